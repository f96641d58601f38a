import { flightHref, h, inert, placeInOrder, put, setText, showError, timeEl } from "/lib/dom.js";
import { call } from "/lib/api.js";
import { fleet, invalidate, putApproval } from "/lib/fleet.js";

// ---------------------------------------------------------------------------------
// Approval items, shared by the approvals view and a flight's view: the exact command
// as text, accept and decline, the outcome and who decided, an error in the item.
//
// Remember: "Accept and remember" and "Decline and remember" make a rule for the scope
// the select names; for a command, a second select may let one plain argument be any
// (`--any-arg N`, N counting from 1 after the program, of the command as the broker
// splits it: [`commandWords`]). The page offers only the plain arguments; the broker
// checks the choice again (a command not in canonical form cannot be remembered) and
// the item shows its reason when it refuses.
//
// Hooks for tests: `li[data-approval]` with `button.accept`, `button.decline`,
// `button.remember` (`data-action="accept-remember"`), `button.decline-remember`,
// `select.remember-scope`, `select.remember-any-arg` (values "" and N), `.remembered`.

/** The shells whose `-c SCRIPT` the broker reads as SCRIPT's words (`policy::SHELLS`). */
const SHELLS = new Set(["/bin/bash", "/usr/bin/bash", "/bin/sh", "/usr/bin/sh", "/bin/zsh", "/usr/bin/zsh", "bash", "sh", "zsh"]);

/** `text` split as a POSIX shell splits words (quotes, backslashes); null when unbalanced. */
function shellWords(text) {
  const words = [];
  let word = null;
  let i = 0;
  const s = String(text);
  while (i < s.length) {
    const c = s[i];
    if (/\s/.test(c)) {
      if (word !== null) words.push(word);
      word = null;
      i++;
    } else if (c === "'") {
      const end = s.indexOf("'", i + 1);
      if (end < 0) return null;
      word = (word ?? "") + s.slice(i + 1, end);
      i = end + 1;
    } else if (c === '"') {
      word = word ?? "";
      i++;
      for (;;) {
        if (i >= s.length) return null;
        if (s[i] === '"') break;
        if (s[i] === "\\" && i + 1 < s.length && '\\"$`\n'.includes(s[i + 1])) i++;
        word += s[i++];
      }
      i++;
    } else if (c === "\\") {
      if (i + 1 >= s.length) return null;
      word = (word ?? "") + s[i + 1];
      i += 2;
    } else {
      word = (word ?? "") + c;
      i++;
    }
  }
  if (word !== null) words.push(word);
  return words;
}

/** The words a command runs, a plain `sh -c SCRIPT` unwrapped (as `policy::command_argv`). */
function commandWords(detail) {
  const argv = shellWords(detail);
  if (!argv || !argv.length) return null;
  if (argv.length === 3 && SHELLS.has(argv[0]) && (argv[1] === "-c" || argv[1] === "-lc")) {
    // Only an ASCII script is unwrapped (as the broker: a multibyte locale could read it otherwise).
    return /^[\x00-\x7f]*$/.test(argv[2]) ? shellWords(argv[2]) : null;
  }
  return argv;
}

/** Whether `w` is an argument `--any-arg` may generalise (`policy::plain_argument`). */
function plainArgument(w) {
  return w !== "" && !/^[-+@]/.test(w) && !w.includes("=") && w !== "*" && w !== "**";
}

function approvalItem(initial) {
  let a = initial;
  let busy = false;
  const agent = h("span", { class: "agent" });
  const flight = h("a", { class: "flight mono" });
  const kind = h("span", { class: "kind" });
  const when = h("span", { class: "when" });
  const command = h("pre", { class: "command" });
  const reason = h("p", { class: "reason" });
  const accept = h("button", { type: "button", class: "accept" }, "Accept");
  const decline = h("button", { type: "button", class: "decline" }, "Decline");
  // Accept and remember: a rule (`relay rule list`) then decides the same request
  // within the chosen scope. Only commands and file changes can be remembered.
  const scope = h("select", { class: "remember-scope", "aria-label": "Remember for" },
    REMEMBER_SCOPES.map(([value, label]) => h("option", { value }, label)));
  scope.value = "agent";
  const remember = h("button", { type: "button", class: "remember", dataset: { action: "accept-remember" } }, "Accept and remember");
  const declineRemember = h("button", { type: "button", class: "decline-remember", dataset: { action: "decline-remember" } },
    "Decline and remember");
  // Which argument may be any plain one; filled in per command by `update`.
  const anyArg = h("select", { class: "remember-any-arg", "aria-label": "Remember which command" });
  const anyArgBox = h("span", { class: "any-arg-box" }, anyArg);
  const rememberBox = h("span", { class: "remember-box" }, remember, declineRemember,
    h("span", { class: "remember-for" }, "for ", scope), anyArgBox);
  const buttons = [accept, decline, remember, declineRemember];
  const actions = h("div", { class: "actions" }, accept, decline, rememberBox);
  const decision = h("span", { class: "decision" });
  const decidedBy = h("span", { class: "decided-by" });
  const decidedAt = h("span", { class: "when" });
  const rememberedAs = h("span", { class: "remembered" });
  const outcome = h("p", { class: "outcome" }, decision, " by ", decidedBy, " ", decidedAt, rememberedAs);
  const error = h("p", { class: "error", role: "alert", hidden: true });
  const li = h("li", { class: "approval", tabindex: "0", dataset: { approval: a.id } },
    h("div", { class: "approval-head" }, agent, " wants ", kind, " in ", flight, " ", when),
    command, reason, actions, outcome, error);

  async function decide(choice, rememberScope) {
    if (busy || a.state !== "pending") return false;
    busy = true;
    for (const b of buttons) b.disabled = true;
    li.setAttribute("aria-busy", "true");
    error.hidden = true;
    const body = { decision: choice };
    if (rememberScope) {
      body.remember = { scope: rememberScope };
      if (a.kind === "command" && anyArg.value) body.remember.any_arg = Number(anyArg.value);
    }
    try {
      const got = await call("approval.decide", [a.id], { body });
      if (got && got.id) {
        update(got);
        putApproval(got, false);
      }
      return true;
    } catch (e) {
      showError(error, e);
      return false;
    } finally {
      busy = false;
      li.removeAttribute("aria-busy");
      for (const b of buttons) b.disabled = a.state !== "pending";
    }
  }

  function update(next) {
    a = next;
    li.dataset.state = a.state;
    setText(agent, a.agent);
    flight.href = flightHref(a.flight);
    setText(flight, a.flight);
    setText(kind, { command: "to run a command", file_change: "to change files" }[a.kind] || a.kind);
    when.replaceChildren(timeEl(a.created_at));
    setText(command, a.detail);
    setText(reason, a.reason ? "Reason: " + a.reason : "");
    reason.hidden = !a.reason;
    const pending = a.state === "pending";
    actions.hidden = !pending;
    for (const b of buttons) b.disabled = busy || !pending;
    rememberBox.hidden = !(a.kind === "command" || a.kind === "file_change");
    paintAnyArg();
    outcome.hidden = pending;
    rememberedAs.replaceChildren();
    if (a.remembered) put(rememberedAs, [", remembered as rule ", h("a", { href: "#/rules", class: "mono" }, a.remembered)]);
    setText(decision, a.state === "expired" ? "expired" : a.decision || a.state);
    decision.dataset.decision = a.state === "expired" ? "expired" : a.decision || "";
    setText(decidedBy, a.decided_by || "nobody");
    decidedAt.replaceChildren(a.decided_at ? timeEl(a.decided_at) : "");
    li.setAttribute("aria-label", inert(`${a.kind} approval for ${a.agent}, ${a.state}`));
  }

  let anyArgFor = null;
  /** The any-argument choices of this command: exactly it, or one plain argument as `*`. */
  function paintAnyArg() {
    if (anyArgFor === a.detail) return;
    anyArgFor = a.detail;
    const words = a.kind === "command" && a.state === "pending" ? commandWords(a.detail) : null;
    const options = [h("option", { value: "" }, "this exact command")];
    if (words) {
      words.forEach((w, i) => {
        if (i > 0 && plainArgument(w)) {
          const shown = words.map((x, j) => (j === i ? "*" : x)).join(" ");
          options.push(h("option", { value: String(i), title: inert(shown) }, `any argument ${i} (${inert(w).slice(0, 40)}): ${inert(shown).slice(0, 80)}`));
        }
      });
    }
    anyArg.replaceChildren(...options);
    anyArg.value = "";
    anyArgBox.hidden = options.length < 2;
  }

  accept.addEventListener("click", () => decide("accept"));
  decline.addEventListener("click", () => decide("decline"));
  remember.addEventListener("click", () => decide("accept", scope.value));
  declineRemember.addEventListener("click", () => decide("decline", scope.value));
  update(a);
  li._approval = { decide, get state() { return a.state; } };
  return { li, update, decide, get approval() { return a; } };
}

/** The scopes a decision can be remembered for, and how the select names them. */
const REMEMBER_SCOPES = [
  ["session", "this session"],
  ["agent", "this agent"],
  ["project", "this project"],
  ["everywhere", "every agent"],
];

/** Approval items by id, kept across renders so focus and pending requests survive. */
class ApprovalItems {
  constructor() {
    this.items = new Map();
  }

  nodes(approvals) {
    return approvals.map((a) => {
      let it = this.items.get(a.id);
      if (!it) {
        it = approvalItem(a);
        this.items.set(a.id, it);
      } else if (it.approval !== a && !(it.approval.state !== "pending" && a.state === "pending")) {
        it.update(a);
      }
      return it.li;
    });
  }

  prune(keep) {
    for (const id of this.items.keys()) if (!keep.has(id)) this.items.delete(id);
  }
}

const byCreated = (x, y) => (x.created_at || 0) - (y.created_at || 0);
const byDecidedDesc = (x, y) => (y.decided_at || y.created_at || 0) - (x.decided_at || x.created_at || 0);

// Approvals ------------------------------------------------------------------------

const RECENT_APPROVALS = 100;

function approvalsView() {
  const recent = new Map();
  const items = new ApprovalItems();
  const pendingList = h("ul", { class: "approvals pending-list", "aria-labelledby": "pending-title" });
  const decidedList = h("ul", { class: "approvals decided-list", "aria-labelledby": "decided-title" });
  const pendingTitle = h("h2", { id: "pending-title" }, "Waiting");
  const noneWaiting = h("p", { class: "muted empty" }, "Nothing is waiting for you.");
  const noneDecided = h("p", { class: "muted empty" }, "None yet.");
  const errBox = h("p", { class: "error", role: "alert", hidden: true });
  const el = h("section", { class: "view approvals-view", "aria-labelledby": "approvals-title" },
    h("div", { class: "view-head" }, h("h1", { id: "approvals-title" }, "Approvals"),
      h("p", { class: "muted keys" }, h("kbd", null, "j"), "/", h("kbd", null, "k"), " or arrows move, ",
        h("kbd", null, "a"), " accepts, ", h("kbd", null, "d"), " declines")),
    errBox,
    h("div", { id: "approvals" },
      pendingTitle, noneWaiting, pendingList,
      h("h2", { id: "decided-title" }, "Decided"), noneDecided, decidedList));

  call("approval.list", [], { query: { state: "all" } }).then((list) => {
    for (const a of list || []) if (a.state !== "pending") recent.set(a.id, a);
    invalidate({ approvals: true });
  }, (e) => showError(errBox, e));

  return {
    el,
    update(d) {
      if (!(d.all || d.approvals)) return;
      const pending = [...fleet.pending.values()].sort(byCreated);
      const decidedMap = new Map(recent);
      for (const a of fleet.decided.values()) decidedMap.set(a.id, a);
      for (const a of pending) decidedMap.delete(a.id);
      const decided = [...decidedMap.values()].sort(byDecidedDesc).slice(0, RECENT_APPROVALS);
      const focused = document.activeElement;
      placeInOrder(pendingList, items.nodes(pending));
      placeInOrder(decidedList, items.nodes(decided));
      items.prune(new Set([...pending, ...decided].map((a) => a.id)));
      if (focused && focused !== document.activeElement && focused.isConnected) focused.focus();
      setText(pendingTitle, `Waiting (${pending.length})`);
      noneWaiting.hidden = pending.length > 0;
      noneDecided.hidden = decided.length > 0;
    },
  };
}

export {
  commandWords,
  ApprovalItems,
  approvalsView,
  byCreated,
};
