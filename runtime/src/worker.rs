//! One agent's worker: its turn queue, its harness session and the turn in progress.
//!
//! The worker is the only owner of the agent's session. It waits on three things at
//! once: the next queued turn (only when no turn runs), control messages (steer,
//! interrupt, approvals), and the session's event stream (also between turns, to see
//! the child die). A session that died is dropped and respawned by the next turn, which
//! resumes the same thread.

use std::path::PathBuf;
use std::time::Duration;

use relay_harnesses::codex::{codex_program, CodexConfig, CodexSession, ThreadOptions};
use relay_harnesses::HarnessError;
use relay_protocol::domain::{
    Agent, AgentState, ApprovalRequest, Endpoint, FlightChange, FlightState, Harness, ItemPhase,
};
use relay_protocol::harness::{HarnessEvent, TurnOutcome};
use relay_protocol::runtime::{Control, Dispatch, Report};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::threads::{DispatchState, ThreadRecord, ThreadStore};
use crate::{RuntimeError, AGENT_QUEUE_CAPACITY};

pub struct Deps {
    pub reports: mpsc::Sender<Report>,
    pub threads: ThreadStore,
    pub node: Option<String>,
    pub shutdown: CancellationToken,
}

enum Msg {
    Warm(Box<Agent>),
    Control(Control, oneshot::Sender<Result<(), RuntimeError>>),
}

#[derive(Clone)]
pub struct Handle {
    queue: mpsc::Sender<Dispatch>,
    msgs: mpsc::UnboundedSender<Msg>,
}

impl Handle {
    pub fn dispatch(&self, d: Dispatch) -> Result<(), RuntimeError> {
        let agent = d.agent.spec.name.clone();
        self.queue.try_send(d).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => RuntimeError::Overloaded(agent),
            mpsc::error::TrySendError::Closed(_) => RuntimeError::ShuttingDown,
        })
    }

    pub fn warm(&self, agent: Agent) -> Result<(), RuntimeError> {
        self.msgs
            .send(Msg::Warm(Box::new(agent)))
            .map_err(|_| RuntimeError::ShuttingDown)
    }

    pub fn control(
        &self,
        c: Control,
        reply: oneshot::Sender<Result<(), RuntimeError>>,
    ) -> Result<(), RuntimeError> {
        self.msgs
            .send(Msg::Control(c, reply))
            .map_err(|_| RuntimeError::ShuttingDown)
    }

    pub fn is_closed(&self) -> bool {
        self.queue.is_closed()
    }
}

pub fn spawn(name: String, deps: Deps, tasks: &TaskTracker) -> Handle {
    let (queue, queue_rx) = mpsc::channel(AGENT_QUEUE_CAPACITY);
    let (msgs, msgs_rx) = mpsc::unbounded_channel();
    let worker = Worker {
        name,
        deps,
        session: None,
    };
    tasks.spawn(worker.run(queue_rx, msgs_rx));
    Handle { queue, msgs }
}

struct Live {
    session: CodexSession,
    events: mpsc::Receiver<HarnessEvent>,
    thread_id: String,
}

/// The turn in progress.
struct Turn {
    flight: String,
    turn_id: String,
    /// Text of the agent message items so far, in case the harness's final event lacks it.
    text: String,
}

struct Worker {
    name: String,
    deps: Deps,
    session: Option<Live>,
}

enum TurnEnd {
    Done,
    /// The runtime is stopping; the flight was failed with that reason.
    Shutdown,
}

impl Worker {
    async fn run(
        mut self,
        mut queue: mpsc::Receiver<Dispatch>,
        mut msgs: mpsc::UnboundedReceiver<Msg>,
    ) {
        loop {
            tokio::select! {
                _ = self.deps.shutdown.cancelled() => break,
                d = queue.recv() => {
                    let Some(d) = d else { break };
                    if let TurnEnd::Shutdown = self.turn(d, &mut msgs).await {
                        break;
                    }
                }
                m = msgs.recv() => match m {
                    None => break,
                    Some(Msg::Warm(agent)) => {
                        if let Err(e) = self.ensure_session(&agent).await {
                            tracing::warn!(agent = %self.name, error = %e, "keep_warm start failed");
                        }
                    }
                    Some(Msg::Control(Control::AgentRemoved { .. }, reply)) => {
                        let _ = reply.send(Ok(()));
                        break;
                    }
                    Some(Msg::Control(c, reply)) => {
                        let _ = reply.send(Err(RuntimeError::Unavailable(format!(
                            "flight {} is not running on agent {:?}",
                            control_flight(&c), self.name
                        ))));
                    }
                },
                ev = next_event(&mut self.session) => self.idle_event(ev).await,
            }
        }
        // Fail what is still queued: it will not run in this process.
        queue.close();
        while let Ok(d) = queue.try_recv() {
            self.fail(&d.flight.id, "the runtime stopped before this turn started")
                .await;
        }
        self.stop_session().await;
    }

    async fn report(&self, r: Report) {
        // The broker side only goes away at shutdown; nothing to do then.
        let _ = self.deps.reports.send(r).await;
    }

    async fn change(&self, flight: &str, change: FlightChange) {
        self.report(Report::Flight {
            flight: flight.to_string(),
            change,
        })
        .await;
    }

    async fn state(&self, flight: &str, to: FlightState, reason: Option<String>) {
        self.change(
            flight,
            FlightChange::State {
                to,
                reason,
                output: None,
            },
        )
        .await;
    }

    async fn fail(&self, flight: &str, reason: &str) {
        self.state(flight, FlightState::Failed, Some(reason.to_string()))
            .await;
    }

    async fn agent_state(&self, state: AgentState) {
        self.report(Report::Agent {
            agent: self.name.clone(),
            state: Some(state),
            thread_id: None,
            endpoint: None,
        })
        .await;
    }

    /// An event while no turn runs: only the child's death matters.
    async fn idle_event(&mut self, ev: Option<HarnessEvent>) {
        match ev {
            Some(HarnessEvent::ProcessExited { .. }) | None => {
                tracing::info!(agent = %self.name, "session ended between turns");
                self.session = None;
                self.agent_state(AgentState::Offline).await;
            }
            Some(other) => {
                tracing::debug!(agent = %self.name, event = ?other, "event between turns")
            }
        }
    }

    async fn stop_session(&mut self) {
        if let Some(live) = self.session.take() {
            if let Err(e) = live.session.shutdown().await {
                tracing::warn!(agent = %self.name, error = %e, "session shutdown");
            }
            self.agent_state(AgentState::Offline).await;
        }
    }

    /// Spawns the harness and resumes (or starts) the agent's thread.
    async fn ensure_session(&mut self, agent: &Agent) -> Result<(), String> {
        if self.session.is_some() {
            return Ok(());
        }
        if agent.spec.harness != Harness::CodexAppServer {
            return Err(format!(
                "harness {} is not supported by this runtime yet (only codex_app_server)",
                agent.spec.harness
            ));
        }
        self.agent_state(AgentState::Starting).await;
        let mut config = CodexConfig::new(codex_program(agent.spec.command.as_deref()));
        config.args = agent.spec.args.clone();
        config.env = agent.spec.env.clone();
        config.cwd = Some(PathBuf::from(&agent.spec.cwd));
        config.model = agent.spec.model.clone();
        let (session, events) = match CodexSession::spawn(config).await {
            Ok(s) => s,
            Err(e) => {
                self.agent_state(AgentState::Failed).await;
                return Err(format!("cannot start codex app-server: {e}"));
            }
        };
        let stored = self
            .deps
            .threads
            .get(&self.name)
            .map_err(|e| e.to_string())?;
        let options = ThreadOptions {
            cwd: Some(PathBuf::from(&agent.spec.cwd)),
            model: agent.spec.model.clone(),
            ..ThreadOptions::default()
        };
        let thread_id = match stored {
            Some(rec) => match session.resume_thread(&rec.thread_id).await {
                Ok(t) => t.thread_id,
                Err(HarnessError::ThreadNotFound { .. }) => {
                    let new = session
                        .start_thread(&options)
                        .await
                        .map_err(|e| format!("cannot start a codex thread: {e}"))?;
                    self.report(Report::ThreadLost {
                        agent: self.name.clone(),
                        old_thread_id: rec.thread_id.clone(),
                        new_thread_id: new.clone(),
                        reason: format!(
                            "codex no longer has thread {}; started {new} without the earlier conversation",
                            rec.thread_id
                        ),
                    })
                    .await;
                    new
                }
                Err(e) => {
                    let _ = session.shutdown().await;
                    self.agent_state(AgentState::Failed).await;
                    return Err(format!("cannot resume codex thread {}: {e}", rec.thread_id));
                }
            },
            None => session
                .start_thread(&options)
                .await
                .map_err(|e| format!("cannot start a codex thread: {e}"))?,
        };
        self.deps
            .threads
            .put(
                &self.name,
                &ThreadRecord {
                    harness: Harness::CodexAppServer.as_str().into(),
                    thread_id: thread_id.clone(),
                    updated_at: now_ms(),
                },
            )
            .await
            .map_err(|e| format!("cannot record the thread id: {e}"))?;
        self.report(Report::Agent {
            agent: self.name.clone(),
            state: Some(AgentState::Idle),
            thread_id: Some(thread_id.clone()),
            endpoint: Some(Endpoint {
                transport: Harness::CodexAppServer,
                node: self.deps.node.clone(),
                session_id: Some(thread_id.clone()),
                pid: Some(session.pid()),
                pane: None,
            }),
        })
        .await;
        self.session = Some(Live {
            session,
            events,
            thread_id,
        });
        Ok(())
    }

    async fn turn(&mut self, d: Dispatch, msgs: &mut mpsc::UnboundedReceiver<Msg>) -> TurnEnd {
        let flight = d.flight.id.clone();
        if self.session.is_none() {
            self.state(&flight, FlightState::Waking, None).await;
            if let Err(reason) = self.ensure_session(&d.agent).await {
                self.fail(&flight, &reason).await;
                return TurnEnd::Done;
            }
        }
        let Some(live) = self.session.as_ref() else {
            return TurnEnd::Done;
        };
        let (session, thread_id) = (live.session.clone(), live.thread_id.clone());
        // Recorded (on disk) before the harness sees the task: whatever happens next, a
        // redelivery of this dispatch (a remote node) never starts the turn a second time.
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
        let turn_id = match session.start_turn(&thread_id, &d.invocation.task).await {
            Ok(t) => t,
            Err(e) => {
                let reason = self.session_error("cannot start the turn", &e);
                self.fail(&flight, &reason).await;
                return TurnEnd::Done;
            }
        };
        self.agent_state(AgentState::Busy).await;
        self.change(
            &flight,
            FlightChange::Session {
                thread_id: Some(thread_id.clone()),
                turn_id: Some(turn_id.clone()),
            },
        )
        .await;
        self.state(&flight, FlightState::Running, None).await;
        let mut turn = Turn {
            flight,
            turn_id,
            text: String::new(),
        };
        let deadline = d.invocation.timeout_ms.map(Duration::from_millis);
        let timeout = async {
            match deadline {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(timeout);
        let end = loop {
            tokio::select! {
                _ = self.deps.shutdown.cancelled() => {
                    self.fail(&turn.flight, "the runtime was shut down during the turn").await;
                    break TurnEnd::Shutdown;
                }
                _ = &mut timeout => {
                    let _ = session.interrupt(&thread_id, &turn.turn_id).await;
                    let after = deadline.unwrap_or_default();
                    self.fail(&turn.flight, &format!("timed out after {} ms", after.as_millis())).await;
                    break TurnEnd::Done;
                }
                m = msgs.recv() => match m {
                    None | Some(Msg::Control(Control::AgentRemoved { .. }, _)) => {
                        let _ = session.interrupt(&thread_id, &turn.turn_id).await;
                        self.fail(&turn.flight, "the agent was removed during the turn").await;
                        if let Some(Msg::Control(_, reply)) = m {
                            let _ = reply.send(Ok(()));
                        }
                        break TurnEnd::Shutdown;
                    }
                    Some(Msg::Warm(_)) => {}
                    Some(Msg::Control(c, reply)) => {
                        let r = self.control(&session, &thread_id, &turn, c).await;
                        let _ = reply.send(r);
                    }
                },
                ev = next_event(&mut self.session) => {
                    if self.turn_event(&mut turn, ev).await {
                        break TurnEnd::Done;
                    }
                }
            }
        };
        self.report(Report::ApprovalsExpired {
            flight: turn.flight.clone(),
        })
        .await;
        if self.session.is_some() {
            self.agent_state(AgentState::Idle).await;
        }
        end
    }

    fn session_error(&self, what: &str, e: &HarnessError) -> String {
        let tail = self
            .session
            .as_ref()
            .map(|l| l.session.stderr_tail())
            .unwrap_or_default();
        if tail.trim().is_empty() || matches!(e, HarnessError::ProcessExited { .. }) {
            format!("{what}: {e}")
        } else {
            format!("{what}: {e}; codex stderr: {}", tail.trim())
        }
    }

    async fn control(
        &self,
        session: &CodexSession,
        thread_id: &str,
        turn: &Turn,
        c: Control,
    ) -> Result<(), RuntimeError> {
        if control_flight(&c) != turn.flight {
            return Err(RuntimeError::Unavailable(format!(
                "flight {} is not the turn running on agent {:?}",
                control_flight(&c),
                self.name
            )));
        }
        match c {
            Control::Steer { text, .. } => {
                session.steer(thread_id, &turn.turn_id, &text).await?;
                self.change(
                    &turn.flight,
                    FlightChange::Note {
                        text: format!("steered: {text}"),
                    },
                )
                .await;
            }
            Control::Interrupt { .. } => {
                // Right after `turn/start` codex may not have made the turn active yet
                // ("no active turn"); give it a moment rather than fail the request.
                let mut tries = 0;
                loop {
                    match session.interrupt(thread_id, &turn.turn_id).await {
                        Err(HarnessError::Rpc { message, .. })
                            if message.contains("no active turn") && tries < 30 =>
                        {
                            tries += 1;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        other => break other?,
                    }
                }
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
            Control::AgentRemoved { .. } => {}
        }
        Ok(())
    }

    /// Handles one event of the running turn; true when the turn has ended.
    async fn turn_event(&mut self, turn: &mut Turn, ev: Option<HarnessEvent>) -> bool {
        let flight = turn.flight.clone();
        let Some(ev) = ev else {
            self.session = None;
            self.fail(&flight, "the codex event stream ended mid-turn")
                .await;
            return true;
        };
        let same_turn = |id: &str| id == turn.turn_id;
        match ev {
            HarnessEvent::TurnStarted { .. } | HarnessEvent::ApprovalResolved { .. } => {}
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
                self.change(
                    &flight,
                    FlightChange::Item {
                        item_id,
                        item_kind: kind.as_str().to_string(),
                        phase: ItemPhase::Started,
                        text: None,
                    },
                )
                .await;
            }
            HarnessEvent::ItemCompleted {
                turn_id,
                item_id,
                kind,
                text,
            } if same_turn(&turn_id) => {
                self.change(
                    &flight,
                    FlightChange::Item {
                        item_id,
                        item_kind: kind.as_str().to_string(),
                        phase: ItemPhase::Completed,
                        text,
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
            HarnessEvent::TokenUsage {
                turn_id,
                input_tokens,
                output_tokens,
            } if same_turn(&turn_id) => {
                self.change(
                    &flight,
                    FlightChange::Usage {
                        input_tokens,
                        output_tokens,
                    },
                )
                .await;
            }
            HarnessEvent::ApprovalRequested {
                turn_id,
                request_id,
                kind,
                detail,
                reason,
            } if same_turn(&turn_id) => {
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
            HarnessEvent::Warning { message } => {
                self.change(&flight, FlightChange::Note { text: message })
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
                self.session = None;
                let how = match (code, signal) {
                    (_, Some(s)) => format!("was killed by signal {s}"),
                    (Some(c), None) => format!("exited with code {c}"),
                    (None, None) => "exited".to_string(),
                };
                let tail = stderr_tail.trim();
                let reason = if tail.is_empty() {
                    format!("codex app-server {how} mid-turn (no stderr)")
                } else {
                    format!("codex app-server {how} mid-turn; stderr tail:\n{tail}")
                };
                self.fail(&flight, &reason).await;
                self.agent_state(AgentState::Offline).await;
                return true;
            }
            other => tracing::debug!(agent = %self.name, event = ?other, "event of another turn"),
        }
        false
    }
}

fn control_flight(c: &Control) -> &str {
    match c {
        Control::Steer { flight, .. }
        | Control::Interrupt { flight, .. }
        | Control::Approval { flight, .. } => flight,
        Control::AgentRemoved { .. } => "",
    }
}

/// The next event of the live session, or never when there is none.
async fn next_event(session: &mut Option<Live>) -> Option<HarnessEvent> {
    match session {
        Some(live) => live.events.recv().await,
        None => std::future::pending().await,
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
