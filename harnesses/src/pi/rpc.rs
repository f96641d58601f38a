//! Pi's RPC stdout as Relay reads it (pi 0.73.1, `docs/rpc.md` of its package): the
//! lines the wire acts on, with only the fields it uses. Every other `type` is
//! [`Line::Other`]; unknown fields are ignored.

use serde::Deserialize;
use serde_json::{json, Value};

/// One stdout line.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum Line {
    /// The answer to a command; `id` is the command's (absent when pi could not read it).
    Response {
        id: Option<String>,
        command: String,
        success: bool,
        data: Option<Value>,
        error: Option<String>,
    },
    AgentStart,
    /// A run ended; `messages` are the ones it added.
    AgentEnd {
        #[serde(default)]
        messages: Vec<Message>,
    },
    MessageStart {
        message: Message,
    },
    MessageUpdate {
        #[serde(rename = "assistantMessageEvent")]
        event: BlockEvent,
    },
    MessageEnd {
        message: Message,
    },
    #[serde(rename_all = "camelCase")]
    ToolExecutionStart {
        tool_call_id: String,
        tool_name: String,
        #[serde(default)]
        args: Value,
    },
    #[serde(rename_all = "camelCase")]
    ToolExecutionUpdate {
        tool_call_id: String,
        #[serde(default)]
        partial_result: ToolResult,
    },
    #[serde(rename_all = "camelCase")]
    ToolExecutionEnd {
        tool_call_id: String,
        tool_name: String,
        #[serde(default)]
        result: ToolResult,
        #[serde(default)]
        is_error: bool,
    },
    /// After an `agent_end` with a retryable error: pi runs again after `delayMs`.
    #[serde(rename_all = "camelCase")]
    AutoRetryStart {
        attempt: u32,
        max_attempts: u32,
        #[serde(default)]
        error_message: String,
    },
    /// Retrying is over; `success: false` when pi gave up (or the retry was aborted).
    #[serde(rename_all = "camelCase")]
    AutoRetryEnd {
        success: bool,
        final_error: Option<String>,
    },
    /// `reason: "overflow"` after an `agent_end` whose error was a context overflow: pi
    /// compacts, then runs again if `compaction_end` says `willRetry`.
    CompactionStart {
        #[serde(default)]
        reason: String,
    },
    #[serde(rename_all = "camelCase")]
    CompactionEnd {
        #[serde(default)]
        reason: String,
        #[serde(default)]
        will_retry: bool,
        error_message: Option<String>,
    },
    #[serde(rename_all = "camelCase")]
    ExtensionError {
        #[serde(default)]
        extension_path: String,
        #[serde(default)]
        error: String,
    },
    ExtensionUiRequest {
        id: String,
        method: String,
        #[serde(default)]
        title: String,
    },
    #[serde(other)]
    Other,
}

/// An `AgentMessage`: user, assistant or tool result.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Message {
    #[serde(default)]
    pub role: String,
    /// A string (user) or content blocks (`text`, `thinking`, `toolCall`...).
    #[serde(default)]
    pub content: Value,
    pub stop_reason: Option<String>,
    pub error_message: Option<String>,
    pub usage: Option<Usage>,
    /// The model that answered (an assistant message's).
    #[serde(default)]
    pub model: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Usage {
    #[serde(default)]
    pub input: u64,
    #[serde(default)]
    pub output: u64,
    #[serde(default)]
    pub cache_read: u64,
    #[serde(default)]
    pub cache_write: u64,
    /// Pi's price of these tokens, from the model's `cost` in `models.json` (all zero
    /// when it has none).
    #[serde(default)]
    pub cost: Option<Cost>,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct Cost {
    /// US dollars.
    #[serde(default)]
    pub total: f64,
}

/// `assistantMessageEvent` of a `message_update`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct BlockEvent {
    /// `text_start|text_delta|text_end`, `thinking_*`, `toolcall_*`...
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub content_index: usize,
    pub delta: Option<String>,
    /// The block's whole text, on `text_end` and `thinking_end`.
    pub content: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct ToolResult {
    #[serde(default)]
    pub content: Value,
}

impl Message {
    pub fn is_assistant(&self) -> bool {
        self.role == "assistant"
    }

    /// The text of its `text` blocks.
    pub fn text(&self) -> String {
        match &self.content {
            Value::String(s) => s.clone(),
            content => blocks_text(content, |b| b.get("type") == Some(&json!("text"))),
        }
    }

    /// The text of block `index` (`text` or `thinking`).
    pub fn block_text(&self, index: usize) -> String {
        let block = self.content.get(index);
        let field = |key| block.and_then(|b| b.get(key)).and_then(Value::as_str);
        field("text")
            .or(field("thinking"))
            .unwrap_or_default()
            .to_string()
    }
}

impl ToolResult {
    pub fn text(&self) -> String {
        blocks_text(&self.content, |_| true)
    }
}

/// The `text` of the blocks of `content` that `keep` selects, concatenated.
fn blocks_text(content: &Value, keep: impl Fn(&Value) -> bool) -> String {
    content
        .as_array()
        .map(|blocks| {
            blocks
                .iter()
                .filter(|b| keep(b))
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default()
}
