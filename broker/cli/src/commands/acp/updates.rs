//! A flight's updates as ACP `session/update`s ([`Translator`]): text deltas as
//! `agent_message_chunk`, reasoning as `agent_thought_chunk`, commands, file changes and
//! tool calls as `tool_call` then `tool_call_update` (their output as it comes, at
//! most every [`OUTPUT_EVERY`], and their end), a plan as `plan`.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use relay_protocol::acp::{
    ContentBlock, ContentChunk, Plan, PlanEntry, SessionUpdate, ToolCall, ToolCallContent,
    ToolCallStatus, ToolCallUpdate, ToolKind,
};
use relay_protocol::domain::{FlightChange, ItemKind, ItemPhase};
use serde_json::json;

/// The most of a command's output a tool call shows (its last bytes): each output
/// update resends the whole content, as ACP's `tool_call_update` replaces it.
const TOOL_OUTPUT: usize = 64 << 10;

/// The least time between two output updates of one tool call (the rest of its output
/// waits for the next, or for [`Translator::flush`]): each resends up to
/// [`TOOL_OUTPUT`], so one per chunk would send megabytes a second of a chatty command.
pub(super) const OUTPUT_EVERY: Duration = Duration::from_millis(250);

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
    /// The tool calls shown so far, by item id.
    tools: HashMap<String, Tool>,
    /// The editor's last message is ours, with text, and nothing (a tool call) came
    /// after it: a new message's text would be appended to it.
    text_open: bool,
    /// A new message of the agent started since the last text: its text begins a new
    /// paragraph when it is appended.
    new_message: bool,
}

/// A tool call shown: its output (its last [`TOOL_OUTPUT`] bytes), when that was last
/// sent, and whether some of it was not.
#[derive(Default)]
struct Tool {
    output: String,
    sent: Option<Instant>,
    held: bool,
}

impl Tool {
    fn output_update(&mut self, id: &str, now: Instant) -> SessionUpdate {
        self.sent = Some(now);
        self.held = false;
        SessionUpdate::ToolCallUpdate(ToolCallUpdate {
            tool_call_id: id.to_string(),
            status: Some(ToolCallStatus::InProgress),
            content: Some(vec![text_content(&self.output)]),
            ..Default::default()
        })
    }

    fn due(&self, now: Instant) -> bool {
        self.sent.is_none_or(|at| now >= at + OUTPUT_EVERY)
    }
}

impl Translator {
    /// The output held back ([`OUTPUT_EVERY`]) of each tool call whose time has come.
    pub fn flush(&mut self) -> Vec<SessionUpdate> {
        self.flush_if(|t, now| t.due(now))
    }

    /// All the output held back, due or not: the flight ended (a command it stopped
    /// never completes, so nothing else would show it).
    pub fn flush_all(&mut self) -> Vec<SessionUpdate> {
        self.flush_if(|_, _| true)
    }

    fn flush_if(&mut self, due: impl Fn(&Tool, Instant) -> bool) -> Vec<SessionUpdate> {
        let now = Instant::now();
        self.tools
            .iter_mut()
            .filter(|(_, t)| t.held && due(t, now))
            .map(|(id, t)| t.output_update(id, now))
            .collect()
    }

    pub fn apply(&mut self, change: &FlightChange) -> Vec<SessionUpdate> {
        match change {
            FlightChange::Delta { text } if !text.is_empty() => {
                self.streamed = true;
                let text = if self.text_open && self.new_message {
                    format!("\n\n{text}")
                } else {
                    text.clone()
                };
                self.text_open = true;
                self.new_message = false;
                vec![agent_text(&text)]
            }
            FlightChange::Item {
                item_id,
                item_kind,
                phase,
                text,
                ..
            } => self.item(item_id, item_kind, *phase, text.as_deref()),
            FlightChange::CommandOutput { item_id, text } => {
                let tool = self.tools.entry(item_id.clone()).or_default();
                let output = &mut tool.output;
                output.push_str(text);
                if output.len() > TOOL_OUTPUT {
                    let mut cut = output.len() - TOOL_OUTPUT;
                    while !output.is_char_boundary(cut) {
                        cut += 1;
                    }
                    output.drain(..cut);
                }
                let now = Instant::now();
                if tool.due(now) {
                    vec![tool.output_update(item_id, now)]
                } else {
                    tool.held = true;
                    Vec::new()
                }
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
            ItemKind::AgentMessage => {
                if phase == ItemPhase::Started {
                    self.new_message = true;
                }
                return Vec::new();
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
                self.tools.insert(id.to_string(), Tool::default());
                self.text_open = false;
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
                let output = self.tools.remove(id).map(|t| t.output);
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
                    self.text_open = false;
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
            text: text.map(Into::into),
            exit_code: None,
        }
    }

    fn kinds(updates: &[SessionUpdate]) -> Vec<Value> {
        updates
            .iter()
            .map(|u| to_value(u)["sessionUpdate"].clone())
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_flight_reads_as_chunks_thoughts_and_tool_calls() {
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
            FlightChange::Usage(relay_protocol::domain::TokenUsage::new(1, 2)),
        ] {
            all.extend(tr.apply(&change));
            // Output as slow as a person reads it is shown as it comes.
            tokio::time::advance(OUTPUT_EVERY).await;
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

    /// The output updates `updates` carries, as the text each shows.
    fn outputs(updates: &[SessionUpdate]) -> Vec<String> {
        updates
            .iter()
            .map(to_value)
            .filter(|v| v["sessionUpdate"] == "tool_call_update" && v["status"] == "in_progress")
            .map(|v| {
                v["content"][0]["content"]["text"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_command_that_prints_fast_is_shown_at_most_a_few_times_a_second() {
        // Each output update resends the whole output shown (up to TOOL_OUTPUT): one
        // per chunk would send chunks x 64 KiB for a command that prints a lot.
        let mut tr = Translator::default();
        tr.apply(&item(
            "c",
            ItemKind::CommandExecution,
            ItemPhase::Started,
            Some("yes"),
        ));
        let chunk = "y\n".repeat(512);
        let mut shown = Vec::new();
        for _ in 0..1000 {
            shown.extend(outputs(&tr.apply(&FlightChange::CommandOutput {
                item_id: "c".into(),
                text: chunk.clone(),
            })));
        }
        assert_eq!(
            shown.len(),
            1,
            "the first chunk at once, the rest held back"
        );
        assert_eq!(shown[0], chunk);
        assert!(outputs(&tr.flush()).is_empty(), "too early");
        tokio::time::advance(OUTPUT_EVERY).await;
        let held = outputs(&tr.flush());
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].len(), TOOL_OUTPUT);
        assert!(tr.flush().is_empty(), "nothing new");
        // Held at the flight's end (a command it stopped): shown then.
        tr.apply(&FlightChange::CommandOutput {
            item_id: "c".into(),
            text: "last\n".into(),
        });
        let last = outputs(&tr.flush_all());
        assert_eq!(last.len(), 1);
        assert!(
            last[0].ends_with("y\nlast\n"),
            "{}",
            &last[0][last[0].len() - 10..]
        );
        // The end shows all of it, whenever it comes.
        let done = tr.apply(&item(
            "c",
            ItemKind::CommandExecution,
            ItemPhase::Completed,
            Some("yes"),
        ));
        assert_eq!(to_value(&done[0])["status"], "completed");
        assert_eq!(
            to_value(&done[0])["content"][0]["content"]["text"]
                .as_str()
                .unwrap()
                .len(),
            TOOL_OUTPUT
        );
    }

    #[test]
    fn two_messages_in_a_row_stay_two_paragraphs() {
        // An editor appends agent_message_chunks to one message until something else
        // (a tool call) comes between: two of the agent's messages in a row would run
        // together ("I'll look.Done.").
        let mut tr = Translator::default();
        let mut all = Vec::new();
        for change in [
            item("m1", ItemKind::AgentMessage, ItemPhase::Started, None),
            FlightChange::Delta {
                text: "I'll look.".into(),
            },
            item("m1", ItemKind::AgentMessage, ItemPhase::Completed, None),
            item("r", ItemKind::Reasoning, ItemPhase::Started, None),
            item("m2", ItemKind::AgentMessage, ItemPhase::Started, None),
            FlightChange::Delta {
                text: "Done.".into(),
            },
        ] {
            all.extend(tr.apply(&change));
        }
        let text: String = all
            .iter()
            .map(|u| to_value(u)["content"]["text"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(text, "I'll look.\n\nDone.");
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
