//! [`Workspaces`]: the async face of the git work (which runs on the blocking pool),
//! the registry of the worktrees this runtime made, and the per-agent lock: a turn
//! holds it from its marker to its commit, so a revert, a removal or a reconcile never
//! changes a worktree under a turn (a revert asked meanwhile is refused, saying which
//! flight runs).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use relay_protocol::api::OrphanWorktree;
use relay_protocol::domain::{AgentSpec, FlightCommit, Revert, WorktreeState};
use tokio::sync::OwnedMutexGuard;

use super::commit::{self, Marker};
use super::{blocking, make, remove, revert, worktree_path, WorkspaceError};
use crate::threads::{ThreadStore, WorktreeRecord};
use crate::RuntimeError;

/// The worktrees of a runtime. Clone freely.
#[derive(Clone)]
pub struct Workspaces {
    store: ThreadStore,
    data_dir: PathBuf,
    locks: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
    /// The flight whose turn holds each agent's lock.
    busy: Arc<Mutex<HashMap<String, String>>>,
}

/// An agent's worktree, made or found ([`Workspaces::ensure`]).
#[derive(Debug, Clone)]
pub struct Ensured {
    pub path: PathBuf,
    pub record: WorktreeRecord,
    pub state: WorktreeState,
    /// It was gone and was made again from its branch.
    pub recreated: bool,
}

/// A commit made (or found made) for the flight a marker named.
#[derive(Debug, Clone)]
pub struct Committed {
    pub marker: Marker,
    /// `None`: nothing changed.
    pub commit: Option<FlightCommit>,
    pub state: WorktreeState,
}

/// An agent's lock, held by its turn from the marker to the commit.
pub struct TurnLock {
    _guard: OwnedMutexGuard<()>,
    agent: String,
    busy: Arc<Mutex<HashMap<String, String>>>,
}

impl Drop for TurnLock {
    fn drop(&mut self) {
        if let Ok(mut busy) = self.busy.lock() {
            busy.remove(&self.agent);
        }
    }
}

impl Workspaces {
    pub fn new(store: ThreadStore, data_dir: PathBuf) -> Workspaces {
        Workspaces {
            store,
            data_dir,
            locks: Arc::default(),
            busy: Arc::default(),
        }
    }

    /// Where agent `spec`'s worktree is (or will be) on this host (found on the blocking
    /// pool: it looks at the file system).
    pub async fn path(&self, spec: &AgentSpec) -> Result<PathBuf, WorkspaceError> {
        Ok(self.paths(std::slice::from_ref(spec)).await?.remove(0))
    }

    /// [`Workspaces::path`] of each of `specs`, in order.
    pub async fn paths(&self, specs: &[AgentSpec]) -> Result<Vec<PathBuf>, WorkspaceError> {
        let (specs, data_dir) = (specs.to_vec(), self.data_dir.clone());
        blocking(move || Ok(specs.iter().map(|s| worktree_path(s, &data_dir)).collect())).await
    }

    /// [`Workspaces::path`], when it is a directory (the worktree made).
    pub async fn existing(&self, spec: &AgentSpec) -> Result<Option<PathBuf>, WorkspaceError> {
        let (spec, data_dir) = (spec.clone(), self.data_dir.clone());
        blocking(move || {
            let path = worktree_path(&spec, &data_dir);
            Ok(path.is_dir().then_some(path))
        })
        .await
    }

    fn lock_of(&self, agent: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self
            .locks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        locks.entry(agent.to_string()).or_default().clone()
    }

    /// Takes agent `agent`'s lock for the turn of `flight` (waiting for a revert or a
    /// reconcile to finish).
    pub async fn lock_turn(&self, agent: &str, flight: Option<&str>) -> TurnLock {
        let guard = self.lock_of(agent).lock_owned().await;
        if let (Some(flight), Ok(mut busy)) = (flight, self.busy.lock()) {
            busy.insert(agent.to_string(), flight.to_string());
        }
        TurnLock {
            _guard: guard,
            agent: agent.to_string(),
            busy: self.busy.clone(),
        }
    }

    /// The registry's record of the worktree at `path`.
    pub async fn record(&self, path: &Path) -> Result<Option<WorktreeRecord>, RuntimeError> {
        let key = path.display().to_string();
        Ok(self
            .store
            .worktrees()
            .await?
            .into_iter()
            .find(|(p, _)| *p == key)
            .map(|(_, r)| r))
    }

    /// The worktree recorded for agent `agent`: the live one, else the newest.
    pub async fn of_agent(
        &self,
        agent: &str,
    ) -> Result<Option<(PathBuf, WorktreeRecord)>, RuntimeError> {
        let mine: Vec<(PathBuf, WorktreeRecord)> = self
            .store
            .worktrees()
            .await?
            .into_iter()
            .filter(|(_, r)| r.agent == agent)
            .map(|(p, r)| (PathBuf::from(p), r))
            .collect();
        Ok(blocking(move || {
            let mut mine = mine;
            mine.sort_by_key(|(p, r)| (p.exists(), r.created_at));
            Ok(mine.pop())
        })
        .await?)
    }

    /// Makes agent `spec`'s worktree, or finds it, or makes it again from its branch
    /// when it was deleted or moved by hand. A refusal says what to do.
    pub async fn ensure(&self, spec: &AgentSpec) -> Result<Ensured, RuntimeError> {
        let path = self.path(spec).await?;
        let known = self.record(&path).await?;
        // A branch of ours with no record here is taken up again (an agent removed and
        // registered again under its name), not counted as a recreation.
        let adopted = known.is_none();
        let (plan, mut record) = {
            let (spec, path) = (spec.clone(), path.clone());
            blocking(move || make::plan(&spec, &path, known.as_ref())).await?
        };
        let key = path.display().to_string();
        match plan {
            // Live, and not in the registry (its database lost): recorded again.
            make::Plan::Ready if adopted => self.store.put_worktree(&key, &record).await?,
            make::Plan::Ready => {}
            make::Plan::Recreate => {
                if !adopted {
                    record.recreated += 1;
                }
                self.store.put_worktree(&key, &record).await?;
                let (p, r) = (path.clone(), record.clone());
                blocking(move || make::recreate(&p, &r)).await?;
            }
            make::Plan::Create => {
                // Recorded before it is made: a crash leaves an entry `relay doctor` finds.
                self.store.put_worktree(&key, &record).await?;
                let copy = spec
                    .worktree
                    .as_ref()
                    .map(|w| w.copy.clone())
                    .unwrap_or_default();
                let (p, r) = (path.clone(), record.clone());
                record.copied = blocking(move || make::create(&p, &r, &copy)).await?;
                if !record.copied.is_empty() {
                    self.store.put_worktree(&key, &record).await?;
                }
            }
        }
        let (p, r) = (path.clone(), record.clone());
        let state = blocking(move || make::state(&p, &r)).await?;
        Ok(Ensured {
            path,
            record,
            state,
            recreated: plan == make::Plan::Recreate && !adopted,
        })
    }

    /// Writes the marker of flight `flight` (task `task`) before its turn. A marker
    /// still there (a commit that could not be made) is carried: its flights become
    /// this one's pending ones, from its start.
    pub async fn begin(
        &self,
        path: &Path,
        flight: &str,
        task: &str,
    ) -> Result<Marker, RuntimeError> {
        let (path, flight, task) = (path.to_path_buf(), flight.to_string(), task.to_string());
        Ok(blocking(move || {
            let mut marker = Marker::new(&flight, &task, commit::head(&path)?);
            if let Some(old) = commit::read_marker(&path)? {
                if old.flight != flight {
                    marker.start = old.start;
                    marker.pending = old.pending;
                    marker.pending.push(old.flight);
                }
            }
            commit::write_marker(&path, &marker)?;
            Ok(marker)
        })
        .await?)
    }

    /// One try at committing what the marker in the worktree at `path` names; `None`
    /// when there is no marker. The marker stays (see [`Workspaces::finish`]).
    pub async fn commit(
        &self,
        path: &Path,
        record: &WorktreeRecord,
    ) -> Result<Option<Committed>, WorkspaceError> {
        let (path, record) = (path.to_path_buf(), record.clone());
        blocking(move || {
            if !make::is_live(Path::new(&record.repo), &path)? {
                return Ok(None);
            }
            let Some(marker) = commit::read_marker(&path)? else {
                return Ok(None);
            };
            let commit = commit::commit(&path, &marker, &record)?;
            let state = make::state(&path, &record)?;
            Ok(Some(Committed {
                marker,
                commit,
                state,
            }))
        })
        .await
    }

    /// Drops the marker `marker` once its commit is reported; a marker written since
    /// (the next turn's, when this commit was made by someone else meanwhile) stays.
    pub async fn finish(&self, path: &Path, marker: &Marker) -> Result<(), WorkspaceError> {
        let (path, marker) = (path.to_path_buf(), marker.clone());
        blocking(move || match commit::read_marker(&path) {
            Ok(Some(there)) if there == marker => commit::clear_marker(&path),
            Ok(_) => Ok(()),
            // Unreadable: it is not the marker committed; left for a person.
            Err(e) => Err(e),
        })
        .await
    }

    /// The worktrees recorded here: (path, record).
    pub async fn recorded(&self) -> Result<Vec<(PathBuf, WorktreeRecord)>, RuntimeError> {
        Ok(self
            .store
            .worktrees()
            .await?
            .into_iter()
            .map(|(p, r)| (PathBuf::from(p), r))
            .collect())
    }

    /// Reverts flight `flight`'s changes on agent `agent`'s branch; refused while a
    /// turn runs on it.
    pub async fn revert(
        &self,
        agent: &str,
        flight: &str,
        commit: &FlightCommit,
        by: &str,
    ) -> Result<(Revert, WorktreeState), RuntimeError> {
        let lock = self.lock_of(agent);
        let Ok(_guard) = lock.try_lock_owned() else {
            let running = self
                .busy
                .lock()
                .ok()
                .and_then(|b| b.get(agent).cloned())
                .unwrap_or_else(|| "(starting)".into());
            return Err(WorkspaceError::Running {
                agent: agent.to_string(),
                flight: running,
            }
            .into());
        };
        let Some((path, record)) = self.of_agent(agent).await? else {
            return Err(WorkspaceError::NoWorktree {
                agent: agent.to_string(),
            }
            .into());
        };
        let (flight, commit, by) = (flight.to_string(), commit.clone(), by.to_string());
        Ok(blocking(move || {
            if !make::is_live(Path::new(&record.repo), &path)? {
                make::recreate(&path, &record)?;
            }
            let revert = revert::revert(&path, &record, &flight, &commit, &by)?;
            Ok((revert, make::state(&path, &record)?))
        })
        .await?)
    }

    /// Removes agent `agent`'s worktree (see [`Control::AgentRemoved`]); the commit of
    /// its leftovers (forced), if any. Uncommitted work without `force` keeps it (the
    /// broker refused earlier; `relay doctor` finds it).
    ///
    /// [`Control::AgentRemoved`]: relay_protocol::runtime::Control::AgentRemoved
    pub async fn remove(&self, agent: &str, force: bool) -> Result<Option<String>, RuntimeError> {
        let _lock = self.lock_turn(agent, None).await;
        let Some((path, record)) = self.of_agent(agent).await? else {
            return Ok(None);
        };
        let why = format!("work left in the worktree when agent {agent} was removed");
        let (p, r) = (path.clone(), record.clone());
        let made = blocking(move || remove::remove(&p, &r, force, &why)).await?;
        self.store
            .forget_worktree(&path.display().to_string())
            .await?;
        Ok(made)
    }

    /// The files agent `spec`'s worktree holds uncommitted (none when it has none here).
    pub async fn dirty(&self, spec: &AgentSpec) -> Result<Vec<String>, RuntimeError> {
        let path = self.path(spec).await?;
        let Some(record) = self.record(&path).await? else {
            return Ok(Vec::new());
        };
        Ok(blocking(move || remove::dirty(&path, &record)).await?)
    }

    /// Agent `spec`'s branch against its base.
    pub async fn diff(
        &self,
        spec: &AgentSpec,
    ) -> Result<(WorktreeState, remove::Diff), RuntimeError> {
        let path = self.path(spec).await?;
        let Some(record) = self.record(&path).await? else {
            return Err(WorkspaceError::NoWorktree {
                agent: spec.name.clone(),
            }
            .into());
        };
        Ok(blocking(move || Ok((make::state(&path, &record)?, remove::diff(&record)?))).await?)
    }

    /// The recorded worktrees no agent of `agents` (name, its worktree's path here)
    /// owns; with `fix`, each is removed (its leftovers committed on its branch first)
    /// and its record dropped.
    pub async fn orphans(
        &self,
        agents: &[(String, PathBuf)],
        fix: bool,
    ) -> Result<Vec<OrphanWorktree>, RuntimeError> {
        let mut out = Vec::new();
        for (path, record) in self.store.worktrees().await? {
            let owner = agents.iter().find(|(name, _)| *name == record.agent);
            let why = match owner {
                None => format!("agent {} is not registered", record.agent),
                Some((_, theirs)) if theirs.display().to_string() != path => format!(
                    "agent {} now has its worktree at {}",
                    record.agent,
                    theirs.display()
                ),
                Some(_) => continue,
            };
            let mut orphan = OrphanWorktree {
                path: path.clone(),
                repo: record.repo.clone(),
                branch: record.branch.clone(),
                agent: record.agent.clone(),
                why,
                fixed: None,
            };
            if fix {
                let note = format!(
                    "work left in the orphaned worktree of agent {}",
                    record.agent
                );
                let (p, r) = (PathBuf::from(&path), record.clone());
                let made = blocking(move || remove::remove(&p, &r, true, &note)).await?;
                self.store.forget_worktree(&path).await?;
                orphan.fixed = Some(match made {
                    Some(c) => format!(
                        "removed; its uncommitted work is commit {} on {} (kept)",
                        relay_protocol::domain::short(&c),
                        record.branch
                    ),
                    None => format!("removed; branch {} kept", record.branch),
                });
            }
            out.push(orphan);
        }
        Ok(out)
    }
}
