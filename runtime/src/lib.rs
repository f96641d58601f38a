//! The harness-session plane: one persistent session per agent. This crate is only that:
//! the process-wide storage thread and retry policy it uses live below it, in
//! `relay_infra`.
//!
//! - [`Runtime`] is a cheap handle. [`Runtime::dispatch`] queues a flight on its agent's
//!   worker; [`Runtime::control`] steers, interrupts or answers an approval;
//!   [`Runtime::preflight`] checks an agent on this host before it is registered
//!   (through its launcher: its directory, program and credentials); [`Runtime::peek`]
//!   shows what an agent's screen (a tmux pane) shows, through its launcher too.
//! - A turn is watched: past its deadline, after [`RuntimeConfig::turn_idle_timeout`]
//!   without any harness event, or after [`RuntimeConfig::turn_stall_timeout`] without
//!   progress since the harness's first retry (a model it cannot reach), it is
//!   interrupted and its flight failed with the reason.
//! - Each agent has one worker task. It owns the agent's turn queue (turns of one agent
//!   run one at a time; different agents run in parallel), the harness session (spawned
//!   on demand, or at start for `keep_warm`), and the turn in progress. It drives the
//!   harness only through the seam of `relay_harnesses` (a [`Harnesses`] registry keyed
//!   by the agent's harness; [`Runtime::start_with`] takes another, as the tests do), so
//!   a new agent CLI is a new launcher there, not a change here.
//! - [`threads::ThreadStore`] keeps each agent's harness thread id in sled, written
//!   through the process's storage thread ([`relay_infra::storage`]). A session
//!   resumes that thread; only when the harness says it is gone does it start a new one,
//!   and it reports the loss ([`Report::ThreadLost`]) instead of hiding it.
//! - Everything the harness streams becomes a [`Report`] on one ordered channel, as it
//!   arrives; the broker turns reports into flight updates.
//! - An agent with a worktree ([`workspace`]) runs in a git worktree of its repository
//!   on branch `relay/NAME`, made by the runtime that serves it (on its host, lazily at
//!   its first session, or by [`Runtime::prepare_worktree`] at registration); each of its
//!   flights' changes is committed when the turn ends, naming the flight.
//! - [`RuntimeError`]: the crate's one error type; the broker maps it to wire codes.
//!
//! Depends on: relay-harnesses, relay-infra, relay-protocol.
//!
//! Never on the broker (the broker depends on it). Nothing here names a particular
//! harness: `worker` reaches the harnesses through `relay_harnesses::seam` only.
//!
//! Layering, one way ([`Runtime`], in the crate root, on `worker`; a module uses only the
//! modules after its arrow; `tests/tests/module_graph/` checks it):
//! - `worktrees` -> `worker`, `workspace`
//! - `worker` -> `workspace`, `threads`
//! - `workspace` -> `threads`
//! - `threads` -> none

pub mod threads;
mod worker;
pub mod workspace;
mod worktrees;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use relay_harnesses::Harnesses;
use relay_infra::storage;
use relay_protocol::domain::{Agent, FlightChange, FlightState, Harness, SharedStr};
use relay_protocol::runtime::{Control, Dispatch, Report};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use relay_harnesses::{AccessIssuer, RelayAccess};
pub use threads::{DispatchState, ThreadStore};

/// Turns queued per agent before new dispatches are refused.
pub const AGENT_QUEUE_CAPACITY: usize = 256;
/// Reports buffered towards the broker; a full buffer slows the harness down.
pub const REPORT_BUFFER: usize = 4096;

/// Why the runtime refused or failed a call. The broker maps these to wire codes in one
/// place (`runtime_error` in its plane): [`Overloaded`](Self::Overloaded),
/// [`TooLarge`](Self::TooLarge) and [`ShuttingDown`](Self::ShuttingDown) have codes of
/// their own; everything else is answered `unavailable` with its text.
///
/// Retryable: `Overloaded` (after a while), and a control refused with `NotRunning` or
/// `TurnEnded` once the flight is the running turn (or never, if it ended). The others
/// are answers: the same call gets the same error.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("agent {0:?} has {AGENT_QUEUE_CAPACITY} turns queued already")]
    Overloaded(String),
    /// A control named a flight that is not the turn running on its agent.
    #[error("flight {flight} is not the turn running on agent {agent:?}")]
    NotRunning { flight: String, agent: String },
    /// No worker of this runtime serves the agent.
    #[error("agent {agent:?} has no live session in this runtime")]
    NoSession { agent: String },
    /// The agent's harness cannot do what a control asks (see
    /// [`relay_harnesses::Capabilities`]); it was not asked.
    #[error("harness {harness} cannot {what}")]
    Unsupported {
        harness: Harness,
        what: &'static str,
    },
    /// The turn ended before the harness took the control.
    #[error("the turn of flight {flight} ended before {harness} took this")]
    TurnEnded {
        flight: String,
        /// How messages name the harness ("codex").
        harness: &'static str,
    },
    /// A lock of the runtime's state was poisoned by a panic.
    #[error("runtime state lock poisoned")]
    Poisoned,
    /// A steer would grow a queued flight's task over the limit it came with.
    #[error("flight {flight}: its task would be {size} bytes with this steer, over the limit of {limit} bytes")]
    TooLarge {
        flight: String,
        size: usize,
        limit: usize,
    },
    #[error("the runtime is shutting down")]
    ShuttingDown,
    #[error("harness: {0}")]
    Harness(#[from] relay_harnesses::HarnessError),
    #[error("storage: {0}")]
    Storage(#[from] sled::Error),
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    #[error("storage: {0}")]
    StorageThread(#[from] storage::StorageError),
    /// The file of a turn's end report too long for a record could not be written or read.
    #[error("the report kept in {path}: {source}")]
    ReportFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The answer of a turn's end report, kept in the broker's text files
    /// ([`TextStore`]), could not be read back.
    #[error("the answer kept in the broker's text file {reference}: {reason}")]
    ReportText { reference: String, reason: String },
    /// An agent's worktree could not be made, committed, reverted or removed.
    #[error(transparent)]
    Workspace(#[from] workspace::WorkspaceError),
}

#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Where the runtime keeps its sled database (thread ids), unless `shared_db`.
    pub data_dir: PathBuf,
    /// Keep the runtime's records in this database instead (the broker's, when the
    /// runtime is embedded in `relay up`): one flush makes both durable.
    pub shared_db: Option<storage::Durable>,
    /// This runtime's node name; `None` for the broker's embedded runtime.
    pub node: Option<String>,
    /// A running turn without a harness event for this long is interrupted and failed
    /// (`None`: never). Waiting for an approval does not count.
    pub turn_idle_timeout: Option<std::time::Duration>,
    /// A running turn whose harness retries its model (`HarnessEvent::Retrying`: Codex's
    /// "Reconnecting... waiting for network"; a plain warning does not count) and then
    /// made no progress (no
    /// text, item, command output, approval request or other event than more notes)
    /// for this long, counted from that first note, is interrupted and failed with the
    /// latest note as its cause (`None`: never; the idle watchdog still applies).
    pub turn_stall_timeout: Option<std::time::Duration>,
    /// A running turn its harness has sent nothing of for this long (not waiting for a
    /// person) gets a note saying so, with how to stop it, and again every minute while
    /// it stays quiet (`None`: never; [`DEFAULT_TURN_QUIET_NOTE`] in `relay up` and
    /// `relay node`). Turns that end by a reply (a tmux pane) get none.
    pub turn_quiet_note: Option<std::time::Duration>,
    /// How each agent's session reaches Relay (its scoped token, the broker's URL);
    /// `None`: sessions run without it.
    pub access: Option<relay_harnesses::AccessIssuer>,
    /// Where a long answer ([`relay_protocol::domain::shared::LONG_TEXT`] or more) is
    /// written before it is reported: the broker's text files, for its embedded runtime
    /// (`None`: reported as it is, as a node's runtime does).
    pub texts: Option<TextSink>,
}

/// Where a flight's long texts are written durably before they are reported (the
/// broker's text files, `store::log::texts`): the reports that carry that very buffer
/// are then stored with a reference to it, and so is the runtime's record of a turn's
/// end ([`ThreadStore::set_dispatch_ended`]). All blocking.
pub trait TextStore: Send + Sync {
    /// Writes `text` of `flight`, synced; the error says why not.
    fn write(&self, flight: &str, text: &SharedStr) -> Result<(), String>;
    /// A reference to the file this very buffer was written to (not an equal text), if
    /// it was and is still known.
    fn written(&self, text: &SharedStr) -> Option<String>;
    /// The text a reference from [`TextStore::written`] names, checked.
    fn read(&self, reference: &str) -> Result<SharedStr, String>;
}

/// A [`TextStore`] to hand around.
#[derive(Clone)]
pub struct TextSink(Arc<dyn TextStore>);

impl TextSink {
    pub fn new(store: impl TextStore + 'static) -> TextSink {
        TextSink(Arc::new(store))
    }
}

impl std::ops::Deref for TextSink {
    type Target = dyn TextStore;
    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl std::fmt::Debug for TextSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TextSink")
    }
}

impl RuntimeConfig {
    /// A runtime keeping its own database in `data_dir`, on no node, with no watchdogs
    /// and no access to Relay: set the fields a caller needs.
    pub fn new(data_dir: impl Into<PathBuf>) -> RuntimeConfig {
        RuntimeConfig {
            data_dir: data_dir.into(),
            shared_db: None,
            node: None,
            turn_idle_timeout: None,
            turn_stall_timeout: None,
            turn_quiet_note: None,
            access: None,
            texts: None,
        }
    }
}

/// The default of [`RuntimeConfig::turn_idle_timeout`].
pub const DEFAULT_TURN_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// The default of [`RuntimeConfig::turn_quiet_note`].
pub const DEFAULT_TURN_QUIET_NOTE: std::time::Duration = std::time::Duration::from_secs(30);

/// The default of [`RuntimeConfig::turn_stall_timeout`].
pub const DEFAULT_TURN_STALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Flights interrupted before their turn started are remembered, up to this many, so
/// that their dispatch is dropped whenever it comes (or the turn is not started).
const CANCELLED_MEMORY: usize = 4096;

/// The flights interrupted before their turn started, newest last. Shared by the runtime
/// and its workers. Its lock is taken before a queue's: a dispatch is checked against it
/// and queued (or an interrupt recorded and the flight taken out of the queue) in one
/// step, so the two never cross.
#[derive(Default)]
pub(crate) struct Cancelled(Mutex<VecDeque<String>>);

impl Cancelled {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<String>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn contains(&self, flight: &str) -> bool {
        self.lock().iter().any(|f| f == flight)
    }
}

fn remember(cancelled: &mut VecDeque<String>, flight: &str) {
    if !cancelled.iter().any(|f| f == flight) {
        if cancelled.len() == CANCELLED_MEMORY {
            cancelled.pop_front();
        }
        cancelled.push_back(flight.to_string());
    }
}

/// The report of a flight interrupted before its turn started.
pub(crate) fn cancelled_report(flight: String) -> Report {
    Report::Flight {
        flight,
        change: FlightChange::State {
            to: FlightState::Cancelled,
            reason: Some("interrupted before its turn started".into()),
            output: None,
        },
    }
}

/// A handle to the runtime. Clone freely.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

struct Inner {
    workers: Mutex<HashMap<String, worker::Handle>>,
    /// Taken by [`Runtime::stopped`], so the report channel closes once workers end.
    reports: Mutex<Option<mpsc::Sender<Report>>>,
    threads: ThreadStore,
    harnesses: Arc<Harnesses>,
    config: RuntimeConfig,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    cancelled: Arc<Cancelled>,
    workspaces: workspace::Workspaces,
    /// Checks of agents before registration running at once ([`Runtime::preflight`]):
    /// each may start a process, so a burst of registrations waits its turn.
    checks: tokio::sync::Semaphore,
}

/// At most this many agent checks ([`Runtime::preflight`]) run at once.
pub const CONCURRENT_CHECKS: usize = 4;

impl Runtime {
    /// Starts the runtime with the harnesses this build has
    /// ([`Harnesses::builtin`]). Reports arrive on the returned receiver, in order per
    /// agent.
    pub fn start(
        config: RuntimeConfig,
        shutdown: CancellationToken,
    ) -> Result<(Runtime, mpsc::Receiver<Report>), RuntimeError> {
        Runtime::start_with(config, Harnesses::builtin(), shutdown)
    }

    /// [`Runtime::start`] driving agents through `harnesses` (the tests' scripted one).
    pub fn start_with(
        config: RuntimeConfig,
        harnesses: Harnesses,
        shutdown: CancellationToken,
    ) -> Result<(Runtime, mpsc::Receiver<Report>), RuntimeError> {
        std::fs::create_dir_all(&config.data_dir).map_err(sled::Error::Io)?;
        let own = config.data_dir.join("runtime");
        let threads = match &config.shared_db {
            Some(db) => ThreadStore::within(db, Some(&own))?,
            None => ThreadStore::open(&own)?,
        }
        .with_texts(config.texts.clone());
        let (reports, rx) = mpsc::channel(REPORT_BUFFER);
        let workspaces = workspace::Workspaces::new(threads.clone(), config.data_dir.clone());
        Ok((
            Runtime {
                inner: Arc::new(Inner {
                    workers: Mutex::new(HashMap::new()),
                    reports: Mutex::new(Some(reports)),
                    threads,
                    workspaces,
                    harnesses: Arc::new(harnesses),
                    config,
                    shutdown,
                    tasks: TaskTracker::new(),
                    cancelled: Arc::default(),
                    checks: tokio::sync::Semaphore::new(CONCURRENT_CHECKS),
                }),
            },
            rx,
        ))
    }

    pub fn node(&self) -> Option<&str> {
        self.inner.config.node.as_deref()
    }

    /// Checks on this host, through its harness's launcher, what would make the agent's
    /// sessions fail (its directory, its program, its credentials; see
    /// [`relay_harnesses::preflight`]), before it is registered: an error refuses it,
    /// the warnings do not. At most [`CONCURRENT_CHECKS`] run at once; the others wait.
    pub async fn preflight(
        &self,
        spec: &relay_protocol::domain::AgentSpec,
    ) -> Result<relay_harnesses::Preflight, relay_harnesses::HarnessError> {
        let launcher = self.inner.harnesses.get(spec.harness)?;
        let _permit = self.inner.checks.acquire().await;
        // An agent with a worktree runs there: checked there once it exists (before,
        // the repository it is made from stands in for it).
        if spec.worktree.is_some() {
            // A failure to look is no reason to refuse: the repository stands in.
            if let Ok(Some(path)) = self.inner.workspaces.existing(spec).await {
                let mut there = spec.clone();
                there.cwd = path.display().to_string();
                return launcher.preflight(&there).await;
            }
        }
        launcher.preflight(spec).await
    }

    /// Whether the agents of `harness` have a screen [`Runtime::peek`] can show (a tmux
    /// pane), as its launcher here says.
    pub fn has_screen(&self, harness: Harness) -> bool {
        self.inner
            .harnesses
            .get(harness)
            .is_ok_and(|launcher| launcher.info().screen)
    }

    /// The last `lines` lines `agent`'s screen shows now (`relay agent peek`), read on
    /// this host through its harness's launcher; the agent as the broker knows it (its
    /// endpoint names the pane). Refused ([`RuntimeError::Unsupported`]) for a harness
    /// without a screen.
    pub async fn peek(
        &self,
        agent: &Agent,
        lines: usize,
    ) -> Result<relay_harnesses::Screen, RuntimeError> {
        let harness = agent.spec.harness;
        let launcher = self.inner.harnesses.get(harness)?;
        if !launcher.info().screen {
            return Err(RuntimeError::Unsupported {
                harness,
                what: "show a screen",
            });
        }
        Ok(launcher.peek(agent, lines).await?)
    }

    pub fn threads(&self) -> &ThreadStore {
        &self.inner.threads
    }

    /// Queues a flight on its agent's worker. A full queue fails the flight at once
    /// (reported), rather than blocking the caller. A flight interrupted before it came
    /// is not queued: it is reported cancelled (again), which also settles it on a node.
    pub async fn dispatch(&self, dispatch: Dispatch) -> Result<(), RuntimeError> {
        let name = dispatch.agent.spec.name.clone();
        let flight = dispatch.flight.id.clone();
        let handle = self.worker(&dispatch.agent)?;
        let queued = {
            let cancelled = self.inner.cancelled.lock();
            if cancelled.iter().any(|f| *f == flight) {
                None
            } else {
                Some(handle.dispatch(dispatch))
            }
        };
        let Some(queued) = queued else {
            tracing::info!(%flight, "dispatch of an interrupted flight dropped");
            self.report(cancelled_report(flight)).await;
            return Ok(());
        };
        if let Err(e) = queued {
            self.report(Report::Flight {
                flight,
                change: FlightChange::State {
                    to: FlightState::Failed,
                    reason: Some(e.to_string()),
                    output: None,
                },
            })
            .await;
            return Err(e);
        }
        tracing::debug!(agent = %name, "dispatched");
        Ok(())
    }

    /// Starts the session of a `keep_warm` agent now instead of at its first turn.
    pub fn warm(&self, agent: &Agent) -> Result<(), RuntimeError> {
        self.worker(agent)?.warm(agent.clone())
    }

    /// Steers, interrupts or answers an approval of a live turn; returns when the harness
    /// has taken it. A flight still queued is cancelled (interrupt) or has the text
    /// added to its task (steer) at once; an interrupted flight whose dispatch has not
    /// come yet is dropped when it does.
    pub async fn control(&self, control: Control) -> Result<(), RuntimeError> {
        let handle = {
            let workers = self.inner.workers.lock().map_err(|_| poisoned())?;
            workers.get(control.agent()).cloned()
        };
        match &control {
            Control::Interrupt { flight, .. } => {
                let removed = {
                    let mut cancelled = self.inner.cancelled.lock();
                    remember(&mut cancelled, flight);
                    handle.as_ref().and_then(|h| h.queue.remove(flight))
                };
                if let Some(d) = removed {
                    self.report(cancelled_report(d.flight.id)).await;
                    return Ok(());
                }
                if handle.is_none() {
                    // Nothing runs it here: it is dropped when its dispatch comes.
                    return Ok(());
                }
            }
            Control::Steer {
                flight,
                text,
                max_task_bytes,
                by,
                ..
            } => {
                let queued = match &handle {
                    Some(h) => h.queue.steer(flight, text, *max_task_bytes)?,
                    None => false,
                };
                if queued {
                    self.report(Report::Flight {
                        flight: flight.clone(),
                        change: FlightChange::Note {
                            text: format!("steered while queued (added to the task): {text}"),
                            by: by.clone(),
                        },
                    })
                    .await;
                    return Ok(());
                }
            }
            Control::Revert {
                agent,
                flight,
                commit,
                by,
            } => return self.revert(agent, flight, commit, by).await,
            Control::AgentRemoved { agent, .. } => {
                // Its thread goes too, live session or not: a new agent of the same
                // name starts afresh.
                if let Err(e) = self.inner.threads.forget(agent).await {
                    tracing::warn!(%agent, error = %e, "cannot forget the thread");
                }
                if let Ok(mut w) = self.inner.workers.lock() {
                    w.remove(agent);
                }
            }
            Control::Wake { spec } => return self.warm(spec),
            Control::Approval { .. } | Control::Reply { .. } => {}
        }
        if let Control::AgentRemoved { agent, force } = &control {
            // The worker ends first (its turn interrupted and committed, its session
            // stopped: it answers only then), then the worktree goes.
            if let Some(handle) = handle {
                let (tx, rx) = oneshot::channel();
                if handle.control(control.clone(), tx).is_ok() {
                    let _ = rx.await;
                }
            }
            return self.remove_worktree(agent, *force).await;
        }
        let Some(handle) = handle else {
            return Err(RuntimeError::NoSession {
                agent: control.agent().to_string(),
            });
        };
        let (tx, rx) = oneshot::channel();
        handle.control(control, tx)?;
        rx.await.map_err(|_| RuntimeError::ShuttingDown)?
    }

    /// Waits until every worker has stopped and its child process is gone. Call after
    /// firing the shutdown token.
    pub async fn stopped(&self) {
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
        if let Ok(mut r) = self.inner.reports.lock() {
            r.take();
        }
        if let Ok(mut w) = self.inner.workers.lock() {
            w.clear();
        }
    }

    fn reports(&self) -> Result<mpsc::Sender<Report>, RuntimeError> {
        self.inner
            .reports
            .lock()
            .map_err(|_| poisoned())?
            .clone()
            .ok_or(RuntimeError::ShuttingDown)
    }

    fn worker(&self, agent: &Agent) -> Result<worker::Handle, RuntimeError> {
        if self.inner.shutdown.is_cancelled() {
            return Err(RuntimeError::ShuttingDown);
        }
        let mut workers = self.inner.workers.lock().map_err(|_| poisoned())?;
        if let Some(h) = workers.get(&agent.spec.name) {
            if !h.is_closed() {
                return Ok(h.clone());
            }
        }
        let handle = worker::spawn(
            agent.spec.name.clone(),
            worker::Deps {
                reports: self.reports()?,
                threads: self.inner.threads.clone(),
                workspaces: self.inner.workspaces.clone(),
                harnesses: self.inner.harnesses.clone(),
                node: self.inner.config.node.clone(),
                shutdown: self.inner.shutdown.child_token(),
                turn_idle_timeout: self.inner.config.turn_idle_timeout,
                turn_stall_timeout: self.inner.config.turn_stall_timeout,
                turn_quiet_note: self.inner.config.turn_quiet_note,
                access: self.inner.config.access.clone(),
                texts: self.inner.config.texts.clone(),
                cancelled: self.inner.cancelled.clone(),
            },
            &self.inner.tasks,
        );
        workers.insert(agent.spec.name.clone(), handle.clone());
        Ok(handle)
    }

    async fn report(&self, report: Report) {
        if let Ok(r) = self.reports() {
            let _ = r.send(report).await;
        }
    }
}

fn poisoned() -> RuntimeError {
    RuntimeError::Poisoned
}
