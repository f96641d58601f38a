//! The Agent Client Protocol (ACP, <https://agentclientprotocol.com>, protocol version 1):
//! JSON-RPC 2.0, one JSON message per line over a child's stdio. Relay speaks it both
//! ways, so its shapes are part of Relay's own contract: the `acp` harness is a client
//! of Gemini CLI, OpenCode, Qwen Code and any other ACP agent, and `relay acp` is an ACP
//! agent for editors.
//!
//! Only what Relay uses is typed, and every type is tolerant, because agents differ and
//! grow (facts in `HARNESSES.md`): unknown fields are ignored, `_meta` is kept as it came,
//! an unknown update, content or tool-call content kind reads as `Unknown` (the caller
//! logs it), and an unknown stop reason, tool kind or status keeps its text
//! ([`StopReason::Other`]). A known kind of the wrong shape is an error for the caller to
//! count and skip.
//!
//! Parts: `rpc.rs` (JSON-RPC messages and errors), `session.rs` (`initialize`, the
//! session methods, prompt results), `update.rs` (`session/update` kinds, tool calls,
//! permission requests).
//!
//! Not `agent-client-protocol-schema`: it turns on serde_json's `preserve_order` for the
//! whole workspace, which would change the key order of every JSON map Relay stores and
//! sends.

mod rpc;
mod session;
mod update;

pub use rpc::{LineError, Message, RequestId, RpcError};
pub use session::*;
pub use update::*;

/// The ACP version Relay speaks (`initialize`'s `protocolVersion`).
pub const PROTOCOL_VERSION: u16 = 1;

/// Method names, both directions.
pub mod method {
    pub const INITIALIZE: &str = "initialize";
    pub const AUTHENTICATE: &str = "authenticate";
    pub const SESSION_NEW: &str = "session/new";
    pub const SESSION_LOAD: &str = "session/load";
    /// Unstable in the schema; offered by OpenCode and Qwen Code.
    pub const SESSION_RESUME: &str = "session/resume";
    pub const SESSION_PROMPT: &str = "session/prompt";
    /// A notification (client -> agent).
    pub const SESSION_CANCEL: &str = "session/cancel";
    /// A notification (agent -> client).
    pub const SESSION_UPDATE: &str = "session/update";
    /// A request (agent -> client).
    pub const REQUEST_PERMISSION: &str = "session/request_permission";
    /// A notification (either way): the request `requestId` is given up.
    pub const CANCEL_REQUEST: &str = "$/cancel_request";
}

#[cfg(test)]
mod tests;
