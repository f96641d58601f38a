// The rules view: remembered decisions and agents' budgets, live and removable.
//
// Rules are asked of `rule.list` again when the fleet watch says one was added or
// removed (`rule_added`, `rule_removed`: a decision remembered on the page, the CLI or
// the bus) or an approval was decided (a rule may have matched it). Budgets come from
// the fleet's agents (an agent's `budget`, live with `agent_updated`); what each used
// today from `agent.budget`, asked again when a flight ends. Removing one is
// `agent.set` with an empty budget (as `relay agent set NAME --no-budget`).
//
// Hooks for tests: `[data-view="rules"]`; `#rules tr[data-rule]` with `.pattern`,
// `.scope`, `.matched`, `button[data-action="remove-rule"]`; `#budgets tr[data-agent]`
// with `.limits`, `.used`, `button[data-action="remove-budget"]`.

import { agentHref, h, inert, muted, num, setText, showError, text, timeEl, usd } from "/lib/dom.js";
import { call } from "/lib/api.js";
import { fleet } from "/lib/fleet.js";
import { KeyedTable } from "/lib/table.js";
import { ruleScopeText } from "/lib/labels.js";

// Rules: remembered decisions ------------------------------------------------------

function removeButton(action, label, onclick) {
  return h("button", { type: "button", class: "danger " + action, dataset: { action }, "aria-label": inert(label), onclick }, "Remove");
}

function rulesSection(errBox) {
  const empty = h("p", { class: "muted empty", hidden: true },
    "No remembered decisions. “Accept and remember” on an approval makes one.");
  const count = h("span", { class: "muted count" });
  let rules = new Map();
  let gone = false;
  let asked = 0;
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
        cls: "origin", head: "Origin", value: (r) => (r.origin || "") + " " + r.created_by,
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
        paint: (td, r) => td.replaceChildren(removeButton("remove-rule", `Remove rule ${r.id}`,
          (e) => remove(r.id, e.currentTarget))),
      },
    ],
  });
  const el = h("section", { class: "rules-section", "aria-labelledby": "rules-subtitle" },
    h("h2", { id: "rules-subtitle" }, "Remembered decisions ", count),
    h("p", { class: "muted" }, "Decisions remembered from approvals: each decides the same request " +
      "(the same command, word for word, or with “*” for one plain argument) within its scope, " +
      "recorded as decided by rule:ID."),
    empty, h("div", { class: "table-box" }, table.el));

  function render(list) {
    rules = new Map(list.map((r) => [r.id, r]));
    for (const id of [...table.rows.keys()]) if (!rules.has(id)) table.remove(id);
    for (const r of list) table.upsert(r.id, r);
    table.order(list.map((r) => r.id));
    empty.hidden = list.length > 0;
    table.el.hidden = list.length === 0;
    setText(count, `(${list.length})`);
    el.dataset.count = String(list.length);
  }

  function refetch() {
    const mine = ++asked;
    call("rule.list").then((list) => {
      if (gone || mine !== asked) return;
      render(list || []);
    }, (e) => { if (!gone) showError(errBox, e); });
  }

  async function remove(id, button) {
    button.disabled = true;
    errBox.hidden = true;
    try {
      await call("rule.remove", [id]);
      asked++; // an answer asked before the removal would bring it back
      rules.delete(id);
      render([...rules.values()]);
    } catch (e) {
      showError(errBox, e);
      button.disabled = false;
    }
  }

  return { el, refetch, destroy: () => { gone = true; } };
}

// Budgets --------------------------------------------------------------------------

/** A budget's limits on one line, as `relay agent show` says them. */
function limitsText(b) {
  const parts = [];
  if (b.tokens_per_day != null) parts.push(`${num(b.tokens_per_day)} tokens/day`);
  if (b.cost_micro_usd_per_day != null) parts.push(`${usd(b.cost_micro_usd_per_day)}/day`);
  if (b.tokens_per_tree != null) parts.push(`${num(b.tokens_per_tree)} tokens/tree`);
  if (b.cost_micro_usd_per_tree != null) parts.push(`${usd(b.cost_micro_usd_per_tree)}/tree`);
  return parts.join(", ") + (b.on_exceed === "interrupt" ? "; a turn past it is interrupted" : "; a turn past it finishes");
}

/** Today's use against the daily limits: "1,234 of 200,000 tokens (1%), $0.01 of $5.00". */
function usedText(b, today) {
  if (!today) return "…";
  const pct = (used, limit) => (limit > 0 ? ` (${Math.floor((used * 100) / limit)}%)` : "");
  const parts = [];
  if (b.tokens_per_day != null) parts.push(`${num(today.tokens || 0)} of ${num(b.tokens_per_day)} tokens${pct(today.tokens || 0, b.tokens_per_day)}`);
  if (b.cost_micro_usd_per_day != null) parts.push(`${usd(today.cost_micro_usd || 0)} of ${usd(b.cost_micro_usd_per_day)}${pct(today.cost_micro_usd || 0, b.cost_micro_usd_per_day)}`);
  if (!parts.length) parts.push(`${num(today.tokens || 0)} tokens today`);
  return parts.join(", ");
}

const hasBudget = (a) => a.budget && ["tokens_per_day", "cost_micro_usd_per_day", "tokens_per_tree", "cost_micro_usd_per_tree"]
  .some((k) => a.budget[k] != null);

function budgetsSection(errBox) {
  const used = new Map(); // agent -> today's totals
  let gone = false;
  const empty = h("p", { class: "muted empty" }, "No agent has a budget. ",
    h("code", null, "relay agent set NAME --budget 200000/day"), " sets one.");
  const count = h("span", { class: "muted count" });
  const table = new KeyedTable({
    id: "budgets",
    caption: "Budgets",
    keyAttr: "agent",
    columns: [
      {
        cls: "name", head: "Agent", rowHeader: true, value: (a) => a.name,
        paint: (td, a) => td.replaceChildren(h("a", { href: agentHref(a.name) }, a.name)),
      },
      { cls: "limits", head: "Limits", value: (a) => limitsText(a.budget) },
      { cls: "used", head: "Used today (UTC)", value: (a) => usedText(a.budget, used.get(a.name)) },
      {
        cls: "remove", head: "", value: (a) => a.name,
        paint: (td, a) => td.replaceChildren(removeButton("remove-budget", `Remove the budget of ${a.name}`,
          (e) => remove(a.name, e.currentTarget))),
      },
    ],
  });
  const el = h("section", { class: "budgets-section", "aria-labelledby": "budgets-title" },
    h("h2", { id: "budgets-title" }, "Budgets ", count),
    h("p", { class: "muted" }, "An agent's limits per UTC day and per flight tree: a flight that would start " +
      "past one is refused (budget_exceeded)."),
    empty, h("div", { class: "table-box" }, table.el));

  function fetchUsed(names) {
    for (const name of names) {
      call("agent.budget", [name]).then((s) => {
        if (gone) return;
        used.set(name, s?.today || {});
        const a = fleet.agents.get(name);
        if (a && table.has(name)) table.upsert(name, a);
      }, () => {
        // The limits still show; the use is unknown.
      });
    }
  }

  function render(fetchAllUsed) {
    const list = [...fleet.agents.values()].filter(hasBudget).sort((x, y) => x.name.localeCompare(y.name));
    const keys = new Set(list.map((a) => a.name));
    for (const name of [...table.rows.keys()]) if (!keys.has(name)) table.remove(name);
    const fresh = list.filter((a) => !table.has(a.name)).map((a) => a.name);
    for (const a of list) table.upsert(a.name, a);
    table.order(list.map((a) => a.name));
    empty.hidden = list.length > 0;
    table.el.hidden = list.length === 0;
    setText(count, `(${list.length})`);
    fetchUsed(fetchAllUsed ? list.map((a) => a.name) : fresh);
  }

  async function remove(name, button) {
    button.disabled = true;
    errBox.hidden = true;
    try {
      const agent = await call("agent.set", [name], { body: { budget: {} } });
      // The watch's agent_updated says it too; the answer is here first.
      if (agent && agent.name && !gone) {
        fleet.agents.set(agent.name, agent);
        render(false);
      }
    } catch (e) {
      showError(errBox, e);
      button.disabled = false;
    }
  }

  return { el, render, destroy: () => { gone = true; } };
}

// The view -------------------------------------------------------------------------

function rulesView() {
  const errBox = h("p", { class: "error", role: "alert", hidden: true });
  const rules = rulesSection(errBox);
  const budgets = budgetsSection(errBox);
  const el = h("section", { class: "view rules-view", dataset: { view: "rules" }, "aria-labelledby": "rules-title" },
    h("div", { class: "view-head" }, h("h1", { id: "rules-title" }, "Rules and budgets")),
    errBox, rules.el, budgets.el);
  let snapshot = fleet.snapshots;
  rules.refetch();
  return {
    el,
    update(d) {
      // A rule added or removed anywhere; a decision (by a person or a rule) may have
      // made or matched one.
      // A snapshot after a reconnect: what changed meanwhile.
      if (d.rules || d.approvals || snapshot !== fleet.snapshots) {
        snapshot = fleet.snapshots;
        if (!d.all || fleet.snapshots > 1) rules.refetch();
      }
      if (fleet.ready && (d.all || d.agents.size || d.ended)) budgets.render(d.all || d.ended);
    },
    destroy: () => {
      rules.destroy();
      budgets.destroy();
    },
  };
}

export {
  rulesView,
};
