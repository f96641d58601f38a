//! Replays built from the log: one flight, an agent's session across turns, a
//! conversation (the shapes are in [`relay_protocol::replay`]).
//!
//! Nothing here scans the log. A flight's updates come from `flight_updates`, and a
//! conversation's messages from `messages`, which keep each one's global seq; everything
//! else a replay needs (an agent's registrations, lost threads and flights; the flights
//! asked in a conversation; a flight's request and approvals) is found through the
//! `replay_index` tree ([`Scope`]), whose keys end in the seq of the event, then read
//! from the log by seq.
//! States come from the events too (the flight record a flight's last update carries),
//! never from a projection that may hold a commit not yet flushed: a replay is cut at
//! the last published seq, so it only shows what is durable, and a log gives the same
//! replay however often the broker restarts.
//!
//! Consecutive text deltas are joined into one entry, as is consecutive output of one
//! command: a flight of 10,000 deltas replays as its text, not 10,000 pieces.

use relay_protocol::domain::{Flight, FlightChange};
use relay_protocol::event::{Event, EventBody};
use relay_protocol::replay::{
    AgentEntry, AgentReplay, ApprovalStep, ConversationEntry, ConversationReplay, TurnEntry,
    TurnReplay, TurnStep,
};

use crate::broker::Broker;
use crate::error::BrokerError;
use crate::store::{Scope, Store, StoredUpdate};

/// One flight's transcript, with the entries after global seq `from`. Each replay reads
/// the store as the log stands at `upto`, what is published: a batch going into sled
/// meanwhile is past it, so a replay reads through `Store::read_listing` and never holds
/// the writer back, however long the flight.
pub async fn flight(broker: &Broker, id: String, from: u64) -> Result<TurnReplay, BrokerError> {
    let upto = broker.last_seq();
    broker
        .store()
        .read_listing(move |s| flight_replay(s, &id, from, upto))
        .await
}

/// An agent's session across turns, with the entries after global seq `from`.
pub async fn agent(broker: &Broker, name: String, from: u64) -> Result<AgentReplay, BrokerError> {
    let upto = broker.last_seq();
    broker
        .store()
        .read_listing(move |s| agent_replay(s, &name, from, upto))
        .await
}

/// A conversation's messages and the flights they started, after global seq `from`.
pub async fn conversation(
    broker: &Broker,
    id: String,
    from: u64,
) -> Result<ConversationReplay, BrokerError> {
    let upto = broker.last_seq();
    broker
        .store()
        .read_listing(move |s| conversation_replay(s, &id, from, upto))
        .await
}

/// [`flight`] on the store, as the log stands at seq `upto`.
pub fn flight_replay(
    store: &Store,
    id: &str,
    from: u64,
    upto: u64,
) -> Result<TurnReplay, BrokerError> {
    let events = events(store, &store.replay_seqs(Scope::Flight, id, 0, upto)?)?;
    let Some((created, approvals)) = events.split_first() else {
        return Err(BrokerError::UnknownFlight(id.into()));
    };
    turn(store, created, approvals, from, upto)
}

/// [`agent`] on the store, as the log stands at seq `upto`.
pub fn agent_replay(
    store: &Store,
    name: &str,
    from: u64,
    upto: u64,
) -> Result<AgentReplay, BrokerError> {
    let seqs = store.replay_seqs(Scope::Agent, name, 0, upto)?;
    if seqs.is_empty() && store.agent(name)?.is_none() {
        return Err(BrokerError::UnknownAgent(name.into()));
    }
    let mut entries = Vec::new();
    for event in events(store, &seqs)? {
        let (seq, at, by) = (event.seq, event.at, event.by);
        let entry = match event.body {
            EventBody::InvocationCreated { flight, .. } => {
                let flight_events = events(
                    store,
                    &store.replay_seqs(Scope::Flight, &flight.id, 0, upto)?,
                )?;
                // A turn asked before `from` is shown only if something happened since.
                let later = seq > from
                    || flight_events.last().is_some_and(|e| e.seq > from)
                    || store
                        .last_stored_update(&flight.id, upto)?
                        .is_some_and(|u| u.event_seq > from);
                if !later {
                    continue;
                }
                let Some((created, approvals)) = flight_events.split_first() else {
                    return Err(BrokerError::Corrupt(format!(
                        "flight {} is not in the replay index",
                        flight.id
                    )));
                };
                let turn = turn(store, created, approvals, from, upto)?;
                if seq <= from && turn.entries.is_empty() {
                    continue;
                }
                AgentEntry::Turn(Box::new(turn))
            }
            _ if seq <= from => continue,
            EventBody::AgentRegistered { agent } => AgentEntry::Registered {
                seq,
                at,
                harness: agent.spec.harness,
                cwd: agent.spec.cwd,
                model: agent.spec.model,
                node: agent.spec.node,
                worktree: agent.worktree,
                by,
            },
            EventBody::AgentRemoved { .. } => AgentEntry::Removed { seq, at, by },
            EventBody::ThreadLost {
                old_thread_id,
                new_thread_id,
                reason,
                ..
            } => AgentEntry::ThreadLost {
                seq,
                at,
                old_thread_id,
                new_thread_id,
                reason,
            },
            other => return Err(unexpected(seq, &other, "an agent")),
        };
        entries.push(entry);
    }
    Ok(AgentReplay {
        agent: name.into(),
        entries,
    })
}

/// [`conversation`] on the store, as the log stands at seq `upto`.
pub fn conversation_replay(
    store: &Store,
    id: &str,
    from: u64,
    upto: u64,
) -> Result<ConversationReplay, BrokerError> {
    let conversation = store
        .conversation(id)?
        .ok_or_else(|| BrokerError::UnknownConversation(id.into()))?;
    // Its messages, and the flights asked in it (from the replay index).
    let mut seqs = store.message_seqs(id, from, upto)?;
    seqs.extend(store.replay_seqs(Scope::Conversation, id, from, upto)?);
    seqs.sort_unstable();
    seqs.dedup();
    let mut entries = Vec::new();
    for event in events(store, &seqs)? {
        let seq = event.seq;
        entries.push(match event.body {
            EventBody::MessagePosted { message, .. } => ConversationEntry::Message { seq, message },
            EventBody::InvocationCreated { invocation, flight } => {
                let flight = flight_as_of(store, flight, upto)?;
                ConversationEntry::FlightStarted {
                    seq,
                    at: event.at,
                    flight: flight.id,
                    agent: flight.agent,
                    requester: invocation.requester,
                    action: invocation.action,
                    request_message: invocation.request_message,
                    state: flight.state,
                    error: flight.error,
                }
            }
            other => return Err(unexpected(seq, &other, "a conversation")),
        });
    }
    Ok(ConversationReplay {
        conversation: conversation.spec,
        entries,
    })
}

/// One turn: `created` (its `invocation_created` event), the approval events of its
/// flight, and its updates up to `upto`; entries after `from`.
fn turn(
    store: &Store,
    created: &Event,
    approvals: &[Event],
    from: u64,
    upto: u64,
) -> Result<TurnReplay, BrokerError> {
    let EventBody::InvocationCreated { invocation, flight } = &created.body else {
        return Err(unexpected(created.seq, &created.body, "a flight's request"));
    };
    let updates: Vec<StoredUpdate> = store
        .stored_updates(&flight.id, 0)?
        .into_iter()
        .take_while(|u| u.event_seq <= upto)
        .collect();
    let now = match updates.last() {
        Some(last) => flight_of_update(store, last.event_seq)?,
        None => flight.clone(),
    };
    // The flight record's usage has its cost filled in from the price table.
    let usage = match &now.usage {
        Some(u) => Some(u.clone()),
        None => updates.iter().rev().find_map(|u| match &u.update.change {
            FlightChange::Usage(usage) => Some(usage.clone()),
            _ => None,
        }),
    };
    let mut steps: Vec<(u64, u64, TurnStep)> = Vec::with_capacity(updates.len());
    for e in approvals.iter().filter(|e| e.seq > from) {
        steps.push((e.seq, e.at, approval_step(e)?));
    }
    steps.extend(
        updates
            .into_iter()
            .filter(|u| u.event_seq > from)
            .map(|u| (u.event_seq, u.update.at, TurnStep::Update(u.update.change))),
    );
    steps.sort_by_key(|(seq, _, _)| *seq);
    Ok(TurnReplay {
        flight: now.id,
        agent: now.agent,
        seq: created.seq,
        at: created.at,
        invocation: invocation.clone(),
        state: now.state,
        error: now.error,
        thread_id: now.thread_id,
        turn_id: now.turn_id,
        usage,
        entries: join(steps),
    })
}

/// Steps in order, consecutive deltas (and output of one command) joined.
fn join(steps: Vec<(u64, u64, TurnStep)>) -> Vec<TurnEntry> {
    let mut out: Vec<TurnEntry> = Vec::with_capacity(steps.len());
    for (seq, at, step) in steps {
        if let Some(last) = out.last_mut() {
            if let Some(more) = joined_text(&mut last.step, &step) {
                more.push_str(step_text(&step));
                last.last_seq = Some(seq);
                continue;
            }
        }
        out.push(TurnEntry {
            seq,
            last_seq: None,
            at,
            step,
        });
    }
    out
}

/// The text of `last` that `next` continues, if it does: a delta after a delta, output
/// of one command after output of the same command.
fn joined_text<'a>(last: &'a mut TurnStep, next: &TurnStep) -> Option<&'a mut String> {
    use FlightChange::{CommandOutput, Delta};
    match (last, next) {
        (TurnStep::Update(Delta { text }), TurnStep::Update(Delta { .. })) => Some(text),
        (
            TurnStep::Update(CommandOutput { item_id, text }),
            TurnStep::Update(CommandOutput { item_id: next, .. }),
        ) if item_id == next => Some(text),
        _ => None,
    }
}

fn step_text(step: &TurnStep) -> &str {
    match step {
        TurnStep::Update(FlightChange::Delta { text })
        | TurnStep::Update(FlightChange::CommandOutput { text, .. }) => text,
        _ => "",
    }
}

fn approval_step(e: &Event) -> Result<TurnStep, BrokerError> {
    Ok(TurnStep::Approval(match &e.body {
        EventBody::ApprovalRequested { approval } => ApprovalStep::ApprovalRequested {
            approval: approval.id.clone(),
            approval_kind: approval.request.kind,
            detail: approval.request.detail.clone(),
            reason: approval.request.reason.clone(),
        },
        EventBody::ApprovalDecided { approval } => ApprovalStep::ApprovalDecided {
            approval: approval.id.clone(),
            state: approval.state,
            decision: approval.decision,
            decided_by: approval.decided_by.clone(),
        },
        other => return Err(unexpected(e.seq, other, "a flight")),
    }))
}

/// The flight as its last update up to `upto` left it (`created`: none yet).
fn flight_as_of(store: &Store, created: Flight, upto: u64) -> Result<Flight, BrokerError> {
    match store.last_stored_update(&created.id, upto)? {
        Some(u) => flight_of_update(store, u.event_seq),
        None => Ok(created),
    }
}

/// The flight record the `flight_updated` event at `seq` carries.
fn flight_of_update(store: &Store, seq: u64) -> Result<Flight, BrokerError> {
    match store.event(seq)?.map(|e| e.body) {
        Some(EventBody::FlightUpdated { flight, .. }) => Ok(flight),
        Some(other) => Err(unexpected(seq, &other, "a flight update")),
        None => Err(missing(seq)),
    }
}

/// The events at `seqs`, from the log.
fn events(store: &Store, seqs: &[u64]) -> Result<Vec<Event>, BrokerError> {
    seqs.iter()
        .map(|&seq| store.event(seq)?.ok_or_else(|| missing(seq)))
        .collect()
}

fn missing(seq: u64) -> BrokerError {
    BrokerError::Corrupt(format!("event {seq} is indexed but not in the log"))
}

fn unexpected(seq: u64, body: &EventBody, what: &str) -> BrokerError {
    BrokerError::Corrupt(format!(
        "event {seq} ({}) is indexed as {what}'s",
        body.type_name()
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn update(seq: u64, change: FlightChange) -> (u64, u64, TurnStep) {
        (seq, seq * 10, TurnStep::Update(change))
    }

    fn delta(text: &str) -> FlightChange {
        FlightChange::Delta { text: text.into() }
    }

    fn output(item: &str, text: &str) -> FlightChange {
        FlightChange::CommandOutput {
            item_id: item.into(),
            text: text.into(),
        }
    }

    fn entry(seq: u64, last_seq: Option<u64>, change: FlightChange) -> TurnEntry {
        TurnEntry {
            seq,
            last_seq,
            at: seq * 10,
            step: TurnStep::Update(change),
        }
    }

    /// Runs of deltas, and of one command's output, become one entry each; anything
    /// else between them, or another command's output, starts a new one.
    #[test]
    fn consecutive_deltas_and_output_of_one_command_are_joined() {
        let usage = FlightChange::Usage(relay_protocol::domain::TokenUsage {
            input_tokens: 1,
            output_tokens: 2,
            ..Default::default()
        });
        let steps = vec![
            update(1, delta("hel")),
            update(2, delta("lo")),
            update(3, output("c1", "a\n")),
            update(4, output("c1", "b\n")),
            update(5, output("c2", "x\n")),
            update(6, usage.clone()),
            update(7, delta("bye")),
        ];
        assert_eq!(
            join(steps),
            vec![
                entry(1, Some(2), delta("hello")),
                entry(3, Some(4), output("c1", "a\nb\n")),
                entry(5, None, output("c2", "x\n")),
                entry(6, None, usage),
                entry(7, None, delta("bye")),
            ]
        );
    }
}
