//! The agent's harness session, through the seam only ([`relay_harnesses::seam`]): the
//! launcher of the agent's harness spawns it, it opens the agent's harness session (whose id
//! is stored, and whose loss is reported), and the worker watches it between turns,
//! starts it again for a `keep_warm` agent when it dies, and stops it.

use std::sync::Arc;
use std::time::Duration;

use relay_harnesses::seam::{HarnessInfo, HarnessSession, Launcher, OpenedSession, Spawned};
use relay_harnesses::HarnessError;
use relay_infra::retry::{self, BackoffBuilder};
use relay_protocol::clock::now_ms;
use relay_protocol::domain::{Agent, AgentState, Endpoint, ForkSpec};
use relay_protocol::harness::HarnessEvent;
use relay_protocol::runtime::{Report, DELTA_MERGE_MAX};
use tokio::sync::mpsc;

use super::Worker;
use crate::threads::ThreadRecord;
use crate::RuntimeError;

/// The waits before a `keep_warm` session that died is started again: a second first,
/// doubling up to [`REWARM_MAX`] while sessions keep dying young (taken one by one: the
/// next try is a deadline in the worker's state, not a loop).
pub(super) const REWARM_BACKOFF: retry::ExponentialBuilder =
    retry::forever(Duration::from_secs(1), REWARM_MAX);
const REWARM_MAX: Duration = Duration::from_secs(60);

/// The live session and the harness session id it has open.
pub(super) struct Live {
    pub session: Arc<dyn HarnessSession>,
    pub events: mpsc::Receiver<HarnessEvent>,
    pub info: HarnessInfo,
    pub session_id: String,
    pub started: tokio::time::Instant,
    /// An event taken from `events` while merging deltas that ended the run
    /// ([`next_event`]): the next one handed out.
    pub held: Option<HarnessEvent>,
}

/// Why a session (or the turn on it) could not be started. Its text is the reason the
/// flight fails with.
#[derive(Debug, thiserror::Error)]
pub(super) enum SessionError {
    /// No launcher for the agent's harness, or its session could not be opened.
    #[error(transparent)]
    Harness(#[from] HarnessError),
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: &'static str,
        #[source]
        source: HarnessError,
    },
    /// The stored session id could not be read.
    #[error(transparent)]
    Stored(RuntimeError),
    /// The agent's worktree could not be made.
    #[error(transparent)]
    Worktree(RuntimeError),
    #[error("cannot record the thread id: {0}")]
    Record(#[source] RuntimeError),
    /// The runtime stopped (or the agent was removed) while the session started.
    #[error("the runtime was shut down while the session started")]
    ShutDown,
    #[error("the {name} session is gone")]
    Gone { name: &'static str },
    /// The harness refused the turn; `stderr` is its tail, where it says more than the
    /// refusal.
    #[error("cannot start the turn: {source}{}", stderr_note(.name, .stderr))]
    TurnStart {
        #[source]
        source: HarnessError,
        name: &'static str,
        stderr: Option<String>,
    },
}

fn stderr_note(name: &str, stderr: &Option<String>) -> String {
    match stderr {
        Some(tail) => format!("; {name} stderr: {tail}"),
        None => String::new(),
    }
}

impl Worker {
    /// Starts the session outside a turn (`relay agent wake`, `keep_warm`); a failure
    /// schedules another try for a `keep_warm` agent. `false` when shutting down.
    pub(super) async fn warm_up(&mut self, agent: &Agent) -> bool {
        match self.wake(agent).await {
            Ok(()) => true,
            Err(SessionError::ShutDown) => false,
            Err(e) => {
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
        // `forever` never runs out; the cap is only a fallback.
        let wait = self.rewarm_waits.next().unwrap_or(REWARM_MAX);
        self.rewarm_at = Some(tokio::time::Instant::now() + wait);
    }

    /// An event while no turn runs: only the child's death matters.
    pub(super) async fn idle_event(&mut self, ev: Option<HarnessEvent>) {
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
    pub(super) async fn session_ended(&mut self) {
        if let Some(live) = self.session.take() {
            if live.started.elapsed() > REWARM_MAX {
                self.rewarm_waits = REWARM_BACKOFF.build();
            }
        }
        self.report(Report::Agent {
            worktree: None,
            agent: self.name.clone(),
            state: Some(AgentState::Offline),
            thread_id: None,
            endpoint: None,
            reason: None,
            program: None,
        })
        .await;
        self.schedule_rewarm();
    }

    pub(super) async fn stop_session(&mut self) {
        if let Some(live) = self.session.take() {
            if let Err(e) = live.session.shutdown().await {
                tracing::warn!(agent = %self.name, error = %e, "session shutdown");
            }
            self.agent_state(AgentState::Offline).await;
        }
    }

    /// Spawns the harness and opens the agent's harness session. On failure the agent is
    /// reported `failed`, never left `starting`.
    pub(super) async fn ensure_session(&mut self, agent: &Agent) -> Result<(), SessionError> {
        if self.session.is_some() {
            return Ok(());
        }
        let launcher = self.deps.harnesses.get(agent.spec.harness)?;
        self.agent_state(AgentState::Starting).await;
        // An agent with a worktree is spawned there (its cwd names the repository).
        let started = match self.in_worktree(agent).await {
            Ok(there) => self.start_session(launcher.as_ref(), &there).await,
            Err(e) => Err(SessionError::Worktree(e)),
        };
        match started {
            Ok(live) => {
                let endpoint = live.session.endpoint();
                self.report(Report::Agent {
                    worktree: None,
                    agent: self.name.clone(),
                    state: Some(AgentState::Idle),
                    thread_id: Some(live.session_id.clone()),
                    endpoint: Some(Endpoint {
                        transport: live.info.harness,
                        node: self.deps.node.clone(),
                        session_id: Some(live.session_id.clone()),
                        pid: endpoint.pid(),
                        pane: endpoint.pane().map(str::to_string),
                    }),
                    reason: None,
                    program: live.session.program(),
                })
                .await;
                self.session = Some(live);
                Ok(())
            }
            Err(e) => {
                // The reason stays with the state: `relay agent show` says why.
                self.agent_state_because(AgentState::Failed, Some(e.to_string()))
                    .await;
                Err(e)
            }
        }
    }

    async fn start_session(
        &self,
        launcher: &dyn Launcher,
        agent: &Agent,
    ) -> Result<Live, SessionError> {
        let info = launcher.info();
        let access = self
            .deps
            .access
            .as_ref()
            .and_then(|issuer| issuer.for_agent(&self.name));
        let Spawned { session, events } = launcher
            .spawn(&agent.spec, access.as_ref())
            .await
            .map_err(|source| SessionError::Spawn {
                program: info.program,
                source,
            })?;
        match self
            .open_session(info, session.as_ref(), agent.spec.fork.as_ref())
            .await
        {
            Ok(session_id) => Ok(Live {
                session,
                events,
                info,
                session_id,
                started: tokio::time::Instant::now(),
                held: None,
            }),
            Err(e) => {
                let _ = session.shutdown().await;
                Err(e)
            }
        }
    }

    /// Opens the stored session (or a new one), reports a lost one as such, and
    /// stores the id. A harness that cannot resume is not asked to: its new session
    /// is recorded as the loss of the stored one. A forked agent without a stored
    /// session yet opens `fork`'s copy; its failure is the error (never a fresh session
    /// in its place).
    async fn open_session(
        &self,
        info: HarnessInfo,
        session: &dyn HarnessSession,
        fork: Option<&ForkSpec>,
    ) -> Result<String, SessionError> {
        let stored = self
            .deps
            .threads
            .get(&self.name)
            .await
            .map_err(SessionError::Stored)?
            .map(|rec| rec.thread_id);
        let opened = match (stored, fork) {
            (None, Some(from)) => session.fork(from).await?,
            (Some(old_id), _) if !info.capabilities.resume => {
                let new = session.open(None).await?;
                let why = format!("{} cannot resume a conversation", info.name);
                OpenedSession::replacing(&old_id, new.id, &why)
            }
            (stored, _) => session.open(stored.as_deref()).await?,
        };
        if let Some(lost) = opened.lost {
            self.report(Report::ThreadLost {
                agent: self.name.clone(),
                old_thread_id: lost.old_id,
                new_thread_id: opened.id.clone(),
                reason: lost.reason,
            })
            .await;
        }
        self.deps
            .threads
            .put(
                &self.name,
                &ThreadRecord {
                    harness: info.harness.as_str().into(),
                    thread_id: opened.id.clone(),
                    updated_at: now_ms(),
                },
            )
            .await
            .map_err(SessionError::Record)?;
        Ok(opened.id)
    }

    /// Makes sure a session is up, racing the shutdown: a hung harness start must not
    /// hold up a stopping runtime.
    pub(super) async fn wake(&mut self, agent: &Agent) -> Result<(), SessionError> {
        let shutdown = self.deps.shutdown.clone();
        tokio::select! {
            _ = shutdown.cancelled() => Err(SessionError::ShutDown),
            r = self.ensure_session(agent) => r,
        }
    }

    /// How messages name the agent's harness program, with or without a live session.
    pub(super) fn harness_name(&self, agent: &Agent) -> &'static str {
        match (&self.session, self.deps.harnesses.get(agent.spec.harness)) {
            (Some(live), _) => live.info.name,
            (None, Ok(launcher)) => launcher.info().name,
            (None, Err(_)) => agent.spec.harness.as_str(),
        }
    }
}

/// The next event of the live session, or never when there is none. Streamed text
/// already waiting behind it is joined to it: consecutive deltas of one item, up to
/// [`DELTA_MERGE_MAX`] bytes, become one (at a slow pace nothing waits, and each delta
/// stays its own). A harness streaming a burst thus costs the worker, its reports and
/// the broker one update per slice, not one per line. Cancel-safe: nothing is awaited
/// once an event is taken.
pub(super) async fn next_event(session: &mut Option<Live>) -> Option<HarnessEvent> {
    match session {
        Some(live) => next_of(&mut live.events, &mut live.held).await,
        None => std::future::pending().await,
    }
}

/// [`next_event`] of a session's `events`, with the event `held` from the last run first.
async fn next_of(
    events: &mut mpsc::Receiver<HarnessEvent>,
    held: &mut Option<HarnessEvent>,
) -> Option<HarnessEvent> {
    let first = match held.take() {
        Some(event) => event,
        None => events.recv().await?,
    };
    Some(join_waiting(first, events, held))
}

/// `first`, and when it is a delta, the deltas of its item waiting right behind it in
/// `events` joined to it (up to [`DELTA_MERGE_MAX`] bytes); the event that ended the
/// run, if one was taken, goes into `held`, to be handed out next.
fn join_waiting(
    first: HarnessEvent,
    events: &mut mpsc::Receiver<HarnessEvent>,
    held: &mut Option<HarnessEvent>,
) -> HarnessEvent {
    let HarnessEvent::TextDelta {
        turn_id,
        item_id,
        mut delta,
    } = first
    else {
        return first;
    };
    while delta.len() < DELTA_MERGE_MAX {
        match events.try_recv() {
            Ok(HarnessEvent::TextDelta {
                turn_id: t,
                item_id: i,
                delta: more,
            }) if t == turn_id && i == item_id && delta.len() + more.len() <= DELTA_MERGE_MAX => {
                delta.push_str(&more)
            }
            Ok(other) => {
                *held = Some(other);
                break;
            }
            Err(_) => break,
        }
    }
    HarnessEvent::TextDelta {
        turn_id,
        item_id,
        delta,
    }
}

/// Resolves at `at`, or never.
pub(super) async fn rewarm(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn delta(item: &str, text: &str) -> HarnessEvent {
        HarnessEvent::TextDelta {
            turn_id: "t".into(),
            item_id: item.into(),
            delta: text.into(),
        }
    }

    /// Takes every event as the worker does, until the session's side is gone.
    async fn drain(events: &mut mpsc::Receiver<HarnessEvent>) -> Vec<HarnessEvent> {
        let mut held = None;
        let mut out = Vec::new();
        while let Some(event) = next_of(events, &mut held).await {
            out.push(event);
        }
        out
    }

    #[tokio::test]
    async fn deltas_waiting_together_are_joined_in_order_and_nothing_else_moves() {
        let (tx, mut rx) = mpsc::channel(64);
        let other_turn = HarnessEvent::TextDelta {
            turn_id: "t2".into(),
            item_id: "m".into(),
            delta: "y".into(),
        };
        for e in [
            delta("m", "a"),
            delta("m", "b"),
            delta("m", "c"),
            HarnessEvent::Warning {
                message: "w".into(),
            },
            delta("m", "d"),
            delta("other", "e"),
            delta("m", "f"),
            delta("m", "g"),
            // Another turn's delta of the same item id is not joined either.
            other_turn.clone(),
            delta("m", "z"),
        ] {
            tx.send(e).await.unwrap();
        }
        drop(tx);
        assert_eq!(
            drain(&mut rx).await,
            vec![
                delta("m", "abc"),
                HarnessEvent::Warning {
                    message: "w".into()
                },
                delta("m", "d"),
                delta("other", "e"),
                delta("m", "fg"),
                other_turn,
                delta("m", "z"),
            ]
        );
    }

    #[tokio::test]
    async fn a_burst_is_cut_into_slices_of_at_most_the_cap_with_nothing_lost() {
        let (tx, mut rx) = mpsc::channel(4096);
        let piece = "0123456789abcdef".repeat(64); // 1 KiB
        let mut sent = String::new();
        for i in 0..100 {
            let text = format!("{i:04}{piece}");
            sent.push_str(&text);
            tx.send(delta("m", &text)).await.unwrap();
        }
        drop(tx);
        let slices = drain(&mut rx).await;
        let mut joined = String::new();
        for s in &slices {
            let HarnessEvent::TextDelta { delta, .. } = s else {
                panic!("not a delta: {s:?}")
            };
            assert!(
                delta.len() <= DELTA_MERGE_MAX,
                "a slice of {} B",
                delta.len()
            );
            joined.push_str(delta);
        }
        assert_eq!(joined, sent);
        // About 1 KiB each: 11 to a 12 KiB slice.
        assert_eq!(slices.len(), 10);
    }
}
