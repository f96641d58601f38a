//! Codex wire -> [`HarnessEvent`]s: the protocol state of one app-server connection,
//! without I/O, so it can be tested line by line.
//!
//! [`CodexWire`] (the translator as the [`stdio::Wire`] of the child's owner task) reads
//! each stdout line into [`Action`]s (a streamed delta's in one pass,
//! [`Translator::delta`], any other by [`Translator::handle_envelope`]) and hands them
//! on: events to publish, responses to hand to waiting requests, and messages to write
//! back (a JSON-RPC error for every server request Relay does not handle, so Codex never
//! waits forever). It remembers what later lines need: each turn's last agent message and
//! failure reason, the file changes an approval refers to, token totals, each thread's
//! model (from the answers to `thread/start|resume|fork`, for the usage reports), and
//! the server requests still awaiting an answer.
//!
//! Usage: `thread/tokenUsage/updated`'s `total` is the thread's over its life (every
//! model request added, a resumed thread's too); a turn's `TokenUsage` is that total
//! minus the one when the turn started, with cached input and reasoning (Codex counts
//! as Relay does: input includes the cached part, output the reasoning). Codex reports
//! no cost.
//!
//! Here: the envelope, the translator's state, the notifications and [`CodexWire`];
//! `approvals.rs`: the server requests surfaced as approvals and their answers;
//! `items.rs`: thread items' kinds and texts.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::app_server::{
    self as wire, notification, FileUpdateChange, KnownThreadItem, Message, RequestId, ThreadItem,
    TokenUsageBreakdown, TurnStatus,
};
use relay_protocol::harness::{HarnessEvent, TurnOutcome};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use self::approvals::Pending;
use self::items::{item_kind, item_text, last_agent_message, plan_text};
use crate::error::HarnessError;
use crate::stdio::{self, Outgoing};

mod approvals;
mod items;
#[cfg(test)]
mod one_pass_tests;
#[cfg(test)]
mod tests;

/// One line of codex's stdout as its outer shape only: `params` and `result` stay raw
/// JSON until the method says what they are ([`Translator::handle_envelope`]).
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(default)]
    id: Option<RequestId>,
    #[serde(default, borrow)]
    method: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    params: Option<&'a RawValue>,
    /// Present even when `null` (a response may answer `null`).
    #[serde(default, borrow, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(default)]
    error: Option<wire::ErrorObject>,
}

/// A streamed text's line read in one pass ([`Translator::delta`]):
/// Codex streams an answer as thousands of these, and reading the envelope first, then
/// its `params` again, was half of its owner task's time in a burst.
#[derive(Deserialize)]
struct DeltaLine<'a> {
    /// A request's id: such a line is not a notification (read the general way).
    #[serde(default, borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    method: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    params: DeltaParams<'a>,
    /// Read as the envelope reads them (one of the wrong shape, or twice, is malformed).
    #[serde(default, rename = "error")]
    _error: Option<wire::ErrorObject>,
    #[serde(default, borrow, rename = "result")]
    _result: Option<&'a RawValue>,
}

/// [`wire::DeltaNotification`] with its thread id checked but not kept (not copied).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeltaParams<'a> {
    #[serde(borrow, rename = "threadId")]
    _thread_id: std::borrow::Cow<'a, str>,
    turn_id: String,
    item_id: String,
    delta: String,
}

/// How an agent message's delta names its method in a line: only a line holding this
/// tries [`DeltaLine`] (a line that holds it elsewhere, or does not parse as one, is read
/// the general way).
const DELTA_METHOD: &str = concat!("\"method\":\"", "item/agentMessage/delta", "\"");

/// [`DELTA_METHOD`]'s searcher, made once (`str::contains` made one per line: a sixth of
/// the fast path's time).
static DELTA_FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(DELTA_METHOD));

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// What the owner task should do with a line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    Event(HarnessEvent),
    /// The answer to one of our requests.
    Response {
        id: RequestId,
        result: Result<Value, wire::ErrorObject>,
    },
    /// A message to write back to Codex.
    Send(Message),
}

#[derive(Debug, Default)]
struct TurnState {
    /// Text of the last completed `agentMessage` item: the answer if `turn/completed`
    /// carries no items.
    last_agent_text: Option<String>,
    /// Message of a non-retried `error` notification: the reason if `turn/completed`
    /// carries no error.
    error: Option<String>,
    /// The thread's token totals when the turn started; usage events report the
    /// difference, i.e. what this turn used.
    usage_baseline: TokenUsageBreakdown,
}

#[derive(Debug)]
pub(crate) struct Translator {
    pub malformed: Arc<AtomicU64>,
    turns: HashMap<String, TurnState>,
    /// Latest cumulative token usage per thread.
    thread_usage: HashMap<String, TokenUsageBreakdown>,
    /// The model of each thread, as the answer to `thread/start`, `thread/resume` or
    /// `thread/fork` names it (the usage notifications do not).
    thread_model: HashMap<String, String>,
    /// Changes of `fileChange` items in progress, by item id: a file change approval names
    /// the item, not the changes.
    file_changes: HashMap<String, Vec<FileUpdateChange>>,
    /// Approval requests surfaced and not yet resolved, by the id handed out in
    /// `ApprovalRequested`.
    server_requests: HashMap<String, Pending>,
    /// Relay's own MCP server (`relay mcp`) is wired into this Codex: calls of its tools
    /// run without asking a person. `false` when it is not, so that a server the user
    /// named `relay` is never taken for Relay's.
    relay_mcp: bool,
    /// `commandExecution` items in progress that streamed output: item id -> turn id. Codex does
    /// not always stream a fast command's output (it may land only in the completed
    /// item's `aggregatedOutput`); for an item absent here, that output is emitted as one
    /// delta when the item completes, so clients always see it.
    streamed_output: HashMap<String, String>,
}

impl Translator {
    /// `relay_mcp`: Relay's own MCP server is wired into this Codex (see the field).
    pub fn new(malformed: Arc<AtomicU64>, relay_mcp: bool) -> Self {
        Self {
            malformed,
            turns: HashMap::new(),
            thread_usage: HashMap::new(),
            thread_model: HashMap::new(),
            file_changes: HashMap::new(),
            server_requests: HashMap::new(),
            relay_mcp,
            streamed_output: HashMap::new(),
        }
    }

    fn malformed(&self, line: &str, why: &dyn std::fmt::Display) {
        self.malformed.fetch_add(1, Ordering::Relaxed);
        let shown: String = line.chars().take(300).collect();
        tracing::warn!(%why, line = %shown, "codex: malformed line ignored");
    }

    /// An agent message's delta read in one pass, straight into its event; `None`: the
    /// line is something else, to be read the general way ([`DeltaLine`]).
    fn delta(&self, line: &str) -> Option<HarnessEvent> {
        DELTA_FINDER.find(line.as_bytes())?;
        match serde_json::from_str(line) {
            Ok(DeltaLine {
                id: None,
                method,
                params,
                ..
            }) if method == notification::AGENT_MESSAGE_DELTA => Some(HarnessEvent::TextDelta {
                turn_id: params.turn_id,
                item_id: params.item_id,
                delta: params.delta,
            }),
            _ => None,
        }
    }

    /// Any line the general way: the envelope borrows `params` as raw JSON, which is
    /// then read once into the type its method names (not a generic tree, a `Value` and
    /// a conversion).
    fn handle_envelope(&mut self, line: &str) -> Vec<Action> {
        if line.trim().is_empty() {
            return Vec::new();
        }
        let envelope: Envelope<'_> = match serde_json::from_str(line) {
            Ok(e) => e,
            Err(err) => {
                self.malformed(line, &err);
                return Vec::new();
            }
        };
        let params = envelope.params;
        // The same order of shapes as [`Message`]: request, notification, response, error.
        match envelope {
            Envelope {
                id: Some(id),
                method: Some(method),
                ..
            } => self.server_request(id, &method, params, line),
            Envelope {
                method: Some(method),
                ..
            } => self.notification(&method, params, line),
            Envelope {
                id: Some(id),
                result: Some(result),
                ..
            } => match serde_json::from_str::<Value>(result.get()) {
                Ok(result) => {
                    self.note_thread_model(&result);
                    vec![Action::Response {
                        id,
                        result: Ok(result),
                    }]
                }
                Err(err) => {
                    self.malformed(line, &err);
                    Vec::new()
                }
            },
            Envelope {
                id: Some(id),
                error: Some(error),
                ..
            } => vec![Action::Response {
                id,
                result: Err(error),
            }],
            _ => {
                self.malformed(
                    line,
                    &"neither a request, a notification, a response nor an error",
                );
                Vec::new()
            }
        }
    }

    /// Keeps the model of a thread answer (`{thread: {id}, model}`).
    fn note_thread_model(&mut self, result: &Value) {
        let thread = result.pointer("/thread/id").and_then(Value::as_str);
        let model = result.get("model").and_then(Value::as_str);
        if let (Some(thread), Some(model)) = (thread, model) {
            self.thread_model
                .insert(thread.to_string(), model.to_string());
        }
    }

    fn parse<T: DeserializeOwned>(&self, params: Option<&RawValue>, line: &str) -> Option<T> {
        // Params that were missing or `null` read as `null` (and fail as the old `Value` did).
        match serde_json::from_str(params.map_or("null", RawValue::get)) {
            Ok(v) => Some(v),
            Err(err) => {
                self.malformed(line, &err);
                None
            }
        }
    }

    fn notification(&mut self, method: &str, params: Option<&RawValue>, line: &str) -> Vec<Action> {
        let event = match method {
            notification::TURN_STARTED => {
                let Some(n) = self.parse::<wire::TurnNotification>(params, line) else {
                    return Vec::new();
                };
                let baseline = self
                    .thread_usage
                    .get(&n.thread_id)
                    .copied()
                    .unwrap_or_default();
                let state = self.turns.entry(n.turn.id.clone()).or_default();
                state.usage_baseline = baseline;
                HarnessEvent::TurnStarted { turn_id: n.turn.id }
            }
            notification::TURN_COMPLETED => {
                let Some(n) = self.parse::<wire::TurnNotification>(params, line) else {
                    return Vec::new();
                };
                let state = self.turns.remove(&n.turn.id).unwrap_or_default();
                // Items the turn never completed (interrupted) are over too.
                self.streamed_output.retain(|_, turn| *turn != n.turn.id);
                let outcome = match n.turn.status {
                    TurnStatus::Completed => TurnOutcome::Completed {
                        text: last_agent_message(&n.turn.items)
                            .or(state.last_agent_text)
                            .unwrap_or_default(),
                    },
                    TurnStatus::Interrupted => TurnOutcome::Interrupted,
                    TurnStatus::Failed => TurnOutcome::Failed {
                        error: n
                            .turn
                            .error
                            .map(|e| e.message)
                            .or(state.error)
                            .unwrap_or_else(|| "turn failed".to_string()),
                    },
                    TurnStatus::InProgress | TurnStatus::Unknown => TurnOutcome::Failed {
                        error: format!("turn ended with status {:?}", n.turn.status),
                    },
                };
                HarnessEvent::TurnCompleted {
                    turn_id: n.turn.id,
                    outcome,
                }
            }
            notification::ITEM_STARTED => {
                let Some(n) = self.parse::<wire::ItemNotification>(params, line) else {
                    return Vec::new();
                };
                if let ThreadItem::Known(KnownThreadItem::FileChange { id, changes, .. }) = &n.item
                {
                    self.file_changes.insert(id.clone(), changes.clone());
                }
                HarnessEvent::ItemStarted {
                    turn_id: n.turn_id,
                    item_id: n.item.id().to_string(),
                    kind: item_kind(&n.item),
                }
            }
            notification::ITEM_COMPLETED => {
                let Some(n) = self.parse::<wire::ItemNotification>(params, line) else {
                    return Vec::new();
                };
                self.file_changes.remove(n.item.id());
                let streamed = self.streamed_output.remove(n.item.id()).is_some();
                let mut events = Vec::new();
                match &n.item {
                    ThreadItem::Known(KnownThreadItem::AgentMessage { text, .. }) => {
                        self.turns
                            .entry(n.turn_id.clone())
                            .or_default()
                            .last_agent_text = Some(text.clone());
                    }
                    ThreadItem::Known(KnownThreadItem::CommandExecution {
                        aggregated_output: Some(output),
                        ..
                    }) if !streamed && !output.is_empty() => {
                        events.push(Action::Event(HarnessEvent::CommandOutputDelta {
                            turn_id: n.turn_id.clone(),
                            item_id: n.item.id().to_string(),
                            delta: output.clone(),
                        }));
                    }
                    _ => {}
                }
                events.push(Action::Event(HarnessEvent::ItemCompleted {
                    turn_id: n.turn_id,
                    item_id: n.item.id().to_string(),
                    kind: item_kind(&n.item),
                    text: item_text(&n.item),
                    exit_code: items::exit_code(&n.item),
                }));
                return events;
            }
            notification::AGENT_MESSAGE_DELTA => {
                let Some(n) = self.parse::<wire::DeltaNotification>(params, line) else {
                    return Vec::new();
                };
                HarnessEvent::TextDelta {
                    turn_id: n.turn_id,
                    item_id: n.item_id,
                    delta: n.delta,
                }
            }
            notification::COMMAND_OUTPUT_DELTA => {
                let Some(n) = self.parse::<wire::DeltaNotification>(params, line) else {
                    return Vec::new();
                };
                self.streamed_output
                    .insert(n.item_id.clone(), n.turn_id.clone());
                HarnessEvent::CommandOutputDelta {
                    turn_id: n.turn_id,
                    item_id: n.item_id,
                    delta: n.delta,
                }
            }
            notification::TURN_PLAN_UPDATED => {
                let Some(n) = self.parse::<wire::TurnPlanUpdatedNotification>(params, line) else {
                    return Vec::new();
                };
                HarnessEvent::PlanUpdated {
                    turn_id: n.turn_id,
                    text: plan_text(n.explanation.as_deref(), &n.plan),
                }
            }
            notification::TURN_DIFF_UPDATED => {
                let Some(n) = self.parse::<wire::TurnDiffUpdatedNotification>(params, line) else {
                    return Vec::new();
                };
                HarnessEvent::DiffUpdated {
                    turn_id: n.turn_id,
                    diff: n.diff,
                }
            }
            notification::TOKEN_USAGE_UPDATED => {
                let Some(n) = self.parse::<wire::TokenUsageUpdatedNotification>(params, line)
                else {
                    return Vec::new();
                };
                let total = n.token_usage.total;
                let model = self.thread_model.get(&n.thread_id).cloned();
                self.thread_usage.insert(n.thread_id, total);
                // Codex replays the last turn's usage right after `thread/resume`; that
                // turn is not running here, so there is nothing to report.
                let Some(state) = self.turns.get(&n.turn_id) else {
                    return Vec::new();
                };
                // Codex's counts already follow Relay's conventions (the OpenAI ones):
                // input includes the cached input, output the reasoning.
                let base = &state.usage_baseline;
                HarnessEvent::TokenUsage {
                    turn_id: n.turn_id,
                    usage: relay_protocol::domain::TokenUsage {
                        input_tokens: total.input_tokens.saturating_sub(base.input_tokens),
                        cached_input_tokens: total
                            .cached_input_tokens
                            .saturating_sub(base.cached_input_tokens),
                        output_tokens: total.output_tokens.saturating_sub(base.output_tokens),
                        reasoning_tokens: Some(
                            total
                                .reasoning_output_tokens
                                .saturating_sub(base.reasoning_output_tokens),
                        ),
                        model,
                        cost_micro_usd: None,
                        cost_source: None,
                    },
                }
            }
            notification::ERROR => {
                let Some(n) = self.parse::<wire::ErrorNotification>(params, line) else {
                    return Vec::new();
                };
                if n.will_retry {
                    // Codex says what failed in `additionalDetails` ("Reconnecting... waiting
                    // for network" / "Connection failed: error sending request").
                    let message = match n.error.additional_details.filter(|d| !d.is_empty()) {
                        Some(details) => format!("{} ({details})", n.error.message),
                        None => n.error.message,
                    };
                    HarnessEvent::Retrying { message }
                } else {
                    // The turn is failing; `turn/completed` follows and reports it.
                    self.turns.entry(n.turn_id).or_default().error = Some(n.error.message);
                    return Vec::new();
                }
            }
            notification::WARNING => {
                let Some(n) = self.parse::<wire::WarningNotification>(params, line) else {
                    return Vec::new();
                };
                HarnessEvent::Warning { message: n.message }
            }
            notification::SERVER_REQUEST_RESOLVED => {
                let Some(n) = self.parse::<wire::ServerRequestResolvedNotification>(params, line)
                else {
                    return Vec::new();
                };
                let request_id = n.request_id.to_string();
                // Only requests surfaced as approvals; refused ones were never announced.
                if self.server_requests.remove(&request_id).is_none() {
                    return Vec::new();
                }
                HarnessEvent::ApprovalResolved { request_id }
            }
            notification::MCP_SERVER_STATUS => {
                let Some(n) = self.parse::<wire::McpServerStatusUpdatedNotification>(params, line)
                else {
                    return Vec::new();
                };
                if n.status != "failed" {
                    tracing::debug!(server = %n.name, status = %n.status, "codex: MCP server");
                    return Vec::new();
                }
                // Its tools are missing from the thread: say so, or the model's calls
                // of them fail with nothing to tell why.
                let message = format!(
                    "codex could not start MCP server {}: {}",
                    n.name,
                    n.error.as_deref().unwrap_or("no reason given")
                );
                tracing::warn!(%message, "codex: MCP server failed");
                HarnessEvent::Warning { message }
            }
            other => {
                tracing::debug!(method = other, "codex: notification ignored");
                return Vec::new();
            }
        };
        vec![Action::Event(event)]
    }
}

/// The [`Translator`] as the [`stdio::Wire`] of a `codex app-server` child, with the
/// ids of the requests Relay sends. Public for the fuzz targets (`tests/tests/fuzz`): they
/// feed it lines as Codex's stdout would.
pub struct CodexWire {
    pub(crate) translator: Translator,
    next_id: i64,
}

impl CodexWire {
    /// `relay_mcp`: Relay's MCP server is wired in ([`Translator::new`]).
    pub fn new(malformed: Arc<AtomicU64>, relay_mcp: bool) -> Self {
        Self {
            translator: Translator::new(malformed, relay_mcp),
            next_id: 1,
        }
    }

    /// Relay's answer to Codex's approval request `request_id`, as `respond_approval`
    /// sends it; `None` when it was answered or settled already. Public for the fuzz
    /// targets, which answer the requests their lines make.
    pub fn answer(
        &mut self,
        request_id: &str,
        decision: relay_protocol::domain::ApprovalDecision,
    ) -> Option<Value> {
        let message = self.translator.answer(request_id, decision)?;
        serde_json::to_value(message).ok()
    }

    /// A request to Codex with the next id, and that id as the answer to wait for.
    pub fn request(&mut self, method: &str, params: Value) -> Result<Outgoing, HarnessError> {
        let id = self.next_id;
        self.next_id += 1;
        let message = Message::Request(wire::Request {
            id: RequestId::Integer(id),
            method: method.to_string(),
            params: Some(params),
        });
        Ok(Outgoing::request(
            serde_json::to_value(message)?,
            id.to_string(),
        ))
    }
}

impl stdio::Wire for CodexWire {
    const NAME: &'static str = "codex";

    fn line(&mut self, line: &str, out: &mut Vec<stdio::Action>) {
        if let Some(delta) = self.translator.delta(line) {
            out.push(stdio::Action::Event(delta));
            return;
        }
        out.extend(
            self.translator
                .handle_envelope(line)
                .into_iter()
                .filter_map(|action| match action {
                    Action::Event(event) => Some(stdio::Action::Event(event)),
                    Action::Response { id, result } => Some(stdio::Action::Answer {
                        id: id.to_string(),
                        result: result.map_err(|e| HarnessError::Rpc {
                            code: e.code,
                            message: e.message,
                        }),
                    }),
                    Action::Send(message) => match serde_json::to_value(message) {
                        Ok(message) => Some(stdio::Action::Send(message)),
                        Err(err) => {
                            tracing::warn!(%err, "codex: cannot encode an answer");
                            None
                        }
                    },
                }),
        );
    }

    fn malformed_counter(&self) -> Option<Arc<AtomicU64>> {
        Some(self.translator.malformed.clone())
    }
}
