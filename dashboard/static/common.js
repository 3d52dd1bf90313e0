// Shared helpers of the dashboard's two pages. Plain JavaScript, no
// framework, no build step; everything the pages need is served by the
// dashboard itself.
"use strict";

const fmt = new Intl.NumberFormat("en-US");

function num(n) { return fmt.format(n || 0); }

// el builds an element: el("td", {class: "num"}, "12", child...).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

const svgNS = "http://www.w3.org/2000/svg";
function svg(tag, attrs, ...children) {
  const e = document.createElementNS(svgNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function ago(ms) {
  if (!ms) return "—";
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 5) return "just now";
  if (s < 60) return s + "s ago";
  if (s < 3600) return Math.floor(s / 60) + "m ago";
  if (s < 86400) return Math.floor(s / 3600) + "h ago";
  return Math.floor(s / 86400) + "d ago";
}

function when(ms) { return ms ? new Date(ms).toLocaleString() : ""; }

async function getJSON(url) {
  const r = await fetch(url, {cache: "no-store"});
  const body = await r.json().catch(() => ({error: r.status + " " + r.statusText}));
  if (!r.ok) {
    const err = new Error(body.error || r.statusText);
    err.status = r.status;
    throw err;
  }
  return body;
}

async function postJSON(url, body) {
  const r = await fetch(url, {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body || {})});
  const out = await r.json().catch(() => ({error: r.status + " " + r.statusText}));
  if (!r.ok) throw new Error(out.error || r.statusText);
  return out;
}

// gauge draws tokens against the window with the threshold and allowed
// lines; the classes say which line the context is over.
function gauge(row, big) {
  const w = row.window || 0;
  const pct = (v) => w > 0 ? Math.min(100, 100 * v / w) : 0;
  const g = el("div", {class: "gauge" + (big ? " big" : ""), "data-key": row.key,
    title: w ? `${num(row.tokens)} of ${num(w)} tokens; condense at ${row.threshold}% (${num(row.threshold_tokens)}), truncate above ${num(row.allowed)}` : "unknown profile"});
  const fill = el("div", {class: "fill"});
  fill.style.width = pct(row.tokens) + "%";
  g.append(fill);
  if (w) {
    const t = el("div", {class: "mark threshold", title: `threshold ${row.threshold}%`});
    t.style.left = pct(row.threshold_tokens) + "%";
    const a = el("div", {class: "mark allowed", title: `allowed ${num(row.allowed)}`});
    a.style.left = pct(row.allowed) + "%";
    g.append(t, a);
    if (row.tokens >= row.threshold_tokens) g.classList.add("over-threshold");
    if (row.tokens > row.allowed) g.classList.add("over-allowed");
  }
  const label = el("div", {class: "gauge-label"},
    w ? `${num(row.tokens)} / ${num(w)} (${row.percent.toFixed(1)}%) · threshold ${row.threshold}% · allowed ${num(row.allowed)}`
      : `${num(row.tokens)} tokens · profile ${row.profile || "default"} unknown`);
  return el("div", {}, g, label);
}

// Live follows /api/events: the browser's EventSource reconnects by itself
// and sends the last stream sequence it saw as Last-Event-ID, so the
// dashboard resumes right after it.
class Live {
  constructor(url, handlers) {
    this.url = url;
    this.h = handlers;
    this.natsUp = true;
    this.open();
  }
  open() {
    const es = new EventSource(this.url);
    this.es = es;
    es.addEventListener("open", () => this.h.state && this.h.state("live"));
    es.addEventListener("error", () => this.h.state && this.h.state(es.readyState === EventSource.CLOSED ? "closed" : "reconnecting"));
    es.addEventListener("ctx", (m) => {
      let ev;
      try { ev = JSON.parse(m.data); } catch (e) { return; }
      this.h.event && this.h.event(ev, m.lastEventId);
    });
    es.addEventListener("changed", () => this.h.changed && this.h.changed());
    es.addEventListener("nats", (m) => {
      const s = JSON.parse(m.data).nats;
      this.h.nats && this.h.nats(s);
    });
  }
}

// The badge says whether the page is live: its event stream open and the
// dashboard's NATS connection up (the stream stays open while NATS is down,
// but then nothing new can come).
const badge = {stream: "connecting", nats: "connected"};

function setLiveBadge(state) {
  badge.stream = state;
  drawBadge();
}

function drawBadge() {
  const b = document.getElementById("live");
  if (!b) return;
  const st = badge.nats !== "connected" ? "nats-down" : badge.stream;
  b.dataset.state = st;
  b.textContent = {live: "● live", reconnecting: "○ reconnecting…", "nats-down": "○ NATS down", connecting: "○ connecting…"}[st] || "○ offline";
  b.classList.toggle("off", st !== "live");
}

function setBanner(id, text, error) {
  const b = document.getElementById(id);
  if (!b) return;
  b.hidden = !text;
  b.textContent = text || "";
  b.classList.toggle("error", !!error);
}

function natsBanner(s) {
  badge.nats = s;
  drawBadge();
  setBanner("nats-banner", s === "connected" ? "" :
    `NATS is unreachable (${s}). Showing what the store holds; live updates and the buttons wait for NATS to come back.`, true);
}

// coalesce runs the async f at most once per wait ms however often it is
// asked, never two at once, and once more after a run if asked meanwhile:
// a steady flow of turns must not postpone the refresh for ever (as a
// debounce would) nor send a read per turn.
function coalesce(f, wait) {
  let timer = null, running = false, again = false;
  const run = async () => {
    timer = null;
    running = true;
    try { await f(); } finally {
      running = false;
      if (again) { again = false; ask(); }
    }
  };
  const ask = () => {
    if (running) { again = true; return; }
    if (!timer) timer = setTimeout(run, wait);
  };
  return ask;
}
