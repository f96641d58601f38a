//! Codex wire -> [`HarnessEvent`]s: the protocol state of one app-server connection,
//! without I/O, so it can be tested line by line.
//!
//! [`Translator::handle_line`] takes one stdout line and returns [`Action`]s, which
//! [`CodexWire`] (the translator as the [`stdio::Wire`] of the child's owner task) hands
//! on: events to publish, responses to hand to waiting requests, and messages to write
//! back (a JSON-RPC error for every server request Relay does not handle, so Codex never
//! waits forever). It remembers what later lines need: each turn's last agent message and
//! failure reason, the file changes an approval refers to, token totals, and the server
//! requests still awaiting an answer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::app_server::{
    self as wire, error_code, notification, server_request, FileUpdateChange, KnownThreadItem,
    Message, RequestId, ThreadItem, TokenUsageBreakdown, TurnStatus,
};
use relay_protocol::domain::{ApprovalDecision, ApprovalKind};
use relay_protocol::harness::{HarnessEvent, ItemKind, TurnOutcome};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::access::MCP_SERVER;
use crate::error::HarnessError;
use crate::stdio::{self, Outgoing};

/// One line of codex's stdout as its outer shape only: `params` and `result` stay raw
/// JSON until the method says what they are ([`Translator::handle_line`]).
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

/// A server request surfaced as an approval and not yet resolved.
#[derive(Debug)]
struct Pending {
    /// Its id on the wire.
    id: RequestId,
    /// Relay answered it already (Codex has yet to say it is resolved).
    answered: bool,
    /// How its answer is written.
    answer: AnswerShape,
}

/// How an approval is answered on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AnswerShape {
    /// `{"decision": ...}` (commands, file changes).
    Decision,
    /// `{"action": ...}` (an MCP tool call, asked as an elicitation).
    ToolCall,
}

/// What Relay does with an `mcpServer/elicitation/request`
/// ([`Translator::elicitation`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Elicitation {
    /// A call of a tool of Relay's own server: accepted at once, since the agent's
    /// scoped token bounds what it can do.
    RunRelayTool,
    /// A call of another server's tool: a Relay approval, decided like a command.
    Approval {
        turn_id: String,
        detail: String,
        reason: Option<String>,
    },
    /// A form to fill in or a URL to open, meant for a person Relay cannot show it to
    /// (or a tool call outside a turn): declined, never answered as if filled in.
    Decline { why: String },
}

#[derive(Debug)]
pub(crate) struct Translator {
    pub malformed: Arc<AtomicU64>,
    turns: HashMap<String, TurnState>,
    /// Latest cumulative token usage per thread.
    thread_usage: HashMap<String, TokenUsageBreakdown>,
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
            file_changes: HashMap::new(),
            server_requests: HashMap::new(),
            relay_mcp,
            streamed_output: HashMap::new(),
        }
    }

    /// The answer to an unanswered approval request, marking it answered: each is
    /// answered once. `None` when there is no such request, or it was answered.
    pub fn answer(&mut self, request_id: &str, decision: ApprovalDecision) -> Option<Message> {
        let pending = self
            .server_requests
            .get_mut(request_id)
            .filter(|p| !p.answered)?;
        pending.answered = true;
        let result = match pending.answer {
            AnswerShape::Decision => serde_json::to_value(wire::ApprovalResponse {
                decision: decision.into(),
            }),
            AnswerShape::ToolCall => {
                serde_json::to_value(wire::McpServerElicitationResponse::tool_call(decision))
            }
        };
        Some(Message::Response(wire::Response {
            id: pending.id.clone(),
            // Plain structs of strings: they always serialise.
            result: result.unwrap_or_default(),
        }))
    }

    /// What to do with an MCP elicitation: see [`Elicitation`]. Only a tool call
    /// approval (`_meta.codex_approval_kind = "mcp_tool_call"`) of the server named
    /// [`MCP_SERVER`], when Relay wired it in, runs unasked.
    pub fn elicitation(&self, p: &wire::McpServerElicitationRequestParams) -> Elicitation {
        if !p.is_tool_call_approval() {
            let what = match p.approval_kind() {
                Some(kind) => format!("{} {kind}", p.mode),
                None => p.mode.clone(),
            };
            return Elicitation::Decline {
                why: format!(
                    "MCP server {} asked for input only a person can give ({what}: {}); \
                     Relay cannot show it, so it declined",
                    p.server_name, p.message
                ),
            };
        }
        if self.relay_mcp && p.server_name == MCP_SERVER {
            return Elicitation::RunRelayTool;
        }
        let Some(turn_id) = p.turn_id.clone() else {
            return Elicitation::Decline {
                why: format!(
                    "MCP server {} tool call outside a turn: no flight to ask about it; declined",
                    p.server_name
                ),
            };
        };
        // `MCP tool <server>.<tool>`, then the arguments it will run with.
        let mut detail = match p.tool_name() {
            Some(tool) => format!("MCP tool {}.{tool}", p.server_name),
            None => format!("MCP server {}: {}", p.server_name, p.message),
        };
        if let Some(params) = p.meta_field("tool_params") {
            detail.push('\n');
            detail.push_str(&serde_json::to_string_pretty(params).unwrap_or_default());
        }
        Elicitation::Approval {
            turn_id,
            detail,
            reason: None,
        }
    }

    fn malformed(&self, line: &str, why: &dyn std::fmt::Display) {
        self.malformed.fetch_add(1, Ordering::Relaxed);
        let shown: String = line.chars().take(300).collect();
        tracing::warn!(%why, line = %shown, "codex: malformed line ignored");
    }

    pub fn handle_line(&mut self, line: &str) -> Vec<Action> {
        if line.trim().is_empty() {
            return Vec::new();
        }
        // One pass over the line: the envelope borrows `params` as raw JSON, which is
        // then read once into the type its method names (a delta costs one parse, not
        // a generic tree, a `Value` and a conversion).
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
            } => match serde_json::from_str(result.get()) {
                Ok(result) => vec![Action::Response {
                    id,
                    result: Ok(result),
                }],
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
                self.thread_usage.insert(n.thread_id, total);
                // Codex replays the last turn's usage right after `thread/resume`; that
                // turn is not running here, so there is nothing to report.
                let Some(state) = self.turns.get(&n.turn_id) else {
                    return Vec::new();
                };
                HarnessEvent::TokenUsage {
                    turn_id: n.turn_id,
                    input_tokens: total
                        .input_tokens
                        .saturating_sub(state.usage_baseline.input_tokens),
                    output_tokens: total
                        .output_tokens
                        .saturating_sub(state.usage_baseline.output_tokens),
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

    fn server_request(
        &mut self,
        id: RequestId,
        method: &str,
        params: Option<&RawValue>,
        line: &str,
    ) -> Vec<Action> {
        if method == server_request::MCP_ELICITATION {
            let Some(p) = self.parse::<wire::McpServerElicitationRequestParams>(params, line)
            else {
                return vec![refuse(
                    id,
                    error_code::INVALID_PARAMS,
                    format!("relay could not read the params of {method}"),
                )];
            };
            return self.answer_elicitation(id, &p);
        }
        let parsed = match method {
            server_request::COMMAND_APPROVAL => self
                .parse::<wire::CommandExecutionRequestApprovalParams>(params, line)
                .map(|p| {
                    let (kind, detail) = command_approval_detail(&p);
                    (p.turn_id, kind, detail, p.reason)
                }),
            server_request::FILE_CHANGE_APPROVAL => self
                .parse::<wire::FileChangeRequestApprovalParams>(params, line)
                .map(|p| {
                    let detail = self.file_change_detail(&p);
                    // Wider write access for the session is a grant, not a file change:
                    // a person decides it, never `accept_file_changes`.
                    let kind = match p.grant_root {
                        Some(_) => ApprovalKind::Other,
                        None => ApprovalKind::FileChange,
                    };
                    (p.turn_id, kind, detail, p.reason)
                }),
            other => {
                tracing::warn!(method = other, id = %id, "codex: unsupported server request refused");
                return vec![refuse(
                    id,
                    error_code::METHOD_NOT_FOUND,
                    format!("relay does not handle {other}"),
                )];
            }
        };
        let Some((turn_id, kind, detail, reason)) = parsed else {
            return vec![refuse(
                id,
                error_code::INVALID_PARAMS,
                format!("relay could not read the params of {}", method),
            )];
        };
        self.surface(id, AnswerShape::Decision, turn_id, kind, detail, reason)
    }

    /// An approval request for a person (or a policy): remembered until answered or
    /// resolved, and announced.
    fn surface(
        &mut self,
        id: RequestId,
        answer: AnswerShape,
        turn_id: String,
        kind: ApprovalKind,
        detail: String,
        reason: Option<String>,
    ) -> Vec<Action> {
        let request_id = id.to_string();
        let pending = Pending {
            id,
            answered: false,
            answer,
        };
        self.server_requests.insert(request_id.clone(), pending);
        vec![Action::Event(HarnessEvent::ApprovalRequested {
            turn_id,
            request_id,
            kind,
            detail,
            reason,
        })]
    }

    fn answer_elicitation(
        &mut self,
        id: RequestId,
        p: &wire::McpServerElicitationRequestParams,
    ) -> Vec<Action> {
        let respond = |id: RequestId, response: wire::McpServerElicitationResponse| {
            Action::Send(Message::Response(wire::Response {
                id,
                result: serde_json::to_value(response).unwrap_or_default(),
            }))
        };
        match self.elicitation(p) {
            Elicitation::RunRelayTool => {
                tracing::debug!(server = %p.server_name, "codex: relay tool call accepted");
                vec![respond(
                    id,
                    wire::McpServerElicitationResponse::accept_tool_call(),
                )]
            }
            Elicitation::Approval {
                turn_id,
                detail,
                reason,
            } => self.surface(
                id,
                AnswerShape::ToolCall,
                turn_id,
                ApprovalKind::Other,
                detail,
                reason,
            ),
            Elicitation::Decline { why } => {
                tracing::warn!(server = %p.server_name, %why, "codex: elicitation declined");
                vec![
                    respond(
                        id,
                        wire::McpServerElicitationResponse::declined(
                            wire::McpElicitationAction::Decline,
                        ),
                    ),
                    Action::Event(HarnessEvent::Warning { message: why }),
                ]
            }
        }
    }

    fn file_change_detail(&self, p: &wire::FileChangeRequestApprovalParams) -> String {
        let mut lines: Vec<String> = self
            .file_changes
            .get(&p.item_id)
            .map(|changes| {
                changes
                    .iter()
                    .map(|c| format!("{} {}", c.kind_name(), c.path))
                    .collect()
            })
            .unwrap_or_default();
        if let Some(root) = &p.grant_root {
            lines.push(format!("write access to {root}"));
        }
        if lines.is_empty() {
            lines.push(format!("file change {}", p.item_id));
        }
        lines.join("\n")
    }
}

/// The [`Translator`] as the [`stdio::Wire`] of a `codex app-server` child, with the
/// ids of the requests Relay sends.
pub(crate) struct CodexWire {
    pub translator: Translator,
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
        out.extend(self.translator.handle_line(line).into_iter().filter_map(
            |action| match action {
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
            },
        ));
    }

    fn malformed_counter(&self) -> Option<Arc<AtomicU64>> {
        Some(self.translator.malformed.clone())
    }
}

fn refuse(id: RequestId, code: i64, message: String) -> Action {
    Action::Send(Message::Error(wire::ErrorResponse {
        id,
        error: wire::ErrorObject {
            code,
            message,
            data: None,
        },
    }))
}

fn last_agent_message(items: &[ThreadItem]) -> Option<String> {
    items.iter().rev().find_map(|item| match item {
        ThreadItem::Known(KnownThreadItem::AgentMessage { text, .. }) => Some(text.clone()),
        _ => None,
    })
}

pub(crate) fn item_kind(item: &ThreadItem) -> ItemKind {
    match item {
        ThreadItem::Known(known) => match known {
            KnownThreadItem::UserMessage { .. } => ItemKind::UserMessage,
            KnownThreadItem::AgentMessage { .. } => ItemKind::AgentMessage,
            KnownThreadItem::Plan { .. } => ItemKind::Plan,
            KnownThreadItem::Reasoning { .. } => ItemKind::Reasoning,
            KnownThreadItem::CommandExecution { .. } => ItemKind::CommandExecution,
            KnownThreadItem::FileChange { .. } => ItemKind::FileChange,
            KnownThreadItem::McpToolCall { .. }
            | KnownThreadItem::DynamicToolCall { .. }
            | KnownThreadItem::WebSearch { .. } => ItemKind::ToolCall,
        },
        ThreadItem::Other(other) => match other.item_type.as_str() {
            // Tool calls Relay has no fields for are still tool calls.
            "collabAgentToolCall" => ItemKind::ToolCall,
            name => ItemKind::Other(name.to_string()),
        },
    }
}

/// The text an `ItemCompleted` carries: what a person would want to see of the item.
fn item_text(item: &ThreadItem) -> Option<String> {
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

fn plan_text(explanation: Option<&str>, steps: &[wire::TurnPlanStep]) -> String {
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

fn command_approval_detail(
    p: &wire::CommandExecutionRequestApprovalParams,
) -> (ApprovalKind, String) {
    if let Some(ctx) = &p.network_approval_context {
        let host = ctx.get("host").and_then(Value::as_str).unwrap_or("?");
        return (ApprovalKind::Other, format!("network access to {host}"));
    }
    match (&p.command, p.kind.as_deref()) {
        // Input to a running process, or a command shown rather than run: what a rule
        // names is a command line, so these go to a person.
        (Some(command), Some(kind)) if kind != "command" => {
            (ApprovalKind::Other, format!("{kind}: {command}"))
        }
        // The whole command, as it will run: policies and people decide on that.
        (Some(command), _) => (ApprovalKind::Command, command.clone()),
        (None, _) => (
            ApprovalKind::Other,
            p.reason
                .clone()
                .unwrap_or_else(|| format!("item {}", p.item_id)),
        ),
    }
}

#[cfg(test)]
mod tests;
