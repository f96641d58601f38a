//! One agent's worker: its turn queue, its harness session and the turn in progress.
//!
//! The worker is the only owner of the agent's session. It waits on four things at
//! once: the session's event stream (also between turns, to see the child die), control
//! messages (steer, interrupt, approvals), the next queued turn (only when no turn
//! runs), and the shutdown. A session that died is dropped and respawned by the next
//! turn, which resumes the same thread; a `keep_warm` session is respawned at once.
//!
//! The queue is shared with the agent's [`Handle`], so a flight still waiting in it can
//! be cancelled or steered without disturbing the turn that runs. Controls of the
//! running turn are carried out by tasks of their own, so the worker keeps draining the
//! harness's events while Codex answers them (a full event buffer would otherwise stop
//! Codex's stdout, and with it the very answer the control waits for).

use std::collections::{HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use relay_harnesses::codex::{codex_program, CodexConfig, CodexSession, ThreadOptions};
use relay_harnesses::HarnessError;
use relay_protocol::clock::now_ms;
use relay_protocol::domain::{
    Agent, AgentState, ApprovalRequest, Endpoint, FlightChange, FlightState, Harness, ItemPhase,
    WakePolicy,
};
use relay_protocol::harness::{HarnessEvent, ItemKind, TurnOutcome};
use relay_protocol::runtime::{Control, Dispatch, Report};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::threads::{DispatchState, ThreadRecord, ThreadStore};
use crate::{cancelled_report, Cancelled, RuntimeError, AGENT_QUEUE_CAPACITY};

/// The first wait before a `keep_warm` session that died is started again; it doubles
/// up to [`REWARM_MAX`] while sessions keep dying young.
const REWARM_FIRST: Duration = Duration::from_secs(1);
const REWARM_MAX: Duration = Duration::from_secs(60);

pub struct Deps {
    pub reports: mpsc::Sender<Report>,
    pub threads: ThreadStore,
    pub node: Option<String>,
    pub shutdown: CancellationToken,
    /// A running turn without a harness event for this long is interrupted and failed
    /// (`None`: never). Time spent waiting for an approval does not count.
    pub turn_idle_timeout: Option<Duration>,
    /// Flights interrupted before their turn started: never started here.
    pub cancelled: Arc<Cancelled>,
}

/// How long an interrupt the worker sends on its own (timeout, idle, removal) may take:
/// the turn is over for Relay either way.
const OWN_INTERRUPT: Duration = Duration::from_secs(5);

enum Msg {
    Warm(Box<Agent>),
    Control(Control, oneshot::Sender<Result<(), RuntimeError>>),
}

/// Between a queued flight's task and a steer added to it.
const STEER_SEPARATOR: &str = "\n\n";

/// The agent's queued turns. See the module docs.
#[derive(Default)]
pub struct TurnQueue {
    state: Mutex<QueueState>,
    ready: Notify,
}

#[derive(Default)]
struct QueueState {
    turns: VecDeque<Dispatch>,
    closed: bool,
}

impl TurnQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn push(&self, d: Dispatch) -> Result<(), RuntimeError> {
        let mut q = self.lock();
        if q.closed {
            return Err(RuntimeError::ShuttingDown);
        }
        if q.turns.len() >= AGENT_QUEUE_CAPACITY {
            return Err(RuntimeError::Overloaded(d.agent.spec.name));
        }
        q.turns.push_back(d);
        drop(q);
        self.ready.notify_one();
        Ok(())
    }

    /// The next turn, waiting for one; `None` once closed and empty. Cancel-safe.
    async fn next(&self) -> Option<Dispatch> {
        loop {
            {
                let mut q = self.lock();
                if let Some(d) = q.turns.pop_front() {
                    return Some(d);
                }
                if q.closed {
                    return None;
                }
            }
            self.ready.notified().await;
        }
    }

    /// Closes the queue and returns what was still in it.
    fn close(&self) -> Vec<Dispatch> {
        let mut q = self.lock();
        q.closed = true;
        q.turns.drain(..).collect()
    }

    /// Takes a flight out of the queue, if it waits there.
    pub fn remove(&self, flight: &str) -> Option<Dispatch> {
        let mut q = self.lock();
        let at = q.turns.iter().position(|d| d.flight.id == flight)?;
        q.turns.remove(at)
    }

    /// Adds `text` to the task of a flight waiting in the queue; `false` if it is not
    /// there. A task that would grow over `max_task_bytes` is left as it is and the steer
    /// refused: steers must not make a task no client could have sent.
    pub fn steer(
        &self,
        flight: &str,
        text: &str,
        max_task_bytes: Option<usize>,
    ) -> Result<bool, RuntimeError> {
        let mut q = self.lock();
        let Some(d) = q.turns.iter_mut().find(|d| d.flight.id == flight) else {
            return Ok(false);
        };
        let size = d.invocation.task.len() + STEER_SEPARATOR.len() + text.len();
        if let Some(limit) = max_task_bytes.filter(|limit| size > *limit) {
            return Err(RuntimeError::TooLarge {
                flight: flight.to_string(),
                size,
                limit,
            });
        }
        d.invocation.task.push_str(STEER_SEPARATOR);
        d.invocation.task.push_str(text);
        Ok(true)
    }

    fn is_closed(&self) -> bool {
        self.lock().closed
    }
}

#[derive(Clone)]
pub struct Handle {
    pub queue: Arc<TurnQueue>,
    msgs: mpsc::UnboundedSender<Msg>,
}

impl Handle {
    pub fn dispatch(&self, d: Dispatch) -> Result<(), RuntimeError> {
        self.queue.push(d)
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
        self.msgs.is_closed() || self.queue.is_closed()
    }
}

pub fn spawn(name: String, deps: Deps, tasks: &TaskTracker) -> Handle {
    let queue = Arc::new(TurnQueue::default());
    let (msgs, msgs_rx) = mpsc::unbounded_channel();
    let worker = Worker {
        name,
        deps,
        session: None,
        warm: None,
        rewarm_delay: REWARM_FIRST,
        rewarm_at: None,
    };
    tasks.spawn(worker.run(queue.clone(), msgs_rx));
    Handle { queue, msgs }
}

struct Live {
    session: CodexSession,
    events: mpsc::Receiver<HarnessEvent>,
    thread_id: String,
    started: tokio::time::Instant,
}

/// The turn in progress.
struct Turn {
    flight: String,
    invocation: String,
    turn_id: String,
    /// Text of the current agent message so far, in case the harness's final event
    /// lacks it.
    text: String,
    /// Approval requests surfaced and not answered by Relay yet.
    approvals: HashSet<String>,
    /// Approval requests Relay is answering right now: codex's `serverRequest/resolved`
    /// for one of them is that answer taking effect, not a withdrawal.
    answering: HashSet<String>,
    /// Cancelled when the turn ends: controls still waiting on codex give up.
    over: CancellationToken,
}

struct Worker {
    name: String,
    deps: Deps,
    session: Option<Live>,
    /// The agent, while its wake policy is `keep_warm`: its session is kept running.
    warm: Option<Agent>,
    rewarm_delay: Duration,
    /// When to start the `keep_warm` session again after it died.
    rewarm_at: Option<tokio::time::Instant>,
}

enum TurnEnd {
    Done,
    /// The runtime is stopping (or the agent was removed); the flight was failed.
    Shutdown,
}

impl Worker {
    async fn run(mut self, queue: Arc<TurnQueue>, mut msgs: mpsc::UnboundedReceiver<Msg>) {
        let mut stop_reason = "the runtime stopped before this turn started";
        loop {
            tokio::select! {
                // The session's death is seen before a queued turn is taken, so that turn
                // respawns the session instead of failing on a dead one.
                biased;
                _ = self.deps.shutdown.cancelled() => break,
                ev = next_event(&mut self.session) => self.idle_event(ev).await,
                m = msgs.recv() => match m {
                    None => break,
                    Some(Msg::Warm(agent)) => {
                        self.warm = (agent.spec.wake == WakePolicy::KeepWarm).then(|| (*agent).clone());
                        if !self.warm_up(&agent).await {
                            break;
                        }
                    }
                    Some(Msg::Control(Control::AgentRemoved { .. }, reply)) => {
                        let _ = reply.send(Ok(()));
                        stop_reason = "the agent was removed before this turn started";
                        break;
                    }
                    Some(Msg::Control(c, reply)) => {
                        let _ = reply.send(self.not_running(&c));
                    }
                },
                _ = rewarm(self.rewarm_at) => {
                    self.rewarm_at = None;
                    if let Some(agent) = self.warm.clone() {
                        if !self.warm_up(&agent).await {
                            break;
                        }
                    }
                }
                d = queue.next() => {
                    let Some(d) = d else { break };
                    if let TurnEnd::Shutdown = self.turn(d, &mut msgs).await {
                        stop_reason = "the agent was removed, or the runtime stopped, before this turn started";
                        break;
                    }
                }
            }
        }
        // Fail what is still queued: it will not run in this process.
        for d in queue.close() {
            self.fail(&d.flight.id, stop_reason).await;
        }
        self.stop_session().await;
    }

    /// The answer to a control of a flight that is not the running turn: an interrupt of
    /// a flight cancelled before its turn is done already; anything else is refused.
    fn not_running(&self, c: &Control) -> Result<(), RuntimeError> {
        if matches!(c, Control::Interrupt { .. }) && self.deps.cancelled.contains(control_flight(c))
        {
            return Ok(());
        }
        Err(RuntimeError::Unavailable(format!(
            "flight {} is not the turn running on agent {:?}",
            control_flight(c),
            self.name
        )))
    }

    /// Whether `flight` was interrupted before its turn: then it is reported cancelled
    /// (again: that settles it on a node too) and not started.
    async fn skip_cancelled(&self, flight: &str) -> bool {
        if !self.deps.cancelled.contains(flight) {
            return false;
        }
        tracing::info!(agent = %self.name, %flight, "flight interrupted before its turn; not started");
        self.report(cancelled_report(flight.to_string())).await;
        true
    }

    /// Starts the session outside a turn (`relay agent wake`, `keep_warm`); a failure
    /// schedules another try for a `keep_warm` agent. `false` when shutting down.
    async fn warm_up(&mut self, agent: &Agent) -> bool {
        match self.wake(agent).await {
            Ok(()) => true,
            Err(None) => false,
            Err(Some(e)) => {
                tracing::warn!(agent = %self.name, error = %e, "starting the session failed");
                self.schedule_rewarm();
                true
            }
        }
    }

    fn schedule_rewarm(&mut self) {
        if self.warm.is_none() || self.deps.shutdown.is_cancelled() {
            return;
        }
        self.rewarm_at = Some(tokio::time::Instant::now() + self.rewarm_delay);
        self.rewarm_delay = (self.rewarm_delay * 2).min(REWARM_MAX);
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
                self.session_ended().await;
            }
            Some(other) => {
                tracing::debug!(agent = %self.name, event = ?other, "event between turns")
            }
        }
    }

    /// The session is gone: the agent is offline, and a `keep_warm` one starts again
    /// (at once after a long life, with a growing pause while sessions die young).
    async fn session_ended(&mut self) {
        if let Some(live) = self.session.take() {
            if live.started.elapsed() > REWARM_MAX {
                self.rewarm_delay = REWARM_FIRST;
            }
        }
        self.report(Report::Agent {
            agent: self.name.clone(),
            state: Some(AgentState::Offline),
            thread_id: None,
            endpoint: None,
        })
        .await;
        self.schedule_rewarm();
    }

    async fn stop_session(&mut self) {
        if let Some(live) = self.session.take() {
            if let Err(e) = live.session.shutdown().await {
                tracing::warn!(agent = %self.name, error = %e, "session shutdown");
            }
            self.agent_state(AgentState::Offline).await;
        }
    }

    /// Spawns the harness and resumes (or starts) the agent's thread. On failure the
    /// agent is reported `failed`, never left `starting`.
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
        match self.start_session(agent).await {
            Ok(live) => {
                self.report(Report::Agent {
                    agent: self.name.clone(),
                    state: Some(AgentState::Idle),
                    thread_id: Some(live.thread_id.clone()),
                    endpoint: Some(Endpoint {
                        transport: Harness::CodexAppServer,
                        node: self.deps.node.clone(),
                        session_id: Some(live.thread_id.clone()),
                        pid: Some(live.session.pid()),
                        pane: None,
                    }),
                })
                .await;
                self.session = Some(live);
                Ok(())
            }
            Err(e) => {
                self.agent_state(AgentState::Failed).await;
                Err(e)
            }
        }
    }

    async fn start_session(&self, agent: &Agent) -> Result<Live, String> {
        let mut config = CodexConfig::new(codex_program(agent.spec.command.as_deref()));
        config.args = agent.spec.args.clone();
        config.env = agent.spec.env.clone();
        // Secret variables (shown as *** in `env`) with their values.
        config.env.extend(
            agent
                .spec
                .secrets
                .0
                .iter()
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        config.cwd = Some(PathBuf::from(&agent.spec.cwd));
        config.model = agent.spec.model.clone();
        let (session, events) = CodexSession::spawn(config)
            .await
            .map_err(|e| format!("cannot start codex app-server: {e}"))?;
        match self.open_thread(agent, &session).await {
            Ok(thread_id) => Ok(Live {
                session,
                events,
                thread_id,
                started: tokio::time::Instant::now(),
            }),
            Err(e) => {
                let _ = session.shutdown().await;
                Err(e)
            }
        }
    }

    /// Resumes the stored thread, or starts one (recording a lost thread as such), and
    /// stores its id.
    async fn open_thread(&self, agent: &Agent, session: &CodexSession) -> Result<String, String> {
        let stored = self
            .deps
            .threads
            .get(&self.name)
            .await
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
                Err(e) => return Err(format!("cannot resume codex thread {}: {e}", rec.thread_id)),
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
        Ok(thread_id)
    }

    /// Makes sure a session is up, racing the shutdown: a hung harness start must not
    /// hold up a stopping runtime. `Err(None)` means shutdown.
    async fn wake(&mut self, agent: &Agent) -> Result<(), Option<String>> {
        let shutdown = self.deps.shutdown.clone();
        tokio::select! {
            _ = shutdown.cancelled() => Err(None),
            r = self.ensure_session(agent) => r.map_err(Some),
        }
    }

    async fn turn(&mut self, d: Dispatch, msgs: &mut mpsc::UnboundedReceiver<Msg>) -> TurnEnd {
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
                Err(Some(reason)) => {
                    self.fail(&flight, &reason).await;
                    return TurnEnd::Done;
                }
                Err(None) => {
                    self.fail(
                        &flight,
                        "the runtime was shut down while the session started",
                    )
                    .await;
                    return TurnEnd::Shutdown;
                }
            }
        }
        // Interrupted while the session started?
        if self.skip_cancelled(&flight).await {
            return TurnEnd::Done;
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
        let shutdown = self.deps.shutdown.clone();
        let started = tokio::select! {
            _ = shutdown.cancelled() => {
                self.fail(&flight, "the runtime was shut down as the turn started").await;
                return TurnEnd::Shutdown;
            }
            r = self.start_turn(&d) => r,
        };
        let (session, thread_id, turn_id) = match started {
            Ok(t) => t,
            Err(reason) => {
                self.fail(&flight, &reason).await;
                self.turn_over(&d.invocation.id).await;
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
            invocation: d.invocation.id.clone(),
            turn_id,
            text: String::new(),
            approvals: HashSet::new(),
            answering: HashSet::new(),
            over: CancellationToken::new(),
        };
        let deadline = d.invocation.timeout_ms.map(Duration::from_millis);
        let timeout = async {
            match deadline {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(timeout);
        let idle = tokio::time::sleep(self.deps.turn_idle_timeout.unwrap_or(Duration::MAX));
        tokio::pin!(idle);
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
                    let _ = tokio::time::timeout(OWN_INTERRUPT, session.interrupt(&thread_id, &turn.turn_id)).await;
                    let after = deadline.unwrap_or_default();
                    self.fail(&turn.flight, &format!("timed out after {} ms", after.as_millis())).await;
                    break TurnEnd::Done;
                }
                _ = &mut idle, if watching => {
                    let _ = tokio::time::timeout(OWN_INTERRUPT, session.interrupt(&thread_id, &turn.turn_id)).await;
                    let secs = self.deps.turn_idle_timeout.unwrap_or_default().as_secs();
                    self.fail(
                        &turn.flight,
                        &format!("codex sent nothing for {secs} s (is its model reachable?); the turn was interrupted"),
                    )
                    .await;
                    break TurnEnd::Done;
                }
                m = msgs.recv() => match m {
                    None | Some(Msg::Control(Control::AgentRemoved { .. }, _)) => {
                        let _ = tokio::time::timeout(OWN_INTERRUPT, session.interrupt(&thread_id, &turn.turn_id)).await;
                        self.fail(&turn.flight, "the agent was removed during the turn").await;
                        if let Some(Msg::Control(_, reply)) = m {
                            let _ = reply.send(Ok(()));
                        }
                        break TurnEnd::Shutdown;
                    }
                    Some(Msg::Warm(agent)) => {
                        self.warm = (agent.spec.wake == WakePolicy::KeepWarm).then_some(*agent);
                    }
                    Some(Msg::Control(c, reply)) => {
                        self.spawn_control(&session, &thread_id, &mut turn, c, reply, &mut controls);
                    }
                },
                // A control finished; an answered approval no longer holds the watchdog.
                Some(done) = controls.join_next(), if !controls.is_empty() => {
                    if let Ok(Some((request, answered))) = done {
                        turn.answering.remove(&request);
                        if answered {
                            turn.approvals.remove(&request);
                        }
                    }
                }
                ev = next_event(&mut self.session) => {
                    let activity = ev.as_ref().is_some_and(counts_as_activity);
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
        // Controls still waiting on codex answer now: an interrupt is done (the turn is
        // over), anything else came too late.
        turn.over.cancel();
        while controls.join_next().await.is_some() {}
        self.report(Report::ApprovalsExpired {
            flight: turn.flight.clone(),
            by: None,
            request: None,
        })
        .await;
        self.turn_over(&turn.invocation).await;
        if self.session.is_some() {
            self.agent_state(AgentState::Idle).await;
        }
        end
    }

    /// Starts the turn. A thread that Codex lost since the session opened is replaced
    /// (the session is restarted, which resumes or starts a thread and records a loss)
    /// and the turn tried once more.
    async fn start_turn(&mut self, d: &Dispatch) -> Result<(CodexSession, String, String), String> {
        for attempt in 0..2 {
            let Some(live) = self.session.as_ref() else {
                return Err("the codex session is gone".into());
            };
            let (session, thread_id) = (live.session.clone(), live.thread_id.clone());
            match session.start_turn(&thread_id, &d.invocation.task).await {
                Ok(turn_id) => return Ok((session, thread_id, turn_id)),
                Err(e @ HarnessError::ThreadNotFound { .. }) if attempt == 0 => {
                    tracing::warn!(agent = %self.name, error = %e, "thread gone mid-session; restarting the session");
                    self.stop_session().await;
                    self.ensure_session(&d.agent).await?;
                }
                Err(e) => return Err(self.session_error("cannot start the turn", &e)),
            }
        }
        Err("cannot start the turn".into())
    }

    /// The embedded runtime forgets a turn once it is over: the record only guards a
    /// restart in the middle. A node keeps it (as done, written by its forwarder once
    /// the end is safely reported), to refuse a late redelivery.
    async fn turn_over(&self, invocation: &str) {
        if self.deps.node.is_none() {
            if let Err(e) = self.deps.threads.forget_dispatch(invocation).await {
                tracing::warn!(agent = %self.name, error = %e, "cannot forget the turn's record");
            }
        }
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

    /// Carries out a control of the running turn in a task of its own; see the module
    /// docs.
    fn spawn_control(
        &self,
        session: &CodexSession,
        thread_id: &str,
        turn: &mut Turn,
        c: Control,
        reply: oneshot::Sender<Result<(), RuntimeError>>,
        controls: &mut tokio::task::JoinSet<Option<(String, bool)>>,
    ) {
        if control_flight(&c) != turn.flight {
            let _ = reply.send(self.not_running(&c));
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
        let session = session.clone();
        let thread_id = thread_id.to_string();
        let turn_id = turn.turn_id.clone();
        let flight = turn.flight.clone();
        let reports = self.deps.reports.clone();
        let turn_over = turn.over.clone();
        controls.spawn(async move {
            let interrupt = matches!(c, Control::Interrupt { .. });
            let r = tokio::select! {
                r = run_control(&session, &thread_id, &turn_id, &flight, &reports, c) => r,
                _ = turn_over.cancelled() => {
                    if interrupt {
                        Ok(())
                    } else {
                        Err(RuntimeError::Unavailable(format!(
                            "the turn of flight {flight} ended before codex took this"
                        )))
                    }
                }
            };
            let answered = answers.map(|request| (request, r.is_ok()));
            let _ = reply.send(r);
            answered
        });
    }

    /// Handles one event of the running turn; true when the turn has ended.
    async fn turn_event(&mut self, turn: &mut Turn, ev: Option<HarnessEvent>) -> bool {
        let flight = turn.flight.clone();
        let Some(ev) = ev else {
            self.session_ended().await;
            self.fail(&flight, "the codex event stream ended mid-turn")
                .await;
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
                // Settled by Codex itself (the request was withdrawn), not by an answer
                // from Relay: close the record, and the turn goes on.
                if turn.approvals.remove(&request_id) {
                    self.report(Report::ApprovalsExpired {
                        flight: flight.clone(),
                        by: Some("codex:withdrawn".into()),
                        request: Some(request_id),
                    })
                    .await;
                    if turn.approvals.is_empty() {
                        self.state(
                            &flight,
                            FlightState::Running,
                            Some("codex withdrew its approval request".into()),
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
                        item_kind: kind,
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
                let how = match (code, signal) {
                    (_, Some(s)) => format!("was killed by signal {s}"),
                    (Some(c), None) => format!("exited with code {c}"),
                    (None, None) => "exited".to_string(),
                };
                let tail = stderr_tail.trim();
                let reason = if tail.is_empty() {
                    format!("codex app-server {how} mid-turn (it wrote nothing on stderr)")
                } else {
                    format!("codex app-server {how} mid-turn; stderr tail:\n{tail}")
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

/// Whether an event shows the turn is alive. Codex's own retry warnings ("Reconnecting...
/// waiting for network") do not: a turn that only retries is stuck.
fn counts_as_activity(ev: &HarnessEvent) -> bool {
    !matches!(ev, HarnessEvent::Warning { .. })
}

/// Steers, interrupts or answers an approval of the running turn.
async fn run_control(
    session: &CodexSession,
    thread_id: &str,
    turn_id: &str,
    flight: &str,
    reports: &mpsc::Sender<Report>,
    c: Control,
) -> Result<(), RuntimeError> {
    match c {
        Control::Steer { text, .. } => {
            session.steer(thread_id, turn_id, &text).await?;
            let _ = reports
                .send(Report::Flight {
                    flight: flight.to_string(),
                    change: FlightChange::Note {
                        text: format!("steered: {text}"),
                    },
                })
                .await;
        }
        Control::Interrupt { .. } => {
            // Right after `turn/start` codex may not have made the turn active yet
            // ("no active turn"); give it a moment rather than fail the request.
            let mut tries = 0;
            loop {
                match session.interrupt(thread_id, turn_id).await {
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
        // Handled by the runtime and the worker's loop, never sent here.
        Control::AgentRemoved { .. } | Control::Wake { .. } => {}
    }
    Ok(())
}

fn control_flight(c: &Control) -> &str {
    match c {
        Control::Steer { flight, .. }
        | Control::Interrupt { flight, .. }
        | Control::Approval { flight, .. } => flight,
        Control::AgentRemoved { .. } | Control::Wake { .. } => "",
    }
}

/// The next event of the live session, or never when there is none.
async fn next_event(session: &mut Option<Live>) -> Option<HarnessEvent> {
    match session {
        Some(live) => live.events.recv().await,
        None => std::future::pending().await,
    }
}

/// Resolves at `at`, or never.
async fn rewarm(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_protocol::domain::{AgentSpec, Flight, Invocation};

    fn dispatch(flight: &str, task: &str) -> Dispatch {
        let invocation = Invocation {
            id: format!("inv_{flight}"),
            requester: "operator".into(),
            target: "a1".into(),
            action: Default::default(),
            task: task.into(),
            conversation: "direct.a1.operator".into(),
            request_message: format!("msg_{flight}"),
            parent_flight: None,
            depth: 0,
            timeout_ms: None,
            created_at: 0,
        };
        Dispatch {
            agent: Agent {
                spec: AgentSpec::new(
                    "a1",
                    relay_protocol::domain::Harness::CodexAppServer,
                    "/tmp",
                ),
                state: AgentState::Offline,
                thread_id: None,
                endpoint: None,
                created_at: 0,
                updated_at: 0,
            },
            flight: Flight::queued(flight, &invocation),
            invocation,
        }
    }

    #[test]
    fn steers_of_a_queued_flight_keep_its_task_within_the_limit() {
        let queue = TurnQueue::default();
        queue.push(dispatch("f1", "0123456789")).unwrap();
        // 10 + 2 + 8 = 20 bytes: exactly the limit.
        assert!(queue.steer("f1", "abcdefgh", Some(20)).unwrap());
        // One byte more is refused, and the task stays as it was.
        let err = queue.steer("f1", "x", Some(22)).unwrap_err();
        assert!(
            matches!(err, RuntimeError::TooLarge { ref flight, size: 23, limit: 22 } if flight == "f1"),
            "{err:?}"
        );
        assert!(queue.steer("f1", "", Some(22)).unwrap(), "22 bytes fit");
        assert!(!queue.steer("f2", "x", Some(100)).unwrap(), "not queued");
        assert!(
            queue.steer("f1", &"y".repeat(1000), None).unwrap(),
            "no limit"
        );
        let d = queue.remove("f1").unwrap();
        assert_eq!(
            d.invocation.task,
            format!("0123456789\n\nabcdefgh\n\n\n\n{}", "y".repeat(1000))
        );
    }
}
