// One flight, live from its watch.

import { methodPath } from "/api.gen.js";
import { agentHref, defs, enc, flightLink, h, isLive, link, muted, onFrame, placeInOrder, setText, showError, stateTag, text, timeEl, usageText } from "/lib/dom.js";
import { call, openStream, withQuery } from "/lib/api.js";
import { commitLabel, ITEM_KINDS, revertLabel } from "/lib/labels.js";
import { ApprovalItems, byCreated } from "/views/approvals.js";

// One flight, live ------------------------------------------------------------------

function flightView(id) {
  let flight = null;
  let lastSeq = 0;
  let stream = null;
  let destroyed = false;
  const textBuf = [];
  const items = new Map(); // item_id -> {li, head, body, out, buf}
  const outPending = new Set();

  const title = h("h1", null, "Flight ", h("span", { class: "mono" }, id));
  const stateEl = h("span", { class: "state-now" });
  const meta = h("div", { class: "meta" });
  const interrupt = h("button", { type: "button", id: "flight-interrupt", class: "danger", hidden: true }, "Interrupt");
  const actionError = h("p", { class: "error", role: "alert", hidden: true });
  const links = h("p", { class: "links" },
    link("#/tree/" + enc(id), "Tree"), " · ", link("#/replay/flight/" + enc(id), "Replay"), " ", interrupt);
  const errorEl = h("p", { id: "flight-error", class: "error", hidden: true });
  const approvalsList = h("ul", { class: "approvals" });
  const approvalsBox = h("section", { class: "inline-approvals", hidden: true, "aria-label": "Approvals of this flight" },
    h("h2", null, "Approvals"), approvalsList);
  const textEl = h("pre", { id: "flight-text", class: "stream", tabindex: "0", "aria-label": "Streamed text" });
  const itemsEl = h("ol", { id: "flight-items", class: "items" });
  const itemsEmpty = h("p", { class: "muted" }, "No items yet.");
  const planEl = h("pre", { id: "flight-plan", class: "block" });
  const planBox = h("section", { hidden: true }, h("h2", null, "Plan"), planEl);
  const diffEl = h("pre", { id: "flight-diff", class: "block" });
  const diffBox = h("section", { hidden: true }, h("h2", null, "Diff"), diffEl);
  const usageEl = h("p", { id: "flight-usage" }, muted("no usage reported yet"));
  const outputEl = h("pre", { id: "flight-output", class: "block" });
  const outputBox = h("section", { hidden: true }, h("h2", null, "Output"), outputEl);
  const history = h("ol", { id: "flight-history", class: "history" });
  const status = h("p", { class: "muted" }, "Connecting…");
  const fetchError = h("p", { class: "error", role: "alert", hidden: true });

  const el = h("section", { id: "flight", class: "view flight-view", dataset: { flight: id } },
    h("div", { class: "view-head" }, title, stateEl), meta, links, actionError, status, fetchError, errorEl,
    approvalsBox,
    h("section", null, h("h2", null, "Text"), textEl),
    h("section", null, h("h2", null, "Items"), itemsEmpty, itemsEl),
    planBox, diffBox,
    h("section", null, h("h2", null, "Usage"), usageEl),
    outputBox,
    h("section", null, h("h2", null, "History"), history));

  interrupt.addEventListener("click", async () => {
    interrupt.disabled = true;
    actionError.hidden = true;
    try {
      const f = await call("flight.interrupt", [id]);
      if (f && f.id === id && (f.update_seq ?? 0) >= (flight?.update_seq ?? 0)) applyFlight(f);
    } catch (e) {
      showError(actionError, e);
    } finally {
      interrupt.disabled = false;
    }
  });

  function flushText() {
    if (destroyed || textBuf.length === 0) return;
    const chunk = textBuf.join("");
    textBuf.length = 0;
    const atEnd = textEl.scrollTop + textEl.clientHeight >= textEl.scrollHeight - 8;
    textEl.append(text(chunk));
    if (atEnd) textEl.scrollTop = textEl.scrollHeight;
  }

  function flushOutputs() {
    if (destroyed) return;
    for (const it of outPending) {
      const atEnd = it.out.scrollTop + it.out.clientHeight >= it.out.scrollHeight - 8;
      it.out.hidden = false;
      it.out.append(text(it.buf.join("")));
      it.buf.length = 0;
      if (atEnd) it.out.scrollTop = it.out.scrollHeight;
    }
    outPending.clear();
  }

  function item(itemId, kind) {
    let it = items.get(itemId);
    if (!it) {
      const head = h("div", { class: "item-head" });
      const body = h("pre", { class: "item-text", hidden: true });
      const out = h("pre", { class: "item-output", hidden: true, "aria-label": "Output" });
      const li = h("li", { class: "item", dataset: { item: itemId, kind: kind || "", phase: "started" } }, head, body, out);
      it = { li, head, body, out, buf: [], kind: kind || "command_execution" };
      items.set(itemId, it);
      itemsEl.append(li);
      itemsEmpty.hidden = true;
    }
    return it;
  }

  function paintItemHead(it, u) {
    it.head.replaceChildren(
      h("span", { class: "item-kind" }, ITEM_KINDS[it.kind] || it.kind),
      " ",
      h("span", { class: "phase", dataset: { phase: u.phase } }, u.phase === "completed" ? "done" : "running…"),
      " ", timeEl(u.at), " ", muted(u.item_id));
  }

  function historyEntry(u, ...content) {
    history.append(h("li", { dataset: { kind: u.kind } }, timeEl(u.at), " ", ...content));
  }

  function applyUpdate(u) {
    if (u.seq <= lastSeq) return; // a reconnect's snapshot repeats what we have
    lastSeq = u.seq;
    switch (u.kind) {
      case "delta":
        textBuf.push(u.text);
        onFrame("flight-text", flushText);
        break;
      case "item": {
        const it = item(u.item_id, u.item_kind);
        it.kind = u.item_kind;
        it.li.dataset.kind = u.item_kind;
        it.li.dataset.phase = u.phase;
        paintItemHead(it, u);
        if (u.text != null && u.text !== "") {
          setText(it.body, u.text);
          it.body.hidden = false;
        }
        break;
      }
      case "command_output": {
        const it = item(u.item_id, null);
        if (!it.head.firstChild) paintItemHead(it, { ...u, phase: "started" });
        it.buf.push(u.text);
        outPending.add(it);
        onFrame("flight-items-out", flushOutputs);
        break;
      }
      case "state":
        historyEntry(u, "→ ", stateTag(u.to), u.reason ? [": ", h("span", { class: "reason" }, u.reason)] : null);
        if (u.output != null && u.output !== paintedOutput) {
          paintedOutput = u.output;
          setText(outputEl, u.output);
          outputBox.hidden = false;
        }
        break;
      case "plan":
        setText(planEl, u.text);
        planBox.hidden = false;
        break;
      case "diff":
        setText(diffEl, u.text);
        diffBox.hidden = false;
        break;
      case "usage":
        // The flight record's usage (its cost filled in by the broker) wins once painted.
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
    el.dataset.state = f.state;
    stateEl.replaceChildren(stateTag(f.state));
    const key = [f.state, f.updated_at, f.thread_id, f.turn_id, f.parent_flight,
      commitLabel(f.commit), revertLabel(f.commit?.reverted_by)].join("|");
    if (key !== paintedKey) {
      paintedKey = key;
      meta.replaceChildren(defs([
        ["Agent", link(agentHref(f.agent), f.agent)],
        ["Conversation", link("#/conversation/" + enc(f.conversation), f.conversation)],
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
    if (f.output != null && f.output !== paintedOutput) {
      paintedOutput = f.output;
      setText(outputEl, f.output);
      outputBox.hidden = false;
    }
    interrupt.hidden = !isLive(f.state);
    if (!isLive(f.state)) {
      status.hidden = false;
      setText(status, "Finished.");
    }
  }
  let paintedKey = "";
  let paintedOutput = null;

  function renderApprovals() {
    const mine = [...fleet.pending.values(), ...fleet.decided.values()]
      .filter((a) => a.flight === id)
      .sort(byCreated);
    approvalsBox.hidden = mine.length === 0;
    placeInOrder(approvalsList, approvalItems.nodes(mine));
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
    },
    destroy() {
      destroyed = true;
      if (stream) stream.close();
    },
  };
}

export {
  flightView,
};
