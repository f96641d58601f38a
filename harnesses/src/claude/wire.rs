//! Claude Code's stream-json as a [`Wire`]: each stdout line read into harness events,
//! answers and replies, and the state that needs (the turn running, the pending
//! permission prompts; the turn's items are `items.rs`). No I/O: the owner task of
//! [`crate::stdio`] feeds it lines, and the session's calls build their lines here.
//!
//! The turn is the one Relay started: Claude Code has no turn ids, so every event carries
//! the id given to [`ClaudeWire::start_turn`], and a `result` line ends it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::stream_json::{
    CanUseTool, ControlReply, ControlRequest, ControlResponse, HostRequest, Input, Line,
    PermissionResult, System, TurnResult, SYNTHETIC,
};
use relay_protocol::domain::{ApprovalDecision, Harness};
use relay_protocol::harness::{HarnessEvent, TurnOutcome};
use serde_json::Value;
use tokio::sync::watch;

use super::items::{approval_detail, str_field, Items};
use crate::access::MCP_SERVER;
use crate::error::HarnessError;
use crate::stdio::{Action, Outgoing, Wire};

/// The message the model gets for a declined tool call.
pub const DECLINED: &str = "declined through Relay";
/// The message the model gets for a tool call cancelled with its turn.
pub const CANCELLED: &str = "cancelled through Relay; the turn was stopped";
/// The error answering a request of Claude Code that Relay does not serve.
pub const NOT_SUPPORTED: &str = "not supported by Relay";

/// The running turn, as the session handle sees it (`None` between turns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    pub turn_id: String,
    /// An interrupt (or a cancelled approval) was sent: the turn ends in a moment.
    pub interrupting: bool,
}

/// The stream-json protocol state of one `claude` process.
pub struct ClaudeWire {
    turn: Option<Turn>,
    running: watch::Sender<Option<Running>>,
    /// Pending `can_use_tool` prompts: request id -> the input asked about.
    approvals: HashMap<String, Value>,
    next_request: u64,
    malformed: Arc<AtomicU64>,
    /// Relay's own MCP server is wired in (`--mcp-config`): its tools
    /// (`mcp__relay__*`) run without a prompt to a person.
    relay_mcp: bool,
    /// The model `system/init` names (`claude-opus-4-8[1m]`): the turn's model when no
    /// message of the API named one.
    init_model: Option<String>,
    /// The last `result`'s `total_cost_usd`: Claude Code adds up the cost over the
    /// process's life (while each `result`'s usage is the turn's alone), so a turn's
    /// cost is the difference.
    session_cost_usd: f64,
}

struct Turn {
    id: String,
    /// `TurnStarted` was sent (at Claude Code's first line after the user message).
    announced: bool,
    interrupting: bool,
    items: Items,
    /// The model that answered, as the API named it in the turn's last message.
    model: Option<String>,
}

impl Default for ClaudeWire {
    fn default() -> Self {
        Self::new()
    }
}

impl ClaudeWire {
    pub fn new() -> Self {
        Self {
            turn: None,
            running: watch::channel(None).0,
            approvals: HashMap::new(),
            next_request: 0,
            malformed: Arc::default(),
            relay_mcp: false,
            init_model: None,
            session_cost_usd: 0.0,
        }
    }

    /// With Relay's MCP server wired in: permission prompts for its tools are allowed at
    /// once, since the agent's scoped token bounds what they can do. Any other tool still
    /// asks a person.
    pub fn with_relay_mcp(mut self, relay_mcp: bool) -> Self {
        self.relay_mcp = relay_mcp;
        self
    }

    /// Whether `tool` is one of Relay's own MCP tools (and Relay wired them in).
    fn is_relay_tool(&self, tool: &str) -> bool {
        self.relay_mcp
            && tool
                .strip_prefix("mcp__")
                .and_then(|t| t.strip_prefix(MCP_SERVER))
                .is_some_and(|t| t.starts_with("__"))
    }

    /// Follows the running turn.
    pub fn running(&self) -> watch::Receiver<Option<Running>> {
        self.running.subscribe()
    }

    /// Counts the stdout lines that were not stream-json (each logged and skipped).
    pub fn malformed(&self) -> Arc<AtomicU64> {
        self.malformed.clone()
    }

    fn request_id(&mut self, what: &str) -> String {
        self.next_request += 1;
        format!("relay-{what}-{}", self.next_request)
    }

    /// The handshake; answered once Claude Code is ready (never when it refuses the
    /// session it was started with: it exits instead).
    pub fn initialize(&mut self) -> Result<Outgoing, HarnessError> {
        let id = self.request_id("init");
        let line = Input::ControlRequest {
            request_id: id.clone(),
            request: HostRequest::Initialize,
        };
        Ok(Outgoing::request(serde_json::to_value(line)?, id))
    }

    /// Starts turn `turn_id` with `text`; [`HarnessError::TurnRunning`] while another runs.
    pub fn start_turn(&mut self, turn_id: &str, text: &str) -> Result<Outgoing, HarnessError> {
        if let Some(turn) = &self.turn {
            return Err(HarnessError::TurnRunning {
                turn_id: turn.id.clone(),
            });
        }
        let line = serde_json::to_value(Input::user(text))?;
        self.turn = Some(Turn {
            id: turn_id.to_string(),
            announced: false,
            interrupting: false,
            items: Items::new(turn_id),
            model: None,
        });
        self.publish();
        Ok(Outgoing::send(line))
    }

    /// Stops turn `turn_id`; answered by Claude Code's control response, and the turn then
    /// ends with `result`. [`HarnessError::NoActiveTurn`] when it is not running.
    pub fn interrupt(&mut self, turn_id: &str) -> Result<Outgoing, HarnessError> {
        match &mut self.turn {
            Some(turn) if turn.id == turn_id => turn.interrupting = true,
            Some(turn) => {
                return Err(HarnessError::NoActiveTurn {
                    detail: format!("turn {turn_id} is not running (turn {} is)", turn.id),
                })
            }
            None => {
                return Err(HarnessError::NoActiveTurn {
                    detail: format!("no turn is running to interrupt (asked for {turn_id})"),
                })
            }
        }
        self.publish();
        let id = self.request_id("interrupt");
        let line = Input::ControlRequest {
            request_id: id.clone(),
            request: HostRequest::Interrupt,
        };
        Ok(Outgoing::request(serde_json::to_value(line)?, id))
    }

    /// Answers the permission prompt `request_id`. Cancel also stops the turn.
    pub fn respond(
        &mut self,
        request_id: &str,
        decision: ApprovalDecision,
    ) -> Result<Outgoing, HarnessError> {
        let Some(input) = self.approvals.remove(request_id) else {
            return Err(HarnessError::UnknownRequest {
                request_id: request_id.to_string(),
            });
        };
        let response = match decision {
            // Claude Code's own "for the session" is a rule it would write to the
            // project's settings; Relay keeps such decisions to itself.
            ApprovalDecision::Accept | ApprovalDecision::AcceptForSession => {
                PermissionResult::Allow {
                    updated_input: input,
                }
            }
            ApprovalDecision::Decline => PermissionResult::Deny {
                message: DECLINED.into(),
                interrupt: false,
            },
            ApprovalDecision::Cancel => {
                if let Some(turn) = &mut self.turn {
                    turn.interrupting = true;
                }
                self.publish();
                PermissionResult::Deny {
                    message: CANCELLED.into(),
                    interrupt: true,
                }
            }
        };
        let line = Input::ControlResponse {
            response: ControlReply::Success {
                request_id: request_id.to_string(),
                response,
            },
        };
        Ok(Outgoing::send(serde_json::to_value(line)?))
    }

    /// The running turn's items; none for a subagent's lines (inside a `Task` call,
    /// which is the item) or outside a turn.
    fn items(&mut self, parent_tool_use_id: Option<&str>) -> Option<&mut Items> {
        match parent_tool_use_id {
            Some(_) => None,
            None => self.turn.as_mut().map(|t| &mut t.items),
        }
    }

    fn publish(&self) {
        let running = self.turn.as_ref().map(|t| Running {
            turn_id: t.id.clone(),
            interrupting: t.interrupting,
        });
        self.running.send_replace(running);
    }

    fn control_request(&mut self, request: ControlRequest, out: &mut Vec<Action>) {
        let refuse = |request_id: String, error: &str| {
            let line = Input::ControlResponse {
                response: ControlReply::Error {
                    request_id,
                    error: error.to_string(),
                },
            };
            serde_json::to_value(line).map(Action::Send)
        };
        let can_use = (request.subtype() == CanUseTool::SUBTYPE)
            .then(|| serde_json::from_value::<CanUseTool>(request.request.clone()));
        let action = match (can_use, &self.turn) {
            (Some(Ok(ask)), Some(_)) if self.is_relay_tool(&ask.tool_name) => {
                tracing::debug!(tool = %ask.tool_name, "claude: relay tool allowed");
                let line = Input::ControlResponse {
                    response: ControlReply::Success {
                        request_id: request.request_id,
                        response: PermissionResult::Allow {
                            updated_input: ask.input,
                        },
                    },
                };
                serde_json::to_value(line).map(Action::Send)
            }
            (Some(Ok(ask)), Some(turn)) => {
                let (kind, detail) = approval_detail(&ask);
                out.push(Action::Event(HarnessEvent::ApprovalRequested {
                    turn_id: turn.id.clone(),
                    request_id: request.request_id.clone(),
                    kind,
                    detail,
                    reason: str_field(&ask.input, "description")
                        .map(str::to_string)
                        .or(ask.decision_reason),
                }));
                self.approvals.insert(request.request_id, ask.input);
                return;
            }
            (Some(Ok(_)), None) => {
                tracing::warn!(id = %request.request_id, "claude asked for a permission outside a turn; denied");
                let line = Input::ControlResponse {
                    response: ControlReply::Success {
                        request_id: request.request_id,
                        response: PermissionResult::Deny {
                            message: "no Relay turn is running".into(),
                            interrupt: false,
                        },
                    },
                };
                serde_json::to_value(line).map(Action::Send)
            }
            (Some(Err(err)), _) => {
                tracing::warn!(%err, "unreadable claude permission request; refused");
                refuse(request.request_id, NOT_SUPPORTED)
            }
            (None, _) => {
                tracing::debug!(
                    subtype = request.subtype(),
                    "claude control request refused"
                );
                refuse(request.request_id, NOT_SUPPORTED)
            }
        };
        match action {
            Ok(action) => out.push(action),
            Err(err) => tracing::warn!(%err, "cannot encode the answer to claude"),
        }
    }

    fn result(&mut self, result: TurnResult, out: &mut Vec<Action>) {
        let Some(turn) = self.turn.take() else {
            // The `result` of a session Claude Code refused to resume, before it exits.
            tracing::debug!(subtype = %result.subtype, "claude result outside a turn");
            return;
        };
        turn.items.finish(out);
        let mut settled: Vec<_> = self.approvals.drain().map(|(id, _)| id).collect();
        settled.sort();
        for request_id in settled {
            out.push(Action::Event(HarnessEvent::ApprovalResolved { request_id }));
        }
        // After an interrupt, and when the model request failed, Claude Code counts none.
        let model = turn.model.clone().or_else(|| self.init_model.clone());
        let cost = result.total_cost_usd.map(|total| {
            let before = std::mem::replace(&mut self.session_cost_usd, total);
            // Less than before: a count that started again, all of it this turn's.
            if total >= before {
                total - before
            } else {
                total
            }
        });
        if let Some(usage) = result.token_usage(model, cost) {
            out.push(Action::Event(HarnessEvent::TokenUsage {
                turn_id: turn.id.clone(),
                usage,
            }));
        }
        let ok = result.subtype == TurnResult::SUCCESS && !result.is_error;
        let outcome = if ok {
            TurnOutcome::Completed {
                text: result.result.unwrap_or_default(),
            }
        } else if turn.interrupting && result.subtype != TurnResult::SUCCESS {
            TurnOutcome::Interrupted
        } else {
            TurnOutcome::Failed {
                error: failure(result),
            }
        };
        out.push(Action::Event(HarnessEvent::TurnCompleted {
            turn_id: turn.id,
            outcome,
        }));
        self.publish();
    }
}

impl Wire for ClaudeWire {
    const NAME: &'static str = "claude";

    fn line(&mut self, line: &str, out: &mut Vec<Action>) {
        let line: Line = match serde_json::from_str(line) {
            Ok(line) => line,
            Err(err) => {
                self.malformed.fetch_add(1, Ordering::Relaxed);
                let head: String = line.chars().take(200).collect();
                tracing::warn!(%err, line = %head, "skipped a claude stdout line that is not stream-json");
                return;
            }
        };
        // Claude Code's first line after the user message: the turn has begun.
        if let Some(turn) = &mut self.turn {
            if !turn.announced && !matches!(line, Line::ControlResponse(_) | Line::Other) {
                turn.announced = true;
                out.push(Action::Event(HarnessEvent::TurnStarted {
                    turn_id: turn.id.clone(),
                }));
            }
        }
        match line {
            Line::StreamEvent(l) => {
                if let Some(items) = self.items(l.parent_tool_use_id.as_deref()) {
                    items.stream_event(l.event, out);
                }
            }
            Line::Assistant(l) => {
                if let (Some(turn), None) = (&mut self.turn, &l.parent_tool_use_id) {
                    // `<synthetic>` is Claude Code's own message about a failed request.
                    if let Some(model) = l.message.model.as_ref().filter(|m| *m != SYNTHETIC) {
                        turn.model = Some(model.clone());
                    }
                }
                if let Some(items) = self.items(l.parent_tool_use_id.as_deref()) {
                    items.assistant(l, out);
                }
            }
            Line::User(l) => {
                if let Some(items) = self.items(l.parent_tool_use_id.as_deref()) {
                    items.user(&l, out);
                }
            }
            Line::Result(result) => self.result(result, out),
            Line::ControlRequest(request) => self.control_request(request, out),
            Line::ControlResponse(l) => out.push(answer(l.response)),
            Line::ControlCancelRequest(cancel) => {
                if self.approvals.remove(&cancel.request_id).is_some() {
                    out.push(Action::Event(HarnessEvent::ApprovalResolved {
                        request_id: cancel.request_id,
                    }));
                }
            }
            // The model cannot be reached (or refuses): a note, which the runtime's stall
            // watchdog counts from.
            Line::System(system) if system.subtype == System::API_RETRY => {
                out.push(Action::Event(HarnessEvent::Retrying {
                    message: system.retry_note(),
                }))
            }
            Line::System(system) if system.subtype == System::INIT => {
                if let Some(model) = system.model {
                    self.init_model = Some(model);
                }
            }
            Line::System(_) => {}
            Line::Other => tracing::debug!("claude line of an unknown type skipped"),
        }
    }
}

fn answer(response: ControlResponse) -> Action {
    let result = if response.subtype == "success" {
        Ok(response.response)
    } else {
        Err(HarnessError::Rpc {
            // Claude Code's control errors have no code.
            code: 0,
            message: response
                .error
                .unwrap_or_else(|| format!("control request {}", response.subtype)),
        })
    };
    Action::Answer {
        id: response.request_id,
        result,
    }
}

/// Claude Code's own word for why the turn failed.
fn failure(result: TurnResult) -> String {
    if let Some(text) = result.result.filter(|t| !t.trim().is_empty()) {
        return text;
    }
    let errors: Vec<String> = result
        .errors
        .iter()
        .map(|e| match e {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect();
    if errors.is_empty() {
        result.subtype
    } else {
        errors.join("; ")
    }
}

/// What `steer` says: Claude Code takes no text into a running turn that Relay could
/// rely on (a user message sent meanwhile becomes the next turn, or is folded into the
/// running one between tool calls).
pub fn cannot_steer() -> HarnessError {
    HarnessError::Incapable {
        harness: Harness::ClaudeStreamJson,
        what: "add text to a running turn".into(),
    }
}

#[cfg(test)]
mod tests;
