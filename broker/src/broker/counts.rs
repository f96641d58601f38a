//! What the broker keeps current from the events it publishes, so that reading it costs
//! no scan: the counts `relay status` shows, and the agents' names that the bus checks a
//! client's name against.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use relay_protocol::domain::FlightChange;
use relay_protocol::event::{Event, EventBody};

use crate::error::BrokerError;
use crate::store::{Store, T};

/// What `relay status` counts, and the agents' names, kept current from the published
/// events.
#[derive(Default)]
pub(super) struct Counts {
    pub(super) agents: AtomicU64,
    pub(super) flights: AtomicU64,
    pub(super) live_flights: AtomicU64,
    /// Each agent's name in ASCII lower case, with how many agents have it (`Ab` and
    /// `ab` are two agents): the bus's check that a client does not speak as an agent
    /// costs no read of the agents (it ran on every request over NATS).
    names: Mutex<HashMap<String, u32>>,
}

impl Counts {
    /// One scan of the store, at start (blocking).
    pub(super) fn scan(store: &Store) -> Result<Counts, BrokerError> {
        let (flights, live_flights) = store.flight_counts()?;
        let counts = Counts {
            flights: AtomicU64::new(flights),
            live_flights: AtomicU64::new(live_flights),
            ..Counts::default()
        };
        for name in store.tree(T::Agents).iter().keys() {
            counts.registered(&String::from_utf8_lossy(&name?));
        }
        Ok(counts)
    }

    pub(super) fn names(&self) -> MutexGuard<'_, HashMap<String, u32>> {
        self.names.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An agent named `name` was registered.
    fn registered(&self, name: &str) {
        let lower = name.to_ascii_lowercase();
        self.agents.fetch_add(1, Ordering::Relaxed);
        *self.names().entry(lower).or_insert(0) += 1;
    }

    /// An agent named `name` was removed.
    fn removed(&self, name: &str) {
        let lower = name.to_ascii_lowercase();
        let mut names = self.names();
        let Some(n) = names.get_mut(&lower) else {
            // Only a registered agent is removed: this would be a broken count.
            tracing::warn!(agent = %name, "an agent removed was not counted");
            return;
        };
        self.agents.fetch_sub(1, Ordering::Relaxed);
        *n -= 1;
        if *n == 0 {
            names.remove(&lower);
        }
    }

    pub(super) fn apply(&self, event: &Event) {
        match &event.body {
            EventBody::AgentRegistered { agent } => self.registered(&agent.spec.name),
            EventBody::AgentRemoved { name, .. } => self.removed(name),
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
