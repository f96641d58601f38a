//! A record found by its seq, walking the records' headers from one before it.

use std::io::Read;

use super::{io, parse_header, record_len, EventLog, LogError, Pos, SegmentReader, HEADER};

impl EventLog {
    /// Where the synced record of `seq` is, walking the records' headers from `from` (a
    /// record at or before it: see `event_pos` in `store`). `None`: not on disk (yet).
    /// Reads only headers; the record's checksum is checked when it is read.
    pub fn find(&self, from: Pos, seq: u64) -> Result<Option<Pos>, LogError> {
        self.find_before(from, seq, self.synced_end())
    }

    /// Where the record of `seq` is once appended, synced or not (as [`Self::find`]):
    /// for the writer's own reads, as [`Self::read_appended`].
    pub fn find_appended(&self, from: Pos, seq: u64) -> Result<Option<Pos>, LogError> {
        self.find_before(from, seq, self.end())
    }

    fn find_before(&self, from: Pos, seq: u64, end: Pos) -> Result<Option<Pos>, LogError> {
        let mut pos = from;
        while pos.saturating_add(HEADER) <= end {
            let (start, file) = self.segment_holding(pos)?;
            let mut header = [0u8; HEADER as usize];
            SegmentReader {
                file: &file,
                at: pos - start,
            }
            .read_exact(&mut header)
            .map_err(io(format!("read the event log at {pos}")))?;
            let (len, _, at) = parse_header(&header);
            match at.cmp(&seq) {
                std::cmp::Ordering::Equal => return Ok(Some(pos)),
                std::cmp::Ordering::Greater => {
                    return Err(LogError::Corrupt(format!(
                        "looking for event {seq} from {from}, the log has event {at} at {pos}"
                    )))
                }
                std::cmp::Ordering::Less => pos = pos.saturating_add(record_len(len as usize)),
            }
        }
        Ok(None)
    }
}
