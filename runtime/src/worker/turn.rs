//! The turn in progress: starting it (waking the session first, recording the start on
//! disk before the harness sees the task), waiting on its events, its controls, its
//! deadline, its quiet note (nothing from the harness for a while: a note says so), its idle watchdog (nothing at all from the harness) and its stall watchdog
//! (a note such as "Reconnecting...", then no progress), and closing it.
//!
//! Controls of the running turn are carried out by tasks of their own, so the worker
//! keeps draining the harness's events while the harness answers them (a full event
//! buffer would otherwise stop the child's stdout, and with it the very answer the
//! control waits for): see `controls.rs`, which also refuses what the harness cannot do
//! (its capabilities), with the reason, never sending it.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use relay_harnesses::seam::{Capabilities, HarnessInfo, HarnessSession};
use relay_harnesses::HarnessError;
use relay_protocol::domain::{
    FlightChange, FlightState, SharedStr, WakePolicy, DEFAULT_REPLY_TIMEOUT_SECS,
};
use relay_protocol::harness::HarnessEvent;
use relay_protocol::runtime::{Control, Dispatch, Report};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::session::SessionError;
use super::{Msg, Worker};
use crate::threads::DispatchState;

/// How long an interrupt the worker sends on its own (timeout, idle, removal) may take:
/// the turn is over for Relay either way.
const OWN_INTERRUPT: Duration = Duration::from_secs(5);

/// How often the quiet note ([`crate::RuntimeConfig::turn_quiet_note`]) comes again
/// while the turn stays quiet.
const QUIET_REPEAT: Duration = Duration::from_secs(60);

/// The turn in progress.
pub(super) struct Turn {
    pub flight: String,
    pub turn_id: String,
    /// The harness that runs it: its names for messages, what it can do.
    pub info: HarnessInfo,
    /// Text of the current agent message so far, in case the harness's final event
    /// lacks it.
    pub text: String,
    /// The last agent message's text, where it was long enough to be written first
    /// ([`crate::TextSink`]): the answer that ends the turn is most often the same text,
    /// handed on as the same buffer.
    pub answer: Option<SharedStr>,
    /// Approval requests surfaced and not answered by Relay yet.
    pub approvals: HashSet<String>,
    /// Approval requests Relay is answering right now: the harness's "resolved" for one
    /// of them is that answer taking effect, not a withdrawal.
    pub answering: HashSet<String>,
    /// Cancelled when the turn ends: controls still waiting on the harness give up.
    pub over: CancellationToken,
}

pub(super) enum TurnEnd {
    Done,
    /// The runtime is stopping (or the agent was removed); the flight was failed, or,
    /// when the runtime stopped before its turn started, left for the next start.
    Shutdown,
}

/// The session a turn runs on, as its controls need it.
pub(super) struct OnSession {
    pub(super) session: Arc<dyn HarnessSession>,
    pub(super) session_id: String,
}

impl Worker {
    pub(super) async fn turn(
        &mut self,
        d: Dispatch,
        msgs: &mut mpsc::UnboundedReceiver<Msg>,
    ) -> TurnEnd {
        let flight = d.flight.id.clone();
        if self.skip_cancelled(&flight).await {
            return TurnEnd::Done;
        }
        if self.session.is_none() {
            if d.agent.spec.wake == WakePolicy::Manual {
                self.fail(
                    &flight,
                    &format!(
                        "agent {} has wake policy `manual` and no live session: start it with `relay agent wake {}`",
                        self.name, self.name
                    ),
                )
                .await;
                return TurnEnd::Done;
            }
            self.state(&flight, FlightState::Waking, None).await;
            match self.wake(&d.agent).await {
                Ok(()) => {}
                // The runtime stops before the turn started: it is not failed but left,
                // like the turns queued behind it, to be delivered again at the next
                // start (see `Worker::run`).
                Err(SessionError::ShutDown) => return TurnEnd::Shutdown,
                Err(e) => {
                    self.fail(&flight, &e.to_string()).await;
                    return TurnEnd::Done;
                }
            }
        }
        // Interrupted while the session started?
        if self.skip_cancelled(&flight).await {
            return TurnEnd::Done;
        }
        match self.tree_before_turn(&d).await {
            Err(e) => {
                self.fail(&flight, &e.to_string()).await;
                return TurnEnd::Done;
            }
            // The worktree was made again under a live session: its harness still works
            // in the deleted directory (its files and commands would go nowhere), so it
            // is started again in the new one.
            Ok(true) if self.session.is_some() => {
                self.stop_session().await;
                match self.wake(&d.agent).await {
                    Ok(()) => {}
                    Err(SessionError::ShutDown) => return TurnEnd::Shutdown,
                    Err(e) => {
                        self.fail(&flight, &e.to_string()).await;
                        return TurnEnd::Done;
                    }
                }
            }
            Ok(_) => {}
        }
        // Recorded (on disk) before the harness sees the task: whatever happens next, a
        // redelivery of this dispatch, or a restart, never starts the turn a second time.
        if let Err(e) = self
            .deps
            .threads
            .set_dispatch_state(&d.invocation.id, DispatchState::Started, &flight)
            .await
        {
            self.fail(&flight, &format!("cannot record the turn's start: {e}"))
                .await;
            return TurnEnd::Done;
        }
        self.started = Some((flight.clone(), d.invocation.id.clone()));
        // The marker, before the harness sees the task: its changes are committed as
        // this flight's whatever happens next.
        if let Err(e) = self.tree_begin(&d).await {
            self.fail(
                &flight,
                &format!("cannot mark the turn's start in its worktree: {e}"),
            )
            .await;
            self.turn_over();
            return TurnEnd::Done;
        }
        let shutdown = self.deps.shutdown.clone();
        let started = tokio::select! {
            _ = shutdown.cancelled() => {
                self.fail(&flight, "the runtime was shut down as the turn started").await;
                self.turn_over();
                return TurnEnd::Shutdown;
            }
            r = self.start_turn(&d) => r,
        };
        let (on, turn_id, info) = match started {
            Ok(t) => t,
            Err(reason) => {
                self.fail(&flight, &reason.to_string()).await;
                self.turn_over();
                return TurnEnd::Done;
            }
        };
        // The agent is `busy` while its flight runs: derived by the broker, not reported.
        self.change(
            &flight,
            FlightChange::Session {
                thread_id: Some(on.session_id.clone()),
                turn_id: Some(turn_id.clone()),
            },
        )
        .await;
        self.state(&flight, FlightState::Running, None).await;
        let mut turn = Turn {
            flight,
            turn_id,
            info,
            text: String::new(),
            answer: None,
            approvals: HashSet::new(),
            answering: HashSet::new(),
            over: CancellationToken::new(),
        };
        let deadline = turn_deadline(&d, turn.info.capabilities);
        let timeout = async {
            match deadline {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(timeout);
        let idle = tokio::time::sleep(self.deps.turn_idle_timeout.unwrap_or(Duration::MAX));
        tokio::pin!(idle);
        // The stall watchdog: armed by the first note after the last progress, disarmed
        // by progress (see `RuntimeConfig::turn_stall_timeout`).
        let mut stall = Stall::default();
        let stall_clock = tokio::time::sleep(Duration::MAX);
        tokio::pin!(stall_clock);
        // The quiet note: a turn its harness has said nothing of for a while says so,
        // with what to do, instead of waiting without a word (an agent that cannot reach
        // its model may retry for minutes in silence: Gemini CLI 0.61 for about 3.5).
        let quiet_after = self.deps.turn_quiet_note.unwrap_or(Duration::MAX);
        let mut quiet_since = tokio::time::Instant::now();
        let quiet = tokio::time::sleep(quiet_after);
        tokio::pin!(quiet);
        let notes_quiet = self.deps.turn_quiet_note.is_some() && !turn.info.capabilities.reply;
        // Controls in progress, stopped when the turn ends (a late interrupt retry must
        // never reach the next turn); each reports the approval it answered, if any.
        let mut controls = tokio::task::JoinSet::new();
        let mut was_watching = true;
        let end = loop {
            let watching = self.deps.turn_idle_timeout.is_some() && turn.approvals.is_empty();
            if watching && !was_watching {
                // Back from waiting on a person: the idle clock starts afresh.
                if let Some(limit) = self.deps.turn_idle_timeout {
                    idle.as_mut().reset(tokio::time::Instant::now() + limit);
                }
            }
            was_watching = watching;
            tokio::select! {
                _ = self.deps.shutdown.cancelled() => {
                    self.fail(&turn.flight, "the runtime was shut down during the turn").await;
                    break TurnEnd::Shutdown;
                }
                _ = &mut timeout => {
                    self.interrupt_own(&on, &turn).await;
                    let after = deadline.unwrap_or_default();
                    let why = match turn.info.capabilities.reply {
                        true => format!(
                            "no answer within {} s: the agent did not reply (relay reply {} TEXT); the turn was interrupted",
                            after.as_secs(),
                            turn.flight
                        ),
                        false => format!("timed out after {} ms", after.as_millis()),
                    };
                    self.fail(&turn.flight, &why).await;
                    break TurnEnd::Done;
                }
                _ = &mut stall_clock, if stall.armed && turn.approvals.is_empty() => {
                    self.interrupt_own(&on, &turn).await;
                    let secs = self.deps.turn_stall_timeout.unwrap_or_default().as_secs();
                    self.fail(
                        &turn.flight,
                        &format!(
                            "{} could not reach its model for {secs} s: {}; the turn was interrupted",
                            turn.info.name, stall.note
                        ),
                    )
                    .await;
                    break TurnEnd::Done;
                }
                _ = &mut quiet, if notes_quiet && turn.approvals.is_empty() => {
                    let secs = quiet_since.elapsed().as_secs();
                    let text = format!(
                        "no word from {} for {secs} s: its model may be slow or unreachable (it may be retrying); `relay interrupt {}` stops the turn",
                        turn.info.name, turn.flight
                    );
                    self.change(&turn.flight, FlightChange::Note { text, by: None }).await;
                    quiet.as_mut().reset(tokio::time::Instant::now() + QUIET_REPEAT);
                }
                _ = &mut idle, if watching => {
                    self.interrupt_own(&on, &turn).await;
                    let secs = self.deps.turn_idle_timeout.unwrap_or_default().as_secs();
                    self.fail(
                        &turn.flight,
                        &format!(
                            "{} sent nothing for {secs} s (is its model reachable?); the turn was interrupted",
                            turn.info.name
                        ),
                    )
                    .await;
                    break TurnEnd::Done;
                }
                m = msgs.recv() => match m {
                    None | Some(Msg::Control(Control::AgentRemoved { .. }, _)) => {
                        self.interrupt_own(&on, &turn).await;
                        self.fail(&turn.flight, "the agent was removed during the turn").await;
                        // Answered once the session stopped (see `Worker::run`).
                        if let Some(Msg::Control(_, reply)) = m {
                            self.removed = Some(reply);
                        }
                        break TurnEnd::Shutdown;
                    }
                    Some(Msg::Warm(agent)) => {
                        self.warm = (agent.spec.wake == WakePolicy::KeepWarm).then_some(*agent);
                    }
                    Some(Msg::Control(c, reply)) => {
                        self.spawn_control(&on, &mut turn, c, reply, &mut controls);
                    }
                },
                // A control finished; an answered approval no longer holds the watchdog.
                Some(done) = controls.join_next(), if !controls.is_empty() => {
                    if let Ok(Some((request, answered))) = done {
                        turn.answering.remove(&request);
                        if answered {
                            turn.approvals.remove(&request);
                            // Back from a person: the harness's silence counts afresh.
                            quiet_since = tokio::time::Instant::now();
                            if notes_quiet {
                                quiet.as_mut().reset(quiet_since + quiet_after);
                            }
                        }
                    }
                }
                ev = super::session::next_event(&mut self.session) => {
                    quiet_since = tokio::time::Instant::now();
                    if notes_quiet {
                        quiet.as_mut().reset(quiet_since + quiet_after);
                    }
                    let activity = ev.as_ref().is_some_and(counts_as_activity);
                    if let (Some(HarnessEvent::Retrying { message }), Some(limit)) =
                        (&ev, self.deps.turn_stall_timeout)
                    {
                        if !stall.armed {
                            stall_clock.as_mut().reset(tokio::time::Instant::now() + limit);
                        }
                        stall = Stall { armed: true, note: message.clone() };
                    }
                    if activity {
                        stall.armed = false;
                    }
                    if self.turn_event(&mut turn, ev).await {
                        break TurnEnd::Done;
                    }
                    if activity {
                        if let Some(limit) = self.deps.turn_idle_timeout {
                            idle.as_mut().reset(tokio::time::Instant::now() + limit);
                        }
                    }
                }
            }
        };
        // Controls still waiting on the harness answer now: an interrupt is done (the
        // turn is over), anything else came too late.
        turn.over.cancel();
        while let Some(done) = controls.join_next().await {
            if let Ok(Some((request, true))) = done {
                turn.approvals.remove(&request);
            }
        }
        // Only the requests Relay did not answer expire with the turn. One the harness had
        // an answer to is recorded by whoever answered it: that decision may still be on
        // its way to the broker (it answers the harness first, then records), and expiring
        // it here first would record "expired" for a command the agent ran, and lose the
        // rule a remembered decision makes (found by issue 28's concurrent test).
        let mut unanswered: Vec<String> = turn.approvals.drain().collect();
        unanswered.sort();
        for request in unanswered {
            self.report(Report::ApprovalsExpired {
                flight: turn.flight.clone(),
                by: None,
                request: Some(request),
            })
            .await;
        }
        self.turn_over();
        end
    }

    /// Starts the turn. A harness session that the harness lost since the session opened
    /// is replaced (the session is restarted, which resumes or starts one and records a
    /// loss) and the turn tried once more.
    async fn start_turn(
        &mut self,
        d: &Dispatch,
    ) -> Result<(OnSession, String, HarnessInfo), SessionError> {
        for attempt in 0..2 {
            let Some(live) = self.session.as_ref() else {
                break;
            };
            let (session, session_id, info) =
                (live.session.clone(), live.session_id.clone(), live.info);
            // Where the harness has no turn ids, the turn goes by its flight's.
            match session
                .start_turn(&session_id, &d.invocation.task, &d.flight.id)
                .await
            {
                Ok(turn_id) => {
                    let on = OnSession {
                        session,
                        session_id,
                    };
                    return Ok((on, turn_id, info));
                }
                Err(e @ HarnessError::SessionNotFound { .. }) if attempt == 0 => {
                    tracing::warn!(agent = %self.name, error = %e, "thread gone mid-session; restarting the session");
                    self.stop_session().await;
                    self.ensure_session(&d.agent).await?;
                }
                Err(source) => {
                    let tail = session.stderr_tail();
                    let tail = tail.trim();
                    // A pane not ready says what its screen shows: its output's tail,
                    // a TUI's redraws stripped of their escapes, adds only noise.
                    let quiet = tail.is_empty()
                        || matches!(
                            source,
                            HarnessError::ProcessExited { .. } | HarnessError::NotReady { .. }
                        );
                    return Err(SessionError::TurnStart {
                        source,
                        name: info.name,
                        stderr: (!quiet).then(|| tail.to_string()),
                    });
                }
            }
        }
        Err(SessionError::Gone {
            name: self.harness_name(&d.agent),
        })
    }

    /// The turn is over: its record (ended, with its last report) stays until its end
    /// is safely with the broker. The broker's plane forgets it once the end is
    /// committed (a record forgotten sooner could let a restart that lost the end run
    /// the turn again); a node's forwarder marks it done once the end is in JetStream,
    /// and keeps it to refuse a late redelivery.
    fn turn_over(&mut self) {
        self.started = None;
        self.tree_over();
    }

    /// Stops the turn on the worker's own account (deadline, idle, removal). A harness
    /// that cannot interrupt loses its session instead: nothing else stops the turn.
    async fn interrupt_own(&mut self, on: &OnSession, turn: &Turn) {
        if turn.info.capabilities.interrupt {
            let interrupt = on.session.interrupt(&on.session_id, &turn.turn_id);
            let _ = tokio::time::timeout(OWN_INTERRUPT, interrupt).await;
        } else {
            self.stop_session().await;
        }
    }
}

/// How long a turn may run: the ask's timeout, else the agent's, else for a harness
/// whose turns end only by a reply, [`DEFAULT_REPLY_TIMEOUT_SECS`]; else no limit.
fn turn_deadline(d: &Dispatch, can: Capabilities) -> Option<Duration> {
    d.invocation
        .timeout_ms
        .map(Duration::from_millis)
        .or(d.agent.spec.turn_timeout_secs.map(Duration::from_secs))
        .or(can
            .reply
            .then_some(Duration::from_secs(DEFAULT_REPLY_TIMEOUT_SECS)))
}

/// The stall watchdog's state: whether a note came since the last progress, and the
/// latest note (the cause a stalled turn fails with).
#[derive(Default)]
struct Stall {
    armed: bool,
    note: String,
}

/// Whether an event shows the turn is alive. A harness's warnings and its retries
/// (Codex's "Reconnecting... waiting for network") do not: a turn that only retries is
/// stuck.
fn counts_as_activity(ev: &HarnessEvent) -> bool {
    !matches!(
        ev,
        HarnessEvent::Warning { .. } | HarnessEvent::Retrying { .. }
    )
}
