//! Codex's thread items as Relay sees them: their kind, their text, a turn's last agent
//! message and a plan's text.

use relay_protocol::harness::ItemKind;

use super::super::app_server::{self as wire, KnownThreadItem, ThreadItem};

pub(super) fn last_agent_message(items: &[ThreadItem]) -> Option<String> {
    items.iter().rev().find_map(|item| match item {
        ThreadItem::Known(KnownThreadItem::AgentMessage { text, .. }) => Some(text.clone()),
        _ => None,
    })
}

/// The kind of an item, by its Codex type: the same for an item Relay models and for one
/// that came as [`ThreadItem::Other`] because its fields did not parse (a newer Codex).
pub(super) fn item_kind(item: &ThreadItem) -> ItemKind {
    let type_name = match item {
        ThreadItem::Known(known) => known.type_name(),
        ThreadItem::Other(other) => other.item_type.as_str(),
    };
    match type_name {
        "userMessage" => ItemKind::UserMessage,
        "agentMessage" => ItemKind::AgentMessage,
        "plan" => ItemKind::Plan,
        "reasoning" => ItemKind::Reasoning,
        "commandExecution" => ItemKind::CommandExecution,
        "fileChange" => ItemKind::FileChange,
        // Tool calls, also those Relay has no fields for.
        "mcpToolCall" | "dynamicToolCall" | "webSearch" | "collabAgentToolCall" => {
            ItemKind::ToolCall
        }
        name => ItemKind::Other(name.to_string()),
    }
}

/// The text an `ItemCompleted` carries: what a person would want to see of the item.
/// A completed command's exit status (`commandExecution.exitCode`; absent while it runs,
/// or for a command that never ran: declined, failed to start).
pub(super) fn exit_code(item: &ThreadItem) -> Option<i32> {
    match item {
        ThreadItem::Known(KnownThreadItem::CommandExecution { exit_code, .. }) => {
            exit_code.and_then(|c| i32::try_from(c).ok())
        }
        _ => None,
    }
}

pub(super) fn item_text(item: &ThreadItem) -> Option<String> {
    let ThreadItem::Known(known) = item else {
        return None;
    };
    let text = match known {
        KnownThreadItem::UserMessage { content, .. } => content
            .iter()
            .filter_map(|c| match c {
                wire::UserInput::Text { text } => Some(text.as_str()),
                wire::UserInput::Other => None,
            })
            .collect::<Vec<_>>()
            .join("\n"),
        KnownThreadItem::AgentMessage { text, .. } | KnownThreadItem::Plan { text, .. } => {
            text.clone()
        }
        KnownThreadItem::Reasoning { summary, .. } => summary.join("\n"),
        KnownThreadItem::CommandExecution { command, .. } => command.clone(),
        KnownThreadItem::FileChange { changes, .. } => changes
            .iter()
            .map(|c| format!("{} {}", c.kind_name(), c.path))
            .collect::<Vec<_>>()
            .join("\n"),
        KnownThreadItem::McpToolCall { server, tool, .. } => format!("{server}.{tool}"),
        KnownThreadItem::DynamicToolCall { tool, .. } => tool.clone(),
        KnownThreadItem::WebSearch { query, .. } => query.clone(),
    };
    Some(text)
}

pub(super) fn plan_text(explanation: Option<&str>, steps: &[wire::TurnPlanStep]) -> String {
    let mut lines = Vec::new();
    if let Some(e) = explanation.filter(|e| !e.is_empty()) {
        lines.push(e.to_string());
    }
    for step in steps {
        let mark = match step.status.as_str() {
            "completed" => "[x]",
            "inProgress" => "[>]",
            _ => "[ ]",
        };
        lines.push(format!("{mark} {}", step.step));
    }
    lines.join("\n")
}
