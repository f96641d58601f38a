//! Texts stored once. A flight's final answer arrives several times: as the text of its
//! last agent message item, as the completion's `output`, in the flight that completion
//! carries, and as the body of the reply message posted with it. Each of these events
//! keeps its whole wire JSON (what subscribers are sent does not change); in the log, a
//! text of [`SHARED_MIN`] bytes or more that repeats the flight's last such text is
//! stored as a reference to where that text already is.
//!
//! A record with references has stored version [`SHARED_VERSION`]: the version byte, then
//! the JSON of `{"refs": [...], "event": {...}}`, the event's JSON with each referring
//! string left empty, and each reference saying where in the event it goes (`at`, a JSON
//! pointer) and where the text is: an earlier event's seq, its position in the log, and
//! the pointer in it (`from`); or a string earlier in the same event. Every reader of the
//! log decodes through [`decode_record`], which fills the references in; a record
//! without any (all but about one per flight) is version 1 and is decoded as before.
//!
//! The writer keeps, per live flight, the last text that may be repeated ([`Source`]),
//! so finding a repeat costs no read; a text is compared whole, never by a digest.

use bytes::Bytes;
use relay_protocol::domain::{Flight, FlightChange, FlightUpdate, ItemKind, ItemPhase, SharedStr};
use relay_protocol::event::{Event, EventBody};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::keys::{decode, pair_value, parse_pair, VALUE_VERSION};
use super::log::{EventLog, Pos, TextFile, TextFiles, TEXT_FILE_MIN};
use super::posted::{self, POSTED_VERSION};
use super::slim::{self, SLIM_VERSION};
use crate::error::BrokerError;

/// The stored version of a record with references (version 1: the wire JSON as it is).
pub const SHARED_VERSION: u8 = 2;
/// The same, with a reference to a text in a file of its own ([`TextFiles`]): a build
/// before them would read that text as empty, so they have a version of their own, which
/// such a build refuses ("stored event has version 6").
pub const SHARED_FILE_VERSION: u8 = 6;
/// Shorter texts are stored as they are: a reference would save too little.
pub const SHARED_MIN: usize = 256;
/// References lead to a literal text at once; more than this many hops is damage.
const MAX_HOPS: usize = 4;

/// A text of a flight that is in the log: in event `seq`, at `pos`, at pointer `at`; or
/// in a file of its own (`file`, see [`super::log::TextFiles`]).
#[derive(Debug, Clone)]
pub struct Source {
    pub seq: u64,
    pub pos: Pos,
    pub at: &'static str,
    pub text: SharedStr,
    pub file: Option<TextFile>,
}

impl Source {
    /// A reference, at pointer `at`, to this text.
    fn to(&self, at: &str) -> Ref {
        Ref {
            at: at.to_string(),
            seq: self.seq,
            pos: self.pos,
            from: self.at.to_string(),
            file: self.file.clone(),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Ref {
    /// Where in this event the text goes.
    at: String,
    /// The event holding it (this event's own seq: an earlier string of it).
    seq: u64,
    pos: Pos,
    /// Where the text is in that event.
    from: String,
    /// Or the file it is in (then `seq`, `pos` and `from` are those of the event that
    /// first referred to it, and not read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    file: Option<TextFile>,
}

#[derive(Serialize)]
struct SharedOut<'a> {
    refs: &'a [Ref],
    event: &'a Event,
}

#[derive(Deserialize)]
struct SharedIn {
    refs: Vec<Ref>,
    event: Value,
}

/// The flight an event's repeatable texts belong to, and those texts (pointer, text) in
/// the order they are stored: an agent message's text, a completion's output and its
/// flight's output, a flight's reply.
fn candidates(body: &EventBody) -> Option<(&str, Vec<(&'static str, &SharedStr)>)> {
    // Checked without allocating: this runs for every event, each delta among them.
    fn long<'t>(
        at: &'static str,
        t: Option<&'t SharedStr>,
    ) -> Option<(&'static str, &'t SharedStr)> {
        t.filter(|t| t.len() >= SHARED_MIN).map(|t| (at, t))
    }
    let (flight, texts) = match body {
        EventBody::FlightUpdated { update, flight } => {
            let text = match &update.change {
                FlightChange::Item {
                    item_kind: ItemKind::AgentMessage,
                    phase: ItemPhase::Completed,
                    text,
                    ..
                } => long("/update/text", text.as_ref()),
                FlightChange::State { output, .. } => long("/update/output", output.as_ref()),
                _ => None,
            };
            (
                update.flight.as_str(),
                [text, long("/flight/output", flight.output.as_ref())],
            )
        }
        EventBody::MessagePosted { message, .. } => (
            message.meta.flight.as_deref()?,
            [long("/message/body", Some(&message.body)), None],
        ),
        _ => return None,
    };
    if texts.iter().all(Option::is_none) {
        return None;
    }
    Some((flight, texts.into_iter().flatten().collect()))
}

/// How `event`, to be stored at `pos`, is encoded: its stored bytes, its wire JSON, and
/// (when it has a text a later event of its flight may repeat) that flight and the text
/// it should look for next. `known`: the flight's last such text ([`Writer`] keeps it).
/// `live_max`: the largest event subscribers are handed in memory (a larger one is not
/// encoded for the wire here: see [`Shared::json`]).
///
/// [`Writer`]: crate::broker
pub fn encode(
    event: &mut Event,
    pos: Pos,
    known: impl Fn(&str) -> Option<Source>,
    files: &TextFiles,
    live_max: usize,
) -> Result<Shared, BrokerError> {
    let Some((flight, texts)) = candidates(&event.body) else {
        return Shared::plain(event);
    };
    // The long texts' bytes: room enough to encode the event in one allocation.
    let long: usize = texts.iter().map(|(_, t)| t.len()).sum();
    let mut refs = Vec::new();
    // Bytes of the texts stored as references.
    let mut referred = 0;
    let mut newest: Option<Source> = None;
    let known = known(flight);
    for (at, text) in texts {
        // A text handed on from the event before is its very buffer: equal at a glance.
        let same = |s: &&Source| SharedStr::same_buffer(&s.text, text) || s.text == *text;
        match newest.as_ref().filter(same).or(known.as_ref().filter(same)) {
            Some(source) => {
                referred += text.len();
                refs.push(source.to(at));
            }
            None => {
                // Written to a file before it was reported: referred to there.
                let file = (text.len() >= TEXT_FILE_MIN)
                    .then(|| files.written(text))
                    .flatten();
                let source = Source {
                    seq: event.seq,
                    pos,
                    at,
                    text: text.clone(),
                    file,
                };
                if source.file.is_some() {
                    referred += text.len();
                    refs.push(source.to(at));
                }
                newest = Some(source);
            }
        }
    }
    let source = newest.map(|s| (flight.to_string(), s));
    let mut shared = if refs.is_empty() {
        Shared::plain_sized(event, long)?
    } else {
        // The referring strings are taken out while the record is written (no copy of
        // the event, nor of its texts), and put back.
        let taken: Vec<SharedStr> = refs
            .iter()
            .map(|r| {
                slot(&mut event.body, &r.at)
                    .map(std::mem::take)
                    .unwrap_or_default()
            })
            .collect();
        let version = match refs.iter().any(|r| r.file.is_some()) {
            true => SHARED_FILE_VERSION,
            false => SHARED_VERSION,
        };
        let mut stored = vec![version];
        let written = serde_json::to_writer(&mut stored, &SharedOut { refs: &refs, event });
        for (r, text) in refs.iter().zip(taken) {
            if let Some(slot) = slot(&mut event.body, &r.at) {
                *slot = text;
            }
        }
        written?;
        // The wire JSON holds those texts whole: past the largest event kept in memory
        // for subscribers, the event goes to them from the log (where it is filled in
        // and encoded then), so it is not encoded for the wire here.
        let json = if referred > live_max {
            Bytes::new()
        } else {
            Bytes::from(serde_json::to_vec(event)?)
        };
        Shared {
            stored: Bytes::from(stored),
            json,
            source: None,
        }
    };
    shared.source = source;
    Ok(shared)
}

/// The string at pointer `at` of [`candidates`] in `body`, to take out and put back.
fn slot<'b>(body: &'b mut EventBody, at: &str) -> Option<&'b mut SharedStr> {
    match (body, at) {
        (EventBody::FlightUpdated { update, .. }, "/update/text") => match &mut update.change {
            FlightChange::Item { text, .. } => text.as_mut(),
            _ => None,
        },
        (EventBody::FlightUpdated { update, .. }, "/update/output") => match &mut update.change {
            FlightChange::State { output, .. } => output.as_mut(),
            _ => None,
        },
        (EventBody::FlightUpdated { flight, .. }, "/flight/output") => flight.output.as_mut(),
        (EventBody::MessagePosted { message, .. }, "/message/body") => Some(&mut message.body),
        _ => None,
    }
}

/// A flight, and the newest of its texts a later event may repeat.
pub type Newest = Option<(String, Source)>;

/// An event's encodings ([`encode`]).
pub struct Shared {
    /// What the log stores (version byte first).
    pub stored: Bytes,
    /// The wire JSON: the stored bytes after their version byte when no text is shared;
    /// empty when the shared texts alone make it larger than `live_max` of [`encode`],
    /// the largest event kept in memory for subscribers: they read it from the log.
    pub json: Bytes,
    /// The flight whose newest repeatable text this event holds, and where.
    pub source: Newest,
}

impl Shared {
    /// Without references: the stored bytes are the version byte and the wire JSON.
    pub(super) fn plain(event: &Event) -> Result<Shared, BrokerError> {
        Shared::plain_sized(event, 0)
    }

    /// [`Shared::plain`] of an event holding `long` bytes of text.
    fn plain_sized(event: &Event, long: usize) -> Result<Shared, BrokerError> {
        let stored = Bytes::from(super::keys::encode_sized(event, long)?);
        Ok(Shared {
            json: stored.slice(1..),
            stored,
            source: None,
        })
    }
}

/// A log record's payload decoded as `V` (an [`Event`], or the part of one a reader
/// needs), its references filled in from the records they point at.
/// A slim flight update ([`super::slim`]) has its flight folded back on.
pub fn decode_record<V: DeserializeOwned>(
    log: &EventLog,
    payload: &[u8],
) -> Result<V, BrokerError> {
    match payload.split_first() {
        Some((&(SHARED_VERSION | SHARED_FILE_VERSION), json)) => {
            Ok(serde_json::from_value(resolve(log, json, 0)?)?)
        }
        Some((&SLIM_VERSION, _)) => Ok(serde_json::from_value(serde_json::to_value(
            decode_event(log, payload)?,
        )?)?),
        Some((&POSTED_VERSION, _)) => Ok(serde_json::from_value(serde_json::to_value(
            posted::decode(payload)?,
        )?)?),
        Some((&VALUE_VERSION, _)) | None => decode(payload),
        Some((v, _)) => Err(BrokerError::Corrupt(format!(
            "stored event has version {v}, this build reads {VALUE_VERSION}, {SHARED_VERSION}, {SLIM_VERSION}, {POSTED_VERSION} and {SHARED_FILE_VERSION}"
        ))),
    }
}

/// A log record's event ([`decode_record`] of an [`Event`], without encoding a slim
/// update's event again to decode it).
pub fn decode_event(log: &EventLog, payload: &[u8]) -> Result<Event, BrokerError> {
    if posted::is_posted(payload) {
        return posted::decode(payload);
    }
    match slim::is_slim(payload) {
        true => slim::decode(log, payload, decode_record),
        false => decode_record(log, payload),
    }
}

/// The update of a `flight_updated` record (without folding a slim one's flight back).
pub fn decode_update(log: &EventLog, payload: &[u8]) -> Result<FlightUpdate, BrokerError> {
    match slim::is_slim(payload) {
        true => slim::decode_update(payload),
        false => Ok(decode_record::<slim::UpdateOf>(log, payload)?.update),
    }
}

/// Whether a stored payload has references (to texts that may be megabytes long).
pub fn has_refs(payload: &[u8]) -> bool {
    matches!(
        payload.first(),
        Some(&(SHARED_VERSION | SHARED_FILE_VERSION))
    )
}

/// Whether a stored payload is its event's wire JSON (after the version byte): not with
/// references, nor a slim flight update, nor a posted message in protobuf.
pub fn is_wire_json(payload: &[u8]) -> bool {
    !has_refs(payload) && !slim::is_slim(payload) && !posted::is_posted(payload)
}

fn resolve(log: &EventLog, json: &[u8], hops: usize) -> Result<Value, BrokerError> {
    let SharedIn { refs, mut event } = serde_json::from_slice(json)?;
    let own = event.get("seq").and_then(Value::as_u64);
    // Where each reference's text is read from (`None`: earlier in this event): a
    // completion refers twice to one answer (its output and its flight's), read and
    // parsed once, and kept only while a later reference needs it.
    let key = |r: &Ref| (r.file.clone(), r.seq, r.from.clone());
    let keys: Vec<_> = refs
        .iter()
        .map(|r| (r.file.is_some() || Some(r.seq) != own).then(|| key(r)))
        .collect();
    let mut kept: Option<(usize, String)> = None;
    for (i, r) in refs.iter().enumerate() {
        let text = match &keys[i] {
            None => event
                .pointer(&r.from)
                .and_then(Value::as_str)
                .map(str::to_string),
            Some(k) => {
                let same = matches!(&kept, Some((at, _)) if keys[*at].as_ref() == Some(k));
                let text = match kept.take().filter(|_| same) {
                    Some((_, text)) => Some(text),
                    None => match &r.file {
                        Some(file) => Some(log.texts().read(file)?),
                        None => source(log, r, hops)?,
                    },
                };
                if let Some(text) = text.as_ref().filter(|_| keys[i + 1..].contains(&keys[i])) {
                    kept = Some((i, text.clone()));
                }
                text
            }
        };
        let text = text.ok_or_else(|| damaged(r, "has no text there"))?;
        *event
            .pointer_mut(&r.at)
            .ok_or_else(|| damaged(r, "has no place for it"))? = Value::String(text);
    }
    Ok(event)
}

fn source(log: &EventLog, r: &Ref, hops: usize) -> Result<Option<String>, BrokerError> {
    if hops >= MAX_HOPS {
        return Err(damaged(r, "leads through too many references"));
    }
    // The text is earlier in the log than the record that refers to it.
    let record = log
        .read_appended(r.pos)?
        .ok_or_else(|| damaged(r, "is not in the log"))?;
    if record.seq != r.seq {
        return Err(damaged(r, &format!("points at event {}", record.seq)));
    }
    let value = match record.payload.split_first() {
        Some((&(SHARED_VERSION | SHARED_FILE_VERSION), json)) => resolve(log, json, hops + 1)?,
        // A text of its update is in the record as it is; its flight must be folded on.
        Some((&SLIM_VERSION, _)) if r.from.starts_with("/update/") => {
            slim::decode_value(&record.payload)?
        }
        Some((&SLIM_VERSION | &POSTED_VERSION, _)) => {
            serde_json::to_value(decode_event(log, &record.payload)?)?
        }
        _ => decode::<Value>(&record.payload)?,
    };
    Ok(value
        .pointer(&r.from)
        .and_then(Value::as_str)
        .map(str::to_string))
}

fn damaged(r: &Ref, what: &str) -> BrokerError {
    BrokerError::Corrupt(format!(
        "the text at {} of event {} (position {}) {what} (run `relay doctor`)",
        r.from, r.seq, r.pos
    ))
}

/// The stored version of a `flights` record whose output is in the log: the version
/// byte, the seq and position (u64 big-endian each) of the update that completed the
/// flight with it, then the flight's JSON without its output.
pub const FLIGHT_OUTPUT_IN_LOG: u8 = 2;

/// `flight`'s record for the `flights` tree. `completed`: the seq and position of the
/// event that made it, when that was its completion with its output; an output of
/// [`SHARED_MIN`] bytes or more is then not copied into the record, but read from that
/// update ([`decode_flight`]).
pub fn encode_flight(
    flight: &Flight,
    completed: Option<(u64, Pos)>,
) -> Result<Vec<u8>, BrokerError> {
    match (completed, flight.output.as_deref()) {
        (Some((seq, pos)), Some(output)) if output.len() >= SHARED_MIN => {
            let mut stored = vec![FLIGHT_OUTPUT_IN_LOG];
            stored.extend_from_slice(&pair_value(seq, pos));
            serde_json::to_writer(&mut stored, &flight.without_output())?;
            Ok(stored)
        }
        _ => super::keys::encode(flight),
    }
}

/// A `flights` record, with its output read from the log where it is kept there.
pub fn decode_flight(log: &EventLog, stored: &[u8]) -> Result<Flight, BrokerError> {
    decode_flight_from(log, stored, |_| None)
}

/// [`decode_flight`], for the writer: `pending` gives the output of an event of the
/// batch being written (not in the log yet), by its seq.
pub fn decode_flight_from(
    log: &EventLog,
    stored: &[u8],
    pending: impl Fn(u64) -> Option<SharedStr>,
) -> Result<Flight, BrokerError> {
    let Some((seq, pos, json)) = output_in_log(stored)? else {
        return decode(stored);
    };
    if let Some(output) = pending(seq) {
        let mut flight: Flight = serde_json::from_slice(json)?;
        flight.output = Some(output);
        return Ok(flight);
    }
    #[derive(Deserialize)]
    struct UpdateOf {
        update: OutputOf,
    }
    #[derive(Deserialize)]
    struct OutputOf {
        output: Option<SharedStr>,
    }
    let mut flight: Flight = serde_json::from_slice(json)?;
    let missing = || {
        BrokerError::Corrupt(format!(
            "the output of flight {} is not in event {seq} at position {pos} (run `relay doctor`)",
            flight.id
        ))
    };
    let record = log.read_appended(pos)?.ok_or_else(missing)?;
    if record.seq != seq {
        return Err(missing());
    }
    let of: UpdateOf = decode_record(log, &record.payload)?;
    flight.output = Some(of.update.output.ok_or_else(missing)?);
    Ok(flight)
}

/// A `flights` record without reading its output from the log (`None` where it is
/// kept there): for what needs only its state, usage or links.
pub fn decode_flight_without_output(stored: &[u8]) -> Result<Flight, BrokerError> {
    match output_in_log(stored)? {
        Some((_, _, json)) => Ok(serde_json::from_slice(json)?),
        None => decode(stored),
    }
}

/// Where a `flights` record's output is (the seq and position of its completion), and
/// the rest of the record (the flight's JSON).
type OutputAt<'a> = (u64, Pos, &'a [u8]);

fn output_in_log(stored: &[u8]) -> Result<Option<OutputAt<'_>>, BrokerError> {
    let Some((&FLIGHT_OUTPUT_IN_LOG, rest)) = stored.split_first() else {
        return Ok(None);
    };
    let (pair, json) = rest
        .split_at_checked(16)
        .ok_or_else(|| BrokerError::Corrupt("a flight record is too short".into()))?;
    let (seq, pos) = parse_pair(pair)?;
    Ok(Some((seq, pos, json)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::store::Store;

    /// A record whose reference leads nowhere, to another event, or round in a circle is
    /// a typed error, never a panic or a wrong text.
    #[test]
    fn a_damaged_reference_is_a_typed_error() {
        let store = Store::temporary().unwrap();
        let log = store.log();
        let literal = br#"{"seq":1,"body":"text"}"#;
        let mut first = vec![VALUE_VERSION];
        first.extend_from_slice(literal);
        log.append([(1, &first[..])]).unwrap();
        let shared = |seq: u64, pos: Pos, from: &str| {
            let mut v = vec![SHARED_VERSION];
            v.extend_from_slice(
                format!(
                    r#"{{"refs":[{{"at":"/body","seq":{seq},"pos":{pos},"from":"{from}"}}],"event":{{"seq":9,"body":""}}}}"#
                )
                .as_bytes(),
            );
            v
        };
        let ok: Value = decode_record(log, &shared(1, 0, "/body")).unwrap();
        assert_eq!(ok["body"], "text");
        for (bad, why) in [
            (shared(1, 1 << 40, "/body"), "is not in the log"),
            (shared(2, 0, "/body"), "points at event 1"),
            (shared(1, 0, "/nothing"), "has no text there"),
            (shared(9, 0, "/missing"), "has no text there"),
        ] {
            match decode_record::<Value>(log, &bad) {
                Err(BrokerError::Corrupt(m)) => assert!(m.contains(why), "{m}"),
                other => panic!("{why}: {other:?}"),
            }
        }
        // A reference to a record that refers to itself (hop after hop) stops.
        let pos = log.end();
        let circle = shared(2, pos, "/body");
        log.append([(2, &circle[..])]).unwrap();
        match decode_record::<Value>(log, &circle) {
            Err(BrokerError::Corrupt(m)) => assert!(m.contains("too many references"), "{m}"),
            other => panic!("{other:?}"),
        }
        let mut newer = first.clone();
        newer[0] = 7;
        assert!(
            matches!(decode_record::<Value>(log, &newer), Err(BrokerError::Corrupt(m)) if m.contains("version 7"))
        );
    }
}
