package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/schema"
)

// The tenants nats.conf ships, each an account with users <tenant>-agent
// and <tenant>-ui. Every user's demo password is "<user>-demo-password".
var tenants = []string{"acme", "globex"}

// locksBucket is pipeline.LocksBucket (the instance lock).
const locksBucket = "ctx_locks"

// adminAPIPrefix is where the ADMIN account sees CTX's JetStream API.
const adminAPIPrefix = "$JS.ctx.API"

func password(user string) string { return user + "-demo-password" }

func other(tenant string) string {
	if tenant == tenants[0] {
		return tenants[1]
	}
	return tenants[0]
}

// user is one connection as a nats.conf user, with its async errors
// (where the server's permission violations arrive) on a channel.
type user struct {
	name string
	nc   *nats.Conn
	js   jetstream.JetStream
	errs chan error
}

// connectAs connects as name the way ctxpipe's programs do, with
// bus.Connect and --nats-user/--nats-password: so with the inbox prefix
// bus.ConnConfig derives, _INBOX_<user>, the only one nats.conf lets the
// user subscribe to.
func connectAs(t *testing.T, url, name string) *user {
	t.Helper()
	u := &user{name: name, errs: make(chan error, 256)}
	cfg := bus.ConnConfig{URL: url, User: name, Password: password(name), Name: name,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	nc, err := bus.Connect(cfg, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case u.errs <- err:
		default:
		}
	}))
	if err != nil {
		t.Fatalf("connect as %s: %v", name, err)
	}
	t.Cleanup(nc.Close)
	u.nc = nc
	if u.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	return u
}

// waitViolation waits for the server's permission violation naming subject.
// The 10 s only bounds a failure: the server answers a refused operation at
// once, so a passing test never waits long.
func (u *user) waitViolation(t *testing.T, subject string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case err := <-u.errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `"`+subject) {
				return
			}
		case <-deadline:
			t.Fatalf("%s: no permission violation for %q", u.name, subject)
		}
	}
}

// refused runs op (a request or JetStream call that only an answer would
// end) and requires the server to refuse it with a permission violation
// naming subject; op must then fail rather than succeed.
func (u *user) refused(t *testing.T, subject string, op func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- op(ctx) }()
	u.waitViolation(t, subject)
	cancel()
	if err := <-done; err == nil {
		t.Fatalf("%s: %s succeeded, want it refused", u.name, subject)
	}
}

// publishRefused publishes on subject with core NATS and requires the
// server to refuse it, naming refused: the subject, or what an account
// mapping made of it.
func (u *user) publishRefused(t *testing.T, refused string, subject ...string) {
	t.Helper()
	subj := refused
	if len(subject) > 0 {
		subj = subject[0]
	}
	if err := u.nc.Publish(subj, []byte(`{}`)); err != nil {
		t.Fatalf("%s: publish %s: %v", u.name, subj, err)
	}
	u.waitViolation(t, refused)
}

// subscribeRefused subscribes to subject and requires the server to refuse it.
func (u *user) subscribeRefused(t *testing.T, subject string) {
	t.Helper()
	sub, err := u.nc.SubscribeSync(subject)
	if err != nil {
		t.Fatalf("%s: subscribe %s: %v", u.name, subject, err)
	}
	u.waitViolation(t, subject)
	_ = sub.Unsubscribe()
}

// input is the body of every input the test publishes: who sent it where,
// so that whatever lands in CTX_IN says where it came from.
func input(tenant, subject string) []byte {
	return fmt.Appendf(nil, `{"tenant":%q,"subject":%q}`, tenant, subject)
}

func (u *user) jsPublish(tenant, subject string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		_, err := bus.PublishInput(ctx, u.js, subject, uuid.NewString(), input(tenant, subject))
		return err
	}
}

// publishOK publishes an input with JetStream from a tenant account and
// requires CTX_IN's PubAck, which comes back through the service import.
func (u *user) publishOK(t *testing.T, ctx context.Context, tenant, subject, id string) *jetstream.PubAck {
	t.Helper()
	ack, err := bus.PublishInput(ctx, u.js, subject, id, input(tenant, subject))
	if err != nil {
		t.Fatalf("%s: publish %s: %v", u.name, subject, err)
	}
	return ack
}

// noAck publishes inputs with JetStream, all at once, and requires that no
// stream acknowledges any. The wait only bounds how long an answer that must
// not come is waited for; the check that matters is the final one of CTX_IN's
// contents, which would find anything stored.
func (u *user) noAck(t *testing.T, ctx context.Context, tenant string, subjects ...string) {
	t.Helper()
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	acked := make(chan string, len(subjects))
	var wg sync.WaitGroup
	for _, subj := range subjects {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := u.js.Publish(pctx, subj, input(tenant, subj)); err == nil {
				acked <- subj
			}
		}()
	}
	wg.Wait()
	close(acked)
	for subj := range acked {
		t.Errorf("%s: %s was acknowledged", u.name, subj)
	}
}

// seen is what the test's query responder saw of one request, in CTX, as
// the service sees it; it is also the reply.
type seen struct {
	Subject string `json:"subject"`
	Reply   string `json:"reply"`
	Body    string `json:"body"`
}

// queryOK asks a query on the tenant-free subject ctx.q.<q> and returns
// what the service side saw.
func (u *user) queryOK(t *testing.T, q string) seen {
	t.Helper()
	msg, err := u.nc.Request("ctx.q."+q, []byte(`{}`), 10*time.Second)
	if err != nil {
		t.Fatalf("%s: request ctx.q.%s: %v", u.name, q, err)
	}
	var s seen
	if err := json.Unmarshal(msg.Data, &s); err != nil {
		t.Fatalf("%s: ctx.q.%s reply %q: %v", u.name, q, msg.Data, err)
	}
	return s
}

// next returns the next message of sub, failing after 10 s.
func next(t *testing.T, sub *nats.Subscription) *nats.Msg {
	t.Helper()
	m, err := sub.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("%s: %v", sub.Subject, err)
	}
	return m
}

// readStream returns the messages of stream from sequence from on, read
// as the service reads (the ctxpipe user).
func readStream(t *testing.T, ctx context.Context, js jetstream.JetStream, stream string, from uint64) []jetstream.Msg {
	t.Helper()
	cfg := jetstream.OrderedConsumerConfig{}
	if from > 1 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	cons, err := js.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		t.Fatalf("read %s: %v", stream, err)
	}
	var out []jetstream.Msg
	for range cons.CachedInfo().NumPending {
		m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("read %s: %v", stream, err)
		}
		out = append(out, m)
	}
	return out
}

// TestNATSConfPermissions starts nats-server from the shipped nats.conf and
// proves, for every user, that what it must do works and that everything
// else is refused: the other tenant's inputs, events, queries and inboxes;
// the streams, consumers and buckets; and writes through forged reply
// subjects. The query responder stands in for the service (it answers with
// what it saw), since this tests the transport.
func TestNATSConfPermissions(t *testing.T) {
	_, url := natstest.RunWithConfig(t, "../nats.conf")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t.Run("authentication", func(t *testing.T) {
		if nc, err := nats.Connect(url); err == nil {
			nc.Close()
			t.Fatal("connected without credentials")
		}
		if nc, err := nats.Connect(url, nats.UserInfo("acme-agent", password("globex-agent"))); err == nil {
			nc.Close()
			t.Fatal("acme-agent connected with another user's password")
		}
	})

	// The service's setup, as ctxpipe: it must be allowed all of it.
	svc := connectAs(t, url, "ctxpipe")
	if err := bus.EnsureStreams(ctx, svc.js); err != nil {
		t.Fatalf("ctxpipe creates the streams: %v", err)
	}
	profiles, err := bus.EnsureProfiles(ctx, svc.js)
	if err != nil {
		t.Fatalf("ctxpipe creates the profiles bucket: %v", err)
	}
	locks, err := svc.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: locksBucket})
	if err != nil {
		t.Fatalf("ctxpipe creates the locks bucket: %v", err)
	}
	for _, id := range []string{"default", "gpt-4o"} {
		if _, err := profiles.Put(ctx, id, fmt.Appendf(nil, `{"id":%q,"context_window":128000}`, id)); err != nil {
			t.Fatalf("ctxpipe seeds profile %s: %v", id, err)
		}
	}
	if _, err := locks.Put(ctx, "ctxpipe", []byte("instance-1")); err != nil {
		t.Fatalf("ctxpipe takes the lock: %v", err)
	}
	// The service's durable consumer, and a consumer on CTX_EVENTS as an
	// operator's tool would have one: no tenant user may delete either.
	if _, err := svc.js.CreateOrUpdateConsumer(ctx, bus.StreamIn, jetstream.ConsumerConfig{
		Durable: bus.ConsumerName, AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatalf("ctxpipe creates its consumer: %v", err)
	}
	if _, err := svc.js.CreateOrUpdateConsumer(ctx, bus.StreamEvents, jetstream.ConsumerConfig{
		Durable: "audit", AckPolicy: jetstream.AckNonePolicy}); err != nil {
		t.Fatalf("ctxpipe creates a consumer on %s: %v", bus.StreamEvents, err)
	}
	// The query responder, in the service's queue group, answers every
	// query with the subject and reply subject it saw in CTX.
	queries := make(chan seen, 1024)
	if _, err := svc.nc.QueueSubscribe("ctx.q.*.*", bus.QueueGroup, func(m *nats.Msg) {
		s := seen{Subject: m.Subject, Reply: m.Reply, Body: string(m.Data)}
		queries <- s
		b, _ := json.Marshal(s)
		_ = m.Respond(b)
	}); err != nil {
		t.Fatal(err)
	}
	if err := svc.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// progress publishes a condense progress notice, as the service does.
	progress := func(tenant, conv string) {
		t.Helper()
		subj := "ctx.progress." + tenant + "." + conv + ".context_managing"
		if err := svc.nc.Publish(subj, input(tenant, subj)); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("ctxpipe", func(t *testing.T) {
		// Outside the queue group the service may not listen to queries.
		svc.subscribeRefused(t, "ctx.q.>")
		// Nor does it write inputs, or read anyone's inbox but its own.
		svc.refused(t, "ctx.in.acme.c0.turn", svc.jsPublish("acme", "ctx.in.acme.c0.turn"))
		// A '*' token in the dashboard's control inputs: no stream takes it.
		svc.noAck(t, ctx, "acme", "ctx.in.acme.*.condense", "ctx.in.*.c1.rewind")
		svc.subscribeRefused(t, "_INBOX_admin.>")
		// What is asked of every instance (the dashboard's list) reaches
		// each one, outside the queue group.
		other := connectAs(t, url, "ctxpipe")
		for _, c := range []*user{svc, other} {
			if _, err := c.nc.Subscribe("ctx.all.conversations", func(m *nats.Msg) { _ = m.Respond([]byte("here")) }); err != nil {
				t.Fatal(err)
			}
			if err := c.nc.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		inbox := svc.nc.NewInbox()
		answers, err := svc.nc.SubscribeSync(inbox)
		if err != nil {
			t.Fatal(err)
		}
		if err := svc.nc.PublishRequest("ctx.all.conversations", inbox, nil); err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			if m := next(t, answers); string(m.Data) != "here" {
				t.Fatalf("answer %d to ctx.all.conversations: %q", i, m.Data)
			}
		}
	})

	// Before the tenants publish: their inputs are then stored after
	// anything admin's forged replies could have put into CTX_IN, and the
	// check that CTX_IN holds exactly the allowed inputs covers both.
	t.Run("admin", func(t *testing.T) {
		admin := connectAs(t, url, "admin")
		ajs, err := jetstream.NewWithAPIPrefix(admin.nc, adminAPIPrefix)
		if err != nil {
			t.Fatal(err)
		}
		kv, err := ajs.KeyValue(ctx, bus.ProfilesBucket)
		if err != nil {
			t.Fatalf("admin opens %s: %v", bus.ProfilesBucket, err)
		}
		rev, err := kv.Put(ctx, "claude-sonnet", []byte(`{"id":"claude-sonnet","context_window":200000}`))
		if err != nil {
			t.Fatalf("admin puts a profile: %v", err)
		}
		if e, err := kv.Get(ctx, "claude-sonnet"); err != nil || !strings.Contains(string(e.Value()), "200000") {
			t.Fatalf("admin gets the profile: %v", err)
		}
		if e, err := kv.GetRevision(ctx, "claude-sonnet", rev); err != nil || e.Revision() != rev {
			t.Fatalf("admin gets revision %d: %v", rev, err)
		}
		if e, err := profiles.Get(ctx, "claude-sonnet"); err != nil || e.Revision() != rev {
			t.Fatalf("the service does not see admin's profile: %v", err)
		}
		if _, err := kv.Put(ctx, "scratch", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		if err := kv.Delete(ctx, "scratch"); err != nil {
			t.Fatalf("admin deletes a profile: %v", err)
		}
		if _, err := profiles.Get(ctx, "scratch"); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("a deleted profile: %v", err)
		}

		// The PubAck of a put goes back to ADMIN, whatever reply it names:
		// neither the lock, nor CTX_EVENTS, nor CTX_IN (checked with the
		// tenants' inputs) take it.
		lockBefore, err := locks.Get(ctx, "ctxpipe")
		if err != nil {
			t.Fatal(err)
		}
		eventsBefore := state(t, ctx, svc.js, bus.StreamEvents)
		for _, reply := range []string{"$KV." + locksBucket + ".ctxpipe", "ctx.in.acme.c1.turn", "ctx.events.acme.c1.condense_context",
			"$KV.ctx_profiles.default", "$JS.API.STREAM.DELETE.CTX_IN", "_INBOX_ctxpipe.x"} {
			if err := admin.nc.PublishRequest(adminAPIPrefix+".$KV.ctx_profiles.forged", reply, []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
		}
		// Barriers: each stream stores in order, so what its PubAck
		// follows was stored before.
		if _, err := kv.Put(ctx, "forged", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		if _, err := locks.Put(ctx, "barrier", nil); err != nil {
			t.Fatal(err)
		}
		event(t, ctx, svc, "acme", "admin-barrier")
		if e, err := locks.Get(ctx, "ctxpipe"); err != nil || e.Revision() != lockBefore.Revision() || string(e.Value()) != "instance-1" {
			t.Fatalf("the service's lock changed: %v", err)
		}
		if after := state(t, ctx, svc.js, bus.StreamEvents); after.LastSeq != eventsBefore.LastSeq+1 {
			t.Fatalf("CTX_EVENTS gained %d messages, want the barrier only", after.LastSeq-eventsBefore.LastSeq)
		}

		// Nothing but the profiles: no other bucket, no stream, no
		// consumer (a consumer's deliver subject would be CTX's), no
		// inputs, events or queries, no other inbox.
		admin.refused(t, adminAPIPrefix+".STREAM.INFO.KV_"+locksBucket, func(ctx context.Context) error {
			_, err := ajs.KeyValue(ctx, locksBucket)
			return err
		})
		admin.refused(t, adminAPIPrefix+".STREAM.DELETE.KV_"+bus.ProfilesBucket, func(ctx context.Context) error {
			return ajs.DeleteKeyValue(ctx, bus.ProfilesBucket)
		})
		admin.refused(t, adminAPIPrefix+".CONSUMER.CREATE.KV_"+bus.ProfilesBucket, func(ctx context.Context) error {
			_, err := kv.ListKeys(ctx)
			return err
		})
		admin.refused(t, adminAPIPrefix+".STREAM.INFO."+bus.StreamIn, func(ctx context.Context) error {
			_, err := ajs.Stream(ctx, bus.StreamIn)
			return err
		})
		admin.refused(t, "$JS.API.STREAM.INFO.KV_"+bus.ProfilesBucket, func(ctx context.Context) error {
			_, err := admin.js.KeyValue(ctx, bus.ProfilesBucket)
			return err
		})
		admin.publishRefused(t, "$KV.ctx_profiles.default")
		admin.refused(t, "ctx.in.acme.c1.turn", admin.jsPublish("acme", "ctx.in.acme.c1.turn"))
		admin.publishRefused(t, "ctx.events.acme.c1.condense_context")
		admin.refused(t, "ctx.q.acme.status", func(ctx context.Context) error {
			_, err := admin.nc.RequestWithContext(ctx, "ctx.q.acme.status", []byte(`{}`))
			return err
		})
		for _, s := range []string{"ctx.events.>", "ctx.in.>", "ctx.q.>", "_INBOX.>", "_INBOX_ctxpipe.>"} {
			admin.subscribeRefused(t, s)
		}
	})

	agents, uis := map[string]*user{}, map[string]*user{}
	// wantIn collects the inputs that must be in CTX_IN: subject → body.
	wantIn := map[string][]byte{}
	// wildcardTokens publishes u's kinds with a conversation token that
	// is a literal wildcard. A '*' is refused at the edge: nats.conf's
	// split mapping leaves a subject no stream takes. A '>' cannot be
	// refused by any permission, mapping or stream subject (the server
	// takes it for any token wherever it compares): it is stored
	// untransformed, where no partition's consumer reads it
	// (bus.Reached), and the service finds it, rejects it and deletes it.
	wildcardTokens := func(t *testing.T, ctx context.Context, u *user, tn string, kinds ...string) {
		t.Helper()
		var stars []string
		for _, kind := range kinds {
			stars = append(stars, "ctx.in.*."+kind)
		}
		u.noAck(t, ctx, tn, stars...)
		for _, kind := range kinds {
			// Raw: bus.PublishInput refuses a wildcard token itself.
			if ack, err := u.js.Publish(ctx, "ctx.in.>."+kind, input(tn, "ctx.in.>."+kind)); err != nil || ack.Stream != bus.StreamIn {
				t.Fatalf("%s: ctx.in.>.%s: ack %+v, %v", u.name, kind, ack, err)
			}
			stored := "ctx.in." + tn + ".>." + kind
			if bus.Reached(stored, bus.DefaultPartitions) {
				t.Fatalf("%s: a partition's consumer reads it", stored)
			}
			wantIn[stored] = input(tn, "ctx.in.>."+kind)
		}
	}
	for _, tn := range tenants {
		agents[tn] = connectAs(t, url, tn+"-agent")
		uis[tn] = connectAs(t, url, tn+"-ui")
	}

	for _, tn := range tenants {
		agent, ot := agents[tn], other(tn)
		t.Run(tn+"-agent", func(t *testing.T) {
			// A turn on the tenant-free subject lands in CTX_IN with the
			// tenant in it, and the PubAck comes back with JetStream's
			// duplicate detection working across the import, for the
			// connection that sent it (bus.MsgID).
			id := uuid.NewString()
			ack := agent.publishOK(t, ctx, tn, "ctx.in.c1.turn", id)
			if ack.Stream != bus.StreamIn || ack.Duplicate {
				t.Fatalf("turn: ack %+v", ack)
			}
			again := agent.publishOK(t, ctx, tn, "ctx.in.c1.turn", id)
			if !again.Duplicate || again.Sequence != ack.Sequence {
				t.Fatalf("re-sent turn: ack %+v, want a duplicate of seq %d", again, ack.Sequence)
			}
			in, err := svc.js.Stream(ctx, bus.StreamIn)
			if err != nil {
				t.Fatal(err)
			}
			m, err := in.GetMsg(ctx, ack.Sequence)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := m.Header.Get(jetstream.MsgIDHeader), bus.MsgID(agent.nc, "ctx.in.c1.turn", id); got != want {
				t.Fatalf("turn stored at %d with Nats-Msg-Id %q, want %s", ack.Sequence, got, want)
			}
			wantIn["ctx.in."+tn+".c1.turn"] = input(tn, "ctx.in.c1.turn")
			agent.publishOK(t, ctx, tn, "ctx.in.c1.overflow", uuid.NewString())
			wantIn["ctx.in."+tn+".c1.overflow"] = input(tn, "ctx.in.c1.overflow")
			wildcardTokens(t, ctx, agent, tn, "turn", "overflow")
			// Naming the other tenant is only a conversation id of one's own.
			agent.publishOK(t, ctx, tn, "ctx.in."+ot+".turn", uuid.NewString())
			wantIn["ctx.in."+tn+"."+ot+".turn"] = input(tn, "ctx.in."+ot+".turn")

			for _, q := range []string{"history", "status", "events"} {
				s := agent.queryOK(t, q)
				if s.Subject != "ctx.q."+tn+"."+q || !strings.HasPrefix(s.Reply, "_R_.") {
					t.Fatalf("ctx.q.%s reached the service as %s with reply %s, want ctx.q.%s.%s with an _R_. reply", q, s.Subject, s.Reply, tn, q)
				}
			}

			agent.refused(t, "ctx.in.c1.condense", agent.jsPublish(tn, "ctx.in.c1.condense"))
			agent.refused(t, "ctx.in.c1.rewind", agent.jsPublish(tn, "ctx.in.c1.rewind"))
			agent.refused(t, "ctx.in.c1.pin", agent.jsPublish(tn, "ctx.in.c1.pin"))
			agent.refused(t, "ctx.in."+ot+".c1.turn", agent.jsPublish(tn, "ctx.in."+ot+".c1.turn"))
			agent.refused(t, "ctx.q."+ot+".history", func(ctx context.Context) error {
				_, err := agent.nc.RequestWithContext(ctx, "ctx.q."+ot+".history", []byte(`{}`))
				return err
			})
			// The tenant's mappings (nats.conf) apply before permissions: the
			// refusal names the mapped subject.
			agent.publishRefused(t, "_dropped.ctx.events.c1.condense_context", "ctx.events.c1.condense_context")
			agent.publishRefused(t, "_dropped.ctx.progress.c1.context_managing", "ctx.progress.c1.context_managing")
			agent.publishRefused(t, "$KV.ctx_profiles.default")
			agent.refused(t, "$JS.API.STREAM.INFO.CTX_IN", func(ctx context.Context) error {
				_, err := agent.js.Stream(ctx, bus.StreamIn)
				return err
			})
			// The changelog holds every tenant's inputs and history: no
			// tenant writes a record into it or reads one out of it.
			agent.publishRefused(t, bus.StateSubject(0))
			// Queries passed between the service's instances carry the
			// tenant in their subject: no tenant names one.
			agent.publishRefused(t, "ctx.own.0."+ot+".history")
			// Nor asks every instance for its conversations.
			agent.publishRefused(t, "ctx.all.conversations")
			agent.refused(t, "$JS.API.DIRECT.GET.CTX_STATE", func(ctx context.Context) error {
				_, err := agent.js.Conn().RequestWithContext(ctx, "$JS.API.DIRECT.GET.CTX_STATE", []byte(`{"seq":1}`))
				return err
			})
			agent.refused(t, "$JS.API.CONSUMER.CREATE.CTX_STATE", func(ctx context.Context) error {
				_, err := agent.js.OrderedConsumer(ctx, bus.StreamState, jetstream.OrderedConsumerConfig{})
				return err
			})
			for _, s := range []string{"ctx.events.>", "ctx.progress.>", "ctx.in.>", "ctx.q.>", "ctx.state.>", "ctx.all.>", ">",
				"_INBOX.>", "_INBOX_" + tn + "-ui.>", "_INBOX_" + ot + "-agent.>", "_INBOX_ctxpipe.>"} {
				agent.subscribeRefused(t, s)
			}
		})

		ui := uis[tn]
		t.Run(tn+"-ui", func(t *testing.T) {
			for _, kind := range []string{"condense", "rewind", "pin"} {
				subj := "ctx.in.c1." + kind
				if ack := ui.publishOK(t, ctx, tn, subj, uuid.NewString()); ack.Stream != bus.StreamIn {
					t.Fatalf("%s: ack %+v", kind, ack)
				}
				wantIn["ctx.in."+tn+".c1."+kind] = input(tn, subj)
			}
			wildcardTokens(t, ctx, ui, tn, "condense", "rewind", "pin")
			for _, q := range []string{"history", "status", "events"} {
				if s := ui.queryOK(t, q); s.Subject != "ctx.q."+tn+"."+q {
					t.Fatalf("ctx.q.%s reached the service as %s", q, s.Subject)
				}
			}

			// Live events and progress, without the tenant in the subject;
			// the other tenant's, published first, never arrive.
			evs, err := ui.nc.SubscribeSync("ctx.events.>")
			if err != nil {
				t.Fatal(err)
			}
			defer evs.Unsubscribe()
			prog, err := ui.nc.SubscribeSync("ctx.progress.>")
			if err != nil {
				t.Fatal(err)
			}
			defer prog.Unsubscribe()
			if err := ui.nc.Flush(); err != nil {
				t.Fatal(err)
			}
			event(t, ctx, svc, ot, "c1")
			event(t, ctx, svc, tn, "c1")
			progress(ot, "c1")
			progress(tn, "c1")
			if m := next(t, evs); m.Subject != "ctx.events.c1.condense_context" || !strings.Contains(string(m.Data), `"`+tn+`"`) {
				t.Fatalf("first event: %s %s, want %s's c1", m.Subject, m.Data, tn)
			}
			if m := next(t, prog); m.Subject != "ctx.progress.c1.context_managing" || !strings.Contains(string(m.Data), `"`+tn+`"`) {
				t.Fatalf("first progress: %s %s, want %s's c1", m.Subject, m.Data, tn)
			}

			ui.refused(t, "ctx.in.c1.turn", ui.jsPublish(tn, "ctx.in.c1.turn"))
			ui.refused(t, "ctx.in.c1.overflow", ui.jsPublish(tn, "ctx.in.c1.overflow"))
			ui.publishRefused(t, "_dropped.ctx.events.c1.rewind", "ctx.events.c1.rewind")
			// No consumer anywhere: neither create (a replay goes through
			// ctx.q.events) nor delete, its own or the service's.
			ui.refused(t, "$JS.API.CONSUMER.CREATE.CTX_EVENTS", func(ctx context.Context) error {
				_, err := ui.js.OrderedConsumer(ctx, bus.StreamEvents, jetstream.OrderedConsumerConfig{})
				return err
			})
			ui.refused(t, "$JS.API.CONSUMER.DELETE.CTX_EVENTS.audit", func(ctx context.Context) error {
				return ui.js.DeleteConsumer(ctx, bus.StreamEvents, "audit")
			})
			ui.refused(t, "$JS.API.CONSUMER.DELETE.CTX_IN."+bus.ConsumerName, func(ctx context.Context) error {
				return ui.js.DeleteConsumer(ctx, bus.StreamIn, bus.ConsumerName)
			})
			ui.publishRefused(t, bus.StateSubject(bus.DefaultPartitions))
			ui.refused(t, "$JS.API.CONSUMER.CREATE.CTX_STATE", func(ctx context.Context) error {
				_, err := ui.js.OrderedConsumer(ctx, bus.StreamState, jetstream.OrderedConsumerConfig{})
				return err
			})
			for _, s := range []string{"ctx.in.>", "ctx.q.>", "ctx.state.>", "_INBOX.>", "_INBOX_" + tn + "-agent.>", "_INBOX_" + ot + "-ui.>"} {
				ui.subscribeRefused(t, s)
			}
		})
	}

	t.Run("inbox prefix", func(t *testing.T) {
		// A client that keeps the library's _INBOX. cannot even receive
		// its own replies: the prefix is enforced, not a convention.
		u := &user{name: "acme-agent (plain _INBOX)", errs: make(chan error, 16)}
		u.nc = natstest.Connect(t, url, nats.UserInfo("acme-agent", password("acme-agent")),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { u.errs <- err }))
		u.refused(t, "_INBOX.", func(ctx context.Context) error {
			_, err := u.nc.RequestWithContext(ctx, "ctx.q.status", []byte(`{}`))
			return err
		})
	})

	// CTX_IN holds exactly the inputs that were allowed, each under its
	// own tenant: acme's c1 and globex's c1 are different conversations.
	var inputs []jetstream.Msg
	t.Run("tenants do not collide", func(t *testing.T) {
		inputs = readStream(t, ctx, svc.js, bus.StreamIn, 1)
		got := map[string][]byte{}
		for _, m := range inputs {
			subj := published(m.Subject())
			if _, dup := got[subj]; dup {
				t.Errorf("%s stored twice", subj)
			}
			got[subj] = m.Data()
		}
		for subj, body := range wantIn {
			if string(got[subj]) != string(body) {
				t.Errorf("CTX_IN %s holds %q, want %q", subj, got[subj], body)
			}
		}
		if len(got) != len(wantIn) {
			t.Errorf("CTX_IN holds %d inputs, want %d: a refused publish got through: %v", len(got), len(wantIn), got)
		}
	})

	t.Run("forged replies", func(t *testing.T) {
		forgedReplies(t, ctx, url, svc, agents, uis, queries, uint64(len(inputs)))
	})
}

// streamState is what a forged reply could change in a stream.
type streamState struct{ Msgs, Bytes, LastSeq uint64 }

func state(t *testing.T, ctx context.Context, js jetstream.JetStream, name string) streamState {
	t.Helper()
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	st := s.CachedInfo().State
	return streamState{st.Msgs, st.Bytes, st.LastSeq}
}

// forgedReplies sends every query and every input of every tenant user
// with a reply subject naming the service's streams, buckets, API, the
// other roles' subjects and inboxes, and requires that nothing changed: the
// buckets and CTX_EVENTS are identical, CTX_IN holds exactly the forged
// messages' own inputs (never a reply or a PubAck), and no UI of either
// tenant saw a reply as an event.
func forgedReplies(t *testing.T, ctx context.Context, url string, svc *user, agents, uis map[string]*user, queries chan seen, inputsBefore uint64) {
	buckets := []string{"KV_" + bus.ProfilesBucket, "KV_" + locksBucket}
	before := map[string]streamState{}
	for _, name := range append([]string{bus.StreamIn, bus.StreamEvents}, buckets...) {
		before[name] = state(t, ctx, svc.js, name)
	}
	if before[bus.StreamIn].Msgs != inputsBefore {
		t.Fatalf("CTX_IN holds %d messages, the test read %d", before[bus.StreamIn].Msgs, inputsBefore)
	}
	profiles, err := svc.js.KeyValue(ctx, bus.ProfilesBucket)
	if err != nil {
		t.Fatal(err)
	}
	entry := func(id string) string {
		e, err := profiles.Get(ctx, id)
		if err != nil {
			t.Fatalf("profile %s: %v", id, err)
		}
		return fmt.Sprintf("rev %d %s", e.Revision(), e.Value())
	}
	defaultBefore, gptBefore := entry("default"), entry("gpt-4o")

	// Every UI listens, live, for anything on the event and progress subjects.
	live := map[string][2]*nats.Subscription{}
	for tn, ui := range uis {
		evs, err1 := ui.nc.SubscribeSync("ctx.events.>")
		prog, err2 := ui.nc.SubscribeSync("ctx.progress.>")
		if err := errors.Join(err1, err2, ui.nc.Flush()); err != nil {
			t.Fatal(err)
		}
		live[tn] = [2]*nats.Subscription{evs, prog}
	}

	replies := func(tn string) []string {
		ot := other(tn)
		return []string{
			"$KV.ctx_profiles.default", "$KV.ctx_profiles.gpt-4o", "$KV." + locksBucket + ".ctxpipe",
			"$JS.API.STREAM.DELETE.CTX_IN", "$JS.API.STREAM.PURGE.CTX_EVENTS", "$JS.API.CONSUMER.DELETE.CTX_IN.ctxpipe",
			"ctx.in.c1.turn", "ctx.in.c1.condense", "ctx.in.c1.overflow", "ctx.in." + ot + ".c1.turn",
			"ctx.events.c1.condense_context", "ctx.progress.c1.context_managing",
			"ctx.events." + tn + ".c1.condense_context", "ctx.events." + ot + ".c1.condense_context",
			"ctx.q.status", "ctx.q.history", "ctx.q." + ot + ".status",
			"_INBOX_" + tn + "-ui.x", "_INBOX_" + ot + "-agent.x", "_INBOX_ctxpipe.x", "_R_.x.y",
		}
	}
	// The inputs the forged messages themselves legitimately carry.
	wantNew := map[string]int{}
	nForged := 0
	for _, tn := range tenants {
		for _, u := range []*user{agents[tn], uis[tn]} {
			kind := "turn"
			if u == uis[tn] {
				kind = "condense"
			}
			for _, reply := range replies(tn) {
				body := fmt.Appendf(nil, `{"forged_reply":%q}`, reply)
				if err := u.nc.PublishRequest("ctx.q.status", reply, body); err != nil {
					t.Fatal(err)
				}
				// The server forwards no message (a request, an input)
				// whose reply is already one of its own _R_ subjects.
				if !strings.HasPrefix(reply, "_R_.") {
					nForged++
				}
				msg := nats.NewMsg("ctx.in.forged." + kind)
				msg.Reply, msg.Data = reply, input(tn, msg.Subject)
				msg.Header.Set(jetstream.MsgIDHeader, uuid.NewString())
				if err := u.nc.PublishMsg(msg); err != nil {
					t.Fatal(err)
				}
				if !strings.HasPrefix(reply, "_R_.") {
					wantNew["ctx.in."+tn+".forged."+kind]++
				}
			}
		}
	}

	// Barriers. The responder answers in order, so once each agent's own
	// query is answered, every forged one before it was, and its reply
	// routed; a PubAck from CTX_IN then means every message that reached
	// the stream before it is stored; the service's events reach the UIs
	// after anything the forged replies could have sent them.
	for _, tn := range tenants {
		agents[tn].queryOK(t, "status")
		agents[tn].publishOK(t, ctx, tn, "ctx.in.barrier.turn", uuid.NewString())
		wantNew["ctx.in."+tn+".barrier.turn"]++
	}
	var forged []seen
	for len(queries) > 0 {
		s := <-queries
		if strings.Contains(s.Body, "forged_reply") {
			forged = append(forged, s)
		}
	}
	if len(forged) != nForged {
		t.Fatalf("the service saw %d forged queries, want %d", len(forged), nForged)
	}
	for _, s := range forged {
		if !strings.HasPrefix(s.Reply, "_R_.") || s.Reply == "_R_.x.y" {
			t.Errorf("a forged query reached the service with reply %s (%s)", s.Reply, s.Body)
		}
		if strings.Contains(s.Body, `"$KV.ctx_profiles.default"`) && s.Subject == "ctx.q.acme.status" {
			t.Logf("acme asked ctx.q.status with reply $KV.ctx_profiles.default; the service saw %s reply %s", s.Subject, s.Reply)
		}
	}
	for _, tn := range tenants {
		event(t, ctx, svc, tn, "barrier")
		if err := svc.nc.Publish("ctx.progress."+tn+".barrier.context_managing", input(tn, "barrier")); err != nil {
			t.Fatal(err)
		}
	}
	for tn, subs := range live {
		for _, sub := range subs {
			m := next(t, sub)
			if !strings.Contains(m.Subject, ".barrier.") {
				t.Errorf("%s-ui received %s %q: a forged reply posing as an event", tn, m.Subject, m.Data)
			}
			_ = sub.Unsubscribe()
		}
	}

	// Nothing changed but what the barriers and the forged messages' own
	// inputs added.
	for _, name := range buckets {
		if after := state(t, ctx, svc.js, name); after != before[name] {
			t.Errorf("%s changed: %+v, was %+v", name, after, before[name])
		}
	}
	if a, b := entry("default"), defaultBefore; a != b {
		t.Errorf("profile default is %s, was %s", a, b)
	}
	if a, b := entry("gpt-4o"), gptBefore; a != b {
		t.Errorf("profile gpt-4o is %s, was %s", a, b)
	}
	ev := state(t, ctx, svc.js, bus.StreamEvents)
	if ev.LastSeq != before[bus.StreamEvents].LastSeq+uint64(len(tenants)) {
		t.Errorf("CTX_EVENTS: last seq %d, want %d (the barriers only)", ev.LastSeq, before[bus.StreamEvents].LastSeq+uint64(len(tenants)))
	}
	got := map[string]int{}
	for _, m := range readStream(t, ctx, svc.js, bus.StreamIn, before[bus.StreamIn].LastSeq+1) {
		subj := published(m.Subject())
		tn := strings.Split(subj, ".")[2]
		if !strings.Contains(string(m.Data()), `"tenant":"`+tn+`"`) {
			t.Errorf("CTX_IN %s holds %q: not an input of %s", m.Subject(), m.Data(), tn)
		}
		got[subj]++
	}
	for subj, n := range wantNew {
		if got[subj] != n {
			t.Errorf("CTX_IN gained %d × %s, want %d", got[subj], subj, n)
		}
	}
	for subj, n := range got {
		if wantNew[subj] == 0 {
			t.Errorf("CTX_IN gained %d × %s, which nobody published", n, subj)
		}
	}
}

// event publishes an event of a tenant's conversation as the outbox relay
// does, and waits for CTX_EVENTS to store it.
func event(t *testing.T, ctx context.Context, svc *user, tenant, conv string) {
	t.Helper()
	subj := "ctx.events." + tenant + "." + conv + ".condense_context"
	if _, err := svc.js.Publish(ctx, subj, input(tenant, subj), jetstream.WithMsgID(uuid.NewString())); err != nil {
		t.Fatalf("ctxpipe publishes %s: %v", subj, err)
	}
}

// TestNATSConfLimits checks settings of nats.conf that the code depends on.
func TestNATSConfLimits(t *testing.T) {
	opts, err := server.ProcessConfigFile("../nats.conf")
	if err != nil {
		t.Fatal(err)
	}
	if got := opts.MaxPayload; got < bus.MaxMsgSize {
		t.Errorf("max_payload %d < bus.MaxMsgSize %d: the largest input would be refused", got, bus.MaxMsgSize)
	}
	s, _ := natstest.RunWithConfig(t, "../nats.conf")
	// Only CTX has JetStream: no other account can hold a stream, a
	// consumer or a bucket of its own, nor reach CTX's but through imports.
	for _, name := range []string{"ADMIN", "ACME", "GLOBEX"} {
		acc, err := s.LookupAccount(name)
		if err != nil {
			t.Fatal(err)
		}
		if acc.JetStreamEnabled() {
			t.Errorf("account %s has JetStream", name)
		}
	}
	acc, err := s.LookupAccount("CTX")
	if err != nil {
		t.Fatal(err)
	}
	// A reply later than the export's response threshold is dropped; the
	// longest is a history query waiting for its input.
	for _, tn := range tenants {
		for _, export := range []string{"ctx.q." + tn + ".>", "ctx.in." + tn + ".>"} {
			d, err := acc.ServiceExportResponseThreshold(export)
			if err != nil {
				t.Fatalf("export %s: %v", export, err)
			}
			if d <= schema.MaxQueryTimeout {
				t.Errorf("export %s: response threshold %v <= the longest query wait %v", export, d, schema.MaxQueryTimeout)
			}
		}
	}
}

// Each user's reply subjects are under the prefix nats.conf lets it
// subscribe to: derived from --nats-user unless --nats-inbox-prefix says.
func TestConnConfigInboxPrefix(t *testing.T) {
	for _, tt := range []struct {
		cfg  bus.ConnConfig
		want string
	}{
		{bus.ConnConfig{}, nats.InboxPrefix[:len(nats.InboxPrefix)-1]}, // the library's _INBOX
		{bus.ConnConfig{User: "acme-agent"}, "_INBOX_acme-agent"},
		{bus.ConnConfig{User: "a.b*c>d e"}, "_INBOX_a_b_c_d_e"}, // one subject token whatever the name
		{bus.ConnConfig{User: "acme-agent", InboxPrefix: "_INBOX_x"}, "_INBOX_x"},
		{bus.ConnConfig{Token: "t", InboxPrefix: "_INBOX_acme-ui"}, "_INBOX_acme-ui"}, // no user name to derive from
	} {
		opts, err := tt.cfg.Options()
		if err != nil {
			t.Fatal(err)
		}
		o := nats.GetDefaultOptions()
		for _, f := range opts {
			if err := f(&o); err != nil {
				t.Fatal(err)
			}
		}
		got := o.InboxPrefix
		if got == "" {
			got = nats.InboxPrefix[:len(nats.InboxPrefix)-1]
		}
		if got != tt.want {
			t.Errorf("%+v: inbox prefix %q, want %q", tt.cfg, got, tt.want)
		}
	}
}

// published is a stored CTX_IN subject as it was published: the partition
// token the stream's transform inserted taken out.
func published(stored string) string {
	_, subj, _ := bus.SplitInputSubject(stored, bus.DefaultPartitions)
	return subj
}
