//! Codex `app-server` wire types: JSON-RPC "lite" over stdio, one JSON object per line,
//! without the `"jsonrpc"` field. Only the subset Relay's adapter uses is typed here.
//!
//! - The envelope: [`Message`] (request, notification, response, error) and [`RequestId`].
//! - Method names: [`method`] (client requests), [`notification`] (server notifications),
//!   [`server_request`] (requests Codex sends to the client, such as approvals).
//! - Params and results for `initialize`, `thread/start`, `thread/resume`, `thread/fork`,
//!   `thread/turns/list`, `turn/start`,
//!   `turn/steer`, `turn/interrupt`, the notifications the adapter translates, and the
//!   approval requests with their answers.
//!
//! Checked against the schema of the pinned Codex (`codex app-server
//! generate-json-schema`, v2 types). Field names are camelCase on the wire. Unknown fields
//! are tolerated everywhere (Codex adds fields often, e.g. `emittedAtMs` on every
//! notification), and fields the schema marks optional are `Option` or `#[serde(default)]`.
//! Unknown item types decode as [`ThreadItem::Other`] rather than failing the message.
//!
//! This root holds the envelope, the method names and `initialize`; the rest is by area:
//! threads, turns, items, notifications, approvals (each re-exported here).

mod approvals;
mod items;
mod notifications;
#[cfg(test)]
mod tests;
mod thread;
mod turn;

pub use approvals::*;
pub use items::*;
pub use notifications::*;
pub use thread::*;
pub use turn::*;

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
    pub const THREAD_FORK: &str = "thread/fork";
    pub const THREAD_TURNS_LIST: &str = "thread/turns/list";
    pub const TURN_START: &str = "turn/start";
    pub const TURN_STEER: &str = "turn/steer";
    pub const TURN_INTERRUPT: &str = "turn/interrupt";
    /// Client -> server notification sent once after the `initialize` response.
    pub const INITIALIZED: &str = "initialized";

    pub const ALL: [&str; 8] = [
        INITIALIZE,
        THREAD_START,
        THREAD_RESUME,
        THREAD_FORK,
        THREAD_TURNS_LIST,
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
    pub const MCP_SERVER_STATUS: &str = "mcpServer/startupStatus/updated";

    pub const ALL: [&str; 14] = [
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
        MCP_SERVER_STATUS,
    ];
}

/// Server -> client request methods. The adapter answers the two approvals and MCP
/// elicitations (tool call approvals among them); every other server request gets a
/// JSON-RPC error so Codex never waits on it.
pub mod server_request {
    pub const COMMAND_APPROVAL: &str = "item/commandExecution/requestApproval";
    pub const FILE_CHANGE_APPROVAL: &str = "item/fileChange/requestApproval";
    pub const MCP_ELICITATION: &str = "mcpServer/elicitation/request";

    pub const ALL: [&str; 3] = [COMMAND_APPROVAL, FILE_CHANGE_APPROVAL, MCP_ELICITATION];
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
