//! The broker: commands in, events out.
//!
//! Every command goes through one writer task. The writer takes as many queued commands
//! as are waiting (up to [`MAX_BATCH`]), runs the domain rules for each inside ONE sled
//! transaction (each rule emits events; each event gets the next global seq, goes into
//! the log and is applied to the projections), flushes once, and only then answers the
//! callers and publishes the events. The transaction and the flush run on the process's
//! storage thread ([`relay_runtime::storage`]), never on an async worker. So nothing is
//! acknowledged or published before it is on disk, and a burst of N commands costs one
//! disk flush, not N (group commit).
//!
//! A command that breaks a rule writes nothing: rules validate before they emit.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use relay_protocol::api::{InvokeAccepted, UpdateResult};
use relay_protocol::clock::now_ms;
use relay_protocol::domain::{
    id_token, parse_mentions, valid_agent_name, valid_conversation_id, Agent, AgentSpec,
    AgentState, Approval, ApprovalDecision, ApprovalRequest, ApprovalState, Conversation,
    ConversationKind, ConversationSpec, Delivery, DeliveryReason, DeliveryState, Endpoint, Flight,
    FlightChange, FlightState, FlightUpdate, Harness, Invocation, InvokeRequest, ItemKind,
    ItemPhase, Message, MessageClass, MessageMeta, PostMessage, DEFAULT_CONVERSATION,
};
use relay_protocol::event::{Event, EventBody};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::error::{quote, BrokerError};
use crate::store::{apply, encode, seq_key, Store, Tx, T};
use relay_runtime::storage::{Ran, StorageError};

/// Commands waiting for the writer, by default ([`BrokerConfig::command_queue`]). When
/// full, external callers get `Overloaded` at once.
pub const COMMAND_QUEUE_CAPACITY: usize = 4096;
/// Most commands committed in one transaction and one flush.
pub const MAX_BATCH: usize = 1024;
/// Committed events buffered for slow subscribers; a subscriber that falls further
/// behind reads the gap back from the log.
pub const EVENT_BUFFER: usize = 4096;
/// Largest event (stored bytes) handed to subscribers in memory. A larger one (a long
/// answer: its item, the completing update, the reply) goes out as [`Live::InLog`] and
/// each subscriber reads it from the log, so the buffer never holds big texts after
/// everyone has seen them: at most [`EVENT_BUFFER`] x this (64 MiB) stays buffered.
pub const LIVE_EVENT_MAX: usize = 16 * 1024;
/// Longest live summary kept on a flight.
const SUMMARY_CHARS: usize = 160;

#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// Largest message body or task text accepted, in bytes.
    pub max_message_bytes: usize,
    /// Deepest agent-to-agent chain allowed (a root invocation has depth 0).
    pub max_depth: u32,
    /// Commands that may wait for the writer; past that, clients get `Overloaded` at
    /// once (HTTP 429, a NATS error reply) and Relay's own commands wait for room.
    pub command_queue: usize,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            max_message_bytes: 256 * 1024,
            max_depth: 4,
            command_queue: COMMAND_QUEUE_CAPACITY,
        }
    }
}

/// What the broker can be asked to do.
#[derive(Debug, Clone)]
pub enum Command {
    RegisterAgent(AgentSpec),
    RemoveAgent(String),
    /// The runtime reports an agent's session state, thread id or endpoint.
    UpdateAgent {
        name: String,
        state: Option<AgentState>,
        thread_id: Option<String>,
        endpoint: Option<Option<Endpoint>>,
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
    DecideApproval {
        id: String,
        decision: ApprovalDecision,
        decided_by: String,
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
        stream_seq: u64,
        command: Box<Command>,
    },
}

/// The result of a command.
#[derive(Debug, Clone)]
pub enum Outcome {
    Agent(Agent),
    Conversation(Conversation),
    Message(Message),
    Invoked(InvokeAccepted),
    Flight(UpdateResult),
    Approval(Approval),
    Approvals(Vec<Approval>),
    Done,
}

struct Pending {
    command: Command,
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
}

/// What `relay status` counts, kept current from the published events.
#[derive(Default)]
struct Counts {
    agents: AtomicU64,
    flights: AtomicU64,
    live_flights: AtomicU64,
}

impl Counts {
    /// One scan of the store, at start (blocking).
    fn scan(store: &Store) -> Result<Counts, BrokerError> {
        let (flights, live_flights) = store.flight_counts()?;
        Ok(Counts {
            agents: AtomicU64::new(store.tree(T::Agents).len() as u64),
            flights: AtomicU64::new(flights),
            live_flights: AtomicU64::new(live_flights),
        })
    }

    fn apply(&self, event: &Event) {
        match &event.body {
            EventBody::AgentRegistered { .. } => {
                self.agents.fetch_add(1, Ordering::Relaxed);
            }
            EventBody::AgentRemoved { .. } => {
                self.agents.fetch_sub(1, Ordering::Relaxed);
            }
            EventBody::InvocationCreated { flight, .. } => {
                self.flights.fetch_add(1, Ordering::Relaxed);
                if !flight.state.is_terminal() {
                    self.live_flights.fetch_add(1, Ordering::Relaxed);
                }
            }
            // A flight reaches a terminal state once: its state never changes again.
            EventBody::FlightUpdated { update, .. } => {
                if let FlightChange::State { to, .. } = &update.change {
                    if to.is_terminal() {
                        self.live_flights.fetch_sub(1, Ordering::Relaxed);
                    }
                }
            }
            _ => {}
        }
    }
}

/// A committed event as subscribers get it live.
#[derive(Debug, Clone)]
pub enum Live {
    Event(Arc<Event>),
    /// This event is too large to keep in memory for subscribers: read it from the log
    /// (it is there: events are published only after their flush).
    InLog(u64),
}

impl Live {
    pub fn seq(&self) -> u64 {
        match self {
            Live::Event(e) => e.seq,
            Live::InLog(seq) => *seq,
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
        let (last_seq, counts) = store
            .read(|s| Ok((s.last_seq()?, Counts::scan(s)?)))
            .await?;
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
            }),
        };
        let writer = Writer {
            store: broker.inner.store.clone(),
            config: broker.inner.config.clone(),
            next_seq: last_seq + 1,
            failure: broker.inner.failed.clone(),
        };
        let task = tokio::spawn(writer.run(rx, broker.clone_weak(), shutdown));
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

    /// An agent, read off the async workers.
    pub async fn agent(&self, name: &str) -> Result<Option<Agent>, BrokerError> {
        let name = name.to_string();
        self.inner.store.read(move |s| s.agent(&name)).await
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
            .try_send(Pending { command, reply })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => {
                    BrokerError::Overloaded("the command queue is full".into())
                }
                mpsc::error::TrySendError::Closed(_) => BrokerError::ShuttingDown,
            })?;
        rx.await.map_err(|_| BrokerError::ShuttingDown)?
    }

    /// Runs a command from inside Relay (the runtime streaming deltas): waits for room in
    /// the queue instead of failing, so the harness's stream is slowed, never dropped.
    pub async fn execute_internal(&self, command: Command) -> Result<Outcome, BrokerError> {
        self.submit(command)
            .await?
            .await
            .map_err(|_| BrokerError::ShuttingDown)?
    }

    /// Enqueues a command (waiting for room) and returns at once with the receiver of its
    /// result. Commands submitted one after another commit in that order, so a caller can
    /// stream many without waiting for each flush.
    pub async fn submit(
        &self,
        command: Command,
    ) -> Result<oneshot::Receiver<Result<Outcome, BrokerError>>, BrokerError> {
        let (reply, rx) = oneshot::channel();
        self.inner
            .commands
            .send(Pending { command, reply })
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

impl Broker {
    pub async fn register_agent(&self, mut spec: AgentSpec) -> Result<Agent, BrokerError> {
        // Secrets apart from here on: the command's `Debug` (logs) shows names only.
        spec.move_secrets();
        expect_outcome!(self.execute(Command::RegisterAgent(spec)), Agent)
    }

    pub async fn remove_agent(&self, name: &str) -> Result<Agent, BrokerError> {
        expect_outcome!(self.execute(Command::RemoveAgent(name.into())), Agent)
    }

    pub async fn create_conversation(
        &self,
        spec: ConversationSpec,
    ) -> Result<Conversation, BrokerError> {
        expect_outcome!(
            self.execute(Command::CreateConversation(spec)),
            Conversation
        )
    }

    pub async fn post_message(&self, post: PostMessage) -> Result<Message, BrokerError> {
        expect_outcome!(self.execute(Command::PostMessage(post)), Message)
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

    /// Decides an approval for a client (rejected with `Overloaded` when the queue is
    /// full).
    pub async fn decide_approval(
        &self,
        id: &str,
        decision: ApprovalDecision,
        decided_by: &str,
    ) -> Result<Approval, BrokerError> {
        self.decide(id, decision, decided_by, false).await
    }

    /// [`Broker::decide_approval`] for Relay's own policies: waits for queue room.
    pub async fn decide_approval_internal(
        &self,
        id: &str,
        decision: ApprovalDecision,
        decided_by: &str,
    ) -> Result<Approval, BrokerError> {
        self.decide(id, decision, decided_by, true).await
    }

    async fn decide(
        &self,
        id: &str,
        decision: ApprovalDecision,
        decided_by: &str,
        internal: bool,
    ) -> Result<Approval, BrokerError> {
        let command = Command::DecideApproval {
            id: id.into(),
            decision,
            decided_by: decided_by.into(),
        };
        let outcome = if internal {
            self.execute_internal(command).await
        } else {
            self.execute(command).await
        };
        expect_outcome!(async { outcome }, Approval)
    }
}

pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

struct Writer {
    store: Store,
    config: BrokerConfig,
    next_seq: u64,
    /// Cancelled when a flush failed and the writer stopped, for [`Broker::failed`].
    failure: CancellationToken,
}

type Reply = oneshot::Sender<Result<Outcome, BrokerError>>;

/// The callers of one command of a batch: several when deltas were merged.
type Replies = Vec<Reply>;

/// A batch's commands, with streamed text merged: consecutive deltas of one flight
/// (no other kind of command between them) become one delta with their texts joined,
/// answered to each of their callers. A flight streaming faster than commits complete
/// thus writes one update per commit instead of one per delta, with nothing of its text
/// lost or reordered; at a slower pace each delta stays its own update. Node reports
/// (`FromNode`, each with its stream seq) are never merged.
fn coalesce_deltas(batch: impl Iterator<Item = Pending>) -> (Vec<Command>, Vec<Replies>) {
    let mut commands: Vec<Command> = Vec::new();
    let mut replies: Vec<Replies> = Vec::new();
    // flight id -> index of its last command in `commands`, while that is a delta.
    let mut open: HashMap<String, usize> = HashMap::new();
    for p in batch {
        if let Command::UpdateFlight {
            flight,
            change: FlightChange::Delta { text },
        } = &p.command
        {
            if let Some(&i) = open.get(flight) {
                if let Command::UpdateFlight {
                    change: FlightChange::Delta { text: merged },
                    ..
                } = &mut commands[i]
                {
                    merged.push_str(text);
                    replies[i].push(p.reply);
                    continue;
                }
            }
            open.insert(flight.clone(), commands.len());
        } else {
            // Anything else may concern a flight with an open run of deltas: later
            // deltas must come after it, so every run ends here.
            open.clear();
        }
        commands.push(p.command);
        replies.push(vec![p.reply]);
    }
    (commands, replies)
}

/// What became of a batch, for the writer.
struct Settled {
    /// Seqs the batch's transaction took (taken even if the flush failed).
    events: u64,
    /// The flush failed: the writer stops.
    failed: bool,
}

impl Writer {
    async fn run(
        mut self,
        mut rx: mpsc::Receiver<Pending>,
        broker: std::sync::Weak<Inner>,
        shutdown: CancellationToken,
    ) {
        let mut batch: Vec<Pending> = Vec::with_capacity(MAX_BATCH);
        loop {
            let first = tokio::select! {
                biased;
                p = rx.recv() => p,
                _ = shutdown.cancelled() => {
                    // Commit what is already queued, then stop taking commands.
                    rx.close();
                    rx.recv().await
                }
            };
            let Some(first) = first else { break };
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(p) => batch.push(p),
                    Err(_) => break,
                }
            }
            let (commands, replies) = coalesce_deltas(batch.drain(..));
            let settled = self.commit(commands, replies, &broker).await;
            // The transaction is applied in memory whatever the flush says, so its seqs
            // are taken either way: never write other events under them.
            self.next_seq += settled.events;
            if settled.failed {
                rx.close();
                while let Ok(p) = rx.try_recv() {
                    let _ = p.reply.send(Err(BrokerError::ShuttingDown));
                }
                self.failure.cancel();
                break;
            }
        }
        if let Err(e) = self.store.flush().await {
            tracing::error!(error = %e, "final flush failed");
        }
        tracing::debug!("broker writer stopped");
    }

    /// Commits a batch: its transaction and its flush run as one job on the storage
    /// thread (grouped with whatever else waits there), off the async workers. Right
    /// after the flush, still on that thread, the events are published and the callers
    /// answered; the writer then hears what became of the batch.
    async fn commit(
        &mut self,
        commands: Vec<Command>,
        replies: Vec<Replies>,
        broker: &std::sync::Weak<Inner>,
    ) -> Settled {
        let first_seq = self.next_seq;
        let (store, config) = (self.store.clone(), self.config.clone());
        let (done, settled) = oneshot::channel();
        let broker = broker.clone();
        let queued = self
            .store
            .durable()
            .write_then(
                move || transact(&store, &config, first_seq, &commands),
                // A batch refused whole wrote nothing (and a failed transaction is
                // rolled back): no flush for it.
                |result| matches!(result, Ok(r) if r.wrote),
                move |ran| {
                    let _ = done.send(settle(ran, replies, &broker));
                },
            )
            .await;
        match (queued, settled.await) {
            (Ok(()), Ok(settled)) => settled,
            _ => {
                // The storage thread is gone (its callers were told by their dropped
                // answer): nothing more can be stored.
                tracing::error!("the storage thread stopped; the broker stops accepting commands");
                Settled {
                    events: 0,
                    failed: true,
                }
            }
        }
    }
}

/// On the storage thread, after a batch's flush: publishes its events and answers its
/// callers (or tells them it failed). Published before the callers hear back, so a
/// caller that reads the log or subscribes right after its answer sees its own events.
fn settle(
    ran: Ran<Result<BatchResult, BrokerError>>,
    replies: Vec<Replies>,
    broker: &std::sync::Weak<Inner>,
) -> Settled {
    let fail_all = |replies: Vec<Replies>, message: String| {
        for reply in replies.into_iter().flatten() {
            let _ = reply.send(Err(BrokerError::Internal(message.clone())));
        }
    };
    let (result, flushed) = match ran {
        Ok((Ok(result), flushed)) => (result, flushed),
        // The transaction failed (sled did not commit it): nothing of it was written. A
        // storage error, or a failed flush of the group, means the disk failed: stop.
        Ok((Err(e), flushed)) => {
            let failed = matches!(e, BrokerError::Storage(_)) || flushed.is_err();
            if failed {
                tracing::error!(error = %e, "storage failed; the broker stops accepting commands");
            }
            fail_all(replies, format!("commit failed: {e}"));
            return Settled { events: 0, failed };
        }
        // The job panicked (sled did not commit it), or its group's flush failed.
        Err(e) => {
            tracing::error!(error = %e, "a batch could not be committed");
            fail_all(replies, format!("commit failed: {e}"));
            return Settled {
                events: 0,
                failed: matches!(e, StorageError::Flush(_)),
            };
        }
    };
    let events = result.events.len() as u64;
    if let Err(e) = flushed {
        // The batch may or may not reach the disk: tell nobody it did, and stop taking
        // commands (the store's state is no longer known).
        tracing::error!(error = %e, "flush failed; the broker stops accepting commands");
        fail_all(
            replies,
            "the disk flush failed; nothing of this batch is known to be stored".into(),
        );
        return Settled {
            events,
            failed: true,
        };
    }
    if let Some(inner) = broker.upgrade() {
        if let Some(last) = result.events.last() {
            inner.last_seq.store(last.0.seq, Ordering::Release);
        }
        for (event, size) in result.events {
            inner.counts.apply(&event);
            let live = if size > LIVE_EVENT_MAX {
                Live::InLog(event.seq)
            } else {
                Live::Event(Arc::new(event))
            };
            // No subscriber is fine: the log has it.
            let _ = inner.events.send(live);
        }
    }
    for (replies, outcome) in replies.into_iter().zip(result.outcomes) {
        // Merged deltas: every caller hears the one outcome.
        let mut replies = replies.into_iter();
        let first = replies.next();
        for reply in replies {
            let _ = reply.send(match &outcome {
                Ok(o) => Ok(o.clone()),
                Err(e) => Err(e.duplicate()),
            });
        }
        if let Some(reply) = first {
            let _ = reply.send(outcome);
        }
    }
    Settled {
        events,
        failed: false,
    }
}

/// Runs the rules of every command of a batch in ONE sled transaction (on the storage
/// thread). A command that fails after emitting part of its events is a bug in a rule
/// (rules validate before they emit); the batch is then run again without it, so that
/// no command is ever half applied.
fn transact(
    store: &Store,
    config: &BrokerConfig,
    first_seq: u64,
    commands: &[Command],
) -> Result<BatchResult, BrokerError> {
    let mut left_out: Vec<Option<BrokerError>> = commands.iter().map(|_| None).collect();
    let committed = loop {
        let partial = RefCell::new(None);
        let committed = store.transaction(|tx| {
            let mut ctx = Ctx {
                tx,
                config,
                next_seq: first_seq,
                now: now_ms(),
                events: Vec::new(),
            };
            let mut outcomes = Vec::with_capacity(commands.len());
            for (i, command) in commands.iter().enumerate() {
                if left_out[i].is_some() {
                    outcomes.push(None);
                    continue;
                }
                let emitted = ctx.events.len();
                match ctx.run(command) {
                    // sled retries the batch on a conflict; a storage error fails it.
                    Err(e @ (BrokerError::TxConflict | BrokerError::Storage(_))) => return Err(e),
                    Err(e) if ctx.events.len() > emitted => {
                        *partial.borrow_mut() = Some((i, e));
                        return Err(BrokerError::Internal("a command was half applied".into()));
                    }
                    outcome => outcomes.push(Some(outcome)),
                }
            }
            Ok((outcomes, ctx.events))
        });
        match partial.into_inner() {
            Some((i, e)) => {
                tracing::error!(command = ?commands[i], error = %e, "a command failed after writing; it is left out of its batch");
                left_out[i] = Some(e);
            }
            None => break committed,
        }
    };
    let (outcomes, events) = committed?;
    // Node reports move their node's cursor even when refused.
    let wrote = !events.is_empty()
        || commands
            .iter()
            .any(|c| matches!(c, Command::FromNode { .. }));
    Ok(BatchResult {
        wrote,
        outcomes: outcomes
            .into_iter()
            .zip(left_out)
            .map(|(outcome, left_out)| match (outcome, left_out) {
                (Some(outcome), _) => outcome,
                (None, Some(e)) => Err(e),
                (None, None) => Err(BrokerError::Internal("command not run".into())),
            })
            .collect(),
        events,
    })
}

struct BatchResult {
    outcomes: Vec<Result<Outcome, BrokerError>>,
    /// With the size each takes in the log.
    events: Vec<(Event, usize)>,
    /// Whether the batch wrote anything (events, or a node's report cursor).
    wrote: bool,
}

/// The domain rules, run inside the writer's transaction.
struct Ctx<'a, 't> {
    tx: &'a Tx<'t>,
    config: &'a BrokerConfig,
    next_seq: u64,
    now: u64,
    /// With the size each takes in the log.
    events: Vec<(Event, usize)>,
}

impl Ctx<'_, '_> {
    fn emit(&mut self, body: EventBody) -> Result<(), BrokerError> {
        let event = Event {
            v: relay_protocol::event::EVENT_VERSION,
            seq: self.next_seq,
            at: self.now,
            body,
        };
        let stored = encode(&event)?;
        let size = stored.len();
        crate::store::Sink::put(self.tx, T::Events, &seq_key(event.seq), stored)?;
        apply(self.tx, &event)?;
        self.next_seq += 1;
        self.events.push((event, size));
        Ok(())
    }

    fn run(&mut self, command: &Command) -> Result<Outcome, BrokerError> {
        match command {
            Command::RegisterAgent(spec) => self.register_agent(spec),
            Command::RemoveAgent(name) => {
                let agent = self.agent(name)?;
                crate::store::Sink::del(self.tx, T::Secrets, name.as_bytes())?;
                self.emit(EventBody::AgentRemoved {
                    name: name.clone(),
                    node: agent.spec.node.clone(),
                })?;
                Ok(Outcome::Agent(agent))
            }
            Command::UpdateAgent {
                name,
                state,
                thread_id,
                endpoint,
            } => {
                let mut agent = self.agent(name)?;
                let before = agent.clone();
                if let Some(s) = state {
                    agent.state = *s;
                }
                if let Some(t) = thread_id {
                    agent.thread_id = Some(t.clone());
                }
                if let Some(e) = endpoint {
                    agent.endpoint = e.clone();
                }
                if agent != before {
                    agent.updated_at = self.now;
                    self.emit(EventBody::AgentUpdated {
                        agent: agent.clone(),
                    })?;
                }
                Ok(Outcome::Agent(agent))
            }
            Command::ThreadLost {
                agent,
                old_thread_id,
                new_thread_id,
                reason,
            } => {
                self.agent(agent)?;
                self.emit(EventBody::ThreadLost {
                    agent: agent.clone(),
                    old_thread_id: old_thread_id.clone(),
                    new_thread_id: new_thread_id.clone(),
                    reason: reason.clone(),
                })?;
                Ok(Outcome::Done)
            }
            Command::CreateConversation(spec) => self.create_conversation(spec),
            Command::PostMessage(post) => {
                let conversation = self.conversation(&post.conversation)?;
                self.check_post(post)?;
                let message = self.post(conversation, post)?;
                Ok(Outcome::Message(message))
            }
            Command::Invoke(req) => self.invoke(req),
            Command::UpdateFlight { flight, change } => self.update_flight(flight, change),
            Command::RequestApproval { agent, request } => self.request_approval(agent, request),
            Command::DecideApproval {
                id,
                decision,
                decided_by,
            } => self.decide_approval(id, *decision, decided_by),
            Command::ExpireApprovals {
                flight,
                by,
                request,
            } => {
                let pending = self.pending_approvals(flight)?;
                let mut closed = Vec::new();
                for mut a in pending.into_iter().filter(|a| {
                    request
                        .as_ref()
                        .is_none_or(|r| *r == a.request.harness_request_id)
                }) {
                    a.state = ApprovalState::Expired;
                    a.decided_by = Some(by.clone());
                    a.decided_at = Some(self.now);
                    self.emit(EventBody::ApprovalDecided {
                        approval: a.clone(),
                    })?;
                    closed.push(a);
                }
                Ok(Outcome::Approvals(closed))
            }
            Command::FromNode {
                node,
                stream_seq,
                command,
            } => {
                let applied: u64 = self
                    .tx
                    .read(T::ReportCursors, node.as_bytes())?
                    .unwrap_or(0);
                if *stream_seq <= applied {
                    return Ok(Outcome::Done);
                }
                // Rules validate before they write, so a refused command wrote nothing;
                // either way this report has been dealt with.
                let result = self
                    .node_may(node, command)
                    .and_then(|()| self.run(command));
                crate::store::Sink::put(
                    self.tx,
                    T::ReportCursors,
                    node.as_bytes(),
                    encode(stream_seq)?,
                )?;
                result
            }
            Command::Bootstrap => {
                if !self
                    .tx
                    .contains(T::Conversations, DEFAULT_CONVERSATION.as_bytes())?
                {
                    self.create_conversation(&ConversationSpec {
                        id: DEFAULT_CONVERSATION.into(),
                        kind: ConversationKind::Channel,
                        title: Some("shared".into()),
                        participants: vec![],
                        parent: None,
                    })?;
                }
                Ok(Outcome::Done)
            }
        }
    }

    /// Whether node `node` may report `command`: only on its own agents and their
    /// flights (its key speaks for it alone, and so do its reports).
    fn node_may(&self, node: &str, command: &Command) -> Result<(), BrokerError> {
        let agent = match command {
            Command::UpdateFlight { flight, .. } | Command::ExpireApprovals { flight, .. } => {
                self.flight(flight)?.agent
            }
            Command::UpdateAgent { name, .. } => name.clone(),
            Command::ThreadLost { agent, .. } | Command::RequestApproval { agent, .. } => {
                agent.clone()
            }
            _ => {
                return Err(BrokerError::Invalid(format!(
                    "node {node:?} reported a command nodes do not send"
                )))
            }
        };
        if self.agent(&agent)?.spec.node.as_deref() != Some(node) {
            tracing::warn!(%node, %agent, "a node reported on an agent that is not its own; refused");
            return Err(BrokerError::Invalid(format!(
                "node {node:?} may only report on its own agents, not {agent:?}"
            )));
        }
        Ok(())
    }

    fn agent(&self, name: &str) -> Result<Agent, BrokerError> {
        self.tx
            .read(T::Agents, name.as_bytes())?
            .ok_or_else(|| BrokerError::UnknownAgent(name.into()))
    }

    fn conversation(&self, id: &str) -> Result<Conversation, BrokerError> {
        self.tx
            .read(T::Conversations, id.as_bytes())?
            .ok_or_else(|| BrokerError::UnknownConversation(id.into()))
    }

    fn flight(&self, id: &str) -> Result<Flight, BrokerError> {
        self.tx
            .read(T::Flights, id.as_bytes())?
            .ok_or_else(|| BrokerError::UnknownFlight(id.into()))
    }

    fn register_agent(&mut self, spec: &AgentSpec) -> Result<Outcome, BrokerError> {
        if !valid_agent_name(&spec.name) {
            return Err(BrokerError::Invalid(format!(
                "agent name {} is not valid: use 1 to 64 letters, digits, '-' or '_', starting with a letter or digit",
                quote(&spec.name)
            )));
        }
        if let Some(node) = &spec.node {
            if !valid_agent_name(node) {
                return Err(BrokerError::Invalid(format!(
                    "node name {} is not valid: use letters, digits, '-' or '_'",
                    quote(node)
                )));
            }
        }
        if spec.cwd.trim().is_empty() {
            return Err(BrokerError::Invalid("the agent's cwd is empty".into()));
        }
        crate::policy::validate(&spec.approval_policy).map_err(BrokerError::Invalid)?;
        if self.tx.contains(T::Agents, spec.name.as_bytes())? {
            return Err(BrokerError::AgentExists(spec.name.clone()));
        }
        let (spec, secrets) = split_secrets(spec)?;
        if !secrets.is_empty() {
            crate::store::Sink::put(self.tx, T::Secrets, spec.name.as_bytes(), encode(&secrets)?)?;
        }
        let agent = Agent {
            spec,
            state: AgentState::Offline,
            thread_id: None,
            endpoint: None,
            created_at: self.now,
            updated_at: self.now,
        };
        self.emit(EventBody::AgentRegistered {
            agent: agent.clone(),
        })?;
        Ok(Outcome::Agent(agent))
    }

    fn create_conversation(&mut self, spec: &ConversationSpec) -> Result<Outcome, BrokerError> {
        if !valid_conversation_id(&spec.id) {
            return Err(BrokerError::Invalid(format!(
                "conversation id {}: 1 to 200 bytes of dot-separated words of letters, digits, `-` and `_` (like channel.shared)",
                quote(&spec.id)
            )));
        }
        if self.tx.contains(T::Conversations, spec.id.as_bytes())? {
            return Err(BrokerError::ConversationExists(spec.id.clone()));
        }
        if let Some(parent) = &spec.parent {
            self.conversation(parent)?;
        }
        let conversation = Conversation {
            spec: spec.clone(),
            created_at: self.now,
            message_count: 0,
        };
        self.emit(EventBody::ConversationCreated {
            conversation: conversation.clone(),
        })?;
        Ok(Outcome::Conversation(conversation))
    }

    fn check_text(&self, what: &'static str, text: &str) -> Result<(), BrokerError> {
        if text.len() > self.config.max_message_bytes {
            return Err(BrokerError::TooLarge {
                what,
                size: text.len(),
                limit: self.config.max_message_bytes,
            });
        }
        if text.trim().is_empty() {
            return Err(BrokerError::Invalid(format!("the {what} is empty")));
        }
        Ok(())
    }

    fn check_post(&self, post: &PostMessage) -> Result<(), BrokerError> {
        self.check_text("message body", &post.body)?;
        if post.author.trim().is_empty() || post.author.len() > 128 {
            return Err(BrokerError::Invalid(
                "a message author is 1 to 128 characters".into(),
            ));
        }
        if let Some(reply_to) = &post.reply_to {
            if !self.tx.contains(T::MessageIds, reply_to.as_bytes())? {
                return Err(BrokerError::UnknownMessage(reply_to.clone()));
            }
        }
        Ok(())
    }

    /// Posts a checked message and plans its deliveries.
    fn post(
        &mut self,
        mut conversation: Conversation,
        post: &PostMessage,
    ) -> Result<Message, BrokerError> {
        let message = Message {
            id: new_id("msg"),
            conversation: conversation.spec.id.clone(),
            index: conversation.message_count,
            author: post.author.clone(),
            class: post.class,
            body: post.body.clone(),
            mentions: parse_mentions(&post.body),
            reply_to: post.reply_to.clone(),
            meta: post.meta.clone(),
            created_at: self.now,
        };
        conversation.message_count += 1;
        let mut targets: Vec<(String, DeliveryReason)> = message
            .mentions
            .iter()
            .map(|m| (m.clone(), DeliveryReason::Mention))
            .collect();
        if conversation.spec.kind == ConversationKind::Direct {
            for p in &conversation.spec.participants {
                if !targets.iter().any(|(t, _)| t == p) {
                    targets.push((p.clone(), DeliveryReason::DirectMessage));
                }
            }
        }
        self.emit(EventBody::MessagePosted {
            message: message.clone(),
            conversation,
        })?;
        for (target, reason) in targets {
            if target == message.author {
                continue;
            }
            // Only registered agents get deliveries; a mention of anything else is text.
            if let Some(agent) = self.tx.read::<Agent>(T::Agents, target.as_bytes())? {
                self.plan_delivery(&message.id, &agent, reason)?;
            }
        }
        Ok(message)
    }

    fn plan_delivery(
        &mut self,
        message: &str,
        agent: &Agent,
        reason: DeliveryReason,
    ) -> Result<(), BrokerError> {
        let transport = agent.spec.harness;
        let id = relay_protocol::domain::delivery_id(message, &agent.spec.name, reason, transport);
        if self.tx.contains(T::Deliveries, id.as_bytes())? {
            return Ok(());
        }
        self.emit(EventBody::DeliveryPlanned {
            delivery: Delivery {
                id,
                message: message.into(),
                target: agent.spec.name.clone(),
                reason,
                transport,
                state: DeliveryState::Pending,
                attempts: vec![],
            },
        })
    }

    fn invoke(&mut self, req: &InvokeRequest) -> Result<Outcome, BrokerError> {
        let agent = self.agent(&req.target)?;
        self.check_text("task", &req.task)?;
        if req.requester.trim().is_empty() || req.requester.len() > 128 {
            return Err(BrokerError::Invalid(
                "a requester is 1 to 128 characters".into(),
            ));
        }
        let depth = match &req.parent_flight {
            None => 0,
            Some(parent) => {
                let mut depth = 1u32;
                let mut cursor = Some(parent.clone());
                while let Some(id) = cursor {
                    let f = self.flight(&id)?;
                    if f.agent == req.target {
                        return Err(BrokerError::Cycle {
                            agent: req.target.clone(),
                        });
                    }
                    cursor = f.parent_flight;
                    if cursor.is_some() {
                        depth += 1;
                    }
                }
                if depth > self.config.max_depth {
                    return Err(BrokerError::DepthLimit {
                        depth,
                        limit: self.config.max_depth,
                    });
                }
                depth
            }
        };
        let conversation = match &req.conversation {
            Some(id) => self.conversation(id)?,
            None => {
                let (a, b) = if req.requester <= req.target {
                    (&req.requester, &req.target)
                } else {
                    (&req.target, &req.requester)
                };
                let id = format!("direct.{}.{}", id_token(a), id_token(b));
                match self
                    .tx
                    .read::<Conversation>(T::Conversations, id.as_bytes())?
                {
                    Some(c) => c,
                    None => match self.create_conversation(&ConversationSpec {
                        id,
                        kind: ConversationKind::Direct,
                        title: None,
                        participants: vec![a.clone(), b.clone()],
                        parent: None,
                    })? {
                        Outcome::Conversation(c) => c,
                        _ => return Err(BrokerError::Internal("conversation".into())),
                    },
                }
            }
        };
        let invocation_id = new_id("inv");
        let flight_id = new_id("flt");
        let request = self.post(
            conversation.clone(),
            &PostMessage {
                conversation: conversation.spec.id.clone(),
                author: req.requester.clone(),
                body: req.task.clone(),
                class: MessageClass::Agent,
                reply_to: None,
                meta: MessageMeta {
                    invocation: Some(invocation_id.clone()),
                    flight: Some(flight_id.clone()),
                    harness: Some(agent.spec.harness),
                    ..Default::default()
                },
            },
        )?;
        self.plan_delivery(&request.id, &agent, DeliveryReason::Invocation)?;
        let invocation = Invocation {
            id: invocation_id,
            requester: req.requester.clone(),
            target: req.target.clone(),
            action: req.action,
            task: req.task.clone(),
            conversation: conversation.spec.id.clone(),
            request_message: request.id,
            parent_flight: req.parent_flight.clone(),
            depth,
            timeout_ms: req.timeout_ms,
            created_at: self.now,
        };
        let flight = Flight::queued(flight_id, &invocation);
        self.emit(EventBody::InvocationCreated {
            invocation: invocation.clone(),
            flight: flight.clone(),
        })?;
        Ok(Outcome::Invoked(InvokeAccepted { invocation, flight }))
    }

    fn update_flight(
        &mut self,
        flight_id: &str,
        change: &FlightChange,
    ) -> Result<Outcome, BrokerError> {
        let mut flight = self.flight(flight_id)?;
        let unchanged = |flight: Flight| {
            Ok(Outcome::Flight(UpdateResult {
                applied: false,
                flight,
            }))
        };
        if let FlightChange::State { to, .. } = change {
            if flight.state == *to {
                // The same state again (a retry, a replayed report): nothing new.
                return unchanged(flight);
            }
        }
        if flight.state.is_terminal() {
            return Err(BrokerError::FlightTerminal {
                flight: flight.id,
                state: flight.state,
            });
        }
        let mut reply: Option<String> = None;
        // The task reached the agent (its turn runs) or never will (ended before).
        let mut delivered: Option<Result<(), String>> = None;
        match change {
            FlightChange::State { to, reason, output } => {
                if !flight.state.can_transition(*to) {
                    return Err(BrokerError::IllegalTransition {
                        flight: flight.id,
                        from: flight.state,
                        to: *to,
                    });
                }
                if matches!(flight.state, FlightState::Queued | FlightState::Waking) {
                    delivered = match to {
                        FlightState::Running | FlightState::Waiting | FlightState::Completed => {
                            Some(Ok(()))
                        }
                        FlightState::Failed | FlightState::Cancelled => Some(Err(reason
                            .clone()
                            .unwrap_or_else(|| format!("the flight was {to} before its turn")))),
                        FlightState::Queued | FlightState::Waking => None,
                    };
                }
                flight.state = *to;
                match to {
                    FlightState::Completed => {
                        flight.output = output.clone();
                        if let Some(text) = output.as_ref().filter(|t| !t.trim().is_empty()) {
                            reply = Some(text.clone());
                        }
                    }
                    FlightState::Failed | FlightState::Cancelled => {
                        flight.error = reason.clone();
                        flight.summary = reason.as_deref().map(summarize);
                    }
                    _ => {
                        if let Some(r) = reason {
                            flight.summary = Some(summarize(r));
                        }
                    }
                }
            }
            FlightChange::Delta { text } => {
                // Streamed text accumulates; after anything else it starts afresh.
                let previous: Option<crate::store::StoredUpdate> = self.tx.read(
                    T::FlightUpdates,
                    &crate::store::child_key(&flight.id, flight.update_seq),
                )?;
                let mut s = match previous.map(|p| p.update.change) {
                    Some(FlightChange::Delta { .. }) => flight.summary.take().unwrap_or_default(),
                    _ => String::new(),
                };
                s.push_str(text);
                flight.summary = Some(tail(&s, SUMMARY_CHARS));
            }
            // Streamed text shows itself through the deltas that follow.
            FlightChange::Item {
                item_kind,
                phase: ItemPhase::Started,
                text,
                ..
            } if !matches!(
                item_kind,
                ItemKind::AgentMessage | ItemKind::UserMessage | ItemKind::Reasoning
            ) =>
            {
                flight.summary = Some(summarize(&match text {
                    Some(t) => format!("{item_kind}: {t}"),
                    None => item_kind.to_string(),
                }));
            }
            FlightChange::Session { thread_id, turn_id } => {
                if (thread_id.is_none() || thread_id == &flight.thread_id)
                    && (turn_id.is_none() || turn_id == &flight.turn_id)
                {
                    return unchanged(flight);
                }
                if thread_id.is_some() {
                    flight.thread_id = thread_id.clone();
                }
                if turn_id.is_some() {
                    flight.turn_id = turn_id.clone();
                }
            }
            FlightChange::Note { text } => flight.summary = Some(summarize(text)),
            FlightChange::Item { .. }
            | FlightChange::CommandOutput { .. }
            | FlightChange::Plan { .. }
            | FlightChange::Diff { .. }
            | FlightChange::Usage { .. } => {}
        }
        if let Some(text) = reply {
            let invocation: Invocation = self
                .tx
                .read(T::Invocations, flight.invocation.as_bytes())?
                .ok_or_else(|| {
                    BrokerError::Corrupt(format!("flight {} has no invocation", flight.id))
                })?;
            let conversation = self.conversation(&invocation.conversation)?;
            let harness = self
                .tx
                .read::<Agent>(T::Agents, flight.agent.as_bytes())?
                .map(|a| a.spec.harness);
            let message = self.post(
                conversation,
                &PostMessage {
                    conversation: invocation.conversation.clone(),
                    author: flight.agent.clone(),
                    body: text,
                    class: MessageClass::Agent,
                    reply_to: Some(invocation.request_message.clone()),
                    meta: MessageMeta {
                        invocation: Some(invocation.id.clone()),
                        flight: Some(flight.id.clone()),
                        harness,
                        thread_id: flight.thread_id.clone(),
                        turn_id: flight.turn_id.clone(),
                    },
                },
            )?;
            flight.reply_message = Some(message.id);
        }
        flight.update_seq += 1;
        flight.updated_at = self.now;
        let update = FlightUpdate {
            flight: flight.id.clone(),
            agent: flight.agent.clone(),
            seq: flight.update_seq,
            at: self.now,
            change: change.clone(),
        };
        self.emit(EventBody::FlightUpdated {
            update,
            flight: flight.clone(),
        })?;
        if let Some(outcome) = delivered {
            self.attempt_deliveries(&flight, outcome)?;
        }
        Ok(Outcome::Flight(UpdateResult {
            applied: true,
            flight,
        }))
    }

    /// Records the attempt on the pending deliveries of a flight's task (its request
    /// message) to its agent: delivered once the turn runs, failed if the flight ended
    /// before.
    fn attempt_deliveries(
        &mut self,
        flight: &Flight,
        outcome: Result<(), String>,
    ) -> Result<(), BrokerError> {
        let Some(invocation) = self
            .tx
            .read::<Invocation>(T::Invocations, flight.invocation.as_bytes())?
        else {
            return Ok(());
        };
        // Every transport: the agent may have been removed, or registered again with
        // another harness, since the deliveries were planned.
        let reasons = [
            DeliveryReason::Invocation,
            DeliveryReason::DirectMessage,
            DeliveryReason::Mention,
        ];
        for (reason, transport) in reasons
            .into_iter()
            .flat_map(|r| Harness::ALL.into_iter().map(move |h| (r, h)))
        {
            let id = relay_protocol::domain::delivery_id(
                &invocation.request_message,
                &flight.agent,
                reason,
                transport,
            );
            let Some(mut delivery) = self.tx.read::<Delivery>(T::Deliveries, id.as_bytes())? else {
                continue;
            };
            if delivery.state != DeliveryState::Pending {
                continue;
            }
            delivery.state = if outcome.is_ok() {
                DeliveryState::Delivered
            } else {
                DeliveryState::Failed
            };
            delivery
                .attempts
                .push(relay_protocol::domain::DeliveryAttempt {
                    at: self.now,
                    ok: outcome.is_ok(),
                    error: outcome.clone().err(),
                });
            self.emit(EventBody::DeliveryAttempted { delivery })?;
        }
        Ok(())
    }

    fn pending_approvals(&self, flight: &str) -> Result<Vec<Approval>, BrokerError> {
        let index: Vec<String> = self
            .tx
            .read(T::FlightApprovals, flight.as_bytes())?
            .unwrap_or_default();
        let mut out = Vec::new();
        for id in index {
            if let Some(a) = self.tx.read::<Approval>(T::Approvals, id.as_bytes())? {
                if a.state == ApprovalState::Pending {
                    out.push(a);
                }
            }
        }
        Ok(out)
    }

    fn request_approval(
        &mut self,
        agent: &str,
        request: &ApprovalRequest,
    ) -> Result<Outcome, BrokerError> {
        self.agent(agent)?;
        let flight = self.flight(&request.flight)?;
        if flight.agent != agent {
            return Err(BrokerError::Invalid(format!(
                "flight {} is not agent {agent:?}'s: an approval is asked by the agent running the flight",
                flight.id
            )));
        }
        if flight.state.is_terminal() {
            return Err(BrokerError::FlightTerminal {
                flight: flight.id,
                state: flight.state,
            });
        }
        let approval = Approval {
            id: new_id("apr"),
            agent: agent.into(),
            request: request.clone(),
            state: ApprovalState::Pending,
            decision: None,
            decided_by: None,
            created_at: self.now,
            decided_at: None,
        };
        self.emit(EventBody::ApprovalRequested {
            approval: approval.clone(),
        })?;
        if flight.state == FlightState::Running {
            self.update_flight(
                &flight.id,
                &FlightChange::State {
                    to: FlightState::Waiting,
                    reason: Some(format!("approval {}: {}", approval.id, request.detail)),
                    output: None,
                },
            )?;
        }
        Ok(Outcome::Approval(approval))
    }

    fn decide_approval(
        &mut self,
        id: &str,
        decision: ApprovalDecision,
        decided_by: &str,
    ) -> Result<Outcome, BrokerError> {
        let mut approval: Approval = self
            .tx
            .read(T::Approvals, id.as_bytes())?
            .ok_or_else(|| BrokerError::UnknownApproval(id.into()))?;
        if approval.state != ApprovalState::Pending {
            return Err(BrokerError::ApprovalClosed(id.into()));
        }
        approval.state = ApprovalState::Decided;
        approval.decision = Some(decision);
        approval.decided_by = Some(decided_by.into());
        approval.decided_at = Some(self.now);
        self.emit(EventBody::ApprovalDecided {
            approval: approval.clone(),
        })?;
        let flight = self.flight(&approval.request.flight)?;
        if flight.state == FlightState::Waiting && self.pending_approvals(&flight.id)?.is_empty() {
            self.update_flight(
                &flight.id,
                &FlightChange::State {
                    to: FlightState::Running,
                    reason: Some(format!("approval {id}: {decision} by {decided_by}")),
                    output: None,
                },
            )?;
        }
        Ok(Outcome::Approval(approval))
    }
}

/// The first line of `s`, cut to [`SUMMARY_CHARS`].
fn summarize(s: &str) -> String {
    let line = s.lines().next().unwrap_or("");
    match line.char_indices().nth(SUMMARY_CHARS) {
        Some((i, _)) => format!("{}...", &line[..i]),
        None => line.to_string(),
    }
}

/// The last `n` characters of `s`, on one line.
fn tail(s: &str, n: usize) -> String {
    let flat: String = s.chars().map(|c| if c == '\n' { ' ' } else { c }).collect();
    let count = flat.chars().count();
    flat.chars().skip(count.saturating_sub(n)).collect()
}

/// A registration's spec as it is stored and published, and its secret variables: the
/// values of `secrets` and of every `env` variable whose name looks secret, each left
/// in `env` as [`relay_protocol::domain::SECRET_SHOWN`].
fn split_secrets(spec: &AgentSpec) -> Result<(AgentSpec, BTreeMap<String, String>), BrokerError> {
    let mut spec = spec.clone();
    spec.move_secrets();
    let secrets = std::mem::take(&mut spec.secrets).0;
    for name in secrets.keys() {
        if name.is_empty() || name.len() > 256 || name.contains(['=', '\0']) {
            let shown: String = name.chars().take(64).collect();
            return Err(BrokerError::Invalid(format!(
                "secret variable name {shown:?} is not valid: 1 to 256 bytes, no '=' or NUL"
            )));
        }
    }
    Ok((spec, secrets))
}
