//! The agent's worktree, for an agent that has one ([`crate::workspace`]): made (or
//! made again from its branch, with a note on the flight) before its session spawns
//! there and before each turn; a marker before the harness sees the task; the commit
//! of the turn's changes when its end goes out (see [`Worker::report`]); and before
//! each turn, the commit of a turn left uncommitted.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use relay_protocol::domain::{Agent, FlightChange, WorktreeState};
use relay_protocol::runtime::{Dispatch, Report};

use super::Worker;
use crate::threads::{ThreadStore, WorktreeRecord};
use crate::workspace::{Committed, TurnLock, WorkspaceError};
use crate::RuntimeError;

/// How long a turn's commit waits for a git lock held by someone else (`index.lock`)
/// before it gives up and leaves the changes to the next turn.
const COMMIT_PATIENCE: Duration = Duration::from_secs(60);
/// The longest wait between two tries.
const COMMIT_RETRY_MAX: Duration = Duration::from_secs(5);

/// The worker's view of its agent's worktree.
#[derive(Default)]
pub(super) struct Tree {
    /// The state last reported (a report goes out when it changes).
    last: Mutex<Option<WorktreeState>>,
    /// A recreation seen at session start, to note on the next flight.
    note: Option<String>,
    /// The turn in progress: its worktree, and the agent's lock it holds.
    turn: Option<TreeTurn>,
}

pub(super) struct TreeTurn {
    flight: String,
    path: PathBuf,
    record: WorktreeRecord,
    /// Released once the turn's commit is made (before its end goes out: a revert asked
    /// as soon as the flight ended is not refused as running).
    lock: Mutex<Option<TurnLock>>,
}

/// The report of an agent's worktree state.
pub(crate) fn worktree_report(agent: &str, state: WorktreeState) -> Report {
    Report::Agent {
        agent: agent.to_string(),
        state: None,
        thread_id: None,
        endpoint: None,
        reason: None,
        program: None,
        worktree: Some(Box::new(state)),
    }
}

/// The reports of a flight's commit: the commit on the flight (and on each flight it
/// carries), and the branch's new state.
pub(crate) fn commit_reports(agent: &str, committed: Committed) -> Vec<Report> {
    let mut out = Vec::new();
    if let Some(commit) = committed.commit {
        let flights = std::iter::once(&committed.marker.flight).chain(&committed.marker.pending);
        for flight in flights {
            out.push(Report::Flight {
                flight: flight.clone(),
                change: FlightChange::Commit {
                    commit: Box::new(commit.clone()),
                },
            });
        }
        out.push(worktree_report(agent, committed.state));
    }
    out
}

/// Sends the reports of a commit made for `flight`'s turn, kept on disk first (see
/// [`ThreadStore::put_commit_reports`]): a crash before the broker records them loses
/// none. A record that cannot be kept is said, and the reports go anyway.
pub(crate) async fn send_commit(
    threads: &ThreadStore,
    to: &tokio::sync::mpsc::Sender<Report>,
    flight: &str,
    reports: Vec<Report>,
) {
    if reports.is_empty() {
        return;
    }
    if let Err(e) = threads.put_commit_reports(flight, &reports).await {
        tracing::error!(%flight, error = %e, "cannot keep the commit's reports until they are recorded");
    }
    for r in reports {
        let _ = to.send(r).await;
    }
}

fn same(a: &WorktreeState, b: &WorktreeState) -> bool {
    WorktreeState {
        updated_at: 0,
        ..a.clone()
    } == WorktreeState {
        updated_at: 0,
        ..b.clone()
    }
}

impl Worker {
    /// Reports the worktree's state when it changed since the last report.
    async fn tree_state(&self, state: WorktreeState) {
        {
            let mut last = self.tree.last.lock().unwrap_or_else(|p| p.into_inner());
            if last.as_ref().is_some_and(|l| same(l, &state)) {
                return;
            }
            *last = Some(state.clone());
        }
        let _ = self
            .deps
            .reports
            .send(worktree_report(&self.name, state))
            .await;
    }

    /// The agent as its session is spawned: in its worktree (made now if need be),
    /// else as it is.
    pub(super) async fn in_worktree(&mut self, agent: &Agent) -> Result<Agent, RuntimeError> {
        let mut agent = agent.clone();
        if agent.spec.worktree.is_some() {
            let (path, _) = self.ensure_worktree(&agent, None).await?;
            agent.spec.cwd = path.display().to_string();
        }
        Ok(agent)
    }

    /// Makes (or finds, or makes again) the agent's worktree; a recreation is noted on
    /// `flight` (or on the next one). (Its path, whether it was made again now.)
    async fn ensure_worktree(
        &mut self,
        agent: &Agent,
        flight: Option<&str>,
    ) -> Result<(PathBuf, bool), RuntimeError> {
        let made = self.deps.workspaces.ensure(&agent.spec).await?;
        if made.recreated {
            self.tree.note = Some(format!(
                "the worktree {} was gone (deleted or moved by hand): made again from branch {} (time {})",
                made.path.display(),
                made.record.branch,
                made.record.recreated
            ));
        }
        if let (Some(flight), Some(text)) = (flight, self.tree.note.take()) {
            self.change(flight, FlightChange::Note { text, by: None })
                .await;
        }
        self.tree_state(made.state).await;
        Ok((made.path, made.recreated))
    }

    /// Before a turn: the worktree there, and a turn left uncommitted committed now.
    /// Whether the worktree was made again just now (a session spawned in the old one
    /// works in a deleted directory: the caller restarts it).
    pub(super) async fn tree_before_turn(&mut self, d: &Dispatch) -> Result<bool, RuntimeError> {
        if d.agent.spec.worktree.is_none() {
            return Ok(false);
        }
        let (path, recreated) = self.ensure_worktree(&d.agent, Some(&d.flight.id)).await?;
        let Some(record) = self.deps.workspaces.record(&path).await? else {
            return Ok(recreated);
        };
        let _lock = self.deps.workspaces.lock_turn(&self.name, None).await;
        match self.deps.workspaces.commit(&path, &record).await {
            Ok(Some(committed)) => {
                let marker = committed.marker.clone();
                let reports = commit_reports(&self.name, committed);
                send_commit(
                    &self.deps.threads,
                    &self.deps.reports,
                    &marker.flight,
                    reports,
                )
                .await;
                self.deps.workspaces.finish(&path, &marker).await?;
            }
            Ok(None) => {}
            // Carried into this turn's commit (see `Workspaces::begin`).
            Err(e) => {
                tracing::warn!(agent = %self.name, error = %e, "an earlier turn's changes stay uncommitted for now")
            }
        }
        Ok(recreated)
    }

    /// At the turn's start (recorded started, the harness not told yet): the agent's
    /// lock, and the marker.
    pub(super) async fn tree_begin(&mut self, d: &Dispatch) -> Result<(), RuntimeError> {
        if d.agent.spec.worktree.is_none() {
            return Ok(());
        }
        let path = self.deps.workspaces.path(&d.agent.spec).await?;
        let Some(record) = self.deps.workspaces.record(&path).await? else {
            return Err(WorkspaceError::NoWorktree {
                agent: self.name.clone(),
            }
            .into());
        };
        let lock = self
            .deps
            .workspaces
            .lock_turn(&self.name, Some(&d.flight.id))
            .await;
        self.deps
            .workspaces
            .begin(&path, &d.flight.id, &d.invocation.task)
            .await?;
        self.tree.turn = Some(TreeTurn {
            flight: d.flight.id.clone(),
            path,
            record,
            lock: Mutex::new(Some(lock)),
        });
        Ok(())
    }

    /// The turn is over: the agent's lock goes.
    pub(super) fn tree_over(&mut self) {
        self.tree.turn = None;
    }

    /// Commits the turn of `flight` as its end goes out (see [`Worker::report`]): a git
    /// lock held elsewhere is waited out up to [`COMMIT_PATIENCE`], with a note; past
    /// it the changes stay, for the next turn (or the next start), and a note says so.
    pub(super) async fn tree_commit(&self, flight: &str) {
        let Some(turn) = self.tree.turn.as_ref().filter(|t| t.flight == flight) else {
            return;
        };
        self.commit_turn(turn, flight).await;
        turn.lock.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    async fn commit_turn(&self, turn: &TreeTurn, flight: &str) {
        let began = tokio::time::Instant::now();
        let mut wait = Duration::from_millis(100);
        let mut noted = false;
        loop {
            match self.deps.workspaces.commit(&turn.path, &turn.record).await {
                Ok(Some(committed)) => {
                    let (state, marker) = (committed.state.clone(), committed.marker.clone());
                    let reports = commit_reports(&self.name, committed);
                    send_commit(&self.deps.threads, &self.deps.reports, flight, reports).await;
                    *self.tree.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(state);
                    if let Err(e) = self.deps.workspaces.finish(&turn.path, &marker).await {
                        tracing::warn!(agent = %self.name, error = %e, "cannot drop the turn's marker");
                    }
                    return;
                }
                // No marker (or no worktree) left to drop.
                Ok(None) => return,
                Err(WorkspaceError::Locked { stderr, .. }) if began.elapsed() < COMMIT_PATIENCE => {
                    if !noted {
                        noted = true;
                        self.note(flight, format!("cannot commit yet: {stderr}; retrying"))
                            .await;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        // The marker stays: the next start commits it.
                        _ = self.deps.shutdown.cancelled() => {
                            self.note(flight, "could not commit before the runtime stopped; the changes stay in the worktree and are committed at the next start".into()).await;
                            return;
                        }
                    }
                    wait = (wait * 2).min(COMMIT_RETRY_MAX);
                }
                Err(e) => {
                    self.note(flight, format!("could not commit: {e}; the changes stay in the worktree and are committed with the next turn (or at the next start)")).await;
                    return;
                }
            }
        }
    }

    async fn note(&self, flight: &str, text: String) {
        let _ = self
            .deps
            .reports
            .send(Report::Flight {
                flight: flight.to_string(),
                change: FlightChange::Note { text, by: None },
            })
            .await;
    }
}
