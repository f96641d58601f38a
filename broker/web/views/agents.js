// The agents view: every agent, live from the fleet watch.

import { agentHref, flightLink, h, inert, loading, muted, setText, stateTag, text } from "/lib/dom.js";
import { fleet } from "/lib/fleet.js";
import { KeyedTable } from "/lib/table.js";
import { branchLabel, programLabel } from "/lib/labels.js";

// Agents ---------------------------------------------------------------------------

function agentIndex() {
  const idx = new Map();
  for (const f of fleet.live.values()) {
    let e = idx.get(f.agent);
    if (!e) idx.set(f.agent, (e = { current: null, queued: 0 }));
    if (f.state === "queued") e.queued++;
    else if (!e.current || f.created_at < e.current.created_at) e.current = f;
  }
  return idx;
}

function agentsView() {
  const table = new KeyedTable({
    id: "agents",
    caption: "Agents",
    keyAttr: "agent",
    columns: [
      { cls: "name", head: "Agent", rowHeader: true, value: (r) => r.agent.name },
      {
        // An ACP agent's program as it named itself at `initialize` (`relay agent show`).
        cls: "harness", head: "Harness",
        value: (r) => [r.agent.harness, programLabel(r.agent.program)].join(" ").trim(),
        paint: (td, r) => td.replaceChildren(text(r.agent.harness),
          ...(r.agent.program ? [" ", muted(programLabel(r.agent.program))] : [])),
      },
      {
        cls: "state", head: "State", value: (r) => r.agent.state,
        paint: (td, r) => td.replaceChildren(stateTag(r.agent.state)),
      },
      {
        cls: "node", head: "Node", value: (r) => r.agent.node || r.agent.endpoint?.node || "",
        paint: (td, r, v) => td.replaceChildren(v ? text(v) : muted("local")),
      },
      {
        // Its worktree's branch (`relay agent add --worktree`), ahead/behind its base.
        cls: "branch", head: "Branch", value: (r) => branchLabel(r.agent),
        paint: (td, r, v) => td.replaceChildren(v ? h("span", { class: "mono" }, v) : muted("—")),
      },
      {
        cls: "session", head: "Session",
        value: (r) => r.agent.session_id || r.agent.endpoint?.session_id || "",
        paint: (td, r, v) => td.replaceChildren(v ? text(v) : muted("—")),
      },
      {
        cls: "flight", head: "Current flight",
        value: (r) => (r.current ? r.current.id + " " + r.current.state : ""),
        paint: (td, r) => td.replaceChildren(...(r.current
          ? [flightLink(r.current.id), " ", stateTag(r.current.state)]
          : [muted("—")])),
      },
      { cls: "queue num", head: "Queue", value: (r) => String(r.queued) },
      {
        cls: "links", head: "Replay", value: (r) => r.agent.name,
        paint: (td, r) => td.replaceChildren(h("a", { href: agentHref(r.agent.name), "aria-label": inert("Replay of " + r.agent.name) }, "replay")),
      },
    ],
  });
  const count = h("p", { class: "muted count" });
  const empty = h("p", { class: "muted empty", hidden: true },
    "No agents yet. Add one with ", h("code", null, "relay agent add NAME --harness …"), ".");
  const waiting = loading("agents");
  const el = h("section", { class: "view agents-view", "aria-labelledby": "agents-title" },
    h("div", { class: "view-head" }, h("h1", { id: "agents-title" }, "Agents"), count),
    waiting, empty, table.el);

  const sorted = () => [...fleet.agents.keys()].sort((x, y) => x.localeCompare(y));

  return {
    el,
    update(d) {
      if (!fleet.ready) return;
      waiting.hidden = true;
      const idx = agentIndex();
      const rec = (a) => ({ agent: a, ...(idx.get(a.name) || { current: null, queued: 0 }) });
      let structure = false;
      if (d.all) {
        for (const a of fleet.agents.values()) table.upsert(a.name, rec(a));
        for (const name of [...table.rows.keys()]) if (!fleet.agents.has(name)) table.remove(name);
        structure = true;
      } else {
        for (const name of d.agents) {
          const a = fleet.agents.get(name);
          if (a) {
            if (!table.has(name)) structure = true;
            table.upsert(name, rec(a));
          } else if (table.has(name)) {
            table.remove(name);
          }
        }
      }
      if (structure) table.order(sorted());
      const n = fleet.agents.size;
      setText(count, n === 1 ? "1 agent" : `${n} agents`);
      empty.hidden = n > 0;
      table.el.hidden = n === 0;
    },
  };
}

export {
  agentsView,
};
