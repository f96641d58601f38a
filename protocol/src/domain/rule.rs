//! Remembered decisions: rules a person made by deciding an approval with
//! `--remember SCOPE`, which decide the next identical request without asking.
//!
//! A rule is written in the exact-match language of `--auto-accept` (see the broker's
//! `policy` module): for a command, the command as it will run, in canonical form (and,
//! if the person chose, `*` in one named position); for a file change, a path pattern.
//! It never widens what the person saw. Its scope says where it applies: the agent's
//! session, the agent, the project (the agent's cwd: the repository it was added with),
//! or every agent. An auto decision by a rule is recorded as decided by `rule:<id>`.

use serde::{Deserialize, Serialize};

use super::{ApprovalDecision, ApprovalKind};
use crate::names::wire_enum;

wire_enum! {
    /// Where a remembered decision applies.
    pub enum RuleScope("rule scope") {
        /// The agent's current session (its harness thread): gone with the session.
        Session = "session",
        /// Every session of the agent.
        Agent = "agent",
        /// Every agent whose cwd is the same project (repository or directory).
        Project = "project",
        /// Every agent.
        Everywhere = "everywhere",
    }
}

/// A remembered decision (`relay rule show`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    /// `rul_...`.
    pub id: String,
    /// `accept` or `decline`.
    pub decision: ApprovalDecision,
    /// `command` or `file_change`.
    pub kind: ApprovalKind,
    /// For a command, a rule of the `--auto-accept` language (`cargo test`, `ls *`);
    /// for a file change, a path pattern.
    pub pattern: String,
    pub scope: RuleScope,
    /// The agent it applies to (scopes `session` and `agent`; for the others, the agent
    /// whose approval made it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The harness session it applies to (scope `session`: the agent's thread id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The project it applies to (scope `project`: the agent's cwd, as registered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// The approval whose decision made it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// Who decided that approval (as its record names them).
    pub created_by: String,
    pub created_at: u64,
    /// How many approvals it decided.
    #[serde(default)]
    pub matched: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_matched_at: Option<u64>,
}

/// What a person asks to remember with a decision (`--remember SCOPE [--any-arg N]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Remember {
    pub scope: RuleScope,
    /// The command's argument at this position (1 = the first argument after the
    /// program) becomes `*`: any plain argument there. Only a plain argument (not an
    /// option) may be generalised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub any_arg: Option<u32>,
}

/// The `decided_by` of a decision made by rule `id`.
pub fn rule_decider(id: &str) -> String {
    format!("{}{id}", super::decider::RULE)
}
