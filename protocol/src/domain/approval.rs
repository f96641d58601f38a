//! Approval requests a harness makes, and how they are decided.

use serde::{Deserialize, Serialize};

use crate::names::wire_enum;

wire_enum! {
    pub enum ApprovalKind("approval kind") {
        Command = "command",
        FileChange = "file_change",
        Other = "other",
    }
}

wire_enum! {
    /// On the command line Codex's own spelling `acceptForSession` is taken too.
    pub enum ApprovalDecision("decision") {
        Accept = "accept",
        AcceptForSession = "accept_for_session" | "acceptForSession",
        Decline = "decline",
        Cancel = "cancel",
    }
}

wire_enum! {
    pub enum ApprovalState("approval state") {
        Pending = "pending",
        Decided = "decided",
        /// Its turn ended (or its session died) before anyone decided.
        Expired = "expired",
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    pub flight: String,
    pub kind: ApprovalKind,
    /// The command line, or a description of the change.
    pub detail: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The harness's own id for the request (JSON-RPC id, request_id...).
    pub harness_request_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    pub id: String,
    pub agent: String,
    #[serde(flatten)]
    pub request: ApprovalRequest,
    pub state: ApprovalState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<ApprovalDecision>,
    /// Who or what decided: `operator`, `policy:auto-accept:<rule>`, an agent name...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    pub created_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<u64>,
}
