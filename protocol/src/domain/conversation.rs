//! Conversations and the messages posted to them.

use serde::{Deserialize, Serialize};

use super::Harness;
use crate::names::wire_enum;

wire_enum! {
    pub enum ConversationKind("conversation kind") {
        Channel = "channel",
        Direct = "direct",
        Group = "group",
        Thread = "thread",
        System = "system",
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConversationSpec {
    pub id: String,
    pub kind: ConversationKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub participants: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conversation {
    #[serde(flatten)]
    pub spec: ConversationSpec,
    pub created_at: u64,
    /// Number of messages posted so far; also the next message's index.
    pub message_count: u64,
}

/// The conversation every broker starts with; `relay send` posts here by default.
pub const DEFAULT_CONVERSATION: &str = "channel.shared";

wire_enum! {
    /// `agent` is a conversational message from any actor (person or agent); the others
    /// are machine-made.
    #[derive(Default)]
    pub enum MessageClass("message class") {
        #[default]
        Agent = "agent",
        Status = "status",
        System = "system",
        Log = "log",
        Artifact = "artifact",
    }
}

/// Links from a message to the work it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MessageMeta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flight: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harness: Option<Harness>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
}

impl MessageMeta {
    pub fn is_empty(&self) -> bool {
        self == &MessageMeta::default()
    }
}

/// What a client sends to post a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PostMessage {
    pub conversation: String,
    /// Absent, it is empty: over HTTP refused (a message names its author), on the bus
    /// the bus's own name (`nats`).
    #[serde(default)]
    pub author: String,
    pub body: super::SharedStr,
    #[serde(default)]
    pub class: MessageClass,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    #[serde(default, skip_serializing_if = "MessageMeta::is_empty")]
    pub meta: MessageMeta,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub id: String,
    pub conversation: String,
    /// Position in its conversation, from 0.
    pub index: u64,
    pub author: String,
    pub class: MessageClass,
    pub body: super::SharedStr,
    /// The names its text mentions (not in code or quoted), in order, once each:
    /// [`super::parse_mentions`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mentions: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    #[serde(default, skip_serializing_if = "MessageMeta::is_empty")]
    pub meta: MessageMeta,
    pub created_at: u64,
}

/// `true` when `id` is a valid conversation id: 1..=200 bytes of dot-separated tokens,
/// each one or more of `[A-Za-z0-9_-]` (`channel.shared`, `direct.operator.codex-1`).
/// Ids are the tail of the conversation's NATS subject, so each token is a subject token.
pub fn valid_conversation_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 200
        && id.split('.').all(|token| {
            !token.is_empty()
                && token
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// `name` as one conversation-id token: every byte outside `[A-Za-z0-9_-]` becomes `_`
/// (an actor named `ci bot` talks to agents in `direct.ci_bot.<agent>`).
pub fn id_token(name: &str) -> String {
    let token: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if token.is_empty() {
        "_".to_string()
    } else {
        token
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversation_ids_are_subject_tokens() {
        for ok in ["channel.shared", "direct.operator.codex-1", "a", "x_y-z.1"] {
            assert!(valid_conversation_id(ok), "{ok}");
        }
        let long = "a".repeat(201);
        for bad in [
            "",
            "a..b",
            ".a",
            "a.",
            "a b",
            "a*",
            "a.>",
            "a\0b",
            "é",
            long.as_str(),
        ] {
            assert!(!valid_conversation_id(bad), "{bad:?}");
        }
        assert_eq!(id_token("ci bot.v2"), "ci_bot_v2");
        assert_eq!(id_token(""), "_");
        assert!(valid_conversation_id(&format!(
            "direct.{}.x",
            id_token("wé ird*")
        )));
    }
}
