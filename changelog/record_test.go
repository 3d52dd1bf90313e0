package changelog_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/ctxpipe/ctxpipe/changelog"
	"github.com/ctxpipe/ctxpipe/engine"
	"github.com/ctxpipe/ctxpipe/internal/transcripts"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
	"github.com/ctxpipe/ctxpipe/tokens"
)

// realRecords runs two real agent runs (one under a tenant) through the
// engine, with a context window small enough for condenses, maskings and
// truncations, a manual condense, a pin and a rewind, plus rejected inputs
// (one whose subject is not UTF-8, one with a payload past the stored
// prefix, one with no payload, one recorded without changes). Each record
// is committed to live as one group, as the service commits a record; the
// records come back in order.
func realRecords(t *testing.T, live *store.Store) []changelog.Record {
	t.Helper()
	ctx := context.Background()
	files := transcripts.Files(t, "../../shared/data/transcripts")
	// Every third summary fails, so the engine falls back to truncating.
	calls := 0
	eng := engine.NewEngine(engine.SummarizerFunc(func(_ context.Context, req schema.SummaryRequest) (schema.Summary, error) {
		if calls++; calls%3 == 0 {
			return schema.Summary{}, errors.New("the summarizer is down")
		}
		return schema.Summary{Text: fmt.Sprintf("summary of %d messages <kept> & \"quoted\"", len(req.Messages)), Model: "t"}, nil
	}))
	eng.Log = slog.New(slog.DiscardHandler)
	eng.Globals = schema.Globals{AutoCondense: true, AutoCondensePercent: 75}
	eng.Counter = func(*schema.Profile) (tokens.Counter, error) {
		return tokens.Counter{Text: tokens.Chars{}, Fudge: 1}, nil
	}
	// The first run masks tool results; the second does not, in a window
	// small enough that a failed condense leaves it over and it truncates.
	profiles := []schema.Profile{
		{ID: "p", ContextWindow: 9000, MaxTokens: 1000, MinGainTokens: new(int), Mask: schema.MaskSettings{Enabled: true}},
		{ID: "q", ContextWindow: 6000, MaxTokens: 1000, MinGainTokens: new(int)},
	}
	lines := [][]transcripts.Line{transcripts.Read(t, files[0]), transcripts.Read(t, files[1])}
	// The payloads are sent as they are, so they name their runs; the
	// second arrives under a tenant.
	convs := []string{lines[0][0].Turn.ConversationID, schema.ConversationKey("acme", lines[1][0].Turn.ConversationID)}

	var (
		records []changelog.Record
		at      = int64(1_800_000_000_000)
	)
	commit := func(entries ...store.Entry) {
		t.Helper()
		at++
		tx, err := live.Begin(ctx, []store.Group{{At: at, Entries: entries}})
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(nil, 0); err != nil {
			t.Fatal(err)
		}
		// A conversation lives in one partition; inputs rejected before
		// they had one go to another.
		p := 0
		if entries[0].Input.ConversationID == "" {
			p = 1
		}
		records = append(records, changelog.Record{Partition: p, At: at, Entries: entries})
	}
	apply := func(conv string, kind schema.InputKind, payload []byte) store.Entry {
		t.Helper()
		subject := schema.InputSubject(conv, kind)
		in, err := schema.DecodeInput(subject, payload)
		if err != nil {
			t.Fatal(err)
		}
		st, _, err := live.State(ctx, conv)
		if err != nil {
			t.Fatal(err)
		}
		p := &profiles[0]
		if conv != convs[0] {
			p = &profiles[1]
		}
		ch, err := eng.Apply(ctx, st, live.Conversation(conv), p, in)
		if err != nil {
			t.Fatalf("%s %s: %v", conv, kind, err)
		}
		return store.Entry{Input: store.InputRecord{ID: in.ID, ConversationID: conv, Kind: string(kind), Subject: subject,
			TS: in.TS, Payload: payload, Status: store.StatusApplied}, Changes: ch}
	}
	control := func(conv string, kind schema.InputKind, in schema.Input) store.Entry {
		t.Helper()
		_, bare := schema.SplitKey(conv)
		in.Kind, in.ID, in.ConversationID = kind, uuid.NewString(), bare
		data, err := schema.ControlPayload(in)
		if err != nil {
			t.Fatal(err)
		}
		return apply(conv, kind, data)
	}
	rejected := func(subject string, payload []byte, withEvent bool) store.Entry {
		id := uuid.NewString()
		e := store.Entry{Input: store.InputRecord{ID: id, Kind: "turn", Subject: subject, TS: at,
			Payload: payload, Status: store.StatusRejected, Reason: string(schema.ReasonInvalidJSON)}}
		if withEvent {
			e.Changes = &schema.Changes{Events: []schema.Event{&schema.InputRejected{
				EventHeader: schema.EventHeader{ID: uuid.NewString(), Type: schema.EventInputRejected,
					ConversationID: schema.InvalidConversationID, TS: at, InputID: id},
				Reason: schema.ReasonInvalidJSON, Message: "bad", Subject: subject,
			}}}
		}
		return e
	}
	n := min(len(lines[0]), len(lines[1]), 90)
	for k := 0; k < n; k++ {
		commit(apply(convs[0], schema.KindTurn, lines[0][k].Raw), apply(convs[1], schema.KindTurn, lines[1][k].Raw))
		switch k {
		case 20:
			commit(rejected("ctx.in.bad\xff\xfe.turn", []byte(`{"id": nope`), true),
				rejected("ctx.in.big.turn", bytes.Repeat([]byte("x"), 3*store.RejectedPayloadPrefix), true),
				rejected("ctx.in.none.turn", nil, false))
		case 40:
			commit(control(convs[0], schema.KindCondense, schema.Input{TS: lines[0][k].Turn.TS + 1, Trigger: schema.TriggerManual}))
		case 45:
			msgs, err := live.Messages(ctx, convs[1])
			if err != nil {
				t.Fatal(err)
			}
			commit(control(convs[1], schema.KindPin, schema.Input{TS: lines[1][k].Turn.TS + 1, MessageID: msgs[3].ID, Pinned: true}))
		case 70:
			msgs, err := live.Messages(ctx, convs[1])
			if err != nil {
				t.Fatal(err)
			}
			commit(control(convs[1], schema.KindRewind, schema.Input{TS: msgs[len(msgs)/2].TS}))
		}
	}
	// The test is only worth something if the engine did all of it.
	seen := map[schema.EventType]int{}
	tags, befores, deletes := 0, 0, 0
	for _, r := range records {
		for _, e := range r.Entries {
			if e.Changes == nil {
				continue
			}
			for _, ev := range e.Changes.Events {
				seen[ev.Header().Type]++
			}
			tags += len(e.Changes.Tags)
			deletes += len(e.Changes.Delete)
			for _, ins := range e.Changes.Insert {
				if ins.Before != "" {
					befores++
				}
			}
		}
	}
	for _, want := range []schema.EventType{schema.EventCondenseContext, schema.EventSlidingWindowTruncation,
		schema.EventRewind, schema.EventInputRejected} {
		if seen[want] == 0 {
			t.Fatalf("no %s among %v: the test no longer exercises it", want, seen)
		}
	}
	if tags == 0 || befores == 0 || deletes == 0 {
		t.Fatalf("%d tag changes, %d insertions before a message, %d deletes: the test no longer exercises them", tags, befores, deletes)
	}
	return records
}

func openStore(t *testing.T, name string, opts ...store.Option) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), name), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// replay commits records to st as a rebuild does, one group each.
func replay(t *testing.T, st *store.Store, records []changelog.Record) {
	t.Helper()
	ctx := context.Background()
	for i, r := range records {
		tx, err := st.Begin(ctx, []store.Group{{At: r.At, Entries: r.Entries, Published: true}})
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if err := tx.Commit(map[int]uint64{r.Partition: uint64(i + 1)}, uint64(i+1)); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	if err := st.EndBulkLoad(ctx); err != nil {
		t.Fatal(err)
	}
}

// journalMode reads the journal mode a database file is in.
func journalMode(t *testing.T, path string) string {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var mode string
	if err := db.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil {
		t.Fatal(err)
	}
	return mode
}

func identical(t *testing.T, a, b *store.Store) {
	t.Helper()
	report, err := store.Diff(context.Background(), a.Path(), b.Path())
	if err != nil {
		t.Fatal(err)
	}
	if !report.Identical() {
		t.Fatalf("%s differs from %s:\n%s", b.Path(), a.Path(), report)
	}
}

// Encode and Decode round-trip real entries: the decoded record encodes
// to the same bytes, carries every input in its stored form and the very
// bytes the store wrote for each message, state and event, and a store
// that commits the decoded records (plain, or as a bulk load) holds the
// same rows as the one that committed the originals.
func TestRecordRoundTripOnRealEntries(t *testing.T) {
	live := openStore(t, "live.db")
	records := realRecords(t, live)
	var decoded []changelog.Record
	for i, r := range records {
		data, err := changelog.Encode(r)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		d, err := changelog.Decode(data)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		again, err := changelog.Encode(d)
		if err != nil {
			t.Fatalf("record %d: encode the decoded one: %v", i, err)
		}
		if !bytes.Equal(again, data) {
			t.Fatalf("record %d: the decoded record encodes to other bytes", i)
		}
		if d.Partition != r.Partition || d.At != r.At || len(d.Entries) != len(r.Entries) {
			t.Fatalf("record %d: partition %d at %d with %d entries, want %d at %d with %d", i,
				d.Partition, d.At, len(d.Entries), r.Partition, r.At, len(r.Entries))
		}
		for k := range r.Entries {
			sameEntry(t, fmt.Sprintf("record %d entry %d", i, k), r.Entries[k], d.Entries[k])
		}
		decoded = append(decoded, d)
	}
	plain := openStore(t, "plain.db")
	replay(t, plain, decoded)
	identical(t, live, plain)
	bulk := openStore(t, "bulk.db", store.WithBulkLoad())
	replay(t, bulk, decoded)
	identical(t, live, bulk)
	if mode := journalMode(t, bulk.Path()); mode != "wal" {
		t.Fatalf("after the bulk load the file's journal mode is %q, want wal", mode)
	}
}

// sameEntry checks that a decoded entry is the original in its stored
// form, with the store's own bytes.
func sameEntry(t *testing.T, where string, orig, got store.Entry) {
	t.Helper()
	want := orig.StoredInput()
	g := got.Input
	if g.ID != want.ID || g.ConversationID != want.ConversationID || g.Kind != want.Kind || g.Subject != want.Subject ||
		g.TS != want.TS || g.Status != want.Status || g.Reason != want.Reason || *g.Stored != *want.Stored ||
		!bytes.Equal(g.Payload, want.Payload) || (g.Payload == nil) != (want.Payload == nil) {
		t.Fatalf("%s: input %+v, want %+v", where, g, want)
	}
	if (got.Changes == nil) != (orig.Changes == nil) {
		t.Fatalf("%s: changes %v, want %v", where, got.Changes != nil, orig.Changes != nil)
	}
	if orig.Changes == nil {
		return
	}
	enc, err := store.EncodeChanges(store.Entry{Input: want, Changes: orig.Changes})
	if err != nil {
		t.Fatal(err)
	}
	ge := got.Encoded
	if ge == nil || !bytes.Equal(ge.State, enc.State) || (ge.State == nil) != (enc.State == nil) ||
		len(ge.Bodies) != len(enc.Bodies) || len(ge.Events) != len(enc.Events) {
		t.Fatalf("%s: encoded changes differ from the store's", where)
	}
	for k := range enc.Bodies {
		if !bytes.Equal(ge.Bodies[k], enc.Bodies[k]) {
			t.Fatalf("%s: body %d differs from the store's", where, k)
		}
	}
	for k := range enc.Events {
		if !bytes.Equal(ge.Events[k], enc.Events[k]) {
			t.Fatalf("%s: event %d differs from the store's", where, k)
		}
		b, err := schema.Marshal(got.Changes.Events[k])
		if err != nil || !bytes.Equal(b, enc.Events[k]) {
			t.Fatalf("%s: decoded event %d encodes to %s, want %s (%v)", where, k, b, enc.Events[k], err)
		}
	}
	oc, gc := orig.Changes, got.Changes
	if fmt.Sprint(gc.Tags) != fmt.Sprint(oc.Tags) || strings.Join(gc.Delete, ",") != strings.Join(oc.Delete, ",") ||
		len(gc.Insert) != len(oc.Insert) {
		t.Fatalf("%s: tags %v deletes %v (%d inserts), want %v %v (%d)", where, gc.Tags, gc.Delete, len(gc.Insert),
			oc.Tags, oc.Delete, len(oc.Insert))
	}
	if (gc.State.ConversationID == "") != (oc.State.ConversationID == "") {
		t.Fatalf("%s: state conversation %q, want %q", where, gc.State.ConversationID, oc.State.ConversationID)
	}
	for k := range oc.Insert {
		o, m := oc.Insert[k].Message, gc.Insert[k].Message
		if gc.Insert[k].Before != oc.Insert[k].Before || m.ID != o.ID || m.TS != o.TS || m.Role != o.Role ||
			m.IsSummary != o.IsSummary || m.CondenseID != o.CondenseID || m.CondenseParent != o.CondenseParent ||
			m.IsTruncationMarker != o.IsTruncationMarker || m.TruncationID != o.TruncationID ||
			m.TruncationParent != o.TruncationParent || m.Tokens != o.Tokens {
			t.Fatalf("%s: message %d's columns differ", where, k)
		}
	}
}

// A record that is damaged, cut short, or of another version is refused.
func TestDecodeRefusesDamagedRecords(t *testing.T) {
	conv := "c"
	m := schema.Message{Turn: schema.Turn{ID: uuid.NewString(), ConversationID: conv, TS: 5, Role: schema.RoleUser,
		Content: schema.TextContent("hello")}, Tokens: 3}
	r := changelog.Record{Partition: 1, At: 7, Entries: []store.Entry{{
		Input: store.InputRecord{ID: uuid.NewString(), ConversationID: conv, Kind: "turn", Subject: "ctx.in.c.turn",
			TS: 5, Payload: []byte(`{"id":"x"}`), Status: store.StatusApplied},
		Changes: &schema.Changes{Insert: []schema.Insertion{{Message: m}},
			State: schema.ConversationState{ConversationID: conv, Messages: 1}},
	}}}
	data, err := changelog.Encode(r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := changelog.Decode(data); err != nil {
		t.Fatal(err)
	}
	head, _, _ := bytes.Cut(data, []byte{'\n'})
	for name, bad := range map[string][]byte{
		"cut short":        data[:len(data)-1],
		"bytes left over":  append(append([]byte(nil), data...), 'x'),
		"no data":          head,
		"version 1":        bytes.Replace(data, []byte(`{"v":2,`), []byte(`{"v":1,`), 1),
		"not JSON":         []byte("\x00\x01"),
		"a short hash":     bytes.Replace(data, []byte(`"hash":"`), []byte(`"hash":"AAAA`), 1),
		"a length too big": bytes.Replace(data, []byte(`"body":`), []byte(`"body":9`), 1),
	} {
		if _, err := changelog.Decode(bad); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

// Whatever a damaged or hostile message holds, Decode returns an error or a
// record, never panics; and what it decodes encodes again, to bytes whose
// round trip is exact (a replica writes what the writer wrote).
func FuzzDecodeRecord(f *testing.F) {
	conv := "c"
	m := schema.Message{Turn: schema.Turn{ID: "m1", ConversationID: conv, TS: 5, Role: schema.RoleUser,
		Content: schema.TextContent("hello")}, Tokens: 3}
	data, err := changelog.Encode(changelog.Record{Partition: 1, At: 7, Entries: []store.Entry{{
		Input: store.InputRecord{ID: "i1", ConversationID: conv, Kind: "turn", Subject: "ctx.in.c.turn",
			TS: 5, Payload: []byte(`{"id":"x"}`), Status: store.StatusApplied},
		Changes: &schema.Changes{Insert: []schema.Insertion{{Message: m}},
			State: schema.ConversationState{ConversationID: conv, Messages: 1}},
	}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add(bytes.Replace(data, []byte(`"body":`), []byte(`"body":-`), 1))
	f.Add([]byte("{\"v\":2,\"p\":0,\"at\":0,\"entries\":[{\"input\":{\"id\":{\"b64\":\"/w==\"},\"kind\":\"\",\"ts\":0,\"payload\":-1,\"hash\":\"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\",\"size\":0,\"status\":\"rejected\",\"subject\":\"\\u00ff\"}}]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := changelog.Decode(data)
		if err != nil {
			return
		}
		again, err := changelog.Encode(r)
		if err != nil {
			t.Fatalf("a decoded record does not encode: %v", err)
		}
		r2, err := changelog.Decode(again)
		if err != nil {
			t.Fatalf("a re-encoded record does not decode: %v", err)
		}
		if again2, err := changelog.Encode(r2); err != nil || !bytes.Equal(again, again2) {
			t.Fatalf("encoding is not stable: %v", err)
		}
	})
}

// recordBeforeTenantIDs is a record as the service wrote it before input ids
// were per tenant (the format has not changed since): acme's turn, a turn of
// the service's own account and a rejected input of acme whose subject named
// no conversation.
const recordBeforeTenantIDs = "{\"v\":2,\"p\":3,\"at\":1750000000002,\"entries\":[{\"input\":{\"id\":\"0b6c7a9e-1d2f-4c3b-9a8e-7f6d5c4b3a21\",\"conversation_id\":\"acme.c1\",\"kind\":\"turn\",\"ts\":1750000000000,\"payload\":128,\"hash\":\"8RCSJeT08qGp/BaWIDTNKFXq7ZUZAZ8WURZLBaRheuU=\",\"size\":128,\"status\":\"applied\"},\"changes\":{\"insert\":[{\"role\":\"user\",\"tokens\":3,\"body\":139}],\"state\":153}},{\"input\":{\"id\":\"0b6c7a9e-1d2f-4c3b-9a8e-7f6d5c4b3a22\",\"conversation_id\":\"c1\",\"kind\":\"turn\",\"ts\":1750000000000,\"payload\":144,\"hash\":\"xZ304DRyk9QWIo+n9GNZV8aQUsO+zrwhcH+NuWp4aP8=\",\"size\":144,\"status\":\"applied\"},\"changes\":{\"insert\":[{\"role\":\"user\",\"tokens\":3,\"body\":155}],\"state\":148}},{\"input\":{\"id\":\"1b6c7a9e-1d2f-4c3b-9a8e-7f6d5c4b3a21\",\"kind\":\"turn\",\"subject\":\"ctx.in.acme.>.turn\",\"ts\":1750000000001,\"payload\":45,\"hash\":\"3H/hOpHZIEJ4XeYyDnEc496Qaa/7mvpESEBxWIh4Nx0=\",\"size\":45,\"status\":\"rejected\",\"reason\":\"bad_conversation_id\"}}]}\n{\"id\":\"0b6c7a9e-1d2f-4c3b-9a8e-7f6d5c4b3a21\",\"conversation_id\":\"acme.c1\",\"ts\":1750000000000,\"role\":\"user\",\"content\":\"from acme\"}{\"id\":\"0b6c7a9e-1d2f-4c3b-9a8e-7f6d5c4b3a21\",\"conversation_id\":\"acme.c1\",\"ts\":1750000000000,\"role\":\"user\",\"content\":\"from acme\",\"tokens\":3}{\"conversation_id\":\"acme.c1\",\"profile_id\":\"\",\"context_tokens\":0,\"system_tokens\":0,\"messages\":1,\"condensations\":0,\"truncations\":0,\"last_ts\":1750000000000}{\"id\":\"0b6c7a9e-1d2f-4c3b-9a8e-7f6d5c4b3a22\",\"conversation_id\":\"c1\",\"ts\":1750000000000,\"role\":\"user\",\"content\":\"from the service's own account\"}{\"id\":\"0b6c7a9e-1d2f-4c3b-9a8e-7f6d5c4b3a22\",\"conversation_id\":\"c1\",\"ts\":1750000000000,\"role\":\"user\",\"content\":\"from the service's own account\",\"tokens\":3}{\"conversation_id\":\"c1\",\"profile_id\":\"\",\"context_tokens\":0,\"system_tokens\":0,\"messages\":1,\"condensations\":0,\"truncations\":0,\"last_ts\":1750000000000}{\"id\":\"1b6c7a9e-1d2f-4c3b-9a8e-7f6d5c4b3a21\"}"

// A record written before input ids were per tenant replays into a store
// that keys them by tenant: each input gets the tenant its subject names,
// and afterwards another tenant may use acme's id while acme may not.
func TestOldRecordReplaysIntoTenantIDs(t *testing.T) {
	ctx := context.Background()
	rec, err := changelog.Decode([]byte(recordBeforeTenantIDs))
	if err != nil {
		t.Fatal(err)
	}
	st := openStore(t, "replayed.db", store.WithBulkLoad())
	replay(t, st, []changelog.Record{rec})
	const id = "0b6c7a9e-1d2f-4c3b-9a8e-7f6d5c4b3a21"
	for _, tc := range []struct{ tenant, id, conv string }{
		{"acme", id, "acme.c1"},
		{"", "0b6c7a9e-1d2f-4c3b-9a8e-7f6d5c4b3a22", "c1"},
		{"acme", "1b6c7a9e-1d2f-4c3b-9a8e-7f6d5c4b3a21", ""},
	} {
		seen, err := st.SeenInputs(ctx, tc.tenant, []string{tc.id})
		if err != nil || len(seen) != 1 || seen[tc.id].ConversationID != tc.conv {
			t.Errorf("tenant %q, id %s: %+v, %v; want the input of %q", tc.tenant, tc.id, seen, err, tc.conv)
		}
	}
	if seen, err := st.SeenInputs(ctx, "globex", []string{id}); err != nil || len(seen) != 0 {
		t.Fatalf("globex sees acme's input: %+v, %v", seen, err)
	}
	mk := func(conv string) store.Entry {
		e := rec.Entries[0]
		e.Input.ConversationID, e.Input.Subject = conv, schema.InputSubject(conv, schema.KindTurn)
		e.Changes, e.Encoded = nil, nil
		return e
	}
	res, err := st.Commit(ctx, []store.Entry{mk("globex.c1"), mk("acme.c2")})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Duplicate || !res[1].Duplicate || !res[1].Conflict {
		t.Fatalf("results %+v: want globex's input new, acme's a reused id", res)
	}
}
