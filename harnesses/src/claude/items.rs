//! A turn's content as items, for the wire: the model's text, thinking and tool-use
//! blocks (streamed as `stream_event`s, or whole in an `assistant` line when Claude Code
//! fell back to a request without streaming) and the tool results (`user` lines) become
//! `ItemStarted`, `TextDelta` and `ItemCompleted`. Also what a tool call says in an
//! approval request. No I/O.

use std::collections::{HashMap, HashSet};

use super::stream_json::{CanUseTool, Content, ContentBlock, Delta, MessageLine, StreamEvent};
use relay_protocol::domain::ApprovalKind;
use relay_protocol::harness::{HarnessEvent, ItemKind};
use serde_json::Value;

use crate::stdio::Action;

/// The items of one turn.
pub(super) struct Items {
    turn_id: String,
    /// The message being streamed (`message_start`).
    message: String,
    /// Messages seen through `stream_event`s; the others are read from their
    /// `assistant` lines.
    streamed: HashSet<String>,
    /// Blocks read from `assistant` lines so far, per message, for their item ids.
    unstreamed: HashMap<String, usize>,
    /// Open blocks of the streamed message, by index.
    blocks: HashMap<u64, Block>,
    /// Tool calls started and not yet answered, by tool use id.
    tools: HashMap<String, Tool>,
}

enum Block {
    Text { item_id: String, text: String },
    Thinking { item_id: String, text: String },
    Tool { id: String, json: String },
}

struct Tool {
    name: String,
    kind: ItemKind,
    input: Value,
}

impl Items {
    pub(super) fn new(turn_id: &str) -> Self {
        Self {
            turn_id: turn_id.to_string(),
            message: String::new(),
            streamed: HashSet::new(),
            unstreamed: HashMap::new(),
            blocks: HashMap::new(),
            tools: HashMap::new(),
        }
    }

    fn event(&self, out: &mut Vec<Action>, event: impl FnOnce(String) -> HarnessEvent) {
        out.push(Action::Event(event(self.turn_id.clone())));
    }

    /// A block begins: its item starts (text and thinking: `<message id>:<index>`; a
    /// tool call: its tool use id).
    fn start(
        &mut self,
        item_id: String,
        block: ContentBlock,
        out: &mut Vec<Action>,
    ) -> Option<Block> {
        let (kind, block) = match block {
            ContentBlock::Text { text } => (
                ItemKind::AgentMessage,
                Block::Text {
                    item_id: item_id.clone(),
                    text,
                },
            ),
            ContentBlock::Thinking { thinking } => (
                ItemKind::Reasoning,
                Block::Thinking {
                    item_id: item_id.clone(),
                    text: thinking,
                },
            ),
            ContentBlock::ToolUse { id, name, input } => {
                let kind = tool_kind(&name);
                self.tools.insert(
                    id.clone(),
                    Tool {
                        name,
                        kind: kind.clone(),
                        input,
                    },
                );
                self.event(out, |turn_id| HarnessEvent::ItemStarted {
                    turn_id,
                    item_id: id.clone(),
                    kind,
                });
                return Some(Block::Tool {
                    id,
                    json: String::new(),
                });
            }
            ContentBlock::ToolResult { .. } | ContentBlock::Other => return None,
        };
        self.event(out, |turn_id| HarnessEvent::ItemStarted {
            turn_id,
            item_id,
            kind,
        });
        Some(block)
    }

    pub(super) fn stream_event(&mut self, event: StreamEvent, out: &mut Vec<Action>) {
        match event {
            StreamEvent::MessageStart { message } => {
                self.streamed.insert(message.id.clone());
                self.message = message.id;
                self.blocks.clear();
            }
            StreamEvent::ContentBlockStart {
                index,
                content_block,
            } => {
                let item_id = format!("{}:{index}", self.message);
                if let Some(block) = self.start(item_id, content_block, out) {
                    self.blocks.insert(index, block);
                }
            }
            StreamEvent::ContentBlockDelta { index, delta } => {
                match (self.blocks.get_mut(&index), delta) {
                    (Some(Block::Text { item_id, text }), Delta::TextDelta { text: delta }) => {
                        text.push_str(&delta);
                        let item_id = item_id.clone();
                        self.event(out, |turn_id| HarnessEvent::TextDelta {
                            turn_id,
                            item_id,
                            delta,
                        });
                    }
                    (Some(Block::Thinking { text, .. }), Delta::ThinkingDelta { thinking }) => {
                        text.push_str(&thinking);
                    }
                    (Some(Block::Tool { json, .. }), Delta::InputJsonDelta { partial_json }) => {
                        json.push_str(&partial_json);
                    }
                    _ => {}
                }
            }
            StreamEvent::ContentBlockStop { index } => match self.blocks.remove(&index) {
                Some(Block::Tool { id, json }) => {
                    // The `assistant` line (just before) has the whole input already;
                    // the deltas are the fallback.
                    if let (Some(tool), Ok(input)) = (
                        self.tools.get_mut(&id),
                        serde_json::from_str::<Value>(&json),
                    ) {
                        if is_empty(&tool.input) {
                            tool.input = input;
                        }
                    }
                }
                Some(block) => self.complete(block, out),
                None => {}
            },
            StreamEvent::Other => {}
        }
    }

    pub(super) fn assistant(&mut self, line: MessageLine, out: &mut Vec<Action>) {
        let message = line.message.id;
        if self.streamed.contains(&message) {
            for block in line.message.content.blocks() {
                if let ContentBlock::ToolUse { id, input, .. } = block {
                    if let Some(tool) = self.tools.get_mut(id) {
                        tool.input = input.clone();
                    }
                }
            }
            return;
        }
        // Claude Code's report of a failed model request: the turn's `result` says it.
        if line.error.is_some() {
            return;
        }
        let Content::Blocks(blocks) = line.message.content else {
            return;
        };
        for block in blocks {
            let n = self.unstreamed.entry(message.clone()).or_default();
            let item_id = format!("{message}:{n}");
            *n += 1;
            if let Some(block) = self.start(item_id, block, out) {
                self.complete(block, out);
            }
        }
    }

    pub(super) fn user(&mut self, line: &MessageLine, out: &mut Vec<Action>) {
        for block in line.message.content.blocks() {
            let ContentBlock::ToolResult {
                tool_use_id,
                content,
                is_error,
            } = block
            else {
                continue;
            };
            if let Some(tool) = self.tools.remove(tool_use_id) {
                let output = tool_output(content);
                let exit_code = match tool.kind {
                    ItemKind::CommandExecution if *is_error => exit_code(&output),
                    _ => None,
                };
                let text = describe(&tool, Some((&output, *is_error)));
                let item_id = tool_use_id.clone();
                self.event(out, |turn_id| HarnessEvent::ItemCompleted {
                    turn_id,
                    item_id,
                    kind: tool.kind,
                    text: Some(text),
                    exit_code,
                });
            }
        }
    }

    /// The `ItemCompleted` of a finished (or cut short) text or thinking block; a tool
    /// call completes with its result instead.
    fn complete(&self, block: Block, out: &mut Vec<Action>) {
        let (item_id, kind, text) = match block {
            Block::Text { item_id, text } => (item_id, ItemKind::AgentMessage, text),
            Block::Thinking { item_id, text } => (item_id, ItemKind::Reasoning, text),
            Block::Tool { .. } => return,
        };
        self.event(out, |turn_id| HarnessEvent::ItemCompleted {
            turn_id,
            item_id,
            kind,
            text: Some(text),
            exit_code: None,
        });
    }

    /// The turn ended: what was started completes with what came (an interrupt cuts a
    /// stream short; a tool call may have had no result).
    pub(super) fn finish(mut self, out: &mut Vec<Action>) {
        let mut blocks: Vec<_> = self.blocks.drain().collect();
        blocks.sort_by_key(|(index, _)| *index);
        for (_, block) in blocks {
            self.complete(block, out);
        }
        let mut tools: Vec<_> = self.tools.drain().collect();
        tools.sort_by(|a, b| a.0.cmp(&b.0));
        for (item_id, tool) in tools {
            let text = describe(&tool, None);
            self.event(out, |turn_id| HarnessEvent::ItemCompleted {
                turn_id,
                item_id,
                kind: tool.kind,
                text: Some(text),
                exit_code: None,
            });
        }
    }
}

/// A failed command's exit status, from the first line of its error result: Claude
/// Code (2.1.197) says `Exit code N` there, and nothing else of it. A result that is no
/// error says nothing of a status (`None`, not a guessed 0); neither does an error of
/// another kind (a timeout, an interrupt).
fn exit_code(output: &str) -> Option<i32> {
    output
        .lines()
        .next()?
        .trim()
        .strip_prefix("Exit code ")?
        .parse()
        .ok()
}

const FILE_TOOLS: [&str; 4] = ["Edit", "Write", "MultiEdit", "NotebookEdit"];

fn tool_kind(name: &str) -> ItemKind {
    match name {
        "Bash" => ItemKind::CommandExecution,
        n if FILE_TOOLS.contains(&n) => ItemKind::FileChange,
        _ => ItemKind::ToolCall,
    }
}

pub(super) fn str_field<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(map) => map.is_empty(),
        _ => false,
    }
}

fn file_path(input: &Value) -> Option<&str> {
    str_field(input, "file_path").or_else(|| str_field(input, "notebook_path"))
}

/// What a permission prompt is about, for a person and the broker's approval policy: a
/// Bash command as the shell line that really runs (`bash -c '<command>'`, quoted with
/// `shlex`, the form the policy unwraps), a file tool's path, else the tool and its input.
pub fn approval_detail(ask: &CanUseTool) -> (ApprovalKind, String) {
    let other = || format!("{} {}", ask.tool_name, ask.input);
    match tool_kind(&ask.tool_name) {
        ItemKind::CommandExecution => match str_field(&ask.input, "command") {
            Some(command) => (
                ApprovalKind::Command,
                shlex::try_join(["bash", "-c", command])
                    // Only a NUL byte cannot be quoted; the policy never trusts this form.
                    .unwrap_or_else(|_| format!("bash -c {command:?}")),
            ),
            None => (ApprovalKind::Command, other()),
        },
        ItemKind::FileChange => (
            ApprovalKind::FileChange,
            file_path(&ask.input).map_or_else(other, str::to_string),
        ),
        _ => (ApprovalKind::Other, other()),
    }
}

/// A tool call and its output, as the item's text: `$ <command>` for Bash, `<tool>
/// <path>` for a file tool, else `<tool> <input>`; then the output (marked `error:`
/// when the tool failed or was refused).
fn describe(tool: &Tool, output: Option<(&str, bool)>) -> String {
    let call = match tool.kind {
        ItemKind::CommandExecution => str_field(&tool.input, "command").map(|c| format!("$ {c}")),
        ItemKind::FileChange => file_path(&tool.input).map(|p| format!("{} {p}", tool.name)),
        _ => None,
    }
    .unwrap_or_else(|| format!("{} {}", tool.name, tool.input));
    match output {
        None => format!("{call}\n(no result: the turn ended first)"),
        Some(("", false)) => call,
        Some((out, false)) => format!("{call}\n{out}"),
        Some((out, true)) => format!("{call}\nerror: {out}"),
    }
}

/// A tool result's content as text: a string, or the text of its blocks.
fn tool_output(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| str_field(p, "text"))
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}
