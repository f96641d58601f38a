//! The [`Runtime`]'s methods for agents' worktrees (see [`crate::workspace`]): made
//! before registration, their diff, what they hold uncommitted, orphans, the commits a
//! crash left to make, and the controls that change them (revert, removal).

use std::path::PathBuf;

use relay_protocol::domain::{Agent, FlightChange};
use relay_protocol::runtime::Report;

use crate::{worker, workspace, Runtime, RuntimeError};

impl Runtime {
    /// Makes agent `spec`'s worktree on this host (or finds the one made before), as
    /// [`Runtime::preflight`] checks the harness, before it is registered: a refusal
    /// ([`RuntimeError::Workspace`]) says what to do; so is an agent without
    /// [`AgentSpec::worktree`](relay_protocol::domain::AgentSpec::worktree).
    pub async fn prepare_worktree(
        &self,
        spec: &relay_protocol::domain::AgentSpec,
    ) -> Result<relay_protocol::domain::WorktreeState, RuntimeError> {
        if spec.worktree.is_none() {
            return Err(workspace::WorkspaceError::NoWorktree {
                agent: spec.name.clone(),
            }
            .into());
        }
        Ok(self.inner.workspaces.ensure(spec).await?.state)
    }

    /// Agent `agent`'s branch against its base (`git diff BASE...relay/NAME`), read on
    /// this host; an agent on another node is refused with where to look.
    pub async fn agent_diff(
        &self,
        agent: &Agent,
    ) -> Result<relay_protocol::api::AgentDiff, RuntimeError> {
        self.here(agent)?;
        let (worktree, diff) = self.inner.workspaces.diff(&agent.spec).await?;
        Ok(relay_protocol::api::AgentDiff {
            agent: agent.spec.name.clone(),
            worktree,
            files: diff.files,
            added: diff.added,
            removed: diff.removed,
            patch: diff.patch,
            patch_truncated: diff.truncated,
        })
    }

    /// The files agent `agent`'s worktree holds uncommitted (empty: clean, gone, or no
    /// worktree on this host).
    pub async fn worktree_dirty(&self, agent: &Agent) -> Result<Vec<String>, RuntimeError> {
        if agent.spec.worktree.is_none() || self.here(agent).is_err() {
            return Ok(Vec::new());
        }
        self.inner.workspaces.dirty(&agent.spec).await
    }

    /// The worktrees this runtime made that none of `agents` owns (its agent is gone, or
    /// has its worktree elsewhere now); with `fix`, each is removed (its uncommitted
    /// work committed on its branch first; the branch stays) and forgotten.
    pub async fn orphan_worktrees(
        &self,
        agents: &[Agent],
        fix: bool,
    ) -> Result<Vec<relay_protocol::api::OrphanWorktree>, RuntimeError> {
        let specs: Vec<_> = agents
            .iter()
            .filter(|a| a.spec.worktree.is_some())
            .map(|a| a.spec.clone())
            .collect();
        let paths = self.inner.workspaces.paths(&specs).await?;
        let owners: Vec<(String, PathBuf)> = specs.into_iter().map(|s| s.name).zip(paths).collect();
        self.inner.workspaces.orphans(&owners, fix).await
    }

    /// Commits what turns left uncommitted in the worktrees made here (a crash between
    /// a turn's end and its commit), once, and reports each commit on its flight. Call
    /// once after [`Runtime::start`] in a runtime that serves agents (not in `relay
    /// doctor`: the reports would have nobody to go to).
    /// The returned handle is for tests; callers need not wait.
    pub fn reconcile_worktrees(&self) -> tokio::task::JoinHandle<()> {
        let runtime = self.clone();
        self.inner.tasks.spawn(async move {
            let workspaces = &runtime.inner.workspaces;
            let recorded = match workspaces.recorded().await {
                Ok(r) => r,
                Err(e) => return tracing::warn!(error = %e, "cannot reconcile the worktrees"),
            };
            for (path, record) in recorded {
                let agent = record.agent.clone();
                // Under the agent's lock from the commit to the marker's removal: its
                // worker, starting a turn meanwhile (a flight dispatched again at the
                // start), writes its own marker only after this one is gone, and this
                // one never removes that.
                let _lock = workspaces.lock_turn(&agent, None).await;
                let committed = match workspaces.commit(&path, &record).await {
                    Ok(Some(c)) => c,
                    Ok(None) => continue,
                    Err(e) => {
                        tracing::warn!(%agent, path = %path.display(), error = %e, "cannot commit a turn left uncommitted");
                        continue;
                    }
                };
                let marker = committed.marker.clone();
                // Reported before the marker goes: a crash in between commits nothing
                // twice (the commit is found) and loses no report.
                let reports = worker::commit_reports(&agent, committed);
                match runtime.reports() {
                    Ok(to) => {
                        worker::send_commit(&runtime.inner.threads, &to, &marker.flight, reports)
                            .await
                    }
                    Err(_) => return,
                }
                if let Err(e) = workspaces.finish(&path, &marker).await {
                    tracing::warn!(%agent, error = %e, "cannot drop the turn's marker");
                }
            }
        })
    }

    /// Refuses an agent this runtime does not serve (it runs on another node).
    fn here(&self, agent: &Agent) -> Result<(), RuntimeError> {
        match &agent.spec.node {
            Some(node) if Some(node.as_str()) != self.node() => {
                Err(workspace::WorkspaceError::OnNode {
                    agent: agent.spec.name.clone(),
                    node: node.clone(),
                }
                .into())
            }
            _ => Ok(()),
        }
    }

    /// Reverts a flight's changes on its agent's branch, between turns (refused while a
    /// turn runs), and reports it: [`FlightChange::Reverted`] on the flight, the branch's
    /// new state on the agent. Needs no live session.
    pub(crate) async fn revert(
        &self,
        agent: &str,
        flight: &str,
        commit: &relay_protocol::domain::FlightCommit,
        by: &str,
    ) -> Result<(), RuntimeError> {
        let (revert, state) = self
            .inner
            .workspaces
            .revert(agent, flight, commit, by)
            .await?;
        self.report(Report::Flight {
            flight: flight.to_string(),
            change: FlightChange::Reverted { revert },
        })
        .await;
        self.report(worker::worktree_report(agent, state)).await;
        Ok(())
    }

    /// Removes a removed agent's worktree; its branch stays. Uncommitted work keeps it
    /// unless `force` (then it is committed on the branch first).
    pub(crate) async fn remove_worktree(
        &self,
        agent: &str,
        force: bool,
    ) -> Result<(), RuntimeError> {
        match self.inner.workspaces.remove(agent, force).await {
            Ok(made) => {
                if let Some(commit) = made {
                    tracing::info!(%agent, %commit, "the removed agent's leftovers committed");
                }
                Ok(())
            }
            Err(RuntimeError::Workspace(e @ workspace::WorkspaceError::Dirty { .. })) => {
                tracing::warn!(%agent, error = %e, "worktree kept (`relay doctor` lists it)");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}
