// Labels several views share: item kinds, a flight's commit and revert, an agent's
// branch and program, a rule's scope, a note's cause.

import { isLive as isLiveState } from "/lib/dom.js";

const ITEM_KINDS = {
  command_execution: "command",
  file_change: "file change",
  tool_call: "tool call",
  agent_message: "message",
  user_message: "user message",
  reasoning: "reasoning",
  plan: "plan",
};

/** "commit 1a2b3c4d5e6f on relay/a: 2 files, +10 -3": a flight's commit (`FlightCommit::summary`). */
function commitLabel(c) {
  if (!c) return "";
  const short = (id) => String(id || "").slice(0, 12);
  const files = (c.files || []).length;
  let line = (c.commit ? "commit " + short(c.commit) : "commits up to " + short(c.head)) +
    " on " + c.branch + ": " + files + (files === 1 ? " file" : " files") +
    ", +" + (c.added || 0) + " -" + (c.removed || 0);
  if ((c.agent_commits || []).length) line += " (" + c.agent_commits.length + " made by the agent)";
  return line;
}

/** "reverted by commit 1a2b3c4d5e6f (operator)" (`Revert::summary`). */
function revertLabel(r) {
  return r ? "reverted by commit " + String(r.commit || "").slice(0, 12) + " (" + r.by + ")" : "";
}

/** "relay/a +2 -0": an agent's branch and how far it is ahead of and behind its base. */
function branchLabel(a) {
  const w = a.worktree_state;
  if (w) return w.branch + " +" + (w.ahead || 0) + " -" + (w.behind || 0);
  return a.worktree ? "relay/" + a.name : "";
}

/** "gemini-cli 0.61.0": an agent's program (name and version), or "" without one. */
function programLabel(p) {
  return p ? [p.name, p.version].filter(Boolean).join(" ") : "";
}

function ruleScopeText(r) {
  switch (r.scope) {
    case "session": return `session ${r.agent ?? "?"}/${r.session ?? "?"}`;
    case "agent": return `agent ${r.agent ?? "?"}`;
    case "project": return `project ${r.project ?? "?"}`;
    default: return r.scope;
  }
}

// A note's cause, in plain words. The notes come from the harness adapters and the
// runtime (see harnesses/src/codex/translate.rs, claude/stream_json.rs `retry_note`,
// pi/wire.rs, runtime/src/worker/turn.rs and tree.rs, broker rules/budgets.rs).

const NOTE_CAUSES = [
  [/^Reconnecting\.\.\.\s*(\d+)\s*\/\s*(\d+)/i,
    (m) => `The agent lost its connection to the model and is retrying (${m[1]}/${m[2]}).`],
  [/^Reconnecting\.\.\.\s*waiting for network/i,
    () => "The agent lost its connection to the model and is waiting for the network to come back."],
  [/^Reconnecting/i, () => "The agent lost its connection to the model and is reconnecting."],
  [/^Claude Code retries its model request \(([^)]*)\):\s*(.*)$/s,
    (m) => `The model request failed (${m[2]}); the agent retries it (${m[1].replace(/,\s*$/, "")}).`],
  [/^pi retries \((\d+\/\d+)\) after:\s*(.*)$/s,
    (m) => `The model request failed (${m[2]}); the agent retries it (${m[1]}).`],
  [/^no word from (\S+) for (\d+) s/,
    (m) => `No word from ${m[1]} for ${m[2]} seconds: its model may be slow or unreachable. Interrupt stops the turn.`],
  [/^budget exceeded:\s*(.*?);\s*this turn finishes\s*\((.*)\)$/s,
    (m) => `The agent's budget is used up (${m[1]}): this turn finishes, new ones are refused (${m[2]}).`],
  [/^cannot commit yet:/, () => "The flight's changes cannot be committed yet (git is busy); retrying."],
  [/^could not commit/, (_, t) => "The flight's changes were not committed yet: " + t],
  [/^the worktree .* was gone/, (_, t) => "The agent's worktree had to be made again: " + t],
];

/** What `table` ([pattern, say] pairs) says of text `t`, or null. */
function explain(table, t) {
  for (const [re, say] of table) {
    const m = re.exec(t);
    if (m) return say(m, t);
  }
  return null;
}

/**
 * A live flight's latest note in plain words when it is the last thing that happened
 * to the flight (a note followed by text or an item is over), else null.
 */
function noteNow(f) {
  const note = f?.note;
  if (!note || !isLiveState(f.state) || /^steered/.test(note.text)) return null;
  if ((note.at || 0) < (f.updated_at || 0)) return null;
  return explain(NOTE_CAUSES, note.text) || note.text;
}

export {
  explain,
  NOTE_CAUSES,
  noteNow,
  branchLabel,
  commitLabel,
  ITEM_KINDS,
  programLabel,
  revertLabel,
  ruleScopeText,
};
