package dashboard_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/schema"
)

// chromiumPath finds the browser the test drives: $CHROMIUM, else Debian's
// chromium package. A missing browser fails the test (CI installs it in
// .ci/run); it is never a silent skip.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "/usr/bin/chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("the dashboard's browser test needs headless Chromium and found none: " +
		"install it with `apt-get install -y chromium` (Debian/Ubuntu; .ci/run does this), " +
		"or set CHROMIUM to a Chrome or Chromium binary")
	return ""
}

// browser starts a headless Chromium with a fresh profile, and stops it
// (and every process it started) when the test ends.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1000),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()      // closes the browser
		cancelAlloc() // and waits for its process to exit
	})
	// Start it now, so a broken install fails here with its own error.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("starting %s: %v", chromiumPath(t), err)
	}
	return ctx
}

// poll waits until the JavaScript expression is truthy in the page.
func poll(t *testing.T, ctx context.Context, what, expr string) {
	t.Helper()
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr,
		chromedp.WithPollingTimeout(30*time.Second), chromedp.WithPollingInterval(50*time.Millisecond))); err != nil {
		body, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`(typeof S === "object" ? JSON.stringify({extra: S.extra.map((e) => e.type), pending: [...S.pending.keys()], events: S.snap && S.snap.events.length}) + "\n" : "") + document.body.innerText`))
		t.Fatalf("waiting for %s (%s): %v\npage text:\n%s", what, expr, err, body)
	}
}

func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	return v
}

// click clicks the element sel selects. A live page may replace the
// element between the lookup and the click (a refresh re-renders it):
// then the click is tried again on the new one.
func click(t *testing.T, ctx context.Context, what, sel string) {
	t.Helper()
	var err error
	for range 10 {
		if err = chromedp.Do(ctx, chromedp.Click(chromedp.CSS(sel))); err == nil {
			return
		}
		if !strings.Contains(err.Error(), "node") {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: %v", what, err)
}

func do(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// TestBrowser drives the real pages in headless Chromium against the real
// service: the sample session arrives and the page follows it live (the
// gauge grows, condenses appear without a reload), a summary expands,
// "Condense now" gives its event, a rewind brings the hidden messages
// back, and a reload shows the same state.
//
// DASHBOARD_SCREENSHOTS=1 also writes docs/dashboard-conversations.png and
// docs/dashboard-conversation.png.
func TestBrowser(t *testing.T) {
	ctx := browser(t)
	e := start(t)
	base := e.srv.URL

	// No conversations yet.
	do(t, ctx, "open the conversations page", chromedp.Navigate(base+"/"))
	poll(t, ctx, "the empty state", `!document.getElementById("empty").hidden`)
	// Marks this page load: a reload would lose it.
	eval[bool](t, ctx, `window.__load = 1; true`)

	const conv = "demo"
	turns := sampleTurns(t, conv)
	published := make(chan error, 1)
	publishFrom := func(from int) {
		go func() {
			pctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			for _, tu := range turns[from:] {
				if _, err := e.cl.Append(pctx, tu); err != nil {
					published <- err
					return
				}
				// A pace a person can follow, and the page gets to show
				// each step.
				time.Sleep(60 * time.Millisecond)
			}
			published <- e.cl.Wait(pctx, conv, turns[len(turns)-1].ID)
		}()
	}
	// The first turns: the row appears live, its gauge below the threshold.
	e.publish(turns[:3])
	poll(t, ctx, "the conversation's row", `document.querySelector('#convs tr[data-key="demo"]') !== null && !document.getElementById("convs").hidden`)
	if !eval[bool](t, ctx, `window.__load === 1`) {
		t.Fatal("the conversations page reloaded")
	}

	// Follow the conversation while the rest of the session arrives.
	// Click does not wait for the page it opens: wait for its load event.
	if _, err := chromedp.Run(ctx, chromedp.WaitEvent(page.LoadEventFired, nil,
		chromedp.Click(chromedp.CSS(`#convs tr[data-key="demo"] a`)))); err != nil {
		t.Fatalf("open the conversation: %v", err)
	}
	poll(t, ctx, "the conversation page", `location.pathname === "/c/demo" && document.querySelectorAll("#history li.msg").length === 3`)
	eval[bool](t, ctx, `window.__load = 2; window.__widths = []; window.__watch = setInterval(() => {
		const f = document.querySelector("#gauge .fill"); if (f) window.__widths.push(parseFloat(f.style.width));
	}, 40); true`)
	publishFrom(3)
	// The condense appears live, announced by context_managing at or over
	// the threshold, and the gauge shows where it started from.
	poll(t, ctx, "a live condense", `document.querySelector("#timeline li.condense_context .managing") !== null`)
	managing := eval[string](t, ctx, `document.querySelector("#timeline li.condense_context .managing").textContent`)
	if !strings.Contains(managing, "threshold 60%") {
		t.Fatalf("the condense's context_managing line: %q", managing)
	}
	poll(t, ctx, "the gauge's last condense over the threshold", `document.querySelector("#gauge .peak.crossed") !== null`)
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	st, err := e.cl.Status(context.Background(), conv)
	if err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "every turn and condense shown", fmt.Sprintf(
		`document.querySelectorAll("#timeline li.condense_context").length === %d && /messages %d \(%d hidden\)/.test(document.getElementById("figures").textContent)`,
		st.Condensations, st.Messages, st.HiddenMessages))
	if !eval[bool](t, ctx, `window.__load === 2`) {
		t.Fatal("the conversation page reloaded")
	}
	// The gauge rose with the turns and fell with the condenses.
	widths := eval[[]float64](t, ctx, `clearInterval(window.__watch); window.__widths`)
	rose, fell := false, false
	for i := 1; i < len(widths); i++ {
		rose = rose || widths[i] > widths[i-1]
		fell = fell || widths[i] < widths[i-1]
	}
	if !rose || !fell {
		t.Fatalf("the gauge did not move live (rose %v, fell %v): %v", rose, fell, widths)
	}
	// The plot has every turn and a dot per condense.
	if n := eval[int](t, ctx, `document.querySelectorAll("#plot-svg .pt-condense").length`); n != st.Condensations {
		t.Fatalf("the plot shows %d condenses, the service made %d", n, st.Condensations)
	}

	// Expand the newest summary.
	click(t, ctx, "expand a summary", `#timeline li.condense_context details.summary > summary`)
	poll(t, ctx, "the summary text", `(() => { const d = document.querySelector("#timeline li.condense_context details.summary");
		return d.open && d.querySelector(".summary-text").offsetHeight > 0 && d.querySelector(".summary-text").textContent.length > 100; })()`)

	if os.Getenv("DASHBOARD_SCREENSHOTS") != "" {
		// A second tenant's conversation, so the list shows the column.
		for _, tu := range sampleTurns(t, "review")[:14] {
			data, _ := schema.Marshal(tu)
			if _, err := bus.PublishInput(context.Background(), e.js, "ctx.in.acme.review.turn", tu.ID, data); err != nil {
				t.Fatal(err)
			}
		}
		e.publish(sampleTurns(t, "scratch")[:5])
		screenshot(t, ctx, "dashboard-conversation.png")
		do(t, ctx, "back to the list", chromedp.Navigate(base+"/"))
		poll(t, ctx, "three rows", `document.querySelectorAll("#convs tbody tr").length === 3`)
		// A short viewport: the full-page shot is then as tall as the table.
		do(t, ctx, "a short viewport", chromedp.EmulateViewport(1400, 300))
		screenshot(t, ctx, "dashboard-conversations.png")
		do(t, ctx, "the usual viewport", chromedp.EmulateViewport(1400, 1000))
		do(t, ctx, "back to the conversation", chromedp.Navigate(base+"/c/demo"))
		poll(t, ctx, "the conversation page", `document.querySelectorAll("#timeline li.condense_context").length > 0`)
		eval[bool](t, ctx, `window.__load = 2; true`)
	}

	// Condense now: its event appears, and the request says how it went.
	before := eval[int](t, ctx, `document.querySelectorAll("#timeline li.condense_context, #timeline li.condense_failed").length`)
	click(t, ctx, "press condense", "#condense")
	poll(t, ctx, "the manual condense's event", fmt.Sprintf(
		`document.querySelectorAll("#timeline li.condense_context, #timeline li.condense_failed").length === %d
		 && /Condense: (condensed|failed)/.test(document.getElementById("request-status").textContent)`, before+1))

	// Rewind to the sixth turn: a confirmation, then every hidden message
	// comes back and the later ones go.
	if n := eval[int](t, ctx, `document.querySelectorAll("#history li.msg.hidden").length`); n == 0 {
		t.Fatal("no hidden message before the rewind")
	}
	target := turns[5]
	// It is hidden: open the groups it is nested in, outermost first, as a
	// person would.
	groups := eval[[]string](t, ctx, fmt.Sprintf(`(() => { const out = [];
		for (let d = document.querySelector('#history li.msg[data-id="%s"]').closest("details"); d; d = d.parentElement.closest("details")) out.unshift(d.dataset.group);
		return out; })()`, target.ID))
	if len(groups) == 0 {
		t.Fatalf("turn %s is not hidden under a summary", target.ID)
	}
	for _, g := range groups {
		click(t, ctx, "open a hidden group", fmt.Sprintf(`details[data-group="%s"] > summary`, g))
	}
	// The button sits in nested <details>; chromedp's mouse click, aimed
	// at coordinates, misses it there in this Chromium, so the click is
	// the element's own (the same handler a person's click runs).
	eval[bool](t, ctx, fmt.Sprintf(`document.querySelector('#history li.msg[data-id="%s"] button.rewind').click(); true`, target.ID))
	poll(t, ctx, "the confirmation", `!document.getElementById("confirm").hidden`)
	click(t, ctx, "confirm", "#confirm-ok")
	poll(t, ctx, "the rewind's result", `document.querySelector("#timeline li.rewind") !== null
		&& /Rewind: \d+ messages removed, [1-9]\d* restored/.test(document.getElementById("request-status").textContent)
		&& document.querySelectorAll("#history li.msg").length === 6
		&& document.querySelectorAll("#history li.msg.hidden").length === 0`)
	history := eval[[]string](t, ctx, `[...document.querySelectorAll("#history > li.msg")].map((li) => li.dataset.id)`)
	for i, id := range history {
		if id != turns[i].ID {
			t.Fatalf("after the rewind, message %d is %s, want turn %s", i, id, turns[i].ID)
		}
	}
	if !eval[bool](t, ctx, `window.__load === 2`) {
		t.Fatal("the conversation page reloaded")
	}

	// A reload shows the same state.
	state := `JSON.stringify({
		history: [...document.querySelectorAll("#history li.msg")].map((li) => li.dataset.id + (li.classList.contains("hidden") ? "-" : "+")),
		events: [...document.querySelectorAll("#timeline li")].map((li) => li.dataset.id),
		figures: document.getElementById("figures").textContent.replace(/last activity.*/, ""),
		gauge: document.querySelector("#gauge .gauge-label").textContent,
	})`
	want := eval[string](t, ctx, state)
	do(t, ctx, "reload", chromedp.Reload())
	poll(t, ctx, "the reloaded page", `document.querySelectorAll("#history li.msg").length === 6 && document.querySelector("#timeline li.rewind") !== null`)
	if got := eval[string](t, ctx, state); got != want {
		t.Fatalf("after a reload:\n%s\nbefore:\n%s", got, want)
	}

	// The list sorts by any column, both ways.
	e.publish(sampleTurns(t, "alpha")[:2])
	e.publish(sampleTurns(t, "zeta")[:3])
	do(t, ctx, "open the conversations page", chromedp.Navigate(base+"/"))
	poll(t, ctx, "the new rows", `document.querySelector('#convs tr[data-key="alpha"]') && document.querySelector('#convs tr[data-key="zeta"]')`)
	ids := `[...document.querySelectorAll("#convs tbody tr td.id")].map((td) => td.textContent)`
	click(t, ctx, "sort by conversation", `#convs th[data-sort="id"]`)
	if got := eval[[]string](t, ctx, ids); !slices.IsSorted(got) || len(got) < 3 {
		t.Fatalf("sorted by conversation: %v", got)
	}
	click(t, ctx, "sort by conversation, descending", `#convs th[data-sort="id"]`)
	got := eval[[]string](t, ctx, ids)
	if slices.Reverse(got); !slices.IsSorted(got) {
		t.Fatalf("sorted by conversation, descending: %v", got)
	}
	click(t, ctx, "sort by messages", `#convs th[data-sort="messages"]`)
	counts := eval[[]string](t, ctx, `[...document.querySelectorAll("#convs tbody tr")].map((tr) => tr.dataset.key)`)
	if counts[0] != "alpha" {
		t.Fatalf("sorted by messages, ascending: %v", counts)
	}
	do(t, ctx, "back to the conversation", chromedp.Navigate(base+"/c/demo"))
	poll(t, ctx, "the conversation page", `document.querySelectorAll("#history li.msg").length === 6`)

	// NATS goes away: the page says so, keeps what the store shows, and
	// disables the button that would need it; it comes back: so does the
	// page.
	e.px.down()
	poll(t, ctx, "the NATS-down banner", `!document.getElementById("nats-banner").hidden
		&& /NATS is unreachable/.test(document.getElementById("nats-banner").textContent)
		&& document.getElementById("condense").disabled
		&& document.getElementById("live").dataset.state === "nats-down"
		&& document.querySelectorAll("#history li.msg").length === 6`)
	e.px.up()
	poll(t, ctx, "NATS back", `document.getElementById("nats-banner").hidden
		&& !document.getElementById("condense").disabled
		&& document.getElementById("live").dataset.state === "live"`)
}

// screenshot saves the whole page to docs/name.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	// Let transitions (the gauge's width) settle.
	time.Sleep(600 * time.Millisecond)
	buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join("..", "docs", name), buf, 0o644); err != nil {
		t.Fatal(err)
	}
}
