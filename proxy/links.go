package proxy

import (
	"strings"

	"github.com/ctxpipe/ctxpipe/schema"
)

// An agent that compacts its own history sends the compaction request (its
// summary prompt) in the conversation it compacts, and then goes on with a
// history that starts over from the summary the model wrote: a history
// whose first turn is not the conversation's, so a thread of its own. What
// links the two is content, not a guess: the new history quotes the
// summary (an agent may drop or rewrap parts of it, such as an analysis
// section or the tags around it, but keeps its lines). The proxy
// remembers, per session and agent, the conversation and some long lines
// of the last compaction reply it recorded, and a new thread of that
// session whose first turns hold one of those lines continues that
// conversation.

// minQuote is the shortest line of a summary that may link a new thread to
// the conversation it summarizes: a shorter one could be found by chance.
const minQuote = 40

// maxQuote bounds a line compared; maxQuotes how many lines are kept, the
// last ones of the reply (where the summary proper is).
const (
	maxQuote  = 160
	maxQuotes = 8
)

// quoteTurns is how many leading turns of a new thread are searched for
// the summary (agents put it in the first user message, after a few
// context attachments at most).
const quoteTurns = 4

// compaction is the last compaction reply recorded for a session's agent.
type compaction struct {
	conv   string
	quotes []string
}

// quotesOf are the long lines of a summary, from its end, clipped.
func quotesOf(summary string) []string {
	lines := strings.Split(summary, "\n")
	var out []string
	for i := len(lines) - 1; i >= 0 && len(out) < maxQuotes; i-- {
		l := strings.TrimSpace(lines[i])
		if len(l) >= minQuote {
			out = append(out, clipRunes(l, maxQuote))
		}
	}
	return out
}

// noteCompaction remembers that the reply to an agent's compaction request
// was recorded in conv.
func (p *Proxy) noteCompaction(key Key, conv string, reply schema.Content) {
	q := quotesOf(reply.OwnText("\n"))
	if len(q) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.compactions) >= maxConvs {
		clear(p.compactions)
	}
	p.compactions[key.Conversation()] = compaction{conv: conv, quotes: q}
}

// compactedFrom is the conversation a new thread of key continues: the one
// whose last compaction reply its first turns quote ("" when none does).
func (p *Proxy) compactedFrom(key Key, req *request) string {
	p.mu.Lock()
	c, ok := p.compactions[key.Conversation()]
	p.mu.Unlock()
	if !ok {
		return ""
	}
	for i := 0; i < len(req.turns) && i < quoteTurns; i++ {
		text := req.turns[i].content.OwnText("\n")
		for _, q := range c.quotes {
			if strings.Contains(text, q) {
				return c.conv
			}
		}
	}
	return ""
}

// clipRunes cuts s to at most n bytes on a character boundary.
func clipRunes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !isRuneStart(s[n]) {
		n--
	}
	return s[:n]
}
