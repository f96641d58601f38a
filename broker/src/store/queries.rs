//! Reads of the records back: by id, a conversation's messages, a flight's updates and
//! tree, the live and recent flights, the log from a seq and a replay's seqs. Plain
//! getters: async code calls them inside [`Store::read`].

use std::sync::Arc;

use relay_protocol::domain::{
    Agent, Approval, Delivery, Flight, FlightUpdate, Invocation, Message, Rule,
};
use relay_protocol::event::Event;

use super::counts::walk_back;
use super::keys::{child_key, message_id_seq, parse_pair, parse_u64, seq_key, Scope, T};
use super::log::{EventLog, Pos};
use super::posted::may_be_posted;
use super::projections::{StoredUpdate, EVENT_POS_EVERY};
use super::published::Published;
use super::shared::{decode_event, decode_flight, decode_record, decode_update};
use super::Store;
use crate::error::BrokerError;

impl Store {
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
            if let Some(flight) = self.flight_at(&key[prefix.len()..])? {
                out.push(flight);
            }
        }
        Ok(out)
    }

    /// The seqs of `scope`'s events (see [`replay_scopes`](super::replay_scopes)) in `after+1 ..= upto`, in
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

    /// The seqs of the events that posted conversation `id`'s messages, in `after+1 ..=
    /// upto`, in order: walked back from its last message to the first at or before
    /// `after` (their seqs grow with their indexes), so a replay from a late seq reads
    /// only what follows it.
    pub fn message_seqs(&self, id: &str, after: u64, upto: u64) -> Result<Vec<u64>, BrokerError> {
        let mut seqs = Vec::new();
        walk_back(self.tree(T::Messages), self.log(), id, |seq, _| {
            if seq > after && seq <= upto {
                seqs.push(seq);
            }
            Ok(seq > after)
        })?;
        seqs.reverse();
        Ok(seqs)
    }

    /// The event with global seq `seq` (once it is on disk).
    pub fn event(&self, seq: u64) -> Result<Option<Event>, BrokerError> {
        match self.event_pos(seq)? {
            None => Ok(None),
            Some(pos) => self.event_at(pos),
        }
    }

    /// Where event `seq` is in the log: from the nearest event at or before it that
    /// `event_pos` holds (one in [`EVENT_POS_EVERY`](super::projections::EVENT_POS_EVERY)), a walk of at most that many
    /// records' headers.
    fn event_pos(&self, seq: u64) -> Result<Option<Pos>, BrokerError> {
        if seq == 0 {
            return Ok(None); // seqs start at 1
        }
        let (from_seq, from) = match self
            .tree(T::EventPos)
            .range(..=seq_key(seq))
            .next_back()
            .transpose()?
        {
            Some((k, v)) => (parse_u64(&k)?, parse_u64(&v)?),
            None => (0, self.log().start()?),
        };
        if from_seq == seq {
            return Ok(Some(from));
        }
        Ok(self.log().find(from, seq)?)
    }

    /// The event at position `pos` of the log (`None`: not synced yet).
    fn event_at(&self, pos: Pos) -> Result<Option<Event>, BrokerError> {
        self.log()
            .read(pos)?
            .map(|r| decode_event(self.log(), &r.payload))
            .transpose()
    }

    /// The flights not yet ended, oldest first (from the index, not a scan).
    pub fn live_flights(&self) -> Result<Vec<Flight>, BrokerError> {
        self.live_flights_where(|_| true)
    }

    /// The live flights `keep` accepts, judged on their records before the updates after
    /// them are folded on (see `heads`: those change no id, agent or state), so only
    /// those kept are folded.
    pub fn live_flights_where(
        &self,
        keep: impl Fn(&Flight) -> bool,
    ) -> Result<Vec<Flight>, BrokerError> {
        let mut out = Vec::new();
        for key in self.tree(T::LiveFlights).iter().keys() {
            let Some(v) = self.tree(T::Flights).get(key?)? else {
                continue;
            };
            let record = decode_flight(self.log(), &v)?;
            if keep(&record) {
                out.push(self.current(record)?);
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
        let scan = FlightScan {
            limit,
            since: None,
            max_read: usize::MAX,
        };
        self.scan_flights(&scan, |f| Ok(keep(f)))
    }

    /// The newest `scan.limit` flights that `keep` accepts, oldest first, read from the
    /// newest back: no further back than the flights created a minute before
    /// `scan.since` (a flight's id and its `created_at` are read from one clock within
    /// a batch; the minute covers a batch and a small step of that clock), and no more
    /// than `scan.max_read` flights in all.
    pub fn scan_flights(
        &self,
        scan: &FlightScan,
        mut keep: impl FnMut(&Flight) -> Result<bool, BrokerError>,
    ) -> Result<Vec<Flight>, BrokerError> {
        let mut out = Vec::new();
        let floor = scan.since.map(|s| s.saturating_sub(60_000));
        for value in self
            .tree(T::Flights)
            .iter()
            .values()
            .rev()
            .take(scan.max_read)
        {
            if out.len() >= scan.limit {
                break;
            }
            let flight = self.current(decode_flight(self.log(), &value?)?)?;
            if floor.is_some_and(|floor| flight.created_at < floor) {
                break;
            }
            if scan.since.is_none_or(|s| flight.created_at >= s) && keep(&flight)? {
                out.push(flight);
            }
        }
        out.reverse();
        Ok(out)
    }

    pub fn agent(&self, name: &str) -> Result<Option<Agent>, BrokerError> {
        self.get(T::Agents, name.as_bytes())
    }

    pub fn flight(&self, id: &str) -> Result<Option<Flight>, BrokerError> {
        self.flight_at(id.as_bytes())
    }

    /// The flight stored at `key` of `flights`, its output read from the log where it
    /// is kept there.
    /// (Its deltas after the record folded on: see `heads`.)
    fn flight_at(&self, key: &[u8]) -> Result<Option<Flight>, BrokerError> {
        self.tree(T::Flights)
            .get(key)?
            .map(|v| self.current(decode_flight(self.log(), &v)?))
            .transpose()
    }

    /// The flight's record as it is stored (see `heads`: it may lag behind the
    /// flight's last deltas).
    pub(super) fn flight_record(&self, id: &str) -> Result<Option<Flight>, BrokerError> {
        self.tree(T::Flights)
            .get(id.as_bytes())?
            .map(|v| decode_flight(self.log(), &v))
            .transpose()
    }

    pub fn invocation(&self, id: &str) -> Result<Option<Invocation>, BrokerError> {
        self.get(T::Invocations, id.as_bytes())
    }

    /// Whether agent `me` runs `flight` or asked for it: what an agent's token reads of
    /// the flights (their list, their usage) and of their trees.
    pub fn runs_or_asked(&self, flight: &Flight, me: &str) -> Result<bool, BrokerError> {
        if flight.agent == me {
            return Ok(true);
        }
        Ok(self
            .invocation(&flight.invocation)?
            .is_some_and(|i| i.requester == me))
    }

    pub fn approval(&self, id: &str) -> Result<Option<Approval>, BrokerError> {
        self.get(T::Approvals, id.as_bytes())
    }

    pub fn rule(&self, id: &str) -> Result<Option<Rule>, BrokerError> {
        self.get(T::Rules, id.as_bytes())
    }

    /// Every remembered rule, oldest first.
    pub fn rules(&self) -> Result<Vec<Rule>, BrokerError> {
        let mut rules: Vec<Rule> = self.values(T::Rules)?;
        rules.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(rules)
    }

    pub fn deliveries(&self) -> Result<Vec<Delivery>, BrokerError> {
        self.values(T::Deliveries)
    }

    /// The last `n` messages of a conversation, oldest first (those on disk: a message
    /// committed but not yet synced is left out, as it is not published yet).
    pub fn messages(&self, conversation: &str, n: usize) -> Result<Vec<Message>, BrokerError> {
        let mut out = Vec::new();
        if n > 0 {
            walk_back(
                self.tree(T::Messages),
                self.log(),
                conversation,
                |seq, pos| {
                    if let Some(m) = message_at(self.log(), seq, pos, false)? {
                        out.push(m);
                    }
                    Ok(out.len() < n)
                },
            )?;
        }
        out.reverse();
        Ok(out)
    }

    pub fn message(&self, id: &str) -> Result<Option<Message>, BrokerError> {
        message_of_id(&|t, k| Ok(self.tree(t).get(k)?), self.log(), id, false)
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
        let mut out = Vec::new();
        for v in self
            .tree(T::FlightUpdates)
            .range(child_key(flight, after.saturating_add(1))..=child_key(flight, u64::MAX))
            .values()
        {
            let (seq, pos) = parse_pair(&v?)?;
            let update = match update_at(self.log(), seq, pos, false)? {
                Some(u) => Some(u),
                // Committed to sled, so shown by the flight's record already, but not
                // yet synced to the log: its group commit is syncing it (a reader
                // that got the flight as it ended must get the update that ended it).
                None => {
                    self.wait_on_disk(seq)?;
                    update_at(self.log(), seq, pos, false)?
                }
            };
            match update {
                Some(u) => out.push(u),
                None => break,
            }
        }
        Ok(out)
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
            let (seq, pos) = parse_pair(&value?)?;
            if seq <= upto {
                return update_at(self.log(), seq, pos, false);
            }
        }
        Ok(None)
    }

    /// Events with global seq greater than `after`, at most `limit` of them (those on
    /// disk), read from the log in one sequential pass, each with its JSON as the writer
    /// stored it (the record's payload, not encoded again): what subscribers are sent
    /// when they read the log back (catch-up, an event too large to be kept in memory).
    /// A large event (a long answer, one that refers to it) is decoded once for the
    /// readers that want it at the same time ([`super::published::ReadBack`]).
    pub fn published_after(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Arc<Published>>, BrokerError> {
        let Some(pos) = self.event_pos(after.saturating_add(1))? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        self.log().scan(pos, |record| {
            let (seq, stored) = (record.seq, bytes::Bytes::from(record.payload));
            out.push(self.read_back.get(seq, stored, |stored| {
                Published::from_stored(stored, self.log())
            })?);
            Ok::<_, BrokerError>(out.len() < limit)
        })?;
        Ok(out)
    }

    /// Events with global seq greater than `after`, at most `limit` of them (those on
    /// disk), read from the log in one sequential pass.
    pub fn events_after(&self, after: u64, limit: usize) -> Result<Vec<Event>, BrokerError> {
        Ok(self
            .published_after(after, limit)?
            .into_iter()
            .map(|p| Arc::unwrap_or_clone(p).event)
            .collect())
    }
}

/// How far [`Store::scan_flights`] reads back.
#[derive(Debug, Clone, Copy)]
pub struct FlightScan {
    /// Most flights it returns (the newest that match).
    pub limit: usize,
    /// Only flights created at or after this (ms since the epoch).
    pub since: Option<u64>,
    /// Most flights it reads, matching or not.
    pub max_read: usize,
}

/// The update that the event at `pos` made (only the update's part of it is decoded);
/// `None` while that is not on disk.
/// (`appended`: the writer's own read, synced or not; see [`EventLog::read_appended`].)
pub(super) fn update_at(
    log: &EventLog,
    event_seq: u64,
    pos: Pos,
    appended: bool,
) -> Result<Option<StoredUpdate>, BrokerError> {
    let record = if appended {
        log.read_appended(pos)?
    } else {
        log.read(pos)?
    };
    let Some(record) = record else {
        return Ok(None);
    };
    if record.seq != event_seq {
        return Err(BrokerError::Corrupt(format!(
            "flight update of event {event_seq} points at event {}",
            record.seq
        )));
    }
    Ok(Some(StoredUpdate {
        event_seq,
        update: decode_update(log, &record.payload)?,
    }))
}

/// A reader of one key of a tree: a batch's or the store's.
pub(super) type Get<'a> = dyn Fn(T, &[u8]) -> Result<Option<sled::IVec>, BrokerError> + 'a;

/// The message with id `id`: the one posted by the event at the seq its id carries
/// ([`message_id`](super::keys::message_id)), when that event posted this very id;
/// else, for a message posted before ids carried their seq, where `message_ids` says.
/// The event is found from the nearest `event_pos` key at or before it (a key for each
/// seq that is a multiple of [`EVENT_POS_EVERY`], so read as one key, not a range,
/// which a batch's view cannot), then a walk of at most that many headers.
/// `appended`: read what the writer appended but has not synced yet (its own reads).
pub(super) fn message_of_id(
    get: &Get<'_>,
    log: &EventLog,
    id: &str,
    appended: bool,
) -> Result<Option<Message>, BrokerError> {
    /// The message of a `message_posted` event; no other event has a `message`.
    #[derive(serde::Deserialize)]
    struct Posted {
        #[serde(default)]
        message: Option<Message>,
    }
    if let Some(seq) = message_id_seq(id).filter(|seq| *seq >= 1) {
        let floor = seq - seq % EVENT_POS_EVERY;
        let from = match floor {
            0 => Some(log.start()?),
            _ => get(T::EventPos, &seq_key(floor))?
                .map(|v| parse_u64(&v))
                .transpose()?,
        };
        let pos = match from {
            Some(from) if appended => log.find_appended(from, seq)?,
            Some(from) => log.find(from, seq)?,
            None => None,
        };
        let record = match pos {
            Some(pos) if appended => log.read_appended(pos)?,
            Some(pos) => log.read(pos)?,
            None => None,
        };
        if let Some(record) = record.filter(|r| may_be_posted(&r.payload)) {
            let posted: Posted = decode_record(log, &record.payload)?;
            if let Some(message) = posted.message.filter(|m| m.id == id) {
                return Ok(Some(message));
            }
        }
    }
    let Some(key) = get(T::MessageIds, id.as_bytes())? else {
        return Ok(None);
    };
    match get(T::Messages, &key)? {
        Some(v) => {
            let (seq, pos) = parse_pair(&v)?;
            message_at(log, seq, pos, appended)
        }
        None => Ok(None),
    }
}

/// The message that the `message_posted` event `event_seq` at `pos` posted (only the
/// message's part of it is decoded); `None` while that is not readable. `appended`: read
/// what is appended though not yet synced (the writer's own reads, on the storage thread).
pub(super) fn message_at(
    log: &EventLog,
    event_seq: u64,
    pos: Pos,
    appended: bool,
) -> Result<Option<Message>, BrokerError> {
    /// The part of a `message_posted` event a message's reader needs.
    #[derive(serde::Deserialize)]
    struct MessageOf {
        message: Message,
    }
    let record = if appended {
        log.read_appended(pos)?
    } else {
        log.read(pos)?
    };
    let Some(record) = record else {
        return Ok(None);
    };
    if record.seq != event_seq {
        return Err(BrokerError::Corrupt(format!(
            "message of event {event_seq} points at event {}",
            record.seq
        )));
    }
    let of: MessageOf = decode_record(log, &record.payload)?;
    Ok(Some(of.message))
}
