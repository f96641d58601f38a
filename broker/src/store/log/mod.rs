//! The event log: append-only segment files, the store's source of truth.
//!
//! # What is synced when
//! - A batch's events are appended (one `write` per batch) on the storage thread, before
//!   any of the batch reaches sled; nothing is acknowledged or published yet.
//! - Once per group of batches (the storage thread's group commit) [`EventLog::sync`]
//!   calls `fdatasync` on the active segment: it writes the file's data and its size to
//!   stable storage and flushes the drive's write cache (unlike sled's flush, which is
//!   `sync_file_range`). Only then are the group's events published and their callers
//!   answered: an acknowledged event survives a power loss.
//! - A segment is sealed when the next record would take it past [`SEGMENT_BYTES`]: it
//!   is `fdatasync`ed first, then the next segment is created and the directory
//!   `fsync`ed, so a sealed segment is whole and every segment's name is on disk.
//! - Readers see only what has been synced ([`EventLog::synced_end`]): never an event
//!   that a power loss could still take back.
//! - A long answer may be in a file of its own in `texts/` ([`texts`]), written and
//!   synced (file and directory) before any record can refer to it.
//!
//! # Format
//! Segment `<first byte offset, 20 digits>-<first seq, 20 digits>.seg`. Positions
//! ([`Pos`]) are global byte offsets: segments follow each other without a gap, so a
//! record's position is known before it is written (the writer's batch stores it
//! in the projections). A record is `[u32 LE payload length][u32 LE crc32 of seq and
//! payload][u64 LE seq][payload]`; seqs follow each other by one. Opening the log scans
//! the active segment and cuts a torn tail (a record whose length or checksum does not
//! hold: it was never synced, so never acknowledged).

mod find;
mod link;
mod segment;
mod texts;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read};

pub use link::{linked, Link, LINKED};
use segment::{create_segment, parse_header, recover, SegmentReader};
use std::os::unix::fs::{DirBuilderExt, FileExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
pub use texts::{LogTexts, TextFile, TextFiles, TEXT_FILE_MIN};

/// A record's global byte offset in the log.
pub type Pos = u64;

/// A segment is sealed once it holds this much (a bigger record gets one of its own).
pub const SEGMENT_BYTES: u64 = 64 << 20;
/// Bytes in front of each record's payload.
pub const HEADER: u64 = 16;
/// Largest payload a record may hold.
pub const MAX_PAYLOAD: u64 = 1 << 30;

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("event log I/O ({what}): {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("event log is damaged: {0}")]
    Corrupt(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LogError {
    let what = what.into();
    move |source| LogError::Io { what, source }
}

impl From<LogError> for crate::error::BrokerError {
    fn from(e: LogError) -> crate::error::BrokerError {
        match e {
            LogError::Corrupt(what) => crate::error::BrokerError::Corrupt(what),
            io => crate::error::BrokerError::Log(io.to_string()),
        }
    }
}

/// One record read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub pos: Pos,
    pub seq: u64,
    /// The payload, without its link if it has one ([`link`]).
    pub payload: Vec<u8>,
    /// The earlier record it names ([`link`]).
    pub link: Option<Link>,
    /// The payload's length as stored, its link's bytes included.
    stored: u64,
}

impl Record {
    /// Where the next record starts.
    pub fn next(&self) -> Pos {
        self.pos + HEADER + self.stored
    }
}

/// A payload longer than this is written to the file directly, not through the batch's
/// buffer.
const DIRECT_PAYLOAD: usize = 1 << 20;

/// The bytes a record of `payload_len` takes in the log.
pub fn record_len(payload_len: usize) -> u64 {
    HEADER + payload_len as u64
}

/// Appends the record of `seq` with `payload` to `buf`, as the log stores it (tools and
/// tests that write a log by hand use it too).
pub fn frame_into(buf: &mut Vec<u8>, seq: u64, payload: &[u8]) {
    buf.extend_from_slice(&header(seq, payload));
    buf.extend_from_slice(payload);
}

/// A record's header: the payload's length, its checksum, the seq.
fn header(seq: u64, payload: &[u8]) -> [u8; HEADER as usize] {
    let mut h = [0u8; HEADER as usize];
    h[..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    h[4..8].copy_from_slice(&checksum(seq, payload).to_le_bytes());
    h[8..].copy_from_slice(&seq.to_le_bytes());
    h
}

/// The name of the segment that starts at byte `start` with seq `first_seq`.
pub fn segment_name(start: Pos, first_seq: u64) -> String {
    format!("{start:020}-{first_seq:020}.seg")
}

/// Reads the record at `pos` from `reader` (positioned there), which must end by `end`
/// and hold its checksum.
fn read_record(reader: &mut impl Read, pos: Pos, end: Pos) -> Result<Record, LogError> {
    let mut header = [0u8; HEADER as usize];
    reader
        .read_exact(&mut header)
        .map_err(io(format!("read the event log at {pos}")))?;
    let (len, crc, seq) = parse_header(&header);
    if pos + HEADER + len > end {
        return Err(LogError::Corrupt(format!(
            "the record at {pos} runs past the end of what it may read ({end})"
        )));
    }
    let mut payload = vec![0u8; len as usize];
    reader
        .read_exact(&mut payload)
        .map_err(io(format!("read the event log at {pos}")))?;
    if checksum(seq, &payload) != crc {
        return Err(LogError::Corrupt(format!(
            "the record at {pos} fails its checksum"
        )));
    }
    let (link, payload) = link::split(payload)?;
    Ok(Record {
        pos,
        seq,
        payload,
        link,
        stored: len,
    })
}

fn checksum(seq: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&seq.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// The append-only event log of one store. Appends and syncs come from the storage
/// thread only; reads from anywhere.
pub struct EventLog {
    dir: PathBuf,
    /// Segment start -> a read handle.
    segments: RwLock<BTreeMap<Pos, Arc<File>>>,
    tail: Mutex<Tail>,
    /// End of what is appended / synced, and the seq of the last record synced.
    appended: AtomicU64,
    synced: AtomicU64,
    synced_seq: AtomicU64,
    /// Notified after each sync, for [`EventLog::wait_synced`].
    on_sync: (Mutex<()>, Condvar),
    /// Unique among the logs this process opened ([`EventLog::id`]).
    id: u64,
    /// Long texts in files of their own, that records refer to ([`texts`]).
    texts: TextFiles,
}

struct Tail {
    file: File,
    /// Global offset where the active segment starts, and its length.
    start: Pos,
    len: u64,
    /// The seq of the last record appended.
    last_seq: u64,
    /// Appended since the last sync.
    dirty: bool,
    buf: Vec<u8>,
}

fn parse_name(name: &str) -> Option<(Pos, u64)> {
    let stem = name.strip_suffix(".seg")?;
    let (start, seq) = stem.split_once('-')?;
    if start.len() != 20 || seq.len() != 20 {
        return None;
    }
    Some((start.parse().ok()?, seq.parse().ok()?))
}

fn open_read(path: &Path) -> Result<File, LogError> {
    File::open(path).map_err(io(format!("open {}", path.display())))
}

fn sync_dir(dir: &Path) -> Result<(), LogError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(format!("fsync directory {}", dir.display())))
}

impl EventLog {
    /// Opens (or creates) the log in `dir`, cutting a torn tail off its active segment.
    pub fn open(dir: &Path) -> Result<EventLog, LogError> {
        // Private whatever the umask, as every file of a data dir.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io(format!("create {}", dir.display())))?;
        let mut found: Vec<(Pos, u64, PathBuf)> = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io(format!("read {}", dir.display())))? {
            let entry = entry.map_err(io(format!("read {}", dir.display())))?;
            let name = entry.file_name();
            if let Some((start, seq)) = name.to_str().and_then(parse_name) {
                found.push((start, seq, entry.path()));
            }
        }
        found.sort();
        if found.is_empty() {
            let path = dir.join(segment_name(0, 1));
            create_segment(&path)?;
            sync_dir(dir)?;
            found.push((0, 1, path));
        }
        let mut segments = BTreeMap::new();
        // Sealed segments were whole before the next one was made: they must join up.
        for pair in found.windows(2) {
            let (start, _, path) = &pair[0];
            let len = std::fs::metadata(path)
                .map_err(io(format!("stat {}", path.display())))?
                .len();
            if start + len != pair[1].0 {
                return Err(LogError::Corrupt(format!(
                    "segment {} ends at {} but the next starts at {}",
                    path.display(),
                    start + len,
                    pair[1].0
                )));
            }
        }
        for (start, _, path) in &found {
            segments.insert(*start, Arc::new(open_read(path)?));
        }
        let (start, first_seq, path) = found.last().cloned().ok_or_else(|| {
            LogError::Corrupt("no segment".into()) // unreachable: one was made above
        })?;
        let (len, last_seq) = recover(&path, first_seq)?;
        let file = OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(io(format!("open {}", path.display())))?;
        let end = start + len;
        static OPENED: AtomicU64 = AtomicU64::new(0);
        Ok(EventLog {
            id: OPENED.fetch_add(1, Ordering::Relaxed),
            texts: TextFiles::new(dir),
            dir: dir.to_path_buf(),
            segments: RwLock::new(segments),
            tail: Mutex::new(Tail {
                file,
                start,
                len,
                last_seq,
                dirty: false,
                buf: Vec::new(),
            }),
            appended: AtomicU64::new(end),
            synced: AtomicU64::new(end),
            synced_seq: AtomicU64::new(last_seq),
            on_sync: (Mutex::new(()), Condvar::new()),
        })
    }

    /// The long texts written in files of their own ([`texts`]).
    pub fn texts(&self) -> &TextFiles {
        &self.texts
    }

    /// Where the next record will go.
    pub fn end(&self) -> Pos {
        self.appended.load(Ordering::Acquire)
    }

    /// End of what is on stable storage (and readable).
    pub fn synced_end(&self) -> Pos {
        self.synced.load(Ordering::Acquire)
    }

    /// The seq of the last record on stable storage (0: none).
    pub fn last_seq(&self) -> u64 {
        self.synced_seq.load(Ordering::Acquire)
    }

    fn tail(&self) -> Result<std::sync::MutexGuard<'_, Tail>, LogError> {
        self.tail
            .lock()
            .map_err(|_| LogError::Corrupt("a writer of the log panicked".into()))
    }

    /// The seq of the last record appended (synced or not).
    pub fn appended_seq(&self) -> Result<u64, LogError> {
        Ok(self.tail()?.last_seq)
    }

    /// Appends records (seq, payload), each seq one past the last, in one write. Not
    /// durable until [`EventLog::sync`]. Returns the position of the first.
    pub fn append<'p>(
        &self,
        records: impl IntoIterator<Item = (u64, &'p [u8])>,
    ) -> Result<Pos, LogError> {
        let mut tail = self.tail()?;
        let first = tail.start + tail.len;
        let mut buf = std::mem::take(&mut tail.buf);
        buf.clear();
        for (seq, payload) in records {
            if seq != tail.last_seq + 1 {
                return Err(LogError::Corrupt(format!(
                    "append of seq {seq} after seq {}",
                    tail.last_seq
                )));
            }
            if payload.len() as u64 > MAX_PAYLOAD {
                return Err(LogError::Corrupt(format!(
                    "an event of {} bytes is over the log's limit",
                    payload.len()
                )));
            }
            let rec = record_len(payload.len());
            if tail.len > 0 && tail.len + buf.len() as u64 + rec > SEGMENT_BYTES {
                self.write_out(&mut tail, &buf)?;
                buf.clear();
                self.roll(&mut tail, seq)?;
            }
            if payload.len() > DIRECT_PAYLOAD {
                // A long answer goes to the file as it is: not copied into the batch's
                // buffer first (growing it to the answer's size, page by page).
                self.write_out(&mut tail, &buf)?;
                buf.clear();
                self.write_out(&mut tail, &header(seq, payload))?;
                self.write_out(&mut tail, payload)?;
            } else {
                frame_into(&mut buf, seq, payload);
            }
            tail.last_seq = seq;
        }
        self.write_out(&mut tail, &buf)?;
        // Keep a small buffer for the next batch, not the largest one ever written.
        if buf.capacity() <= 1 << 20 {
            tail.buf = buf;
        }
        Ok(first)
    }

    /// Takes back what was appended past `pos` (`last_seq`: the seq of the record
    /// before it): a batch that was not committed after all. Never past what is synced,
    /// nor into a sealed segment. The file is cut there, so a crash cannot bring the
    /// records taken back to life.
    pub fn rewind(&self, pos: Pos, last_seq: u64) -> Result<(), LogError> {
        let mut tail = self.tail()?;
        if pos == tail.start + tail.len {
            // Nothing reached the file (a batch whose write failed): its seqs still go.
            tail.last_seq = last_seq;
            return Ok(());
        }
        if pos < self.synced_end() || pos < tail.start || pos > tail.start + tail.len {
            return Err(LogError::Corrupt(format!(
                "cannot take the log back to {pos}: synced to {}, active segment {}..{}",
                self.synced_end(),
                tail.start,
                tail.start + tail.len
            )));
        }
        tail.file
            .set_len(pos - tail.start)
            .map_err(io("cut the event log"))?;
        tail.len = pos - tail.start;
        tail.last_seq = last_seq;
        self.appended.store(pos, Ordering::Release);
        Ok(())
    }

    fn write_out(&self, tail: &mut Tail, bytes: &[u8]) -> Result<(), LogError> {
        if bytes.is_empty() {
            return Ok(());
        }
        let at = tail.len;
        tail.file
            .write_all_at(bytes, at)
            .map_err(io("append to the event log"))?;
        tail.len += bytes.len() as u64;
        tail.dirty = true;
        self.appended
            .store(tail.start + tail.len, Ordering::Release);
        Ok(())
    }

    /// Seals the active segment (synced first) and starts the next at the same offset.
    fn roll(&self, tail: &mut Tail, first_seq: u64) -> Result<(), LogError> {
        self.sync_tail(tail)?;
        let start = tail.start + tail.len;
        let path = self.dir.join(segment_name(start, first_seq));
        let file = create_segment(&path)?;
        sync_dir(&self.dir)?;
        self.segments
            .write()
            .map_err(|_| LogError::Corrupt("a reader of the log panicked".into()))?
            .insert(start, Arc::new(open_read(&path)?));
        tail.file = file;
        tail.start = start;
        tail.len = 0;
        Ok(())
    }

    /// Makes every appended record durable (`fdatasync`), then readable.
    pub fn sync(&self) -> Result<(), LogError> {
        let mut tail = self.tail()?;
        self.sync_tail(&mut tail)
    }

    fn sync_tail(&self, tail: &mut Tail) -> Result<(), LogError> {
        if tail.dirty {
            tail.file
                .sync_data()
                .map_err(io("fdatasync of the event log"))?;
            tail.dirty = false;
        }
        self.synced.store(tail.start + tail.len, Ordering::Release);
        self.synced_seq.store(tail.last_seq, Ordering::Release);
        let _guard = self.on_sync.0.lock();
        self.on_sync.1.notify_all();
        Ok(())
    }

    /// Blocks until the record with `seq` is on stable storage, or `timeout` passed
    /// (then `false`). For readers that know a seq is committed and about to be synced.
    pub fn wait_synced(&self, seq: u64, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let Ok(mut guard) = self.on_sync.0.lock() else {
            return false;
        };
        while self.last_seq() < seq {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            guard = match self.on_sync.1.wait_timeout(guard, left) {
                Ok((g, _)) => g,
                Err(_) => return false,
            };
        }
        true
    }

    fn segment_at(&self, pos: Pos) -> Result<Option<(Pos, Arc<File>)>, LogError> {
        let segments = self
            .segments
            .read()
            .map_err(|_| LogError::Corrupt("a writer of the log panicked".into()))?;
        Ok(segments
            .range(..=pos)
            .next_back()
            .map(|(s, f)| (*s, f.clone())))
    }

    /// Which log this is, among those this process opened: for what readers keep of a
    /// log in memory beside it (`store::slim`), so that two stores never mix.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The record at `pos`; `None` at or past the synced end.
    pub fn read(&self, pos: Pos) -> Result<Option<Record>, LogError> {
        self.read_before(pos, self.synced_end())
    }

    /// The record at `pos` once appended, synced or not: for the writer's own reads of
    /// what it wrote a moment ago (never for what is shown: that waits for the sync),
    /// and for the text a shown record refers to (`store::shared`: always earlier in
    /// the log than the record, so on disk when it is).
    pub fn read_appended(&self, pos: Pos) -> Result<Option<Record>, LogError> {
        self.read_before(pos, self.end())
    }

    fn read_before(&self, pos: Pos, end: Pos) -> Result<Option<Record>, LogError> {
        let Some((file, at)) = self.file_at(pos, end)? else {
            return Ok(None);
        };
        read_record(&mut SegmentReader { file: &file, at }, pos, end).map(Some)
    }

    /// The segment file holding `pos` and where `pos` is in it; `None` when a record's
    /// header there would pass `end`.
    fn file_at(&self, pos: Pos, end: Pos) -> Result<Option<(Arc<File>, u64)>, LogError> {
        if pos.saturating_add(HEADER) > end {
            return Ok(None);
        }
        let (start, file) = self.segment_holding(pos)?;
        Ok(Some((file, pos - start)))
    }

    /// Calls `f` with every synced record from `from` on, in order, until it returns
    /// `false` or the log ends. Reads each segment sequentially (for rebuilds and
    /// migrations, which read everything). `f`'s error stops the scan and is returned.
    pub fn scan<E: From<LogError>>(
        &self,
        from: Pos,
        mut f: impl FnMut(Record) -> Result<bool, E>,
    ) -> Result<(), E> {
        let end = self.synced_end();
        let mut pos = from;
        while pos < end {
            let (start, file) = self.segment_holding(pos)?;
            let seg_end = self.segment_end(start)?.unwrap_or(end).min(end);
            let mut reader = BufReader::with_capacity(
                1 << 20,
                SegmentReader {
                    file: &file,
                    at: pos - start,
                },
            );
            while pos < seg_end {
                let record = read_record(&mut reader, pos, seg_end)?;
                pos = record.next();
                if !f(record)? {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Where the log's first record is.
    pub fn start(&self) -> Result<Pos, LogError> {
        let segments = self
            .segments
            .read()
            .map_err(|_| LogError::Corrupt("a writer of the log panicked".into()))?;
        Ok(segments.keys().next().copied().unwrap_or(0))
    }

    fn segment_holding(&self, pos: Pos) -> Result<(Pos, Arc<File>), LogError> {
        self.segment_at(pos)?
            .ok_or_else(|| LogError::Corrupt(format!("no segment holds position {pos}")))
    }

    /// Where the segment starting at `start` ends (the next one's start), if sealed.
    fn segment_end(&self, start: Pos) -> Result<Option<Pos>, LogError> {
        let segments = self
            .segments
            .read()
            .map_err(|_| LogError::Corrupt("a writer of the log panicked".into()))?;
        Ok(segments
            .range(start.saturating_add(1)..)
            .next()
            .map(|(s, _)| *s))
    }

    /// Bytes the log takes on disk.
    pub fn bytes(&self) -> u64 {
        self.synced_end()
    }
}

impl std::fmt::Debug for EventLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventLog")
            .field("dir", &self.dir)
            .field("synced", &self.synced_end())
            .field("last_seq", &self.last_seq())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
