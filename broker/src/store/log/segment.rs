//! One segment file: sequential reads by `pread`, the header of a record, making a
//! segment, and the scan that finds where the active one ends at open.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use super::{checksum, io, LogError, HEADER, MAX_PAYLOAD};

/// Sequential reads of one segment by `pread` (the shared handle's cursor stays put).
pub(super) struct SegmentReader<'a> {
    pub(super) file: &'a File,
    pub(super) at: u64,
}

impl Read for SegmentReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read_at(buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

pub(super) fn parse_header(h: &[u8; HEADER as usize]) -> (u64, u32, u64) {
    let word = |r: std::ops::Range<usize>| {
        let mut b = [0u8; 8];
        b[..r.len()].copy_from_slice(&h[r]);
        u64::from_le_bytes(b)
    };
    (word(0..4), word(4..8) as u32, word(8..16))
}

pub(super) fn create_segment(path: &Path) -> Result<File, LogError> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io(format!("create {}", path.display())))
}

/// Scans the active segment: its valid length and last seq. A torn tail is cut off
/// (and the cut synced), so the next append starts after the last whole record.
pub(super) fn recover(path: &Path, first_seq: u64) -> Result<(u64, u64), LogError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(io(format!("open {}", path.display())))?;
    let file_len = file
        .metadata()
        .map_err(io(format!("stat {}", path.display())))?
        .len();
    let mut reader = BufReader::with_capacity(1 << 20, SegmentReader { file: &file, at: 0 });
    let (mut len, mut last_seq) = (0u64, first_seq - 1);
    let mut payload = Vec::new();
    loop {
        let mut header = [0u8; HEADER as usize];
        if len + HEADER > file_len || reader.read_exact(&mut header).is_err() {
            break;
        }
        let (plen, crc, seq) = parse_header(&header);
        if plen > MAX_PAYLOAD || len + HEADER + plen > file_len {
            break;
        }
        payload.resize(plen as usize, 0);
        if reader.read_exact(&mut payload).is_err() || checksum(seq, &payload) != crc {
            break;
        }
        if seq != last_seq + 1 {
            return Err(LogError::Corrupt(format!(
                "{}: seq {seq} follows seq {last_seq}",
                path.display()
            )));
        }
        last_seq = seq;
        len += HEADER + plen;
    }
    if len < file_len {
        tracing::warn!(
            segment = %path.display(),
            cut = file_len - len,
            "the event log ended in a record never synced (a crash while writing): cut off"
        );
        file.set_len(len)
            .and_then(|()| file.sync_data())
            .map_err(io(format!("cut the torn tail of {}", path.display())))?;
    }
    Ok((len, last_seq))
}
