//! A record that names an earlier one: a conversation's messages are a chain through
//! the log, each posted message's record naming the one before it in its conversation,
//! so no index holds a key per message (`store::counts::walk_back`).
//!
//! Such a record's payload starts with [`LINKED`], the earlier record's seq and position
//! (u64 big-endian each), then the record's own payload (its version byte and the rest).
//! The log hands the link apart ([`Record::link`](super::Record)): every other reader
//! of a record sees the payload as it would be without one.

use std::io::Read;

use super::{io, parse_header, EventLog, LogError, Pos, SegmentReader, HEADER};

/// The first byte of a linked record's payload (not a version any record has).
pub const LINKED: u8 = 4;

/// The link's bytes before the record's own payload.
const PREFIX: usize = 17;

/// An earlier record: its seq and where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    pub seq: u64,
    pub pos: Pos,
}

/// `payload` as a record linked to `to` stores it.
pub fn linked(to: Link, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(PREFIX + payload.len());
    v.push(LINKED);
    v.extend_from_slice(&to.seq.to_be_bytes());
    v.extend_from_slice(&to.pos.to_be_bytes());
    v.extend_from_slice(payload);
    v
}

/// A record's payload as read, parted into its link and its own payload.
pub(super) fn split(mut payload: Vec<u8>) -> Result<(Option<Link>, Vec<u8>), LogError> {
    if payload.first() != Some(&LINKED) {
        return Ok((None, payload));
    }
    let link = parse(&payload)?;
    if payload.len() == PREFIX {
        return Err(LogError::Corrupt(
            "a linked record without a payload".into(),
        ));
    }
    payload.drain(..PREFIX);
    Ok((Some(link), payload))
}

fn parse(payload: &[u8]) -> Result<Link, LogError> {
    let word = |at: usize| {
        payload
            .get(at..at + 8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_be_bytes)
    };
    match (word(1), word(9)) {
        (Some(seq), Some(pos)) => Ok(Link { seq, pos }),
        _ => Err(LogError::Corrupt(
            "a linked record too short for its link".into(),
        )),
    }
}

impl EventLog {
    /// The seq of the record at `pos` and the earlier record it links to, once
    /// appended (synced or not: a reader following a chain may pass a record not yet
    /// on disk, and leaves it out of what it shows). Reads the header and the link
    /// only; the checksum is checked when the record is read. `None`: nothing there.
    pub fn link_at(&self, pos: Pos) -> Result<Option<(u64, Option<Link>)>, LogError> {
        let end = self.end();
        let Some((file, at)) = self.file_at(pos, end)? else {
            return Ok(None);
        };
        let mut reader = SegmentReader { file: &file, at };
        let mut header = [0u8; HEADER as usize];
        reader
            .read_exact(&mut header)
            .map_err(io(format!("read the event log at {pos}")))?;
        let (len, _, seq) = parse_header(&header);
        if len as usize <= PREFIX || pos + HEADER + len > end {
            return Ok(Some((seq, None)));
        }
        let mut head = [0u8; PREFIX];
        reader
            .read_exact(&mut head)
            .map_err(io(format!("read the event log at {pos}")))?;
        match head[0] {
            LINKED => Ok(Some((seq, Some(parse(&head)?)))),
            _ => Ok(Some((seq, None))),
        }
    }
}

impl super::Record {
    /// The payload as the log stores it, its link included: what a copy of the log
    /// appends.
    pub fn into_stored(self) -> Vec<u8> {
        match self.link {
            Some(to) => linked(to, &self.payload),
            None => self.payload,
        }
    }
}
