//! The broker: commands in, events out. This file is its public face: the [`Broker`]
//! handle and its calls, [`Command`], [`Outcome`], [`BrokerConfig`] and [`Live`]; what
//! is kept from the published events (the status counts, the agents' names) is in
//! `counts.rs`; the writer (batching, commit, publication) is in `writer.rs`, the domain
//! rules, by the entity they govern, in `rules/`, the live flights per agent the queue
//! rule counts in `live.rs`, the calls that register (after the runtime's checks),
//! change and remove agents in `agents.rs`, the calls that decide approvals and remove
//! remembered rules in `approvals.rs`, the reads of usage (the report, an agent's budget)
//! in `usage.rs`.
//!
//! Every command goes through one writer task. The writer takes as many queued commands
//! as are waiting (up to [`MAX_BATCH`]), runs the domain rules for each as ONE batch
//! (each rule emits events; each event gets the next global seq, goes into the log and
//! is applied to the projections, written to sled key by key once the log has the
//! batch, readers seeing it whole: see `store::direct`), flushes once, and only then
//! answers the callers and publishes the events. The batch and the flush run on the
//! process's storage thread ([`relay_infra::storage`]), never on an async worker. So
//! nothing is acknowledged or published before it is on disk, and a burst of N commands
//! costs one disk flush, not N (group commit).
//!
//! A command that breaks a rule writes nothing: rules validate before they emit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use relay_infra::disk::Room;
use relay_protocol::api::{InvokeAccepted, MessagePosted, UpdateResult};
use relay_protocol::domain::{
    Agent, AgentSpec, AgentState, Approval, ApprovalDecision, ApprovalRequest, Conversation,
    ConversationSpec, Endpoint, Flight, FlightChange, InvokeRequest, PostMessage, ProgramInfo,
    Rule,
};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::error::BrokerError;
use crate::store::Store;
use crate::tasks::Tasks;

mod counts;
mod held;
mod live;
mod refusals;
mod rules;
mod writer;

pub use held::{Held, HELD_MAX};
pub use refusals::{Full, Refusals};

/// What [`Live::Event`] carries (defined with the log it is read back from).
pub use crate::store::Published;

pub(crate) use live::LiveByAgent;

use counts::Counts;
use writer::Writer;

/// Commands waiting for the writer, by default ([`BrokerConfig::command_queue`]). When
/// full, external callers get `Overloaded` at once.
pub const COMMAND_QUEUE_CAPACITY: usize = 4096;
/// Most commands committed in one batch and one flush.
pub const MAX_BATCH: usize = 1024;
/// Committed events buffered for slow subscribers; a subscriber that falls further
/// behind reads the gap back from the log.
pub const EVENT_BUFFER: usize = 4096;
/// Largest event (stored bytes) handed to subscribers in memory. A larger one (a long
/// answer: its item, the completing update, the reply) goes out as [`Live::InLog`] and
/// each subscriber reads it from the log, so the buffer never holds big texts after
/// everyone has seen them: at most [`EVENT_BUFFER`] x this (64 MiB) stays buffered.
pub const LIVE_EVENT_MAX: usize = 16 * 1024;
pub use relay_protocol::runtime::DELTA_MERGE_MAX;

#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// Largest message body or task text accepted, in bytes.
    pub max_message_bytes: usize,
    /// Deepest agent-to-agent chain allowed (a root invocation has depth 0).
    pub max_depth: u32,
    /// Commands that may wait for the writer; past that, clients get `Overloaded` at
    /// once (HTTP 429, a NATS error reply) and Relay's own commands wait for room.
    pub command_queue: usize,
    /// Free bytes kept on the data dir's filesystem: under it, writes are refused
    /// (`storage_full`) before sled could hit ENOSPC ([`relay_infra::disk`]).
    pub disk_reserve: u64,
    /// Longest the storage thread may take over one group commit before `relay up`
    /// decides it is stuck (sled waiting forever on its disk) and exits with an error.
    pub storage_stall_timeout: std::time::Duration,
    /// Flights an agent may have waiting behind its turn (its runtime's queue holds as
    /// many): one more invocation is refused `overloaded` before anything is written.
    pub agent_queue: usize,
    /// Bytes a flight may stream (text, command output, items, plans, diffs, notes)
    /// before it is failed, naming this cap, and its turn interrupted: one runaway turn
    /// cannot fill the disk. What came before the cap is kept.
    pub max_flight_output: u64,
    /// The user's price table (`relay up --prices FILE`): the writer costs a flight's
    /// usage from it when the harness reported no cost. `None`: costs only where
    /// harnesses report them.
    pub prices: Option<Arc<crate::prices::PriceTable>>,
}

/// See [`BrokerConfig::storage_stall_timeout`]: a group commit takes milliseconds; a
/// minute is a disk that will not come back.
pub const DEFAULT_STORAGE_STALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// [`BrokerConfig::max_flight_output`] by default: 8 MiB, far above any answer, build
/// log or diff a turn is read for.
pub const DEFAULT_MAX_FLIGHT_OUTPUT: u64 = 8 * 1024 * 1024;

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            max_message_bytes: 256 * 1024,
            max_depth: 4,
            command_queue: COMMAND_QUEUE_CAPACITY,
            disk_reserve: relay_infra::disk::DEFAULT_RESERVE,
            storage_stall_timeout: DEFAULT_STORAGE_STALL_TIMEOUT,
            agent_queue: relay_runtime::AGENT_QUEUE_CAPACITY,
            max_flight_output: DEFAULT_MAX_FLIGHT_OUTPUT,
            prices: None,
        }
    }
}

/// What the broker can be asked to do.
#[derive(Debug, Clone)]
pub enum Command {
    /// An agent, with the worktree its runtime made for it (kept as [`Agent::worktree`]).
    RegisterAgent(
        Box<AgentSpec>,
        Option<Box<relay_protocol::domain::WorktreeState>>,
    ),
    /// `force`: its worktree is removed even with uncommitted work (see
    /// [`EventBody::AgentRemoved`]).
    RemoveAgent {
        name: String,
        force: bool,
    },
    /// `agent.set`: changes an agent's settings (its budget).
    SetAgent {
        name: String,
        settings: relay_protocol::api::AgentSettings,
    },
    /// A client asked to start the agent's session (`agent.wake`): noted on the agent,
    /// before the runtime is asked (which reports the session's state as it changes).
    WakeAsked {
        name: String,
    },
    /// A client's command: its events record `by` as who asked for them
    /// ([`relay_protocol::event::Event::by`]).
    As {
        by: String,
        command: Box<Command>,
    },
    /// The runtime reports an agent's session state (with why, if it said), thread id or
    /// endpoint.
    UpdateAgent {
        name: String,
        state: Option<AgentState>,
        thread_id: Option<String>,
        endpoint: Option<Option<Endpoint>>,
        /// Why the agent is in `state`; kept as [`Agent::state_reason`] (only with a state).
        reason: Option<String>,
        /// What its program said of itself; kept as [`Agent::program`].
        program: Option<ProgramInfo>,
        /// Its worktree as made, recreated or moved on; kept as [`Agent::worktree`].
        worktree: Option<relay_protocol::domain::WorktreeState>,
    },
    ThreadLost {
        agent: String,
        old_thread_id: String,
        new_thread_id: String,
        reason: String,
    },
    CreateConversation(ConversationSpec),
    PostMessage(PostMessage),
    Invoke(InvokeRequest),
    UpdateFlight {
        flight: String,
        change: FlightChange,
    },
    RequestApproval {
        agent: String,
        request: ApprovalRequest,
    },
    /// `remember`: the rule this decision is remembered as (built by `ops::decide` from
    /// what the person saw; its id, time and origin are the writer's), recorded with it.
    DecideApproval {
        id: String,
        decision: ApprovalDecision,
        decided_by: String,
        remember: Option<Box<Rule>>,
    },
    /// Removes a remembered rule (`relay rule remove`), recorded as removed by `removed_by`.
    RemoveRule {
        id: String,
        removed_by: String,
    },
    /// Closes every approval of a flight still pending (its turn ended).
    ExpireApprovals {
        flight: String,
        /// Recorded as who closed them.
        by: String,
        /// Only the approval of this harness request id (`None`: all).
        request: Option<String>,
    },
    /// Creates what every broker starts with (the default conversation) if missing.
    Bootstrap,
    /// A command carried by a node's report, with the report's JetStream stream seq:
    /// applied at most once (a redelivered report is skipped).
    FromNode {
        node: String,
        /// The report stream's identity (its creation time, ns since the epoch): the
        /// seqs of a stream made anew start again and are not compared with the old.
        stream: i64,
        stream_seq: u64,
        command: Box<Command>,
    },
}

/// The result of a command.
#[derive(Debug, Clone)]
pub enum Outcome {
    Agent(Agent),
    Conversation(Conversation),
    /// A posted message and the consults its mentions started.
    Posted(MessagePosted),
    Invoked(InvokeAccepted),
    Flight(UpdateResult),
    Approval(Approval),
    Approvals(Vec<Approval>),
    Rule(Rule),
    Done,
}

struct Pending {
    command: Command,
    /// How far into the disk's reserve it may write: clients' commands stop at the
    /// reserve, Relay's own go on to its floor ([`Room`]).
    room: Room,
    reply: oneshot::Sender<Result<Outcome, BrokerError>>,
}

/// A cheap handle to the broker. The writer task stops when the shutdown token fires,
/// after committing what was queued.
#[derive(Clone)]
pub struct Broker {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    commands: mpsc::Sender<Pending>,
    events: broadcast::Sender<Live>,
    last_seq: AtomicU64,
    config: BrokerConfig,
    started: Instant,
    /// Cancelled when the writer stopped because the disk failed it.
    failed: CancellationToken,
    /// Kept as events are published, so `status` costs nothing however many flights.
    counts: Counts,
    /// Every task spawned for the broker, ended at the writer's stop.
    tasks: Tasks,
    /// Flights not yet ended per agent, as committed: the queue rule reads it.
    live: Arc<LiveByAgent>,
    /// What was refused for overload, for `/metrics`.
    refusals: Refusals,
    /// The runtime the broker started on: what lets go of a [`Held`] event after
    /// [`HELD_MAX`] (the writer publishes on the storage thread, outside it).
    runtime: tokio::runtime::Handle,
}

/// A committed event as subscribers get it live.
#[derive(Debug, Clone)]
pub enum Live {
    /// The event with its stored JSON, shared by every subscriber: sent as it is.
    Event(Arc<Published>),
    /// This event is too large to keep in the buffer: held briefly for the subscribers
    /// following live ([`Held`]); once let go, read it from the log (it is there: events
    /// are published only after their flush).
    InLog(Arc<Held>),
}

impl Live {
    pub fn seq(&self) -> u64 {
        match self {
            Live::Event(e) => e.seq,
            Live::InLog(held) => held.seq(),
        }
    }

    /// The event, when it is in memory: always for a small one; a large one while it is
    /// held ([`Held::take`]: call this once per event received, even to pass it by).
    /// `None`: read it from the log.
    pub fn take(&self) -> Option<Arc<Published>> {
        match self {
            Live::Event(e) => Some(e.clone()),
            Live::InLog(held) => held.take(),
        }
    }
}

/// Counts kept by the broker: (agents, flights, flights not yet ended).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusCounts {
    pub agents: u64,
    pub flights: u64,
    pub live_flights: u64,
}

impl Broker {
    /// Opens the broker over `store` and starts its writer task.
    pub async fn start(
        store: Store,
        config: BrokerConfig,
        shutdown: CancellationToken,
    ) -> Result<(Broker, tokio::task::JoinHandle<()>), BrokerError> {
        let (last_seq, counts, live) = store
            .read(|s| Ok((s.last_seq()?, Counts::scan(s)?, LiveByAgent::scan(s)?)))
            .await?;
        // A damaged log's last event may hold the largest seq: then none can follow it.
        let next_seq = last_seq.checked_add(1).ok_or_else(|| {
            BrokerError::Corrupt(format!(
                "the event log's last event has the largest seq ({last_seq}); no event can follow it (run `relay doctor`)"
            ))
        })?;
        let live = Arc::new(live);
        let (commands, rx) = mpsc::channel(config.command_queue.max(1));
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        let broker = Broker {
            inner: Arc::new(Inner {
                store,
                commands,
                events,
                last_seq: AtomicU64::new(last_seq),
                config,
                started: Instant::now(),
                failed: CancellationToken::new(),
                counts,
                tasks: Tasks::new(&shutdown),
                live: live.clone(),
                refusals: Refusals::default(),
                runtime: tokio::runtime::Handle::current(),
            }),
        };
        let writer = Writer {
            store: broker.inner.store.clone(),
            config: broker.inner.config.clone(),
            next_seq,
            failure: broker.inner.failed.clone(),
            live,
            streaming: Default::default(),
        };
        // On a thread of its own: every update waits for this loop to take it, and under a
        // burst the async workers are busy reading the burst (ops/BENCHMARKS.md part 20).
        let task = broker
            .inner
            .tasks
            .track_on_thread(
                "relay-writer",
                writer.run(rx, broker.clone_weak(), shutdown),
            )
            .map_err(|e| BrokerError::Internal(format!("cannot start the writer's thread: {e}")))?;
        broker.execute(Command::Bootstrap).await?;
        Ok((broker, task))
    }

    /// Agents and flights, as of the last published event: no scan.
    pub fn counts(&self) -> StatusCounts {
        let c = &self.inner.counts;
        StatusCounts {
            agents: c.agents.load(Ordering::Relaxed),
            flights: c.flights.load(Ordering::Relaxed),
            live_flights: c.live_flights.load(Ordering::Relaxed),
        }
    }

    /// Resolves if the writer stopped because a commit or flush failed: the broker takes
    /// no more commands, and its process should stop rather than serve stale reads.
    pub async fn failed(&self) {
        self.inner.failed.cancelled().await
    }

    fn clone_weak(&self) -> std::sync::Weak<Inner> {
        Arc::downgrade(&self.inner)
    }

    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// The broker's tasks (the writer, the feeds, the watches...): ended at the writer's
    /// stop; [`Tasks::stopped`] waits for them all.
    pub fn tasks(&self) -> &Tasks {
        &self.inner.tasks
    }

    /// `agent` as shown to a client: `busy` while a flight of its runs a turn, as of the
    /// last committed batch ([`AgentState::shown`](relay_protocol::domain::AgentState::shown)).
    pub fn shown(&self, mut agent: Agent) -> Agent {
        agent.state = agent.state.shown(self.inner.live.turning(&agent.spec.name));
        agent
    }

    /// An agent, read off the async workers (as stored: [`Broker::shown`] is how a client
    /// sees it).
    pub async fn agent(&self, name: &str) -> Result<Option<Agent>, BrokerError> {
        let name = name.to_string();
        self.inner.store.read(move |s| s.agent(&name)).await
    }

    /// Whether an agent's name equals `name` but for ASCII case, as of the last published
    /// event: no read of the store.
    pub fn agent_named_in_any_case(&self, name: &str) -> bool {
        self.inner
            .counts
            .names()
            .contains_key(&name.to_ascii_lowercase())
    }

    /// A flight, read off the async workers.
    pub async fn flight(&self, id: &str) -> Result<Option<Flight>, BrokerError> {
        let id = id.to_string();
        self.inner.store.read(move |s| s.flight(&id)).await
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.inner.config
    }

    pub fn uptime_ms(&self) -> u64 {
        self.inner.started.elapsed().as_millis() as u64
    }

    /// Durable flushes of the database since the broker opened it (group commit keeps
    /// this far below the writes; `relay-bench` reads it as flushes per flight).
    pub fn flushes(&self) -> u64 {
        self.inner.store.flushes()
    }

    /// Commands waiting for the writer now (its queue's depth).
    pub fn queue_depth(&self) -> usize {
        let c = &self.inner.commands;
        c.max_capacity().saturating_sub(c.capacity())
    }

    /// Whether the writer stopped because a commit or flush failed (see [`Broker::failed`]).
    pub fn has_failed(&self) -> bool {
        self.inner.failed.is_cancelled()
    }

    /// What was refused for overload (counted by the broker and the HTTP server).
    pub fn refusals(&self) -> &Refusals {
        &self.inner.refusals
    }

    /// Seq of the last committed (flushed and published) event.
    pub fn last_seq(&self) -> u64 {
        self.inner.last_seq.load(Ordering::Acquire)
    }

    /// Committed events as they are published. Pair with [`crate::feed`] to start from a
    /// seq without gaps.
    pub fn subscribe(&self) -> broadcast::Receiver<Live> {
        self.inner.events.subscribe()
    }

    /// Runs a command for an outside client: rejected with `Overloaded` when the queue is
    /// full rather than waiting.
    pub async fn execute(&self, command: Command) -> Result<Outcome, BrokerError> {
        let (reply, rx) = oneshot::channel();
        self.inner
            .commands
            .try_send(Pending {
                command,
                room: Room::AboveReserve,
                reply,
            })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => {
                    self.inner.refusals.count(Full::CommandQueue);
                    BrokerError::Overloaded("the command queue is full".into())
                }
                mpsc::error::TrySendError::Closed(_) => BrokerError::ShuttingDown,
            })?;
        self.counted(rx.await.map_err(|_| BrokerError::ShuttingDown)?)
    }

    /// Counts an invocation refused for its agent's full queue.
    fn counted(&self, r: Result<Outcome, BrokerError>) -> Result<Outcome, BrokerError> {
        if let Err(BrokerError::AgentQueueFull { .. }) = &r {
            self.inner.refusals.count(Full::AgentQueue);
        }
        r
    }

    /// Runs a command from inside Relay (the runtime streaming deltas): waits for room in
    /// the queue instead of failing, so the harness's stream is slowed, never dropped.
    pub async fn execute_internal(&self, command: Command) -> Result<Outcome, BrokerError> {
        let r = self.submit(command).await?.await;
        self.counted(r.map_err(|_| BrokerError::ShuttingDown)?)
    }

    /// Enqueues a command from inside Relay (waiting for room) and returns at once with
    /// the receiver of its result. On a disk under its reserve it is still stored, down
    /// to the reserve's floor ([`Room::DownToFloor`]): a turn's end must not be lost. Commands submitted one after another commit in that order, so a caller can
    /// stream many without waiting for each flush.
    pub async fn submit(
        &self,
        command: Command,
    ) -> Result<oneshot::Receiver<Result<Outcome, BrokerError>>, BrokerError> {
        let (reply, rx) = oneshot::channel();
        self.inner
            .commands
            .send(Pending {
                command,
                room: Room::DownToFloor,
                reply,
            })
            .await
            .map_err(|_| BrokerError::ShuttingDown)?;
        Ok(rx)
    }
}

/// Unwraps an [`Outcome`] of the expected variant.
macro_rules! expect_outcome {
    ($fut:expr, $variant:ident) => {
        match $fut.await? {
            Outcome::$variant(v) => Ok(v),
            other => Err(BrokerError::Internal(format!(
                "unexpected outcome {other:?}"
            ))),
        }
    };
}

// The agents' registration and removal: `agents.rs`.
mod agents;
// The usage report and an agent's budget status: `usage.rs`.
mod usage;

impl Broker {
    pub async fn create_conversation(
        &self,
        spec: ConversationSpec,
    ) -> Result<Conversation, BrokerError> {
        expect_outcome!(
            self.execute(Command::CreateConversation(spec)),
            Conversation
        )
    }

    pub async fn post_message(&self, post: PostMessage) -> Result<MessagePosted, BrokerError> {
        expect_outcome!(self.execute(Command::PostMessage(post)), Posted)
    }

    pub async fn invoke(&self, req: InvokeRequest) -> Result<InvokeAccepted, BrokerError> {
        expect_outcome!(self.execute(Command::Invoke(req)), Invoked)
    }

    pub async fn update_flight(
        &self,
        flight: &str,
        change: FlightChange,
    ) -> Result<UpdateResult, BrokerError> {
        expect_outcome!(
            self.execute(Command::UpdateFlight {
                flight: flight.into(),
                change
            }),
            Flight
        )
    }
}

// Approvals' decisions and remembered rules: `approvals.rs`.
mod approvals;

pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}
