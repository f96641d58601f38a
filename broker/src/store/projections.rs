//! Events applied to the projections ([`apply`], the only writer of them, live and in a
//! rebuild), the sinks it writes through, and the indexes built once for a database made
//! before they existed.

use relay_protocol::domain::{
    decider, Approval, ApprovalState, Flight, FlightChange, FlightUpdate, Rule,
};
use relay_protocol::event::{Event, EventBody};
use serde::Serialize;

use super::heads::record_lags;
use super::keys::{
    child_key, decode, encode, last_message_key, last_message_value, message_id_seq, pair_key,
    pair_value, parse_pair, seq_key, Scope, T,
};
use super::log::Pos;
use super::shared::{
    decode_event, decode_flight_without_output, encode_flight, FLIGHT_OUTPUT_IN_LOG, SHARED_MIN,
};
use super::{Store, Tx};
use crate::error::BrokerError;

/// `event_pos` holds the position of one event in this many (the others are found from
/// it by their headers: [`EventLog::find`](super::log::EventLog::find)). A key per event
/// was a sled write per streamed delta, and memory sled keeps for each.
pub const EVENT_POS_EVERY: u64 = 16;

/// Where [`apply`] writes: the writer's batch, or plain trees during a rebuild.
pub trait Sink {
    fn get(&self, tree: T, key: &[u8]) -> Result<Option<sled::IVec>, BrokerError>;
    fn put(&self, tree: T, key: &[u8], value: Vec<u8>) -> Result<(), BrokerError>;
    fn del(&self, tree: T, key: &[u8]) -> Result<(), BrokerError>;
    /// `flight` changed, and its record is left as it is (see `heads`). Only the
    /// writer's batch keeps the newest state; a rebuild has no reader to give it.
    fn lag(&self, _flight: &Flight) {}
    /// Conversation `id` has `count` messages now (see `counts`). Only the writer's
    /// batch keeps it; a rebuild has no reader to give it.
    fn count(&self, _id: &str, _count: u64) {}
    /// Counters are about to move by what `key` of `tree` holds now: a batch that a
    /// crash cuts short puts it back with them (see `direct`).
    fn moves_from(&self, _tree: T, _key: &[u8]) {}
}

/// The replay scopes an event belongs to: an agent's registrations, removals, lost
/// threads and flights; the flights asked in a conversation; a flight's creation and
/// approvals. A flight's updates are not here (they are in `flight_updates`, with their
/// seq), so streaming text costs the index nothing; nor a conversation's messages (a
/// chain through the log from its last: [`Store::message_seqs`]), so a posted message
/// costs it nothing either.
pub fn replay_scopes(body: &EventBody) -> Vec<(Scope, &str)> {
    match body {
        EventBody::AgentRegistered { agent } => vec![(Scope::Agent, agent.spec.name.as_str())],
        EventBody::AgentRemoved { name, .. } => vec![(Scope::Agent, name.as_str())],
        EventBody::ThreadLost { agent, .. } => vec![(Scope::Agent, agent.as_str())],
        EventBody::InvocationCreated { invocation, flight } => vec![
            (Scope::Agent, flight.agent.as_str()),
            (Scope::Conversation, invocation.conversation.as_str()),
            (Scope::Flight, flight.id.as_str()),
        ],
        EventBody::ApprovalRequested { approval } | EventBody::ApprovalDecided { approval } => {
            vec![(Scope::Flight, approval.request.flight.as_str())]
        }
        EventBody::AgentUpdated { .. }
        | EventBody::RuleAdded { .. }
        | EventBody::RuleRemoved { .. }
        | EventBody::ConversationCreated { .. }
        | EventBody::MessagePosted { .. }
        | EventBody::DeliveryPlanned { .. }
        | EventBody::DeliveryAttempted { .. }
        | EventBody::FlightUpdated { .. }
        | EventBody::BindingCreated { .. } => Vec::new(),
    }
}

/// Applies one event, at position `pos` of the log, to the projections (`linked`: its
/// record links to an earlier one, [`Link`](super::log::Link)). Events carry the records
/// they produce, so applying is a set of puts and deletes, and applying twice changes
/// nothing, except for the counters it moves (usage, a rule's matches: see
/// [`Sink::moves_from`] and `direct`).
pub fn apply(sink: &dyn Sink, event: &Event, pos: Pos, linked: bool) -> Result<(), BrokerError> {
    if event.seq.is_multiple_of(EVENT_POS_EVERY) {
        sink.put(T::EventPos, &seq_key(event.seq), pos.to_be_bytes().to_vec())?;
    }
    for (scope, id) in replay_scopes(&event.body) {
        sink.put(T::ReplayIndex, &scope.key(id, event.seq), Vec::new())?;
    }
    match &event.body {
        EventBody::AgentRegistered { agent } | EventBody::AgentUpdated { agent } => {
            sink.put(T::Agents, agent.spec.name.as_bytes(), encode(agent)?)
        }
        EventBody::AgentRemoved { name, .. } => sink.del(T::Agents, name.as_bytes()),
        EventBody::ThreadLost { .. } => Ok(()),
        EventBody::ConversationCreated { conversation } => {
            sink.count(&conversation.spec.id, conversation.message_count);
            sink.put(
                T::Conversations,
                conversation.spec.id.as_bytes(),
                encode(conversation)?,
            )
        }
        EventBody::MessagePosted { message, .. } => {
            // The message itself is stored once, in the log; its conversation's count
            // is its index plus one (see `counts`), not written to the record.
            sink.count(&message.conversation, message.index.saturating_add(1));
            let key = child_key(&message.conversation, message.index);
            // An id that carries its event's seq is found by it (see `message_id`); any
            // other by `message_ids`, which names the message's key.
            let by_seq = message_id_seq(&message.id) == Some(event.seq);
            if !by_seq {
                sink.put(T::MessageIds, message.id.as_bytes(), key.clone())?;
            }
            // A linked record is found from the one after it (see `counts::walk_back`):
            // a key only for the first of a chain (and for one `message_ids` names).
            if !linked || !by_seq {
                sink.put(T::Messages, &key, pair_value(event.seq, pos).to_vec())?;
            }
            sink.put(
                T::Messages,
                &last_message_key(&message.conversation),
                last_message_value(event.seq, pos, message.index),
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
                pair_value(event.seq, pos).to_vec(),
            )?;
            // Only the change that ends a flight touches the index (never a delta).
            if matches!(update.change, FlightChange::State { .. }) && flight.state.is_terminal() {
                sink.del(T::LiveFlights, flight.id.as_bytes())?;
            }
            // The usage counters move by what this update changed of the flight's usage
            // (its record before it is still stored here).
            if matches!(update.change, FlightChange::Usage(_)) {
                sink.moves_from(T::Flights, flight.id.as_bytes());
                let previous: Option<Flight> = match sink.get(T::Flights, flight.id.as_bytes())? {
                    Some(v) => Some(decode_flight_without_output(&v)?),
                    None => None,
                };
                super::usage::fold(sink, previous.as_ref(), flight)?;
            }
            // A completion's output is kept once, in the log, with the update.
            let completed = match &update.change {
                FlightChange::State {
                    output: Some(output),
                    ..
                } if flight.output.as_ref() == Some(output) => Some((event.seq, pos)),
                _ => None,
            };
            if record_lags(update, flight) {
                sink.lag(flight);
                return Ok(());
            }
            sink.put(
                T::Flights,
                flight.id.as_bytes(),
                encode_flight(flight, completed)?,
            )
        }
        EventBody::RuleAdded { rule } => sink.put(T::Rules, rule.id.as_bytes(), encode(rule)?),
        EventBody::RuleRemoved { rule, .. } => sink.del(T::Rules, rule.id.as_bytes()),
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
            count_rule_match(sink, approval, event.at)?;
            sink.put(T::Approvals, approval.id.as_bytes(), encode(approval)?)
        }
    }
}

/// A decision made by remembered rule `rule:<id>` counts as one match of that rule (the
/// fold of the log: a rebuild counts the same). A rule removed meanwhile (its decision
/// was on its way when it went) counts nowhere.
fn count_rule_match(sink: &dyn Sink, approval: &Approval, at: u64) -> Result<(), BrokerError> {
    if approval.state != ApprovalState::Decided {
        return Ok(());
    }
    let Some(id) = approval
        .decided_by
        .as_deref()
        .and_then(|by| by.strip_prefix(decider::RULE))
    else {
        return Ok(());
    };
    let Some(stored) = sink.get(T::Rules, id.as_bytes())? else {
        return Ok(());
    };
    let mut rule: Rule = decode(&stored)?;
    rule.matched += 1;
    rule.last_matched_at = Some(approval.decided_at.unwrap_or(at));
    sink.put(T::Rules, id.as_bytes(), encode(&rule)?)
}

/// A flight update as read back: with the global seq of the event that made it.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct StoredUpdate {
    pub event_seq: u64,
    pub update: FlightUpdate,
}

impl Sink for Tx<'_> {
    fn get(&self, tree: T, key: &[u8]) -> Result<Option<sled::IVec>, BrokerError> {
        self.trees.get(tree, key)
    }
    fn put(&self, tree: T, key: &[u8], value: Vec<u8>) -> Result<(), BrokerError> {
        self.outside_log(tree);
        if matches!(tree, T::Flights) {
            // The record is the flight again.
            self.set_head(&String::from_utf8_lossy(key), None);
        }
        self.trees.write(tree, key, Some(value.into()));
        Ok(())
    }
    fn lag(&self, flight: &Flight) {
        self.set_head(&flight.id, Some(flight.clone()));
    }
    fn count(&self, id: &str, count: u64) {
        self.set_count(id, count);
    }
    fn del(&self, tree: T, key: &[u8]) -> Result<(), BrokerError> {
        self.outside_log(tree);
        self.trees.write(tree, key, None);
        Ok(())
    }
    fn moves_from(&self, tree: T, key: &[u8]) {
        Sink::moves_from(self.trees, tree, key);
    }
}

impl Tx<'_> {
    /// A write to state the log does not hold (see the module header of `store`): the
    /// group commit must make sled itself durable.
    fn outside_log(&self, tree: T) {
        if matches!(tree, T::Secrets | T::ReportCursors) {
            self.durable.want_db_flush();
        }
    }
}

pub(super) struct PlainSink<'a>(pub(super) &'a Store);

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

impl Store {
    /// Builds each index a database made before it existed lacks (at open).
    pub(super) fn index_once_each(&self) -> Result<(), BrokerError> {
        self.index_once(b"live_flights_indexed", Store::index_live_flights)?;
        self.index_once(b"flight_children_indexed", Store::index_flight_children)?;
        self.index_once(b"replay_indexed", Store::index_replays)?;
        self.index_once(b"flight_outputs_in_log", Store::outputs_to_log)?;
        self.index_once(b"event_pos_sparse", Store::sparse_event_pos)?;
        self.index_once(b"messages_uncounted", Store::messages_uncounted)?;
        self.index_once(b"last_messages", Store::last_messages)
    }

    /// A store made before a conversation's messages were a chain through the log has a
    /// key per message in `messages` and none for its last, which `apply` now writes
    /// for every message: each conversation gets it, from its last message's key (what
    /// a rebuild from the log would write).
    fn last_messages(&self) -> Result<(), BrokerError> {
        let messages = self.tree(T::Messages);
        for id in self.tree(T::Conversations).iter().keys() {
            let id = String::from_utf8_lossy(&id?).into_owned();
            let Some((index, value)) = super::counts::last_key(messages, &id)? else {
                continue;
            };
            if index != u64::MAX {
                let (seq, pos) = parse_pair(&value)?;
                messages.insert(last_message_key(&id), last_message_value(seq, pos, index))?;
            }
        }
        Ok(())
    }

    /// A store made before a conversation's count was read from `messages` (`counts`)
    /// wrote the record again for each message, and indexed each message for replay:
    /// the records go back to the count they were created with and the messages leave
    /// the replay index (what a rebuild from the log would write).
    fn messages_uncounted(&self) -> Result<(), BrokerError> {
        let mut batch = sled::Batch::default();
        let mut n = 0usize;
        for kv in self.tree(T::Conversations).iter() {
            let (id, value) = kv?;
            let mut c: relay_protocol::domain::Conversation = decode(&value)?;
            if c.message_count != 0 {
                c.message_count = 0;
                self.tree(T::Conversations).insert(&id, encode(&c)?)?;
            }
            let id = String::from_utf8_lossy(&id);
            for seq in self.message_seqs(&id, 0, u64::MAX)? {
                batch.remove(Scope::Conversation.key(&id, seq));
                n += 1;
                if n == 100_000 {
                    self.tree(T::ReplayIndex)
                        .apply_batch(std::mem::take(&mut batch))?;
                    n = 0;
                }
            }
        }
        self.tree(T::ReplayIndex).apply_batch(batch)?;
        Ok(())
    }

    /// A store made before `event_pos` held one event in [`EVENT_POS_EVERY`] has a key
    /// for each: the others go (what a rebuild from the log would write).
    fn sparse_event_pos(&self) -> Result<(), BrokerError> {
        let tree = self.tree(T::EventPos);
        let mut batch = sled::Batch::default();
        let mut n = 0usize;
        for key in tree.iter().keys() {
            let key = key?;
            // A key that is not a seq was never looked up: it goes too.
            let seq = <[u8; 8]>::try_from(&key[..]).map_or(1, u64::from_be_bytes);
            if !seq.is_multiple_of(EVENT_POS_EVERY) {
                batch.remove(key);
                n += 1;
            }
            if n == 100_000 {
                tree.apply_batch(std::mem::take(&mut batch))?;
                n = 0;
            }
        }
        tree.apply_batch(batch)?;
        Ok(())
    }

    /// A store made before answers were stored once keeps a copy of each completed
    /// flight's output in its record: the record now reads it from its completion, as
    /// [`apply`] writes it (a flight whose last update is the completion with that
    /// output).
    fn outputs_to_log(&self) -> Result<(), BrokerError> {
        for kv in self.tree(T::Flights).iter() {
            let (id, value) = kv?;
            if value.first() == Some(&FLIGHT_OUTPUT_IN_LOG) {
                continue;
            }
            let flight: Flight = decode(&value)?;
            let Some(output) = flight.output.as_deref().filter(|o| o.len() >= SHARED_MIN) else {
                continue;
            };
            let mut prefix = id.to_vec();
            prefix.push(0);
            let Some(last) = self
                .tree(T::FlightUpdates)
                .scan_prefix(&prefix)
                .values()
                .next_back()
            else {
                continue;
            };
            let (seq, pos) = parse_pair(&last?)?;
            let Some(stored) = super::queries::update_at(self.log(), seq, pos, false)? else {
                continue;
            };
            if matches!(&stored.update.change, FlightChange::State { output: Some(o), .. } if o == output)
            {
                self.tree(T::Flights)
                    .insert(&id, encode_flight(&flight, Some((seq, pos)))?)?;
            }
        }
        Ok(())
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
            let flight = decode_flight_without_output(&value?)?;
            if let Some(parent) = &flight.parent_flight {
                self.tree(T::FlightChildren)
                    .insert(pair_key(parent, &flight.id), Vec::<u8>::new())?;
            }
        }
        Ok(())
    }

    fn index_live_flights(&self) -> Result<(), BrokerError> {
        for value in self.tree(T::Flights).iter().values() {
            let flight = decode_flight_without_output(&value?)?;
            if !flight.state.is_terminal() {
                self.tree(T::LiveFlights)
                    .insert(flight.id.as_bytes(), Vec::<u8>::new())?;
            }
        }
        Ok(())
    }

    /// One pass over the log (a database made before the replay index: once).
    fn index_replays(&self) -> Result<(), BrokerError> {
        self.log().scan(0, |record| {
            let event: Event = decode_event(self.log(), &record.payload)?;
            for (scope, id) in replay_scopes(&event.body) {
                self.tree(T::ReplayIndex)
                    .insert(scope.key(id, event.seq), Vec::<u8>::new())?;
            }
            Ok::<_, BrokerError>(true)
        })
    }
}
