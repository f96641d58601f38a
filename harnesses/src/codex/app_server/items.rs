//! Thread items: what a turn is made of (messages, commands, file changes, ...), known
//! types typed and the others kept as [`ThreadItem::Other`].

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::UserInput;

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
