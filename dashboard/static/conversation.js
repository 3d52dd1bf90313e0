// One conversation: gauge, context-size plot, event timeline, history
// (hidden messages nested under what hides them), and the condense and
// rewind buttons. The snapshot comes from /api/conversations/<key>; the
// event stream adds events as they are published and says when to read
// the snapshot again.
"use strict";

const key = decodeURIComponent(location.pathname.replace(/^\/c\//, ""));
const S = {
  snap: null,
  extra: [],            // live events the last snapshot did not have yet
  open: new Set(),      // expanded things (summaries, groups, bodies), by id
  pending: new Map(),   // input id → what was asked, until its outcome arrives
  fresh: new Set(),     // event ids to flash once
};

// ---- status -------------------------------------------------------------

function renderStatus(s) {
  document.getElementById("crumb-tenant").textContent = s.tenant ? "/ " + s.tenant : "";
  document.getElementById("crumb-id").textContent = "/ " + s.id;
  document.title = "ctxpipe · " + s.key;
  const g = gauge(s, true);
  // The context crosses the threshold on the turn that makes it condense,
  // so the stored figure is already the reduced one: the gauge also shows
  // where the last reduction started from (unless a rewind undid it since).
  const last = lastReduction();
  if (last && s.window) {
    const from = last.prev_context_tokens, to = last.new_context_tokens;
    // A hatched stretch from the current size up to where the last
    // reduction started, ending in a tick.
    const pct = (v) => Math.min(100, 100 * v / s.window);
    const low = Math.min(pct(s.tokens), pct(from));
    const peak = el("div", {class: "peak" + (from >= s.threshold_tokens ? " crossed" : ""),
      title: `${last.type === "condense_context" ? "condensed" : "truncated"} from ${num(from)} to ${num(to)} tokens`});
    peak.style.left = low + "%";
    peak.style.width = (pct(from) - low) + "%";
    g.querySelector(".gauge").append(peak);
    g.querySelector(".gauge-label").append(` · last ${last.type === "condense_context" ? "condense" : "truncation"} ${num(from)} → ${num(to)}`);
  }
  document.getElementById("gauge").replaceChildren(g);
  const f = (label, value, cls) => el("span", {class: cls}, label + " ", el("b", {}, value));
  document.getElementById("figures").replaceChildren(...[
    f("profile", s.profile || "default"),
    s.tenant ? f("tenant", s.tenant) : null,
    f("messages", `${num(s.messages)} (${num(s.hidden)} hidden)`, "fig-messages"),
    f("condenses", num(s.condenses), "fig-condenses"),
    f("truncations", num(s.truncations), "fig-truncations"),
    el("span", {title: when(s.updated_at)}, "last activity ", el("b", {}, ago(s.updated_at)))].filter(Boolean));
}

// lastReduction is the latest condense or truncation, if no rewind came
// after it.
function lastReduction() {
  const all = allEvents();
  for (let i = all.length - 1; i >= 0; i--) {
    const e = all[i];
    if (e.type === "rewind") return null;
    if (e.type === "condense_context" || e.type === "sliding_window_truncation") return e;
  }
  return null;
}

function allEvents() {
  const known = new Set(S.snap.events.map((e) => e.id));
  return S.snap.events.concat(S.extra.filter((e) => !known.has(e.id)));
}

// ---- plot ---------------------------------------------------------------

// drawPlot draws the series as publisher plot does: context tokens per
// turn, the window, allowed and threshold lines, a dot per condense and a
// square per truncation.
function drawPlot(s) {
  const pts = s.series || [];
  const box = document.getElementById("plot");
  if (pts.length === 0) {
    box.replaceChildren(el("div", {class: "empty"}, "No turns yet."));
    return;
  }
  const W = 960, H = 340, left = 70, right = 20, top = 14, bottom = 40;
  let maxX = 1, maxY = s.window || 1;
  for (const p of pts) { maxX = Math.max(maxX, p.x); maxY = Math.max(maxY, p.y); }
  maxY = maxY * 1.05;
  const px = (x) => left + x * (W - left - right) / maxX;
  const py = (y) => H - bottom - y * (H - top - bottom) / maxY;
  const g = svg("svg", {viewBox: `0 0 ${W} ${H}`, "font-size": "12", "font-family": "system-ui, sans-serif", id: "plot-svg"});
  g.append(svg("line", {x1: left, y1: H - bottom, x2: W - right, y2: H - bottom, stroke: "#333"}));
  g.append(svg("line", {x1: left, y1: top, x2: left, y2: H - bottom, stroke: "#333"}));
  if (s.window) {
    for (let q = 0; q <= 4; q++) {
      const y = Math.round(s.window * q / 4);
      g.append(svg("line", {x1: left, y1: py(y), x2: W - right, y2: py(y), stroke: "#e3e6eb"}));
      g.append(svg("text", {x: left - 6, y: py(y) + 4, "text-anchor": "end", fill: "#666"}, num(y)));
    }
  }
  let step = 1;
  for (const st of [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000]) { step = st; if (maxX / st <= 10) break; }
  for (let x = 0; x <= maxX; x += step) {
    g.append(svg("text", {x: px(x), y: H - bottom + 16, "text-anchor": "middle", fill: "#666"}, x));
  }
  g.append(svg("text", {x: (W + left) / 2, y: H - 6, "text-anchor": "middle", fill: "#666"}, "turn"));
  const ref = (y, color, label, cls) => {
    if (!(y > 0)) return;
    g.append(svg("line", {x1: left, y1: py(y), x2: W - right, y2: py(y), stroke: color, "stroke-dasharray": "6 4", class: cls}));
    g.append(svg("text", {x: W - right - 4, y: py(y) - 4, fill: color, "text-anchor": "end"}, label));
  };
  ref(s.window, "#555", "window " + num(s.window), "ref-window");
  ref(s.allowed, "#c0392b", `allowed ${num(s.allowed)} (truncate above)`, "ref-allowed");
  ref(s.threshold_tokens, "#e67e22", `threshold ${s.threshold}% (condense)`, "ref-threshold");
  g.append(svg("polyline", {fill: "none", stroke: "#2c6fbb", "stroke-width": 2, class: "series",
    points: pts.map((p) => `${px(p.x).toFixed(1)},${py(p.y).toFixed(1)}`).join(" ")}));
  for (const p of pts) {
    if (p.kind === "condense_context") {
      g.append(svg("circle", {cx: px(p.x), cy: py(p.y), r: 5, fill: "#27ae60", class: "pt-condense"},
        svg("title", {}, `condense at turn ${p.x} → ${num(p.y)} tokens`)));
    } else if (p.kind === "sliding_window_truncation") {
      g.append(svg("rect", {x: px(p.x) - 4.5, y: py(p.y) - 4.5, width: 9, height: 9, fill: "#e67e22", class: "pt-truncation"},
        svg("title", {}, `truncation at turn ${p.x} → ${num(p.y)} tokens`)));
    }
  }
  box.replaceChildren(g);
}

// ---- timeline -----------------------------------------------------------

function usd(v) { return "$" + (v || 0).toFixed(4); }

function eventLine(ev, managing) {
  const head = (...parts) => el("div", {class: "head"},
    el("span", {class: "type"}, ev.type), ...parts, el("span", {class: "when", title: when(ev.ts)}, new Date(ev.ts).toLocaleTimeString()));
  const li = el("li", {class: ev.type + (S.fresh.has(ev.id) ? " fresh" : ""), "data-id": ev.id, "data-input": ev.input_id});
  switch (ev.type) {
  case "condense_context": {
    li.append(head(el("span", {}, `${ev.trigger} · ${num(ev.prev_context_tokens)} → ${num(ev.new_context_tokens)} tokens`)));
    if (managing) {
      li.append(el("div", {class: "muted managing"},
        `context_managing at ${num(managing.context_tokens)} / ${num(managing.context_window)} tokens (threshold ${managing.threshold}%) → condensed`));
    }
    li.append(el("div", {class: "muted"}, `${num(ev.messages_condensed)} messages condensed · cost ${usd(ev.cost)} · model ${ev.model || "—"}`));
    const d = el("details", {class: "summary", "data-open-id": "sum-" + ev.id},
      el("summary", {}, "summary"), el("div", {class: "summary-text"}, ev.summary || ""));
    keepOpen(d, "sum-" + ev.id);
    li.append(d);
    break;
  }
  case "context_managing":
    li.append(head(el("span", {}, `${ev.trigger} at ${num(ev.context_tokens)} / ${num(ev.context_window)} tokens (threshold ${ev.threshold}%)`)));
    li.append(el("div", {class: "muted"}, "condensing…"));
    break;
  case "condense_failed":
    if (managing) li.append(el("div", {class: "muted managing"}, `context_managing at ${num(managing.context_tokens)} tokens → failed`));
    li.prepend(head(el("span", {class: "reason"}, ev.error)));
    li.append(el("div", {class: "muted"}, `${ev.message || ""} · trigger ${ev.trigger} · cost ${usd(ev.cost)}`));
    break;
  case "sliding_window_truncation":
    li.append(head(el("span", {}, `${num(ev.prev_context_tokens)} → ${num(ev.new_context_tokens)} tokens`)),
      el("div", {class: "muted"}, `${num(ev.messages_removed)} messages hidden`));
    break;
  case "tool_results_masked":
    li.append(head(el("span", {}, `${num(ev.prev_context_tokens)} → ${num(ev.new_context_tokens)} tokens`)),
      el("div", {class: "muted"}, `${num(ev.count)} tool results masked in ${num(ev.messages_masked)} messages`));
    break;
  case "rewind": {
    const undone = (ev.removed_condense_ids || []).length, untrunc = (ev.removed_truncation_ids || []).length;
    li.append(head(el("span", {}, `to ${when(ev.cutoff_ts)}${ev.include_target ? " (kept the target)" : ""}`)),
      el("div", {class: "muted"}, `${num(ev.messages_removed)} messages removed · ${num(ev.messages_restored)} restored · ${undone} condenses and ${untrunc} truncations undone`));
    break;
  }
  case "conversation_forked":
    li.append(head(el("span", {}, `continues ${ev.continues_from}`)));
    break;
  case "input_rejected":
    li.append(head(el("span", {class: "reason"}, ev.reason)),
      el("div", {class: "muted"}, `${ev.message || ""} · ${ev.subject || ""}`));
    break;
  default:
    li.append(head());
  }
  return li;
}

function renderTimeline() {
  const all = allEvents();
  // context_managing announces the condense whose outcome shares its input:
  // shown as one entry once the outcome is there.
  const outcome = new Map();
  for (const e of all) if (e.type === "condense_context" || e.type === "condense_failed") outcome.set(e.input_id, e);
  const managing = new Map();
  for (const e of all) if (e.type === "context_managing") managing.set(e.input_id, e);
  const shown = all.filter((e) => !(e.type === "context_managing" && outcome.has(e.input_id)));
  document.getElementById("no-events").hidden = shown.length > 0;
  document.getElementById("timeline").replaceChildren(...shown.slice().reverse().map((e) =>
    eventLine(e, e.type === "condense_context" || e.type === "condense_failed" ? managing.get(e.input_id) : null)));
  S.fresh.clear();
}

// ---- history ------------------------------------------------------------

// keepOpen keeps a details element open across re-renders. The click is
// recorded at once: a refresh may replace the element before its toggle
// event fires.
function keepOpen(details, id) {
  details.open = S.open.has(id);
  details.querySelector("summary").addEventListener("click", () => { if (details.open) S.open.delete(id); else S.open.add(id); });
  details.addEventListener("toggle", () => { if (details.open) S.open.add(id); else S.open.delete(id); });
}

function renderMsg(it, children) {
  const hidden = !!it.hidden_by;
  const kids = children.get(it.id) || [];
  const cls = ["msg", it.kind, hidden ? "hidden" : "", !hidden && !it.effective ? "dropped" : ""].filter(Boolean).join(" ");
  const badges = [];
  if (it.kind !== "turn") badges.push(el("span", {class: "badge " + it.kind}, it.kind === "marker" ? "truncation marker" : it.kind === "ack" ? "summary acknowledgement" : it.kind));
  if (hidden) badges.push(el("span", {class: "badge hidden"}, "hidden"));
  else if (!it.effective) badges.push(el("span", {class: "badge"}, "not sent"));
  const body = el("div", {class: "body" + (S.open.has("body-" + it.id) ? " open" : ""), title: "click to expand"}, it.text);
  body.addEventListener("click", () => {
    body.classList.toggle("open");
    if (body.classList.contains("open")) S.open.add("body-" + it.id); else S.open.delete("body-" + it.id);
  });
  const li = el("li", {class: cls, "data-id": it.id, "data-ts": it.ts, "data-kind": it.kind},
    el("div", {class: "head"},
      el("span", {class: "role"}, it.role), it.agent ? el("span", {}, it.agent) : null, ...badges,
      el("span", {}, `${num(it.tokens)} tokens`),
      el("span", {title: when(it.ts)}, new Date(it.ts).toLocaleTimeString()),
      el("span", {class: "spacer"}),
      it.kind === "turn" ? el("button", {class: "small rewind", "data-ts": it.ts, title: "Rewind to this message: remove everything after it",
        onclick: () => askRewind(it)}, "rewind to here") : null),
    body);
  if (kids.length) {
    const what = it.kind === "marker" ? "truncation marker" : it.kind === "mask" ? "masked stand-in" : "summary";
    const d = el("details", {class: "hidden-group", "data-group": it.id},
      el("summary", {}, `${kids.length} message${kids.length === 1 ? "" : "s"} hidden by this ${what}`),
      el("ul", {class: "history"}, kids.map((k) => renderMsg(k, children))));
    keepOpen(d, "grp-" + it.id);
    li.append(d);
  }
  return li;
}

function renderHistory(s) {
  const children = new Map();
  for (const it of s.history) {
    if (!it.hidden_by) continue;
    if (!children.has(it.hidden_by)) children.set(it.hidden_by, []);
    children.get(it.hidden_by).push(it);
  }
  const top = s.history.filter((it) => !it.hidden_by);
  document.getElementById("history").replaceChildren(...top.map((it) => renderMsg(it, children)));
  document.getElementById("history-note").textContent =
    `${num(s.history.length)} stored · ${num(s.history.length - s.hidden)} visible · ${num(s.hidden)} hidden (greyed, under the summary or marker that hides them)`;
  const emptied = document.getElementById("emptied");
  emptied.hidden = s.history.length > 0;
  if (s.history.length === 0) {
    const rw = s.events.filter((e) => e.type === "rewind").pop();
    emptied.textContent = rw ? `A rewind to ${when(rw.cutoff_ts)} removed every message of this conversation (${num(rw.messages_removed)} messages). New turns will appear here.`
      : "This conversation has no messages.";
  }
}

// ---- requests -----------------------------------------------------------

function requestStatus(text) { document.getElementById("request-status").textContent = text; }

async function send(kind, body, label) {
  try {
    const rep = await postJSON(`/api/conversations/${encodeURIComponent(key)}/${kind}`, body);
    S.pending.set(rep.input_id, label);
    requestStatus(`${label} sent (input ${rep.input_id.slice(0, 8)}); waiting for the service…`);
    // Its outcome may have come in before this answer did.
    if (S.snap) allEvents().forEach(outcome);
  } catch (e) {
    requestStatus(`${label} failed: ${e.message}`);
  }
}

// outcome reports what became of an input this page sent.
function outcome(ev) {
  const label = S.pending.get(ev.input_id);
  if (!label || ev.type === "context_managing") return;
  S.pending.delete(ev.input_id);
  switch (ev.type) {
  case "condense_context": requestStatus(`${label}: condensed ${num(ev.prev_context_tokens)} → ${num(ev.new_context_tokens)} tokens.`); break;
  case "condense_failed": requestStatus(`${label}: failed (${ev.error}).`); break;
  case "rewind": requestStatus(`${label}: ${num(ev.messages_removed)} messages removed, ${num(ev.messages_restored)} restored.`); break;
  case "input_rejected": requestStatus(`${label}: rejected (${ev.reason}): ${ev.message || ""}`); break;
  default: requestStatus(`${label}: ${ev.type}.`);
  }
}

function askRewind(it) {
  const box = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent =
    `Every message after this ${it.role} message (${when(it.ts)}) is removed, and every condense and truncation from then on is undone: the messages they hid come back. This cannot be undone.`;
  box.hidden = false;
  const ok = document.getElementById("confirm-ok"), cancel = document.getElementById("confirm-cancel");
  const close = () => { box.hidden = true; ok.onclick = cancel.onclick = null; };
  cancel.onclick = close;
  ok.onclick = () => { close(); send("rewind", {ts: it.ts, include_target: true}, "Rewind"); };
  ok.focus();
}

// ---- loading ------------------------------------------------------------

let live = null;

function gone(text) {
  document.getElementById("page").hidden = true;
  const g = document.getElementById("gone");
  g.hidden = false;
  g.replaceChildren(el("p", {}, el("b", {}, text)), el("p", {}, el("a", {href: "/"}, "Back to the conversations")));
}

async function load() {
  let s;
  try {
    s = await getJSON(`/api/conversations/${encodeURIComponent(key)}`);
  } catch (e) {
    if (e.status === 404) {
      gone(`No conversation “${key}”. It was never stored here (a rewind empties a conversation but keeps it).`);
    } else {
      setBanner("error-banner", "The dashboard could not read this conversation: " + e.message, true);
    }
    if (!live) follow(0, -1);
    return;
  }
  setBanner("error-banner", "");
  document.getElementById("gone").hidden = true;
  document.getElementById("page").hidden = false;
  natsBanner(s.nats);
  S.snap = s;
  const known = new Set(s.events.map((e) => e.id));
  S.extra = S.extra.filter((e) => !known.has(e.id));
  renderStatus(s);
  drawPlot(s);
  renderTimeline();
  renderHistory(s);
  allEvents().forEach(outcome);
  document.getElementById("condense").disabled = s.nats !== "connected";
  if (!live) follow(s.seq, s.mark);
}

const refresh = coalesce(load, 100);

function follow(seq, mark) {
  live = new Live(`/api/events?conv=${encodeURIComponent(key)}&after=${seq}&mark=${mark}`, {
    state: setLiveBadge,
    event: (ev) => {
      if (ev.conversation_id !== undefined && S.snap) {
        if (!S.snap.events.some((e) => e.id === ev.id) && !S.extra.some((e) => e.id === ev.id)) {
          S.extra.push(ev);
          S.fresh.add(ev.id);
          renderTimeline();
        }
      }
      outcome(ev);
      refresh();
    },
    changed: refresh,
    nats: (st) => {
      natsBanner(st);
      document.getElementById("condense").disabled = st !== "connected";
      if (st === "connected") refresh();
    },
  });
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("condense").addEventListener("click", () => send("condense", {}, "Condense"));
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") document.getElementById("confirm").hidden = true; });
  load();
});
