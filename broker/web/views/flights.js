// The flights view: recent flights, live ones first, filtered by agent, state, time and
// text.
//
// The filters live in the hash's query (`#/flights?agent=a&state=running&since=24h&q=x`):
// a filtered list is a link and survives a reload. Changing one rewrites the hash in
// place (`history.replaceState`: no hashchange, the view stays) and asks the broker
// again: `flight.list` filters by `agent`, `state`, `since` and `q`. The same predicate
// ([`matches`]) runs on the page over what it holds, the fetched list and the live
// flights of the fleet watch, so the list stays live and a broker that ignores a filter
// still shows only matching flights.
//
// A flight's task and requester come with `flight.list`'s rows (the task's first 500
// characters) or from the watch (`invocation_created`); a flight known only from the
// watch's snapshot has its asked once of `replay.flight` (with `from_seq` past the end:
// the invocation, no entries), a few at a time, only for the flights it shows. A row the
// broker found for the current text search stays though its match lies past the part
// of the task the page holds.
//
// Hooks for tests: `[data-view="flights"]`; the filters `select[data-filter="agent"]`,
// `select[data-filter="state"]`, `select[data-filter="since"]`, `input[data-filter="q"]`
// (also `[data-search]`: `/` focuses it); rows `#flights tr[data-flight]` with cells
// `.agent`, `.state`, `.task`; the count `.count` ("N shown" and, filtered, "of M").

import { FLIGHT_STATES } from "/api.gen.js";
import { agentHref, firstLine, flightLink, h, isLive, link, muted, setText, showError, stateTag, timeEl } from "/lib/dom.js";
import { call } from "/lib/api.js";
import { askedOf, fetchAsked, fleet, invalidate, rememberAsked } from "/lib/fleet.js";
import { KeyedTable } from "/lib/table.js";

// Flights --------------------------------------------------------------------------

/** How many flights one fetch asks for (the newest that match). */
const LIMIT = 200;

/** The time filter's choices: `flight.list`'s `since` forms, and "" for all time. */
const SINCE = [
  ["1h", "last hour"],
  ["24h", "last 24 hours"],
  ["7d", "last 7 days"],
  ["", "all time"],
];

/** The filters of `params` (a URLSearchParams), each "" when not given. */
function filtersOf(params) {
  const get = (k) => (params.get(k) || "").trim();
  return { agent: get("agent"), state: get("state"), since: get("since"), q: get("q") };
}

/**
 * The time `since` stands for (ms since the epoch), 0 for none: `90m`, `24h`, `7d`, `2w` back
 * from `now`, a UTC day `2026-11-27`, or ms since the epoch (as `relay usage --since`).
 * `null` when it reads as none of these.
 */
function sinceMs(since, now = Date.now()) {
  if (!since) return 0;
  let m = /^(\d+)([mhdw])$/.exec(since);
  if (m) return now - Number(m[1]) * { m: 60e3, h: 3600e3, d: 86400e3, w: 7 * 86400e3 }[m[2]];
  m = /^(\d{4})-(\d{2})-(\d{2})$/.exec(since);
  if (m) return Date.UTC(Number(m[1]), Number(m[2]) - 1, Number(m[3]));
  if (/^\d+$/.test(since)) return Number(since);
  return null;
}

/** What a flight's text search looks in: id, agent, requester, task and output. */
function haystack(f, asked) {
  return [f.id, f.agent, asked?.requester, asked?.task, f.output].filter(Boolean).join("\n").toLowerCase();
}

/**
 * Whether flight `f` passes `filters` (with `cutoff` from [`sinceMs`]); `asked` is its
 * task and requester where known. `undefined` when that depends on a task not known yet.
 */
function matches(f, filters, cutoff, asked) {
  if (filters.agent && f.agent !== filters.agent) return false;
  if (filters.state && f.state !== filters.state) return false;
  if (cutoff && (f.created_at || 0) < cutoff) return false;
  if (filters.q) {
    if (haystack(f, asked).includes(filters.q.toLowerCase())) return true;
    return asked ? false : undefined;
  }
  return true;
}

function flightsView(params = new URLSearchParams()) {
  let filters = filtersOf(params);
  let fetched = new Map(); // the broker's answer to the current filters
  let fetchedFor = null; // the filters and snapshot that answer is for
  let full = false; // the answer hit LIMIT: older matches are not on the page
  let timer = 0;
  const table = new KeyedTable({
    id: "flights",
    caption: "Flights",
    keyAttr: "flight",
    columns: [
      {
        cls: "id", head: "Flight", rowHeader: true, value: (r) => r.f.id,
        paint: (td, r) => td.replaceChildren(flightLink(r.f.id)),
      },
      {
        cls: "agent", head: "Agent", value: (r) => r.f.agent,
        paint: (td, r) => td.replaceChildren(link(agentHref(r.f.agent), r.f.agent)),
      },
      { cls: "state", head: "State", value: (r) => r.f.state, paint: (td, r) => td.replaceChildren(stateTag(r.f.state)) },
      {
        cls: "task", head: "Task", value: (r) => (r.asked ? firstLine(r.asked.task, 200) : "\u0000"),
        paint: (td, r, v) => td.replaceChildren(v === "\u0000" ? muted("…") : v),
      },
      {
        cls: "summary", head: "Summary",
        value: (r) => firstLine(r.f.error || (isLive(r.f.state) ? r.f.summary : r.f.output ?? r.f.summary) || "", 200),
      },
      { cls: "when", head: "Asked", value: (r) => String(r.f.created_at), paint: (td, r) => td.replaceChildren(timeEl(r.f.created_at)) },
      { cls: "when", head: "Updated", value: (r) => String(r.f.updated_at), paint: (td, r) => td.replaceChildren(timeEl(r.f.updated_at)) },
    ],
  });

  // The filter bar.
  const agentSel = h("select", { dataset: { filter: "agent" }, "aria-label": "Agent" });
  const stateSel = h("select", { dataset: { filter: "state" }, "aria-label": "State" },
    h("option", { value: "" }, "any state"), FLIGHT_STATES.map((s) => h("option", { value: s }, s)));
  const sinceSel = h("select", { dataset: { filter: "since" }, "aria-label": "Asked since" },
    SINCE.map(([v, label]) => h("option", { value: v }, label)));
  const search = h("input", {
    type: "search", dataset: { filter: "q", search: "" }, placeholder: "Search (/)",
    "aria-label": "Search flights: id, agent, requester, task, output", autocomplete: "off", spellcheck: "false",
  });
  const clear = h("button", { type: "button", dataset: { action: "clear-filters" } }, "Clear");
  const bar = h("form", { class: "filters", role: "search", onsubmit: (e) => e.preventDefault() },
    agentSel, stateSel, sinceSel, search, clear);

  const count = h("p", { class: "muted count", "aria-live": "polite" });
  const errBox = h("p", { class: "error", role: "alert", hidden: true });
  const empty = h("p", { class: "muted empty", hidden: true }, "No flight matches.");
  const el = h("section", { class: "view flights-view", dataset: { view: "flights" }, "aria-labelledby": "flights-title" },
    h("div", { class: "view-head" }, h("h1", { id: "flights-title" }, "Flights"), count),
    bar, errBox, empty, table.el);

  /** Puts `value` in `sel`, adding an option for a value the list lacks (a link's). */
  function choose(sel, value, label = value) {
    if (![...sel.options].some((o) => o.value === value)) sel.append(h("option", { value }, label));
    sel.value = value;
  }

  function paintAgents() {
    const names = [...new Set([...fleet.agents.keys(), filters.agent].filter(Boolean))].sort((x, y) => x.localeCompare(y));
    const have = [...agentSel.options].map((o) => o.value);
    const want = ["", ...names];
    if (have.join("\n") !== want.join("\n")) {
      agentSel.replaceChildren(h("option", { value: "" }, "every agent"), ...names.map((n) => h("option", { value: n }, n)));
    }
    agentSel.value = filters.agent;
  }

  function paintFilters() {
    paintAgents();
    choose(stateSel, filters.state);
    choose(sinceSel, filters.since, "since " + filters.since);
    if (search.value.trim() !== filters.q) search.value = filters.q;
  }

  /** The hash for the current filters; rewritten in place. */
  function keepInUrl() {
    const q = new URLSearchParams();
    for (const k of ["agent", "state", "since", "q"]) if (filters[k]) q.set(k, filters[k]);
    const qs = q.toString();
    const hash = "#/flights" + (qs ? "?" + qs : "");
    if (location.hash !== hash) history.replaceState(history.state, "", hash);
  }

  function setFilters(next) {
    filters = { ...filters, ...next };
    keepInUrl();
    refetch();
    invalidate({ all: false });
  }

  agentSel.addEventListener("change", () => setFilters({ agent: agentSel.value }));
  stateSel.addEventListener("change", () => setFilters({ state: stateSel.value }));
  sinceSel.addEventListener("change", () => setFilters({ since: sinceSel.value }));
  // Typing asks the broker once it pauses; the page narrows what it holds at once.
  search.addEventListener("input", () => {
    filters = { ...filters, q: search.value.trim() };
    keepInUrl();
    invalidate({ all: false });
    clearTimeout(timer);
    timer = setTimeout(refetch, 250);
  });
  search.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && search.value) {
      e.preventDefault();
      search.value = "";
      setFilters({ q: "" });
    }
  });
  clear.addEventListener("click", () => {
    setFilters({ agent: "", state: "", since: "", q: "" });
    paintFilters();
  });

  let asking = 0;
  function refetch() {
    clearTimeout(timer);
    const cutoff = sinceMs(filters.since);
    if (cutoff === null) {
      showError(errBox, new Error(`since ${filters.since}: write 30m, 24h, 7d, 2w, a day (2026-11-27) or ms since the epoch`));
      return;
    }
    const query = { limit: LIMIT };
    for (const k of ["agent", "state", "since", "q"]) if (filters[k]) query[k] = filters[k];
    const mine = ++asking;
    const key = JSON.stringify(filters);
    fetchedFor = { key, snapshot: fleet.snapshots };
    call("flight.list", [], { query }).then((list) => {
      if (mine !== asking) return;
      fetched = new Map((list || []).map((f) => [f.id, f]));
      for (const f of list || []) {
        if (typeof f.task === "string") rememberAsked(f.id, f.task, f.requester);
      }
      full = (list || []).length >= LIMIT;
      errBox.hidden = true;
      invalidate({ all: false });
    }, (e) => {
      if (mine === asking) showError(errBox, e);
    });
  }

  paintFilters();
  keepInUrl();

  return {
    el,
    update(d) {
      if (d.all && (!fetchedFor || fetchedFor.snapshot !== fleet.snapshots)) refetch();
      if (d.all || d.agents.size) paintAgents();
      const cutoff = sinceMs(filters.since) || 0;
      // The newer record of each flight: the fleet's (live) or the list's.
      const all = new Map(fetched);
      for (const f of fleet.seen.values()) {
        const old = all.get(f.id);
        if (!old || (f.update_seq ?? 0) >= (old.update_seq ?? 0)) all.set(f.id, f);
      }
      for (const f of fleet.live.values()) all.set(f.id, f);
      const unknown = [];
      const list = [];
      const answered = fetchedFor && fetchedFor.key === JSON.stringify(filters);
      for (const f of all.values()) {
        const asked = askedOf(f.id);
        // The broker searched the whole task; the page holds its beginning.
        const byBroker = answered && fetched.has(f.id);
        const ok = matches(f, byBroker ? { ...filters, q: "" } : filters, cutoff, asked);
        if (ok === undefined) unknown.push(f.id);
        else if (ok) list.push({ f, asked });
      }
      list.sort((x, y) => (isLive(y.f.state) - isLive(x.f.state)) || (y.f.created_at - x.f.created_at));
      const shown = list.slice(0, LIMIT);
      const keys = new Set(shown.map((r) => r.f.id));
      for (const id of [...table.rows.keys()]) if (!keys.has(id)) table.remove(id);
      for (const r of shown) table.upsert(r.f.id, r);
      table.order(shown.map((r) => r.f.id));
      fetchAsked([...unknown, ...shown.filter((r) => !r.asked).map((r) => r.f.id)], () => invalidate({ all: false }));

      const filtered = Object.values(filters).some(Boolean);
      const live = shown.filter((r) => isLive(r.f.state)).length;
      let line = `${shown.length} shown`;
      if (filtered) line += ` of ${all.size} loaded (filtered)`;
      if (live) line += `, ${live} live`;
      if (unknown.length) line += `, ${unknown.length} being searched`;
      if (full) line += `; the newest ${LIMIT}: narrow the filters for older ones`;
      setText(count, line);
      count.dataset.shown = String(shown.length);
      empty.hidden = shown.length > 0 || unknown.length > 0;
      table.el.hidden = shown.length === 0;
    },
    destroy() {
      clearTimeout(timer);
      asking++;
    },
  };
}

export {
  flightsView,
  matches,
  sinceMs,
};
