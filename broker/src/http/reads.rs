//! What an agent's token may read: what it asked or was asked, not every agent's work.
//!
//! - a flight, its updates, stream, tree and replay: when the flight's tree (from its
//!   root) holds a flight the agent runs or asked for ([`Principal::may_read_flight`]);
//! - the flight list: the flights it runs or asked for; the approval list: the approvals
//!   of those flights;
//! - a conversation, its messages and replay: a channel (or a thread, a system
//!   conversation) is open to all; a direct or group conversation only to its
//!   participants ([`Principal::may_read_conversation`]);
//! - its own agent's watch and replay; not the whole event log or the fleet.
//!
//! The operator (its token or a dashboard login) reads everything.

use relay_protocol::api::FlightTree;
use relay_protocol::domain::{Approval, Conversation, ConversationKind, Flight};

use super::Principal;
use crate::broker::Broker;
use crate::error::{quote, BrokerError};
use crate::store::Store;

/// Most flights looked through to decide whether an agent may read one (a tree's).
const TREE_LIMIT: usize = 10_000;

impl Principal {
    /// The agent this caller is limited to, if it is one.
    pub(super) fn agent(&self) -> Option<&str> {
        match self {
            Principal::Operator => None,
            Principal::Agent(me) => Some(me),
        }
    }

    /// Refuses an agent a flight whose tree holds none of its own flights (ones it runs
    /// or asked for).
    pub async fn may_read_flight(&self, broker: &Broker, id: &str) -> Result<(), BrokerError> {
        let Some(me) = self.agent() else {
            return Ok(());
        };
        let (me, id) = (me.to_string(), id.to_string());
        broker
            .store()
            .read(move |st| {
                let tree = st.flight_tree(&id, TREE_LIMIT)?;
                if tree_holds(st, &tree, &me)? {
                    return Ok(());
                }
                Err(BrokerError::Unauthorized(format!(
                    "agent {}'s token reads only the flights it runs or asked for and their trees; flight {} is not in one",
                    quote(&me),
                    quote(&id)
                )))
            })
            .await
    }

    /// Refuses an agent a direct or group conversation it is not in.
    pub async fn may_read_conversation(
        &self,
        broker: &Broker,
        id: &str,
    ) -> Result<(), BrokerError> {
        let Some(me) = self.agent() else {
            return Ok(());
        };
        let (me, id) = (me.to_string(), id.to_string());
        broker
            .store()
            .read(move |st| {
                let c = st
                    .conversation(&id)?
                    .ok_or_else(|| BrokerError::UnknownConversation(id.clone()))?;
                if in_conversation(&c, &me) {
                    return Ok(());
                }
                Err(BrokerError::Unauthorized(format!(
                    "agent {}'s token reads only the conversations it is in; {} is between {}",
                    quote(&me),
                    quote(&id),
                    c.spec.participants.join(", ")
                )))
            })
            .await
    }

    /// Refuses an agent another agent's session (its watch, replay, pane).
    pub fn may_read_agent(&self, name: &str) -> Result<(), BrokerError> {
        match self.agent() {
            Some(me) if me != name => Err(BrokerError::Unauthorized(format!(
                "agent {}'s token reads its own session only, not agent {}'s",
                quote(me),
                quote(name)
            ))),
            _ => Ok(()),
        }
    }

    /// Refuses an agent what holds every agent's work (the event log, the fleet).
    pub fn may_read_all(&self, what: &str) -> Result<(), BrokerError> {
        match self.agent() {
            Some(me) => Err(BrokerError::Unauthorized(format!(
                "agent {}'s token cannot read {what}: it holds every agent's work; watch your own flights, agent or conversations instead",
                quote(me)
            ))),
            None => Ok(()),
        }
    }
}

/// Whether `me` runs or asked for `flight`.
pub(super) fn own_flight(st: &Store, flight: &Flight, me: &str) -> Result<bool, BrokerError> {
    st.runs_or_asked(flight, me)
}

fn tree_holds(st: &Store, tree: &FlightTree, me: &str) -> Result<bool, BrokerError> {
    if own_flight(st, &tree.flight, me)? {
        return Ok(true);
    }
    for child in &tree.children {
        if tree_holds(st, child, me)? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether `me` may read conversation `c`: one with participants (direct, group) only
/// when it is one of them.
pub(super) fn in_conversation(c: &Conversation, me: &str) -> bool {
    match c.spec.kind {
        ConversationKind::Direct => c.spec.participants.iter().any(|p| p == me),
        // A group without a list of participants is open, like a channel.
        ConversationKind::Group => {
            c.spec.participants.is_empty() || c.spec.participants.iter().any(|p| p == me)
        }
        _ => true,
    }
}

/// Whether `me` may see approval `a`: one of a flight it runs or asked for.
pub(super) fn own_approval(st: &Store, a: &Approval, me: &str) -> Result<bool, BrokerError> {
    if a.agent == me {
        return Ok(true);
    }
    match st.flight(&a.request.flight)? {
        Some(f) => own_flight(st, &f, me),
        None => Ok(false),
    }
}
