package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Upstream is where one API's requests go.
type Upstream struct {
	// BaseURL is the provider's API base, as an SDK's base URL is given
	// (https://api.openai.com/v1, https://api.anthropic.com): the request's
	// path is appended, its /v1 not repeated.
	BaseURL string
	// APIKey replaces the client's credentials when set; when empty the
	// client's Authorization or x-api-key header goes through. It is never
	// logged.
	APIKey string
	// KeyHeader is the header APIKey travels in: "Authorization" (as a
	// bearer token) or "x-api-key".
	KeyHeader string
}

// hopHeaders are the hop-by-hop headers (RFC 9110, 7.6.1) and the ones the
// proxy sets itself; all others travel unchanged both ways.
var hopHeaders = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Proxy-Connection": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Host": true, "Content-Length": true,
	// The proxy reads the reply to record it: it asks for it uncompressed.
	"Accept-Encoding": true,
}

// copyHeaders copies src into dst, leaving out the hop-by-hop headers,
// those named in Connection, and the proxy's own.
func copyHeaders(dst, src http.Header) {
	drop := map[string]bool{}
	for _, v := range src.Values("Connection") {
		for _, f := range strings.Split(v, ",") {
			drop[http.CanonicalHeaderKey(strings.TrimSpace(f))] = true
		}
	}
	for k, vs := range src {
		if hopHeaders[k] || drop[k] || strings.HasPrefix(k, "X-Ctxpipe-") {
			continue
		}
		dst[k] = append([]string(nil), vs...)
	}
}

// target is the upstream URL for the client's request URL.
func (u *Upstream) target(in *url.URL) (string, error) {
	base, err := url.Parse(u.BaseURL)
	if err != nil || base.Scheme == "" || base.Host == "" {
		return "", fmt.Errorf("upstream base URL %q is not an absolute URL", u.BaseURL)
	}
	p := in.Path
	if strings.HasSuffix(strings.TrimRight(base.Path, "/"), "/v1") {
		p = strings.TrimPrefix(p, "/v1")
	}
	t := strings.TrimRight(base.String(), "/") + p
	if in.RawQuery != "" {
		t += "?" + in.RawQuery
	}
	return t, nil
}

// upstreamError is a failure to get an answer from the upstream: the
// client gets 502, or 504 when the upstream did not answer in time.
type upstreamError struct {
	status int
	err    error
}

func (e *upstreamError) Error() string { return e.err.Error() }
func (e *upstreamError) Unwrap() error { return e.err }

// send forwards the client's request with body to the upstream and
// returns its response (headers read; the body is the caller's to close).
func (p *Proxy) send(ctx context.Context, u *Upstream, in *http.Request, body []byte) (*http.Response, error) {
	target, err := u.target(in.URL)
	if err != nil {
		return nil, &upstreamError{http.StatusBadGateway, err}
	}
	out, err := http.NewRequestWithContext(ctx, in.Method, target, bytes.NewReader(body))
	if err != nil {
		return nil, &upstreamError{http.StatusBadGateway, err}
	}
	copyHeaders(out.Header, in.Header)
	out.Header.Set("Accept-Encoding", "identity")
	if body != nil {
		out.ContentLength = int64(len(body))
		out.Header.Set("Content-Length", strconv.Itoa(len(body)))
	}
	if u.APIKey != "" {
		out.Header.Del("Authorization")
		out.Header.Del("X-Api-Key")
		if strings.EqualFold(u.KeyHeader, "x-api-key") {
			out.Header.Set("X-Api-Key", u.APIKey)
		} else {
			out.Header.Set("Authorization", "Bearer "+u.APIKey)
		}
	}
	resp, err := p.http.Do(out)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded) {
			return nil, &upstreamError{http.StatusGatewayTimeout, fmt.Errorf("the upstream did not answer within %v", p.cfg.HeaderTimeout)}
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &upstreamError{http.StatusBadGateway, fmt.Errorf("the upstream failed: %s", redactURL(err))}
	}
	return resp, nil
}

// redactURL is err's message without any URL's user information.
func redactURL(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		if u, perr := url.Parse(ue.URL); perr == nil {
			u.User = nil
			return fmt.Sprintf("%s %s: %v", ue.Op, u.Redacted(), ue.Err)
		}
	}
	return err.Error()
}

// relay writes the upstream's response to the client unchanged (status,
// headers but hop-by-hop ones, body byte for byte, flushed as it comes for
// streams) with extra headers added, and keeps up to keep bytes of the
// body (nothing, when the body is larger). complete says the body reached
// its end and was written whole.
// A body that stalls longer than the idle bound is cut.
//
// When reading the body fails, what was kept is still returned (complete
// false): everything kept was written to the client. A client may leave as
// soon as a stream's last event reached it, and its leaving ends the
// upstream's read (the request's context is the client's) before the
// body's end; the reply is then whole, which the dialect's reply parser
// tells (it takes a stream only with its final event, and JSON only whole).
func (p *Proxy) relay(w http.ResponseWriter, resp *http.Response, extra http.Header, keep int) (kept []byte, complete bool) {
	h := w.Header()
	copyHeaders(h, resp.Header)
	if resp.ContentLength >= 0 {
		h.Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	}
	for k, vs := range extra {
		h[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	flusher, _ := w.(http.Flusher)
	idle := time.AfterFunc(p.cfg.IdleTimeout, func() { resp.Body.Close() })
	defer idle.Stop()
	var buf bytes.Buffer
	chunk := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(chunk)
		if n > 0 {
			idle.Reset(p.cfg.IdleTimeout)
			if buf.Len()+n <= keep {
				buf.Write(chunk[:n])
			} else {
				keep = -1 // too large to record: keep nothing more
			}
			if _, werr := w.Write(chunk[:n]); werr != nil {
				return nil, false
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		if errors.Is(err, io.EOF) {
			if keep < 0 {
				// Too large to record: nothing kept. The client's next
				// request holds the reply, and records it.
				p.log.Warn("proxy: the reply is over the bound on replies kept to record (MaxReplyBytes); not recorded now",
					"bound", p.cfg.MaxReplyBytes)
				return nil, true
			}
			return buf.Bytes(), true
		}
		if err != nil {
			if keep <= 0 {
				p.log.Warn("proxy: the upstream's reply was cut", "err", err)
				return nil, false
			}
			return buf.Bytes(), false
		}
	}
}
