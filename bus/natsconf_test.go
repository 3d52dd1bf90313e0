package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/schema"
)

// The demo passwords written in nats.conf.
var passwords = map[string]string{
	"ctxpipe": "ctxpipe-demo-password",
	"agent":   "agent-demo-password",
	"ui":      "ui-demo-password",
}

// user is one connection as a nats.conf user, with its async errors
// (where the server's permission violations arrive) on a channel.
type user struct {
	name string
	nc   *nats.Conn
	js   jetstream.JetStream
	errs chan error
}

func connectAs(t *testing.T, url, name string) *user {
	t.Helper()
	u := &user{name: name, errs: make(chan error, 64)}
	u.nc = natstest.Connect(t, url,
		nats.UserInfo(name, passwords[name]),
		nats.Name(name),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case u.errs <- err:
			default:
			}
		}))
	js, err := jetstream.New(u.nc)
	if err != nil {
		t.Fatal(err)
	}
	u.js = js
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

// refused runs op (a publish or request that only an answer would end) and
// requires the server to refuse it with a permission violation naming
// subject; op must then fail rather than succeed.
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

func (u *user) jsPublish(subject string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		_, err := bus.PublishInput(ctx, u.js, subject, uuid.NewString(), []byte(`{}`))
		return err
	}
}

func (u *user) publishOK(t *testing.T, ctx context.Context, subject string) {
	t.Helper()
	if _, err := bus.PublishInput(ctx, u.js, subject, uuid.NewString(), []byte(`{}`)); err != nil {
		t.Fatalf("%s: publish %s: %v", u.name, subject, err)
	}
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

func (u *user) queryOK(t *testing.T, subject, conv string) {
	t.Helper()
	body, _ := json.Marshal(schema.StatusRequest{ConversationID: conv})
	msg, err := u.nc.Request(subject, body, 10*time.Second)
	if err != nil {
		t.Fatalf("%s: request %s: %v", u.name, subject, err)
	}
	var r schema.StatusReply
	if err := schema.DecodeQueryReply(msg.Data, &r); err != nil || r.ConversationID != conv {
		t.Fatalf("%s: %s reply %s (%v)", u.name, subject, msg.Data, err)
	}
}

func TestNATSConfPermissions(t *testing.T) {
	_, url := natstest.RunWithConfig(t, "../nats.conf")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	if _, err := nats.Connect(url, nats.UserInfo("agent", "wrong")); err == nil {
		t.Fatal("agent connected with a wrong password")
	}

	svc := connectAs(t, url, "ctxpipe")
	if err := bus.EnsureStreams(ctx, svc.js); err != nil {
		t.Fatalf("ctxpipe creates the streams: %v", err)
	}
	kv, err := bus.EnsureProfiles(ctx, svc.js)
	if err != nil {
		t.Fatalf("ctxpipe creates the bucket: %v", err)
	}
	// Profile changes apply without restart: the service watches the bucket.
	w, err := kv.Watch(ctx, "default", jetstream.UpdatesOnly())
	if err != nil {
		t.Fatalf("ctxpipe watches profiles: %v", err)
	}
	defer w.Stop()
	if _, err := kv.Put(ctx, "default", []byte(`{"id":"default","context_window":16000}`)); err != nil {
		t.Fatalf("ctxpipe writes a profile: %v", err)
	}
	for e := range w.Updates() {
		if e != nil && e.Key() == "default" {
			break
		}
	}
	if e, err := kv.Get(ctx, "default"); err != nil || !strings.Contains(string(e.Value()), "16000") {
		t.Fatalf("ctxpipe reads a profile: %v", err)
	}
	// The query responder, as the service runs it: one queue group.
	respond := func(m *nats.Msg) {
		var req schema.StatusRequest
		_ = json.Unmarshal(m.Data, &req)
		b, _ := schema.Marshal(schema.StatusReply{ConversationID: req.ConversationID})
		_ = m.Respond(b)
	}
	for _, subj := range []string{schema.SubjectHistory, schema.SubjectStatus} {
		if _, err := svc.nc.QueueSubscribe(subj, bus.QueueGroup, respond); err != nil {
			t.Fatal(err)
		}
	}
	if err := svc.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	events := func(conv string) { // the outbox relay
		t.Helper()
		ev := &schema.CondenseContext{EventHeader: schema.EventHeader{ID: uuid.NewString(),
			Type: schema.EventCondenseContext, ConversationID: conv, TS: time.Now().UnixMilli()}}
		b, _ := schema.Marshal(ev)
		if _, err := svc.js.Publish(ctx, schema.EventSubject(ev), b, jetstream.WithMsgID(ev.ID)); err != nil {
			t.Fatalf("ctxpipe publishes an event: %v", err)
		}
	}

	t.Run("ctxpipe", func(t *testing.T) {
		// Outside the queue group the service may not listen to queries.
		svc.subscribeRefused(t, "ctx.q.>")
		// Nor may it publish inputs.
		svc.refused(t, "ctx.in.c0.turn", svc.jsPublish("ctx.in.c0.turn"))
	})

	agent := connectAs(t, url, "agent")
	t.Run("agent", func(t *testing.T) {
		agent.publishOK(t, ctx, "ctx.in.c1.turn")
		agent.publishOK(t, ctx, "ctx.in.c1.overflow")
		agent.queryOK(t, schema.SubjectHistory, "c1")
		agent.queryOK(t, schema.SubjectStatus, "c1")

		agent.refused(t, "ctx.in.c1.condense", agent.jsPublish("ctx.in.c1.condense"))
		agent.refused(t, "ctx.in.c1.rewind", agent.jsPublish("ctx.in.c1.rewind"))
		agent.refused(t, "ctx.events.c1.condense_context", func(ctx context.Context) error {
			_, err := agent.js.Publish(ctx, "ctx.events.c1.condense_context", []byte(`{}`))
			return err
		})
		agent.subscribeRefused(t, "ctx.events.>")
		agent.refused(t, "$JS.API.STREAM.DELETE.CTX_IN", func(ctx context.Context) error {
			return agent.js.DeleteStream(ctx, bus.StreamIn)
		})
		agent.refused(t, "$JS.API.CONSUMER.CREATE.CTX_EVENTS", func(ctx context.Context) error {
			_, err := agent.js.OrderedConsumer(ctx, bus.StreamEvents, jetstream.OrderedConsumerConfig{})
			return err
		})
	})

	ui := connectAs(t, url, "ui")
	t.Run("ui", func(t *testing.T) {
		ui.publishOK(t, ctx, "ctx.in.c1.condense")
		ui.publishOK(t, ctx, "ctx.in.c1.rewind")
		ui.queryOK(t, schema.SubjectHistory, "c1")
		ui.queryOK(t, schema.SubjectStatus, "c1")

		// Replay: an ordered consumer on CTX_EVENTS.
		events("c1")
		if _, err := ui.js.Stream(ctx, bus.StreamEvents); err != nil {
			t.Fatalf("ui: stream info: %v", err)
		}
		cons, err := ui.js.OrderedConsumer(ctx, bus.StreamEvents, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{"ctx.events.c1.>"},
		})
		if err != nil {
			t.Fatalf("ui: ordered consumer: %v", err)
		}
		m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("ui: replay: %v", err)
		}
		if m.Subject() != "ctx.events.c1.condense_context" {
			t.Fatalf("ui: replayed %s", m.Subject())
		}
		// Live: a core subscription.
		sub, err := ui.nc.SubscribeSync("ctx.events.>")
		if err != nil {
			t.Fatal(err)
		}
		if err := ui.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		events("c2")
		if m, err := sub.NextMsg(10 * time.Second); err != nil || m.Subject != "ctx.events.c2.condense_context" {
			t.Fatalf("ui: live event %v, %v", m, err)
		}

		ui.refused(t, "ctx.in.c1.turn", ui.jsPublish("ctx.in.c1.turn"))
		ui.refused(t, "ctx.in.c1.overflow", ui.jsPublish("ctx.in.c1.overflow"))
		ui.refused(t, "ctx.events.c1.rewind", func(ctx context.Context) error {
			_, err := ui.js.Publish(ctx, "ctx.events.c1.rewind", []byte(`{}`))
			return err
		})
		ui.refused(t, "$JS.API.STREAM.DELETE.CTX_EVENTS", func(ctx context.Context) error {
			return ui.js.DeleteStream(ctx, bus.StreamEvents)
		})
		// Inputs are not the UI's to read.
		ui.refused(t, "$JS.API.CONSUMER.CREATE.CTX_IN", func(ctx context.Context) error {
			_, err := ui.js.OrderedConsumer(ctx, bus.StreamIn, jetstream.OrderedConsumerConfig{})
			return err
		})
		ui.subscribeRefused(t, "ctx.in.>")
	})

	// The service consumes exactly the inputs that were allowed, with its
	// durable pull consumer, and both streams survived the delete attempts.
	t.Run("ctxpipe consumes", func(t *testing.T) {
		cons, err := svc.js.CreateOrUpdateConsumer(ctx, bus.StreamIn, jetstream.ConsumerConfig{
			Durable: bus.ConsumerName, AckPolicy: jetstream.AckExplicitPolicy,
		})
		if err != nil {
			t.Fatalf("ctxpipe: durable consumer: %v", err)
		}
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]bool{"ctx.in.c1.turn": true, "ctx.in.c1.overflow": true,
			"ctx.in.c1.condense": true, "ctx.in.c1.rewind": true}
		if info.NumPending != uint64(len(want)) {
			t.Fatalf("CTX_IN holds %d inputs, want %d (a refused publish got through?)", info.NumPending, len(want))
		}
		batch, err := cons.Fetch(len(want), jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		for m := range batch.Messages() {
			got[m.Subject()] = true
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatalf("ctxpipe: ack %s: %v", m.Subject(), err)
			}
		}
		if len(got) != len(want) {
			t.Fatalf("consumed %v, want %v", got, want)
		}
		for s := range want {
			if !got[s] {
				t.Errorf("input %s not consumed", s)
			}
		}
		for _, name := range []string{bus.StreamIn, bus.StreamEvents} {
			if _, err := svc.js.Stream(ctx, name); err != nil {
				t.Errorf("stream %s: %v", name, err)
			}
		}
	})
}
