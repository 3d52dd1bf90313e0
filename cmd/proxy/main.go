// Command proxy is ctxpipe behind a base URL: an OpenAI- and
// Anthropic-compatible HTTP server that records every request's new turns
// in ctxpipe, forwards the conversation's effective history to the real
// provider and relays its reply unchanged (see docs/proxy.md).
//
//	NATS_USER=acme-agent NATS_PASSWORD=acme-agent-demo-password proxy
//	ANTHROPIC_BASE_URL=http://127.0.0.1:8788 claude
//
// It connects to NATS as an agent does, with one tenant's credentials
// (--nats-* flags, NATS_* variables). Provider keys come from the
// environment, never from flags, and are never logged: without one the
// client's own Authorization or x-api-key header goes through.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/client"
	"github.com/ctxpipe/ctxpipe/proxy"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "proxy:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	var conn bus.ConnConfig
	conn.RegisterFlags(fs)
	listen := fs.String("listen", "127.0.0.1:8788", "HTTP address the agents' base URL points at")
	openaiURL := fs.String("openai-base-url", envOr("CTXPIPE_PROXY_OPENAI_BASE_URL", "https://api.openai.com/v1"),
		"the OpenAI-compatible upstream (env CTXPIPE_PROXY_OPENAI_BASE_URL); its key: env CTXPIPE_PROXY_OPENAI_KEY")
	anthURL := fs.String("anthropic-base-url", envOr("CTXPIPE_PROXY_ANTHROPIC_BASE_URL", "https://api.anthropic.com"),
		"the Anthropic upstream (env CTXPIPE_PROXY_ANTHROPIC_BASE_URL); its key: env CTXPIPE_PROXY_ANTHROPIC_KEY")
	tenant := fs.String("tenant", "", "from the service's own account: the tenant whose conversations these are (operators only; a tenant's own credentials need none)")
	profile := fs.String("profile", "", "the profile the turns name (default: the conversation's, else the service's default)")
	secretFile := fs.String("id-secret-file", filepath.Join("data", "proxy-id.secret"),
		"file holding the secret that keys turn ids, made on first start (env CTXPIPE_PROXY_ID_SECRET overrides); every proxy of a tenant must share it")
	maxBody := fs.Int64("max-body-bytes", 32<<20, "largest request body accepted")
	headerTimeout := fs.Duration("upstream-timeout", 10*time.Minute, "how long to wait for the upstream's response headers before answering 504")
	idleTimeout := fs.Duration("upstream-idle-timeout", 5*time.Minute, "how long a pause in the upstream's reply may last before it is cut")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	conn.Log = log
	if conn.Name == "" {
		conn.Name = "ctxpipe-proxy"
	}
	secret, err := loadSecret(*secretFile)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	nc, err := bus.ConnectRetry(ctx, conn)
	if err != nil {
		return err
	}
	defer nc.Close()
	var opts []client.Option
	if *tenant != "" {
		opts = append(opts, client.WithTenant(*tenant))
	}
	c, err := client.New(nc, opts...)
	if err != nil {
		return err
	}
	p := proxy.New(c, proxy.Config{
		OpenAI:        proxy.Upstream{BaseURL: *openaiURL, APIKey: os.Getenv("CTXPIPE_PROXY_OPENAI_KEY")},
		Anthropic:     proxy.Upstream{BaseURL: *anthURL, APIKey: os.Getenv("CTXPIPE_PROXY_ANTHROPIC_KEY")},
		Secret:        secret,
		ProfileID:     *profile,
		MaxBodyBytes:  *maxBody,
		HeaderTimeout: *headerTimeout,
		IdleTimeout:   *idleTimeout,
		Log:           log,
	})
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 30 * time.Second}
	log.Info("proxy: listening", "addr", ln.Addr().String(), "openai", *openaiURL, "anthropic", *anthURL,
		"openai_key", keySource("CTXPIPE_PROXY_OPENAI_KEY"), "anthropic_key", keySource("CTXPIPE_PROXY_ANTHROPIC_KEY"))
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// keySource says where an upstream key comes from, without the key.
func keySource(env string) string {
	if os.Getenv(env) != "" {
		return "configured (" + env + ")"
	}
	return "passed through from the client"
}

// loadSecret reads the id secret from the environment or the file, making
// the file with 32 random bytes when it does not exist.
func loadSecret(path string) ([]byte, error) {
	if s := os.Getenv("CTXPIPE_PROXY_ID_SECRET"); s != "" {
		return []byte(s), nil
	}
	b, err := os.ReadFile(path)
	if err == nil {
		if s := strings.TrimSpace(string(b)); len(s) >= 16 {
			return []byte(s), nil
		}
		return nil, fmt.Errorf("%s: the id secret is shorter than 16 characters", path)
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	s := rand.Text()
	if err := os.WriteFile(path, []byte(s+"\n"), 0o600); err != nil {
		return nil, err
	}
	return []byte(s), nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
