//! Flights not yet ended per agent ([`LiveByAgent`]): what the queue rule of an
//! invocation counts; and the flights running a turn (running or waiting), which make
//! an agent `busy` ([`LiveByAgent::turning`]): derived, never stored.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use relay_protocol::domain::{FlightChange, FlightState};
use relay_protocol::event::{Event, EventBody};

use crate::error::BrokerError;
use crate::store::Store;

/// Flights not yet ended, per agent, as of the last committed batch: what the queue
/// rule of an invocation counts (without a scan of the live index). Kept by
/// the writer alone, from the events of each batch it commits, so it is exact when the
/// next batch's rules read it (the writer commits one batch at a time).
#[derive(Default)]
pub(crate) struct LiveByAgent(Mutex<HashMap<String, u64>>, Mutex<Turns>);

/// The flights running a turn (`running` or `waiting`), with their agents, and how many
/// each agent has.
#[derive(Default)]
struct Turns {
    flights: HashMap<String, String>,
    agents: HashMap<String, u64>,
}

impl Turns {
    /// `flight` of `agent` is now in `state`.
    fn set(&mut self, flight: &str, agent: &str, state: FlightState) {
        let turning = state.runs_turn();
        if turning && !self.flights.contains_key(flight) {
            self.flights.insert(flight.to_owned(), agent.to_owned());
            *self.agents.entry(agent.to_owned()).or_insert(0) += 1;
        } else if !turning && self.flights.remove(flight).is_some() {
            if let Some(n) = self.agents.get_mut(agent) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.agents.remove(agent);
                }
            }
        }
    }
}

impl LiveByAgent {
    /// One scan of the live flights, at start (blocking).
    pub(super) fn scan(store: &Store) -> Result<LiveByAgent, BrokerError> {
        let mut counts = HashMap::new();
        let mut turns = Turns::default();
        for flight in store.live_flights()? {
            turns.set(&flight.id, &flight.agent, flight.state);
            *counts.entry(flight.agent).or_insert(0) += 1;
        }
        Ok(LiveByAgent(Mutex::new(counts), Mutex::new(turns)))
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, u64>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn turns(&self) -> MutexGuard<'_, Turns> {
        self.1.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a flight of `agent` runs a turn, as of the last committed batch: what
    /// makes it `busy` ([`AgentState::shown`](relay_protocol::domain::AgentState::shown)).
    pub(crate) fn turning(&self, agent: &str) -> bool {
        self.turns().agents.contains_key(agent)
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
                if let FlightChange::State { to, .. } = &update.change {
                    self.turns().set(&flight.id, &flight.agent, *to);
                }
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
