// The conversations list and one conversation, live, with two composers: one asks an
// agent picked by name (`invocation.create` with `conversation` set: the broker posts
// the task as a message of this conversation, and the agent's reply in reply to it, so
// both are recorded here), the other posts a message (an @mention consults an agent).
// While a flight of this conversation runs, a "working" line says so, with its latest
// progress (the flight record's summary or note, from the fleet watch), until its
// reply message arrives. A reply names the message it answers by that message's first
// line, a link that scrolls to it. The header's message count follows each message.
//
// Test hooks: `section[data-view="conversation"]`, `#conversation-count` (the header's
// count), `#messages li.message[data-message=ID]` with `.reply-link[data-reply-to=ID]`,
// `#working li.working[data-flight=ID]`, the composer's hooks (views/composer.js);
// the list's `#conversations tr[data-conversation=ID]` and `#conversations-count`.

import { methodPath } from "/api.gen.js";
import { conversationHref, defs, errorNode, firstLine, flightLink, h, isLive, loading, muted, num, put, setText, showError, submitOnCtrlEnter, timeEl } from "/lib/dom.js";
import { call, login, openStream, withQuery } from "/lib/api.js";
import { fleet } from "/lib/fleet.js";
import { noteNow } from "/lib/labels.js";
import { markdown } from "/lib/markdown.js";
import { KeyedTable } from "/lib/table.js";
import { askComposer } from "/views/composer.js";

// Conversations --------------------------------------------------------------------

function conversationsView() {
  const table = new KeyedTable({
    id: "conversations",
    caption: "Conversations",
    keyAttr: "conversation",
    columns: [
      {
        cls: "id", head: "Conversation", rowHeader: true, value: (c) => c.id,
        paint: (td, c) => td.replaceChildren(h("a", { href: conversationHref(c.id), class: "mono" }, c.id)),
      },
      { cls: "kind", head: "Kind", value: (c) => c.kind },
      { cls: "title", head: "Title", value: (c) => c.title || "" },
      { cls: "participants", head: "Participants", value: (c) => (c.participants || []).join(", ") },
      { cls: "num", head: "Messages", value: (c) => num(c.message_count) },
      { cls: "when", head: "Created", value: (c) => String(c.created_at), paint: (td, c) => td.replaceChildren(timeEl(c.created_at)) },
    ],
  });
  const waiting = loading("conversations");
  const refresh = h("button", { type: "button" }, "Refresh");
  const count = h("p", { id: "conversations-count", class: "muted count" });
  const errBox = h("p", { class: "error", role: "alert", hidden: true });
  const el = h("section", { class: "view", dataset: { view: "conversations" }, "aria-labelledby": "conv-title" },
    h("div", { class: "view-head" }, h("h1", { id: "conv-title" }, "Conversations"), count, refresh),
    waiting, errBox, table.el);
  let gone = false;
  let timer = 0;

  function load() {
    clearTimeout(timer);
    timer = 0;
    call("conversation.list").then((list) => {
      if (gone) return;
      waiting.hidden = true;
      errBox.hidden = true;
      list = (list || []).slice().sort((x, y) => y.created_at - x.created_at);
      for (const id of [...table.rows.keys()]) if (!list.some((c) => c.id === id)) table.remove(id);
      for (const c of list) table.upsert(c.id, c);
      table.order(list.map((c) => c.id));
      setText(count, list.length === 1 ? "1 conversation" : `${list.length} conversations`);
    }, (e) => {
      if (gone) return;
      waiting.hidden = true;
      showError(errBox, e);
    });
  }
  refresh.addEventListener("click", load);
  load();
  return {
    el,
    // A flight asked or ended posted a message somewhere: read the counts again (at
    // most twice a second; the fleet watch does not carry messages).
    update(d) {
      if (d.all || !d.flights.size || timer) return;
      timer = setTimeout(load, 500);
    },
    destroy() {
      gone = true;
      clearTimeout(timer);
    },
  };
}

/** A message; `answered` is the message it replies to when the page has it. */
function messageItem(m, answered, jump) {
  const meta = m.meta || {};
  let reply = null;
  if (m.reply_to) {
    reply = h("a", {
      href: location.hash, class: "reply-link", dataset: { replyTo: m.reply_to },
      title: "Go to the message this answers",
      onclick: (e) => {
        e.preventDefault();
        jump(m.reply_to);
      },
    }, "↩ ", answered ? [h("span", { class: "author" }, answered.author), ": ", firstLine(answered.body, 100)]
      : "an earlier message");
  }
  return h("li", { class: "message", tabindex: "-1", dataset: { message: m.id, class: m.class || "agent" } },
    h("div", { class: "message-head" },
      h("span", { class: "author" }, m.author), " ",
      m.class && m.class !== "agent" ? [h("span", { class: "tag" }, m.class), " "] : null,
      timeEl(m.created_at), " ", muted("#" + m.index),
      meta.flight ? [" · flight ", flightLink(meta.flight)] : null),
    reply ? h("div", { class: "reply-to" }, reply) : null,
    // A message is Markdown as people and agents write it, rendered safely (lib/markdown.js).
    h("div", { class: "body" }, markdown(m.body)));
}

/** Why a mention asked nobody (`skipped[].reason` of a post's answer). */
const SKIP_REASONS = {
  author: "it wrote the message",
  code: "the mention is inside code",
  quote: "the mention is on a quoted line",
  repeated: "the message this answers mentioned it already",
};

function conversationView(id) {
  const msgs = new Map(); // id -> {index, li, message}
  const list = h("ol", { id: "messages", class: "messages" });
  const header = h("div", { class: "meta" });
  const countEl = h("span", { id: "conversation-count" });
  const working = h("ul", { id: "working", class: "working", "aria-live": "polite" });
  const status = h("p", { class: "muted" }, "Connecting…");
  const errBox = h("p", { class: "error", role: "alert", hidden: true });
  const body = h("textarea", { id: "compose-body", rows: "3", required: true, placeholder: "Write a message; @agent asks that agent" });
  const author = h("span", { class: "login-name" }, login.name || "…");
  const send = h("button", { type: "submit", dataset: { action: "post" } }, "Post");
  const result = h("div", { class: "post-result", "aria-live": "polite" });
  const form = h("form", { class: "compose", dataset: { action: "post" } },
    h("label", { for: "compose-body" }, "Message as ", author), body, h("div", { class: "row" }, send, muted(" Ctrl+Enter posts")), result);
  // Ask an agent picked by name: the task and the reply are messages of this
  // conversation; the working line shows progress, the reply arrives as a message.
  const agentNames = () => [...fleet.agents.keys()].sort((x, y) => x.localeCompare(y));
  const composer = askComposer({ agentNames, conversation: id, stream: false, onAsked: () => paintWorking() });

  const el = h("section", { class: "view conversation-view", dataset: { view: "conversation", conversation: id } },
    h("div", { class: "view-head" }, h("h1", null, "Conversation ", h("span", { class: "mono" }, id))),
    header, status, errBox, list, working,
    h("section", { class: "ask-agent", "aria-label": "Ask an agent" }, h("h2", null, "Ask an agent"), composer.el),
    h("section", { "aria-label": "Post a message" }, h("h2", null, "Post a message"), form));

  let conversation = null;
  let maxIndex = -1;

  function paintHeader() {
    const c = conversation || {};
    // The count: the conversation's as last told, or more when messages came since.
    const n = Math.max(c.message_count ?? 0, maxIndex + 1);
    setText(countEl, num(n));
    countEl.dataset.count = String(n);
    header.replaceChildren(defs([
      ["Kind", c.kind],
      ["Title", c.title],
      ["Participants", (c.participants || []).join(", ")],
      ["Messages", countEl],
    ]));
  }

  function jump(messageId) {
    const m = msgs.get(messageId);
    if (!m) return;
    m.li.scrollIntoView({ block: "center" });
    m.li.focus({ preventScroll: true });
  }

  function add(m) {
    if (msgs.has(m.id)) return;
    const li = messageItem(m, m.reply_to ? msgs.get(m.reply_to)?.message : null, jump);
    msgs.set(m.id, { index: m.index, li, message: m });
    if (m.index > maxIndex) maxIndex = m.index;
    // Messages come in index order; one older than the last goes in its place.
    let before = null;
    for (let node = list.lastElementChild; node; node = node.previousElementSibling) {
      const other = msgs.get(node.dataset.message);
      if (!other || other.index < m.index) break;
      before = node;
    }
    list.insertBefore(li, before);
    if (m.meta?.flight) paintWorking();
  }

  // Working lines ------------------------------------------------------------------

  const lines = new Map(); // flight id -> li
  /** The flights of this conversation to show as working: live ones, and ended ones
   * whose reply message has not reached the page yet. */
  function workingFlights() {
    // A flight's reply: the message its agent posted in reply, naming the flight (the
    // request message names the flight too, but is no reply).
    const replied = new Set();
    for (const { message: m } of msgs.values()) if (m.meta?.flight && m.reply_to) replied.add(m.meta.flight + "\n" + m.author);
    const out = [];
    for (const f of fleet.seen.values()) {
      if (f.conversation !== id || replied.has(f.id + "\n" + f.agent)) continue;
      if (isLive(f.state) || (f.reply_message && !msgs.has(f.reply_message))) out.push(f);
    }
    return out.sort((x, y) => x.created_at - y.created_at);
  }

  function paintWorking() {
    const show = workingFlights();
    const keep = new Set(show.map((f) => f.id));
    for (const [fid, li] of lines) {
      if (!keep.has(fid)) {
        li.remove();
        lines.delete(fid);
      }
    }
    for (const f of show) {
      let li = lines.get(f.id);
      if (!li) {
        li = h("li", { class: "working", dataset: { flight: f.id } });
        lines.set(f.id, li);
        working.append(li);
      }
      li.dataset.state = f.state;
      // A note that is the latest news (a retry, a stall) in plain words, else progress.
      const latest = noteNow(f) || f.summary || "";
      const doing = f.state === "queued" ? " is asked (queued)…" : f.state === "waiting" ? " is waiting for an approval…" : " is working…";
      li.replaceChildren();
      put(li, [h("span", { class: "spinner", "aria-hidden": "true" }), h("span", { class: "author" }, f.agent), doing,
        latest ? [" ", h("span", { class: "latest" }, firstLine(latest, 160))] : null, " ", flightLink(f.id)]);
    }
  }

  const stream = openStream(withQuery(methodPath("watch"), { conversation: id, limit: 200 }), {
    snapshot(s) {
      status.hidden = true;
      errBox.hidden = true;
      conversation = s.conversation || {};
      const atEnd = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
      for (const m of s.messages || []) add(m);
      paintHeader();
      paintWorking();
      if (atEnd && msgs.size) list.lastElementChild.scrollIntoView({ block: "end" });
    },
    message_posted(e) {
      const atEnd = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
      // The message's index says its conversation's count (a broker before 2026-11-29's
      // event carries the conversation after it instead).
      if (e.conversation) conversation = e.conversation;
      else if (conversation) {
        conversation.message_count = Math.max(conversation.message_count ?? 0, e.message.index + 1);
      }
      add(e.message);
      paintHeader();
      if (atEnd) list.lastElementChild.scrollIntoView({ block: "end" });
    },
  }, {
    onError() {
      if (msgs.size === 0) {
        call("conversation.read", [id], { query: { limit: 1 } }).catch((e) => {
          status.hidden = true;
          showError(errBox, e);
          if (e.status === 404) stream.close();
        });
      }
    },
  });

  submitOnCtrlEnter(body, form);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const textValue = body.value;
    if (!textValue.trim()) return;
    send.disabled = true;
    result.replaceChildren();
    try {
      const got = await call("message.post", [], {
        body: { conversation: id, author: login.name || "operator", body: textValue },
      });
      body.value = "";
      if (got && got.message) {
        add(got.message);
        paintHeader();
      }
      const flights = got?.flights || [];
      if (flights.length) {
        result.append(h("p", null, "Asked: ",
          flights.map((f, i) => [i ? ", " : "", flightLink(f.id), " (", f.agent, ")"])));
      }
      for (const r of got?.refused || []) {
        result.append(h("p", { class: "error" }, `@${r.agent} was not asked: `, r.error?.message || "", ` (${r.error?.code || "?"})`));
      }
      for (const s of got?.skipped || []) {
        result.append(h("p", null, `@${s.name} was not asked: `, SKIP_REASONS[s.reason] || s.reason));
      }
      for (const name of got?.unknown || []) {
        result.append(h("p", { class: "error" }, `@${name} is not an agent (see Agents)`));
      }
    } catch (err) {
      result.append(errorNode(err));
    } finally {
      send.disabled = false;
    }
  });

  return {
    el,
    update(d) {
      if (d.all || d.agents.size) composer.refreshAgents();
      if (d.all || d.flights.size) paintWorking();
    },
    destroy() {
      stream.close();
      composer.destroy();
    },
  };
}

export {
  conversationsView,
  conversationView,
};
