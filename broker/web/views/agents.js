// The agents view: every agent, live from the fleet watch, each row with what it is
// doing (its current flight's task and progress); its name opens its page
// (views/agent.js), its replay is a link of its own. "Add agent" opens a form for
// `agent.add` (views/agent_add.js).
//
// Test hooks: `section[data-view="agents"]`, rows `#agents tr[data-agent=NAME]` with
// cells `.name a` (the page), `.doing` (`[data-flight]` of the current flight, its
// task's first line in `.task-line`), `.state`; `button[data-action="add-agent"]`.

import { agentHref, firstLine, flightLink, h, inert, isLive, loading, muted, put, replayAgentHref, setText, stateTag, text } from "/lib/dom.js";
import { agentState, fleet, invalidate } from "/lib/fleet.js";
import { KeyedTable } from "/lib/table.js";
import { branchLabel, programLabel } from "/lib/labels.js";
import { taskOf } from "/views/agent.js";
import { addAgentForm } from "/views/agent_add.js";

// Agents ---------------------------------------------------------------------------

function agentIndex() {
  const idx = new Map();
  const entry = (name) => {
    let e = idx.get(name);
    if (!e) idx.set(name, (e = { current: null, queued: 0, last: null }));
    return e;
  };
  for (const f of fleet.live.values()) {
    const e = entry(f.agent);
    if (f.state === "queued") e.queued++;
    else if (!e.current || f.created_at < e.current.created_at) e.current = f;
  }
  // What it did last: the newest flight that ended while the page watched.
  for (const f of fleet.seen.values()) {
    if (isLive(f.state)) continue;
    const e = entry(f.agent);
    if (!e.last || f.created_at > e.last.created_at) e.last = f;
  }
  return idx;
}

function agentsView() {
  const table = new KeyedTable({
    id: "agents",
    caption: "Agents",
    keyAttr: "agent",
    columns: [
      {
        cls: "name", head: "Agent", rowHeader: true, value: (r) => r.agent.name,
        paint: (td, r) => td.replaceChildren(h("a", { href: agentHref(r.agent.name) }, r.agent.name)),
      },
      {
        // An ACP agent's program as it named itself at `initialize` (`relay agent show`).
        cls: "harness", head: "Harness",
        value: (r) => [r.agent.harness, programLabel(r.agent.program)].join(" ").trim(),
        paint: (td, r) => td.replaceChildren(text(r.agent.harness),
          ...(r.agent.program ? [" ", muted(programLabel(r.agent.program))] : [])),
      },
      {
        cls: "state", head: "State", value: (r) => agentState(r.agent),
        paint: (td, r, v) => td.replaceChildren(stateTag(v)),
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
      {
        // What it is doing: the current flight's task (first line) and its progress.
        cls: "doing summary", head: "Doing",
        // Without one, the last it did (ended while the page watched), muted.
        value: (r) => [r.current?.id, r.task, r.current?.summary, r.last?.id, r.last?.state, r.lastTask].join("|"),
        paint: (td, r) => {
          td.dataset.flight = r.current ? r.current.id : "";
          td.replaceChildren();
          td.removeAttribute("title");
          if (r.current) {
            put(td, [r.task != null ? h("span", { class: "task-line" }, firstLine(r.task, 80)) : muted("…"),
              r.current.summary ? [" ", muted("· " + firstLine(r.current.summary, 60))] : null]);
            if (r.task != null) td.title = inert(firstLine(r.task, 400));
          } else if (r.last && r.lastTask != null) {
            put(td, [muted("last: "), h("span", { class: "last-task muted" }, firstLine(r.lastTask, 70)), " ",
              stateTag(r.last.state)]);
          } else {
            put(td, [muted("—")]);
          }
        },
      },
      { cls: "queue num", head: "Queue", value: (r) => String(r.queued) },
      {
        cls: "links", head: "Replay", value: (r) => r.agent.name,
        paint: (td, r) => td.replaceChildren(h("a", { href: replayAgentHref(r.agent.name), "aria-label": inert("Replay of " + r.agent.name) }, "replay")),
      },
    ],
  });
  const count = h("p", { class: "muted count" });
  const empty = h("p", { class: "muted empty", hidden: true },
    "No agents yet. Add one here, or with ", h("code", null, "relay agent add NAME --harness …"), ".");
  const waiting = loading("agents");
  const add = addAgentForm();
  const addButton = h("button", { type: "button", dataset: { action: "add-agent" }, "aria-expanded": "false" }, "Add agent");
  addButton.addEventListener("click", () => {
    add.el.hidden = !add.el.hidden;
    addButton.setAttribute("aria-expanded", String(!add.el.hidden));
    if (!add.el.hidden) add.focus();
  });
  const el = h("section", { class: "view agents-view", dataset: { view: "agents" }, "aria-labelledby": "agents-title" },
    h("div", { class: "view-head" }, h("h1", { id: "agents-title" }, "Agents"), count, addButton),
    add.el, waiting, empty, table.el);
  // A task fetched for a flight live before the page opened: paint its row again.
  const repaint = () => invalidate({ all: true });

  const sorted = () => [...fleet.agents.keys()].sort((x, y) => x.localeCompare(y));

  return {
    el,
    update(d) {
      if (!fleet.ready) return;
      waiting.hidden = true;
      const idx = agentIndex();
      const rec = (a) => {
        const r = { agent: a, ...(idx.get(a.name) || { current: null, queued: 0, last: null }) };
        r.task = r.current ? taskOf(r.current, repaint) : null;
        r.lastTask = !r.current && r.last ? taskOf(r.last, repaint) : null;
        return r;
      };
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
