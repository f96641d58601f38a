//! One agent's worker: its turn queue, its harness session and the turn in progress.
//! It knows the harness only through the seam ([`relay_harnesses::seam`]): the launcher
//! of the agent's [`Harness`](relay_protocol::domain::Harness), found in the runtime's
//! [`Harnesses`], and the `dyn HarnessSession` it spawns.
//!
//! The worker is the only owner of the agent's session. It waits on four things at
//! once: the session's event stream (also between turns, to see the child die), control
//! messages (steer, interrupt, approvals), the next queued turn (only when no turn
//! runs), and the shutdown. A session that died is dropped and respawned by the next
//! turn, which resumes the same conversation; a `keep_warm` session is respawned at once.
//!
//! Parts, each on one concern, in the order a turn meets them:
//! - `queue.rs`: [`TurnQueue`], shared with the agent's [`Handle`], so a flight still
//!   waiting in it can be cancelled or steered without disturbing the turn that runs.
//! - this file: the worker's loop between turns, its handle, and how it reports.
//! - `session.rs`: spawning the session, opening (and storing) its conversation,
//!   watching it between turns, `keep_warm`, stopping it.
//! - `turn.rs`: the turn in progress, its deadline and idle watchdog.
//! - `controls.rs`: its controls, each a task of its own (refused with a reason where
//!   the harness lacks the capability).
//! - `events.rs`: each harness event of the turn, turned into reports.
//! - `tree.rs`: the agent's git worktree, when it has one: made before its session
//!   spawns there, a marker at each turn's start, the turn's commit as its end goes out.
//!
//! Layering: `mod` -> `turn` -> `controls`, `events`, `session` -> the seam; `tree` -> the
//! workspace; `queue` stands alone.
//! Only `session.rs`, `turn.rs` and `controls.rs` call the harness.

mod controls;
mod events;
mod queue;
mod session;
mod tree;
mod turn;

use std::sync::Arc;
use std::time::Duration;

use relay_harnesses::Harnesses;
use relay_protocol::domain::{Agent, AgentState, FlightChange, FlightState, SharedStr, WakePolicy};
use relay_protocol::runtime::{Control, Dispatch, Report};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use queue::TurnQueue;
pub(crate) use tree::{commit_reports, send_commit, worktree_report};

use self::session::{next_event, rewarm, Live, REWARM_BACKOFF};
use self::turn::TurnEnd;
use crate::{cancelled_report, Cancelled, RuntimeError};
use relay_infra::retry::BackoffBuilder;

pub struct Deps {
    pub reports: mpsc::Sender<Report>,
    pub threads: crate::ThreadStore,
    /// The worktrees of this runtime's agents.
    pub workspaces: crate::workspace::Workspaces,
    /// The launchers of the harnesses this runtime drives.
    pub harnesses: Arc<Harnesses>,
    pub node: Option<String>,
    pub shutdown: CancellationToken,
    /// A running turn without a harness event for this long is interrupted and failed
    /// (`None`: never). Time spent waiting for an approval does not count.
    pub turn_idle_timeout: Option<Duration>,
    /// See [`crate::RuntimeConfig::turn_stall_timeout`].
    pub turn_stall_timeout: Option<Duration>,
    /// See [`crate::RuntimeConfig::turn_quiet_note`].
    pub turn_quiet_note: Option<Duration>,
    /// Flights interrupted before their turn started: never started here.
    pub cancelled: Arc<Cancelled>,
    /// How the agent's session reaches Relay.
    pub access: Option<relay_harnesses::AccessIssuer>,
    /// See [`crate::RuntimeConfig::texts`].
    pub texts: Option<crate::TextSink>,
}

enum Msg {
    Warm(Box<Agent>),
    Control(Control, oneshot::Sender<Result<(), RuntimeError>>),
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
        rewarm_waits: REWARM_BACKOFF.build(),
        rewarm_at: None,
        started: None,
        tree: Default::default(),
        removed: None,
    };
    tasks.spawn(worker.run(queue.clone(), msgs_rx));
    Handle { queue, msgs }
}

struct Worker {
    name: String,
    deps: Deps,
    session: Option<Live>,
    /// The agent, while its wake policy is `keep_warm`: its session is kept running.
    warm: Option<Agent>,
    /// The waits before the next starts of a `keep_warm` session that keeps dying.
    rewarm_waits: relay_infra::retry::ExponentialBackoff,
    /// When to start the `keep_warm` session again after it died.
    rewarm_at: Option<tokio::time::Instant>,
    /// The turn whose start is recorded on disk: (flight, invocation). Its end is
    /// recorded too, with its report, before that report leaves (see [`Worker::report`]).
    started: Option<(String, String)>,
    /// The agent's worktree, if it has one.
    tree: tree::Tree,
    /// The answer to the agent's removal, sent once its session stopped.
    removed: Option<oneshot::Sender<Result<(), RuntimeError>>>,
}

impl Worker {
    /// The agent's task, alive as long as the agent. What it awaits only now and then (a
    /// turn, a session's start or stop, an idle event, failing what is left) is boxed:
    /// inline, the largest of those futures made every idle worker's task that large,
    /// 26 KB an agent (the broker of 1,000 live agents held 26 MB of it). See
    /// `tests::an_idle_worker_task_is_small`.
    async fn run(mut self, queue: Arc<TurnQueue>, mut msgs: mpsc::UnboundedReceiver<Msg>) {
        // Why the turns still queued will not run here; `None`: the runtime is stopping,
        // and they are left to the next start (see below).
        let mut stop_reason = None;
        loop {
            tokio::select! {
                // The session's death is seen before a queued turn is taken, so that turn
                // respawns the session instead of failing on a dead one.
                biased;
                _ = self.deps.shutdown.cancelled() => break,
                ev = next_event(&mut self.session) => Box::pin(self.idle_event(ev)).await,
                m = msgs.recv() => match m {
                    None => break,
                    Some(Msg::Warm(agent)) => {
                        self.warm = (agent.spec.wake == WakePolicy::KeepWarm).then(|| (*agent).clone());
                        if !Box::pin(self.warm_up(&agent)).await {
                            break;
                        }
                    }
                    Some(Msg::Control(Control::AgentRemoved { .. }, reply)) => {
                        self.removed = Some(reply);
                        stop_reason = Some(REMOVED);
                        break;
                    }
                    Some(Msg::Control(c, reply)) => {
                        let _ = reply.send(self.not_running(&c));
                    }
                },
                _ = rewarm(self.rewarm_at) => {
                    self.rewarm_at = None;
                    if let Some(agent) = self.warm.clone() {
                        if !Box::pin(self.warm_up(&agent)).await {
                            break;
                        }
                    }
                }
                d = queue.next() => {
                    let Some(d) = d else { break };
                    // Every line the turn logs names its flight.
                    let span = tracing::info_span!("flight", flight = %d.flight.id);
                    let turn = async {
                        tracing::debug!(agent = %self.name, "turn starts");
                        let end = Box::pin(self.turn(d, &mut msgs)).await;
                        tracing::debug!(agent = %self.name, "turn ended");
                        end
                    };
                    if let TurnEnd::Shutdown = tracing::Instrument::instrument(turn, span).await {
                        break;
                    }
                }
            }
        }
        // The handle went away (or the turn ended) without the runtime stopping: the
        // agent was removed.
        if !self.deps.shutdown.is_cancelled() {
            stop_reason = stop_reason.or(Some(REMOVED));
        }
        let left = queue.close();
        match stop_reason {
            // Fail what is still queued: its agent is gone.
            Some(reason) => {
                for d in left {
                    Box::pin(self.fail(&d.flight.id, reason)).await;
                }
            }
            // The runtime stops: these turns never started, so nothing of them ran. They
            // are not failed but left as they are, to be delivered again at the next start
            // (the broker dispatches its `queued` flights again; a node leaves their
            // dispatches unacknowledged, so JetStream delivers them again).
            None if !left.is_empty() => tracing::info!(
                agent = %self.name,
                turns = left.len(),
                "runtime stopping: queued turns left for the next start"
            ),
            None => {}
        }
        Box::pin(self.stop_session()).await;
        // The removal is answered only now that the session stopped: the runtime removes
        // the worktree then, never under a harness still writing in it.
        if let Some(reply) = self.removed.take() {
            let _ = reply.send(Ok(()));
        }
    }

    /// The answer to a control of a flight that is not the running turn: an interrupt of
    /// a flight cancelled before its turn is done already; anything else is refused.
    fn not_running(&self, c: &Control) -> Result<(), RuntimeError> {
        if matches!(c, Control::Interrupt { .. }) && self.deps.cancelled.contains(control_flight(c))
        {
            return Ok(());
        }
        Err(RuntimeError::NotRunning {
            flight: control_flight(c).to_string(),
            agent: self.name.clone(),
        })
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

    async fn report(&self, r: Report) {
        // The end of a started turn is on disk, with its report, before the report
        // leaves: reports wait in memory (a node's go out one JetStream ack at a time),
        // and a crash before they are recorded must neither call a finished turn
        // interrupted nor run it again (the record keeps its dispatch from running).
        if let (
            Some((started, invocation)),
            Report::Flight {
                flight,
                change: FlightChange::State { to, .. },
            },
        ) = (&self.started, &r)
        {
            if flight == started && to.is_terminal() {
                if let Err(e) = self.deps.threads.set_dispatch_ended(invocation, &r).await {
                    tracing::error!(agent = %self.name, error = %e, "cannot record the turn's end");
                }
                // Then the worktree's changes are committed, before the end leaves: a
                // crash in between leaves the marker, committed at the next start.
                self.tree_commit(flight).await;
            }
        }
        // The broker side only goes away at shutdown; nothing to do then.
        let _ = self.deps.reports.send(r).await;
    }

    /// Writes a long text of `flight` before it is reported ([`crate::TextSink`]), on
    /// the blocking pool; `false` where it was not (no sink, or it failed: the text then
    /// goes into the broker's log as it is).
    async fn write_first(&self, flight: &str, text: &SharedStr) -> bool {
        let Some(sink) = self.deps.texts.clone() else {
            return false;
        };
        if text.len() < relay_protocol::domain::shared::LONG_TEXT {
            return false;
        }
        let (flight, text) = (flight.to_string(), text.clone());
        match tokio::task::spawn_blocking(move || sink.write(&flight, &text)).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::warn!(agent = %self.name, error = %e, "a long text could not be written first; it is stored with its event");
                false
            }
            Err(_) => false,
        }
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
        self.agent_state_because(state, None).await;
    }

    /// Reports the agent's state with why it is in it (kept with the state).
    async fn agent_state_because(&self, state: AgentState, reason: Option<String>) {
        self.report(Report::Agent {
            worktree: None,
            agent: self.name.clone(),
            state: Some(state),
            thread_id: None,
            endpoint: None,
            reason,
            program: None,
        })
        .await;
    }
}

/// Why the turns queued for a removed agent fail.
const REMOVED: &str = "the agent was removed before this turn started";

fn control_flight(c: &Control) -> &str {
    match c {
        Control::Steer { flight, .. }
        | Control::Interrupt { flight, .. }
        | Control::Reply { flight, .. }
        | Control::Approval { flight, .. }
        | Control::Revert { flight, .. } => flight,
        Control::AgentRemoved { .. } | Control::Wake { .. } => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future `f` returns, without making one.
    fn future_size<A, F: std::future::Future>(_: impl FnOnce(A) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// Each agent's worker task lives as long as the agent, so its size is paid by every
    /// agent, busy or not (1,000 live agents: ops/BENCHMARKS.md scenario 7). A turn's
    /// future alone (17 KB) is larger than the whole task may be: it stays boxed.
    #[test]
    fn an_idle_worker_task_is_small() {
        type Msgs = mpsc::UnboundedReceiver<Msg>;
        let task = future_size(|(w, q, m): (Worker, Arc<TurnQueue>, Msgs)| w.run(q, m));
        assert!(task <= 16 * 1024, "the worker's task takes {task} B");
    }
}
