// One flight, live from its watch: a place to read what an agent did and to work with it.
//
// Top to bottom: the task (who asked, what, in which conversation), the cause of a stall
// in plain words, the flight's facts, the controls (steer and interrupt while it runs,
// follow up once it ended), its approvals inline, the reply (rendered Markdown, shown
// once: streamed text while it runs, then the final output in the same element), the
// commands and tool calls with their output and exit status, the diff per file, usage,
// the agent-to-agent children, and the history.
//
// Text from the broker goes in inert (`text()`); the reply goes through the safe
// Markdown renderer (`lib/markdown.js`); a diff is text lines with a class each.
//
// Hooks for tests: the view is `#flight[data-view="flight"][data-flight][data-state]`;
// `#flight-task` (`.requester`, `.task`, `a.message`), `#flight-cause`, `#flight-text`
// (the reply), `#flight-items > li.item[data-item][data-kind][data-phase]` with
// `.command`, `.item-output`, `.exit[data-exit]`; `#flight-diff > details.diff-file
// [data-file]` with `.diff-line.add|del|hunk|meta`; `#flight-children`; the forms
// `form[data-action="steer"|"follow-up"]` (an input, a submit button) and
// `button[data-action="interrupt"]`, each with `.result` and `.error` beside it.

import { methodPath } from "/api.gen.js";
import { agentHref, conversationHref, defs, enc, flightHref, flightLink, h, isLive, link, muted, onFrame, placeInOrder, put, setText, showError, stateTag, text, timeEl, usageText } from "/lib/dom.js";
import { call, openStream, withQuery } from "/lib/api.js";
import { fleet } from "/lib/fleet.js";
import { commitLabel, explain, ITEM_KINDS, NOTE_CAUSES, revertLabel } from "/lib/labels.js";
import { renderMarkdown } from "/lib/markdown.js";
import { ApprovalItems, byCreated } from "/views/approvals.js";

// A command's output kept on the page: its tail (the end says how it went).
const OUTPUT_TAIL = 64 * 1024;
// Lines of one file's diff shown (a huge generated file would stall the page).
const DIFF_LINES = 4000;
// Items the reply already shows, or that are the task and steers themselves.
const NOT_TOOLS = new Set(["agent_message", "user_message"]);

// ---------------------------------------------------------------------------------
// The cause of a stall, in plain words (a note's, lib/labels.js NOTE_CAUSES).

const ERROR_CAUSES = [
  [/^budget_exceeded:\s*(.*)$/s, (m) => `Refused: the agent's budget is used up: ${m[1]}`],
  [/could not reach its model for (\d+) s/, (m, t) => `The agent could not reach its model for ${m[1]} seconds; the turn was interrupted. (${t})`],
  [/^interrupted$/, () => "Interrupted."],
];


/**
 * Why `f` is not moving, in a sentence, or null. `progressAt` is the time of its last
 * text or item: a note older than that is over.
 */
function stallCause(f, progressAt, pending) {
  if (f.state === "failed" || f.state === "cancelled") {
    return f.error ? explain(ERROR_CAUSES, f.error) || f.error : null;
  }
  if (!isLive(f.state)) return null;
  if (pending > 0) return pending === 1 ? "Waiting for a decision on the approval below." : `Waiting for decisions on ${pending} approvals below.`;
  if (f.state === "queued") {
    const ahead = [...fleet.live.values()]
      .filter((x) => x.agent === f.agent && x.id !== f.id && x.state !== "queued");
    if (ahead.length) return ["Queued: waiting for ", f.agent, "'s current flight ", flightLink(ahead[0].id), " to end."];
    const agent = fleet.agents.get(f.agent);
    if (agent && (agent.state === "offline" || agent.state === "starting")) return `Queued: ${f.agent}'s session is starting.`;
    if (agent && agent.state === "failed") return `Queued: ${f.agent} failed to start${agent.state_reason ? ": " + agent.state_reason : "."}`;
    return "Queued: waiting for its turn.";
  }
  if (f.state === "waking") return `${f.agent}'s session is starting.`;
  const note = f.note;
  if (note && note.at >= progressAt && !/^steered/.test(note.text)) return explain(NOTE_CAUSES, note.text) || note.text;
  return null;
}

// ---------------------------------------------------------------------------------
// A unified diff, one collapsible block per file.

/** `patch` split at its `diff --git` lines: [{name, lines}]. */
function splitPatch(patch) {
  const files = [];
  let cur = null;
  for (const line of String(patch || "").split("\n")) {
    if (line.startsWith("diff --git ")) {
      const m = / b\/(.*)$/.exec(line);
      cur = { name: m ? m[1] : line.slice(11), lines: [line] };
      files.push(cur);
    } else if (cur) cur.lines.push(line);
    else if (line) {
      cur = { name: "(patch)", lines: [line] };
      files.push(cur);
    }
  }
  for (const f of files) {
    while (f.lines.length && f.lines[f.lines.length - 1] === "") f.lines.pop();
    // A renamed or deleted file names itself in +++/--- lines.
    const plus = f.lines.find((l) => l.startsWith("+++ "));
    if (plus && plus !== "+++ /dev/null" && f.name === "(patch)") f.name = plus.replace(/^\+\+\+ (b\/)?/, "");
  }
  return files;
}

function diffFile(f) {
  let added = 0;
  let removed = 0;
  let header = true;
  const pre = h("pre", { class: "diff" });
  const shown = f.lines.slice(0, DIFF_LINES);
  for (const line of shown) {
    let cls = "ctx";
    if (line.startsWith("@@")) {
      cls = "hunk";
      header = false;
    } else if (header) cls = "meta";
    else if (line.startsWith("+")) {
      cls = "add";
      added++;
    } else if (line.startsWith("-")) {
      cls = "del";
      removed++;
    }
    pre.append(h("span", { class: "diff-line " + cls }, line), "\n");
  }
  if (f.lines.length > shown.length) pre.append(muted(`… ${f.lines.length - shown.length} more lines not shown`));
  return h("details", { class: "diff-file", open: true, dataset: { file: f.name } },
    h("summary", null, h("span", { class: "mono file-name" }, f.name), " ",
      h("span", { class: "added" }, "+" + added), " ", h("span", { class: "removed" }, "-" + removed)),
    pre);
}

// ---------------------------------------------------------------------------------
// A control: a form with a text box and a button, or a button alone; Enter in the box
// sends, Escape leaves it; the result or the error shows beside it.

function control(action, label, { placeholder, send }) {
  const input = placeholder == null ? null
    : h("input", { type: "text", name: "text", autocomplete: "off", placeholder, "aria-label": placeholder });
  const button = h("button", { type: "submit", class: action === "interrupt" ? "danger" : null }, label);
  const result = h("span", { class: "result", role: "status" });
  const error = h("p", { class: "error", role: "alert", hidden: true });
  const form = h("form", { class: "control", dataset: { action } }, input, button, result, error);
  if (input) {
    input.addEventListener("keydown", (e) => {
      if (e.key === "Escape") {
        e.preventDefault();
        input.blur();
      }
    });
  }
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const value = input ? input.value.trim() : "";
    if (input && !value) {
      showError(error, "Type something first.");
      return;
    }
    button.disabled = true;
    error.hidden = true;
    setText(result, "…");
    try {
      const said = await send(value);
      result.replaceChildren();
      put(result, [said ?? "Done."]);
      if (input) input.value = "";
    } catch (err) {
      setText(result, "");
      showError(error, err);
    } finally {
      button.disabled = false;
    }
  });
  return { form, input, button, result, error };
}

// ---------------------------------------------------------------------------------

function flightView(id) {
  let flight = null;
  let invocation = null;
  let lastSeq = 0;
  let stream = null;
  let destroyed = false;
  let streamed = ""; // the text deltas so far
  let progressAt = 0;
  let diffKey = "";
  let treeKey = "";
  const items = new Map(); // item_id -> {li, head, cmd, body, out, outText, exit}

  const title = h("h1", null, "Flight ", h("span", { class: "mono" }, id));
  const stateEl = h("span", { class: "state-now" });
  const taskEl = h("section", { id: "flight-task", class: "task", "aria-label": "Task" }, muted("Loading the task…"));
  const causeEl = h("p", { id: "flight-cause", class: "cause", role: "status", hidden: true });
  const meta = h("div", { class: "meta" });
  const links = h("p", { class: "links" },
    link("#/tree/" + enc(id), "Tree"), " · ", link("#/replay/flight/" + enc(id), "Replay"));
  const errorEl = h("p", { id: "flight-error", class: "error", hidden: true });
  const status = h("p", { class: "muted" }, "Connecting…");
  const fetchError = h("p", { class: "error", role: "alert", hidden: true });

  const steer = control("steer", "Steer", {
    placeholder: "Steer: add to what it is doing",
    send: async (text) => {
      const f = await call("flight.steer", [id], { body: { text } });
      if (f && f.id === id) applyFlight(f);
      return "Sent to the agent.";
    },
  });
  const interrupt = control("interrupt", "Interrupt", {
    send: async () => {
      const f = await call("flight.interrupt", [id]);
      if (f && f.id === id && (f.update_seq ?? 0) >= (flight?.update_seq ?? 0)) applyFlight(f);
      return "Interrupted.";
    },
  });
  const followUp = control("follow-up", "Follow up", {
    placeholder: "Follow up: ask the same agent, in the same session",
    send: async (task) => {
      const got = await call("invocation.create", [], {
        body: { target: flight.agent, task, conversation: flight.conversation },
      });
      const next = got.flight.id;
      location.hash = flightHref(next);
      return ["Asked: ", flightLink(next)];
    },
  });
  const controls = h("section", { id: "flight-controls", class: "controls", "aria-label": "Work with this flight" },
    steer.form, interrupt.form, followUp.form);
  for (const c of [steer, interrupt, followUp]) c.form.hidden = true;

  const approvalsList = h("ul", { class: "approvals" });
  const approvalsBox = h("section", { class: "inline-approvals", hidden: true, "aria-label": "Approvals of this flight" },
    h("h2", null, "Approvals"), approvalsList);
  const textEl = h("div", { id: "flight-text", class: "md reply", tabindex: "0", "aria-label": "Reply" });
  const itemsEl = h("ol", { id: "flight-items", class: "items" });
  const itemsBox = h("section", { hidden: true }, h("h2", null, "Commands and tools"), itemsEl);
  const planEl = h("pre", { id: "flight-plan", class: "block" });
  const planBox = h("section", { hidden: true }, h("h2", null, "Plan"), planEl);
  const diffEl = h("div", { id: "flight-diff" });
  const diffNote = h("p", { class: "muted" });
  const diffBox = h("section", { hidden: true }, h("h2", null, "Changes"), diffNote, diffEl);
  const usageEl = h("p", { id: "flight-usage" }, muted("no usage reported yet"));
  const childrenEl = h("ul", { id: "flight-children", class: "tree" });
  const childrenBox = h("section", { hidden: true }, h("h2", null, "Flights it asked"), childrenEl);
  const history = h("ol", { id: "flight-history", class: "history" });

  const el = h("section", { id: "flight", class: "view flight-view", dataset: { view: "flight", flight: id } },
    h("div", { class: "view-head" }, title, stateEl), taskEl, causeEl, meta, links, status, fetchError, errorEl,
    controls, approvalsBox,
    h("section", null, h("h2", null, "Reply"), textEl),
    itemsBox, planBox, diffBox,
    h("section", null, h("h2", null, "Usage"), usageEl),
    childrenBox,
    h("details", { class: "history-box" }, h("summary", null, "History"), history));

  // The task: who asked what, from the log (only the request: no entries).
  call("replay.flight", [id], { query: { from_seq: Number.MAX_SAFE_INTEGER } }).then((r) => {
    if (destroyed) return;
    invocation = r.invocation;
    paintTask();
  }, (e) => {
    if (!destroyed) taskEl.replaceChildren(errorNode(e));
  });

  function errorNode(e) {
    const p = h("p", { class: "error", role: "alert" });
    showError(p, e);
    return p;
  }

  function paintTask() {
    const inv = invocation;
    if (!inv) return;
    const conv = inv.conversation;
    taskEl.replaceChildren(
      h("p", { class: "asked" },
        h("span", { class: "requester" }, inv.requester), " asked ", link(agentHref(inv.target), inv.target),
        inv.parent_flight ? [" from flight ", flightLink(inv.parent_flight)] : null,
        " in ", link(conversationHref(conv), conv),
        inv.request_message ? [" (", h("a", { class: "message mono", href: conversationHref(conv), title: "The message that asked" }, inv.request_message), ")"] : null,
        " ", timeEl(inv.created_at)),
      h("pre", { class: "task-text task" }, inv.task));
  }

  // Rendering the reply again costs as much as its last block (a long paragraph being
  // written is re-parsed whole): after a costly render the next waits a few frames, so
  // that rendering takes at most about a quarter of the time and frames keep coming.
  let nextRenderAt = 0;
  function paintReply() {
    if (destroyed) return;
    const ended = flight && !isLive(flight.state);
    const t0 = performance.now();
    if (!ended && t0 < nextRenderAt) {
      onFrame("flight-text", paintReply);
      return;
    }
    // The final output replaces the streamed text in the same element: the blocks that
    // did not change keep their nodes, so nothing jumps.
    const shown = ended && flight.output != null ? flight.output : streamed;
    if (shown === paintedReply) return;
    paintedReply = shown;
    renderMarkdown(textEl, shown);
    nextRenderAt = t0 + 4 * (performance.now() - t0);
  }
  let paintedReply = null;

  function flushOutputs() {
    if (destroyed) return;
    for (const it of items.values()) {
      if (!it.dirty) continue;
      it.dirty = false;
      const atEnd = it.out.scrollTop + it.out.clientHeight >= it.out.scrollHeight - 8;
      let t = it.outText;
      let cut = "";
      if (t.length > OUTPUT_TAIL) {
        cut = `… ${t.length - OUTPUT_TAIL} earlier characters not shown\n`;
        t = t.slice(-OUTPUT_TAIL);
      }
      it.out.replaceChildren(...(cut ? [muted(cut)] : []), text(t));
      it.outBox.hidden = false;
      if (atEnd) it.out.scrollTop = it.out.scrollHeight;
    }
  }

  function item(itemId, kind) {
    let it = items.get(itemId);
    if (!it) {
      const head = h("div", { class: "item-head" });
      const cmd = h("pre", { class: "command", hidden: true });
      const out = h("pre", { class: "item-output", "aria-label": "Output" });
      const outBox = h("details", { class: "output-box", hidden: true, open: true }, h("summary", null, "Output"), out);
      const li = h("li", { class: "item", dataset: { item: itemId, kind: kind || "", phase: "started" } }, head, cmd, outBox);
      it = { li, head, cmd, out, outBox, outText: "", kind: kind || "command_execution", dirty: false };
      items.set(itemId, it);
      itemsEl.append(li);
    }
    return it;
  }

  function paintItemHead(it, u) {
    const done = u.phase === "completed";
    let exit = null;
    if (it.kind === "command_execution" && done) {
      exit = u.exit_code != null
        ? h("span", { class: "exit", dataset: { exit: String(u.exit_code) } }, "exit status " + u.exit_code)
        : h("span", { class: "exit", dataset: { exit: "unknown" } }, "exit status unknown");
    }
    it.head.replaceChildren();
    put(it.head, [
      h("span", { class: "item-kind" }, ITEM_KINDS[it.kind] || it.kind), " ",
      h("span", { class: "phase", dataset: { phase: u.phase } }, done ? "done" : "running…"),
      exit ? [" · ", exit] : null, " ", timeEl(u.at)]);
  }

  function historyEntry(u, ...content) {
    history.append(h("li", { dataset: { kind: u.kind } }, timeEl(u.at), " ", ...content));
  }

  function showPatch(patch, note) {
    const files = splitPatch(patch);
    diffEl.replaceChildren(...files.map(diffFile));
    setText(diffNote, note || "");
    diffNote.hidden = !note;
    diffBox.hidden = files.length === 0 && !note;
  }

  function applyUpdate(u) {
    if (u.seq <= lastSeq) return; // a reconnect's snapshot repeats what we have
    lastSeq = u.seq;
    switch (u.kind) {
      case "delta":
        streamed += u.text;
        progressAt = u.at || progressAt;
        onFrame("flight-text", paintReply);
        break;
      case "item": {
        progressAt = u.at || progressAt;
        if (NOT_TOOLS.has(u.item_kind)) break;
        const it = item(u.item_id, u.item_kind);
        it.kind = u.item_kind;
        it.li.dataset.kind = u.item_kind;
        it.li.dataset.phase = u.phase;
        paintItemHead(it, u);
        if (u.text != null && u.text !== "") {
          setText(it.cmd, u.text);
          it.cmd.hidden = false;
        }
        itemsBox.hidden = false;
        break;
      }
      case "command_output": {
        progressAt = u.at || progressAt;
        const it = item(u.item_id, null);
        if (!it.head.firstChild) paintItemHead(it, { ...u, phase: "started" });
        it.outText += u.text;
        // Keep a bounded tail in memory too.
        if (it.outText.length > 2 * OUTPUT_TAIL) it.outText = it.outText.slice(-OUTPUT_TAIL - 1024);
        it.dirty = true;
        itemsBox.hidden = false;
        onFrame("flight-items-out", flushOutputs);
        break;
      }
      case "state":
        historyEntry(u, "→ ", stateTag(u.to), u.reason ? [": ", h("span", { class: "reason" }, u.reason)] : null);
        break;
      case "plan":
        setText(planEl, u.text);
        planBox.hidden = false;
        break;
      case "diff":
        // The harness's own view of the turn's changes, until the commit's patch.
        if (!diffKey) showPatch(u.text, "As the agent reported it (not committed yet).");
        break;
      case "usage":
        if (!flight?.usage) setText(usageEl, usageText(u));
        break;
      case "session":
        historyEntry(u, "session ", u.thread_id ? ["thread ", h("span", { class: "mono" }, u.thread_id)] : null,
          u.turn_id ? [" turn ", h("span", { class: "mono" }, u.turn_id)] : null);
        break;
      case "note":
        historyEntry(u, h("span", { class: "note" }, u.text));
        break;
      case "commit":
        historyEntry(u, h("span", { class: "mono" }, commitLabel(u.commit)));
        if (u.commit && u.commit.patch != null) {
          diffKey = u.commit.head || "commit";
          showPatch(u.commit.patch, u.commit.patch_truncated ? "The patch was cut: `relay diff` shows all of it." : "");
        }
        break;
      case "reverted":
        historyEntry(u, h("span", { class: "mono" }, revertLabel(u.revert)));
        break;
      default:
        historyEntry(u, u.kind);
    }
  }

  // Many records arrive per second while text streams: keep the last, paint it once a frame.
  function applyFlight(f) {
    flight = f;
    if (!isLive(f.state) && stream) {
      // A finished flight's watch ends; do not let the browser reconnect it.
      stream.close();
      stream = null;
    }
    onFrame("flight-record", paintFlight);
  }

  function paintFlight() {
    if (destroyed || !flight) return;
    const f = flight;
    const live = isLive(f.state);
    if (!live && el.dataset.state && isLive(el.dataset.state) && el.isConnected) {
      // Ended while shown: the reply box keeps the height it streamed in (the final
      // output may be shorter), so the sections below do not move.
      textEl.style.minHeight = textEl.offsetHeight + "px";
    }
    el.dataset.state = f.state;
    stateEl.replaceChildren(stateTag(f.state));
    const key = [f.state, f.updated_at, f.thread_id, f.turn_id, f.parent_flight,
      commitLabel(f.commit), revertLabel(f.commit?.reverted_by)].join("|");
    if (key !== paintedKey) {
      paintedKey = key;
      meta.replaceChildren(defs([
        ["Agent", link(agentHref(f.agent), f.agent)],
        ["Conversation", link(conversationHref(f.conversation), f.conversation)],
        ["Parent flight", f.parent_flight ? flightLink(f.parent_flight) : null],
        ["Asked", timeEl(f.created_at)],
        ["Updated", timeEl(f.updated_at)],
        ["Thread", f.thread_id ? h("span", { class: "mono" }, f.thread_id) : null],
        ["Turn", f.turn_id ? h("span", { class: "mono" }, f.turn_id) : null],
        // What it changed in its agent's worktree, and its revert (`relay diff`, `relay revert`).
        ["Commit", f.commit ? h("span", { class: "mono" }, commitLabel(f.commit)) : null],
        ["Reverted", f.commit?.reverted_by ? h("span", { class: "mono" }, revertLabel(f.commit.reverted_by)) : null],
      ]));
    }
    if (f.usage) setText(usageEl, usageText(f.usage));
    setText(errorEl, f.error ? "Error: " + f.error : "");
    errorEl.hidden = !f.error;
    steer.form.hidden = !live;
    interrupt.form.hidden = !live;
    followUp.form.hidden = live;
    paintCause();
    paintReply();
    // The commit's patch, once per commit (the record leaves the patch out).
    if (f.commit && diffKey !== (f.commit.head || "commit")) {
      diffKey = f.commit.head || "commit";
      call("flight.diff", [id]).then((d) => {
        if (!destroyed && d.commit) showPatch(d.commit.patch || "", d.commit.patch_truncated ? "The patch was cut: `relay diff` shows all of it." : "");
      }, (e) => {
        if (!destroyed) {
          diffBox.hidden = false;
          diffEl.replaceChildren(errorNode(e));
        }
      });
    }
    loadChildren();
  }
  let paintedKey = "";

  function paintCause() {
    if (!flight) return;
    const pending = [...fleet.pending.values()].filter((a) => a.flight === id).length;
    const cause = stallCause(flight, progressAt, pending);
    causeEl.hidden = cause == null;
    causeEl.replaceChildren();
    put(causeEl, [cause ?? []]);
    causeEl.dataset.state = flight.state;
  }

  // The flights this one asked (agent to agent), from its tree; again when one of them
  // changes in the fleet, or this one's state does.
  function loadChildren() {
    const kids = [...fleet.seen.values()].filter((x) => x.parent_flight === id);
    const key = flight.state + "|" + kids.map((k) => k.id + k.state).join(",");
    if (key === treeKey) return;
    treeKey = key;
    call("flight.tree", [id]).then((t) => {
      if (destroyed) return;
      const find = (n) => (n.flight.id === id ? n : n.children.map(find).find(Boolean));
      const me = find(t);
      const list = (n) => n.children.map((c) => h("li", { dataset: { flight: c.flight.id } },
        flightLink(c.flight.id), " ", link(agentHref(c.flight.agent), c.flight.agent), " ", stateTag(c.flight.state),
        c.children.length ? h("ul", null, list(c)) : null));
      const nodes = me ? list(me) : [];
      childrenEl.replaceChildren(...nodes);
      childrenBox.hidden = nodes.length === 0;
    }, () => {});
  }

  function renderApprovals() {
    const mine = [...fleet.pending.values(), ...fleet.decided.values()]
      .filter((a) => a.flight === id)
      .sort(byCreated);
    approvalsBox.hidden = mine.length === 0;
    placeInOrder(approvalsList, approvalItems.nodes(mine));
    paintCause();
  }
  const approvalItems = new ApprovalItems();

  stream = openStream(withQuery(methodPath("watch"), { flight: id }), {
    snapshot(s) {
      status.hidden = true;
      fetchError.hidden = true;
      for (const u of s.updates || []) applyUpdate(u);
      applyFlight(s.flight);
    },
    // A reconnection resumed after the last event seen (Last-Event-ID): no snapshot.
    resumed() {
      status.hidden = true;
    },
    flight_updated(e) {
      if (e.update) applyUpdate(e.update);
      if (e.flight) applyFlight(e.flight);
    },
  }, {
    onError() {
      if (!flight) {
        // No snapshot: find out why (an unknown flight says so).
        call("flight.show", [id]).then(() => setText(status, "Reconnecting…"), (e) => {
          showError(fetchError, e);
          status.hidden = true;
          if (e.status === 404 && stream) {
            stream.close();
            stream = null;
          }
        });
      } else if (isLive(flight.state)) {
        status.hidden = false;
        setText(status, "Disconnected: reconnecting…");
      }
    },
  });

  return {
    el,
    update(d) {
      if (d.all || d.approvals) renderApprovals();
      if (flight && (d.all || d.flights.size || d.agents.size)) {
        paintCause();
        loadChildren();
      }
    },
    destroy() {
      destroyed = true;
      if (stream) stream.close();
    },
  };
}

export {
  flightView,
  splitPatch,
  stallCause,
};
