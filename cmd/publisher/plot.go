package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/ctxpipe/ctxpipe/client"
	"github.com/ctxpipe/ctxpipe/internal/ctxseries"
	"github.com/ctxpipe/ctxpipe/schema"
)

// runPlot draws a conversation's context size turn by turn, with its
// condenses and truncations, as an SVG page: the sawtooth people would
// rather see than read off a list of events.
func runPlot(ctx context.Context, c *cli, args []string) error {
	fs := c.flags()
	conv := convFlag(fs)
	out := fs.String("out", "", "write the SVG here (default: stdout)")
	if err := parseConv(fs, args, conv); err != nil {
		return err
	}
	nc, _, err := c.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	var hist schema.HistoryReply
	if err := query(ctx, nc, schema.SubjectHistory, schema.HistoryRequest{ConversationID: *conv, View: schema.ViewFull}, 30*time.Second, &hist); err != nil {
		return err
	}
	var st schema.StatusReply
	if err := query(ctx, nc, schema.SubjectStatus, schema.StatusRequest{ConversationID: *conv}, 10*time.Second, &st); err != nil {
		return err
	}
	cl, err := client.New(nc)
	if err != nil {
		return err
	}
	gctx, cancel := c.guard(ctx)
	defer cancel()
	evs, err := storedEvents(gctx, cl, *conv)
	if err != nil {
		return queryFailed(c.refused(err))
	}
	w := c.stdout
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	return renderSVG(w, st, ctxseries.Series(hist.Messages, evs))
}

// renderSVG draws the series with the window, the allowed size and the
// condense threshold as reference lines.
func renderSVG(w io.Writer, st schema.StatusReply, pts []ctxseries.Point) error {
	const W, H, left, right, top, bottom = 960, 420, 80, 30, 50, 50
	maxX, maxY := 1, st.ContextWindow
	for _, p := range pts {
		maxX, maxY = max(maxX, p.X), max(maxY, p.Y)
	}
	maxY = maxY * 105 / 100
	px := func(x int) float64 { return left + float64(x)*float64(W-left-right)/float64(maxX) }
	py := func(y int) float64 { return float64(H-bottom) - float64(y)*float64(H-top-bottom)/float64(max(maxY, 1)) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", W, H, W, H)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", W, H)
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="16">%s — context tokens per turn (profile %s, window %s)</text>`+"\n",
		left, xmlEscape(st.ConversationID), xmlEscape(st.ProfileID), thousands(st.ContextWindow))
	// Axes and a y grid every quarter of the window.
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, H-bottom, W-right, H-bottom)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, top, left, H-bottom)
	for q := 0; q <= 4; q++ {
		y := st.ContextWindow * q / 4
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n",
			left, py(y), W-right, py(y), left-6, py(y)+4, thousands(y))
	}
	for _, x := range xTicks(maxX) {
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%d</text>`+"\n", px(x), H-bottom+16, x)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">turn</text>`+"\n", (W+left)/2, H-12)
	ref := func(y int, color, label string) {
		if y <= 0 {
			return
		}
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s" stroke-dasharray="6 4"/><text x="%d" y="%.1f" fill="%s" text-anchor="end">%s</text>`+"\n",
			left, py(y), W-right, py(y), color, W-right-4, py(y)-4, color, label)
	}
	ref(st.ContextWindow, "#555", "window "+thousands(st.ContextWindow))
	ref(st.AllowedTokens, "#c0392b", "allowed "+thousands(st.AllowedTokens)+" (truncate above)")
	ref(st.ContextWindow*st.Threshold/100, "#e67e22", fmt.Sprintf("threshold %d%% (condense)", st.Threshold))
	if len(pts) > 0 {
		var line strings.Builder
		for _, p := range pts {
			fmt.Fprintf(&line, "%.1f,%.1f ", px(p.X), py(p.Y))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="#2c6fbb" stroke-width="2" points="%s"/>`+"\n", strings.TrimSpace(line.String()))
	}
	condenses, truncations, maskings := 0, 0, 0
	diamond := func(x, y float64) string {
		return fmt.Sprintf("%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f", x, y-6, x+6, y, x, y+6, x-6, y)
	}
	for _, p := range pts {
		switch p.Kind {
		case schema.EventCondenseContext:
			condenses++
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="5" fill="#27ae60"><title>condense at turn %d → %s tokens</title></circle>`+"\n", px(p.X), py(p.Y), p.X, thousands(p.Y))
		case schema.EventSlidingWindowTruncation:
			truncations++
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="9" height="9" fill="#e67e22"><title>truncation at turn %d → %s tokens</title></rect>`+"\n", px(p.X)-4.5, py(p.Y)-4.5, p.X, thousands(p.Y))
		case schema.EventToolResultsMasked:
			maskings++
			fmt.Fprintf(&b, `<polygon points="%s" fill="#8e44ad"><title>masking at turn %d → %s tokens</title></polygon>`+"\n", diamond(px(p.X), py(p.Y)), p.X, thousands(p.Y))
		}
	}
	fmt.Fprintf(&b, `<circle cx="%d" cy="38" r="5" fill="#27ae60"/><text x="%d" y="42">condense (%d)</text>`+"\n", W-260, W-250, condenses)
	fmt.Fprintf(&b, `<rect x="%d" y="33.5" width="9" height="9" fill="#e67e22"/><text x="%d" y="42">truncation (%d)</text>`+"\n", W-140, W-128, truncations)
	fmt.Fprintf(&b, `<polygon points="%s" fill="#8e44ad"/><text x="%d" y="42">masking (%d)</text>`+"\n", diamond(float64(W-380), 38), W-370, maskings)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// xTicks picks about ten round turn numbers.
func xTicks(maxX int) []int {
	step := 1
	for _, s := range []int{1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000} {
		step = s
		if maxX/s <= 10 {
			break
		}
	}
	var out []int
	for x := 0; x <= maxX; x += step {
		out = append(out, x)
	}
	return out
}

func xmlEscape(s string) string {
	b, _ := json.Marshal(s) // ids are [A-Za-z0-9_-]; this only guards odd profile ids
	return strings.NewReplacer("<", "&lt;", ">", "&gt;", "&", "&amp;").Replace(strings.Trim(string(b), `"`))
}
