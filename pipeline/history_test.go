package pipeline_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ctxpipe/ctxpipe/schema"
)

// historyReq sends a ctx.q.history request and returns the raw reply.
func (h *harness) historyReq(req schema.HistoryRequest) (schema.HistoryReply, *schema.QueryErrorBody, []byte) {
	h.t.Helper()
	req.TimeoutMS = 10000
	data, _ := json.Marshal(req)
	msg, err := h.nc.Request(schema.SubjectHistory, data, 15*time.Second)
	if err != nil {
		h.t.Fatal(err)
	}
	checkHistoryJSON(h.t, data, msg.Data)
	var qe schema.QueryError
	if json.Unmarshal(msg.Data, &qe) == nil && qe.Error.Code != "" {
		return schema.HistoryReply{}, &qe.Error, msg.Data
	}
	var rep schema.HistoryReply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		h.t.Fatal(err)
	}
	again := rep
	if again.Messages == nil {
		again.Messages = []schema.Message{}
	}
	if b, err := schema.Marshal(again); err != nil || string(b) != string(msg.Data) {
		h.t.Fatalf("history reply differs from its own re-encoding (%v):\n%s\n%s", err, msg.Data, b)
	}
	return rep, nil, msg.Data
}

// TestIncrementalHistory follows a conversation as an agent does, reading
// after every change with the seq of its previous reply: appends come alone,
// anything else comes as the whole view marked reset, and what the client
// holds is always what a full read gives.
func TestIncrementalHistory(t *testing.T) {
	h := start(t)
	const conv = "incremental"
	ts := h.turns(conv, 4, 50)
	full, qe, _ := h.historyReq(schema.HistoryRequest{ConversationID: conv, WaitFor: ts[3].ID})
	if qe != nil || len(full.Messages) != 4 || full.Seq == 0 || full.Reset {
		t.Fatalf("first read: %d messages, seq %d, reset %v, error %v", len(full.Messages), full.Seq, full.Reset, qe)
	}
	held := full.Messages
	seq := full.Seq

	// follow reads incrementally after waitFor and checks what the client
	// then holds against a full read.
	follow := func(waitFor string, wantNew int, wantReset bool) {
		t.Helper()
		rep, qe, _ := h.historyReq(schema.HistoryRequest{ConversationID: conv, WaitFor: waitFor, After: seq})
		if qe != nil {
			t.Fatalf("incremental read: %v", qe)
		}
		if rep.Reset != wantReset || (!wantReset && len(rep.Messages) != wantNew) {
			t.Fatalf("incremental read after %d: %d messages, reset %v; want %d, reset %v", seq, len(rep.Messages), rep.Reset, wantNew, wantReset)
		}
		if rep.Seq < seq || (wantNew > 0 || wantReset) && rep.Seq == seq {
			t.Fatalf("seq went from %d to %d", seq, rep.Seq)
		}
		if rep.Reset {
			held = rep.Messages
		} else {
			held = append(held, rep.Messages...)
		}
		seq = rep.Seq
		all := h.history(conv, schema.ViewEffective, "")
		if !reflect.DeepEqual(held, all) {
			t.Fatalf("the client holds %d messages, a full read gives %d", len(held), len(all))
		}
	}
	more := h.turns(conv, 2, 50)
	follow(more[1].ID, 2, false)
	follow("", 0, false) // nothing changed
	// A manual condense hides messages: the whole view again.
	follow(h.control(conv, schema.KindCondense, schema.Input{Trigger: schema.TriggerManual}), 0, true)
	more = h.turns(conv, 3, 50)
	follow(more[2].ID, 3, false)
	// A rewind deletes and restores: the whole view again.
	follow(h.control(conv, schema.KindRewind, schema.Input{TS: more[0].TS}), 0, true)
	more = h.turns(conv, 1, 50)
	follow(more[0].ID, 1, false)

	// A tool call and its result, each read as it lands: the result's call
	// is in the tail the incremental read looks back on.
	call := schema.Turn{ID: uuid.NewString(), ConversationID: conv, TS: h.nextTS(), Role: schema.RoleAssistant,
		Content: schema.BlockContent(schema.Block{Type: schema.BlockToolUse, ID: "call-1", Name: "read_file", Input: json.RawMessage(`{"path":"a.go"}`)})}
	h.publish(schema.InputSubject(conv, schema.KindTurn), call.ID, call)
	follow(call.ID, 1, false)
	result := schema.Turn{ID: uuid.NewString(), ConversationID: conv, TS: h.nextTS(), Role: schema.RoleUser,
		Content: schema.BlockContent(schema.Block{Type: schema.BlockToolResult, ToolUseID: "call-1", Content: &schema.Content{Text: "package a"}})}
	h.publish(schema.InputSubject(conv, schema.KindTurn), result.ID, result)
	follow(result.ID, 1, false)
	// A call that a condense keeps visible, answered after it: what the
	// store holds in memory starts at the condense, so the result's call
	// is found in SQLite's tail, and the read is still incremental.
	call = schema.Turn{ID: uuid.NewString(), ConversationID: conv, TS: h.nextTS(), Role: schema.RoleAssistant,
		Content: schema.BlockContent(schema.Block{Type: schema.BlockToolUse, ID: "call-2", Name: "read_file", Input: json.RawMessage(`{"path":"b.go"}`)})}
	h.publish(schema.InputSubject(conv, schema.KindTurn), call.ID, call)
	follow(call.ID, 1, false)
	follow(h.control(conv, schema.KindCondense, schema.Input{Trigger: schema.TriggerManual}), 0, true)
	result = schema.Turn{ID: uuid.NewString(), ConversationID: conv, TS: h.nextTS(), Role: schema.RoleUser,
		Content: schema.BlockContent(schema.Block{Type: schema.BlockToolResult, ToolUseID: "call-2", Content: &schema.Content{Text: "package b"}})}
	h.publish(schema.InputSubject(conv, schema.KindTurn), result.ID, result)
	follow(result.ID, 1, false)

	// A seq from the future (another store, say) is answered in full.
	rep, qe, _ := h.historyReq(schema.HistoryRequest{ConversationID: conv, After: seq + 100})
	if qe != nil || !rep.Reset || len(rep.Messages) != len(held) {
		t.Fatalf("after a future seq: %d messages, reset %v, error %v", len(rep.Messages), rep.Reset, qe)
	}
	// The full view reads incrementally too.
	fullView, _, _ := h.historyReq(schema.HistoryRequest{ConversationID: conv, View: schema.ViewFull})
	more = h.turns(conv, 2, 50)
	h.history(conv, schema.ViewFull, more[1].ID)
	rep, qe, _ = h.historyReq(schema.HistoryRequest{ConversationID: conv, View: schema.ViewFull, After: fullView.Seq})
	if qe != nil || rep.Reset || len(rep.Messages) != 2 || rep.Messages[1].ID != more[1].ID {
		t.Fatalf("full view after appends: %d messages, reset %v, error %v", len(rep.Messages), rep.Reset, qe)
	}
	// after and paging are refused together.
	for _, req := range []schema.HistoryRequest{
		{ConversationID: conv, After: seq, Limit: 2},
		{ConversationID: conv, After: seq, Cursor: "1.x"},
		{ConversationID: conv, After: -1},
	} {
		if _, qe, _ := h.historyReq(req); qe == nil || qe.Code != schema.QueryBadRequest {
			t.Fatalf("%+v: %v, want bad_request", req, qe)
		}
	}
	// Paged replies carry the seq to go on from.
	page, qe, _ := h.historyReq(schema.HistoryRequest{ConversationID: conv, Limit: 2})
	if qe != nil || page.Seq != rep.Seq || page.NextCursor == "" {
		t.Fatalf("paged reply: seq %d (want %d), next %q, error %v", page.Seq, rep.Seq, page.NextCursor, qe)
	}
}

// A paging cursor goes on over appends, and is refused once a condense
// retagged the messages before it without moving any: the pages would
// otherwise show hidden messages as visible, a view that never existed.
func TestCursorRefusedAfterCondense(t *testing.T) {
	h := start(t)
	const conv = "pages"
	ts := h.turns(conv, 10, 20)
	h.history(conv, schema.ViewFull, ts[9].ID)
	first, qe, _ := h.historyReq(schema.HistoryRequest{ConversationID: conv, View: schema.ViewFull, Limit: 5})
	if qe != nil || len(first.Messages) != 5 || first.NextCursor == "" {
		t.Fatalf("first page: %d messages, next %q, error %v", len(first.Messages), first.NextCursor, qe)
	}
	more := h.turns(conv, 1, 20)
	h.history(conv, schema.ViewFull, more[0].ID)
	second, qe, _ := h.historyReq(schema.HistoryRequest{ConversationID: conv, View: schema.ViewFull, Limit: 5, Cursor: first.NextCursor})
	if qe != nil || len(second.Messages) != 5 || second.Messages[0].ID != ts[5].ID {
		t.Fatalf("after an append the cursor goes on: %d messages, error %v", len(second.Messages), qe)
	}
	id := h.control(conv, schema.KindCondense, schema.Input{Trigger: schema.TriggerManual})
	full := h.history(conv, schema.ViewFull, id)
	hidden := 0
	for _, m := range full[:5] {
		if m.CondenseParent != "" {
			hidden++
		}
	}
	if hidden == 0 {
		t.Fatal("the condense hid none of the first page's messages: the test proves nothing")
	}
	if _, qe, _ := h.historyReq(schema.HistoryRequest{ConversationID: conv, View: schema.ViewFull, Limit: 5, Cursor: first.NextCursor}); qe == nil || qe.Code != schema.QueryBadRequest {
		t.Fatalf("a cursor from before the condense: %v, want bad_request", qe)
	}
	// A cursor read after it goes on; forged or mangled ones do not.
	again, qe, _ := h.historyReq(schema.HistoryRequest{ConversationID: conv, View: schema.ViewFull, Limit: 5})
	if qe != nil || again.NextCursor == "" {
		t.Fatalf("first page again: next %q, error %v", again.NextCursor, qe)
	}
	off, rest, _ := strings.Cut(again.NextCursor, ".")
	_, last, _ := strings.Cut(rest, ".")
	for _, bad := range []string{off + "." + last, off + ".x." + last, off + ".." + last, off + ".99999999999999999999." + last,
		off + ".-1." + last, "0.0." + last, "999.0." + last, off + "." + rest + "x"} {
		if _, qe, _ := h.historyReq(schema.HistoryRequest{ConversationID: conv, View: schema.ViewFull, Limit: 5, Cursor: bad}); qe == nil || qe.Code != schema.QueryBadRequest {
			t.Fatalf("cursor %q: %v, want bad_request", bad, qe)
		}
	}
	if _, qe, _ := h.historyReq(schema.HistoryRequest{ConversationID: conv, View: schema.ViewFull, Limit: 5, Cursor: again.NextCursor}); qe != nil {
		t.Fatalf("a cursor from after the condense: %v", qe)
	}
}
