//! Approvals: the server requests that ask the client to approve a command or a file
//! change, and their answers.

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommandExecutionRequestApprovalParams {
    pub thread_id: String,
    pub turn_id: String,
    pub item_id: String,
    /// The model's justification.
    #[serde(default)]
    pub reason: Option<String>,
    /// The command line as Codex would run it, e.g. `/bin/bash -lc 'echo hi'`. Absent for
    /// network approvals.
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub cwd: Option<String>,
    /// `command`, `writeStdin` or `humanCommand`.
    #[serde(default)]
    pub kind: Option<String>,
    /// Set for network access approvals: `{host, protocol}`.
    #[serde(default)]
    pub network_approval_context: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileChangeRequestApprovalParams {
    pub thread_id: String,
    pub turn_id: String,
    /// The `fileChange` item (announced by `item/started`) that holds the changes.
    pub item_id: String,
    #[serde(default)]
    pub reason: Option<String>,
    /// A directory the change asks write access to, when it is outside the sandbox.
    #[serde(default)]
    pub grant_root: Option<String>,
}

/// The answer to either approval request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ApprovalDecision {
    Accept,
    AcceptForSession,
    Decline,
    Cancel,
}

impl From<crate::domain::ApprovalDecision> for ApprovalDecision {
    fn from(d: crate::domain::ApprovalDecision) -> Self {
        use crate::domain::ApprovalDecision as D;
        match d {
            D::Accept => ApprovalDecision::Accept,
            D::AcceptForSession => ApprovalDecision::AcceptForSession,
            D::Decline => ApprovalDecision::Decline,
            D::Cancel => ApprovalDecision::Cancel,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalResponse {
    pub decision: ApprovalDecision,
}
