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

impl From<relay_protocol::domain::ApprovalDecision> for ApprovalDecision {
    fn from(d: relay_protocol::domain::ApprovalDecision) -> Self {
        use relay_protocol::domain::ApprovalDecision as D;
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

/// `mcpServer/elicitation/request`: an MCP server asks the user something through Codex.
/// Codex sends the same request before every MCP tool call, as a form with no fields and
/// `_meta.codex_approval_kind = "mcp_tool_call"` (then `_meta` also names the tool,
/// `tool_name`, and holds the call's arguments, `tool_params`; seen with 0.169.0); any
/// other is a real form (or a URL to open) meant for a person.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct McpServerElicitationRequestParams {
    pub thread_id: String,
    /// The turn running when it came, when Codex could tell.
    #[serde(default)]
    pub turn_id: Option<String>,
    /// The server's name in Codex's `mcp_servers`.
    pub server_name: String,
    /// `form`, `openai/form`, `openaiForm` or `url`.
    #[serde(default)]
    pub mode: String,
    #[serde(default)]
    pub message: String,
    #[serde(default, rename = "_meta")]
    pub meta: Option<Value>,
}

/// `_meta.codex_approval_kind` of a tool call approval.
pub const MCP_TOOL_CALL_APPROVAL: &str = "mcp_tool_call";

impl McpServerElicitationRequestParams {
    /// `_meta.codex_approval_kind`, when Codex set one.
    pub fn approval_kind(&self) -> Option<&str> {
        self.meta_field("codex_approval_kind")?.as_str()
    }

    /// Whether this is Codex asking before an MCP tool call (not a form for a person).
    pub fn is_tool_call_approval(&self) -> bool {
        self.approval_kind() == Some(MCP_TOOL_CALL_APPROVAL)
    }

    /// The tool a tool call approval is about (`_meta.tool_name`).
    pub fn tool_name(&self) -> Option<&str> {
        self.meta_field("tool_name")?.as_str()
    }

    /// A field of `_meta` (`tool_name`, `tool_params`, `tool_description`...).
    pub fn meta_field(&self, key: &str) -> Option<&Value> {
        self.meta.as_ref()?.get(key)
    }
}

/// The answer to `mcpServer/elicitation/request`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpServerElicitationResponse {
    pub action: McpElicitationAction,
    /// What the form was filled with; `{}` accepts a tool call approval (a form without
    /// fields), absent when declined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum McpElicitationAction {
    Accept,
    Decline,
    Cancel,
}

impl McpServerElicitationResponse {
    /// A person's decision on a tool call approval. Accepting "for the session" is an
    /// accept here: Relay keeps such decisions itself (its policies), it does not ask
    /// Codex to remember them.
    pub fn tool_call(decision: relay_protocol::domain::ApprovalDecision) -> Self {
        use relay_protocol::domain::ApprovalDecision as D;
        match decision {
            D::Accept | D::AcceptForSession => Self::accept_tool_call(),
            D::Decline => Self::declined(McpElicitationAction::Decline),
            D::Cancel => Self::declined(McpElicitationAction::Cancel),
        }
    }

    /// Runs the tool call.
    pub fn accept_tool_call() -> Self {
        Self {
            action: McpElicitationAction::Accept,
            content: Some(Value::Object(Default::default())),
        }
    }

    /// Declines or cancels, with nothing filled in.
    pub fn declined(action: McpElicitationAction) -> Self {
        Self {
            action,
            content: None,
        }
    }
}
