//! The log and sled kept in step: the journal the storage thread syncs for every group
//! commit ([`LogJournal`], with its checkpoints of sled), and at open the catch-up of
//! sled with the log, or its rebuild from it ([`Store::recover`]).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use relay_protocol::event::Event;

use super::keys::{pair_value, parse_pair, T};
use super::log::{EventLog, Pos, Record};
use super::projections::apply;
use super::shared::decode_event;
use super::Store;
use crate::error::BrokerError;

/// sled is flushed once this many events were appended since its last flush...
pub const CHECKPOINT_EVENTS: u64 = 20_000;
/// ...or this long after it, whichever comes first (at the next group commit).
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(5);

/// Where the projections are: the seq and the log's end after the last event applied.
const APPLIED: &[u8] = b"log_applied";
/// The last seq of a batch written to sled without a transaction, before any of its keys
/// (u64 BE; [`Store::direct`]), then what the counters it moves held before it (see
/// `direct`). Above the log's last seq at open, sled may hold part of a batch the log
/// lost in a power cut: every projection is rebuilt. Above where the projections stand,
/// but not the log's: the batch was cut short; its counters are put back, then the log
/// is applied from where they stand.
pub(crate) const APPLYING_KEY: &[u8] = b"log_applying";

/// Events applied per sled batch while catching up or rebuilding.
const APPLY_CHUNK: usize = 2048;

/// The event log as the storage thread's journal for the projections database.
pub(super) struct LogJournal {
    log: Arc<EventLog>,
    /// The log's last seq at sled's last flush, and when that was.
    checkpoint: Mutex<(u64, Instant)>,
}

impl LogJournal {
    pub(super) fn new(log: Arc<EventLog>) -> LogJournal {
        let seq = log.last_seq();
        LogJournal {
            log,
            checkpoint: Mutex::new((seq, Instant::now())),
        }
    }
}

impl relay_infra::storage::Journal for LogJournal {
    fn sync(&self) -> Result<bool, String> {
        self.log.sync().map_err(|e| e.to_string())?;
        let seq = self.log.last_seq();
        let Ok(mut last) = self.checkpoint.lock() else {
            return Ok(true);
        };
        let due = seq.saturating_sub(last.0) >= CHECKPOINT_EVENTS
            || (seq != last.0 && last.1.elapsed() >= CHECKPOINT_INTERVAL);
        if due {
            *last = (seq, Instant::now());
        }
        Ok(due)
    }
}

/// Where the projections stand, in `meta`: seq, then the log's end after it
/// ([`pair_value`]).
pub(crate) const APPLIED_KEY: &[u8] = APPLIED;

impl Store {
    /// The seq of the last event the projections hold: committed, though perhaps not
    /// on disk yet (see [`Store::wait_on_disk`]).
    pub fn committed_seq(&self) -> Result<u64, BrokerError> {
        let applying = self.applying.load(std::sync::atomic::Ordering::Acquire);
        Ok(self.applied()?.0.max(applying))
    }

    /// Blocks until event `seq`, committed, is on disk too (a group commit's sync
    /// follows its batch within moments; a writer that stopped never syncs it).
    pub fn wait_on_disk(&self, seq: u64) -> Result<(), BrokerError> {
        if self.log().wait_synced(seq, Duration::from_secs(30)) {
            Ok(())
        } else {
            Err(BrokerError::Unavailable(format!(
                "event {seq} is committed but not on disk after 30 s: the storage is stalled"
            )))
        }
    }

    /// Where the projections stand: (seq, log end) of the last event applied.
    pub(super) fn applied(&self) -> Result<(u64, Pos), BrokerError> {
        match self.tree(T::Meta).get(APPLIED)? {
            None => Ok((0, 0)),
            Some(v) => parse_pair(&v),
        }
    }

    /// At open: brings sled level with the log. Behind (sled lost its last writes in a
    /// crash): applies the log past it. Ahead (it kept a batch the log did not, never
    /// acknowledged), or not matching the log: rebuilds every projection from the log.
    pub(super) fn recover(&self) -> Result<(), BrokerError> {
        let (seq, end) = self.applied()?;
        let last = self.log.last_seq();
        // A damaged marker is taken as ahead: the projections are rebuilt.
        let (applying, undo) = match self.tree(T::Meta).get(APPLYING_KEY)? {
            Some(v) => super::direct::parse_marker(&v).unwrap_or((u64::MAX, Vec::new())),
            None => (0, Vec::new()),
        };
        let ahead = applying > last;
        if seq == last && end == self.log.synced_end() && !ahead {
            return Ok(());
        }
        let matches = !ahead
            && seq < last
            && self
                .log
                .read(end)?
                .is_some_and(|r: Record| r.seq == seq + 1);
        if matches {
            if applying > seq && !undo.is_empty() {
                // A batch cut short: what it moved is put back before it is applied again.
                super::direct::restore(&self.trees, &undo)?;
            }
            tracing::info!(
                from = seq + 1,
                to = last,
                "applying the event log's last events to the projections"
            );
            self.apply_log(end)?;
        } else {
            tracing::warn!(
                projections_at = seq,
                log_at = last,
                "the projections do not match the event log: rebuilding them from it"
            );
            self.rebuild()?;
        }
        self.tree(T::Meta).flush()?;
        Ok(())
    }

    /// Applies every event of the log from `from` on to the projections, in chunks, each
    /// with the position it reached (a crash meanwhile resumes from there).
    pub(crate) fn apply_log(&self, from: Pos) -> Result<u64, BrokerError> {
        let mut chunk: Vec<(Event, Pos, Pos, bool)> = Vec::with_capacity(APPLY_CHUNK);
        let mut applied = 0u64;
        self.log.scan(from, |record| {
            let next = record.next();
            let event = decode_event(&self.log, &record.payload)?;
            chunk.push((event, record.pos, next, record.link.is_some()));
            if chunk.len() >= APPLY_CHUNK {
                applied += chunk.len() as u64;
                self.apply_chunk(&mut chunk)?;
            }
            Ok::<_, BrokerError>(true)
        })?;
        applied += chunk.len() as u64;
        self.apply_chunk(&mut chunk)?;
        Ok(applied)
    }

    /// Applies a chunk of the log as the writer applies a batch ([`Store::direct`]), so
    /// that a crash in the middle of it is caught up the same way.
    fn apply_chunk(&self, chunk: &mut Vec<(Event, Pos, Pos, bool)>) -> Result<(), BrokerError> {
        let Some((last, _, end, _)) = chunk.last() else {
            return Ok(());
        };
        let (seq, marker) = (last.seq, pair_value(last.seq, *end));
        let writes = super::direct::Direct::new(&self.trees);
        for (event, pos, _, linked) in chunk.iter() {
            apply(&writes, event, *pos, *linked)?;
        }
        super::Sink::put(&writes, T::Meta, APPLIED, marker.to_vec())?;
        self.gate.write(|| writes.apply(seq, &self.crash))?;
        chunk.clear();
        Ok(())
    }

    /// Empties every projection, then applies the whole log.
    ///
    /// Marked first as ahead of any log (`u64::MAX`, with nothing to put back), so that a
    /// crash before its first chunk is in has the next open rebuild again: sled keeps a
    /// prefix of these writes, so none of the clearing without the mark, and never an
    /// older batch's marker over emptied trees. Each chunk then marks its own seq.
    pub(crate) fn rebuild(&self) -> Result<u64, BrokerError> {
        let meta = self.tree(T::Meta);
        // Each step a write that a test's crash may cut (`Store::open_crashing`).
        let survives = || super::direct::survives(&self.crash);
        if !survives() {
            return Ok(0);
        }
        meta.insert(APPLYING_KEY, &u64::MAX.to_be_bytes())?;
        for t in super::doctor::TREES_PROJECTED {
            if !survives() {
                return Ok(0);
            }
            self.tree(t).clear()?;
        }
        if !survives() {
            return Ok(0);
        }
        meta.remove(APPLIED)?;
        let applied = self.apply_log(0)?;
        if applied == 0 && survives() {
            meta.remove(APPLYING_KEY)?;
        }
        Ok(applied)
    }
}
