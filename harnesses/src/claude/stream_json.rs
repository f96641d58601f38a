//! Claude Code stream-json wire types: `claude -p --input-format stream-json
//! --output-format stream-json --verbose --include-partial-messages
//! --permission-prompt-tool stdio`, one JSON object per line each way. Only what Relay's
//! adapter reads is typed.
//!
//! - CLI -> host, [`Line`] by its `type`: `system`, `stream_event` (a raw Anthropic
//!   Messages SSE event, [`StreamEvent`]), `assistant` and `user` (whole messages: the
//!   model's blocks, the tool results), `result` (the end of a turn), `control_request`
//!   (a permission prompt, `can_use_tool`), `control_response` (the answer to a request
//!   of the host), `control_cancel_request` (a prompt withdrawn).
//! - Host -> CLI, [`Input`]: a user message, a control request (`initialize`,
//!   `interrupt`), a control response (a [`PermissionResult`], or an error).
//!
//! Shapes checked against the lines of Claude Code 2.1.197 (the adapter's fixtures,
//! `harnesses/src/claude/fixtures`). Unknown fields are tolerated everywhere, and unknown
//! `type`s (of lines, events, blocks, deltas) decode as an `Other` variant rather than
//! failing the line.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One stdout line of the CLI.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Line {
    /// `init` (at every turn, with the tools and the session id), `status`, and others.
    System(System),
    StreamEvent(StreamEventLine),
    /// A message of the model, as Claude Code keeps it. While streaming, one line per
    /// content block, before that block's `content_block_stop`.
    Assistant(MessageLine),
    /// Tool results (and the notes Claude Code adds, such as `[Request interrupted by
    /// user]`).
    User(MessageLine),
    Result(TurnResult),
    ControlRequest(ControlRequest),
    ControlResponse(ControlResponseLine),
    ControlCancelRequest(ControlCancel),
    #[serde(other)]
    Other,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct System {
    #[serde(default)]
    pub subtype: String,
    #[serde(default)]
    pub session_id: Option<String>,
    /// Subtype [`System::API_RETRY`]: the model request failed and is tried again
    /// (`attempt` of `max_retries`, after `retry_delay_ms`); `error` and `error_status`
    /// say why ("unknown" and none for a refused connection).
    #[serde(default)]
    pub attempt: Option<u64>,
    #[serde(default)]
    pub max_retries: Option<u64>,
    #[serde(default)]
    pub retry_delay_ms: Option<f64>,
    #[serde(default)]
    pub error_status: Option<serde_json::Value>,
    #[serde(default)]
    pub error: Option<serde_json::Value>,
    /// Subtype [`System::INIT`]: the model the session uses.
    #[serde(default)]
    pub model: Option<String>,
}

impl System {
    /// Claude Code retries the model request (2.1.197: `{"type":"system","subtype":
    /// "api_retry","attempt":1,"max_retries":3,"retry_delay_ms":513.5,"error_status":null,
    /// "error":"unknown",...}`).
    pub const API_RETRY: &'static str = "api_retry";
    /// The first line of every turn: session id, tools, model.
    pub const INIT: &'static str = "init";

    /// An `api_retry` line as a note for a person: "Claude Code retries its model
    /// request (1/3, in 0.5 s): unknown error".
    pub fn retry_note(&self) -> String {
        let of = match (self.attempt, self.max_retries) {
            (Some(a), Some(m)) => format!("{a}/{m}, "),
            (Some(a), None) => format!("{a}, "),
            _ => String::new(),
        };
        let delay = self.retry_delay_ms.unwrap_or(0.0) / 1000.0;
        let text = |v: &Option<serde_json::Value>| match v {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Null) | None => None,
            Some(other) => Some(other.to_string()),
        };
        let why = match (text(&self.error), text(&self.error_status)) {
            (Some(e), Some(status)) => format!("{e} (HTTP {status})"),
            (Some(e), None) => format!("{e} error"),
            (None, Some(status)) => format!("HTTP {status}"),
            (None, None) => "no reason given".to_string(),
        };
        format!("Claude Code retries its model request ({of}in {delay:.1} s): {why}")
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct StreamEventLine {
    pub event: StreamEvent,
    /// Set on the lines of a subagent (the `Task` tool), naming the tool call it runs in.
    #[serde(default)]
    pub parent_tool_use_id: Option<String>,
}

/// A Messages API streaming event, as the model sent it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    MessageStart {
        message: MessageStart,
    },
    ContentBlockStart {
        index: u64,
        content_block: ContentBlock,
    },
    ContentBlockDelta {
        index: u64,
        delta: Delta,
    },
    ContentBlockStop {
        index: u64,
    },
    /// `message_delta`, `message_stop`, `ping`, `error`...
    #[serde(other)]
    Other,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct MessageStart {
    pub id: String,
}

/// A content block of a message.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    Thinking {
        #[serde(default)]
        thinking: String,
    },
    ToolUse {
        id: String,
        name: String,
        /// Empty (`{}`) in a `content_block_start`: it arrives as `input_json_delta`s.
        #[serde(default)]
        input: Value,
    },
    ToolResult {
        tool_use_id: String,
        /// A string, or content blocks (`{type: "text", text}`...).
        #[serde(default)]
        content: Value,
        #[serde(default)]
        is_error: bool,
    },
    #[serde(other)]
    Other,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Delta {
    TextDelta {
        text: String,
    },
    InputJsonDelta {
        partial_json: String,
    },
    ThinkingDelta {
        thinking: String,
    },
    #[serde(other)]
    Other,
}

/// An `assistant` or `user` line.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct MessageLine {
    pub message: Message,
    #[serde(default)]
    pub parent_tool_use_id: Option<String>,
    /// On a message Claude Code made up to report a failed model request (model
    /// `<synthetic>`, text `API Error: ...`), e.g. `"server_error"`.
    #[serde(default)]
    pub error: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Message {
    /// The model's message id (`assistant` only).
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub content: Content,
    /// The model that answered (`assistant` only; [`SYNTHETIC`] on Claude Code's own
    /// messages).
    #[serde(default)]
    pub model: Option<String>,
}

/// The model of the messages Claude Code makes up itself (`API Error: ...`).
pub const SYNTHETIC: &str = "<synthetic>";

/// A message's content: plain text or blocks.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Blocks(Vec<ContentBlock>),
}

impl Default for Content {
    fn default() -> Self {
        Content::Blocks(Vec::new())
    }
}

impl Content {
    /// The blocks (none for plain text).
    pub fn blocks(&self) -> &[ContentBlock] {
        match self {
            Content::Text(_) => &[],
            Content::Blocks(blocks) => blocks,
        }
    }
}

/// The end of a turn.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TurnResult {
    /// `success`, `error_during_execution` (also after an interrupt), `error_max_turns`...
    pub subtype: String,
    /// Also `true` with subtype `success` when the model request failed.
    #[serde(default)]
    pub is_error: bool,
    /// The final text, or the error (`API Error: 500 ...`). Missing after an interrupt.
    #[serde(default)]
    pub result: Option<String>,
    #[serde(default)]
    pub session_id: Option<String>,
    /// The turn's model usage (summed over its model requests).
    #[serde(default)]
    pub usage: Option<Usage>,
    /// What Claude Code says the session cost so far (over every turn of the process,
    /// not this turn's alone), from its own price of the model: it prices any model
    /// name, the mock's included.
    #[serde(default)]
    pub total_cost_usd: Option<f64>,
    /// Diagnostics of an `error_*` subtype.
    #[serde(default)]
    pub errors: Vec<Value>,
}

impl TurnResult {
    pub const SUCCESS: &'static str = "success";

    /// The turn's usage in Relay's conventions: input is every input token (uncached,
    /// written to the cache and read from it), cached the part read from it; the
    /// output includes any thinking (the API has no separate count). The cost is Claude
    /// `cost_usd`, the turn's part of Claude Code's `total_cost_usd`. `None` when
    /// nothing was counted (after an interrupt, or a failed model request).
    pub fn token_usage(
        &self,
        model: Option<String>,
        cost_usd: Option<f64>,
    ) -> Option<relay_protocol::domain::TokenUsage> {
        let usage = self.usage.filter(|u| *u != Usage::default())?;
        let cost = cost_usd.and_then(relay_protocol::domain::usd_to_micros);
        Some(relay_protocol::domain::TokenUsage {
            input_tokens: usage
                .input_tokens
                .saturating_add(usage.cache_creation_input_tokens)
                .saturating_add(usage.cache_read_input_tokens),
            cached_input_tokens: usage.cache_read_input_tokens,
            output_tokens: usage.output_tokens,
            reasoning_tokens: None,
            model,
            cost_micro_usd: cost,
            cost_source: cost.map(|_| relay_protocol::domain::CostSource::Harness),
        })
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
    #[serde(default)]
    pub cache_creation_input_tokens: u64,
    #[serde(default)]
    pub cache_read_input_tokens: u64,
}

/// A request of the CLI. `request` is kept raw: its `subtype` says what it is, and a
/// request the host cannot read must still be answered (by its id), never left waiting.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ControlRequest {
    pub request_id: String,
    pub request: Value,
}

impl ControlRequest {
    pub fn subtype(&self) -> &str {
        self.request
            .get("subtype")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }
}

/// The `request` of a `can_use_tool` control request: may the tool run?
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CanUseTool {
    pub tool_name: String,
    #[serde(default)]
    pub input: Value,
    #[serde(default)]
    pub tool_use_id: Option<String>,
    /// Why Claude Code asks, when a rule says (`Path is outside allowed working
    /// directories`).
    #[serde(default)]
    pub decision_reason: Option<String>,
}

impl CanUseTool {
    pub const SUBTYPE: &'static str = "can_use_tool";
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ControlResponseLine {
    pub response: ControlResponse,
}

/// The CLI's answer to a control request of the host.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ControlResponse {
    /// `success` or `error`.
    pub subtype: String,
    pub request_id: String,
    #[serde(default)]
    pub response: Value,
    #[serde(default)]
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ControlCancel {
    pub request_id: String,
}

/// One stdin line for the CLI.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Input {
    /// Starts a turn.
    User {
        message: UserInput,
    },
    ControlRequest {
        request_id: String,
        request: HostRequest,
    },
    ControlResponse {
        response: ControlReply,
    },
}

impl Input {
    pub fn user(text: impl Into<String>) -> Input {
        Input::User {
            message: UserInput {
                role: "user",
                content: text.into(),
            },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UserInput {
    pub role: &'static str,
    pub content: String,
}

/// A request of the host. (A bare `{"subtype": "interrupt"}` line is ignored by the
/// CLI: it must come as a full control request.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "subtype", rename_all = "snake_case")]
pub enum HostRequest {
    /// Answered with the session's commands, agents and models.
    Initialize,
    /// Stops the running turn: it ends with a `result` of subtype
    /// `error_during_execution`.
    Interrupt,
}

/// The host's answer to a control request of the CLI.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "subtype", rename_all = "snake_case")]
pub enum ControlReply {
    Success {
        request_id: String,
        response: PermissionResult,
    },
    Error {
        request_id: String,
        error: String,
    },
}

/// The answer to `can_use_tool`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "behavior", rename_all = "snake_case")]
pub enum PermissionResult {
    /// Run the tool with this input (the one asked about, unchanged).
    Allow {
        #[serde(rename = "updatedInput")]
        updated_input: Value,
    },
    /// Do not run it; the model gets `message` as the tool's error. With `interrupt`, the
    /// turn also ends.
    Deny {
        message: String,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        interrupt: bool,
    },
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    #[test]
    fn inputs_have_the_shapes_the_cli_takes() {
        let cases = [
            (
                Input::user("hi"),
                json!({"type": "user", "message": {"role": "user", "content": "hi"}}),
            ),
            (
                Input::ControlRequest {
                    request_id: "r1".into(),
                    request: HostRequest::Interrupt,
                },
                json!({"type": "control_request", "request_id": "r1", "request": {"subtype": "interrupt"}}),
            ),
            (
                Input::ControlResponse {
                    response: ControlReply::Success {
                        request_id: "r2".into(),
                        response: PermissionResult::Allow {
                            updated_input: json!({"command": "ls"}),
                        },
                    },
                },
                json!({"type": "control_response", "response": {"subtype": "success", "request_id": "r2",
                    "response": {"behavior": "allow", "updatedInput": {"command": "ls"}}}}),
            ),
            (
                Input::ControlResponse {
                    response: ControlReply::Success {
                        request_id: "r3".into(),
                        response: PermissionResult::Deny {
                            message: "no".into(),
                            interrupt: false,
                        },
                    },
                },
                json!({"type": "control_response", "response": {"subtype": "success", "request_id": "r3",
                    "response": {"behavior": "deny", "message": "no"}}}),
            ),
            (
                Input::ControlResponse {
                    response: ControlReply::Error {
                        request_id: "r4".into(),
                        error: "nope".into(),
                    },
                },
                json!({"type": "control_response", "response": {"subtype": "error", "request_id": "r4", "error": "nope"}}),
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(serde_json::to_value(&input).unwrap(), expected);
        }
    }

    #[test]
    fn unknown_types_decode_as_other() {
        let line: Line = serde_json::from_str(r#"{"type":"rate_limit_event","x":1}"#).unwrap();
        assert_eq!(line, Line::Other);
        let line: Line = serde_json::from_str(
            r#"{"type":"stream_event","event":{"type":"content_block_start","index":2,"content_block":{"type":"server_tool_use","id":"s"}}}"#,
        )
        .unwrap();
        assert_eq!(
            line,
            Line::StreamEvent(StreamEventLine {
                event: StreamEvent::ContentBlockStart {
                    index: 2,
                    content_block: ContentBlock::Other
                },
                parent_tool_use_id: None,
            })
        );
    }
}
