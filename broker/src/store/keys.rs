//! The trees, their keys and the versioned encoding of every stored value (the layout
//! is in the module's header, `store/mod.rs`).

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::BrokerError;

/// Version byte in front of every stored value.
pub(super) const VALUE_VERSION: u8 = 1;

/// Projection trees, in the order [`Store`](super::Store) holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum T {
    /// seq -> the event's position in the log (an index of the log).
    EventPos = 0,
    Agents,
    Conversations,
    Messages,
    MessageIds,
    Invocations,
    Flights,
    FlightUpdates,
    Deliveries,
    Approvals,
    Bindings,
    /// flight id -> ids of its approvals, so a batch can find them without a scan.
    FlightApprovals,
    /// node name -> stream seq of the last report applied (not a projection: it
    /// de-duplicates redelivered node reports, written with the command they carry).
    ReportCursors,
    /// agent name -> its secret variables (not a projection: never in an event, so
    /// never published nor replayed; deleted with the agent).
    Secrets,
    /// ids of the flights not yet ended (an index: live listings read it instead of
    /// every flight ever).
    LiveFlights,
    /// Markers of one-time work done on this database (not a projection).
    Meta,
    /// parent flight id, 0, child flight id -> nothing: the agent-to-agent tree of a
    /// flight without a scan (an index).
    FlightChildren,
    /// Where the events of an agent, a conversation or a flight are in the log (an
    /// index for replays: see the module docs).
    ReplayIndex,
    /// rule id -> `Rule`: remembered decisions, with their match counters.
    Rules,
    /// agent, 0, `YYYY-MM-DD` -> `UsageTotals` of the agent's flights created that UTC
    /// day (budgets read it without a scan).
    UsageDaily,
    /// root flight id -> `UsageTotals` of its agent-to-agent tree.
    UsageTrees,
}

pub(super) const TREE_NAMES: [&str; 21] = [
    "event_pos",
    "agents",
    "conversations",
    "messages",
    "message_ids",
    "invocations",
    "flights",
    "flight_updates",
    "deliveries",
    "approvals",
    "bindings",
    "flight_approvals",
    "report_cursors",
    "agent_secrets",
    "live_flights",
    "meta",
    "flight_children",
    "replay_index",
    "rules",
    "usage_daily",
    "usage_trees",
];

pub fn encode<V: Serialize>(v: &V) -> Result<Vec<u8>, BrokerError> {
    encode_sized(v, 0)
}

/// [`encode`] of a value holding `long` bytes of text: the buffer is sized for them up
/// front (not grown, and copied, a doubling at a time).
pub fn encode_sized<V: Serialize>(v: &V, long: usize) -> Result<Vec<u8>, BrokerError> {
    let mut out = Vec::with_capacity(256 + long + long / 16);
    out.push(VALUE_VERSION);
    serde_json::to_writer(&mut out, v)?;
    Ok(out)
}

pub fn decode<V: DeserializeOwned>(bytes: &[u8]) -> Result<V, BrokerError> {
    match bytes.split_first() {
        Some((&VALUE_VERSION, rest)) => Ok(serde_json::from_slice(rest)?),
        Some((v, _)) => Err(BrokerError::Corrupt(format!(
            "stored value has version {v}, this build reads {VALUE_VERSION}"
        ))),
        None => Err(BrokerError::Corrupt("empty stored value".into())),
    }
}

/// `a`, 0, `b`: a key of an index from one id to many.
pub fn pair_key(a: &str, b: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(a.len() + 1 + b.len());
    key.extend_from_slice(a.as_bytes());
    key.push(0);
    key.extend_from_slice(b.as_bytes());
    key
}

pub fn seq_key(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

/// Two u64s, big-endian: an update's (event seq, log position), or any such pair.
pub fn pair_value(a: u64, b: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&a.to_be_bytes());
    v[8..].copy_from_slice(&b.to_be_bytes());
    v
}

/// The pair of [`pair_value`] read back.
pub fn parse_pair(v: &[u8]) -> Result<(u64, u64), BrokerError> {
    let word = |r: std::ops::Range<usize>| {
        v.get(r)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_be_bytes)
    };
    match (v.len(), word(0..8), word(8..16)) {
        (16, Some(a), Some(b)) => Ok((a, b)),
        _ => Err(BrokerError::Corrupt(format!(
            "a stored position is {} bytes, not 16",
            v.len()
        ))),
    }
}

/// A u64 stored big-endian (a log position in `event_pos`).
pub fn parse_u64(v: &[u8]) -> Result<u64, BrokerError> {
    <[u8; 8]>::try_from(v)
        .map(u64::from_be_bytes)
        .map_err(|_| BrokerError::Corrupt(format!("a stored position is {} bytes, not 8", v.len())))
}

/// `prefix`, 0, `n` big-endian: keys that sort by `n` within one prefix.
pub fn child_key(prefix: &str, n: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + 9);
    k.extend_from_slice(prefix.as_bytes());
    k.push(0);
    k.extend_from_slice(&n.to_be_bytes());
    k
}

pub(super) fn child_prefix(prefix: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + 1);
    k.extend_from_slice(prefix.as_bytes());
    k.push(0);
    k
}

/// What a replay reads the log by: one agent's, conversation's or flight's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Agent,
    Conversation,
    Flight,
}

impl Scope {
    pub(super) fn key(self, id: &str, seq: u64) -> Vec<u8> {
        let letter = match self {
            Scope::Agent => 'a',
            Scope::Conversation => 'c',
            Scope::Flight => 'f',
        };
        child_key(&format!("{letter}{id}"), seq)
    }
}

/// A new message's id: `msg_` and a UUIDv7 (its time and 12 random bits) whose last 62
/// bits, which RFC 9562 leaves to random bits or a counter, are `seq`, the global seq of
/// the event that posts it. The message is found by its id from that seq and the log
/// (`queries::message_of_id`), without a key of its own: `message_ids` holds only the
/// ids of messages posted before ids carried their seq.
pub fn message_id(seq: u64) -> String {
    let mut bytes = *uuid::Uuid::now_v7().as_bytes();
    // The variant's two bits (`10`), then the seq (a seq never reaches 2^62).
    bytes[8..].copy_from_slice(&((seq & (u64::MAX >> 2)) | (1 << 63)).to_be_bytes());
    format!("msg_{}", uuid::Uuid::from_bytes(bytes).simple())
}

/// The seq a message id made by [`message_id`] carries. An older id (random bits
/// there) gives a seq too, usually far past the log's end: the reader checks that the
/// event at that seq posted a message with this very id.
pub fn message_id_seq(id: &str) -> Option<u64> {
    let hex = id.strip_prefix("msg_")?;
    let uuid = uuid::Uuid::try_parse(hex).ok()?;
    if hex.len() != 32 || uuid.get_version_num() != 7 {
        return None;
    }
    let tail = <[u8; 8]>::try_from(&uuid.as_bytes()[8..]).ok()?;
    Some(u64::from_be_bytes(tail) & (u64::MAX >> 2))
}

/// `messages`' key for conversation `id`'s last message, from which the others are
/// found along their records' links ([`Link`](super::log::Link)): after every key of
/// a message of its own.
pub fn last_message_key(id: &str) -> Vec<u8> {
    child_key(id, u64::MAX)
}

/// The last message's value: its event's seq, its log position and its index (u64 BE).
pub fn last_message_value(seq: u64, pos: u64, index: u64) -> Vec<u8> {
    let mut v = pair_value(seq, pos).to_vec();
    v.extend_from_slice(&index.to_be_bytes());
    v
}

/// The value of [`last_message_value`] read back.
pub fn parse_last_message(v: &[u8]) -> Result<(u64, u64, u64), BrokerError> {
    let index = v
        .get(16..)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| BrokerError::Corrupt("a last message's value is not 24 bytes".into()))?;
    let (seq, pos) = parse_pair(&v[..16])?;
    Ok((seq, pos, index))
}
