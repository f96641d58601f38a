//! Pi's RPC lines read into [`HarnessEvent`]s, and the commands written to it: the
//! [`Wire`] the stdio owner runs. Pure: no I/O, so the tests feed it recorded lines.
//!
//! Pi has no turn ids: the turn running is the one whose `prompt` this wire wrote last,
//! until the run it started is over. Its events are stamped with Relay's turn id; items
//! are named by the turn and the message's number in it (`<turn>-u<n>` for user
//! messages, `<turn>-m<n>-<block index>` for an assistant message's blocks), tools by
//! pi's `toolCallId`.
//!
//! A run that ends with an error may not be the turn's end: pi retries some errors
//! (overloaded, rate limits, 5xx, lost connections) and recovers from a context overflow
//! by compacting, each time with a new run after `agent_end`. It says so (`auto_retry_start`,
//! `compaction_start`) in the same breath as that `agent_end`, before it reads its next
//! command; so the wire answers such an `agent_end` with a `get_state` probe, and the turn
//! fails when the probe's answer comes first ([`Phase::Ending`]).

mod turn;

use relay_protocol::harness::{HarnessEvent, TurnOutcome};
use serde_json::{json, Value};

use self::turn::{outcome, Phase, Turn};
use super::rpc::Line;
use crate::error::HarnessError;
use crate::stdio::{Action, Outgoing, Wire};

/// The `code` of [`HarnessError::Rpc`] for pi's refusals: its responses carry none.
pub(crate) const REFUSED: i64 = 0;
/// Pi's `finalError` when an abort cancelled the wait for a retry.
const RETRY_CANCELLED: &str = "Retry cancelled";

/// Pi's RPC state: the request ids and the turn running.
#[derive(Debug, Default)]
pub struct PiWire {
    next_id: u64,
    turn: Option<Turn>,
    /// The probe written on the last failed `agent_end`, until answered.
    probe: Option<String>,
}

impl Wire for PiWire {
    const NAME: &'static str = "pi";

    fn line(&mut self, line: &str, out: &mut Vec<Action>) {
        match serde_json::from_str::<Line>(line) {
            Ok(line) => self.read(line, out),
            Err(err) => out.push(Action::Malformed(err.to_string())),
        }
    }
}

impl PiWire {
    fn next_id(&mut self) -> String {
        self.next_id += 1;
        format!("relay-{}", self.next_id)
    }

    fn request(&mut self, command: &str, mut message: Value) -> Outgoing {
        let id = self.next_id();
        message["id"] = json!(id);
        message["type"] = json!(command);
        Outgoing::request(message, id)
    }

    /// `get_state`: answers the session's id (`sessionId`) and file.
    pub fn get_state(&mut self) -> Outgoing {
        self.request("get_state", json!({}))
    }

    /// `get_fork_messages`: the user messages of the session's branch, oldest first, each
    /// with its `entryId` and `text`.
    pub fn fork_messages(&mut self) -> Outgoing {
        self.request("get_fork_messages", json!({}))
    }

    /// `fork` at user message `entry_id`: pi switches to a new session holding what came
    /// before that message.
    pub fn fork(&mut self, entry_id: &str) -> Outgoing {
        self.request("fork", json!({ "entryId": entry_id }))
    }

    /// `prompt` starting turn `turn_id`: its events are stamped with it from now on.
    pub fn prompt(&mut self, turn_id: &str, text: &str) -> Result<Outgoing, HarnessError> {
        if let Some(turn) = &self.turn {
            return Err(HarnessError::Rpc {
                code: REFUSED,
                message: format!("pi is still running turn {}", turn.id),
            });
        }
        let outgoing = self.request("prompt", json!({ "message": text }));
        self.turn = Some(Turn::new(turn_id, outgoing.awaits.clone()));
        Ok(outgoing)
    }

    /// `steer` of turn `turn_id`. Pi itself would queue the text for its next prompt
    /// when idle, so a steer without that turn running is refused here.
    pub fn steer(&mut self, turn_id: &str, text: &str) -> Result<Outgoing, HarnessError> {
        self.running(turn_id, "steer")?;
        // Pi may be done: it would keep the text for the next prompt. Soon known.
        if let Some(Turn {
            phase: Phase::Ending { .. },
            ..
        }) = self.turn
        {
            return Err(HarnessError::NoActiveTurn {
                detail: format!("turn {turn_id} is ending; pi may retry it"),
            });
        }
        Ok(self.request("steer", json!({ "message": text })))
    }

    /// `abort` of turn `turn_id`; pi answers once the turn has ended.
    pub fn abort(&mut self, turn_id: &str) -> Result<Outgoing, HarnessError> {
        self.running(turn_id, "interrupt")?;
        Ok(self.request("abort", json!({})))
    }

    fn running(&self, turn_id: &str, what: &str) -> Result<(), HarnessError> {
        match &self.turn {
            Some(turn) if turn.id == turn_id => Ok(()),
            Some(turn) => Err(HarnessError::NoActiveTurn {
                detail: format!("no active turn {turn_id} to {what} (pi runs {})", turn.id),
            }),
            None => Err(HarnessError::NoActiveTurn {
                detail: format!("no active turn to {what}"),
            }),
        }
    }

    fn read(&mut self, line: Line, out: &mut Vec<Action>) {
        let warn = |message| Action::Event(HarnessEvent::Warning { message });
        match line {
            Line::Response { .. } | Line::ExtensionUiRequest { .. } => self.answer(line, out),
            Line::ExtensionError {
                extension_path,
                error,
            } => out.push(warn(format!(
                "pi extension {extension_path} failed: {error}"
            ))),
            Line::AutoRetryStart {
                attempt,
                max_attempts,
                error_message,
            } => {
                out.push(Action::Event(HarnessEvent::Retrying {
                    message: format!(
                        "pi retries ({attempt}/{max_attempts}) after: {error_message}"
                    ),
                }));
                self.retrying();
            }
            Line::CompactionStart { reason } if reason == "overflow" => self.retrying(),
            Line::AutoRetryEnd {
                success: false,
                final_error,
            } => {
                let outcome = match final_error {
                    Some(e) if e == RETRY_CANCELLED => TurnOutcome::Interrupted,
                    Some(error) => TurnOutcome::Failed { error },
                    None => match self.turn.as_ref().map(|t| &t.phase) {
                        Some(Phase::Ending { outcome, .. } | Phase::Retrying { outcome }) => {
                            outcome.clone()
                        }
                        _ => return,
                    },
                };
                self.finish_unless_running(outcome, out);
            }
            Line::CompactionEnd {
                reason,
                will_retry: false,
                error_message,
            } if reason == "overflow" => {
                if let Some(Phase::Retrying {
                    outcome: TurnOutcome::Failed { error },
                }) = self.turn.as_ref().map(|t| &t.phase)
                {
                    let error = match error_message {
                        Some(why) => format!("{error}; {why}"),
                        None => error.clone(),
                    };
                    self.finish_unless_running(TurnOutcome::Failed { error }, out);
                }
            }
            Line::AgentEnd { messages } => {
                let Some(turn) = self.turn.as_mut() else {
                    tracing::debug!("pi: agent_end outside a turn");
                    return;
                };
                if !turn.started {
                    turn.started = true;
                    out.push(Action::Event(HarnessEvent::TurnStarted {
                        turn_id: turn.id.clone(),
                    }));
                }
                match outcome(&messages) {
                    outcome @ TurnOutcome::Failed { .. } => {
                        let probe = self.next_id();
                        out.push(Action::Send(json!({"id": probe, "type": "get_state"})));
                        if let Some(turn) = self.turn.as_mut() {
                            turn.phase = Phase::Ending {
                                outcome,
                                probe: probe.clone(),
                            };
                        }
                        self.probe = Some(probe);
                    }
                    outcome => self.finish(outcome, out),
                }
            }
            Line::Other => {}
            line => match self.turn.as_mut() {
                Some(turn) => turn.read(line, &mut |e| out.push(Action::Event(e))),
                None => tracing::debug!(?line, "pi: event outside a turn"),
            },
        }
    }

    /// Pi runs the ending turn again.
    fn retrying(&mut self) {
        if let Some(turn) = self.turn.as_mut() {
            if let Phase::Ending { outcome, .. } = &turn.phase {
                turn.phase = Phase::Retrying {
                    outcome: outcome.clone(),
                };
            }
        }
    }

    /// Ends the turn with `outcome`.
    fn finish(&mut self, outcome: TurnOutcome, out: &mut Vec<Action>) {
        if let Some(turn) = self.turn.take() {
            out.push(Action::Event(HarnessEvent::TurnCompleted {
                turn_id: turn.id,
                outcome,
            }));
        }
    }

    /// Ends the turn with `outcome` if its run is over (ending, or waiting to retry).
    fn finish_unless_running(&mut self, outcome: TurnOutcome, out: &mut Vec<Action>) {
        if matches!(
            self.turn.as_ref().map(|t| &t.phase),
            Some(Phase::Ending { .. } | Phase::Retrying { .. })
        ) {
            self.finish(outcome, out);
        }
    }

    /// A response to one of Relay's commands, or a request of pi's own.
    fn answer(&mut self, line: Line, out: &mut Vec<Action>) {
        match line {
            Line::Response {
                id,
                command,
                success,
                data,
                error,
            } => {
                let Some(id) = id else {
                    // Pi names no request when it cannot read one, or does not know it.
                    tracing::warn!(%command, ?error, "pi refused a command it could not read");
                    return;
                };
                if self.probe.as_ref() == Some(&id) {
                    self.probe = None;
                    // Nothing said pi would run again: the error ends the turn.
                    if let Some(Turn {
                        phase: Phase::Ending { outcome, probe },
                        ..
                    }) = &self.turn
                    {
                        if *probe == id {
                            let outcome = outcome.clone();
                            self.finish(outcome, out);
                        }
                    }
                    return;
                }
                if self.turn.as_ref().and_then(|t| t.prompt.as_ref()) == Some(&id) {
                    if success {
                        self.turn.as_mut().map(|t| t.prompt.take());
                    } else {
                        self.turn = None;
                    }
                }
                let result = if success {
                    Ok(data.unwrap_or(Value::Null))
                } else {
                    Err(HarnessError::Rpc {
                        code: REFUSED,
                        message: error.unwrap_or_else(|| format!("pi refused {command}")),
                    })
                };
                out.push(Action::Answer { id, result });
            }
            Line::ExtensionUiRequest { id, method, title } => {
                // A dialog blocks pi until answered, and Relay has no one to ask.
                if matches!(method.as_str(), "select" | "confirm" | "input" | "editor") {
                    out.push(Action::Send(json!({
                        "type": "extension_ui_response", "id": id, "cancelled": true,
                    })));
                    out.push(Action::Event(HarnessEvent::Warning {
                        message: format!("pi extension asked ({method}) {title:?}; cancelled"),
                    }));
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;
