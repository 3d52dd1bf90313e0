// The conversations page: every conversation with its gauge, sortable,
// read again whenever the event stream says something changed.
"use strict";

const state = {rows: [], sort: "updated_at", desc: true, seen: new Map()};

function sortRows(rows) {
  const k = state.sort, dir = state.desc ? -1 : 1;
  return rows.slice().sort((a, b) => {
    const x = a[k], y = b[k];
    if (x === y) return a.key < b.key ? -1 : 1;
    return (x < y ? -1 : 1) * dir;
  });
}

function render() {
  const table = document.getElementById("convs");
  document.getElementById("empty").hidden = state.rows.length > 0;
  table.hidden = state.rows.length === 0;
  for (const th of table.querySelectorAll("th")) {
    th.classList.toggle("sorted-asc", th.dataset.sort === state.sort && !state.desc);
    th.classList.toggle("sorted-desc", th.dataset.sort === state.sort && state.desc);
  }
  const tbody = table.querySelector("tbody");
  tbody.replaceChildren(...sortRows(state.rows).map((r) => {
    // A row flashes when its figures changed since the last read.
    const sig = [r.tokens, r.messages, r.condenses, r.truncations].join();
    const changed = state.seen.has(r.key) && state.seen.get(r.key) !== sig;
    state.seen.set(r.key, sig);
    return el("tr", {"data-key": r.key, class: changed ? "flash" : ""},
      el("td", {class: "tenant"}, r.tenant || el("span", {class: "muted"}, "—")),
      el("td", {class: "id"}, el("a", {href: "/c/" + encodeURIComponent(r.key)}, r.id)),
      el("td", {class: "profile"}, r.profile || "default"),
      el("td", {class: "gauge-cell"}, gauge(r)),
      el("td", {class: "num messages"}, r.messages === 0 ? el("span", {class: "muted"}, "0 (emptied by a rewind)") :
        `${num(r.messages)} (${num(r.hidden)})`),
      el("td", {class: "num condenses"}, num(r.condenses)),
      el("td", {class: "num truncations"}, num(r.truncations)),
      el("td", {class: "updated", title: when(r.updated_at)}, ago(r.updated_at)));
  }));
}

let live = null;

async function load() {
  try {
    const rep = await getJSON("/api/conversations");
    state.rows = rep.conversations;
    setBanner("error-banner", "");
    const missing = rep.missing_partitions || [];
    setBanner("partial-banner",
      (missing.length ? `The conversations of partition${missing.length > 1 ? "s" : ""} ${missing.join(", ")} are not listed: no instance answered for them in time (one is taking them over). ` : "") +
      (rep.truncated ? "An instance holds more conversations than one answer carries: only its most recently active ones are listed." : ""));
    natsBanner(rep.nats);
    render();
    if (!live) {
      live = new Live(`/api/events?after=${rep.seq}&mark=${rep.mark}`, {
        state: setLiveBadge,
        event: refresh,
        changed: refresh,
        nats: (s) => { natsBanner(s); if (s === "connected") refresh(); },
      });
    }
  } catch (e) {
    setBanner("error-banner", "The dashboard could not read the conversations: " + e.message, true);
  }
}

const refresh = coalesce(load, 100);

document.addEventListener("DOMContentLoaded", () => {
  for (const th of document.querySelectorAll("#convs th")) {
    th.addEventListener("click", () => {
      const k = th.dataset.sort;
      state.desc = state.sort === k ? !state.desc : (k === "updated_at" || k === "percent");
      state.sort = k;
      render();
    });
  }
  load();
  setInterval(() => {
    for (const td of document.querySelectorAll("#convs td.updated")) {
      const r = state.rows.find((x) => x.key === td.parentElement.dataset.key);
      if (r) td.textContent = ago(r.updated_at);
    }
  }, 5000);
});
