// The usage view: tokens and cost by agent and by day.

import { costText, errorNode, h, loading, num } from "/lib/dom.js";
import { call } from "/lib/api.js";

// Usage ----------------------------------------------------------------------------

function usageTable(report, keyHead) {
  const numCell = (v) => h("td", { class: "num" }, num(v));
  const row = (key, t, total) => h("tr", { class: total ? "total" : null },
    h("th", { scope: "row", class: "mono" }, key),
    numCell(t.flights), numCell(t.input_tokens), numCell(t.cached_input_tokens),
    numCell(t.output_tokens), numCell(t.reasoning_tokens), numCell(t.tokens),
    h("td", { class: "num cost" }, costText(t)));
  const rows = (report.rows || []).map((r) => row(r.key, r, false));
  if (rows.length > 1) rows.push(row("total", report.total || {}, true));
  return h("table", { class: "grid usage" },
    h("caption", { class: "sr-only" }, "Usage by " + keyHead),
    h("thead", null, h("tr", null, [keyHead, "Flights", "Input", "Cached", "Output", "Reasoning", "Tokens", "Cost"]
      .map((c, i) => h("th", { scope: "col", class: i ? "num" : null }, c)))),
    h("tbody", null, rows.length ? rows : h("tr", null, h("td", { colspan: "8", class: "muted" }, "No flight reported usage."))));
}

function usageView() {
  const byAgent = h("div", { id: "usage-by-agent" }, loading("usage"));
  const byDay = h("div", { id: "usage-by-day" }, loading("usage"));
  const el = h("section", { class: "view usage-view", "aria-labelledby": "usage-title" },
    h("div", { class: "view-head" }, h("h1", { id: "usage-title" }, "Usage")),
    h("p", { class: "muted" }, "Tokens and cost of flights (input includes cached, output includes reasoning; " +
      "a flight counts in the UTC day it was created). Cost is ? where unknown: no cost from the harness " +
      "and no price for the model (relay up --prices)."),
    h("h2", null, "By agent"), byAgent,
    h("h2", null, "By day (UTC)"), byDay);
  let gone = false;
  for (const [by, box, head] of [["agent", byAgent, "Agent"], ["day", byDay, "Day"]]) {
    call("usage", [], { query: { by } }).then((r) => {
      if (!gone) box.replaceChildren(usageTable(r || {}, head));
    }, (e) => { if (!gone) box.replaceChildren(errorNode(e)); });
  }
  return { el, destroy: () => { gone = true; } };
}

export {
  usageView,
};
