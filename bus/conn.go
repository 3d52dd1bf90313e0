package bus

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
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
	// Name labels the connection in the server's monitoring (connz).
	Name string
}

// RegisterFlags registers --nats-url, --nats-user, --nats-password,
// --nats-token, --nats-creds and --nats-nkey on fs. Their defaults come from
// the environment (NATS_URL, NATS_USER, NATS_PASSWORD, NATS_TOKEN,
// NATS_CREDS, NATS_NKEY), so secrets need not appear on a command line.
func (c *ConnConfig) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.URL, "nats-url", envOr("NATS_URL", nats.DefaultURL), "NATS server URL(s), comma-separated (env NATS_URL)")
	fs.StringVar(&c.User, "nats-user", os.Getenv("NATS_USER"), "NATS user (env NATS_USER)")
	fs.StringVar(&c.Password, "nats-password", os.Getenv("NATS_PASSWORD"), "NATS password (env NATS_PASSWORD)")
	fs.StringVar(&c.Token, "nats-token", os.Getenv("NATS_TOKEN"), "NATS token (env NATS_TOKEN)")
	fs.StringVar(&c.CredsFile, "nats-creds", os.Getenv("NATS_CREDS"), "NATS credentials file (env NATS_CREDS)")
	fs.StringVar(&c.NKeyFile, "nats-nkey", os.Getenv("NATS_NKEY"), "NATS nkey seed file (env NATS_NKEY)")
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// Options turns the configuration into nats.Options: authentication plus
// reconnect settings suited to a long-running service or CLI (reconnect for
// ever with jitter, buffer publishes while reconnecting, log connection
// changes with slog).
func (c ConnConfig) Options() ([]nats.Option, error) {
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
			if err != nil {
				slog.Warn("nats disconnected", "name", c.Name, "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			slog.Info("nats reconnected", "name", c.Name, "url", nc.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(func(nc *nats.Conn, sub *nats.Subscription, err error) {
			attrs := []any{"name", c.Name, "err", err}
			if sub != nil {
				attrs = append(attrs, "subject", sub.Subject)
			}
			slog.Error("nats async error", attrs...)
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
	return opts, nil
}

// Connect connects with cfg. Options in extra are applied after ours, so a
// caller can replace, say, the error handler.
func Connect(cfg ConnConfig, extra ...nats.Option) (*nats.Conn, error) {
	opts, err := cfg.Options()
	if err != nil {
		return nil, err
	}
	url := cfg.URL
	if url == "" {
		url = nats.DefaultURL
	}
	nc, err := nats.Connect(url, append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats %s: %w", redact(url), err)
	}
	return nc, nil
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
