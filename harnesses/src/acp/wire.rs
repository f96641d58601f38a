//! An ACP agent's stdout read into [`HarnessEvent`]s, and the requests written to it:
//! the [`Wire`] the stdio owner runs. Pure: no I/O, so the tests feed it lines.
//!
//! ACP has no turn ids: the turn running is the one whose `session/prompt` this wire
//! wrote, until its answer (the `stopReason`) comes. Its events are stamped with
//! Relay's turn id; items are named `<turn>-i<n>`, tools by the agent's `toolCallId`.
//! Updates that come while no turn runs are a `session/load`'s replay of history (or
//! a late word of an ended turn): counted in [`AcpWire::quiet_counter`], never shown.

mod turn;
mod usage;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use relay_protocol::acp::{
    self, method, Message, PermissionOptionKind, PermissionOutcome, PromptResponse, RequestId,
    RequestPermissionRequest, RequestPermissionResponse, RpcError, SessionNotification,
    SessionUpdate, ToolKind,
};
use relay_protocol::domain::{ApprovalDecision, ApprovalKind};
use relay_protocol::harness::{HarnessEvent, ItemKind, TurnOutcome};
use serde::Serialize;
use serde_json::Value;

use self::turn::Turn;
use crate::error::HarnessError;
use crate::pinned::GEMINI_VERSION;
use crate::stdio::{Action, Outgoing, Wire};

/// A permission request surfaced as a Relay approval, until answered.
#[derive(Debug)]
struct Pending {
    id: RequestId,
    /// The option ids that mean "yes, this once" and "no, this once".
    allow: Option<String>,
    reject: Option<String>,
}

/// The ACP client's state: request ids, the session, the turn running, the permission
/// requests waiting for a person.
#[derive(Debug, Default)]
pub struct AcpWire {
    next_id: i64,
    /// The session whose updates are read (others are logged and skipped).
    session: Option<String>,
    turn: Option<Turn>,
    pending: HashMap<String, Pending>,
    /// Updates read while no turn ran (a load's replay): the launcher waits for it to
    /// go quiet.
    quiet: Arc<AtomicU64>,
    malformed: Arc<AtomicU64>,
    /// Update kinds and methods Relay does not know, each logged once.
    unknown: HashSet<String>,
    /// A command's title is the command line itself, when it has no `rawInput` (Gemini
    /// CLI's `run_shell_command` sends none; its title is the command it runs). Only
    /// for the Gemini CLI version that was checked ([`GEMINI_VERSION`]): its answer to
    /// `initialize` turns it off for any other.
    title_is_command: bool,
    /// The id of the `initialize` request, whose answer names the agent's version.
    initialize: Option<String>,
}

impl Wire for AcpWire {
    const NAME: &'static str = "acp";

    fn line(&mut self, line: &str, out: &mut Vec<Action>) {
        match Message::parse(line) {
            Ok(message) => self.read(message, out),
            Err(err) => {
                // A request we cannot read is still answered, so the agent is not left
                // waiting for it.
                if let acp::LineError::NotRpc { id: Some(id), .. } = &err {
                    out.push(send(&Message::error(id.clone(), err.rpc_error())));
                }
                out.push(Action::Malformed(err.to_string()));
                self.broken(line, out);
            }
        }
    }

    fn malformed_counter(&self) -> Option<Arc<AtomicU64>> {
        Some(self.malformed.clone())
    }
}

fn send(message: &Message) -> Action {
    Action::Send(serde_json::from_str(&message.to_line()).unwrap_or(Value::Null))
}

impl AcpWire {
    /// A wire for an agent whose `execute` calls are titled with their command line
    /// (Gemini CLI), taken as the command when the call has no `rawInput.command`.
    pub fn titled_by_command() -> AcpWire {
        AcpWire {
            title_is_command: true,
            ..AcpWire::default()
        }
    }

    /// The counter of updates read while no turn ran (see the module).
    pub fn quiet_counter(&self) -> Arc<AtomicU64> {
        self.quiet.clone()
    }

    /// A request of `method`; its answer comes as [`Action::Answer`] with the id.
    pub fn request(&mut self, method: &str, params: impl Serialize) -> Outgoing {
        self.next_id += 1;
        let id = self.next_id;
        if method == method::INITIALIZE {
            self.initialize = Some(id.to_string());
        }
        let message = Message::request(RequestId::Number(id), method, params);
        let value = serde_json::from_str(&message.to_line()).unwrap_or(Value::Null);
        Outgoing::request(value, id.to_string())
    }

    /// The session whose updates are read from now on.
    pub fn set_session(&mut self, session: &str) {
        self.session = Some(session.to_string());
    }

    /// `session/prompt` starting turn `turn_id` in `session`.
    pub fn prompt(
        &mut self,
        session: &str,
        turn_id: &str,
        text: &str,
    ) -> Result<Outgoing, HarnessError> {
        if let Some(turn) = &self.turn {
            return Err(HarnessError::TurnRunning {
                turn_id: turn.id.clone(),
            });
        }
        self.session = Some(session.to_string());
        let outgoing = self.request(
            method::SESSION_PROMPT,
            acp::PromptRequest {
                session_id: session.to_string(),
                prompt: vec![acp::ContentBlock::text(text)],
            },
        );
        let prompt = outgoing.awaits.clone().unwrap_or_default();
        self.turn = Some(Turn::new(turn_id, prompt));
        // Answered once written: the prompt's own answer is the turn's end.
        Ok(Outgoing::send(outgoing.message))
    }

    /// `session/cancel` of turn `turn_id` (a notification; the prompt then answers
    /// `cancelled`). Pending permission requests are answered `cancelled`, as ACP asks
    /// of a client that cancels.
    pub fn cancel(&mut self, session: &str, turn_id: &str) -> Result<Outgoing, HarnessError> {
        match self.turn.as_mut() {
            Some(turn) if turn.id == turn_id => turn.cancelled = true,
            Some(turn) => {
                return Err(HarnessError::NoActiveTurn {
                    detail: format!(
                        "no active turn {turn_id} to interrupt (the agent runs {})",
                        turn.id
                    ),
                })
            }
            None => {
                return Err(HarnessError::NoActiveTurn {
                    detail: format!("no active turn {turn_id} to interrupt"),
                })
            }
        }
        let message = Message::notification(
            method::SESSION_CANCEL,
            acp::CancelNotification {
                session_id: session.to_string(),
            },
        );
        Ok(Outgoing::send(
            serde_json::from_str(&message.to_line()).unwrap_or(Value::Null),
        ))
    }

    /// One permission request still waiting, answered `cancelled` (after a cancel:
    /// ACP asks a client that cancels to answer them so), and its approval settled
    /// (`ApprovalResolved`, before the answer is written); [`HarnessError::UnknownRequest`]
    /// when none is left.
    pub fn cancel_one_pending(&mut self) -> Result<Outgoing, HarnessError> {
        let key = self.pending.keys().next().cloned();
        let Some((request_id, p)) = key.and_then(|k| self.pending.remove_entry(&k)) else {
            return Err(HarnessError::UnknownRequest {
                request_id: "(none pending)".into(),
            });
        };
        let answer = Message::ok(
            p.id,
            RequestPermissionResponse {
                outcome: PermissionOutcome::Cancelled,
            },
        );
        Ok(
            Outgoing::send(serde_json::from_str(&answer.to_line()).unwrap_or(Value::Null))
                .with_event(HarnessEvent::ApprovalResolved { request_id }),
        )
    }

    /// The answer to permission request `request_id`: the option that allows it once
    /// (accept, even "for the session": "always" options are never chosen) or rejects
    /// it once (decline, cancel). [`HarnessError::UnknownRequest`] when it is not
    /// pending.
    pub fn answer(
        &mut self,
        request_id: &str,
        decision: ApprovalDecision,
    ) -> Result<Outgoing, HarnessError> {
        let unknown = || HarnessError::UnknownRequest {
            request_id: request_id.to_string(),
        };
        let pending = self.pending.remove(request_id).ok_or_else(unknown)?;
        let option = match decision {
            ApprovalDecision::Accept | ApprovalDecision::AcceptForSession => pending.allow,
            ApprovalDecision::Decline | ApprovalDecision::Cancel => pending.reject,
        };
        let outcome = match option {
            Some(option_id) => PermissionOutcome::Selected { option_id },
            // No such option offered: the only other answer ACP has.
            None => PermissionOutcome::Cancelled,
        };
        let answer = Message::ok(pending.id, RequestPermissionResponse { outcome });
        Ok(Outgoing::send(
            serde_json::from_str(&answer.to_line()).unwrap_or(Value::Null),
        ))
    }

    /// A line that is not JSON-RPC: before a turn it is skipped (a banner); during one
    /// the stream can no longer be trusted to say how the turn goes, so the turn fails
    /// saying why, and the agent is told to stop it.
    fn broken(&mut self, line: &str, out: &mut Vec<Action>) {
        let Some(turn) = self.turn.take() else {
            return;
        };
        if let Some(session) = &self.session {
            let cancel = Message::notification(
                method::SESSION_CANCEL,
                acp::CancelNotification {
                    session_id: session.clone(),
                },
            );
            out.push(send(&cancel));
        }
        // Its permission requests are answered too (as after any cancel): the agent
        // waits on them, and would never end the turn.
        for (request_id, pending) in self.pending.drain() {
            out.push(send(&Message::ok(
                pending.id,
                RequestPermissionResponse {
                    outcome: PermissionOutcome::Cancelled,
                },
            )));
            out.push(Action::Event(HarnessEvent::ApprovalResolved { request_id }));
        }
        let shown: String = line.chars().take(200).collect();
        let error = format!(
            "the agent wrote a line on stdout that is not ACP's JSON-RPC, so its turn cannot be followed: {shown:?}"
        );
        turn.finish(TurnOutcome::Failed { error }, &mut |e| {
            out.push(Action::Event(e))
        });
    }

    /// Keeps taking titles as commands only if the agent's answer to `initialize`
    /// says it is the checked Gemini CLI: in Gemini CLI a tool's title defaults to
    /// its `getDescription()`, which for a long shell command is the model's own
    /// description, and 0.61.0 is the version seen to title shell calls with the
    /// command. Elsewhere such a call is an `Other` approval (a person decides).
    fn trust_titles_of(&mut self, init: &Value) {
        let version = init
            .pointer("/agentInfo/version")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if self.title_is_command && version != GEMINI_VERSION {
            self.title_is_command = false;
            tracing::info!(
                version,
                checked = GEMINI_VERSION,
                "acp: not the checked Gemini CLI version: its shell calls' titles are not taken as their commands (no policy reads them)"
            );
        }
    }

    /// Logs `what` the first time only.
    fn unknown_once(&mut self, what: String) {
        if self.unknown.insert(what.clone()) {
            tracing::info!(what = %what, "acp: skipping what Relay does not use (logged once)");
        }
    }

    fn read(&mut self, message: Message, out: &mut Vec<Action>) {
        match message {
            Message::Response { id, result } => self.response(id, result, out),
            Message::Notification { method, params } if method == method::SESSION_UPDATE => {
                self.update(params, out)
            }
            Message::Notification { method, .. } => {
                self.unknown_once(format!("notification {method}"))
            }
            Message::Request { id, method, params } if method == method::REQUEST_PERMISSION => {
                self.permission(id, params, out)
            }
            Message::Request { id, method, .. } => {
                // Qwen Code's `craft/drainMidTurnQueue`, `fs/*` and `terminal/*` (Relay
                // offers neither), anything newer: refused, and the turn goes on.
                self.unknown_once(format!("request {method}"));
                out.push(send(&Message::error(
                    id,
                    RpcError::method_not_found(&method),
                )));
            }
        }
    }

    fn response(&mut self, id: RequestId, result: Result<Value, RpcError>, out: &mut Vec<Action>) {
        let id = id.to_string();
        if self.turn.as_ref().is_some_and(|t| t.prompt == id) {
            let Some(turn) = self.turn.take() else {
                return;
            };
            // The turn is over: whatever the agent still asked of it is moot.
            for (request_id, _) in self.pending.drain() {
                out.push(Action::Event(HarnessEvent::ApprovalResolved { request_id }));
            }
            let emit = &mut |e| out.push(Action::Event(e));
            match result {
                Ok(value) => match serde_json::from_value::<PromptResponse>(value) {
                    Ok(r) => turn.end(r, emit),
                    Err(e) => turn.finish(
                        TurnOutcome::Failed {
                            error: format!("the agent's answer to the prompt is not ACP's: {e}"),
                        },
                        emit,
                    ),
                },
                Err(e) => turn.finish(
                    TurnOutcome::Failed {
                        error: format!("the agent failed the prompt: {e}"),
                    },
                    emit,
                ),
            }
            return;
        }
        if self.initialize.as_deref() == Some(id.as_str()) {
            if let Ok(init) = &result {
                self.trust_titles_of(init);
            }
        }
        let result = result.map_err(|e| HarnessError::Rpc {
            code: e.code,
            message: e.message,
        });
        out.push(Action::Answer { id, result });
    }

    fn update(&mut self, params: Value, out: &mut Vec<Action>) {
        let kind = SessionNotification::kind_of(&params).map(str::to_string);
        let n = match serde_json::from_value::<SessionNotification>(params) {
            Ok(n) => n,
            Err(e) => {
                out.push(Action::Malformed(format!(
                    "session/update {}: {e}",
                    kind.as_deref().unwrap_or("without a kind")
                )));
                return;
            }
        };
        if self.session.as_ref().is_some_and(|s| *s != n.session_id) {
            tracing::debug!(session = %n.session_id, "acp: update of another session");
            return;
        }
        let Some(turn) = self.turn.as_mut() else {
            // A load's replay of history (or a late word): not new output.
            self.quiet.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let emit = &mut |e| out.push(Action::Event(e));
        match n.update {
            SessionUpdate::AgentMessageChunk(c) => turn.chunk(ItemKind::AgentMessage, c, emit),
            SessionUpdate::AgentThoughtChunk(c) => turn.chunk(ItemKind::Reasoning, c, emit),
            SessionUpdate::ToolCall(call) => turn.tool_call(call, emit),
            SessionUpdate::ToolCallUpdate(u) => turn.tool_update(u, emit),
            SessionUpdate::Plan(plan) => turn.plan(plan, emit),
            SessionUpdate::UsageUpdate(u) => turn.context_usage(u, emit),
            SessionUpdate::UserMessageChunk(_) => {}
            SessionUpdate::Unknown => {
                self.unknown_once(format!("update {}", kind.unwrap_or_default()));
            }
        }
    }

    /// `session/request_permission`: a Relay approval of the call as it will run.
    fn permission(&mut self, id: RequestId, params: Value, out: &mut Vec<Action>) {
        let request: RequestPermissionRequest = match serde_json::from_value(params) {
            Ok(r) => r,
            Err(e) => {
                let error = RpcError::new(RpcError::INVALID_PARAMS, e.to_string());
                out.push(send(&Message::error(id, error)));
                out.push(Action::Malformed(format!(
                    "session/request_permission: {e}"
                )));
                return;
            }
        };
        let Some(turn) = self.turn.as_mut().filter(|t| !t.cancelled) else {
            // Nobody to ask outside a turn, or in one being cancelled (a request that
            // crossed Relay's `session/cancel`; the agent waits for its answer): no.
            let answer = Message::ok(
                id,
                RequestPermissionResponse {
                    outcome: PermissionOutcome::Cancelled,
                },
            );
            out.push(send(&answer));
            return;
        };
        let emit = &mut |e| out.push(Action::Event(e));
        turn.start(emit);
        let tool = turn.tool_seen(&request.tool_call);
        let command = tool.command().or_else(|| {
            (self.title_is_command
                && tool.kind == Some(ToolKind::Execute)
                && tool.raw_input.is_none()
                && !tool.title.trim().is_empty())
            .then(|| tool.title.clone())
        });
        let (kind, detail) = match (&tool.kind, command) {
            (Some(ToolKind::Execute) | None, Some(command)) => (ApprovalKind::Command, command),
            (Some(ToolKind::Edit | ToolKind::Delete | ToolKind::Move), _) => {
                (ApprovalKind::FileChange, tool.describe())
            }
            _ => (ApprovalKind::Other, tool.describe()),
        };
        let kind_name = tool.kind.as_ref().map(ToolKind::as_str).unwrap_or("other");
        let reason = Some(format!("{} ({kind_name})", tool.title).trim().to_string());
        let request_id = id.to_string();
        let option = |kind| request.option(kind).map(|o| o.option_id.clone());
        self.pending.insert(
            request_id.clone(),
            Pending {
                id,
                allow: option(PermissionOptionKind::AllowOnce),
                reject: option(PermissionOptionKind::RejectOnce),
            },
        );
        let turn_id = turn.id.clone();
        out.push(Action::Event(HarnessEvent::ApprovalRequested {
            turn_id,
            request_id,
            kind,
            detail,
            reason,
        }));
    }
}

#[cfg(test)]
mod tests;
