// The rules view: remembered decisions, removable.

import { h, inert, muted, setText, showError, text, timeEl } from "/lib/dom.js";
import { call } from "/lib/api.js";
import { KeyedTable } from "/lib/table.js";
import { ruleScopeText } from "/lib/labels.js";

// Rules: remembered decisions ------------------------------------------------------

function rulesView() {
  const errBox = h("p", { class: "error", role: "alert", hidden: true });
  const empty = h("p", { class: "muted empty", hidden: true },
    "No remembered decisions. “Accept and remember” on an approval makes one.");
  const count = h("p", { class: "muted count" });
  let rules = new Map();
  const table = new KeyedTable({
    id: "rules",
    caption: "Remembered decisions",
    keyAttr: "rule",
    columns: [
      { cls: "id mono", head: "Rule", rowHeader: true, value: (r) => r.id },
      { cls: "decision", head: "Decision", value: (r) => r.decision },
      { cls: "kind", head: "Kind", value: (r) => r.kind },
      { cls: "pattern mono", head: "Pattern", value: (r) => r.pattern },
      { cls: "scope", head: "Scope", value: ruleScopeText },
      {
        cls: "origin", head: "Origin", value: (r) => r.origin || "",
        paint: (td, r) => td.replaceChildren(r.origin ? h("span", { class: "mono" }, r.origin) : muted("—"),
          text(" by " + r.created_by)),
      },
      { cls: "num matched", head: "Matched", value: (r) => String(r.matched ?? 0) },
      {
        cls: "when", head: "Last matched", value: (r) => String(r.last_matched_at || 0),
        paint: (td, r) => td.replaceChildren(timeEl(r.last_matched_at)),
      },
      {
        cls: "remove", head: "", value: (r) => r.id,
        paint: (td, r) => td.replaceChildren(h("button", {
          type: "button", class: "danger remove-rule", "aria-label": inert(`Remove rule ${r.id}`),
          onclick: (e) => remove(r.id, e.currentTarget),
        }, "Remove")),
      },
    ],
  });
  const el = h("section", { class: "view rules-view", "aria-labelledby": "rules-title" },
    h("div", { class: "view-head" }, h("h1", { id: "rules-title" }, "Rules"), count),
    h("p", { class: "muted" }, "Decisions remembered from approvals: each decides the same request " +
      "(the same command, word for word) within its scope, recorded as decided by rule:ID."),
    errBox, empty, table.el);
  let gone = false;

  function render(list) {
    rules = new Map(list.map((r) => [r.id, r]));
    for (const id of [...table.rows.keys()]) if (!rules.has(id)) table.remove(id);
    for (const r of list) table.upsert(r.id, r);
    table.order(list.map((r) => r.id));
    empty.hidden = list.length > 0;
    setText(count, `${list.length} rules`);
  }

  function refetch() {
    call("rule.list").then((list) => {
      if (gone) return;
      errBox.hidden = true;
      render(list || []);
    }, (e) => { if (!gone) showError(errBox, e); });
  }

  async function remove(id, button) {
    button.disabled = true;
    errBox.hidden = true;
    try {
      await call("rule.remove", [id]);
      rules.delete(id);
      render([...rules.values()]);
    } catch (e) {
      showError(errBox, e);
      button.disabled = false;
    }
  }

  refetch();
  return {
    el,
    // A decision (by a person or a rule) may have made or matched a rule.
    update(d) {
      if (!d.all && d.approvals) refetch();
    },
    destroy: () => { gone = true; },
  };
}

export {
  rulesView,
};
