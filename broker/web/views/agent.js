// One agent's page (`#/agent/NAME`): what it is and does, live from the fleet watch; its
// usage today and budget (and a form to set or clear it), its rules, its recent
// flights; wake, remove (after a confirm step) and fork; and a composer whose replies
// stream in place (views/composer.js).
//
// Test hooks: `section[data-view="agent"][data-agent=NAME]`; `#agent-state`,
// `#agent-current` (the current flight), `#agent-queue`, `#agent-usage` (today's
// tokens), `#agent-budget` (its limits); forms and buttons by `data-action`: `wake`,
// `remove` then `confirm-remove` (with `input.remove-force`), `set-budget` (with
// `input.budget-limits`, `select.budget-on`), `clear-budget`, `fork` (with
// `input.fork-name`, `select.fork-at`), `remove-rule`; `#agent-rules` and
// `#agent-flights` (rows `tr[data-flight]`), `.action-result` for what an action did.

import { ON_BUDGET } from "/api.gen.js";
import {
  agentHref, costText, defs, errorNode, firstLine, flightLink, h, isLive, link, muted, num,
  replayAgentHref, setText, showError, stateTag, text, timeEl, usd,
} from "/lib/dom.js";
import { call } from "/lib/api.js";
import { agentState, askedOf, fetchAsked, fleet } from "/lib/fleet.js";
import { branchLabel, programLabel, ruleScopeText } from "/lib/labels.js";
import { askComposer } from "/views/composer.js";

/**
 * The task of flight `f` if known (`null` while it is asked, or when the broker would not
 * say); else asks for it (lib/fleet.js `fetchAsked`) and calls `then()` once answered.
 */
function taskOf(f, then) {
  const asked = askedOf(f.id);
  if (asked) return asked.unknown ? null : asked.task;
  fetchAsked([f.id], then);
  return null;
}

/** The current flight (the oldest not queued) and the queue of agent `name`. */
function agentFlights(name) {
  let current = null;
  let queued = 0;
  for (const f of fleet.live.values()) {
    if (f.agent !== name) continue;
    if (f.state === "queued") queued++;
    else if (!current || f.created_at < current.created_at) current = f;
  }
  return { current, queued };
}

// Budgets --------------------------------------------------------------------------

/** Millionths of a dollar from `5`, `2.50`, `.5` (at most 6 decimals), or null. */
function usdMicros(s) {
  const m = /^(\d*)(?:\.(\d{0,6}))?$/.exec(s);
  if (!m || (m[1] === "" && (m[2] ?? "") === "")) return null;
  const whole = m[1] === "" ? 0 : Number(m[1]);
  const micros = whole * 1e6 + Number((m[2] || "").padEnd(6, "0"));
  return Number.isSafeInteger(micros) ? micros : null;
}

/**
 * A budget from limits as `relay agent set --budget` takes them, separated by spaces or
 * commas (`200000/day $5/day 50k/tree`), the same rules as `Budget::set_limit`; throws
 * with what is wrong.
 */
function parseBudget(textValue, onExceed) {
  const budget = { on_exceed: onExceed };
  const limits = textValue.split(/[\s,]+/).filter(Boolean);
  if (!limits.length) throw new Error("give at least one limit (like 200000/day or $5/day), or clear the budget");
  for (const limit of limits) {
    const bad = (why) => new Error(`budget "${limit}": ${why} (write TOKENS/day, $USD/day, TOKENS/tree or $USD/tree, like 200000/day or $5/day)`);
    const at = limit.lastIndexOf("/");
    if (at < 0) throw bad("no period");
    const per = limit.slice(at + 1);
    const perDay = per === "day" || per === "d";
    if (!perDay && per !== "tree") throw bad("the period must be `day` or `tree`");
    const amount = limit.slice(0, at);
    let key;
    let value;
    if (amount.startsWith("$")) {
      value = usdMicros(amount.slice(1));
      if (value == null) throw bad("not an amount of dollars");
      key = perDay ? "cost_micro_usd_per_day" : "cost_micro_usd_per_tree";
    } else {
      const a = amount.toLowerCase().replaceAll("_", "");
      const mult = a.endsWith("k") ? 1e3 : a.endsWith("m") ? 1e6 : 1;
      const digits = mult === 1 ? a : a.slice(0, -1);
      if (!/^\d+$/.test(digits)) throw bad("not a whole number of tokens");
      value = Number(digits) * mult;
      if (!Number.isSafeInteger(value)) throw bad("not a whole number of tokens");
      key = perDay ? "tokens_per_day" : "tokens_per_tree";
    }
    // Two limits on the same thing: the last would silently win.
    if (budget[key] != null) throw new Error(`two limits on the same thing ("${limit}" and an earlier one): give one`);
    budget[key] = value;
  }
  return budget;
}

/** "200,000 tokens/day, $5.000000/day; a turn past it finishes" (`budget_text` of the CLI). */
function budgetText(b) {
  const limits = [];
  if (b.tokens_per_day != null) limits.push(`${num(b.tokens_per_day)} tokens/day`);
  if (b.cost_micro_usd_per_day != null) limits.push(`${usd(b.cost_micro_usd_per_day)}/day`);
  if (b.tokens_per_tree != null) limits.push(`${num(b.tokens_per_tree)} tokens/tree`);
  if (b.cost_micro_usd_per_tree != null) limits.push(`${usd(b.cost_micro_usd_per_tree)}/tree`);
  if (!limits.length) return "";
  const past = b.on_exceed === "interrupt" ? "a turn past it is interrupted" : "a turn past it finishes";
  return limits.join(", ") + "; " + past;
}

/** The limits of `b` as the form's text (`200000/day $5/day`). */
function budgetInput(b) {
  if (!b) return "";
  const dollars = (m) => "$" + (m / 1e6).toString();
  return [
    b.tokens_per_day != null ? `${b.tokens_per_day}/day` : null,
    b.cost_micro_usd_per_day != null ? `${dollars(b.cost_micro_usd_per_day)}/day` : null,
    b.tokens_per_tree != null ? `${b.tokens_per_tree}/tree` : null,
    b.cost_micro_usd_per_tree != null ? `${dollars(b.cost_micro_usd_per_tree)}/tree` : null,
  ].filter(Boolean).join(" ");
}

/** Today's use as one line: tokens, cost, flights (`relay agent show`'s `today`). */
function todayText(t) {
  const cost = !t.flights_without_cost ? usd(t.cost_micro_usd)
    : t.flights_without_cost >= t.flights ? "cost unknown" : costText(t);
  return `${num(t.tokens)} tokens (${num(t.input_tokens)} input, ${num(t.output_tokens)} output), ${cost}, ` +
    (t.flights === 1 ? "1 flight" : `${num(t.flights)} flights`);
}

/** Midnight UTC of today, in ms: the start of the budget's day. */
function utcToday() {
  const now = Date.now();
  return now - (now % 86400000);
}

// The page -------------------------------------------------------------------------

function agentView(name) {
  const stateEl = h("span", { id: "agent-state" });
  const meta = h("div", { class: "meta" });
  const workEl = h("div", { class: "meta agent-work" });
  const status = h("p", { class: "muted" }, "Loading agent…");
  const gone = h("p", { class: "error", role: "alert", hidden: true });
  const actionResult = h("div", { class: "action-result", "aria-live": "polite" });

  // Actions: wake, remove (confirm), fork.
  const wake = h("button", { type: "button", dataset: { action: "wake" } }, "Wake");
  const remove = h("button", { type: "button", class: "danger", dataset: { action: "remove" } }, "Remove…");
  const force = h("input", { type: "checkbox", id: "remove-force", class: "remove-force" });
  const confirmRemove = h("button", { type: "button", class: "danger", dataset: { action: "confirm-remove" } },
    "Remove " + name);
  const cancelRemove = h("button", { type: "button" }, "Keep it");
  const confirmBox = h("div", { class: "confirm-remove", role: "group", "aria-label": "Confirm removal", hidden: true },
    h("p", null, "Remove agent ", h("strong", null, name), "? Its session stops; its worktree is removed and its branch kept."),
    h("label", null, force, " Remove the worktree even with uncommitted work (committed on its branch first)"),
    h("div", { class: "row" }, confirmRemove, cancelRemove));
  const forkName = h("input", { type: "text", id: "fork-name", class: "fork-name", required: true, placeholder: name + "-2", autocomplete: "off" });
  const forkAt = h("select", { id: "fork-at", class: "fork-at" }, h("option", { value: "" }, "its last flight"));
  const forkForm = h("form", { class: "inline-form fork-form", dataset: { action: "fork" } },
    h("label", { for: "fork-name" }, "Fork as"), forkName,
    h("label", { for: "fork-at" }, "at"), forkAt,
    h("button", { type: "submit", dataset: { action: "fork" } }, "Fork"));
  const actions = h("section", { class: "agent-actions", "aria-label": "Actions" },
    h("div", { class: "row" }, wake, remove, link(replayAgentHref(name), "Replay")), confirmBox, forkForm, actionResult);

  // Usage and budget.
  const usageEl = h("p", { id: "agent-usage" }, muted("Loading usage…"));
  const budgetEl = h("p", { id: "agent-budget" }, muted("Loading budget…"));
  const limits = h("input", { type: "text", id: "budget-limits", class: "budget-limits", placeholder: "200000/day $5/day 50k/tree", autocomplete: "off" });
  const onBudget = h("select", { id: "budget-on", class: "budget-on" },
    ON_BUDGET.map((v) => h("option", { value: v }, v)));
  const clearBudget = h("button", { type: "button", dataset: { action: "clear-budget" } }, "Clear budget");
  const budgetResult = h("div", { class: "budget-result", "aria-live": "polite" });
  const budgetForm = h("form", { class: "inline-form budget-form", dataset: { action: "set-budget" } },
    h("label", { for: "budget-limits" }, "Limits"), limits,
    h("label", { for: "budget-on" }, "past a limit, a turn"), onBudget,
    h("button", { type: "submit", dataset: { action: "set-budget" } }, "Set budget"), clearBudget);

  // Rules and flights.
  const rulesEl = h("div", { id: "agent-rules" }, muted("Loading rules…"));
  const flightsEl = h("div", { id: "agent-flights" }, muted("Loading flights…"));

  const composer = askComposer({ agent: name, onAsked: () => loadFlights() });

  const el = h("section", { class: "view agent-view", dataset: { view: "agent", agent: name }, "aria-labelledby": "agent-title" },
    h("div", { class: "view-head" }, h("h1", { id: "agent-title" }, "Agent ", h("span", { class: "mono" }, name)), stateEl),
    status, gone, meta, workEl, actions,
    h("section", { "aria-labelledby": "agent-ask-title" }, h("h2", { id: "agent-ask-title" }, "Ask"), composer.el),
    h("section", { "aria-labelledby": "agent-usage-title" }, h("h2", { id: "agent-usage-title" }, "Usage today (UTC)"),
      usageEl, budgetEl, budgetForm, budgetResult),
    h("section", { "aria-labelledby": "agent-rules-title" }, h("h2", { id: "agent-rules-title" }, "Rules"), rulesEl),
    h("section", { "aria-labelledby": "agent-flights-title" }, h("h2", { id: "agent-flights-title" }, "Recent flights"), flightsEl));

  let destroyed = false;
  let agent = null;
  let paintedKey = "";

  function paintAgent() {
    const a = fleet.agents.get(name);
    if (!fleet.ready) return;
    status.hidden = true;
    if (!a) {
      agent = null;
      setText(gone, `No agent ${name} (removed, or never added).`);
      gone.hidden = false;
      stateEl.replaceChildren();
      el.dataset.state = "gone";
      return;
    }
    gone.hidden = true;
    agent = a;
    const state = agentState(a);
    el.dataset.state = state;
    stateEl.replaceChildren(stateTag(state));
    const w = a.worktree_state;
    const key = JSON.stringify([a.updated_at, state, a.session_id, a.thread_id, w, a.program, a.state_reason, a.note]);
    if (key === paintedKey) return;
    paintedKey = key;
    meta.replaceChildren(defs([
      ["Harness", [a.harness, a.program ? [" ", muted(programLabel(a.program))] : null]],
      ["State", [stateTag(state), a.state_reason ? [" ", h("span", { class: "reason" }, a.state_reason)] : null]],
      ["Session", a.session_id || a.thread_id ? h("span", { class: "mono", id: "agent-session" }, a.session_id || a.thread_id) : muted("none yet")],
      ["Working dir", h("span", { class: "mono" }, a.cwd)],
      ["Model", a.model || null],
      ["Node", a.node || null],
      ["Wake", a.wake],
      // Its worktree's branch, how far ahead of and behind its base (`relay agent add --worktree`).
      ["Worktree", w
        ? h("span", { id: "agent-branch" }, h("span", { class: "mono" }, branchLabel(a)), muted(` from ${w.base} · ${w.ahead} ahead, ${w.behind} behind · `), h("span", { class: "mono" }, w.path))
        : a.worktree ? muted("not made yet (at its first session)") : null],
      ["Note", a.note ? [h("span", { class: "note" }, firstLine(a.note.text)), " ", timeEl(a.note.at)] : null],
      ["Added", timeEl(a.created_at)],
    ]));
  }

  function paintWork() {
    const { current, queued } = agentFlights(name);
    const task = current ? taskOf(current, () => !destroyed && paintWork()) : null;
    workEl.replaceChildren(defs([
      ["Current flight", h("span", { id: "agent-current" }, current
        ? [flightLink(current.id), " ", stateTag(current.state), " ",
          task != null ? h("span", { class: "task-line" }, firstLine(task)) : null,
          current.summary ? [" ", muted("· " + firstLine(current.summary, 100))] : null]
        : muted("none"))],
      ["Queue", h("span", { id: "agent-queue" }, queued ? `${queued} waiting` : "empty")],
    ]));
  }

  // Usage and budget ---------------------------------------------------------------

  function loadUsage() {
    call("agent.budget", [name]).then((s) => {
      if (destroyed) return;
      const b = s.budget && budgetText(s.budget);
      budgetEl.replaceChildren(b ? text("Budget: " + b) : muted("No budget."));
      budgetEl.dataset.budget = b ? "set" : "none";
      if (b && document.activeElement !== limits) {
        limits.value = budgetInput(s.budget);
        onBudget.value = s.budget.on_exceed || "finish";
      }
      usageEl.dataset.tokens = String(s.today?.tokens ?? 0);
    }, (e) => { if (!destroyed) budgetEl.replaceChildren(errorNode(e)); });
    // The usage report by day for this agent, since today's start (UTC).
    call("usage", [], { query: { by: "day", agent: name, since: utcToday() } }).then((r) => {
      if (destroyed) return;
      const t = r?.total || { tokens: 0, flights: 0, input_tokens: 0, output_tokens: 0, cost_micro_usd: 0 };
      usageEl.replaceChildren(text(todayText(t)));
      usageEl.dataset.tokens = String(t.tokens ?? 0);
    }, (e) => { if (!destroyed) usageEl.replaceChildren(errorNode(e)); });
  }

  async function setBudget(budget, button) {
    button.disabled = true;
    budgetResult.replaceChildren();
    try {
      await call("agent.set", [name], { body: { budget } });
      budgetResult.append(h("p", { class: "ok" }, Object.keys(budget).length ? "Budget set." : "Budget cleared."));
      if (!Object.keys(budget).length) limits.value = "";
      loadUsage();
    } catch (err) {
      budgetResult.append(errorNode(err));
    } finally {
      button.disabled = false;
    }
  }
  budgetForm.addEventListener("submit", (e) => {
    e.preventDefault();
    let budget;
    try {
      budget = parseBudget(limits.value, onBudget.value);
    } catch (err) {
      budgetResult.replaceChildren(errorNode(err));
      return;
    }
    setBudget(budget, e.submitter || budgetForm.querySelector("button[type=submit]"));
  });
  // An empty budget removes it (`AgentSettings::budget`, `relay agent set --no-budget`).
  clearBudget.addEventListener("click", () => setBudget({}, clearBudget));

  // Rules ----------------------------------------------------------------------------

  function loadRules() {
    call("rule.list", [], { query: { agent: name } }).then((list) => {
      if (destroyed) return;
      list = list || [];
      if (!list.length) {
        rulesEl.replaceChildren(muted("No rules apply to this agent."));
        return;
      }
      rulesEl.replaceChildren(h("table", { class: "grid" },
        h("caption", { class: "sr-only" }, "Rules that apply to " + name),
        h("thead", null, h("tr", null, ["Rule", "Decision", "Pattern", "Scope", "Matched", ""].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", null, list.map((r) => h("tr", { dataset: { rule: r.id } },
          h("th", { scope: "row", class: "mono" }, r.id), h("td", null, r.decision),
          h("td", { class: "pattern mono" }, r.pattern), h("td", { class: "scope" }, ruleScopeText(r)),
          h("td", { class: "num" }, num(r.matched ?? 0)),
          h("td", null, h("button", {
            type: "button", class: "danger", dataset: { action: "remove-rule" },
            onclick: (e) => removeRule(r.id, e.currentTarget),
          }, "Remove")))))));
    }, (e) => { if (!destroyed) rulesEl.replaceChildren(errorNode(e)); });
  }

  async function removeRule(id, button) {
    button.disabled = true;
    try {
      await call("rule.remove", [id]);
      loadRules();
    } catch (err) {
      button.disabled = false;
      rulesEl.prepend(errorNode(err));
    }
  }

  // Recent flights -------------------------------------------------------------------

  let flightsTimer = 0;
  function loadFlights() {
    clearTimeout(flightsTimer);
    flightsTimer = 0;
    call("flight.list", [], { query: { agent: name, limit: 20 } }).then((list) => {
      if (destroyed) return;
      list = (list || []).slice().reverse(); // newest first
      const picked = forkAt.value;
      forkAt.replaceChildren(h("option", { value: "" }, "its last flight"),
        ...list.filter((f) => !isLive(f.state)).map((f) => h("option", { value: f.id }, f.id)));
      if ([...forkAt.options].some((o) => o.value === picked)) forkAt.value = picked;
      if (!list.length) {
        flightsEl.replaceChildren(muted("No flights yet."));
        return;
      }
      flightsEl.replaceChildren(h("table", { class: "grid" },
        h("caption", { class: "sr-only" }, "Recent flights of " + name),
        h("thead", null, h("tr", null, ["Flight", "State", "Task", "Asked"].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", null, list.map((f) => {
          const task = taskOf(f, () => !destroyed && scheduleFlights());
          return h("tr", { dataset: { flight: f.id, state: f.state } },
            h("th", { scope: "row" }, flightLink(f.id)), h("td", null, stateTag(f.state)),
            h("td", { class: "summary" }, task != null ? firstLine(task) : muted(firstLine(f.summary || ""))),
            h("td", { class: "when" }, timeEl(f.created_at)));
        }))));
    }, (e) => { if (!destroyed) flightsEl.replaceChildren(errorNode(e)); });
  }
  // Many updates a second while a flight streams: read the list at most every half second.
  function scheduleFlights() {
    if (!flightsTimer) flightsTimer = setTimeout(loadFlights, 500);
  }

  // Actions ----------------------------------------------------------------------------

  function said(...content) {
    actionResult.replaceChildren(h("p", { class: "ok" }, ...content));
  }
  async function act(button, fn) {
    button.disabled = true;
    actionResult.replaceChildren();
    try {
      await fn();
    } catch (err) {
      actionResult.replaceChildren(errorNode(err));
    } finally {
      button.disabled = false;
    }
  }
  wake.addEventListener("click", () => act(wake, async () => {
    const a = await call("agent.wake", [name]);
    said("Woken: ", stateTag(a?.state || "starting"));
  }));
  remove.addEventListener("click", () => {
    confirmBox.hidden = false;
    remove.hidden = true;
    cancelRemove.focus();
  });
  cancelRemove.addEventListener("click", () => {
    confirmBox.hidden = true;
    remove.hidden = false;
  });
  confirmRemove.addEventListener("click", () => act(confirmRemove, async () => {
    await call("agent.remove", [name], { query: force.checked ? { force: true } : undefined });
    confirmBox.hidden = true;
    said("Agent ", name, " removed. ", h("a", { href: "#/agents" }, "Back to the agents"));
  }));
  forkForm.addEventListener("submit", (e) => {
    e.preventDefault();
    const button = forkForm.querySelector("button[type=submit]");
    act(button, async () => {
      const body = { name: forkName.value.trim() };
      if (forkAt.value) body.at = forkAt.value;
      const added = await call("agent.fork", [name], { body });
      forkName.value = "";
      said("Forked as ", h("a", { href: agentHref(added.name) }, added.name),
        ...(added.warnings || []).map((w) => h("span", { class: "warning" }, " ", w)));
    });
  });

  loadUsage();
  loadRules();
  loadFlights();
  return {
    el,
    update(d) {
      if (d.all || d.agents.has(name)) {
        paintAgent();
        paintWork();
      }
      let mine = false;
      for (const id of d.flights) {
        const f = fleet.seen.get(id);
        if (f && f.agent === name) mine = true;
      }
      if (mine || d.all) {
        scheduleFlights();
        // A flight ended: today's usage changed.
        for (const id of d.flights) {
          const f = fleet.seen.get(id);
          if (f && f.agent === name && !isLive(f.state)) {
            loadUsage();
            break;
          }
        }
      }
      if (d.all || d.approvals) loadRulesSoon();
    },
    destroy() {
      destroyed = true;
      clearTimeout(flightsTimer);
      composer.destroy();
    },
  };

  // A decision may have made a rule for this agent.
  function loadRulesSoon() {
    if (!agent) return;
    loadRules();
  }
}

export {
  agentFlights,
  agentView,
  parseBudget,
  taskOf,
};
