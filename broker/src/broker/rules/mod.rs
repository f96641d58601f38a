//! The domain rules, run inside the writer's batch: [`Ctx`], the one way they
//! write ([`Ctx::emit`]: the next seq, the log, the projections), the dispatch of a
//! command to its rule ([`Ctx::run`]), node reports (`FromNode`) and the lookups every
//! rule shares. The rules themselves are in the submodules, by the entity they govern.

use relay_protocol::domain::{
    Agent, Conversation, ConversationKind, ConversationSpec, Flight, DEFAULT_CONVERSATION,
};
use relay_protocol::event::{Event, EventBody};

use std::collections::HashMap;

use relay_protocol::domain::{FlightChange, SharedStr};

use super::writer::Kept;
use super::{BrokerConfig, Command, LiveByAgent, Outcome};
use crate::error::BrokerError;
use crate::store::log::Link;
use crate::store::{apply, compact_posted, encode, slim_store, Published, Tx, T};

mod agents;
mod approvals;
mod budgets;
mod flights;
mod messages;

pub(super) use agents::check_spec;

/// The domain rules, run inside the writer's batch.
pub(super) struct Ctx<'a, 't> {
    pub(super) tx: &'a Tx<'t>,
    pub(super) config: &'a BrokerConfig,
    /// Live flights per agent as committed before this batch...
    pub(super) live: &'a LiveByAgent,
    /// ...and how this batch changed them so far (the queue rule adds both).
    pub(super) live_delta: HashMap<String, i64>,
    /// What the writer keeps of each live flight, as committed...
    pub(super) streaming: &'a super::writer::Streaming,
    /// ...and as this batch left it (`None`: the flight ended).
    pub(super) streaming_delta: HashMap<String, Option<Kept>>,
    pub(super) next_seq: u64,
    /// Where the next event will be in the log (the batch is appended after it commits).
    pub(super) next_pos: crate::store::Pos,
    pub(super) now: u64,
    /// Each with its encoding: the log record's payload (version byte and wire JSON),
    /// whose JSON the `Published` shares (one allocation).
    pub(super) events: Vec<(Published, bytes::Bytes)>,
    /// The deliveries this batch planned (message, target, id): a flight made for one
    /// keeps its id to settle ([`Kept::deliveries`]).
    pub(super) planned: Vec<(String, String, String)>,
    /// Who asked for the command running now ([`Command::As`]), recorded as its
    /// events' `by`.
    pub(super) by: Option<String>,
}

impl Ctx<'_, '_> {
    fn emit(&mut self, body: EventBody) -> Result<(), BrokerError> {
        let event = Event {
            v: relay_protocol::event::EVENT_VERSION,
            seq: self.next_seq,
            at: self.now,
            by: self.by.clone(),
            body,
        };
        // Encoded once: these bytes are the log record's payload, and their JSON is what
        // every subscriber is sent (unless a text of it is stored as a reference to the
        // same text earlier in the log, or it is a flight's update stored without its
        // flight: then the log gets a shorter copy).
        let mut linked = false;
        let (published, mut stored, source) = Published::encode_sharing(
            event,
            self.next_pos,
            |f| self.kept(f).and_then(|k| k.text),
            self.tx.texts(),
            super::LIVE_EVENT_MAX,
        )?;
        match &published.event.body {
            EventBody::InvocationCreated { invocation, flight } if !flight.state.is_terminal() => {
                *self.live_delta.entry(flight.agent.clone()).or_insert(0) += 1;
                // Taken out: each is for one task, and the list stays short in a big batch.
                let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.planned)
                    .into_iter()
                    .partition(|(m, t, _)| *m == invocation.request_message && *t == flight.agent);
                self.planned = rest;
                let deliveries = mine.into_iter().map(|(_, _, id)| id).collect();
                let kept = Kept {
                    deliveries: Some(deliveries),
                    ..Kept::default()
                };
                self.streaming_delta.insert(flight.id.clone(), Some(kept));
            }
            // Its record links to its conversation's message before it, so the
            // conversation keeps no key per message (see `store::counts::walk_back`).
            EventBody::MessagePosted { message, .. } => {
                // In protobuf, unless it refers to a text earlier in the log.
                stored = compact_posted(&published.event, stored);
                if let Some((seq, pos, _)) = self.tx.last_message(&message.conversation)? {
                    stored = crate::store::log::linked(Link { seq, pos }, &stored).into();
                    linked = true;
                }
            }
            EventBody::FlightUpdated { update, flight } => {
                if matches!(&update.change, FlightChange::State { to, .. } if to.is_terminal()) {
                    *self.live_delta.entry(flight.agent.clone()).or_insert(0) -= 1;
                }
                // Stored without its flight when the previous update folds into it
                // (`store::slim`).
                let previous = self.kept(&flight.id);
                let last = previous.as_ref().and_then(|k| k.last.as_ref());
                let (slim, last) = slim_store(&published.event, stored, self.next_pos, last);
                stored = slim;
                let kept = (!flight.state.is_terminal()).then(|| {
                    let mut kept = previous.unwrap_or_default();
                    kept.delta = Some(matches!(update.change, FlightChange::Delta { .. }));
                    kept.last = last;
                    kept
                });
                self.streaming_delta.insert(flight.id.clone(), kept);
            }
            _ => {}
        }
        // The flight's newest text to look for: only a live flight's (a message may name
        // a flight that ended, or none that exists, and nothing would drop its entry).
        if let Some((flight, source)) = source {
            let live = match self.streaming_delta.get(&flight) {
                Some(kept) => kept.is_some(),
                None => self.tx.contains(T::LiveFlights, flight.as_bytes())?,
            };
            if live {
                let kept = self.kept(&flight).unwrap_or_default();
                let text = Some(source);
                self.streaming_delta
                    .insert(flight, Some(Kept { text, ..kept }));
            }
        }
        apply(self.tx, &published.event, self.next_pos, linked)?;
        self.next_seq += 1;
        self.next_pos += crate::store::log::record_len(stored.len());
        self.events.push((published, stored));
        Ok(())
    }

    /// Whether `flight`'s last update was streamed text: from this batch, else from
    /// what the writer keeps, else (an update from before this broker started) from the
    /// log.
    pub(super) fn last_was_delta(&self, flight: &Flight) -> Result<bool, BrokerError> {
        if let Some(None) = self.streaming_delta.get(&flight.id) {
            return Ok(false);
        }
        match self.kept(&flight.id).and_then(|k| k.delta) {
            Some(delta) => Ok(delta),
            None => Ok(self
                .tx
                .stored_update(&flight.id, flight.update_seq)?
                .is_some_and(|u| matches!(u.update.change, FlightChange::Delta { .. }))),
        }
    }

    /// What the writer keeps of `flight`: as this batch left it, else as committed
    /// (`None`: nothing, or the flight ended in this batch).
    pub(super) fn kept(&self, flight: &str) -> Option<Kept> {
        match self.streaming_delta.get(flight) {
            Some(kept) => kept.clone(),
            None => self.streaming.lock().ok()?.get(flight).cloned(),
        }
    }

    pub(super) fn run(&mut self, command: &Command) -> Result<Outcome, BrokerError> {
        match command {
            Command::RegisterAgent(spec, worktree) => self.register_agent(spec, worktree),
            Command::RemoveAgent { name, force } => self.remove_agent(name, *force),
            Command::UpdateAgent {
                name,
                state,
                thread_id,
                endpoint,
                reason,
                program,
                worktree,
            } => self.update_agent(name, *state, thread_id, endpoint, reason, program, worktree),
            Command::ThreadLost {
                agent,
                old_thread_id,
                new_thread_id,
                reason,
            } => self.thread_lost(agent, old_thread_id, new_thread_id, reason),
            Command::CreateConversation(spec) => self.create_conversation(spec),
            Command::PostMessage(post) => self.post_message(post),
            Command::Invoke(req) => self.invoke(req),
            Command::UpdateFlight {
                flight,
                change: FlightChange::Usage(usage),
            } => self.report_usage(flight, usage),
            Command::UpdateFlight { flight, change } => self.update_flight(flight, change),
            Command::SetAgent { name, settings } => self.set_agent(name, settings),
            Command::WakeAsked { name } => self.wake_asked(name),
            Command::As { by, command } => {
                let outer = self.by.replace(by.clone());
                let result = self.run(command);
                self.by = outer;
                result
            }
            Command::RequestApproval { agent, request } => self.request_approval(agent, request),
            Command::DecideApproval {
                id,
                decision,
                decided_by,
                remember,
            } => self.decide_approval(id, *decision, decided_by, remember.as_deref()),
            Command::RemoveRule { id, removed_by } => self.remove_rule(id, removed_by),
            Command::ExpireApprovals {
                flight,
                by,
                request,
            } => self.expire_approvals(flight, by, request),
            Command::FromNode {
                node,
                stream,
                stream_seq,
                command,
            } => {
                let applied: Option<ReportCursor> =
                    self.tx.read(T::ReportCursors, node.as_bytes())?;
                if applied.is_some_and(|c| c.covers(*stream, *stream_seq)) {
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
                    encode(&ReportCursor::Of {
                        stream: *stream,
                        seq: *stream_seq,
                    })?,
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
                self.flight_head(flight)?.agent
            }
            Command::UpdateAgent { name, .. } => name.clone(),
            Command::ThreadLost { agent, .. } | Command::RequestApproval { agent, .. } => {
                agent.clone()
            }
            _ => {
                return Err(BrokerError::NodeCommand {
                    node: node.to_string(),
                })
            }
        };
        if self.agent(&agent)?.spec.node.as_deref() != Some(node) {
            tracing::warn!(%node, %agent, "a node reported on an agent that is not its own; refused");
            return Err(BrokerError::NotNodesAgent {
                node: node.to_string(),
                agent,
            });
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
            .conversation(id)?
            .ok_or_else(|| BrokerError::UnknownConversation(id.into()))
    }

    fn flight(&self, id: &str) -> Result<Flight, BrokerError> {
        self.tx
            .flight(id, |seq| self.pending_output(seq))?
            .ok_or_else(|| BrokerError::UnknownFlight(id.into()))
    }

    /// [`Ctx::flight`] without its output where the log keeps it: for checks that look
    /// at its agent, state or parent only.
    fn flight_head(&self, id: &str) -> Result<Flight, BrokerError> {
        self.tx
            .flight_without_output(id)?
            .ok_or_else(|| BrokerError::UnknownFlight(id.into()))
    }

    /// The output a completion of this batch (event `seq`) recorded.
    pub(super) fn pending_output(&self, seq: u64) -> Option<SharedStr> {
        let first = self.events.first()?.0.seq;
        let (published, _) = self
            .events
            .get(usize::try_from(seq.checked_sub(first)?).ok()?)?;
        match &published.body {
            EventBody::FlightUpdated { update, .. } => match &update.change {
                FlightChange::State { output, .. } => output.clone(),
                _ => None,
            },
            _ => None,
        }
    }
}

/// A node's cursor in the report stream: the last report of it applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub(crate) enum ReportCursor {
    /// Written before the stream's identity was kept: taken as the current stream's.
    Seq(u64),
    /// The seq of the last report applied, in the stream of this identity.
    Of { stream: i64, seq: u64 },
}

impl ReportCursor {
    /// Whether the report at `seq` of the stream `stream` was applied already. A stream
    /// made anew (another identity) starts its seqs again: none of its reports was.
    pub(crate) fn covers(self, stream: i64, seq: u64) -> bool {
        match self {
            ReportCursor::Seq(applied) => seq <= applied,
            ReportCursor::Of {
                stream: applied_in,
                seq: applied,
            } => applied_in == stream && seq <= applied,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::ReportCursor;
    use crate::store::{decode, encode};

    #[test]
    fn a_cursor_covers_only_the_seqs_of_its_own_stream() {
        let cursor = ReportCursor::Of { stream: 7, seq: 40 };
        assert!(cursor.covers(7, 40));
        assert!(cursor.covers(7, 1));
        assert!(!cursor.covers(7, 41));
        // A stream made anew starts again from 1: none of its reports was applied.
        assert!(!cursor.covers(8, 1));
        assert!(!cursor.covers(8, 40));
    }

    #[test]
    fn a_cursor_written_before_the_streams_identity_reads_as_the_current_streams() {
        let old: ReportCursor = decode(&encode(&40u64).unwrap()).unwrap();
        assert_eq!(old, ReportCursor::Seq(40));
        assert!(old.covers(123, 40));
        assert!(!old.covers(123, 41));
        let new = ReportCursor::Of { stream: -5, seq: 3 };
        assert_eq!(decode::<ReportCursor>(&encode(&new).unwrap()).unwrap(), new);
    }
}
