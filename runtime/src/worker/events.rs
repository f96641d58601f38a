//! One event of the running turn, turned into what the broker hears: flight changes
//! (deltas, items, command output, plan, diff, usage, notes, the end), approval requests
//! and their withdrawal, and the harness's death mid-turn.

use relay_protocol::domain::{ApprovalRequest, FlightChange, FlightState, ItemPhase, SharedStr};
use relay_protocol::harness::{HarnessEvent, ItemKind, TurnOutcome};
use relay_protocol::runtime::Report;

use super::turn::Turn;
use super::Worker;

impl Worker {
    /// Handles one event of the running turn; true when the turn has ended.
    pub(super) async fn turn_event(&mut self, turn: &mut Turn, ev: Option<HarnessEvent>) -> bool {
        let flight = turn.flight.clone();
        let Some(ev) = ev else {
            self.session_ended().await;
            let reason = format!("the {} event stream ended mid-turn", turn.info.name);
            self.fail(&flight, &reason).await;
            return true;
        };
        let same_turn = |id: &str| id == turn.turn_id;
        match ev {
            HarnessEvent::TurnStarted { .. } => {}
            HarnessEvent::ApprovalResolved { request_id }
                if turn.answering.contains(&request_id) =>
            {
                // Relay's own answer taking effect (it may come before the answer's call
                // returns): the decision is recorded by whoever answered.
                turn.approvals.remove(&request_id);
            }
            HarnessEvent::ApprovalResolved { request_id } => {
                // Settled by the harness itself (the request was withdrawn), not by an answer
                // from Relay: close the record, and the turn goes on.
                if turn.approvals.remove(&request_id) {
                    self.report(Report::ApprovalsExpired {
                        flight: flight.clone(),
                        by: Some(relay_protocol::domain::decider::withdrawn(
                            turn.info.harness,
                        )),
                        request: Some(request_id),
                    })
                    .await;
                    if turn.approvals.is_empty() {
                        self.state(
                            &flight,
                            FlightState::Running,
                            Some(format!("{} withdrew its approval request", turn.info.name)),
                        )
                        .await;
                    }
                }
            }
            HarnessEvent::TextDelta { turn_id, delta, .. } if same_turn(&turn_id) => {
                turn.text.push_str(&delta);
                self.change(&flight, FlightChange::Delta { text: delta })
                    .await;
            }
            HarnessEvent::ItemStarted {
                turn_id,
                item_id,
                kind,
            } if same_turn(&turn_id) => {
                if kind == ItemKind::AgentMessage {
                    turn.text.clear();
                }
                self.change(
                    &flight,
                    FlightChange::Item {
                        item_id,
                        item_kind: kind,
                        phase: ItemPhase::Started,
                        text: None,
                        exit_code: None,
                    },
                )
                .await;
            }
            HarnessEvent::ItemCompleted {
                turn_id,
                item_id,
                kind,
                text,
                exit_code,
            } if same_turn(&turn_id) => {
                let text = text.map(SharedStr::from);
                if let (ItemKind::AgentMessage, Some(text)) = (&kind, &text) {
                    turn.answer = self.write_first(&flight, text).await.then(|| text.clone());
                }
                self.change(
                    &flight,
                    FlightChange::Item {
                        item_id,
                        item_kind: kind,
                        phase: ItemPhase::Completed,
                        text,
                        exit_code,
                    },
                )
                .await;
            }
            HarnessEvent::CommandOutputDelta {
                turn_id,
                item_id,
                delta,
            } if same_turn(&turn_id) => {
                self.change(
                    &flight,
                    FlightChange::CommandOutput {
                        item_id,
                        text: delta,
                    },
                )
                .await;
            }
            HarnessEvent::PlanUpdated { turn_id, text } if same_turn(&turn_id) => {
                self.change(&flight, FlightChange::Plan { text }).await;
            }
            HarnessEvent::DiffUpdated { turn_id, diff } if same_turn(&turn_id) => {
                self.change(&flight, FlightChange::Diff { text: diff })
                    .await;
            }
            HarnessEvent::TokenUsage { turn_id, usage } if same_turn(&turn_id) => {
                self.change(&flight, FlightChange::Usage(usage)).await;
            }
            HarnessEvent::ApprovalRequested {
                turn_id,
                request_id,
                kind,
                detail,
                reason,
            } if same_turn(&turn_id) => {
                turn.approvals.insert(request_id.clone());
                self.report(Report::ApprovalRequested {
                    agent: self.name.clone(),
                    request: ApprovalRequest {
                        flight: flight.clone(),
                        kind,
                        detail,
                        reason,
                        harness_request_id: request_id,
                    },
                })
                .await;
            }
            HarnessEvent::Warning { message } | HarnessEvent::Retrying { message } => {
                self.change(
                    &flight,
                    FlightChange::Note {
                        text: message,
                        by: None,
                    },
                )
                .await;
            }
            HarnessEvent::TurnCompleted { turn_id, outcome } if same_turn(&turn_id) => {
                match outcome {
                    TurnOutcome::Completed { text } => {
                        let output = if text.is_empty() {
                            std::mem::take(&mut turn.text)
                        } else {
                            text
                        };
                        // The last message's text (most often): its buffer, written.
                        let output = match turn.answer.take() {
                            Some(answer) if *answer == *output => answer,
                            _ => {
                                let output = SharedStr::from(output);
                                self.write_first(&flight, &output).await;
                                output
                            }
                        };
                        self.change(
                            &flight,
                            FlightChange::State {
                                to: FlightState::Completed,
                                reason: None,
                                output: Some(output),
                            },
                        )
                        .await;
                    }
                    TurnOutcome::Failed { error } => self.fail(&flight, &error).await,
                    TurnOutcome::Interrupted => {
                        self.state(
                            &flight,
                            FlightState::Cancelled,
                            Some("interrupted".to_string()),
                        )
                        .await
                    }
                }
                return true;
            }
            HarnessEvent::ProcessExited {
                code,
                signal,
                stderr_tail,
            } => {
                let how = match (code, signal) {
                    (_, Some(s)) => format!("was killed by signal {s}"),
                    (Some(c), None) => format!("exited with code {c}"),
                    (None, None) => "exited".to_string(),
                };
                let tail = stderr_tail.trim();
                let program = turn.info.program;
                let reason = if tail.is_empty() {
                    format!("{program} {how} mid-turn (it wrote nothing on stderr)")
                } else {
                    format!("{program} {how} mid-turn; stderr tail:\n{tail}")
                };
                self.fail(&flight, &reason).await;
                self.session_ended().await;
                return true;
            }
            other => tracing::debug!(agent = %self.name, event = ?other, "event of another turn"),
        }
        false
    }
}
