package proxy

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/klauspost/compress/zstd"
)

// errUnknownEncoding is a request body in a content coding the proxy
// cannot undo: it goes on as it came, unmanaged.
var errUnknownEncoding = errors.New("unknown content coding")

// maxCodings bounds the codings one body may be wrapped in.
const maxCodings = 4

// decodeBody undoes the request's Content-Encoding (Codex sends large
// bodies zstd-compressed; gzip and deflate are undone too), last coding
// first, and reports whether there was one. The decoded body is bounded
// by limit like any other. A coding the proxy does not know is
// errUnknownEncoding; a body that does not decode is another error.
func decodeBody(h http.Header, body []byte, limit int64) ([]byte, bool, error) {
	var codings []string
	for _, v := range h.Values("Content-Encoding") {
		for _, c := range strings.Split(v, ",") {
			if c = strings.ToLower(strings.TrimSpace(c)); c != "" && c != "identity" {
				codings = append(codings, c)
			}
		}
	}
	if len(codings) == 0 {
		return body, false, nil
	}
	if len(codings) > maxCodings {
		return nil, true, fmt.Errorf("the request body is wrapped in %d content codings; at most %d", len(codings), maxCodings)
	}
	for i := len(codings) - 1; i >= 0; i-- {
		var err error
		if body, err = decode(codings[i], body, limit); err != nil {
			return nil, true, err
		}
	}
	return body, true, nil
}

// decode undoes one coding.
func decode(coding string, body []byte, limit int64) ([]byte, error) {
	var r io.Reader
	switch coding {
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			return nil, fmt.Errorf("the request body is not gzip: %v", err)
		}
		defer zr.Close()
		r = zr
	case "deflate":
		// RFC 9110's deflate is zlib; some clients send the raw stream.
		if zr, err := zlib.NewReader(bytes.NewReader(body)); err == nil {
			defer zr.Close()
			r = zr
		} else {
			fr := flate.NewReader(bytes.NewReader(body))
			defer fr.Close()
			r = fr
		}
	case "zstd":
		zr, err := zstd.NewReader(bytes.NewReader(body), zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(uint64(limit)+1))
		if err != nil {
			return nil, fmt.Errorf("the request body is not zstd: %v", err)
		}
		defer zr.Close()
		r = zr
	default:
		return nil, fmt.Errorf("%w %q", errUnknownEncoding, coding)
	}
	out, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, fmt.Errorf("the request body does not decode as %s: %v", coding, err)
	}
	if int64(len(out)) > limit {
		return nil, fmt.Errorf("the request body is larger than this proxy accepts (%d bytes) once decoded", limit)
	}
	return out, nil
}
