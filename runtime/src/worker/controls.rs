//! The controls of the running turn (steer, interrupt, an approval's answer, a reply),
//! each carried out by a task of its own so the worker keeps draining the harness's
//! events meanwhile (see `turn.rs`); what the harness cannot do is refused here with
//! the reason and never sent to it.

use std::time::Duration;

use relay_harnesses::seam::{Capabilities, HarnessSession};
use relay_harnesses::HarnessError;
use relay_infra::retry::{self, Retryable};
use relay_protocol::domain::FlightChange;
use relay_protocol::runtime::{Control, Report};
use tokio::sync::{mpsc, oneshot};

use super::turn::{OnSession, Turn};
use super::{control_flight, Worker};
use crate::RuntimeError;

/// An interrupt the harness refuses because no turn is active yet (right after the
/// turn's start) is tried again every 100 ms, up to 30 times.
const INTERRUPT_BACKOFF: retry::ExponentialBuilder =
    retry::at_most(30, Duration::from_millis(100), Duration::from_millis(100));

/// How long an approval's answer that was on its way when the turn ended may take to
/// return (a write to the harness: milliseconds) before it counts as too late.
const ANSWER_AFTER_TURN_END: Duration = Duration::from_secs(5);

impl Worker {
    /// Carries out a control of the running turn in a task of its own; see the module
    /// docs.
    pub(super) fn spawn_control(
        &self,
        on: &OnSession,
        turn: &mut Turn,
        c: Control,
        reply: oneshot::Sender<Result<(), RuntimeError>>,
        controls: &mut tokio::task::JoinSet<Option<(String, bool)>>,
    ) {
        if control_flight(&c) != turn.flight {
            let _ = reply.send(self.not_running(&c));
            return;
        }
        if let Some(what) = unsupported(&c, turn.info.capabilities) {
            let _ = reply.send(Err(RuntimeError::Unsupported {
                harness: turn.info.harness,
                what,
            }));
            return;
        }
        let answers = match &c {
            Control::Approval {
                harness_request_id, ..
            } => Some(harness_request_id.clone()),
            _ => None,
        };
        if let Some(request) = &answers {
            turn.answering.insert(request.clone());
        }
        let session = on.session.clone();
        let session_id = on.session_id.clone();
        let turn_id = turn.turn_id.clone();
        let flight = turn.flight.clone();
        let name = turn.info.name;
        let reports = self.deps.reports.clone();
        let turn_over = turn.over.clone();
        let answering = answers.is_some();
        controls.spawn(async move {
            let interrupt = matches!(c, Control::Interrupt { .. });
            // An approval's answer may already be with the harness when the turn ends (the
            // agent acted on it and finished): it gets a moment to return, so it is not
            // reported unanswered, and expired, behind an answer the agent got.
            let ended = async {
                turn_over.cancelled().await;
                if answering {
                    tokio::time::sleep(ANSWER_AFTER_TURN_END).await;
                }
            };
            let r = tokio::select! {
                r = run_control(session.as_ref(), &session_id, &turn_id, &flight, &reports, c) => r,
                _ = ended => {
                    if interrupt {
                        Ok(())
                    } else {
                        Err(RuntimeError::TurnEnded { flight, harness: name })
                    }
                }
            };
            let answered = answers.map(|request| (request, r.is_ok()));
            let _ = reply.send(r);
            answered
        });
    }
}

/// A steer the harness cannot take: what it asked, and what to do instead.
const STEER_INSTEAD: &str = "steer a running turn: interrupt it (`relay interrupt FLIGHT`) and ask again with the added text, or ask a follow-up once it ends";

/// What a control of the running turn asks that the harness cannot do, if anything.
fn unsupported(c: &Control, can: Capabilities) -> Option<&'static str> {
    match c {
        Control::Steer { .. } if !can.steer => Some(STEER_INSTEAD),
        Control::Interrupt { .. } if !can.interrupt => Some("interrupt a running turn"),
        Control::Approval { .. } if !can.approvals => Some("answer approval requests"),
        Control::Reply { .. } if !can.reply => Some(
            "take an answer through Relay (its turns end on their own, with the agent's reply)",
        ),
        _ => None,
    }
}

/// Steers, interrupts or answers an approval of the running turn.
async fn run_control(
    session: &dyn HarnessSession,
    session_id: &str,
    turn_id: &str,
    flight: &str,
    reports: &mpsc::Sender<Report>,
    c: Control,
) -> Result<(), RuntimeError> {
    match c {
        Control::Steer { text, by, .. } => {
            session.steer(session_id, turn_id, &text).await?;
            let _ = reports
                .send(Report::Flight {
                    flight: flight.to_string(),
                    change: FlightChange::Note {
                        text: format!("steered: {text}"),
                        by,
                    },
                })
                .await;
        }
        Control::Interrupt { .. } => {
            // Right after the turn's start the harness may not have made it active yet
            // (Codex: "no active turn"); give it a moment rather than fail the request.
            (|| session.interrupt(session_id, turn_id))
                .retry(INTERRUPT_BACKOFF)
                .when(|e| matches!(e, HarnessError::NoActiveTurn { .. }))
                .await?;
        }
        Control::Approval {
            harness_request_id,
            decision,
            ..
        } => {
            session
                .respond_approval(&harness_request_id, decision)
                .await?
        }
        Control::Reply { text, .. } => session.reply(session_id, turn_id, &text).await?,
        // Handled by the runtime and the worker's loop, never sent here.
        Control::AgentRemoved { .. } | Control::Wake { .. } | Control::Revert { .. } => {}
    }
    Ok(())
}
