// The composer: ask an agent from the page, and the reply streaming in place under it.
//
// `askComposer(opts)` is a form (a task, and the agent picked by name unless the page is
// one agent's) that asks with `invocation.create`; each ask gets an entry under the
// form that follows its flight's watch (`watch?flight=ID`, as views/flight.js does):
// the streamed text grows as deltas come, once a frame; when the flight ends the text
// is replaced by its output, rendered as safe Markdown by lib/markdown.js, so the reply
// is shown once, with a link to its flight.
//
// Test hooks: `form[data-action="ask"]`, `textarea.composer-task`,
// `select.composer-agent`, `button[data-action="ask"]`; each ask is
// `li.ask[data-flight=ID][data-state=STATE]` holding `.ask-stream` (the deltas so far),
// `.ask-output` (the final reply) and `.ask-error`.

import { methodPath } from "/api.gen.js";
import { errorNode, firstLine, flightLink, h, isLive, muted, onFrame, setText, stateTag, submitOnCtrlEnter, text } from "/lib/dom.js";
import { call, login, openStream, withQuery } from "/lib/api.js";
import { markdown } from "/lib/markdown.js";

/** `textValue` in `el` as safe Markdown (lib/markdown.js: nodes only, no innerHTML). */
function renderReply(el, textValue) {
  el.replaceChildren(markdown(textValue));
  el.classList.add("markdown");
}

/** The name the page asks as, `<user>@dashboard`: what the broker records for a login's
 * ask whatever the body says. */
function requesterName() {
  return login.name ? `${login.name}@dashboard` : "operator";
}

/**
 * One ask's entry: its task, state, flight link, the text streaming in, then the reply.
 * `done(flight)` is called once when the flight ends. Returns `{li, close}`.
 */
function askEntry(flight, task, { done } = {}) {
  const id = flight.id;
  const stateEl = h("span", { class: "ask-state" }, stateTag(flight.state));
  const streamEl = h("pre", { class: "ask-stream stream", "aria-live": "polite", "aria-label": "Reply so far" });
  const outputEl = h("div", { class: "ask-output", hidden: true });
  const errorEl = h("p", { class: "ask-error error", hidden: true });
  const li = h("li", { class: "ask", dataset: { flight: id, state: flight.state } },
    h("div", { class: "ask-head" }, h("span", { class: "ask-task" }, firstLine(task, 200)), " ", stateEl, " ",
      flightLink(id)),
    streamEl, outputEl, errorEl);
  const buf = [];
  let lastSeq = 0;
  let ended = false;
  let stream = null;

  function flush() {
    if (buf.length === 0 || ended) return;
    streamEl.append(text(buf.join("")));
    buf.length = 0;
  }

  function applyUpdate(u) {
    if (u.seq <= lastSeq) return; // a reconnect's snapshot repeats what we have
    lastSeq = u.seq;
    if (u.kind === "delta") {
      buf.push(u.text);
      onFrame("ask-" + id, flush);
    }
  }

  function applyFlight(f) {
    if (!f || ended) return;
    li.dataset.state = f.state;
    stateEl.replaceChildren(stateTag(f.state));
    if (isLive(f.state)) return;
    ended = true;
    if (stream) stream.close();
    // The reply is shown once: its output replaces the streamed text.
    if (f.output != null && f.output !== "") {
      streamEl.hidden = true;
      outputEl.hidden = false;
      renderReply(outputEl, f.output);
    } else {
      flush();
    }
    if (f.error) {
      setText(errorEl, "Error: " + f.error);
      errorEl.hidden = false;
    }
    if (done) done(f);
  }

  stream = openStream(withQuery(methodPath("watch"), { flight: id }), {
    snapshot(s) {
      for (const u of s.updates || []) applyUpdate(u);
      applyFlight(s.flight);
    },
    flight_updated(e) {
      if (e.update) applyUpdate(e.update);
      if (e.flight) applyFlight(e.flight);
    },
  });
  return { li, close: () => stream && stream.close() };
}

/**
 * A composer. `agent`: the agent it asks (an agent's page); without, a select of
 * `agentNames()` picks one. `conversation`: the conversation the request and reply are
 * posted in (else the broker's direct one). `stream` (default true): follow each reply
 * in place under the form. `onAsked(accepted)` after each ask.
 */
function askComposer({ agent = null, agentNames = () => [], conversation = null, stream = true, onAsked } = {}) {
  const uid = "composer-" + Math.random().toString(36).slice(2, 8);
  const task = h("textarea", { id: uid + "-task", class: "composer-task", rows: "3", required: true,
    placeholder: agent ? `Ask ${agent}…` : "Ask the agent picked above…" });
  const select = agent ? null : h("select", { id: uid + "-agent", class: "composer-agent", required: true });
  const send = h("button", { type: "submit", dataset: { action: "ask" } }, "Ask");
  const result = h("div", { class: "ask-result", "aria-live": "polite" });
  const asks = h("ol", { class: "asks" });
  const entries = [];
  const form = h("form", { class: "compose composer", dataset: { action: "ask" } },
    select ? h("div", { class: "row" }, h("label", { for: select.id }, "Ask"), select) : null,
    h("label", { for: task.id }, agent ? ["Ask ", h("strong", null, agent)] : "Task"),
    task, h("div", { class: "row" }, send, muted(" Ctrl+Enter asks")), result);

  /** Puts the agents' names in the select, keeping the one picked. */
  function refreshAgents() {
    if (!select) return;
    const names = agentNames();
    const picked = select.value;
    const have = [...select.options].map((o) => o.value);
    if (have.length === names.length && have.every((n, i) => n === names[i])) return;
    select.replaceChildren(...names.map((n) => h("option", { value: n }, n)));
    if (names.includes(picked)) select.value = picked;
  }

  submitOnCtrlEnter(task, form);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const target = agent || select.value;
    const value = task.value;
    if (!target || !value.trim()) return;
    send.disabled = true;
    result.replaceChildren();
    const body = { target, task: value, requester: requesterName() };
    if (conversation) body.conversation = conversation;
    try {
      const got = await call("invocation.create", [], { body });
      task.value = "";
      if (stream) {
        const entry = askEntry(got.flight, value);
        entries.push(entry);
        asks.append(entry.li);
      } else {
        result.append(h("p", { class: "asked" }, "Asked ", target, ": ", flightLink(got.flight.id)));
      }
      if (onAsked) onAsked(got);
    } catch (err) {
      result.append(errorNode(err));
    } finally {
      send.disabled = false;
    }
  });
  refreshAgents();
  const el = h("div", { class: "composer-box" }, form, asks);
  return {
    el,
    refreshAgents,
    destroy() {
      for (const entry of entries) entry.close();
    },
  };
}

export {
  askComposer,
  askEntry,
  renderReply,
  requesterName,
};
