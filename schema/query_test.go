package schema

import (
	"encoding/json"
	"errors"
	"math"
	"testing"
	"time"
)

func TestHistoryRequestValidate(t *testing.T) {
	const id = "0b6c7a9e-1d2f-4c3b-9a8e-7f6d5c4b3a21"
	tests := []struct {
		name     string
		req      HistoryRequest
		wantCode QueryCode // "" = valid
		wantView View
	}{
		{"default view", HistoryRequest{ConversationID: "task-42"}, "", ViewEffective},
		{"full view", HistoryRequest{ConversationID: "task-42", View: ViewFull}, "", ViewFull},
		{"wait_for", HistoryRequest{ConversationID: "c", WaitFor: id, TimeoutMS: 500}, "", ViewEffective},
		{"bad view", HistoryRequest{ConversationID: "c", View: "all"}, QueryBadRequest, ""},
		{"empty conversation", HistoryRequest{}, QueryBadRequest, ""},
		{"subject-unsafe conversation", HistoryRequest{ConversationID: "a.b"}, QueryBadRequest, ""},
		{"wait_for not a uuid", HistoryRequest{ConversationID: "c", WaitFor: "turn-1"}, QueryBadRequest, ""},
		{"negative timeout", HistoryRequest{ConversationID: "c", TimeoutMS: -1}, QueryBadRequest, ""},
		{"most negative timeout", HistoryRequest{ConversationID: "c", TimeoutMS: math.MinInt64}, QueryBadRequest, ""},
		{"huge timeout is capped, not refused", HistoryRequest{ConversationID: "c", TimeoutMS: 1e13}, "", ViewEffective},
		{"reserved conversation", HistoryRequest{ConversationID: InvalidConversationID}, QueryBadRequest, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.req.Validate()
			if tt.wantCode == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				if tt.req.View != tt.wantView {
					t.Fatalf("View = %q, want %q", tt.req.View, tt.wantView)
				}
				return
			}
			var qe *QueryErrorBody
			if !errors.As(err, &qe) || qe.Code != tt.wantCode {
				t.Fatalf("Validate() = %v, want code %q", err, tt.wantCode)
			}
		})
	}
}

func TestHistoryRequestTimeout(t *testing.T) {
	tests := []struct {
		ms   int64
		want time.Duration
	}{
		{0, 5 * time.Second},
		{250, 250 * time.Millisecond},
		{10 * 60 * 1000, MaxQueryTimeout},
		{MaxQueryTimeout.Milliseconds(), MaxQueryTimeout},
		{MaxQueryTimeout.Milliseconds() - 1, MaxQueryTimeout - time.Millisecond},
		// 1e13 ms overflows a Duration (wrapped, it would be a negative,
		// instant timeout): it waits the longest allowed.
		{1e13, MaxQueryTimeout},
		{math.MaxInt64, MaxQueryTimeout},
		{math.MaxInt64 / int64(time.Millisecond), MaxQueryTimeout},
		{math.MaxInt64/int64(time.Millisecond) + 1, MaxQueryTimeout},
	}
	for _, tt := range tests {
		r := HistoryRequest{TimeoutMS: tt.ms}
		if got := r.Timeout(5 * time.Second); got != tt.want {
			t.Errorf("Timeout(ms=%d) = %v, want %v", tt.ms, got, tt.want)
		}
	}
}

func TestStatusRequestValidate(t *testing.T) {
	for conv, ok := range map[string]bool{"task-42": true, "": false, "x y": false} {
		r := StatusRequest{ConversationID: conv}
		if err := r.Validate(); (err == nil) != ok {
			t.Errorf("Validate(%q) = %v, want ok=%v", conv, err, ok)
		}
	}
}

// The JSON names are the wire contract of DESIGN.md.
func TestQueryWireNames(t *testing.T) {
	tests := []struct {
		name string
		v    any
		keys []string
	}{
		{"history request", HistoryRequest{ConversationID: "c", View: ViewFull, WaitFor: "w", TimeoutMS: 1},
			[]string{"conversation_id", "view", "wait_for", "timeout_ms"}},
		{"history reply", HistoryReply{ConversationID: "c", View: ViewEffective, Messages: []Message{}},
			[]string{"conversation_id", "view", "messages"}},
		{"status request", StatusRequest{ConversationID: "c"}, []string{"conversation_id"}},
		{"status reply", StatusReply{ConversationID: "c"}, []string{"conversation_id", "profile_id",
			"context_tokens", "context_window", "allowed_tokens", "percent", "threshold", "messages",
			"hidden_messages", "condensations", "truncations"}},
		{"error", QueryError{Error: QueryErrorBody{Code: QueryNotFound, Message: "m"}}, []string{"error"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := Marshal(tt.v)
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]json.RawMessage
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			if len(m) != len(tt.keys) {
				t.Errorf("%s has %d keys, want %d", b, len(m), len(tt.keys))
			}
			for _, k := range tt.keys {
				if _, ok := m[k]; !ok {
					t.Errorf("%s lacks %q", b, k)
				}
			}
		})
	}
}

func TestDecodeQueryReply(t *testing.T) {
	var st StatusReply
	err := DecodeQueryReply([]byte(`{"error":{"code":"not_found","message":"no conversation x"}}`), &st)
	var qe *QueryErrorBody
	if !errors.As(err, &qe) || qe.Code != QueryNotFound || qe.Message != "no conversation x" {
		t.Fatalf("error reply decoded as %v", err)
	}
	if err := DecodeQueryReply([]byte(`{"conversation_id":"x","percent":12.5}`), &st); err != nil || st.Percent != 12.5 {
		t.Fatalf("reply decoded as %+v, %v", st, err)
	}
	if err := DecodeQueryReply([]byte(`not json`), &st); err == nil || errors.As(err, &qe) {
		t.Fatalf("garbage decoded with error %v", err)
	}
	if got := string(MarshalQueryError(QueryTimeout, "a<b")); got != `{"error":{"code":"timeout","message":"a<b"}}` {
		t.Fatalf("MarshalQueryError = %s", got)
	}
}
