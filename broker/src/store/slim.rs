//! Flight updates stored without their flight. A `flight_updated` event carries the
//! whole flight after its update: about 600 bytes (a 160-character summary among them)
//! for a delta of a few dozen, while most updates (streamed text, items, commands)
//! change little of it. Subscribers are still sent the whole event; the log keeps such
//! an update "slim": version byte [`SLIM_VERSION`], the seq and the position of the
//! flight's previous update (u64 big-endian each), then the event's wire JSON without
//! its `flight`.
//!
//! A reader gets the flight back by folding the update onto the previous update's flight
//! ([`Flight::apply_recorded`], the fold the rules make flights with). The writer stores
//! an update slim only when that fold, of the update as a reader will read it back,
//! gives exactly the flight it is publishing ([`store`]), so what is read back equals
//! what was published, and so does its JSON (encoded again from it: the same data
//! encodes to the same bytes). A change of state is always stored whole.
//!
//! At most [`SLIM_RUN`] slim updates of a flight follow one another; then one is stored
//! whole. So a reader starting anywhere reads at most that many records back; one
//! reading in order (a follower of the log, a restart's catch-up, a rebuild) finds the
//! previous flight in memory ([`Memo`]). What needs only the update (a replay, the fold
//! of deltas onto a flight's record) reads it without the flight ([`decode_update`]).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use bytes::Bytes;
use relay_protocol::domain::{Flight, FlightChange, FlightUpdate};
use relay_protocol::event::{Event, EventBody, EVENT_VERSION};
use serde::Deserialize;

use super::keys::{pair_value, parse_pair, VALUE_VERSION};
use super::log::{EventLog, Pos};
use crate::error::BrokerError;

/// The stored version of a flight update kept without its flight.
pub const SLIM_VERSION: u8 = 3;
/// Most slim updates of a flight in a row (the records a reader may read back).
pub const SLIM_RUN: u32 = 32;
/// The version byte and the previous update's seq and position.
const HEAD: usize = 1 + 16;
/// Flights whose last update read is kept ([`Memo`]); past it, the memo starts afresh.
const MEMO_MAX: usize = 4096;
/// A larger update (a long answer's item) is stored whole: its flight is a few hundred
/// bytes of it, and the slim form would copy it, scan it for the flight and parse it
/// back (about 40 ms of the storage thread for a 32 MB answer, every other flight's
/// commits waiting; ops/BENCHMARKS.md part 17).
const SLIM_MAX: usize = 64 * 1024;

/// What the writer keeps of a live flight's last update: where it is, and its flight.
#[derive(Debug, Clone)]
pub struct Last {
    pub seq: u64,
    pub pos: Pos,
    pub flight: Arc<Flight>,
    /// Whether that update was streamed text (a delta after it extends the summary).
    pub delta: bool,
    /// Slim updates since the last one stored whole.
    pub run: u32,
}

/// What to store for `event`, to be appended at `pos`, whose plain encoding (the version
/// byte and the wire JSON) is `stored`: the slim form when it is a flight's update that
/// `last` (the flight's previous update) folds into exactly, else `stored` as it is.
/// And what the writer keeps of the flight after it (`None`: not an update of a live
/// flight).
pub fn store(event: &Event, stored: Bytes, pos: Pos, last: Option<&Last>) -> (Bytes, Option<Last>) {
    let EventBody::FlightUpdated { update, flight } = &event.body else {
        return (stored, None);
    };
    if flight.state.is_terminal() {
        return (stored, None);
    }
    let delta = matches!(update.change, FlightChange::Delta { .. });
    let kept = |flight: Flight, run| Last {
        seq: event.seq,
        pos,
        flight: Arc::new(flight),
        delta,
        run,
    };
    let slim = last
        .filter(|last| {
            last.run < SLIM_RUN
                && last.flight.id == flight.id
                && last.flight.update_seq + 1 == update.seq
                && !matches!(update.change, FlightChange::State { .. })
                && stored.first() == Some(&VALUE_VERSION)
                && stored.len() <= SLIM_MAX
        })
        .and_then(|last| {
            let cut = cut(&stored[1..], &flight.id)?;
            let mut slim = Vec::with_capacity(HEAD + cut + 1);
            slim.push(SLIM_VERSION);
            slim.extend_from_slice(&pair_value(last.seq, last.pos));
            slim.extend_from_slice(&stored[1..1 + cut]);
            slim.push(b'}');
            // Folded as a reader will fold it: with the update read back from what is
            // stored (a value that does not read back as itself, such as an item kind
            // of another name, could fold otherwise than the one in memory). A delta's
            // text reads back as itself: a burst's long texts are not parsed again.
            let read = match delta {
                true => None,
                false => Some(serde_json::from_slice::<SlimIn>(&slim[HEAD..]).ok()?.update),
            };
            let mut folded = (*last.flight).clone();
            let update = read.as_ref().unwrap_or(update);
            let same = folded.apply_recorded(update, None, last.delta) && folded == *flight;
            same.then_some((last, folded, slim))
        });
    match slim {
        Some((last, folded, slim)) => (Bytes::from(slim), Some(kept(folded, last.run + 1))),
        None => (stored, Some(kept(flight.clone(), 0))),
    }
}

/// Where the event's `flight` starts in its wire JSON: the flight is its last field (the
/// body's fields follow the order of their declaration: `update`, then `flight`), and
/// a string cannot hold `,"flight":{` unescaped, so its last occurrence is the one.
fn cut(json: &[u8], id: &str) -> Option<usize> {
    let mark = format!(",\"flight\":{{\"id\":{}", serde_json::to_string(id).ok()?);
    let at = json
        .windows(mark.len())
        .rposition(|w| w == mark.as_bytes())?;
    json.ends_with(b"}}").then_some(at)
}

/// Whether a stored payload is a slim update.
pub fn is_slim(payload: &[u8]) -> bool {
    payload.first() == Some(&SLIM_VERSION)
}

#[derive(Deserialize)]
struct SlimIn {
    #[serde(default = "first_version")]
    v: u8,
    seq: u64,
    at: u64,
    #[serde(default)]
    by: Option<String>,
    update: FlightUpdate,
}

fn first_version() -> u8 {
    1
}

fn split(payload: &[u8]) -> Result<(u64, Pos, &[u8]), BrokerError> {
    if payload.len() < HEAD || !is_slim(payload) {
        return Err(BrokerError::Corrupt(
            "a slim flight update is cut short".into(),
        ));
    }
    let (seq, pos) = parse_pair(&payload[1..HEAD])?;
    Ok((seq, pos, &payload[HEAD..]))
}

/// A slim record's event as JSON, without its flight (for a text of its update).
pub fn decode_value(payload: &[u8]) -> Result<serde_json::Value, BrokerError> {
    let (_, _, json) = split(payload)?;
    Ok(serde_json::from_slice(json)?)
}

/// The part of a `flight_updated` event an update's reader needs.
#[derive(Deserialize)]
pub(super) struct UpdateOf {
    pub(super) update: FlightUpdate,
}

/// The update of a slim record, without its flight.
pub fn decode_update(payload: &[u8]) -> Result<FlightUpdate, BrokerError> {
    let (_, _, json) = split(payload)?;
    Ok(serde_json::from_slice::<UpdateOf>(json)?.update)
}

/// A slim record's event, its flight folded back on. `whole` decodes a record that is
/// not slim (with its references filled in: `store::shared`).
pub fn decode(
    log: &EventLog,
    payload: &[u8],
    whole: fn(&EventLog, &[u8]) -> Result<Event, BrokerError>,
) -> Result<Event, BrokerError> {
    decode_at(log, payload, whole, 0)
}

fn decode_at(
    log: &EventLog,
    payload: &[u8],
    whole: fn(&EventLog, &[u8]) -> Result<Event, BrokerError>,
    hops: u32,
) -> Result<Event, BrokerError> {
    let (prev_seq, prev_pos, json) = split(payload)?;
    let slim: SlimIn = serde_json::from_slice(json)?;
    if slim.v > EVENT_VERSION {
        return Err(BrokerError::Corrupt(format!(
            "event {} has version {}, this build reads up to {EVENT_VERSION}",
            slim.seq, slim.v
        )));
    }
    let (previous, was_delta) = match MEMO.get(log.id(), &slim.update.flight, prev_seq) {
        Some(hit) => hit,
        None => {
            let damaged = |what: &str| {
                BrokerError::Corrupt(format!(
                    "the update before event {} (event {prev_seq} at position {prev_pos}) {what} (run `relay doctor`)",
                    slim.seq
                ))
            };
            if hops >= SLIM_RUN {
                return Err(damaged("is too many updates back"));
            }
            let record = log
                .read_appended(prev_pos)?
                .ok_or_else(|| damaged("is not in the log"))?;
            if record.seq != prev_seq {
                return Err(damaged(&format!("is event {}", record.seq)));
            }
            let event = match is_slim(&record.payload) {
                true => decode_at(log, &record.payload, whole, hops + 1)?,
                false => whole(log, &record.payload)?,
            };
            match event.body {
                EventBody::FlightUpdated { update, flight } if flight.id == slim.update.flight => {
                    let delta = matches!(update.change, FlightChange::Delta { .. });
                    (Arc::new(flight), delta)
                }
                _ => return Err(damaged("is no update of its flight")),
            }
        }
    };
    let mut flight = (*previous).clone();
    if !flight.apply_recorded(&slim.update, None, was_delta) {
        return Err(BrokerError::Corrupt(format!(
            "event {} updates flight {} to {}, which it is at already (run `relay doctor`)",
            slim.seq, flight.id, slim.update.seq
        )));
    }
    let delta = matches!(slim.update.change, FlightChange::Delta { .. });
    MEMO.put(log.id(), slim.seq, Arc::new(flight.clone()), delta);
    Ok(Event {
        v: slim.v,
        seq: slim.seq,
        at: slim.at,
        by: slim.by,
        body: EventBody::FlightUpdated {
            update: slim.update,
            flight,
        },
    })
}

/// The flight of the last slim update read, per log and flight: a reader reading the log
/// in order finds the previous update's flight here instead of reading it back.
/// By log, then by flight (looked up by `&str`, without allocating a key).
struct Memo(Mutex<HashMap<u64, HashMap<String, Remembered>>>);

/// Of a flight in a log: the seq of its update read last, its flight after that update,
/// and whether the update was streamed text.
type Remembered = (u64, Arc<Flight>, bool);

static MEMO: LazyLock<Memo> = LazyLock::new(|| Memo(Mutex::new(HashMap::new())));

impl Memo {
    fn get(&self, log: u64, flight: &str, seq: u64) -> Option<(Arc<Flight>, bool)> {
        let memo = self.0.lock().ok()?;
        match memo.get(&log)?.get(flight) {
            Some((at, flight, delta)) if *at == seq => Some((flight.clone(), *delta)),
            _ => None,
        }
    }

    fn put(&self, log: u64, seq: u64, flight: Arc<Flight>, delta: bool) {
        if let Ok(mut memo) = self.0.lock() {
            if memo.values().map(HashMap::len).sum::<usize>() >= MEMO_MAX {
                memo.clear();
            }
            let flights = memo.entry(log).or_default();
            flights.insert(flight.id.clone(), (seq, flight, delta));
        }
    }
}
