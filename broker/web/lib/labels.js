// Labels several views share: item kinds, a flight's commit and revert, an agent's
// branch and program, a rule's scope.

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

export {
  branchLabel,
  commitLabel,
  ITEM_KINDS,
  programLabel,
  revertLabel,
  ruleScopeText,
};
