//! A flight's updates as ACP `session/update`s ([`Translator`]): text deltas as
//! `agent_message_chunk`, reasoning as `agent_thought_chunk`, commands, file changes and
//! tool calls as `tool_call` then `tool_call_update` (their output as it comes, and
//! their end), a plan as `plan`.

use std::collections::HashMap;

use relay_protocol::acp::{
    ContentBlock, ContentChunk, Plan, PlanEntry, SessionUpdate, ToolCall, ToolCallContent,
    ToolCallStatus, ToolCallUpdate, ToolKind,
};
use relay_protocol::domain::{FlightChange, ItemKind, ItemPhase};
use serde_json::json;

/// The most of a command's output a tool call shows (its last bytes): each output
/// update resends the whole content, as ACP's `tool_call_update` replaces it.
const TOOL_OUTPUT: usize = 64 << 10;

pub(super) fn agent_text(text: &str) -> SessionUpdate {
    SessionUpdate::AgentMessageChunk(ContentChunk {
        content: ContentBlock::text(text),
        message_id: None,
        meta: None,
    })
}

/// A flight's updates as ACP session updates.
#[derive(Default)]
pub(super) struct Translator {
    /// Text was streamed (a delta): the final reply need not be sent again.
    pub streamed: bool,
    /// The tool calls shown so far, by item id, with their output (its last
    /// [`TOOL_OUTPUT`] bytes).
    tools: HashMap<String, String>,
}

impl Translator {
    pub fn apply(&mut self, change: &FlightChange) -> Vec<SessionUpdate> {
        match change {
            FlightChange::Delta { text } if !text.is_empty() => {
                self.streamed = true;
                vec![agent_text(text)]
            }
            FlightChange::Item {
                item_id,
                item_kind,
                phase,
                text,
            } => self.item(item_id, item_kind, *phase, text.as_deref()),
            FlightChange::CommandOutput { item_id, text } => {
                let output = self.tools.entry(item_id.clone()).or_default();
                output.push_str(text);
                if output.len() > TOOL_OUTPUT {
                    let mut cut = output.len() - TOOL_OUTPUT;
                    while !output.is_char_boundary(cut) {
                        cut += 1;
                    }
                    output.drain(..cut);
                }
                vec![SessionUpdate::ToolCallUpdate(ToolCallUpdate {
                    tool_call_id: item_id.clone(),
                    status: Some(ToolCallStatus::InProgress),
                    content: Some(vec![text_content(output)]),
                    ..Default::default()
                })]
            }
            FlightChange::Plan { text } => vec![SessionUpdate::Plan(plan(text))],
            // Not shown: a diff (the file change's tool call says what changed), usage
            // (ACP's is the context window's fill), notes, sessions, other states.
            _ => Vec::new(),
        }
    }

    fn item(
        &mut self,
        id: &str,
        kind: &ItemKind,
        phase: ItemPhase,
        text: Option<&str>,
    ) -> Vec<SessionUpdate> {
        let text = text.filter(|t| !t.is_empty());
        let tool_kind = match kind {
            ItemKind::Reasoning => {
                return match (phase, text) {
                    (ItemPhase::Completed, Some(t)) => {
                        vec![SessionUpdate::AgentThoughtChunk(ContentChunk {
                            content: ContentBlock::text(t),
                            message_id: None,
                            meta: None,
                        })]
                    }
                    _ => Vec::new(),
                };
            }
            ItemKind::CommandExecution => ToolKind::Execute,
            ItemKind::FileChange => ToolKind::Edit,
            ItemKind::ToolCall => ToolKind::Other,
            // Messages stream as deltas; a plan comes as its own change; a kind Relay
            // has no name for is not claimed to be a tool.
            _ => return Vec::new(),
        };
        let title = text.unwrap_or(kind.as_str()).to_string();
        let raw_input = (tool_kind == ToolKind::Execute)
            .then(|| text.map(|t| json!({ "command": t })))
            .flatten();
        let known = self.tools.contains_key(id);
        match phase {
            ItemPhase::Started if !known => {
                self.tools.insert(id.to_string(), String::new());
                vec![SessionUpdate::ToolCall(ToolCall {
                    tool_call_id: id.to_string(),
                    title,
                    kind: tool_kind,
                    status: ToolCallStatus::InProgress,
                    content: Vec::new(),
                    locations: Vec::new(),
                    raw_input,
                    raw_output: None,
                    meta: None,
                })]
            }
            ItemPhase::Started => Vec::new(),
            ItemPhase::Completed => {
                let output = self.tools.remove(id);
                let content: Vec<ToolCallContent> = output
                    .as_deref()
                    .filter(|o| !o.is_empty())
                    .map(|o| vec![text_content(o)])
                    .unwrap_or_default();
                let raw_output = output
                    .as_deref()
                    .filter(|o| !o.is_empty())
                    .map(|o| json!({ "output": o }));
                if output.is_none() {
                    // Completed without a start seen: the whole call at once.
                    return vec![SessionUpdate::ToolCall(ToolCall {
                        tool_call_id: id.to_string(),
                        title,
                        kind: tool_kind,
                        status: ToolCallStatus::Completed,
                        content,
                        locations: Vec::new(),
                        raw_input,
                        raw_output,
                        meta: None,
                    })];
                }
                vec![SessionUpdate::ToolCallUpdate(ToolCallUpdate {
                    tool_call_id: id.to_string(),
                    title: text.map(str::to_string),
                    status: Some(ToolCallStatus::Completed),
                    content: (!content.is_empty()).then_some(content),
                    raw_output,
                    ..Default::default()
                })]
            }
        }
    }
}

fn text_content(text: &str) -> ToolCallContent {
    ToolCallContent::Content {
        content: ContentBlock::text(text),
    }
}

/// A plan's text as ACP plan entries: Codex's `[x]`/`[>]`/`[ ]` steps by their marks;
/// a plan without marks, each line as a pending entry.
fn plan(text: &str) -> Plan {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let marked = |l: &str| -> Option<(&'static str, String)> {
        [
            ("[x]", "completed"),
            ("[>]", "in_progress"),
            ("[ ]", "pending"),
        ]
        .into_iter()
        .find_map(|(mark, status)| {
            l.strip_prefix(mark)
                .map(|rest| (status, rest.trim().to_string()))
        })
    };
    let any_marked = lines.iter().any(|l| marked(l).is_some());
    let entries = lines
        .iter()
        .filter_map(|l| match marked(l) {
            Some((status, content)) => Some((status, content)),
            None if !any_marked => Some(("pending", l.to_string())),
            None => None,
        })
        .map(|(status, content)| PlanEntry {
            content,
            priority: "medium".into(),
            status: status.into(),
        })
        .collect();
    Plan { entries }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::super::to_value;
    use super::*;
    use serde_json::Value;

    fn item(id: &str, kind: ItemKind, phase: ItemPhase, text: Option<&str>) -> FlightChange {
        FlightChange::Item {
            item_id: id.into(),
            item_kind: kind,
            phase,
            text: text.map(str::to_string),
        }
    }

    fn kinds(updates: &[SessionUpdate]) -> Vec<Value> {
        updates
            .iter()
            .map(|u| to_value(u)["sessionUpdate"].clone())
            .collect()
    }

    #[test]
    fn a_flight_reads_as_chunks_thoughts_and_tool_calls() {
        let mut tr = Translator::default();
        let mut all = Vec::new();
        for change in [
            item("r", ItemKind::Reasoning, ItemPhase::Started, None),
            item(
                "r",
                ItemKind::Reasoning,
                ItemPhase::Completed,
                Some("think"),
            ),
            item(
                "c",
                ItemKind::CommandExecution,
                ItemPhase::Started,
                Some("ls"),
            ),
            FlightChange::CommandOutput {
                item_id: "c".into(),
                text: "a\n".into(),
            },
            FlightChange::CommandOutput {
                item_id: "c".into(),
                text: "b\n".into(),
            },
            item(
                "c",
                ItemKind::CommandExecution,
                ItemPhase::Completed,
                Some("ls"),
            ),
            item("m", ItemKind::AgentMessage, ItemPhase::Started, None),
            FlightChange::Delta { text: "Hi ".into() },
            FlightChange::Delta {
                text: "there".into(),
            },
            item(
                "m",
                ItemKind::AgentMessage,
                ItemPhase::Completed,
                Some("Hi there"),
            ),
            FlightChange::Usage {
                input_tokens: 1,
                output_tokens: 2,
            },
        ] {
            all.extend(tr.apply(&change));
        }
        assert_eq!(
            kinds(&all),
            vec![
                "agent_thought_chunk",
                "tool_call",
                "tool_call_update",
                "tool_call_update",
                "tool_call_update",
                "agent_message_chunk",
                "agent_message_chunk"
            ]
        );
        assert!(tr.streamed);
        let call = to_value(&all[1]);
        assert_eq!(call["kind"], "execute");
        assert_eq!(call["status"], "in_progress");
        assert_eq!(call["rawInput"]["command"], "ls");
        // The output so far, whole, each time; then the end with all of it.
        assert_eq!(to_value(&all[3])["content"][0]["content"]["text"], "a\nb\n");
        let done = to_value(&all[4]);
        assert_eq!(done["status"], "completed");
        assert_eq!(done["rawOutput"]["output"], "a\nb\n");
        assert_eq!(to_value(&all[6])["content"]["text"], "there");
    }

    #[test]
    fn a_tool_completed_unseen_is_shown_whole_and_output_is_kept_to_its_tail() {
        let mut tr = Translator::default();
        let u = tr.apply(&item(
            "f",
            ItemKind::FileChange,
            ItemPhase::Completed,
            Some("add a.rs"),
        ));
        let v = to_value(&u[0]);
        assert_eq!(
            (&v["sessionUpdate"], &v["kind"], &v["status"], &v["title"]),
            (
                &json!("tool_call"),
                &json!("edit"),
                &json!("completed"),
                &json!("add a.rs")
            )
        );
        tr.apply(&item(
            "c",
            ItemKind::CommandExecution,
            ItemPhase::Started,
            Some("yes"),
        ));
        let big = "é".repeat(TOOL_OUTPUT);
        let u = tr.apply(&FlightChange::CommandOutput {
            item_id: "c".into(),
            text: big,
        });
        let shown = to_value(&u[0])["content"][0]["content"]["text"]
            .as_str()
            .unwrap()
            .len();
        assert!(shown <= TOOL_OUTPUT && shown > TOOL_OUTPUT - 4, "{shown}");
        // Unknown kinds are no tool calls.
        assert!(tr
            .apply(&item(
                "x",
                ItemKind::Other("imageView".into()),
                ItemPhase::Started,
                None
            ))
            .is_empty());
    }

    #[test]
    fn plans_read_by_their_marks() {
        let p = to_value(plan("Why\n[x] one\n[>] two\n[ ] three"));
        assert_eq!(
            p["entries"],
            json!([
                {"content": "one", "priority": "medium", "status": "completed"},
                {"content": "two", "priority": "medium", "status": "in_progress"},
                {"content": "three", "priority": "medium", "status": "pending"},
            ])
        );
        let p = to_value(plan("first\n\nsecond"));
        assert_eq!(p["entries"][1]["content"], "second");
        assert_eq!(p["entries"][1]["status"], "pending");
    }
}
