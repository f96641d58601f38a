//! sled storage: the append-only event log and one tree per projection.
//!
//! Over 600 lines, whole for now: keys, projections, queries and the doctor check all
//! read the same trees through one handle; issue 24 splits it by concern.
//!
//! Layout (every value starts with a version byte, then JSON):
//! - `events`: global seq (u64 big-endian) -> [`Event`]
//! - `agents`: name -> [`Agent`]
//! - `conversations`: id -> [`Conversation`]
//! - `messages`: conversation id, 0, index (u64 BE) -> [`Message`]
//! - `message_ids`: message id -> key in `messages`
//! - `invocations`, `flights`, `deliveries`, `approvals`, `bindings`: id -> record
//! - `flight_updates`: flight id, 0, per-flight seq (u64 BE) -> [`FlightUpdate`]
//! - `flight_children` (an index): parent flight id, 0, child flight id -> nothing
//! - `replay_index`: scope letter + id, 0, global seq (u64 BE) -> nothing: the events a
//!   replay of an agent (`a`), a conversation (`c`) or a flight (`f`) reads besides the
//!   flight's updates ([`Scope`], [`replay_scopes`]). Deltas are not in it: a flight's
//!   updates are read from `flight_updates`, which holds each one's global seq.
//!
//! Projections are written only by [`apply`], both when a batch commits and when
//! [`Store::verify`] rebuilds them from the log, so the two cannot drift apart.
//!
//! Who touches sled, and where (see [`relay_infra::storage`] for why):
//! - Transactions and flushes run only on the process's storage thread: the broker's
//!   writer hands each batch over as one job ([`Store::durable`]).
//! - Reads from async code go through [`Store::read`], on the blocking pool. The plain
//!   getters below are for code already off the async workers.

use relay_infra::storage::{self, Durable};
use relay_protocol::domain::{
    Agent, Approval, Conversation, Delivery, Flight, FlightUpdate, Invocation, Message,
};
use relay_protocol::event::{Event, EventBody};
use serde::de::DeserializeOwned;
use serde::Serialize;
use sled::transaction::{ConflictableTransactionError, TransactionalTree};
use sled::Transactional;

use crate::error::BrokerError;

/// Version byte in front of every stored value.
const VALUE_VERSION: u8 = 1;

/// Projection trees, in the order [`Store::trees`] holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum T {
    Events = 0,
    Agents,
    Conversations,
    Messages,
    MessageIds,
    Invocations,
    Flights,
    FlightUpdates,
    Deliveries,
    Approvals,
    Bindings,
    /// flight id -> ids of its approvals, so a transaction can find them without a scan.
    FlightApprovals,
    /// node name -> stream seq of the last report applied (not a projection: it
    /// de-duplicates redelivered node reports, written with the command they carry).
    ReportCursors,
    /// agent name -> its secret variables (not a projection: never in an event, so
    /// never published nor replayed; deleted with the agent).
    Secrets,
    /// ids of the flights not yet ended (an index: live listings read it instead of
    /// every flight ever).
    LiveFlights,
    /// Markers of one-time work done on this database (not a projection).
    Meta,
    /// parent flight id, 0, child flight id -> nothing: the agent-to-agent tree of a
    /// flight without a scan (an index).
    FlightChildren,
    /// Where the events of an agent, a conversation or a flight are in the log (an
    /// index for replays: see the module docs).
    ReplayIndex,
}

const TREE_NAMES: [&str; 18] = [
    "events",
    "agents",
    "conversations",
    "messages",
    "message_ids",
    "invocations",
    "flights",
    "flight_updates",
    "deliveries",
    "approvals",
    "bindings",
    "flight_approvals",
    "report_cursors",
    "agent_secrets",
    "live_flights",
    "meta",
    "flight_children",
    "replay_index",
];

pub fn encode<V: Serialize>(v: &V) -> Result<Vec<u8>, BrokerError> {
    let mut out = Vec::with_capacity(256);
    out.push(VALUE_VERSION);
    serde_json::to_writer(&mut out, v)?;
    Ok(out)
}

pub fn decode<V: DeserializeOwned>(bytes: &[u8]) -> Result<V, BrokerError> {
    match bytes.split_first() {
        Some((&VALUE_VERSION, rest)) => Ok(serde_json::from_slice(rest)?),
        Some((v, _)) => Err(BrokerError::Corrupt(format!(
            "stored value has version {v}, this build reads {VALUE_VERSION}"
        ))),
        None => Err(BrokerError::Corrupt("empty stored value".into())),
    }
}

/// `a`, 0, `b`: a key of an index from one id to many.
pub fn pair_key(a: &str, b: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(a.len() + 1 + b.len());
    key.extend_from_slice(a.as_bytes());
    key.push(0);
    key.extend_from_slice(b.as_bytes());
    key
}

pub fn seq_key(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

/// `prefix`, 0, `n` big-endian: keys that sort by `n` within one prefix.
pub fn child_key(prefix: &str, n: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + 9);
    k.extend_from_slice(prefix.as_bytes());
    k.push(0);
    k.extend_from_slice(&n.to_be_bytes());
    k
}

fn child_prefix(prefix: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + 1);
    k.extend_from_slice(prefix.as_bytes());
    k.push(0);
    k
}

/// Where [`apply`] writes: the live transaction, or plain trees during a rebuild.
pub trait Sink {
    fn get(&self, tree: T, key: &[u8]) -> Result<Option<sled::IVec>, BrokerError>;
    fn put(&self, tree: T, key: &[u8], value: Vec<u8>) -> Result<(), BrokerError>;
    fn del(&self, tree: T, key: &[u8]) -> Result<(), BrokerError>;
}

/// What a replay reads the log by: one agent's, conversation's or flight's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Agent,
    Conversation,
    Flight,
}

impl Scope {
    fn key(self, id: &str, seq: u64) -> Vec<u8> {
        let letter = match self {
            Scope::Agent => 'a',
            Scope::Conversation => 'c',
            Scope::Flight => 'f',
        };
        child_key(&format!("{letter}{id}"), seq)
    }
}

/// The replay scopes an event belongs to: an agent's registrations, removals, lost
/// threads and flights; a conversation's messages and the flights asked in it; a
/// flight's creation and approvals. A flight's updates are not here (they are in
/// `flight_updates`, with their seq), so streaming text costs the index nothing.
pub fn replay_scopes(body: &EventBody) -> Vec<(Scope, &str)> {
    match body {
        EventBody::AgentRegistered { agent } => vec![(Scope::Agent, agent.spec.name.as_str())],
        EventBody::AgentRemoved { name, .. } => vec![(Scope::Agent, name.as_str())],
        EventBody::ThreadLost { agent, .. } => vec![(Scope::Agent, agent.as_str())],
        EventBody::MessagePosted { message, .. } => {
            vec![(Scope::Conversation, message.conversation.as_str())]
        }
        EventBody::InvocationCreated { invocation, flight } => vec![
            (Scope::Agent, flight.agent.as_str()),
            (Scope::Conversation, invocation.conversation.as_str()),
            (Scope::Flight, flight.id.as_str()),
        ],
        EventBody::ApprovalRequested { approval } | EventBody::ApprovalDecided { approval } => {
            vec![(Scope::Flight, approval.request.flight.as_str())]
        }
        EventBody::AgentUpdated { .. }
        | EventBody::ConversationCreated { .. }
        | EventBody::DeliveryPlanned { .. }
        | EventBody::DeliveryAttempted { .. }
        | EventBody::FlightUpdated { .. }
        | EventBody::BindingCreated { .. } => Vec::new(),
    }
}

/// Applies one event to the projections. Events carry the records they produce, so
/// applying is a set of puts and deletes, and applying twice changes nothing.
pub fn apply(sink: &dyn Sink, event: &Event) -> Result<(), BrokerError> {
    for (scope, id) in replay_scopes(&event.body) {
        sink.put(T::ReplayIndex, &scope.key(id, event.seq), Vec::new())?;
    }
    match &event.body {
        EventBody::AgentRegistered { agent } | EventBody::AgentUpdated { agent } => {
            sink.put(T::Agents, agent.spec.name.as_bytes(), encode(agent)?)
        }
        EventBody::AgentRemoved { name, .. } => sink.del(T::Agents, name.as_bytes()),
        EventBody::ThreadLost { .. } => Ok(()),
        EventBody::ConversationCreated { conversation } => sink.put(
            T::Conversations,
            conversation.spec.id.as_bytes(),
            encode(conversation)?,
        ),
        EventBody::MessagePosted {
            message,
            conversation,
        } => {
            let key = child_key(&message.conversation, message.index);
            sink.put(T::MessageIds, message.id.as_bytes(), key.clone())?;
            sink.put(T::Messages, &key, encode(message)?)?;
            sink.put(
                T::Conversations,
                conversation.spec.id.as_bytes(),
                encode(conversation)?,
            )
        }
        EventBody::DeliveryPlanned { delivery } | EventBody::DeliveryAttempted { delivery } => {
            sink.put(T::Deliveries, delivery.id.as_bytes(), encode(delivery)?)
        }
        EventBody::InvocationCreated { invocation, flight } => {
            sink.put(
                T::Invocations,
                invocation.id.as_bytes(),
                encode(invocation)?,
            )?;
            if !flight.state.is_terminal() {
                sink.put(T::LiveFlights, flight.id.as_bytes(), Vec::new())?;
            }
            if let Some(parent) = &flight.parent_flight {
                sink.put(T::FlightChildren, &pair_key(parent, &flight.id), Vec::new())?;
            }
            sink.put(T::Flights, flight.id.as_bytes(), encode(flight)?)
        }
        EventBody::FlightUpdated { update, flight } => {
            sink.put(
                T::FlightUpdates,
                &child_key(&update.flight, update.seq),
                encode(&StoredUpdate {
                    event_seq: event.seq,
                    update: update.clone(),
                })?,
            )?;
            // Only the change that ends a flight touches the index (never a delta).
            if matches!(
                update.change,
                relay_protocol::domain::FlightChange::State { .. }
            ) && flight.state.is_terminal()
            {
                sink.del(T::LiveFlights, flight.id.as_bytes())?;
            }
            sink.put(T::Flights, flight.id.as_bytes(), encode(flight)?)
        }
        EventBody::BindingCreated { binding } => {
            sink.put(T::Bindings, binding.id.as_bytes(), encode(binding)?)
        }
        EventBody::ApprovalRequested { approval } | EventBody::ApprovalDecided { approval } => {
            let flight = approval.request.flight.as_bytes();
            let mut ids: Vec<String> = match sink.get(T::FlightApprovals, flight)? {
                Some(v) => decode(&v)?,
                None => Vec::new(),
            };
            if !ids.contains(&approval.id) {
                ids.push(approval.id.clone());
                sink.put(T::FlightApprovals, flight, encode(&ids)?)?;
            }
            sink.put(T::Approvals, approval.id.as_bytes(), encode(approval)?)
        }
    }
}

/// The sled database and its trees. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    durable: Durable,
    trees: Vec<sled::Tree>,
}

impl Store {
    pub fn open(path: &std::path::Path) -> Result<Store, BrokerError> {
        let db = storage::config()
            .path(path)
            .mode(sled::Mode::HighThroughput)
            .open()
            .map_err(|e| match e {
                sled::Error::Io(io) if io.kind() == std::io::ErrorKind::WouldBlock => {
                    BrokerError::Locked(path.display().to_string())
                }
                sled::Error::Io(io) if io.to_string().contains("lock") => {
                    BrokerError::Locked(path.display().to_string())
                }
                other => BrokerError::Storage(other),
            })?;
        Self::with_db(db)
    }

    /// An in-memory store, for unit tests and rebuild checks.
    pub fn temporary() -> Result<Store, BrokerError> {
        Self::with_db(storage::config().temporary(true).open()?)
    }

    fn with_db(db: sled::Db) -> Result<Store, BrokerError> {
        let trees = TREE_NAMES
            .iter()
            .map(|n| db.open_tree(n))
            .collect::<Result<Vec<_>, _>>()?;
        let store = Store {
            durable: Durable::new(db),
            trees,
        };
        store.index_once(b"live_flights_indexed", Store::index_live_flights)?;
        store.index_once(b"flight_children_indexed", Store::index_flight_children)?;
        store.index_once(b"replay_indexed", Store::index_replays)?;
        Ok(store)
    }

    /// The agent-to-agent tree flight `id` belongs to, from its root; at most `limit`
    /// flights (deeper or later ones are left out).
    pub fn flight_tree(
        &self,
        id: &str,
        limit: usize,
    ) -> Result<relay_protocol::api::FlightTree, BrokerError> {
        let mut root = self
            .flight(id)?
            .ok_or_else(|| BrokerError::UnknownFlight(id.to_string()))?;
        // Parents are checked when an invocation is made, so the chain ends; the
        // bound only guards against a damaged store.
        for _ in 0..limit {
            match root.parent_flight.as_deref().map(|p| self.flight(p)) {
                Some(Ok(Some(parent))) => root = parent,
                Some(Err(e)) => return Err(e),
                _ => break,
            }
        }
        let mut budget = limit.saturating_sub(1);
        self.subtree(root, &mut budget)
    }

    fn subtree(
        &self,
        flight: Flight,
        budget: &mut usize,
    ) -> Result<relay_protocol::api::FlightTree, BrokerError> {
        let mut children = Vec::new();
        for child in self.children(&flight.id)? {
            if *budget == 0 {
                break;
            }
            *budget -= 1;
            children.push(self.subtree(child, budget)?);
        }
        Ok(relay_protocol::api::FlightTree { flight, children })
    }

    /// The flights asked from flight `id` (agent-to-agent), oldest first (the index's keys
    /// end in the child's time-ordered id).
    pub fn children(&self, id: &str) -> Result<Vec<Flight>, BrokerError> {
        let mut prefix = id.as_bytes().to_vec();
        prefix.push(0);
        let mut out = Vec::new();
        for key in self.tree(T::FlightChildren).scan_prefix(&prefix).keys() {
            let key = key?;
            if let Some(flight) = self.get::<Flight>(T::Flights, &key[prefix.len()..])? {
                out.push(flight);
            }
        }
        Ok(out)
    }

    /// Builds an index of a database made before it existed, once (the marker is made
    /// durable by the next flush; until then it is simply built again).
    fn index_once(
        &self,
        marker: &[u8],
        build: fn(&Store) -> Result<(), BrokerError>,
    ) -> Result<(), BrokerError> {
        if self.tree(T::Meta).contains_key(marker)? {
            return Ok(());
        }
        build(self)?;
        self.tree(T::Meta).insert(marker, Vec::<u8>::new())?;
        Ok(())
    }

    fn index_flight_children(&self) -> Result<(), BrokerError> {
        for value in self.tree(T::Flights).iter().values() {
            let flight: Flight = decode(&value?)?;
            if let Some(parent) = &flight.parent_flight {
                self.tree(T::FlightChildren)
                    .insert(pair_key(parent, &flight.id), Vec::<u8>::new())?;
            }
        }
        Ok(())
    }

    fn index_live_flights(&self) -> Result<(), BrokerError> {
        for value in self.tree(T::Flights).iter().values() {
            let flight: Flight = decode(&value?)?;
            if !flight.state.is_terminal() {
                self.tree(T::LiveFlights)
                    .insert(flight.id.as_bytes(), Vec::<u8>::new())?;
            }
        }
        Ok(())
    }

    /// One pass over the log (a database made before the replay index: once).
    fn index_replays(&self) -> Result<(), BrokerError> {
        for value in self.tree(T::Events).iter().values() {
            let event: Event = decode(&value?)?;
            for (scope, id) in replay_scopes(&event.body) {
                self.tree(T::ReplayIndex)
                    .insert(scope.key(id, event.seq), Vec::<u8>::new())?;
            }
        }
        Ok(())
    }

    /// The seqs of `scope`'s events (see [`replay_scopes`]) in `after+1 ..= upto`, in
    /// order; read from the index, not the log.
    pub fn replay_seqs(
        &self,
        scope: Scope,
        id: &str,
        after: u64,
        upto: u64,
    ) -> Result<Vec<u64>, BrokerError> {
        if after >= upto {
            return Ok(Vec::new());
        }
        self.tree(T::ReplayIndex)
            .range(scope.key(id, after + 1)..=scope.key(id, upto))
            .keys()
            .map(|k| {
                let k = k?;
                let tail = k
                    .len()
                    .checked_sub(8)
                    .and_then(|at| <[u8; 8]>::try_from(&k[at..]).ok())
                    .ok_or_else(|| BrokerError::Corrupt("replay index key too short".into()))?;
                Ok(u64::from_be_bytes(tail))
            })
            .collect()
    }

    /// The event with global seq `seq`.
    pub fn event(&self, seq: u64) -> Result<Option<Event>, BrokerError> {
        self.get(T::Events, &seq_key(seq))
    }

    /// The flights not yet ended, oldest first (from the index, not a scan).
    pub fn live_flights(&self) -> Result<Vec<Flight>, BrokerError> {
        let mut out = Vec::new();
        for key in self.tree(T::LiveFlights).iter().keys() {
            if let Some(flight) = self.get::<Flight>(T::Flights, &key?)? {
                out.push(flight);
            }
        }
        Ok(out)
    }

    /// The newest `limit` flights that `keep` accepts, oldest first: flight ids are
    /// time-ordered, so this reads from the newest and stops at `limit`.
    pub fn recent_flights(
        &self,
        limit: usize,
        keep: impl Fn(&Flight) -> bool,
    ) -> Result<Vec<Flight>, BrokerError> {
        let mut out = Vec::new();
        for value in self.tree(T::Flights).iter().values().rev() {
            if out.len() >= limit {
                break;
            }
            let flight: Flight = decode(&value?)?;
            if keep(&flight) {
                out.push(flight);
            }
        }
        out.reverse();
        Ok(out)
    }

    pub fn tree(&self, t: T) -> &sled::Tree {
        &self.trees[t as usize]
    }

    pub fn last_seq(&self) -> Result<u64, BrokerError> {
        Ok(match self.tree(T::Events).last()? {
            Some((k, _)) => u64::from_be_bytes(
                k.as_ref()
                    .try_into()
                    .map_err(|_| BrokerError::Corrupt("event key is not 8 bytes".into()))?,
            ),
            None => 0,
        })
    }

    /// Runs `f` in one transaction over every tree. `f` may be re-run by sled, so it must
    /// not have side effects outside the transaction.
    pub fn transaction<R>(
        &self,
        f: impl Fn(&Tx<'_>) -> Result<R, BrokerError>,
    ) -> Result<R, BrokerError> {
        self.trees
            .as_slice()
            .transaction(|trees| {
                f(&Tx { trees }).map_err(|e| match e {
                    // Let sled retry the whole closure, as it expects.
                    BrokerError::TxConflict => ConflictableTransactionError::Conflict,
                    e => ConflictableTransactionError::Abort(e),
                })
            })
            .map_err(|e| match e {
                sled::transaction::TransactionError::Abort(e) => e,
                sled::transaction::TransactionError::Storage(e) => BrokerError::Storage(e),
            })
    }

    /// The database as the storage thread writes and flushes it.
    pub fn durable(&self) -> &Durable {
        &self.durable
    }

    /// Waits until everything written so far is on disk.
    pub async fn flush(&self) -> Result<(), BrokerError> {
        Ok(self.durable.flush().await?)
    }

    /// How many flushes this store has made since it was opened.
    pub fn flushes(&self) -> u64 {
        self.durable.flushes()
    }

    /// Runs reads (point reads, scans) on the blocking pool, off the async workers.
    pub async fn read<R, F>(&self, f: F) -> Result<R, BrokerError>
    where
        F: FnOnce(&Store) -> Result<R, BrokerError> + Send + 'static,
        R: Send + 'static,
    {
        let store = self.clone();
        storage::read(move || f(&store)).await?
    }

    pub fn get<V: DeserializeOwned>(&self, t: T, key: &[u8]) -> Result<Option<V>, BrokerError> {
        self.tree(t).get(key)?.map(|v| decode(&v)).transpose()
    }

    pub fn values<V: DeserializeOwned>(&self, t: T) -> Result<Vec<V>, BrokerError> {
        self.tree(t).iter().values().map(|v| decode(&v?)).collect()
    }

    pub fn agent(&self, name: &str) -> Result<Option<Agent>, BrokerError> {
        self.get(T::Agents, name.as_bytes())
    }

    pub fn flight(&self, id: &str) -> Result<Option<Flight>, BrokerError> {
        self.get(T::Flights, id.as_bytes())
    }

    pub fn invocation(&self, id: &str) -> Result<Option<Invocation>, BrokerError> {
        self.get(T::Invocations, id.as_bytes())
    }

    pub fn conversation(&self, id: &str) -> Result<Option<Conversation>, BrokerError> {
        self.get(T::Conversations, id.as_bytes())
    }

    pub fn approval(&self, id: &str) -> Result<Option<Approval>, BrokerError> {
        self.get(T::Approvals, id.as_bytes())
    }

    pub fn deliveries(&self) -> Result<Vec<Delivery>, BrokerError> {
        self.values(T::Deliveries)
    }

    /// The last `n` messages of a conversation, oldest first.
    pub fn messages(&self, conversation: &str, n: usize) -> Result<Vec<Message>, BrokerError> {
        let mut out = self
            .tree(T::Messages)
            .scan_prefix(child_prefix(conversation))
            .values()
            .rev()
            .take(n)
            .map(|v| decode(&v?))
            .collect::<Result<Vec<Message>, _>>()?;
        out.reverse();
        Ok(out)
    }

    pub fn message(&self, id: &str) -> Result<Option<Message>, BrokerError> {
        match self.tree(T::MessageIds).get(id.as_bytes())? {
            Some(key) => self.get(T::Messages, &key),
            None => Ok(None),
        }
    }

    /// Updates of a flight with per-flight seq greater than `after`, in order.
    pub fn flight_updates(
        &self,
        flight: &str,
        after: u64,
    ) -> Result<Vec<FlightUpdate>, BrokerError> {
        Ok(self
            .stored_updates(flight, after)?
            .into_iter()
            .map(|s| s.update)
            .collect())
    }

    /// Like [`Store::flight_updates`], with the global seq of each update's event.
    pub fn stored_updates(
        &self,
        flight: &str,
        after: u64,
    ) -> Result<Vec<StoredUpdate>, BrokerError> {
        self.tree(T::FlightUpdates)
            .range(child_key(flight, after.saturating_add(1))..=child_key(flight, u64::MAX))
            .values()
            .map(|v| decode(&v?))
            .collect()
    }

    /// The last update of a flight whose event's global seq is at most `upto`.
    pub fn last_stored_update(
        &self,
        flight: &str,
        upto: u64,
    ) -> Result<Option<StoredUpdate>, BrokerError> {
        for value in self
            .tree(T::FlightUpdates)
            .range(child_key(flight, 0)..=child_key(flight, u64::MAX))
            .values()
            .rev()
        {
            let stored: StoredUpdate = decode(&value?)?;
            if stored.event_seq <= upto {
                return Ok(Some(stored));
            }
        }
        Ok(None)
    }

    /// Events with global seq greater than `after`, at most `limit` of them.
    pub fn events_after(&self, after: u64, limit: usize) -> Result<Vec<Event>, BrokerError> {
        self.tree(T::Events)
            .range(seq_key(after.saturating_add(1))..)
            .values()
            .take(limit)
            .map(|v| decode(&v?))
            .collect()
    }

    /// Rebuilds every projection from the event log into a scratch store and compares it
    /// with the live projections. Also checks that the log's sequence has no gaps.
    pub fn verify(&self) -> Result<VerifyReport, BrokerError> {
        let scratch = Store::temporary()?;
        let mut report = VerifyReport::default();
        let mut expected = 1u64;
        for v in self.tree(T::Events).iter().values() {
            let event: Event = decode(&v?)?;
            if event.seq != expected {
                report.gaps.push((expected, event.seq));
            }
            expected = event.seq + 1;
            report.events += 1;
            apply(&PlainSink(&scratch), &event)?;
        }
        for t in TREES_PROJECTED {
            let (live, rebuilt) = (self.tree(t), scratch.tree(t));
            let live_entries: Vec<_> = live.iter().collect::<Result<_, _>>()?;
            let rebuilt_entries: Vec<_> = rebuilt.iter().collect::<Result<_, _>>()?;
            if live_entries != rebuilt_entries {
                report
                    .mismatched_trees
                    .push(TREE_NAMES[t as usize].to_string());
            }
        }
        Ok(report)
    }
}

impl Store {
    /// [`Store::verify`] with what a person checking a data dir wants to see.
    pub fn doctor(&self) -> Result<DoctorReport, BrokerError> {
        let verify = self.verify()?;
        let (flights, live_flights) = self.flight_counts()?;
        Ok(DoctorReport {
            consistent: verify.is_consistent(),
            events: verify.events,
            last_seq: self.last_seq()?,
            flights,
            live_flights,
            gaps: verify.gaps,
            mismatched_trees: verify.mismatched_trees,
        })
    }

    /// (flights, flights not in a terminal state), by a scan.
    pub fn flight_counts(&self) -> Result<(u64, u64), BrokerError> {
        // Counted by keys: nothing is decoded.
        Ok((
            self.tree(T::Flights).len() as u64,
            self.tree(T::LiveFlights).len() as u64,
        ))
    }
}

/// What `relay doctor` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct DoctorReport {
    /// No gap in the log, and every projection equals a rebuild from it.
    pub consistent: bool,
    pub events: u64,
    pub last_seq: u64,
    pub flights: u64,
    /// Flights not in a terminal state (a broker that starts resumes or fails them).
    pub live_flights: u64,
    /// (expected seq, found seq) wherever the log skips.
    pub gaps: Vec<(u64, u64)>,
    pub mismatched_trees: Vec<String>,
}

const TREES_PROJECTED: [T; 14] = [
    T::Agents,
    T::Conversations,
    T::Messages,
    T::MessageIds,
    T::Invocations,
    T::Flights,
    T::FlightUpdates,
    T::Deliveries,
    T::Approvals,
    T::Bindings,
    T::FlightApprovals,
    T::LiveFlights,
    T::FlightChildren,
    T::ReplayIndex,
];

/// A flight update as stored: with the global seq of the event that made it.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct StoredUpdate {
    pub event_seq: u64,
    pub update: FlightUpdate,
}

#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct VerifyReport {
    pub events: u64,
    /// (expected seq, found seq) wherever the log skips.
    pub gaps: Vec<(u64, u64)>,
    /// Projections that differ from a rebuild from the log.
    pub mismatched_trees: Vec<String>,
}

impl VerifyReport {
    pub fn is_consistent(&self) -> bool {
        self.gaps.is_empty() && self.mismatched_trees.is_empty()
    }
}

/// A view of every tree inside one transaction.
pub struct Tx<'a> {
    trees: &'a [TransactionalTree],
}

impl Tx<'_> {
    pub fn read<V: DeserializeOwned>(&self, t: T, key: &[u8]) -> Result<Option<V>, BrokerError> {
        self.trees[t as usize]
            .get(key)
            .map_err(unabortable)?
            .map(|v| decode(&v))
            .transpose()
    }

    pub fn contains(&self, t: T, key: &[u8]) -> Result<bool, BrokerError> {
        Ok(self.trees[t as usize]
            .get(key)
            .map_err(unabortable)?
            .is_some())
    }
}

fn unabortable(e: sled::transaction::UnabortableTransactionError) -> BrokerError {
    match e {
        sled::transaction::UnabortableTransactionError::Storage(e) => BrokerError::Storage(e),
        sled::transaction::UnabortableTransactionError::Conflict => BrokerError::TxConflict,
    }
}

impl Sink for Tx<'_> {
    fn get(&self, tree: T, key: &[u8]) -> Result<Option<sled::IVec>, BrokerError> {
        self.trees[tree as usize].get(key).map_err(unabortable)
    }
    fn put(&self, tree: T, key: &[u8], value: Vec<u8>) -> Result<(), BrokerError> {
        self.trees[tree as usize]
            .insert(key, value)
            .map_err(unabortable)?;
        Ok(())
    }
    fn del(&self, tree: T, key: &[u8]) -> Result<(), BrokerError> {
        self.trees[tree as usize].remove(key).map_err(unabortable)?;
        Ok(())
    }
}

struct PlainSink<'a>(&'a Store);

impl Sink for PlainSink<'_> {
    fn get(&self, tree: T, key: &[u8]) -> Result<Option<sled::IVec>, BrokerError> {
        Ok(self.0.tree(tree).get(key)?)
    }
    fn put(&self, tree: T, key: &[u8], value: Vec<u8>) -> Result<(), BrokerError> {
        self.0.tree(tree).insert(key, value)?;
        Ok(())
    }
    fn del(&self, tree: T, key: &[u8]) -> Result<(), BrokerError> {
        self.0.tree(tree).remove(key)?;
        Ok(())
    }
}
