// Package textfacts reads facts out of a conversation's text, mechanically
// and without a model, for the engine and the condensers alike (both import
// it; it imports only schema and prompts):
//
//   - files touched: FilesTouched lists the files a span's tool calls read,
//     edited or created, from their path arguments and the words of their
//     shell commands (files.go, paths.go, commands.go, toolinput.go), and
//     the bounded list that names them in a summary or on a truncation
//     marker is written and read back here (filelist.go);
//   - commands run: CallLine, the one line that names what a call ran;
//   - errors: LastErrorLine, the last line of a tool output that reports an
//     error, and FailureLine, what a failed call's output says (errors.go);
//   - the masked stand-in that replaces a tool result's body: its prefix,
//     how it is written and how its error line is read back (masked.go);
//   - the text helpers these share with their readers: Clip, Head and
//     CollapseSpace (text.go).
//
// The scanners are written by hand because they run over every tool input
// and output of every condensed span; reference_test.go holds them equal to
// the regular expressions they stand for.
package textfacts
