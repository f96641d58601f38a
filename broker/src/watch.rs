//! Snapshot, then follow: the state of a flight, an agent or a conversation valid at a
//! global event seq S, then every event of that scope with a seq above S, without a gap
//! or a duplicate. `GET /v1/watch` (SSE), `relay watch` and the NATS subject
//! `relay.v1.cmd.snapshot` are built on it.
//!
//! ## Why a snapshot is exact
//!
//! A snapshot must be "the scope after every event <= S, and nothing after". Two things
//! stand in the way. The writer commits a batch, then flushes, then publishes, so the
//! projections can already hold events that [`Broker::last_seq`] (the last published)
//! does not cover. And a read of several records is not atomic: sled makes each single
//! read atomic against a commit, but a scan takes its lock per step, so a commit can land
//! between two records of one snapshot.
//!
//! So [`snapshot`] reads, then rolls forward over the log (one read closure, on the
//! blocking pool):
//!
//! 1. `from` = the last seq on disk in the log. Every event <= `from` is committed, so
//!    the projections read next hold at least that.
//! 2. Read the scope's records from the projections. Each is the value of that key at
//!    some moment of the read, so its event is > `from` or it did not change since.
//! 3. `to` = the last seq committed to the projections now, after the read (sled keeps
//!    it with them: [`Store::committed_seq`]): every record read is at or before it.
//!    The log is synced just after a batch goes into sled, so wait until `to` is on
//!    disk there.
//! 4. Apply the scope's events in (`from`, `to`] from the log, in order, on top. Events
//!    carry the records they produce, so applying one sets each record it touches to
//!    its value after it (applying one the read already saw changes nothing). A record
//!    no event in (`from`, `to`] touched did not change during the read, so the read
//!    has its value at `to`. Lists (a flight's updates, a conversation's messages) only
//!    grow at their end, so a scan of one is a prefix and the events extend it.
//!
//! The result is exactly the scope after the events <= `to`, and S = `to`. [`watch`]
//! then waits until S is published (flushed: nothing a crash could undo is shown), and
//! follows [`crate::feed::Feed`] from S, keeping the events of the scope ([`matches`]).
//! The feed starts strictly after S and is itself gap-free and duplicate-free, so a
//! watcher sees each event of its scope exactly once: in the snapshot or in the follow.

use std::sync::Arc;

use relay_protocol::domain::{Agent, Approval, ApprovalState, Flight, FlightUpdate};
use relay_protocol::event::{Event, EventBody};
use relay_protocol::watch::{
    AgentView, ConversationView, FleetView, FlightView, Scope, Snapshot, View,
};
use tokio::sync::{broadcast, mpsc};

use crate::broker::{Broker, Published};
use crate::error::BrokerError;
use crate::store::{Store, T};

/// Events read from the log per step while rolling a snapshot forward.
const ROLL_PAGE: usize = 1024;

/// The snapshot of `scope`, exact at its seq (see the module docs). Blocking: run it in
/// [`Store::read`].
pub fn snapshot(store: &Store, scope: &Scope) -> Result<Snapshot, BrokerError> {
    let from = store.last_seq()?;
    let mut view = read_view(store, scope)?;
    // What the projections may hold: committed, if not yet on disk (the log is synced
    // after the batch), so wait for the log to have it to roll forward over it.
    let to = store.committed_seq()?;
    store.wait_on_disk(to)?;
    let mut cursor = from;
    while cursor < to {
        let page = store.events_after(cursor, ROLL_PAGE)?;
        let before = cursor;
        for event in page.iter().take_while(|e| e.seq <= to) {
            cursor = event.seq;
            if matches(scope, event) {
                apply(store, &mut view, event)?;
            }
        }
        if cursor == before {
            return Err(BrokerError::Corrupt(format!(
                "the log has no event after {cursor}, yet its last seq is {to}"
            )));
        }
    }
    // Messages posted during the read are appended: keep the last `limit`.
    if let (View::Conversation(v), Scope::Conversation { limit, .. }) = (&mut view, scope) {
        let extra = v.messages.len().saturating_sub(*limit);
        v.messages.drain(..extra);
    }
    Ok(Snapshot { seq: to, view })
}

/// The scope's records as the projections hold them now.
fn read_view(store: &Store, scope: &Scope) -> Result<View, BrokerError> {
    Ok(match scope {
        Scope::Fleet => {
            let mut agents: Vec<Agent> = store.values(T::Agents)?;
            agents.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
            let mut approvals: Vec<Approval> = store.values(T::Approvals)?;
            approvals.retain(|a| a.state == ApprovalState::Pending);
            approvals.sort_by(|a, b| a.id.cmp(&b.id));
            View::Fleet(FleetView {
                agents,
                flights: store.live_flights()?,
                approvals,
            })
        }
        Scope::Flight(id) => {
            let flight = store
                .flight(id)?
                .ok_or_else(|| BrokerError::UnknownFlight(id.clone()))?;
            View::Flight(flight_view(store, flight)?)
        }
        Scope::Agent(name) => {
            let agent = store
                .agent(name)?
                .ok_or_else(|| BrokerError::UnknownAgent(name.clone()))?;
            let flights = store
                .live_flights()?
                .into_iter()
                .filter(|f| f.agent == *name)
                .map(|f| flight_view(store, f))
                .collect::<Result<_, _>>()?;
            View::Agent(AgentView { agent, flights })
        }
        Scope::Conversation { id, limit } => {
            let conversation = store
                .conversation(id)?
                .ok_or_else(|| BrokerError::UnknownConversation(id.clone()))?;
            View::Conversation(ConversationView {
                conversation,
                messages: store.messages(id, *limit)?,
            })
        }
    })
}

/// A flight with its stored updates. Read after the flight, so the updates reach at
/// least its `update_seq`; any beyond are the roll's to explain.
fn flight_view(store: &Store, flight: Flight) -> Result<FlightView, BrokerError> {
    let updates = store.flight_updates(&flight.id, 0)?;
    Ok(FlightView { flight, updates })
}

/// Whether `event` belongs to `scope`: what a watcher of it follows.
pub fn matches(scope: &Scope, event: &Event) -> bool {
    use EventBody as B;
    match (scope, &event.body) {
        (Scope::Fleet, body) => matches!(
            body,
            B::AgentRegistered { .. }
                | B::AgentUpdated { .. }
                | B::AgentRemoved { .. }
                | B::ThreadLost { .. }
                | B::InvocationCreated { .. }
                | B::FlightUpdated { .. }
                | B::ApprovalRequested { .. }
                | B::ApprovalDecided { .. }
                // Not in the snapshot (`rule.list` reads them), but live: the
                // dashboard's Rules view follows them.
                | B::RuleAdded { .. }
                | B::RuleRemoved { .. }
        ),
        (Scope::Flight(id), B::FlightUpdated { update, .. }) => update.flight == *id,
        (Scope::Agent(name), body) => match body {
            B::AgentRegistered { agent } | B::AgentUpdated { agent } => agent.spec.name == *name,
            B::AgentRemoved { name: n, .. } => n == name,
            B::ThreadLost { agent, .. } => agent == name,
            B::InvocationCreated { flight, .. } => flight.agent == *name,
            B::FlightUpdated { update, .. } => update.agent == *name,
            _ => false,
        },
        (Scope::Conversation { id, .. }, B::MessagePosted { message, .. }) => {
            message.conversation == *id
        }
        _ => false,
    }
}

/// Applies one event of the view's scope: each record it carries replaces the one held,
/// an update or a message is appended unless already there.
fn apply(store: &Store, view: &mut View, event: &Event) -> Result<(), BrokerError> {
    use EventBody as B;
    match (view, &event.body) {
        (View::Fleet(v), body) => apply_fleet(v, body),
        (View::Flight(v), B::FlightUpdated { update, flight }) => {
            extend(v, update, flight);
        }
        (View::Agent(v), body) => match body {
            B::AgentRegistered { agent } | B::AgentUpdated { agent } => v.agent = agent.clone(),
            B::AgentRemoved { name, .. } => return Err(BrokerError::UnknownAgent(name.clone())),
            B::InvocationCreated { flight, .. }
                if !flight.state.is_terminal()
                    && !v.flights.iter().any(|f| f.flight.id == flight.id) =>
            {
                v.flights.push(FlightView {
                    flight: flight.clone(),
                    updates: Vec::new(),
                });
            }
            B::FlightUpdated { update, flight } => {
                match v.flights.iter().position(|f| f.flight.id == flight.id) {
                    Some(i) if flight.state.is_terminal() => {
                        v.flights.remove(i);
                    }
                    Some(i) => extend(&mut v.flights[i], update, flight),
                    // Live now, yet neither read nor created in the roll: it cannot be
                    // (it was live for the whole read), but if it were, read it whole.
                    None if !flight.state.is_terminal() => {
                        let mut updates = store.flight_updates(&flight.id, 0)?;
                        updates.retain(|u| u.seq <= update.seq);
                        v.flights.push(FlightView {
                            flight: flight.clone(),
                            updates,
                        });
                    }
                    None => {}
                }
                // Oldest first, as the live index lists them (ids are time-ordered).
                v.flights.sort_by(|a, b| a.flight.id.cmp(&b.flight.id));
            }
            _ => {}
        },
        (
            View::Conversation(v),
            B::MessagePosted {
                message,
                conversation,
            },
        ) => {
            match conversation {
                // A broker before 2026-11-29's event: the conversation after it.
                Some(c) => v.conversation = c.clone(),
                None => {
                    let count = &mut v.conversation.message_count;
                    *count = (*count).max(message.index.saturating_add(1));
                }
            }
            if v.messages.last().is_none_or(|m| m.index < message.index) {
                v.messages.push(message.clone());
            }
        }
        _ => {}
    }
    Ok(())
}

/// Applies one event to the fleet: each record it carries replaces the one held (by
/// key); a flight that ended and an approval decided or expired leave the view.
fn apply_fleet(v: &mut FleetView, body: &EventBody) {
    use EventBody as B;
    match body {
        B::AgentRegistered { agent } | B::AgentUpdated { agent } => {
            match v
                .agents
                .binary_search_by(|a| a.spec.name.cmp(&agent.spec.name))
            {
                Ok(i) => v.agents[i] = agent.clone(),
                Err(i) => v.agents.insert(i, agent.clone()),
            }
        }
        B::AgentRemoved { name, .. } => v.agents.retain(|a| a.spec.name != *name),
        B::InvocationCreated { flight, .. } | B::FlightUpdated { flight, .. } => {
            let at = v.flights.binary_search_by(|f| f.id.cmp(&flight.id));
            match (at, flight.state.is_terminal()) {
                (Ok(i), true) => {
                    v.flights.remove(i);
                }
                (Ok(i), false) => v.flights[i] = flight.clone(),
                (Err(i), false) => v.flights.insert(i, flight.clone()),
                (Err(_), true) => {}
            }
        }
        B::ApprovalRequested { approval } | B::ApprovalDecided { approval } => {
            let at = v.approvals.binary_search_by(|a| a.id.cmp(&approval.id));
            match (at, approval.state == ApprovalState::Pending) {
                (Ok(i), true) => v.approvals[i] = approval.clone(),
                (Ok(i), false) => {
                    v.approvals.remove(i);
                }
                (Err(i), true) => v.approvals.insert(i, approval.clone()),
                (Err(_), false) => {}
            }
        }
        _ => {}
    }
}

/// The flight after `update`, with `update` appended unless the read had it.
fn extend(v: &mut FlightView, update: &FlightUpdate, flight: &Flight) {
    v.flight = flight.clone();
    if v.updates.last().is_none_or(|u| u.seq < update.seq) {
        v.updates.push(update.clone());
    }
}

/// The snapshot of `scope`, and the events of the scope after it, live. For a flight the
/// events end after the update that makes it terminal (at once when it already is).
pub async fn watch(
    broker: &Broker,
    scope: Scope,
) -> Result<
    (
        Snapshot,
        mpsc::Receiver<Result<Arc<Published>, BrokerError>>,
    ),
    BrokerError,
> {
    let read_scope = scope.clone();
    let snapshot = broker
        .store()
        .read(move |s| snapshot(s, &read_scope))
        .await?;
    published(broker, snapshot.seq).await?;
    if matches!(&snapshot.view, View::Flight(v) if v.flight.state.is_terminal()) {
        let (_, rx) = mpsc::channel(1);
        return Ok((snapshot, rx));
    }
    let rx = follow_scope(broker, scope, snapshot.seq);
    Ok((snapshot, rx))
}

/// A watch of `scope` that broke, resumed: its events after global seq `after` (the
/// last one the watcher had), with no snapshot. A flight that ended at or before
/// `after` has nothing more: the stream ends at once; one that ended after it ends with
/// its terminal update, as a watch does.
pub async fn resume(
    broker: &Broker,
    scope: Scope,
    after: u64,
) -> Result<mpsc::Receiver<Result<Arc<Published>, BrokerError>>, BrokerError> {
    let last = broker.last_seq();
    if after > last {
        return Err(BrokerError::PastTheLog { after, last });
    }
    let check = scope.clone();
    let ended_before = broker
        .store()
        .read(move |st| match &check {
            Scope::Flight(id) => {
                let flight = st
                    .flight(id)?
                    .ok_or_else(|| BrokerError::UnknownFlight(id.clone()))?;
                if !flight.state.is_terminal() {
                    return Ok(false);
                }
                // Terminal now: its end is the last update; was it seen already?
                Ok(st
                    .last_stored_update(id, u64::MAX)?
                    .is_some_and(|u| u.event_seq <= after))
            }
            Scope::Agent(name) => st
                .agent(name)?
                .map(|_| false)
                .ok_or_else(|| BrokerError::UnknownAgent(name.clone())),
            Scope::Conversation { id, .. } => st
                .conversation(id)?
                .map(|_| false)
                .ok_or_else(|| BrokerError::UnknownConversation(id.clone())),
            Scope::Fleet => Ok(false),
        })
        .await?;
    if ended_before {
        let (_, rx) = mpsc::channel(1);
        return Ok(rx);
    }
    Ok(follow_scope(broker, scope, after))
}

/// The events of `scope` after global seq `from`, live; a flight's end after its
/// terminal update.
fn follow_scope(
    broker: &Broker,
    scope: Scope,
    from: u64,
) -> mpsc::Receiver<Result<Arc<Published>, BrokerError>> {
    let (tx, rx) = mpsc::channel(256);
    let mut feed = crate::feed::Feed::new(broker.clone(), from);
    broker.tasks().spawn(async move {
        while let Some(item) = feed.recv().await {
            let keep = match &item {
                Ok(event) => matches(&scope, event),
                Err(_) => true,
            };
            if !keep {
                continue;
            }
            let ends = match (&scope, &item) {
                (Scope::Flight(_), Ok(event)) => ends_flight(event),
                (_, Err(_)) => true,
                _ => false,
            };
            if tx.send(item).await.is_err() || ends {
                return;
            }
        }
    });
    rx
}

/// The update that makes a flight terminal: a flight's watch ends after it.
fn ends_flight(event: &Event) -> bool {
    matches!(&event.body, EventBody::FlightUpdated { flight, .. } if flight.state.is_terminal())
}

/// Waits until every event up to `seq` is published (flushed).
async fn published(broker: &Broker, seq: u64) -> Result<(), BrokerError> {
    // Subscribed before looking, so the publication cannot slip between the two.
    let mut live = broker.subscribe();
    while broker.last_seq() < seq {
        match live.recv().await {
            Ok(live) => {
                let _ = live.take(); // passed by: a held one is let go
            }
            Err(broadcast::error::RecvError::Lagged(_)) => {}
            Err(broadcast::error::RecvError::Closed) => return Err(BrokerError::ShuttingDown),
        }
    }
    Ok(())
}
