//! Flights not yet ended per agent ([`LiveByAgent`]): what the queue rule of an
//! invocation counts.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use relay_protocol::domain::FlightChange;
use relay_protocol::event::{Event, EventBody};

use crate::error::BrokerError;
use crate::store::Store;

/// Flights not yet ended, per agent, as of the last committed batch: what the queue
/// rule of an invocation counts (a sled transaction cannot scan the live index). Kept by
/// the writer alone, from the events of each batch it commits, so it is exact when the
/// next batch's rules read it (the writer commits one batch at a time).
#[derive(Default)]
pub(crate) struct LiveByAgent(Mutex<HashMap<String, u64>>);

impl LiveByAgent {
    /// One scan of the live flights, at start (blocking).
    pub(super) fn scan(store: &Store) -> Result<LiveByAgent, BrokerError> {
        let mut counts = HashMap::new();
        for flight in store.live_flights()? {
            *counts.entry(flight.agent).or_insert(0) += 1;
        }
        Ok(LiveByAgent(Mutex::new(counts)))
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, u64>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn get(&self, agent: &str) -> u64 {
        self.lock().get(agent).copied().unwrap_or(0)
    }

    /// Counts a committed event (a flight made, or ended).
    pub(super) fn apply(&self, event: &Event) {
        match &event.body {
            EventBody::InvocationCreated { flight, .. } if !flight.state.is_terminal() => {
                *self.lock().entry(flight.agent.clone()).or_insert(0) += 1;
            }
            EventBody::FlightUpdated { update, flight } => {
                if matches!(&update.change, FlightChange::State { to, .. } if to.is_terminal()) {
                    let mut counts = self.lock();
                    if let Some(n) = counts.get_mut(&flight.agent) {
                        *n = n.saturating_sub(1);
                        if *n == 0 {
                            counts.remove(&flight.agent);
                        }
                    }
                }
            }
            _ => {}
        }
    }
}
