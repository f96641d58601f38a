//! Codex `app-server` wire types: JSON-RPC "lite" over stdio, one JSON object per line,
//! without the `"jsonrpc"` field. Only the subset Relay's adapter uses is typed here.
//!
//! - The envelope: [`Message`] (request, notification, response, error) and [`RequestId`].
//! - Method names: [`method`] (client requests), [`notification`] (server notifications),
//!   [`server_request`] (requests Codex sends to the client, such as approvals).
//! - Params and results for `initialize`, `thread/start`, `thread/resume`, `turn/start`,
//!   `turn/steer`, `turn/interrupt`, the notifications the adapter translates, and the
//!   approval requests with their answers.
//!
//! Checked against the schema of the pinned Codex (`codex app-server
//! generate-json-schema`, v2 types). Field names are camelCase on the wire. Unknown fields
//! are tolerated everywhere (Codex adds fields often, e.g. `emittedAtMs` on every
//! notification), and fields the schema marks optional are `Option` or `#[serde(default)]`.
//! Unknown item types decode as [`ThreadItem::Other`] rather than failing the message.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A JSON-RPC request id: Codex uses integers for its own requests (from 0), and accepts
/// integers or strings from clients.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RequestId {
    Integer(i64),
    String(String),
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestId::Integer(n) => write!(f, "{n}"),
            RequestId::String(s) => f.write_str(s),
        }
    }
}

/// Any message on the wire. Decoded by shape: a request has `id` and `method`, a
/// notification only `method`, a response `id` and `result`, an error `id` and `error`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Message {
    Request(Request),
    Notification(Notification),
    Response(Response),
    Error(ErrorResponse),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub id: RequestId,
    pub method: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Notification {
    pub method: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub id: RequestId,
    pub result: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorResponse {
    pub id: RequestId,
    pub error: ErrorObject,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorObject {
    pub code: i64,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

/// Error codes Codex uses. It answers most refusals (unknown thread, no active turn,
/// unknown method, bad params) with [`error_code::INVALID_REQUEST`].
pub mod error_code {
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
}

/// Client -> server request methods.
pub mod method {
    pub const INITIALIZE: &str = "initialize";
    pub const THREAD_START: &str = "thread/start";
    pub const THREAD_RESUME: &str = "thread/resume";
    pub const TURN_START: &str = "turn/start";
    pub const TURN_STEER: &str = "turn/steer";
    pub const TURN_INTERRUPT: &str = "turn/interrupt";
    /// Client -> server notification sent once after the `initialize` response.
    pub const INITIALIZED: &str = "initialized";

    pub const ALL: [&str; 6] = [
        INITIALIZE,
        THREAD_START,
        THREAD_RESUME,
        TURN_START,
        TURN_STEER,
        TURN_INTERRUPT,
    ];
}

/// Server -> client notification methods the adapter uses.
pub mod notification {
    pub const THREAD_STARTED: &str = "thread/started";
    pub const TURN_STARTED: &str = "turn/started";
    pub const TURN_COMPLETED: &str = "turn/completed";
    pub const ITEM_STARTED: &str = "item/started";
    pub const ITEM_COMPLETED: &str = "item/completed";
    pub const AGENT_MESSAGE_DELTA: &str = "item/agentMessage/delta";
    pub const COMMAND_OUTPUT_DELTA: &str = "item/commandExecution/outputDelta";
    pub const TURN_PLAN_UPDATED: &str = "turn/plan/updated";
    pub const TURN_DIFF_UPDATED: &str = "turn/diff/updated";
    pub const TOKEN_USAGE_UPDATED: &str = "thread/tokenUsage/updated";
    pub const ERROR: &str = "error";
    pub const WARNING: &str = "warning";
    pub const SERVER_REQUEST_RESOLVED: &str = "serverRequest/resolved";

    pub const ALL: [&str; 13] = [
        THREAD_STARTED,
        TURN_STARTED,
        TURN_COMPLETED,
        ITEM_STARTED,
        ITEM_COMPLETED,
        AGENT_MESSAGE_DELTA,
        COMMAND_OUTPUT_DELTA,
        TURN_PLAN_UPDATED,
        TURN_DIFF_UPDATED,
        TOKEN_USAGE_UPDATED,
        ERROR,
        WARNING,
        SERVER_REQUEST_RESOLVED,
    ];
}

/// Server -> client request methods. The adapter answers the two approvals; every other
/// server request gets a JSON-RPC error so Codex never waits on it.
pub mod server_request {
    pub const COMMAND_APPROVAL: &str = "item/commandExecution/requestApproval";
    pub const FILE_CHANGE_APPROVAL: &str = "item/fileChange/requestApproval";

    pub const ALL: [&str; 2] = [COMMAND_APPROVAL, FILE_CHANGE_APPROVAL];
}

// ---------------------------------------------------------------------------------------
// initialize

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientInfo {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    pub version: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeParams {
    pub client_info: ClientInfo,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<InitializeCapabilities>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeCapabilities {
    /// Notification methods Codex should not send to this client at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opt_out_notification_methods: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeResponse {
    #[serde(default)]
    pub user_agent: String,
    #[serde(default)]
    pub codex_home: Option<String>,
    #[serde(default)]
    pub platform_os: Option<String>,
}

// ---------------------------------------------------------------------------------------
// Threads

/// `approvalPolicy`. (The schema also has a `granular` object form; Relay never sends it.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AskForApproval {
    /// Refused by Codex 0.169.0 in app-server mode (the process exits).
    Untrusted,
    OnRequest,
    Never,
}

/// `sandbox` on `thread/start` and `thread/resume`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxMode {
    ReadOnly,
    WorkspaceWrite,
    DangerFullAccess,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadStartParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_policy: Option<AskForApproval>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_instructions: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub developer_instructions: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadStartResponse {
    pub thread: Thread,
    #[serde(default)]
    pub model: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadResumeParams {
    pub thread_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_policy: Option<AskForApproval>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub developer_instructions: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadResumeResponse {
    pub thread: Thread,
    #[serde(default)]
    pub model: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Thread {
    pub id: String,
    /// The JSONL rollout under `$CODEX_HOME/sessions/`.
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub preview: Option<String>,
    /// Filled by `thread/resume` (the earlier turns); empty on `thread/start`.
    #[serde(default)]
    pub turns: Vec<Turn>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Turn {
    pub id: String,
    pub status: TurnStatus,
    /// On `turn/completed`, a summary: the turn's final agent message.
    #[serde(default)]
    pub items: Vec<ThreadItem>,
    #[serde(default)]
    pub error: Option<TurnError>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TurnStatus {
    Completed,
    Interrupted,
    Failed,
    InProgress,
    /// A status this version of Relay does not know.
    #[serde(other)]
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnError {
    pub message: String,
    #[serde(default)]
    pub additional_details: Option<String>,
    /// A tag such as `"other"` or an object; kept raw.
    #[serde(default)]
    pub codex_error_info: Option<Value>,
}

// ---------------------------------------------------------------------------------------
// Turns

/// One piece of user input. Relay only sends text; other kinds (images, skills,
/// mentions) decode as [`UserInput::Other`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum UserInput {
    Text {
        text: String,
    },
    #[serde(other)]
    Other,
}

impl UserInput {
    pub fn text(text: impl Into<String>) -> Self {
        UserInput::Text { text: text.into() }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnStartParams {
    pub thread_id: String,
    pub input: Vec<UserInput>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnStartResponse {
    pub turn: Turn,
}

/// Adds input to the turn in progress. Codex 0.169.0 cuts the model request in flight
/// short and samples again with the steered input appended, inside the same turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnSteerParams {
    pub thread_id: String,
    pub expected_turn_id: String,
    pub input: Vec<UserInput>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnSteerResponse {
    pub turn_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnInterruptParams {
    pub thread_id: String,
    pub turn_id: String,
}

/// `{}`: the turn then ends with `turn/completed` status `interrupted`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnInterruptResponse {}

// ---------------------------------------------------------------------------------------
// Items

/// One step of a turn, flat on the wire with a `type` tag. Types Relay does not model
/// decode as [`ThreadItem::Other`] with their tag and id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ThreadItem {
    Known(KnownThreadItem),
    Other(OtherThreadItem),
}

impl ThreadItem {
    pub fn id(&self) -> &str {
        match self {
            ThreadItem::Known(item) => item.id(),
            ThreadItem::Other(item) => &item.id,
        }
    }

    /// The wire `type` tag (`agentMessage`, `commandExecution`...).
    pub fn type_name(&self) -> &str {
        match self {
            ThreadItem::Known(item) => item.type_name(),
            ThreadItem::Other(item) => &item.item_type,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum KnownThreadItem {
    #[serde(rename_all = "camelCase")]
    UserMessage {
        id: String,
        #[serde(default)]
        content: Vec<UserInput>,
    },
    #[serde(rename_all = "camelCase")]
    AgentMessage {
        id: String,
        #[serde(default)]
        text: String,
    },
    #[serde(rename_all = "camelCase")]
    Plan {
        id: String,
        #[serde(default)]
        text: String,
    },
    #[serde(rename_all = "camelCase")]
    Reasoning {
        id: String,
        #[serde(default)]
        summary: Vec<String>,
        #[serde(default)]
        content: Vec<String>,
    },
    #[serde(rename_all = "camelCase")]
    CommandExecution {
        id: String,
        /// The command line as Codex runs it, e.g. `/bin/bash -lc 'echo hi'`.
        #[serde(default)]
        command: String,
        #[serde(default)]
        cwd: Option<String>,
        #[serde(default)]
        status: Option<String>,
        #[serde(default)]
        aggregated_output: Option<String>,
        #[serde(default)]
        exit_code: Option<i64>,
    },
    #[serde(rename_all = "camelCase")]
    FileChange {
        id: String,
        #[serde(default)]
        changes: Vec<FileUpdateChange>,
        #[serde(default)]
        status: Option<String>,
    },
    #[serde(rename_all = "camelCase")]
    McpToolCall {
        id: String,
        #[serde(default)]
        server: String,
        #[serde(default)]
        tool: String,
        #[serde(default)]
        status: Option<String>,
    },
    #[serde(rename_all = "camelCase")]
    DynamicToolCall {
        id: String,
        #[serde(default)]
        tool: String,
        #[serde(default)]
        status: Option<String>,
    },
    #[serde(rename_all = "camelCase")]
    WebSearch {
        id: String,
        #[serde(default)]
        query: String,
    },
}

impl KnownThreadItem {
    pub fn id(&self) -> &str {
        match self {
            KnownThreadItem::UserMessage { id, .. }
            | KnownThreadItem::AgentMessage { id, .. }
            | KnownThreadItem::Plan { id, .. }
            | KnownThreadItem::Reasoning { id, .. }
            | KnownThreadItem::CommandExecution { id, .. }
            | KnownThreadItem::FileChange { id, .. }
            | KnownThreadItem::McpToolCall { id, .. }
            | KnownThreadItem::DynamicToolCall { id, .. }
            | KnownThreadItem::WebSearch { id, .. } => id,
        }
    }

    pub fn type_name(&self) -> &'static str {
        match self {
            KnownThreadItem::UserMessage { .. } => "userMessage",
            KnownThreadItem::AgentMessage { .. } => "agentMessage",
            KnownThreadItem::Plan { .. } => "plan",
            KnownThreadItem::Reasoning { .. } => "reasoning",
            KnownThreadItem::CommandExecution { .. } => "commandExecution",
            KnownThreadItem::FileChange { .. } => "fileChange",
            KnownThreadItem::McpToolCall { .. } => "mcpToolCall",
            KnownThreadItem::DynamicToolCall { .. } => "dynamicToolCall",
            KnownThreadItem::WebSearch { .. } => "webSearch",
        }
    }
}

/// An item of a type Relay does not model (`imageView`, `contextCompaction`...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OtherThreadItem {
    #[serde(rename = "type")]
    pub item_type: String,
    #[serde(default)]
    pub id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileUpdateChange {
    pub path: String,
    /// `{"type": "add" | "delete" | "update", "move_path"?}`; kept raw.
    #[serde(default)]
    pub kind: Value,
    #[serde(default)]
    pub diff: String,
}

impl FileUpdateChange {
    /// `add`, `delete`, `update` (or `?` when absent).
    pub fn kind_name(&self) -> &str {
        self.kind
            .get("type")
            .and_then(Value::as_str)
            .or_else(|| self.kind.as_str())
            .unwrap_or("?")
    }
}

// ---------------------------------------------------------------------------------------
// Notifications

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadStartedNotification {
    pub thread: Thread,
}

/// `turn/started` and `turn/completed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnNotification {
    pub thread_id: String,
    pub turn: Turn,
}

/// `item/started` and `item/completed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ItemNotification {
    pub thread_id: String,
    pub turn_id: String,
    pub item: ThreadItem,
}

/// `item/agentMessage/delta` and `item/commandExecution/outputDelta`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeltaNotification {
    pub thread_id: String,
    pub turn_id: String,
    pub item_id: String,
    pub delta: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnPlanUpdatedNotification {
    pub thread_id: String,
    pub turn_id: String,
    #[serde(default)]
    pub explanation: Option<String>,
    #[serde(default)]
    pub plan: Vec<TurnPlanStep>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnPlanStep {
    pub step: String,
    /// `pending`, `inProgress` or `completed`.
    pub status: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnDiffUpdatedNotification {
    pub thread_id: String,
    pub turn_id: String,
    pub diff: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenUsageUpdatedNotification {
    pub thread_id: String,
    pub turn_id: String,
    pub token_usage: ThreadTokenUsage,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadTokenUsage {
    /// Cumulative over the thread's life (a resumed thread starts from its old total).
    pub total: TokenUsageBreakdown,
    /// The last model request.
    pub last: TokenUsageBreakdown,
    #[serde(default)]
    pub model_context_window: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenUsageBreakdown {
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub cached_input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
    #[serde(default)]
    pub reasoning_output_tokens: u64,
    #[serde(default)]
    pub total_tokens: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorNotification {
    pub thread_id: String,
    pub turn_id: String,
    pub error: TurnError,
    /// `true`: Codex retries and the turn goes on; `false`: the turn is failing.
    pub will_retry: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WarningNotification {
    #[serde(default)]
    pub thread_id: Option<String>,
    pub message: String,
}

/// A server request was settled: answered by the client, or dropped by Codex (its turn
/// ended first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerRequestResolvedNotification {
    pub thread_id: String,
    pub request_id: RequestId,
}

// ---------------------------------------------------------------------------------------
// Approvals (server -> client requests)

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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use serde_json::json;

    use super::*;

    #[test]
    fn envelope_kinds_decode_by_shape() {
        let m: Message = serde_json::from_str(
            r#"{"id":0,"method":"item/fileChange/requestApproval","params":{}}"#,
        )
        .unwrap();
        assert!(matches!(
            m,
            Message::Request(Request {
                id: RequestId::Integer(0),
                ..
            })
        ));
        let m: Message = serde_json::from_str(
            r#"{"method":"warning","params":{"message":"m"},"emittedAtMs":1}"#,
        )
        .unwrap();
        assert!(matches!(m, Message::Notification(_)));
        let m: Message = serde_json::from_str(r#"{"id":"a","result":{}}"#).unwrap();
        assert_eq!(
            m,
            Message::Response(Response {
                id: RequestId::String("a".into()),
                result: json!({})
            })
        );
        let m: Message =
            serde_json::from_str(r#"{"error":{"code":-32600,"message":"no"},"id":3}"#).unwrap();
        assert!(matches!(
            m,
            Message::Error(ErrorResponse {
                id: RequestId::Integer(3),
                ..
            })
        ));
        assert!(serde_json::from_str::<Message>(r#"{"garbage":1}"#).is_err());
    }

    #[test]
    fn requests_serialise_without_jsonrpc_field_and_with_camel_case() {
        let req = Request {
            id: RequestId::Integer(7),
            method: method::TURN_STEER.into(),
            params: Some(
                serde_json::to_value(TurnSteerParams {
                    thread_id: "t".into(),
                    expected_turn_id: "u".into(),
                    input: vec![UserInput::text("hi")],
                })
                .unwrap(),
            ),
        };
        assert_eq!(
            serde_json::to_value(&req).unwrap(),
            json!({"id": 7, "method": "turn/steer", "params": {
                "threadId": "t", "expectedTurnId": "u", "input": [{"type": "text", "text": "hi"}]
            }})
        );
        assert_eq!(
            serde_json::to_value(ThreadStartParams {
                approval_policy: Some(AskForApproval::OnRequest),
                sandbox: Some(SandboxMode::ReadOnly),
                ..Default::default()
            })
            .unwrap(),
            json!({"approvalPolicy": "on-request", "sandbox": "read-only"})
        );
        assert_eq!(
            serde_json::to_value(ApprovalResponse {
                decision: ApprovalDecision::AcceptForSession
            })
            .unwrap(),
            json!({"decision": "acceptForSession"})
        );
    }

    #[test]
    fn items_decode_known_and_unknown_types() {
        let item: ThreadItem = serde_json::from_value(json!({
            "type": "agentMessage", "id": "msg_1", "text": "hi", "phase": null
        }))
        .unwrap();
        assert_eq!(
            item,
            ThreadItem::Known(KnownThreadItem::AgentMessage {
                id: "msg_1".into(),
                text: "hi".into()
            })
        );
        let item: ThreadItem = serde_json::from_value(json!({
            "type": "userMessage", "id": "u", "content": [
                {"type": "text", "text": "a", "text_elements": []},
                {"type": "localImage", "path": "/x.png"}
            ]
        }))
        .unwrap();
        assert_eq!(
            item,
            ThreadItem::Known(KnownThreadItem::UserMessage {
                id: "u".into(),
                content: vec![UserInput::text("a"), UserInput::Other]
            })
        );
        let item: ThreadItem =
            serde_json::from_value(json!({"type": "contextCompaction", "id": "c"})).unwrap();
        assert_eq!((item.type_name(), item.id()), ("contextCompaction", "c"));
    }

    #[test]
    fn unknown_turn_status_is_tolerated() {
        let turn: Turn =
            serde_json::from_value(json!({"id": "t", "status": "paused", "items": []})).unwrap();
        assert_eq!(turn.status, TurnStatus::Unknown);
    }
}
