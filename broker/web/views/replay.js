// Replays (a flight, an agent) read back from the log, and a flight's tree.

import { methodPath } from "/api.gen.js";
import { agentHref, conversationHref, defs, enc, errorNode, firstLine, flightHref, flightLink, h, link, loading, muted, num, stateTag, timeEl } from "/lib/dom.js";
import { api } from "/lib/api.js";
import { ITEM_KINDS } from "/lib/labels.js";

// Replay ---------------------------------------------------------------------------

function seqLabel(e) {
  return h("span", { class: "seq", title: "event seq" }, "#" + e.seq + (e.last_seq ? "–" + e.last_seq : ""));
}

/** One turn entry (a flight update or an approval step), every kind readable. */
function entryNode(e) {
  const body = [];
  let label = e.kind;
  switch (e.kind) {
    case "delta":
      label = "text";
      body.push(h("pre", { class: "block" }, e.text));
      break;
    case "item":
      label = `${ITEM_KINDS[e.item_kind] || e.item_kind} ${e.phase}`;
      body.push(muted("item " + e.item_id));
      if (e.text) body.push(h("pre", { class: "block" }, e.text));
      break;
    case "command_output":
      label = "command output";
      body.push(muted("item " + e.item_id), h("pre", { class: "block output" }, e.text));
      break;
    case "state":
      label = "state";
      body.push(h("p", null, "→ ", stateTag(e.to), e.reason ? [": ", e.reason] : null));
      if (e.output != null) body.push(h("pre", { class: "block" }, e.output));
      break;
    case "plan":
    case "diff":
      body.push(h("pre", { class: "block" }, e.text));
      break;
    case "usage":
      body.push(h("p", null, `${num(e.input_tokens)} input tokens, ${num(e.output_tokens)} output tokens`));
      break;
    case "session":
      body.push(h("p", null, e.thread_id ? ["thread ", h("span", { class: "mono" }, e.thread_id)] : null,
        e.turn_id ? [" turn ", h("span", { class: "mono" }, e.turn_id)] : null));
      break;
    case "note":
      body.push(h("p", { class: "note" }, e.text));
      break;
    case "approval_requested":
      label = "approval asked";
      body.push(h("p", null, ({ command: "run a command", file_change: "change files" })[e.approval_kind] || e.approval_kind,
        " ", muted(e.approval)),
      h("pre", { class: "command" }, e.detail),
      e.reason ? h("p", { class: "reason" }, "Reason: ", e.reason) : null);
      break;
    case "approval_decided":
      label = "approval " + (e.state === "expired" ? "expired" : "decided");
      body.push(h("p", null, muted(e.approval), " ",
        e.decision ? h("span", { class: "decision", dataset: { decision: e.decision } }, e.decision) : null,
        e.decided_by ? [" by ", h("span", { class: "decided-by" }, e.decided_by)] : null));
      break;
    default: {
      const rest = { ...e };
      delete rest.seq;
      delete rest.last_seq;
      delete rest.at;
      body.push(h("pre", { class: "block" }, JSON.stringify(rest, null, 2)));
    }
  }
  return h("li", { class: "entry", dataset: { kind: e.kind } },
    h("div", { class: "entry-head" }, seqLabel(e), " ", timeEl(e.at), " ", h("span", { class: "entry-kind" }, label)),
    body);
}

/** A whole turn: who asked what, then its entries in order. */
function turnNode(t) {
  const inv = t.invocation || {};
  return h("div", { class: "turn" },
    defs([
      ["Flight", flightLink(t.flight)],
      ["Agent", link(agentHref(t.agent), t.agent)],
      ["Asked by", inv.requester],
      ["Action", inv.action],
      ["Conversation", inv.conversation ? link(conversationHref(inv.conversation), inv.conversation) : null],
      ["Parent flight", inv.parent_flight ? flightLink(inv.parent_flight) : null],
      ["Depth", inv.depth ? String(inv.depth) : null],
      ["Asked", [seqLabel(t), " ", timeEl(t.at)]],
      ["State", stateTag(t.state)],
      ["Error", t.error],
      ["Usage", t.usage ? `${num(t.usage.input_tokens)} input, ${num(t.usage.output_tokens)} output tokens` : null],
      ["Thread", t.thread_id ? h("span", { class: "mono" }, t.thread_id) : null],
      ["Turn", t.turn_id ? h("span", { class: "mono" }, t.turn_id) : null],
      ["Links", [link("#/tree/" + enc(t.flight), "tree"), " · ", link(flightHref(t.flight), "live view")]],
    ]),
    h("h3", null, "Task"),
    h("pre", { class: "block task" }, inv.task ?? ""),
    h("h3", null, `Entries (${(t.entries || []).length})`),
    h("ol", { class: "entries" }, (t.entries || []).map(entryNode)));
}

function fetchedView(titleNodes, path, render) {
  const body = h("div", null, loading("replay"));
  const el = h("section", { class: "view replay-view" }, h("div", { class: "view-head" }, h("h1", null, titleNodes)), body);
  let gone = false;
  api(path).then((data) => {
    if (!gone) body.replaceChildren(render(data));
  }, (e) => {
    if (!gone) body.replaceChildren(errorNode(e));
  });
  return { el, destroy: () => { gone = true; } };
}

function replayFlightView(id) {
  return fetchedView(["Replay of flight ", h("span", { class: "mono" }, id)], methodPath("replay.flight", id), turnNode);
}

function replayAgentView(name) {
  return fetchedView(["Replay of agent ", h("span", { class: "mono" }, name)], methodPath("replay.agent", name), (r) => {
    const entries = r.entries || [];
    if (!entries.length) return h("p", { class: "muted" }, "Nothing recorded for this agent.");
    const turns = entries.filter((e) => e.kind === "turn").length;
    return h("div", null,
      h("p", { class: "muted" }, `${entries.length} entries, ${turns} turns, oldest first.`),
      h("ol", { class: "agent-entries" }, entries.map((e, i) => {
        switch (e.kind) {
          case "registered":
            return h("li", { class: "entry", dataset: { kind: e.kind } },
              h("div", { class: "entry-head" }, seqLabel(e), " ", timeEl(e.at), " ", h("span", { class: "entry-kind" }, "registered")),
              defs([["Harness", e.harness], ["Directory", e.cwd], ["Model", e.model], ["Node", e.node]]));
          case "removed":
            return h("li", { class: "entry", dataset: { kind: e.kind } },
              h("div", { class: "entry-head" }, seqLabel(e), " ", timeEl(e.at), " ", h("span", { class: "entry-kind" }, "removed")));
          case "thread_lost":
            return h("li", { class: "entry", dataset: { kind: e.kind } },
              h("div", { class: "entry-head" }, seqLabel(e), " ", timeEl(e.at), " ", h("span", { class: "entry-kind" }, "session lost")),
              h("p", null, "Thread ", h("span", { class: "mono" }, e.old_thread_id), " could not be resumed; a new one, ",
                h("span", { class: "mono" }, e.new_thread_id), ", replaced it: ", e.reason));
          case "turn":
            return h("li", { class: "entry", dataset: { kind: e.kind } },
              h("details", { open: i >= entries.length - 3 ? true : null },
                h("summary", null, seqLabel(e), " ", timeEl(e.at), " ", h("span", { class: "entry-kind" }, "turn"), " ",
                  h("span", { class: "mono" }, e.flight), " ", stateTag(e.state), " ",
                  h("span", { class: "task-line" }, firstLine(e.invocation?.task, 100))),
                turnNode(e)));
          default:
            return entryNode(e);
        }
      })));
  });
}

// Tree -----------------------------------------------------------------------------

function treeView(id) {
  const node = (t) => {
    const f = t.flight;
    const here = f.id === id;
    return h("li", { class: here ? "current" : null, dataset: { flight: f.id } },
      h("div", { class: "tree-node" },
        h("a", { href: flightHref(f.id), class: "mono", "aria-current": here ? "true" : null }, f.id), " ",
        link(agentHref(f.agent), f.agent), " ", stateTag(f.state), " ",
        h("span", { class: "summary" }, firstLine(f.error || f.summary || f.output || "", 100))),
      t.children && t.children.length ? h("ul", null, t.children.map(node)) : null);
  };
  return fetchedView(["Flight tree of ", h("span", { class: "mono" }, id)], methodPath("flight.tree", id),
    (tree) => h("ul", { class: "tree", id: "tree" }, node(tree)));
}

export {
  replayAgentView,
  replayFlightView,
  treeView,
};
