//! A live flight's record is not rewritten for every update. Each `flight_updated`
//! event carries the whole flight, and its `flights` record used to be written again in
//! sled for each one: about 1 KB of sled per streamed delta, most of what sled wrote, and
//! memory that sled keeps. Now [`apply`](super::apply) writes a flight's record for a
//! change of state or of usage (the usage counters fold from the record before it), for
//! every [`SNAPSHOT_EVERY`]th update, and when the flight ends; the updates between
//! (deltas, items, the session's ids, commands, notes...) are folded onto the record when
//! it is read ([`Flight::apply`], the one fold every reader shares). None of them changes
//! a flight's id, agent or state:
//! - by the writer's rules, from [`Heads`]: the newest state of each flight whose
//!   record lags, kept in memory by the store and moved on only when a batch
//!   commits (a batch's own changes sit in its overlay until then);
//! - by the writer after a restart (nothing in [`Heads`] yet), from the record and its
//!   later updates, read point by point in the batch;
//! - by every other reader ([`Store::current`], through every read of a flight), from
//!   the record and the later updates on disk. (A record written by a batch not synced
//!   yet is read as it is, as before: the log is synced just after the batch.)
//!
//! What is written is decided by the event alone, so a rebuild from the log (`relay
//! doctor`, recovery at open) writes the same records.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Mutex;

use relay_protocol::domain::{Flight, FlightChange, FlightUpdate};

use super::keys::{child_key, parse_pair, T};
use super::queries::update_at;
use super::{Store, Tx};
use crate::error::BrokerError;

/// A streaming flight's record is written at least every this many of its updates, so
/// a reader folds at most this many minus one updates onto it.
pub const SNAPSHOT_EVERY: u64 = 32;

/// Whether `update`, which made `flight`, leaves the flight's record as it is (the
/// updates between records: see the module header).
pub fn record_lags(update: &FlightUpdate, flight: &Flight) -> bool {
    lags(update) && !flight.state.is_terminal()
}

/// Whether an update of a live flight leaves its record as it is: all but a change of
/// state or usage and every [`SNAPSHOT_EVERY`]th update.
fn lags(update: &FlightUpdate) -> bool {
    !matches!(
        update.change,
        FlightChange::State { .. } | FlightChange::Usage(_)
    ) && !update.seq.is_multiple_of(SNAPSHOT_EVERY)
}

/// The newest state of each flight whose record lags behind it (the writer's; see the
/// module header).
#[derive(Default)]
pub struct Heads(Mutex<HashMap<String, Flight>>);

/// A batch's changes to [`Heads`], applied when it commits: a flight's newest
/// state (its record lags), or `None` (its record was written).
pub type Overlay = RefCell<HashMap<String, Option<Flight>>>;

impl Heads {
    fn get(&self, id: &str) -> Option<Flight> {
        self.0.lock().ok()?.get(id).cloned()
    }

    /// A committed batch's changes.
    pub fn commit(&self, overlay: &Overlay) {
        let Ok(mut heads) = self.0.lock() else {
            return;
        };
        for (id, head) in overlay.borrow_mut().drain() {
            match head {
                Some(flight) => heads.insert(id, flight),
                None => heads.remove(&id),
            };
        }
    }
}

impl Tx<'_> {
    /// The flight's newest state where its record lags behind it (`None`: the record,
    /// as this batch sees it, is the flight).
    pub(super) fn head(&self, id: &str) -> Result<Option<Flight>, BrokerError> {
        if let Some(head) = self.overlay.borrow().get(id) {
            return Ok(head.clone());
        }
        if let Some(head) = self.heads.get(id) {
            return Ok(Some(head));
        }
        Ok(None)
    }

    /// Folds onto `flight` (its record) the updates stored after it: none, unless the
    /// broker restarted since (its newest state is then not in [`Heads`] yet).
    pub(super) fn caught_up(&self, mut flight: Flight) -> Result<Flight, BrokerError> {
        if flight.state.is_terminal() {
            return Ok(flight);
        }
        let mut last_delta = None;
        while let Some(next) = self.update_of(&flight.id, flight.update_seq.saturating_add(1))? {
            let last = match last_delta {
                Some(last) => last,
                // Whether the first delta extends is the record's own update's to say.
                None => self
                    .update_of(&flight.id, flight.update_seq)?
                    .is_some_and(|u| is_delta(&u)),
            };
            last_delta = Some(fold(&mut flight, &next, last));
        }
        if last_delta.is_some() {
            // Committed already: kept, so the next read need not fold again.
            self.set_head(&flight.id, Some(flight.clone()));
        }
        Ok(flight)
    }

    /// Update `seq` of flight `id`, synced or not (`None`: there is none).
    fn update_of(&self, id: &str, seq: u64) -> Result<Option<FlightUpdate>, BrokerError> {
        let Some((event_seq, pos)) = self.update_pos(id, seq)? else {
            return Ok(None);
        };
        let update = update_at(self.log, event_seq, pos, true)?.ok_or_else(|| {
            BrokerError::Corrupt(format!(
                "update {seq} of flight {id} (event {event_seq}) is not in the log"
            ))
        })?;
        Ok(Some(update.update))
    }

    /// Records the flight's newest state: its record lags (`Some`) or was written.
    pub(super) fn set_head(&self, id: &str, head: Option<Flight>) {
        self.overlay.borrow_mut().insert(id.to_string(), head);
    }
}

fn is_delta(update: &FlightUpdate) -> bool {
    matches!(update.change, FlightChange::Delta { .. })
}

/// Folds `update` onto `flight` as the rules made it (`last_delta`: the update before
/// it was a delta, so streamed text extends). Returns whether `update` is a delta.
fn fold(flight: &mut Flight, update: &FlightUpdate, last_delta: bool) -> bool {
    flight.apply_recorded(update, None, last_delta);
    is_delta(update)
}

impl Store {
    /// `flight` (its record) with the updates stored after it folded on, those on disk.
    pub(super) fn current(&self, mut flight: Flight) -> Result<Flight, BrokerError> {
        // A record is re-read (at most a few times) when a later change rewrote it
        // while this fold read the updates after it.
        for _ in 0..4 {
            if flight.state.is_terminal() {
                return Ok(flight);
            }
            let updates = self.tree(T::FlightUpdates);
            let after = child_key(&flight.id, flight.update_seq.saturating_add(1));
            let to = child_key(&flight.id, u64::MAX);
            // Nothing after the record (all but a streaming flight): no read of the log.
            if updates.range(after..=to.clone()).next().is_none() {
                return Ok(flight);
            }
            // From the record's own update: whether the first delta after it extends.
            let from = child_key(&flight.id, flight.update_seq);
            let mut rewritten = false;
            let mut last_delta = false;
            for v in updates.range(from..=to).values() {
                let (seq, pos) = parse_pair(&v?)?;
                let Some(update) = update_at(self.log(), seq, pos, false)? else {
                    break; // not synced yet: not there for readers
                };
                let update = update.update;
                if update.seq <= flight.update_seq {
                    last_delta = is_delta(&update);
                    continue;
                }
                // An update the record does not lag behind: it was written again since.
                if !lags(&update) {
                    rewritten = true;
                    break;
                }
                last_delta = fold(&mut flight, &update, last_delta);
            }
            if !rewritten {
                return Ok(flight);
            }
            match self.flight_record(&flight.id)? {
                Some(record) => flight = record,
                None => return Ok(flight),
            }
        }
        Ok(flight)
    }
}
