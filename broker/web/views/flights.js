// The flights view: recent flights, live ones first.

import { agentHref, firstLine, flightLink, h, isLive, link, setText, showError, stateTag, timeEl } from "/lib/dom.js";
import { call } from "/lib/api.js";
import { fleet, invalidate } from "/lib/fleet.js";
import { KeyedTable } from "/lib/table.js";

// Flights --------------------------------------------------------------------------

function flightsView() {
  const recent = new Map();
  let fetchedAt = -1;
  let error = null;
  const table = new KeyedTable({
    id: "flights",
    caption: "Flights",
    keyAttr: "flight",
    columns: [
      {
        cls: "id", head: "Flight", rowHeader: true, value: (f) => f.id,
        paint: (td, f) => td.replaceChildren(flightLink(f.id)),
      },
      {
        cls: "agent", head: "Agent", value: (f) => f.agent,
        paint: (td, f) => td.replaceChildren(link(agentHref(f.agent), f.agent)),
      },
      { cls: "state", head: "State", value: (f) => f.state, paint: (td, f) => td.replaceChildren(stateTag(f.state)) },
      {
        cls: "summary", head: "Summary",
        value: (f) => firstLine(f.error || (isLive(f.state) ? f.summary : f.output ?? f.summary) || ""),
      },
      { cls: "when", head: "Asked", value: (f) => String(f.created_at), paint: (td, f) => td.replaceChildren(timeEl(f.created_at)) },
      { cls: "when", head: "Updated", value: (f) => String(f.updated_at), paint: (td, f) => td.replaceChildren(timeEl(f.updated_at)) },
    ],
  });
  const count = h("p", { class: "muted count" });
  const errBox = h("p", { class: "error", role: "alert", hidden: true });
  const el = h("section", { class: "view flights-view", "aria-labelledby": "flights-title" },
    h("div", { class: "view-head" }, h("h1", { id: "flights-title" }, "Flights"), count),
    errBox, table.el);

  function refetch() {
    fetchedAt = fleet.snapshots;
    call("flight.list", [], { query: { limit: 100 } }).then((list) => {
      for (const f of list || []) recent.set(f.id, f);
      errBox.hidden = true;
      invalidate({ all: true });
    }, (e) => {
      error = e;
      showError(errBox, error);
    });
  }

  return {
    el,
    update(d) {
      if (d.all && fetchedAt !== fleet.snapshots) refetch();
      // The newer record of each flight: the fleet's (live) or the list's.
      const all = new Map(recent);
      for (const f of fleet.seen.values()) {
        const old = all.get(f.id);
        if (!old || (f.update_seq ?? 0) >= (old.update_seq ?? 0)) all.set(f.id, f);
      }
      for (const f of fleet.live.values()) all.set(f.id, f);
      const list = [...all.values()]
        .sort((x, y) => (isLive(y.state) - isLive(x.state)) || (y.created_at - x.created_at))
        .slice(0, 300);
      const keys = new Set(list.map((f) => f.id));
      for (const id of [...table.rows.keys()]) if (!keys.has(id)) table.remove(id);
      for (const f of list) table.upsert(f.id, f);
      table.order(list.map((f) => f.id));
      const live = list.filter((f) => isLive(f.state)).length;
      setText(count, `${live} live, ${list.length} shown`);
    },
  };
}

export {
  flightsView,
};
