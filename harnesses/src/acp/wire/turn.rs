//! One turn's reading of an ACP agent's `session/update`s: its message and thought
//! items, tool calls, plan, usage, and how it ended.

use std::collections::{HashMap, HashSet};

use relay_protocol::acp::{
    ContentBlock, ContentChunk, Plan, PromptResponse, StopReason, ToolCall, ToolCallContent,
    ToolCallStatus, ToolCallUpdate, ToolKind, UsageUpdate,
};
use relay_protocol::domain::TokenUsage;
use relay_protocol::harness::{HarnessEvent, ItemKind, TurnOutcome};
use serde_json::Value;

use super::usage::{self, Counts};

/// The turn running: from Relay's `session/prompt` to its answer.
#[derive(Debug)]
pub(super) struct Turn {
    pub(super) id: String,
    /// The `session/prompt` request's id: its answer ends the turn.
    pub(super) prompt: String,
    /// Relay sent `session/cancel`: the agent's permission requests from now on are
    /// answered `cancelled`, nobody asked.
    pub(super) cancelled: bool,
    started: bool,
    /// Items begun so far; names the next one (`<turn>-i<n>`).
    items: u32,
    /// The message or thought being streamed: item id, kind, text so far, and the
    /// agent's `messageId` (a new one starts a new item).
    open: Option<Streamed>,
    /// Every message's text, for the turn's answer: the last message's.
    last_message: String,
    tools: HashMap<String, Tool>,
    /// Tool calls whose item has started (a permission request may name a call before
    /// any update does: it is known then, but its item starts with its first update).
    started_tools: HashSet<String>,
    /// The turn's usage as last reported.
    usage: TokenUsage,
    /// The sum of the model calls' usage reported on chunks so far (Qwen Code's
    /// `_meta.usage`: one per model call, a turn with tools makes several).
    calls: TokenUsage,
}

#[derive(Debug)]
struct Streamed {
    item_id: String,
    kind: ItemKind,
    text: String,
    message_id: Option<String>,
}

/// A tool call as known so far.
#[derive(Debug, Default, Clone)]
pub(super) struct Tool {
    pub(super) title: String,
    pub(super) kind: Option<ToolKind>,
    pub(super) raw_input: Option<Value>,
    /// Its output as last shown (ACP sends a call's whole content each time).
    output: String,
    done: bool,
}

impl Tool {
    /// The command it runs, as it will run: `rawInput.command` (a string, or a list
    /// of words joined with shell quoting).
    pub(super) fn command(&self) -> Option<String> {
        let raw = self.raw_input.as_ref()?.get("command")?;
        match raw {
            Value::String(s) if !s.trim().is_empty() => Some(s.clone()),
            Value::Array(words) => {
                let words: Option<Vec<&str>> = words.iter().map(Value::as_str).collect();
                shlex::try_join(words?).ok().filter(|s| !s.is_empty())
            }
            _ => None,
        }
    }

    /// What it did, as a person would name it: the command, else the title.
    pub(super) fn describe(&self) -> String {
        self.command().unwrap_or_else(|| self.title.clone())
    }

    fn item_kind(&self) -> ItemKind {
        match (&self.kind, self.command()) {
            (Some(ToolKind::Execute), _) | (None, Some(_)) => ItemKind::CommandExecution,
            (Some(ToolKind::Edit | ToolKind::Delete | ToolKind::Move), _) => ItemKind::FileChange,
            _ => ItemKind::ToolCall,
        }
    }

    pub(super) fn merge(&mut self, u: &ToolCallUpdate) {
        if let Some(title) = u.title.as_ref().filter(|t| !t.is_empty()) {
            self.title = title.clone();
        }
        if let Some(kind) = &u.kind {
            self.kind = Some(kind.clone());
        }
        if let Some(raw) = u.raw_input.as_ref().filter(|r| !r.is_null()) {
            self.raw_input = Some(raw.clone());
        }
    }
}

/// A call's output: its text content, else `rawOutput`'s `output` (or the whole of it).
fn output_of(content: Option<&[ToolCallContent]>, raw: Option<&Value>) -> Option<String> {
    let texts: Vec<&str> = content
        .unwrap_or_default()
        .iter()
        .filter_map(|c| match c {
            ToolCallContent::Content { content } => content.as_text(),
            _ => None,
        })
        .collect();
    if !texts.is_empty() {
        return Some(texts.join("\n"));
    }
    match raw? {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        raw => Some(
            raw.get("output")
                .and_then(Value::as_str)
                .map_or_else(|| raw.to_string(), str::to_string),
        ),
    }
}

impl Turn {
    pub(super) fn new(id: &str, prompt: String) -> Turn {
        Turn {
            id: id.to_string(),
            prompt,
            cancelled: false,
            started: false,
            items: 0,
            open: None,
            last_message: String::new(),
            tools: HashMap::new(),
            started_tools: HashSet::new(),
            usage: TokenUsage::default(),
            calls: TokenUsage::default(),
        }
    }

    /// `TurnStarted`, once: ACP says nothing when a turn starts, so it is the first
    /// word of the turn.
    pub(super) fn start(&mut self, emit: &mut impl FnMut(HarnessEvent)) {
        if !self.started {
            self.started = true;
            emit(HarnessEvent::TurnStarted {
                turn_id: self.id.clone(),
            });
        }
    }

    fn next_item(&mut self) -> String {
        self.items += 1;
        format!("{}-i{}", self.id, self.items)
    }

    /// A message (or thought) chunk: text to the open item of its kind, else a new one.
    pub(super) fn chunk(
        &mut self,
        kind: ItemKind,
        chunk: ContentChunk,
        emit: &mut impl FnMut(HarnessEvent),
    ) {
        self.start(emit);
        if let Some(usage) = chunk.meta.as_ref().and_then(|m| m.get("usage")) {
            self.call_usage(usage, emit);
        }
        let ContentBlock::Text { text } = chunk.content else {
            return;
        };
        if text.is_empty() {
            return;
        }
        let same = self.open.as_ref().is_some_and(|o| {
            o.kind == kind && (chunk.message_id.is_none() || o.message_id == chunk.message_id)
        });
        if !same {
            self.close(emit);
            let item_id = self.next_item();
            emit(HarnessEvent::ItemStarted {
                turn_id: self.id.clone(),
                item_id: item_id.clone(),
                kind: kind.clone(),
            });
            self.open = Some(Streamed {
                item_id,
                kind: kind.clone(),
                text: String::new(),
                message_id: chunk.message_id.clone(),
            });
        }
        if let Some(open) = self.open.as_mut() {
            open.text.push_str(&text);
            // Thoughts are shown whole, as the other harnesses' reasoning.
            if kind == ItemKind::AgentMessage {
                emit(HarnessEvent::TextDelta {
                    turn_id: self.id.clone(),
                    item_id: open.item_id.clone(),
                    delta: text,
                });
            }
        }
    }

    /// Completes the streamed item, if one is open.
    fn close(&mut self, emit: &mut impl FnMut(HarnessEvent)) {
        if let Some(open) = self.open.take() {
            if open.kind == ItemKind::AgentMessage {
                self.last_message = open.text.clone();
            }
            emit(HarnessEvent::ItemCompleted {
                turn_id: self.id.clone(),
                item_id: open.item_id,
                kind: open.kind,
                text: Some(open.text),
                exit_code: None,
            });
        }
    }

    /// The tool call as Relay knows it (for a permission request), merged with `u`.
    pub(super) fn tool_seen(&mut self, u: &ToolCallUpdate) -> Tool {
        let tool = self.tools.entry(u.tool_call_id.clone()).or_default();
        tool.merge(u);
        tool.clone()
    }

    pub(super) fn tool_call(&mut self, call: ToolCall, emit: &mut impl FnMut(HarnessEvent)) {
        let update = ToolCallUpdate {
            tool_call_id: call.tool_call_id,
            title: Some(call.title),
            kind: Some(call.kind),
            status: Some(call.status),
            content: Some(call.content),
            locations: None,
            raw_input: call.raw_input,
            raw_output: call.raw_output,
            meta: call.meta,
        };
        self.tool_update(update, emit);
    }

    /// A `tool_call` or `tool_call_update`: the item starts when Relay first hears of
    /// it (Gemini CLI sends no `tool_call` first), its output grows, and it completes
    /// when the call did or failed.
    pub(super) fn tool_update(&mut self, u: ToolCallUpdate, emit: &mut impl FnMut(HarnessEvent)) {
        self.start(emit);
        self.close(emit);
        let turn_id = self.id.clone();
        let id = u.tool_call_id.clone();
        let tool = self.tools.entry(id.clone()).or_default();
        tool.merge(&u);
        let tool = tool.clone();
        if self.started_tools.insert(id.clone()) {
            emit(HarnessEvent::ItemStarted {
                turn_id: turn_id.clone(),
                item_id: id.clone(),
                kind: tool.item_kind(),
            });
        }
        if let Some(output) = output_of(u.content.as_deref(), u.raw_output.as_ref()) {
            let before = tool.output.clone();
            let delta = output.strip_prefix(before.as_str()).unwrap_or(&output);
            if tool.item_kind() == ItemKind::CommandExecution && !delta.is_empty() {
                emit(HarnessEvent::CommandOutputDelta {
                    turn_id: turn_id.clone(),
                    item_id: id.clone(),
                    delta: delta.to_string(),
                });
            }
            if let Some(t) = self.tools.get_mut(&id) {
                t.output = output;
            }
        }
        let done = matches!(
            u.status,
            Some(ToolCallStatus::Completed | ToolCallStatus::Failed)
        );
        let Some(tool) = self.tools.get_mut(&id).filter(|t| done && !t.done) else {
            return;
        };
        tool.done = true;
        let call = tool.describe();
        let text = match (tool.output.trim_end(), u.status) {
            ("", Some(ToolCallStatus::Failed)) => format!("{call}\nfailed"),
            ("", _) => call,
            (out, Some(ToolCallStatus::Failed)) => format!("{call}\nfailed: {out}"),
            (out, _) => format!("{call}\n{out}"),
        };
        let kind = tool.item_kind();
        emit(HarnessEvent::ItemCompleted {
            turn_id,
            item_id: id,
            kind,
            text: Some(text),
            exit_code: None,
        });
    }

    pub(super) fn plan(&mut self, plan: Plan, emit: &mut impl FnMut(HarnessEvent)) {
        self.start(emit);
        let text = plan
            .entries
            .iter()
            .map(|e| format!("[{}] {}", e.status, e.content))
            .collect::<Vec<_>>()
            .join("\n");
        emit(HarnessEvent::PlanUpdated {
            turn_id: self.id.clone(),
            text,
        });
    }

    /// `usage_update` says how full the context is: the tokens in it are the turn's
    /// input as far as Relay can tell; its `cost`, where it has one, is the turn's.
    pub(super) fn context_usage(&mut self, u: UsageUpdate, emit: &mut impl FnMut(HarnessEvent)) {
        let before = self.usage.clone();
        if u.used > 0 {
            self.usage.input_tokens = u.used;
        }
        if let Some(cost) = &u.cost {
            usage::set_cost(&mut self.usage, cost.amount, &cost.currency);
        }
        if self.usage != before {
            self.emit_usage(emit);
        }
    }

    fn emit_usage(&self, emit: &mut impl FnMut(HarnessEvent)) {
        emit(HarnessEvent::TokenUsage {
            turn_id: self.id.clone(),
            usage: self.usage.clone(),
        });
    }

    /// One model call's usage on a chunk (Qwen Code's `_meta.usage`): added to the
    /// calls before it, since a turn counts all its model calls (as Codex's and Claude
    /// Code's turns do).
    fn call_usage(&mut self, v: &Value, emit: &mut impl FnMut(HarnessEvent)) {
        let counts = Counts::of(v).in_relays_way(false);
        if !counts.any() {
            return;
        }
        counts.add_to(&mut self.calls);
        let (model, cost) = (self.usage.model.take(), self.usage.cost_micro_usd);
        let source = self.usage.cost_source.take();
        self.usage = TokenUsage {
            model,
            cost_micro_usd: cost,
            cost_source: source,
            ..self.calls.clone()
        };
        self.emit_usage(emit);
    }

    /// The turn's token counts (the prompt's answer), in whichever spelling the agent
    /// uses (see [`Counts::of`]); `acp`: ACP's own `Usage`, whose kinds are counted
    /// apart.
    pub(super) fn usage_of(&mut self, v: &Value, acp: bool, emit: &mut impl FnMut(HarnessEvent)) {
        let counts = Counts::of(v).in_relays_way(acp);
        if !counts.any() {
            return;
        }
        counts.replace(&mut self.usage);
        self.emit_usage(emit);
    }

    /// The prompt's answer: the turn's end.
    pub(super) fn end(mut self, result: PromptResponse, emit: &mut impl FnMut(HarnessEvent)) {
        self.start(emit);
        self.close(emit);
        if let Some(usage) = &result.usage {
            if let Ok(v) = serde_json::to_value(usage) {
                self.usage_of(&v, true, emit);
            }
        }
        if let Some(meta) = &result.meta {
            for key in ["usage", "quota"] {
                if let Some(v) = meta.get(key) {
                    if let Some(model) = usage::model_of(v) {
                        self.usage.model = Some(model);
                    }
                    self.usage_of(v, false, emit);
                    // Gemini CLI nests its counts (`_meta.quota.token_count`).
                    if let Some(inner) = v
                        .as_object()
                        .and_then(|o| o.values().find(|x| x.is_object()))
                    {
                        self.usage_of(inner, false, emit);
                    }
                }
            }
        }
        let outcome = match &result.stop_reason {
            StopReason::EndTurn => TurnOutcome::Completed {
                text: self.last_message.clone(),
            },
            StopReason::Cancelled => TurnOutcome::Interrupted,
            StopReason::MaxTokens => {
                failed("the agent reached its output token limit (max_tokens)")
            }
            StopReason::MaxTurnRequests => failed(
                "the agent reached its limit of model requests in a turn (max_turn_requests)",
            ),
            StopReason::Refusal => failed("the agent refused to go on (refusal)"),
            StopReason::Other(why) => failed(&format!(
                "the agent ended the turn with a stop reason Relay does not know: {why:?}"
            )),
        };
        self.finish(outcome, emit);
    }

    /// Ends the turn with `outcome`, completing what is open.
    pub(super) fn finish(mut self, outcome: TurnOutcome, emit: &mut impl FnMut(HarnessEvent)) {
        self.start(emit);
        self.close(emit);
        emit(HarnessEvent::TurnCompleted {
            turn_id: self.id,
            outcome,
        });
    }
}

fn failed(why: &str) -> TurnOutcome {
    TurnOutcome::Failed {
        error: why.to_string(),
    }
}
