// Package schema is ctxpipe's wire contract in Go (docs/protocol.md): the
// types every other package shares, their JSON forms and their checks.
// input.go holds inputs, their kinds and subjects, conversation ids and
// tenant keys; turn.go turns and stored messages, content.go their content
// (a string or blocks), validate.go and limits.go what a turn must satisfy,
// jsondec.go the one-pass decoder that keeps encoding/json's acceptance
// rules; changes.go a conversation's state and the changes an input makes
// to it; event.go the events and DecodeEvent; query.go the ctx.q.*
// requests and replies; profile.go profiles and the service-wide Globals they inherit;
// summary.go what the engine asks a condenser; errors.go the reason codes
// of rejected inputs. The *.schema.json files are the machine-readable
// half of the same contract.
package schema
