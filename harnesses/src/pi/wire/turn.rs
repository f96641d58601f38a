//! One turn's reading of pi's events: its items (messages, blocks, tools), token usage
//! and phase, and how its run ended.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap};

use relay_protocol::harness::{HarnessEvent, ItemKind, TurnOutcome};
use serde_json::Value;

use relay_protocol::domain::{usd_to_micros, CostSource, TokenUsage};

use super::super::rpc::{BlockEvent, Line, Message, Usage};

/// Longest tool arguments shown in an item's text, in bytes.
pub(super) const ARGS_SHOWN: usize = 500;

/// The turn running: from Relay's `prompt` to pi's `agent_end`.
#[derive(Debug)]
pub(super) struct Turn {
    pub(super) id: String,
    /// The `prompt` request, until pi accepts it (a refusal ends the turn).
    pub(super) prompt: Option<String>,
    pub(super) started: bool,
    pub(super) phase: Phase,
    /// Assistant messages begun so far; the last one names its blocks' items.
    messages: u32,
    /// User messages begun so far (the prompt, then each steer): `<turn>-u<n>`.
    users: u32,
    /// Blocks of the current assistant message that are open: index -> item id, kind.
    open: BTreeMap<usize, (String, ItemKind)>,
    tools: HashMap<String, Tool>,
    /// The turn's usage so far: the sum of its assistant messages' (one per model call).
    usage: TokenUsage,
    /// The sum of the messages' costs, in US dollars (rounded once, when reported).
    cost_usd: f64,
}

/// Where a turn is after its prompt was accepted.
#[derive(Debug)]
pub(super) enum Phase {
    Running,
    /// The run ended with this error; the answer to the `get_state` request `probe`
    /// comes after any word of pi's that it runs again.
    Ending {
        outcome: TurnOutcome,
        probe: String,
    },
    /// Pi runs again (after a delay, or a compaction); its next `agent_start` goes on
    /// with the turn. `outcome` is the error it retries.
    Retrying {
        outcome: TurnOutcome,
    },
}

#[derive(Debug)]
struct Tool {
    kind: ItemKind,
    /// What was called, for the item's text.
    call: String,
    /// The output so far, as pi last showed it.
    output: String,
}

impl Turn {
    /// Adds one assistant message's usage (one model call) to the turn's, in Relay's
    /// conventions: pi's `input` is the uncached rest (as the Messages API counts), so
    /// the input is it plus the cache reads and writes, the cached part the reads. Pi's
    /// cost is kept only when it is not zero: pi prices a model it has no `cost` for at
    /// zero, which says nothing (the price table then applies).
    fn add_usage(&mut self, usage: &Usage, model: Option<&str>) {
        // Counts from the wire: a huge one saturates rather than overflow.
        let u = &mut self.usage;
        u.input_tokens = u
            .input_tokens
            .saturating_add(usage.input)
            .saturating_add(usage.cache_read)
            .saturating_add(usage.cache_write);
        u.cached_input_tokens = u.cached_input_tokens.saturating_add(usage.cache_read);
        u.output_tokens = u.output_tokens.saturating_add(usage.output);
        if let Some(model) = model.filter(|m| !m.is_empty()) {
            u.model = Some(model.to_string());
        }
        self.cost_usd += usage.cost.as_ref().map_or(0.0, |c| c.total);
        u.cost_micro_usd = usd_to_micros(self.cost_usd).filter(|&c| c > 0);
        u.cost_source = u.cost_micro_usd.map(|_| CostSource::Harness);
    }

    /// Turn `id`, prompted by request `prompt`.
    pub(super) fn new(id: &str, prompt: Option<String>) -> Turn {
        Turn {
            id: id.to_string(),
            prompt,
            started: false,
            phase: Phase::Running,
            messages: 0,
            users: 0,
            open: BTreeMap::new(),
            tools: HashMap::new(),
            usage: TokenUsage::default(),
            cost_usd: 0.0,
        }
    }
    pub(super) fn read(&mut self, line: Line, emit: &mut impl FnMut(HarnessEvent)) {
        let turn_id = self.id.clone();
        match line {
            Line::AgentStart => {
                // A retry's run goes on with the turn already started.
                self.phase = Phase::Running;
                if !self.started {
                    self.started = true;
                    emit(HarnessEvent::TurnStarted { turn_id });
                }
            }
            Line::MessageStart { message } if message.is_assistant() => {
                self.messages += 1;
                self.open.clear();
            }
            Line::MessageStart { message } if message.role == "user" => {
                self.users += 1;
                emit(HarnessEvent::ItemStarted {
                    turn_id: turn_id.clone(),
                    item_id: format!("{turn_id}-u{}", self.users),
                    kind: ItemKind::UserMessage,
                });
            }
            Line::MessageEnd { message } if message.role == "user" => {
                emit(HarnessEvent::ItemCompleted {
                    item_id: format!("{turn_id}-u{}", self.users),
                    turn_id,
                    kind: ItemKind::UserMessage,
                    text: Some(message.text()),
                    exit_code: None,
                });
            }
            Line::MessageUpdate { event } => self.block(event, emit),
            Line::MessageEnd { message } if message.is_assistant() => {
                // An aborted stream ends without its blocks' `*_end`.
                for (index, (item_id, kind)) in std::mem::take(&mut self.open) {
                    emit(HarnessEvent::ItemCompleted {
                        turn_id: turn_id.clone(),
                        item_id,
                        kind,
                        text: Some(message.block_text(index)),
                        exit_code: None,
                    });
                }
                if let Some(usage) = &message.usage {
                    self.add_usage(usage, message.model.as_deref());
                    emit(HarnessEvent::TokenUsage {
                        turn_id,
                        usage: self.usage.clone(),
                    });
                }
            }
            Line::ToolExecutionStart {
                tool_call_id,
                tool_name,
                args,
            } => {
                let kind = tool_kind(&tool_name);
                let call = describe_call(&tool_name, &args);
                self.tools.insert(
                    tool_call_id.clone(),
                    Tool {
                        kind: kind.clone(),
                        call,
                        output: String::new(),
                    },
                );
                emit(HarnessEvent::ItemStarted {
                    turn_id,
                    item_id: tool_call_id,
                    kind,
                });
            }
            Line::ToolExecutionUpdate {
                tool_call_id,
                partial_result,
            } => {
                let Some(tool) = self.tools.get_mut(&tool_call_id) else {
                    return;
                };
                let now = partial_result.text();
                let delta = output_delta(&tool.output, &now).to_string();
                tool.output = now;
                if !delta.is_empty() {
                    emit(HarnessEvent::CommandOutputDelta {
                        turn_id,
                        item_id: tool_call_id,
                        delta,
                    });
                }
            }
            Line::ToolExecutionEnd {
                tool_call_id,
                tool_name,
                result,
                is_error,
            } => {
                let tool = self.tools.remove(&tool_call_id).unwrap_or_else(|| Tool {
                    kind: tool_kind(&tool_name),
                    call: tool_name.clone(),
                    output: String::new(),
                });
                let result = result.text();
                let rest = output_delta(&tool.output, &result);
                if tool.kind == ItemKind::CommandExecution && !rest.is_empty() {
                    emit(HarnessEvent::CommandOutputDelta {
                        turn_id: turn_id.clone(),
                        item_id: tool_call_id.clone(),
                        delta: rest.to_string(),
                    });
                }
                let text = match (result.trim_end(), is_error) {
                    ("", false) => tool.call,
                    ("", true) => format!("{}\nfailed", tool.call),
                    (result, false) => format!("{}\n{result}", tool.call),
                    (result, true) => format!("{}\nfailed: {result}", tool.call),
                };
                emit(HarnessEvent::ItemCompleted {
                    turn_id,
                    item_id: tool_call_id,
                    kind: tool.kind,
                    text: Some(text),
                    exit_code: None,
                });
            }
            _ => {}
        }
    }

    /// A `message_update`: text and thinking blocks become items; tool calls are
    /// reported when pi runs them (`tool_execution_*`).
    fn block(&mut self, event: BlockEvent, emit: &mut impl FnMut(HarnessEvent)) {
        let kind = match event.kind.as_str() {
            "text_start" | "text_delta" | "text_end" => ItemKind::AgentMessage,
            "thinking_start" | "thinking_end" => ItemKind::Reasoning,
            _ => return,
        };
        let turn_id = self.id.clone();
        let index = event.content_index;
        let item_id = format!("{}-m{}-{index}", self.id, self.messages);
        if let Entry::Vacant(slot) = self.open.entry(index) {
            slot.insert((item_id.clone(), kind.clone()));
            emit(HarnessEvent::ItemStarted {
                turn_id: turn_id.clone(),
                item_id: item_id.clone(),
                kind: kind.clone(),
            });
        }
        if let Some(delta) = event.delta.filter(|_| event.kind == "text_delta") {
            emit(HarnessEvent::TextDelta {
                turn_id,
                item_id,
                delta,
            });
        } else if event.kind.ends_with("_end") {
            self.open.remove(&index);
            emit(HarnessEvent::ItemCompleted {
                turn_id,
                item_id,
                kind,
                text: event.content,
                exit_code: None,
            });
        }
    }
}

/// How a run ended, from its last assistant message (`agent_end` lists the run's).
pub(super) fn outcome(messages: &[Message]) -> TurnOutcome {
    let Some(last) = messages.iter().rev().find(|m| m.is_assistant()) else {
        return TurnOutcome::Completed {
            text: String::new(),
        };
    };
    match last.stop_reason.as_deref() {
        Some("aborted") => TurnOutcome::Interrupted,
        Some("error") => TurnOutcome::Failed {
            error: last
                .error_message
                .clone()
                .unwrap_or_else(|| "pi reported an error without a message".into()),
        },
        _ => TurnOutcome::Completed { text: last.text() },
    }
}

/// Pi's built-in tools by name: `bash` runs commands, `edit` and `write` change files.
pub(super) fn tool_kind(name: &str) -> ItemKind {
    match name {
        "bash" => ItemKind::CommandExecution,
        "edit" | "write" => ItemKind::FileChange,
        _ => ItemKind::ToolCall,
    }
}

/// What a tool call did, as a person would name it: the command line, the tool and
/// its file, or the tool and its arguments.
pub(super) fn describe_call(name: &str, args: &Value) -> String {
    let field = |key| args.get(key).and_then(Value::as_str);
    match (name, field("command"), field("path")) {
        ("bash", Some(command), _) => command.to_string(),
        ("read" | "edit" | "write", _, Some(path)) => format!("{name} {path}"),
        _ => {
            let mut args = args.to_string();
            if args.len() > ARGS_SHOWN {
                let cut = (0..=ARGS_SHOWN)
                    .rev()
                    .find(|&i| args.is_char_boundary(i))
                    .unwrap_or(0);
                args.truncate(cut);
                args.push('…');
            }
            format!("{name} {args}")
        }
    }
}

/// What `now` adds to `before`, two snapshots of a tool's output. Pi sends the output
/// so far with each update, but only its tail once it is long (the last 2000 lines or
/// 50 KB), so a later snapshot may start further on: the new part then follows the
/// longest tail of `before` (from a line start) that `now` begins with, or is all of
/// `now` when they share nothing.
pub(super) fn output_delta<'a>(before: &str, now: &'a str) -> &'a str {
    if let Some(rest) = now.strip_prefix(before) {
        return rest;
    }
    before
        .match_indices('\n')
        .map(|(i, _)| &before[i + 1..])
        .find(|tail| !tail.is_empty() && now.starts_with(tail))
        .map_or(now, |tail| &now[tail.len()..])
}
