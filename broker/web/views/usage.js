// The usage view: tokens and cost by agent and by day, since a chosen time, asked of
// `usage` again when a flight ends (the fleet watch says so), at most once a second.
//
// Hooks for tests: `[data-view="usage"]`, `select[data-filter="since"]`, the tables
// `#usage-by-agent` and `#usage-by-day` (rows `tr[data-key]`, the total `tr.total`,
// cells `.flights`, `.tokens`, `.cost`...), `#usage-total` (the totals line); an agent's
// name links to its page (`#/agent/NAME`).

import { agentHref, costText, errorNode, h, loading, num, setText } from "/lib/dom.js";
import { call } from "/lib/api.js";
import { fleet } from "/lib/fleet.js";

// Usage ----------------------------------------------------------------------------

const SINCE = [
  ["", "all time"],
  ["24h", "last 24 hours"],
  ["7d", "last 7 days"],
  ["30d", "last 30 days"],
];

const COLUMNS = [
  ["flights", "Flights", (t) => num(t.flights)],
  ["input", "Input", (t) => num(t.input_tokens)],
  ["cached", "Cached", (t) => num(t.cached_input_tokens)],
  ["output", "Output", (t) => num(t.output_tokens)],
  ["reasoning", "Reasoning", (t) => num(t.reasoning_tokens)],
  ["tokens", "Tokens", (t) => num(t.tokens)],
  ["cost", "Cost", costText],
];

function usageTable(report, by, keyHead) {
  const key = (k) => (by === "agent" ? h("a", { href: agentHref(k), class: "mono" }, k) : h("span", { class: "mono" }, k));
  const row = (k, t, total) => h("tr", { class: total ? "total" : null, dataset: total ? null : { key: k } },
    h("th", { scope: "row", class: "key" }, total ? "total" : key(k)),
    COLUMNS.map(([cls, head, f]) => h("td", { class: "num " + cls, dataset: { label: head } }, f(t || {}))));
  const rows = (report.rows || []).map((r) => row(r.key, r, false));
  if (rows.length > 1) rows.push(row("total", report.total || {}, true));
  return h("table", { class: "grid usage" },
    h("caption", { class: "sr-only" }, "Usage by " + keyHead),
    h("thead", null, h("tr", null, h("th", { scope: "col" }, keyHead),
      COLUMNS.map(([cls, head]) => h("th", { scope: "col", class: "num " + cls }, head)))),
    h("tbody", null, rows.length ? rows : h("tr", null, h("td", { colspan: String(COLUMNS.length + 1), class: "muted" }, "No flight reported usage."))));
}

function usageView() {
  const byAgent = h("div", { id: "usage-by-agent", class: "table-box" }, loading("usage"));
  const byDay = h("div", { id: "usage-by-day", class: "table-box" }, loading("usage"));
  const total = h("p", { id: "usage-total", class: "totals" });
  const since = h("select", { dataset: { filter: "since" }, "aria-label": "Flights created since" },
    SINCE.map(([v, label]) => h("option", { value: v }, label)));
  const el = h("section", { class: "view usage-view", dataset: { view: "usage" }, "aria-labelledby": "usage-title" },
    h("div", { class: "view-head" }, h("h1", { id: "usage-title" }, "Usage"), h("form", { class: "filters", onsubmit: (e) => e.preventDefault() }, since)),
    h("p", { class: "muted" }, "Tokens and cost of flights (input includes cached, output includes reasoning; " +
      "a flight counts in the UTC day it was created). Cost is ? where unknown: no cost from the harness " +
      "and no price for the model (relay up --prices)."),
    total,
    h("h2", null, "By agent"), byAgent,
    h("h2", null, "By day (UTC)"), byDay);
  let gone = false;
  let asked = 0;
  let last = 0;
  let timer = 0;
  let snapshot = -1;

  function fetchAll() {
    clearTimeout(timer);
    timer = 0;
    snapshot = fleet.snapshots;
    last = performance.now();
    const mine = ++asked;
    const query = (by) => {
      const q = { by };
      // `usage` takes ms since the epoch; the select's choices are back from now.
      const back = { "24h": 86400e3, "7d": 7 * 86400e3, "30d": 30 * 86400e3 }[since.value];
      if (back) q.since = String(Date.now() - back);
      return q;
    };
    for (const [by, box, head] of [["agent", byAgent, "Agent"], ["day", byDay, "Day"]]) {
      call("usage", [], { query: query(by) }).then((r) => {
        if (gone || mine !== asked) return;
        box.replaceChildren(usageTable(r || {}, by, head));
        box.dataset.loaded = String(mine);
        if (by === "agent") {
          const t = (r && r.total) || {};
          setText(total, `${num(t.flights || 0)} flights, ${num(t.tokens || 0)} tokens, cost ${costText(t)}`);
        }
      }, (e) => { if (!gone && mine === asked) box.replaceChildren(errorNode(e)); });
    }
  }

  /** Asks again, at most once a second however many flights end. */
  function soon() {
    if (timer) return;
    timer = setTimeout(fetchAll, Math.max(0, 1000 - (performance.now() - last)));
  }

  since.addEventListener("change", fetchAll);
  fetchAll();
  return {
    el,
    update(d) {
      // A snapshot after a reconnect, or a flight that ended: its usage is in now.
      if (d.ended || (d.all && snapshot !== fleet.snapshots)) soon();
    },
    destroy: () => {
      gone = true;
      clearTimeout(timer);
    },
  };
}

export {
  usageView,
};
