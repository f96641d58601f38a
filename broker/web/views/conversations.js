// The conversations list and one conversation, live, with a composer.

import { methodPath } from "/api.gen.js";
import { defs, enc, errorNode, flightLink, h, loading, muted, num, showError, timeEl } from "/lib/dom.js";
import { call, login, openStream, withQuery } from "/lib/api.js";
import { KeyedTable } from "/lib/table.js";

// Conversations --------------------------------------------------------------------

function conversationsView() {
  const table = new KeyedTable({
    id: "conversations",
    caption: "Conversations",
    keyAttr: "conversation",
    columns: [
      {
        cls: "id", head: "Conversation", rowHeader: true, value: (c) => c.id,
        paint: (td, c) => td.replaceChildren(h("a", { href: "#/conversation/" + enc(c.id), class: "mono" }, c.id)),
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
  const errBox = h("p", { class: "error", role: "alert", hidden: true });
  const el = h("section", { class: "view", "aria-labelledby": "conv-title" },
    h("div", { class: "view-head" }, h("h1", { id: "conv-title" }, "Conversations"), refresh),
    waiting, errBox, table.el);

  function load() {
    call("conversation.list").then((list) => {
      waiting.hidden = true;
      errBox.hidden = true;
      list = (list || []).slice().sort((x, y) => y.created_at - x.created_at);
      for (const c of list) table.upsert(c.id, c);
      table.order(list.map((c) => c.id));
    }, (e) => {
      waiting.hidden = true;
      showError(errBox, e);
    });
  }
  refresh.addEventListener("click", load);
  load();
  return { el };
}

function messageItem(m) {
  const meta = m.meta || {};
  return h("li", { class: "message", dataset: { message: m.id, class: m.class || "agent" } },
    h("div", { class: "message-head" },
      h("span", { class: "author" }, m.author), " ",
      m.class && m.class !== "agent" ? [h("span", { class: "tag" }, m.class), " "] : null,
      timeEl(m.created_at), " ", muted("#" + m.index),
      meta.flight ? [" · flight ", flightLink(meta.flight)] : null,
      m.reply_to ? [" · reply to ", muted(m.reply_to)] : null),
    h("pre", { class: "body" }, m.body));
}

/** Why a mention asked nobody (`skipped[].reason` of a post's answer). */
const SKIP_REASONS = {
  author: "it wrote the message",
  code: "the mention is inside code",
  quote: "the mention is on a quoted line",
  repeated: "the message this answers mentioned it already",
};

function conversationView(id) {
  const msgs = new Map(); // id -> {index, li}
  const list = h("ol", { id: "messages", class: "messages" });
  const header = h("div", { class: "meta" });
  const status = h("p", { class: "muted" }, "Connecting…");
  const errBox = h("p", { class: "error", role: "alert", hidden: true });
  const body = h("textarea", { id: "compose-body", rows: "3", required: true, placeholder: "Write a message; @agent asks that agent" });
  const author = h("span", { class: "login-name" }, login.name || "…");
  const send = h("button", { type: "submit" }, "Post");
  const result = h("div", { class: "post-result", "aria-live": "polite" });
  const form = h("form", { class: "compose" },
    h("label", { for: "compose-body" }, "Message as ", author), body, h("div", { class: "row" }, send, muted(" Ctrl+Enter posts")), result);

  const el = h("section", { class: "view conversation-view", dataset: { conversation: id } },
    h("div", { class: "view-head" }, h("h1", null, "Conversation ", h("span", { class: "mono" }, id))),
    header, status, errBox, list, form);

  function add(m) {
    if (msgs.has(m.id)) return;
    const li = messageItem(m);
    msgs.set(m.id, { index: m.index, li });
    // Messages come in index order; one older than the last goes in its place.
    let before = null;
    for (let node = list.lastElementChild; node; node = node.previousElementSibling) {
      const other = msgs.get(node.dataset.message);
      if (!other || other.index < m.index) break;
      before = node;
    }
    list.insertBefore(li, before);
  }

  const stream = openStream(withQuery(methodPath("watch"), { conversation: id, limit: 200 }), {
    snapshot(s) {
      status.hidden = true;
      errBox.hidden = true;
      const c = s.conversation || {};
      header.replaceChildren(defs([
        ["Kind", c.kind],
        ["Title", c.title],
        ["Participants", (c.participants || []).join(", ")],
        ["Messages", c.message_count != null ? num(c.message_count) : null],
      ]));
      const atEnd = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
      for (const m of s.messages || []) add(m);
      if (atEnd && msgs.size) list.lastElementChild.scrollIntoView({ block: "end" });
    },
    message_posted(e) {
      const atEnd = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
      add(e.message);
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

  body.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      form.requestSubmit();
    }
  });
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
      if (got && got.message) add(got.message);
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

  return { el, destroy: () => stream.close() };
}

export {
  conversationsView,
  conversationView,
};
