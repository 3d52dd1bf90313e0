package changelog_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ctxpipe/ctxpipe/changelog"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
)

// A rebuild skips the records the store refuses, as a follower does, and
// only them, with transactions of many records or of few (a
// failure rolls back the transaction, whose other records are applied
// again without the refused one): a message inserted under a key its
// conversation holds already, a tag on a message that does not exist. The
// record after the first refused one reuses its input id with other
// content: it is applied, as the refused one's input row is not kept.
func TestRebuildSkipsRefusedRecords(t *testing.T) {
	js := startState(t)
	ctx := context.Background()
	live := openStore(t, "live.db")
	records := realRecords(t, live)
	first := records[0].Entries[0]
	conv, taken := first.Input.ConversationID, first.Changes.Insert[0].Message
	record := func(id string, ch *schema.Changes) changelog.Record {
		tn := schema.Turn{ID: id, ConversationID: conv, TS: 1, Role: schema.RoleUser, Content: schema.TextContent("x " + uuid.NewString())}
		payload, err := schema.Marshal(tn)
		if err != nil {
			t.Fatal(err)
		}
		return changelog.Record{Partition: records[0].Partition, At: records[0].At, Entries: []store.Entry{{
			Input: store.InputRecord{ID: id, ConversationID: conv, Kind: string(schema.KindTurn),
				Subject: schema.InputSubject(conv, schema.KindTurn), TS: tn.TS, Payload: payload, Status: store.StatusApplied},
			Changes: ch,
		}}}
	}
	reused := uuid.NewString()
	takenKey := record(reused, &schema.Changes{Insert: []schema.Insertion{{Message: taken}}})
	fresh := taken
	fresh.ID = uuid.NewString()
	sameID := record(reused, &schema.Changes{Insert: []schema.Insertion{{Message: fresh}}})
	missingTag := record(uuid.NewString(), &schema.Changes{Tags: []schema.TagChange{{MessageID: "no-such-message", Field: schema.TagCondenseParent, Value: "x"}}})
	takenLate := record(uuid.NewString(), &schema.Changes{Insert: []schema.Insertion{{Message: taken}}})

	var log, applied []changelog.Record
	log = append(log, records[:3]...)
	log = append(log, takenKey, sameID, missingTag)
	log = append(log, records[3:len(records)-3]...)
	log = append(log, takenLate)
	log = append(log, records[len(records)-3:]...)
	applied = append(applied, records[:3]...)
	applied = append(applied, sameID)
	applied = append(applied, records[3:]...)

	l := &changelog.Log{JS: js}
	at := map[int]uint64{}
	for i, r := range log {
		data, err := changelog.Encode(r)
		if err != nil {
			t.Fatal(err)
		}
		if at[r.Partition], err = l.Append(ctx, r.Partition, at[r.Partition], data); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	expect := openStore(t, "expect.db")
	replay(t, expect, applied)
	for _, batch := range []int{1 << 20, 50} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			rebuilt := openStore(t, "rebuilt.db", store.WithBulkLoad())
			rctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			stats, err := changelog.Rebuild(rctx, js, rebuilt, changelog.RebuildOptions{BatchEntries: batch})
			if err != nil {
				t.Fatal(err)
			}
			if stats.Skipped != 3 || stats.Records != len(applied) {
				t.Fatalf("skipped %d records and applied %d; want 3 and %d", stats.Skipped, stats.Records, len(applied))
			}
			identical(t, expect, rebuilt)
		})
	}
}
