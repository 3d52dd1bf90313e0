package bus

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ctxpipe/ctxpipe/internal/backoff"
)

// ConnConfig says where the NATS server is and who we are. At most one way
// of authenticating should be set: user/password, token, a creds file (JWT
// + seed) or an nkey seed file.
type ConnConfig struct {
	URL       string
	User      string
	Password  string
	Token     string
	CredsFile string
	NKeyFile  string
	// Name labels the connection in the server's monitoring (connz) and in
	// every log line about it. Empty: the nats.Name a caller passes to
	// Connect, else the program's name.
	Name string
	// Log receives every line about the connection (nil: slog.Default()),
	// so they follow the service's --log-format and --log-level.
	Log *slog.Logger
	// InboxPrefix is the prefix of the connection's reply subjects
	// (nats.CustomInboxPrefix). nats.conf lets each user subscribe only to
	// its own, _INBOX_<user>, so that no user can read another's replies.
	// Empty: _INBOX_<User> when User is set, else the library's _INBOX.
	InboxPrefix string
}

// RegisterFlags registers --nats-url, --nats-user, --nats-password,
// --nats-token, --nats-creds, --nats-nkey and --nats-inbox-prefix on fs.
// Their defaults come from the environment (NATS_URL, NATS_USER,
// NATS_PASSWORD, NATS_TOKEN, NATS_CREDS, NATS_NKEY, NATS_INBOX_PREFIX), so
// secrets need not appear on a command line.
func (c *ConnConfig) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.URL, "nats-url", envOr("NATS_URL", nats.DefaultURL), "NATS server URL(s), comma-separated (env NATS_URL)")
	fs.StringVar(&c.User, "nats-user", os.Getenv("NATS_USER"), "NATS user (env NATS_USER)")
	fs.StringVar(&c.Password, "nats-password", os.Getenv("NATS_PASSWORD"), "NATS password (env NATS_PASSWORD)")
	fs.StringVar(&c.Token, "nats-token", os.Getenv("NATS_TOKEN"), "NATS token (env NATS_TOKEN)")
	fs.StringVar(&c.CredsFile, "nats-creds", os.Getenv("NATS_CREDS"), "NATS credentials file (env NATS_CREDS)")
	fs.StringVar(&c.NKeyFile, "nats-nkey", os.Getenv("NATS_NKEY"), "NATS nkey seed file (env NATS_NKEY)")
	fs.StringVar(&c.InboxPrefix, "nats-inbox-prefix", os.Getenv("NATS_INBOX_PREFIX"), "prefix of reply subjects; default _INBOX_<user> with --nats-user, else _INBOX (env NATS_INBOX_PREFIX)")
}

// inboxPrefix is InboxPrefix, else _INBOX_<User> with every character a
// subject token cannot hold replaced by '_', else "" (the library's).
func (c ConnConfig) inboxPrefix() string {
	if c.InboxPrefix != "" || c.User == "" {
		return c.InboxPrefix
	}
	return "_INBOX_" + strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
			return r
		}
		return '_'
	}, c.User)
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// Options turns the configuration into nats.Options: authentication plus
// reconnect settings suited to a long-running service or CLI (reconnect for
// ever with jitter, buffer publishes while reconnecting), and handlers that
// log every change of the connection through c.Log, each with the
// connection's name: an error line is always followed, once things are
// well again, by a recovery line (disconnected → reconnected, slow consumer
// → caught up), or by "closed" when the connection ends.
func (c ConnConfig) Options() ([]nats.Option, error) {
	log := c.logger()
	var downSince atomic.Int64 // unix nanoseconds of the last disconnect; 0 when up
	var slow sync.Map          // *nats.Subscription → watching its recovery
	opts := []nats.Option{
		nats.Name(c.Name),
		nats.Timeout(5 * time.Second),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.ReconnectJitter(250*time.Millisecond, time.Second),
		// 8 MiB: one largest input can be buffered while reconnecting.
		nats.ReconnectBufSize(MaxMsgSize),
		nats.PingInterval(20 * time.Second),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			// A nil error is our own Close: ClosedHandler says so.
			if err == nil {
				return
			}
			downSince.CompareAndSwap(0, time.Now().UnixNano())
			attrs := []any{"name", connName(nc), "err", err}
			if u := nc.ConnectedUrlRedacted(); u != "" {
				attrs = append(attrs, "url", u)
			}
			log.Warn("nats disconnected, reconnecting", attrs...)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			attrs := []any{"name", connName(nc), "url", nc.ConnectedUrlRedacted()}
			if t := downSince.Swap(0); t != 0 {
				attrs = append(attrs, "down", time.Since(time.Unix(0, t)).Round(time.Millisecond))
			}
			log.Info("nats reconnected", attrs...)
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			if downSince.Load() != 0 {
				// Closed while down: it will not come back.
				log.Warn("nats connection closed while disconnected", "name", connName(nc), "err", nc.LastError())
				return
			}
			log.Info("nats connection closed", "name", connName(nc))
		}),
		nats.LameDuckModeHandler(func(nc *nats.Conn) {
			log.Info("nats server entering lame duck mode, moving to another", "name", connName(nc), "url", nc.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(func(nc *nats.Conn, sub *nats.Subscription, err error) {
			attrs := []any{"name", connName(nc), "err", err}
			if sub != nil {
				attrs = append(attrs, "subject", sub.Subject)
			}
			log.Error("nats async error", attrs...)
			if sub != nil && errors.Is(err, nats.ErrSlowConsumer) {
				if _, watching := slow.LoadOrStore(sub, true); !watching {
					go watchSlowConsumer(log, nc, sub, &slow)
				}
			}
		}),
	}
	n := 0
	if c.User != "" || c.Password != "" {
		n++
		opts = append(opts, nats.UserInfo(c.User, c.Password))
	}
	if c.Token != "" {
		n++
		opts = append(opts, nats.Token(c.Token))
	}
	if c.CredsFile != "" {
		n++
		opts = append(opts, nats.UserCredentials(c.CredsFile))
	}
	if c.NKeyFile != "" {
		n++
		o, err := nats.NkeyOptionFromSeed(c.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("nats nkey %s: %w", c.NKeyFile, err)
		}
		opts = append(opts, o)
	}
	if n > 1 {
		return nil, errors.New("nats: set only one of user/password, token, creds or nkey")
	}
	if p := c.inboxPrefix(); p != "" {
		opts = append(opts, nats.CustomInboxPrefix(p))
	}
	return opts, nil
}

// watchSlowConsumer follows a subscription that dropped messages until it
// is closed, and logs each time it keeps up again after falling behind, so
// that the slow consumer error line has its recovery line.
func watchSlowConsumer(log *slog.Logger, nc *nats.Conn, sub *nats.Subscription, watching *sync.Map) {
	defer watching.Delete(sub)
	behind := true // the async error that started us said so
	for st := range sub.StatusChanged(nats.SubscriptionActive, nats.SubscriptionSlowConsumer, nats.SubscriptionClosed) {
		switch st {
		case nats.SubscriptionSlowConsumer:
			behind = true
		case nats.SubscriptionActive:
			if behind {
				dropped, _ := sub.Dropped()
				log.Info("nats subscription caught up", "name", connName(nc), "subject", sub.Subject, "dropped_total", dropped)
			}
			behind = false
		case nats.SubscriptionClosed:
			return
		}
		if nc.IsClosed() {
			return
		}
	}
}

func (c ConnConfig) logger() *slog.Logger {
	if c.Log != nil {
		return c.Log
	}
	return slog.Default()
}

// connName is the name the connection was made with (ConnConfig.Name, or
// the nats.Name a caller passed), else the program's name: a log line
// always says which connection it is about.
func connName(nc *nats.Conn) string {
	if nc.Opts.Name != "" {
		return nc.Opts.Name
	}
	return defaultName()
}

func defaultName() string { return filepath.Base(os.Args[0]) }

// effectiveOptions applies opts as nats.Connect would, to learn the name the
// connection will have before it exists.
func effectiveOptions(opts []nats.Option) nats.Options {
	o := nats.GetDefaultOptions()
	for _, f := range opts {
		_ = f(&o) // the errors are nats.Connect's to report
	}
	return o
}

// Connect connects with cfg. Options in extra are applied after ours, so a
// caller can replace, say, the error handler, or name the connection with
// nats.Name when cfg.Name is empty.
func Connect(cfg ConnConfig, extra ...nats.Option) (*nats.Conn, error) {
	opts, err := cfg.Options()
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(cfg.url(), append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats %s: %w", redact(cfg.url()), err)
	}
	return nc, nil
}

func (c ConnConfig) url() string {
	if c.URL == "" {
		return nats.DefaultURL
	}
	return c.URL
}

// startRetry is the backoff of ConnectRetry and RetryStart: from 250 ms
// doubling to 10 s, each wait drawn between half and all of its step, so
// that instances started together do not retry in step.
var startRetry = backoff.Policy{First: 250 * time.Millisecond, Max: 10 * time.Second, Jitter: true}

// ConnectRetry connects like Connect, but when no server is reachable it
// logs that and tries again, with exponential backoff (capped, jittered),
// until it connects or ctx is done; then it returns an error wrapping
// ctx.Err(). An error that retrying cannot cure (a bad configuration, an
// authorization refused) is returned at once.
//
// It blocks rather than using nats.RetryOnFailedConnect, which returns a
// connection that is not connected yet: every JetStream call made with it
// (creating the streams, the consumer, the profiles watch) would then fail
// or time out on its own, each needing its own retry, and nothing would say
// the broker is the problem.
func ConnectRetry(ctx context.Context, cfg ConnConfig, extra ...nats.Option) (*nats.Conn, error) {
	log := cfg.logger()
	opts, err := cfg.Options()
	if err != nil {
		return nil, err
	}
	opts = append(opts, extra...)
	name := effectiveOptions(opts).Name
	if name == "" {
		name = defaultName()
	}
	url := redact(cfg.url())
	start := time.Now()
	b := backoff.New(startRetry)
	for attempt := 1; ; attempt++ {
		nc, err := connectCtx(ctx, cfg.url(), opts)
		if err == nil {
			attrs := []any{"name", name, "url", nc.ConnectedUrlRedacted()}
			if attempt > 1 {
				attrs = append(attrs, "attempts", attempt, "waited", time.Since(start).Round(time.Millisecond))
			}
			log.Info("nats connected", attrs...)
			return nc, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("connect to nats %s: gave up after %d attempts: %w", url, attempt, ctx.Err())
		}
		if !retryable(err) {
			return nil, fmt.Errorf("connect to nats %s: %w", url, err)
		}
		wait := b.Next()
		log.Warn(fmt.Sprintf("nats not reachable, retrying in %v", wait.Round(time.Millisecond)),
			"name", name, "url", url, "attempt", attempt, "err", err)
		if serr := backoff.Sleep(ctx, wait); serr != nil {
			return nil, fmt.Errorf("connect to nats %s: gave up after %d attempts: %w", url, attempt, serr)
		}
	}
}

// connectCtx is nats.Connect that returns as soon as ctx is done; a
// connection made after that is closed.
func connectCtx(ctx context.Context, url string, opts []nats.Option) (*nats.Conn, error) {
	type result struct {
		nc  *nats.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		nc, err := nats.Connect(url, opts...)
		done <- result{nc, err}
	}()
	select {
	case r := <-done:
		return r.nc, r.err
	case <-ctx.Done():
		go func() {
			if r := <-done; r.nc != nil {
				r.nc.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// retryable reports whether a failed connect may succeed later: the server
// is down or unreachable, not refusing us.
func retryable(err error) bool {
	for _, permanent := range []error{nats.ErrAuthorization, nats.ErrAuthExpired, nats.ErrAuthRevoked, nats.ErrAccountAuthExpired,
		nats.ErrNkeysNotSupported, nats.ErrNoUserCB, nats.ErrNkeyButNoSigCB, nats.ErrSecureConnRequired, nats.ErrSecureConnWanted} {
		if errors.Is(err, permanent) {
			return false
		}
	}
	return true
}

// redact hides credentials embedded in URLs (nats://user:pass@host), for
// error messages. url may be a comma-separated list.
func redact(url string) string {
	parts := strings.Split(url, ",")
	for i, p := range parts {
		scheme, rest, ok := strings.Cut(p, "://")
		if !ok {
			continue
		}
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			parts[i] = scheme + "://***@" + rest[at+1:]
		}
	}
	return strings.Join(parts, ",")
}
