//! A batch of the writer as it goes into sled, without a sled transaction
//! ([`Store::direct`](super::Store::direct)): its writes held until it is done
//! ([`Direct`]), then written key by key; and the gate that keeps readers from seeing
//! part of it ([`Gate`]).
//!
//! # Why a batch needs no sled transaction
//! Every sled transaction, however small, seals sled's I/O buffer and hands it to sled's
//! thread pool, which wakes all 7 of its waiting threads to write it and
//! `sync_file_range` it. At one delta a millisecond that was a third of the broker's
//! CPU samples (ops/BENCHMARKS.md part 22), on 2 cores and beside the log's `fdatasync`;
//! with 64 invocations in flight, most of the storage thread's time was in sled's
//! transactions (part 25). So the writer writes every batch key by key, after the log
//! holds it, `meta` last:
//! - **Readers** ([`Store::read`](super::Store::read)) see a batch whole or not at all:
//!   its keys go in behind the [`Gate`], which a reader checks before and after its
//!   reads, and reads again (at last under the gate's lock) when a batch went in
//!   meanwhile. And before its first key, the batch's last seq counts as committed
//!   ([`Store::committed_seq`](super::Store::committed_seq)), so a reader that sees any
//!   of its keys waits for its sync, as it waited for a transaction's.
//! - **A crash of the process:** the log holds the batch before any of it reaches sled,
//!   so a crash between two of these writes is caught up at the next start as any crash
//!   after the log's write is: from `APPLIED`, applying each event again. Applying an
//!   event twice changes nothing, except where it moves a counter: the usage counters
//!   (folded from the flight's record before it) and a rule's matches. So before its
//!   first key, the batch writes what those keys held before it, and the records of the
//!   flights they were folded from ([`APPLYING_KEY`], with its last seq); the next start
//!   puts them back ([`restore`]) before it applies the batch again.
//! - **A power cut:** sled may keep the first keys of a batch whose log record, not yet
//!   synced, is lost. So the batch's last seq goes into `meta` first
//!   ([`APPLYING_KEY`]); at open, one above the log's last seq has every projection
//!   rebuilt from the log.
//! - **A write that fails midway** (a disk error): the batch's callers are told it
//!   failed, the log's append is taken back, and the writer stops, as after any storage
//!   error. Its first keys in sled are then above the log's last seq, as after a power
//!   cut: the next start rebuilds sled.
//!
//! All of this rests on sled keeping, after a crash, a prefix of the writes made to it
//! (its log is replayed up to the first write it cannot read). Only the storage thread
//! writes, so nothing else can change a key between the batch's reads and its writes:
//! no conflict to detect.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock};

use sled::IVec;

use super::recover::APPLYING_KEY;
use super::T;
use crate::error::BrokerError;

/// A batch's writes to the trees, held (and read back by the batch) until applied.
pub(super) struct Direct<'a> {
    trees: &'a [sled::Tree],
    /// Per tree: key -> its new value (`None`: removed).
    writes: RefCell<Vec<BTreeMap<Vec<u8>, Option<IVec>>>>,
    /// The keys of [`MOVED_FROM`] counters were moved by (see
    /// [`Sink::moves_from`](super::Sink::moves_from)).
    moved_from: RefCell<std::collections::BTreeSet<Vec<u8>>>,
}

impl<'a> Direct<'a> {
    pub(super) fn new(trees: &'a [sled::Tree]) -> Direct<'a> {
        Direct {
            trees,
            writes: RefCell::new(vec![BTreeMap::new(); trees.len()]),
            moved_from: RefCell::default(),
        }
    }

    pub(super) fn get(&self, t: T, key: &[u8]) -> Result<Option<IVec>, BrokerError> {
        if let Some(written) = self.writes.borrow()[t as usize].get(key) {
            return Ok(written.clone());
        }
        Ok(self.trees[t as usize].get(key)?)
    }

    pub(super) fn write(&self, t: T, key: &[u8], value: Option<IVec>) {
        self.writes.borrow_mut()[t as usize].insert(key.to_vec(), value);
    }

    /// Writes the batch, whose last seq is `last`, to sled: first that seq as the batch
    /// being applied ([`APPLYING_KEY`], with what the keys it moves held before:
    /// [`undo`]), then every tree, a flight's record after its update positions,
    /// and `meta` (where the projections stand) last, so that `APPLIED` never says more
    /// than sled holds.
    /// A batch that wrote nothing (every delta of it refused) writes nothing here either.
    /// `crash`: the key writes sled may still get, as
    /// [`Store::crash_sled_after`](super::Store::crash_sled_after) left them.
    pub(super) fn apply(self, last: u64, crash: &AtomicUsize) -> Result<(), BrokerError> {
        let mut writes = self.writes.into_inner();
        if writes.iter().all(BTreeMap::is_empty) {
            return Ok(());
        }
        let mut marker = last.to_be_bytes().to_vec();
        undo(
            self.trees,
            &writes,
            &self.moved_from.into_inner(),
            &mut marker,
        )?;
        let later =
            [T::Flights, T::Meta].map(|t| (t as usize, std::mem::take(&mut writes[t as usize])));
        let first = (
            T::Meta as usize,
            BTreeMap::from([(APPLYING_KEY.to_vec(), Some(marker.into()))]),
        );
        let trees = std::iter::once(first)
            .chain(writes.into_iter().enumerate())
            .chain(later);
        for (t, keys) in trees {
            let tree = &self.trees[t];
            for (key, value) in keys {
                if !survives(crash) {
                    return Ok(());
                }
                match value {
                    Some(v) => tree.insert(key, v)?,
                    None => tree.remove(key)?,
                };
            }
        }
        Ok(())
    }
}

impl super::Sink for Direct<'_> {
    fn get(&self, tree: T, key: &[u8]) -> Result<Option<IVec>, BrokerError> {
        Direct::get(self, tree, key)
    }
    fn put(&self, tree: T, key: &[u8], value: Vec<u8>) -> Result<(), BrokerError> {
        self.write(tree, key, Some(value.into()));
        Ok(())
    }
    fn del(&self, tree: T, key: &[u8]) -> Result<(), BrokerError> {
        self.write(tree, key, None);
        Ok(())
    }
    fn moves_from(&self, tree: T, key: &[u8]) {
        if tree == MOVED_FROM {
            self.moved_from.borrow_mut().insert(key.to_vec());
        }
    }
}

/// Whether one more key write reaches sled (always, unless a test crashes it: see
/// [`Store::crash_sled_after`](super::Store::crash_sled_after)).
pub(super) fn survives(crash: &AtomicUsize) -> bool {
    crash.load(Ordering::Relaxed) == usize::MAX
        || crash
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
}

/// The trees whose values applying an event moves (adds to) rather than sets: applying
/// it twice would count it twice.
const MOVED: [T; 3] = [T::UsageDaily, T::UsageTrees, T::Rules];
/// The tree the usage counters are moved from (by what a flight's record before held).
const MOVED_FROM: T = T::Flights;

/// Appends to `marker` what each key of [`MOVED`] the batch writes held before it, and
/// each key of [`MOVED_FROM`] it writes that counters were moved by (`moved_from`),
/// when it writes any key of [`MOVED`]: per key, its tree, its key, and its value or
/// none, each length as a u32 BE.
fn undo(
    trees: &[sled::Tree],
    writes: &[BTreeMap<Vec<u8>, Option<IVec>>],
    moved_from: &std::collections::BTreeSet<Vec<u8>>,
    marker: &mut Vec<u8>,
) -> Result<(), BrokerError> {
    if MOVED.iter().all(|t| writes[*t as usize].is_empty()) {
        return Ok(());
    }
    let moved = MOVED
        .iter()
        .flat_map(|t| writes[*t as usize].keys().map(move |k| (*t, k)));
    let from = writes[MOVED_FROM as usize]
        .keys()
        .filter(|k| moved_from.contains(*k))
        .map(|k| (MOVED_FROM, k));
    for (t, key) in moved.chain(from) {
        marker.push(t as u8);
        put_bytes(marker, Some(key));
        put_bytes(marker, trees[t as usize].get(key)?.as_deref());
    }
    Ok(())
}

fn put_bytes(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        None => out.push(0),
        Some(b) => {
            out.push(1);
            out.extend_from_slice(&u32::try_from(b.len()).unwrap_or(u32::MAX).to_be_bytes());
            out.extend_from_slice(b);
        }
    }
}

/// One key as a batch found it before its first write: tree, key, value (none: absent).
pub(super) type Undo = (usize, Vec<u8>, Option<Vec<u8>>);

/// Reads an [`APPLYING_KEY`] marker: the batch's last seq and what its moved keys held
/// before it. `None`: damaged.
pub(super) fn parse_marker(marker: &[u8]) -> Option<(u64, Vec<Undo>)> {
    let (seq, mut rest) = marker.split_first_chunk::<8>()?;
    let mut undo = Vec::new();
    while let Some((&tree, after)) = rest.split_first() {
        if !MOVED
            .into_iter()
            .chain([MOVED_FROM])
            .any(|t| t as u8 == tree)
        {
            return None;
        }
        let (key, after) = take_bytes(after)?;
        let (value, after) = take_bytes(after)?;
        undo.push((usize::from(tree), key?, value));
        rest = after;
    }
    Some((u64::from_be_bytes(*seq), undo))
}

/// One [`put_bytes`] field: `Some(None)` for none, `None` when damaged.
#[allow(clippy::type_complexity)]
fn take_bytes(bytes: &[u8]) -> Option<(Option<Vec<u8>>, &[u8])> {
    match bytes.split_first()? {
        (0, rest) => Some((None, rest)),
        (1, rest) => {
            let (len, rest) = rest.split_first_chunk::<4>()?;
            let len = usize::try_from(u32::from_be_bytes(*len)).ok()?;
            (rest.len() >= len).then(|| (Some(rest[..len].to_vec()), &rest[len..]))
        }
        _ => None,
    }
}

/// Puts back what a batch cut short by a crash found (from its marker), so that applying
/// it again moves its counters once. Idempotent, for a crash in the middle of it too.
pub(super) fn restore(trees: &[sled::Tree], undo: &[Undo]) -> Result<(), BrokerError> {
    for (t, key, value) in undo {
        let tree = trees
            .get(*t)
            .ok_or_else(|| BrokerError::Internal(format!("no tree {t} to put back")))?;
        match value {
            Some(v) => tree.insert(key, v.as_slice())?,
            None => tree.remove(key)?,
        };
    }
    Ok(())
}

/// Keeps readers from seeing part of a batch written without a transaction: the
/// writer goes through [`Gate::write`] while its keys go in; a reader tries its reads
/// ([`Gate::read`]), and when a batch went in during each try, holds the writer back
/// ([`Gate::hold`]) for one more (see [`Store::read`](super::Store::read)).
#[derive(Default)]
pub(super) struct Gate {
    /// Odd while a batch goes in; one more when one starts, and when it ends.
    generation: AtomicU64,
    /// Held by the batch going in, and by a reader that saw batches go in too often.
    lock: RwLock<()>,
}

/// Reads run without the gate's lock this many times before they hold the writer back:
/// a reader that raced a batch each time (a long scan, under a stream of batches) then
/// holds it back for one read, not forever itself.
const OPTIMISTIC_READS: usize = 3;

impl Gate {
    pub(super) fn write<R>(&self, apply: impl FnOnce() -> R) -> R {
        /// Makes the generation even again when dropped, after `apply` even if it
        /// panicked (and before the lock is let go: dropped first).
        struct Even<'a>(&'a AtomicU64);
        impl Drop for Even<'_> {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let _held = self.lock.write().unwrap_or_else(PoisonError::into_inner);
        self.generation.fetch_add(1, Ordering::SeqCst);
        let _even = Even(&self.generation);
        apply()
    }

    /// Runs `read` until it ran while no batch went in, and answers what it read then;
    /// `None` when a batch went in during each of its tries.
    pub(super) fn read<R>(&self, read: impl Fn() -> R) -> Option<R> {
        for _ in 0..OPTIMISTIC_READS {
            let mut before = self.generation.load(Ordering::SeqCst);
            if before % 2 == 1 {
                // A batch is going in: wait for it, rather than using up a try.
                drop(self.hold());
                before = self.generation.load(Ordering::SeqCst);
                if before % 2 == 1 {
                    continue;
                }
            }
            let done = read();
            // The reads above are done before the generation is looked at again.
            fence(Ordering::SeqCst);
            if self.generation.load(Ordering::SeqCst) == before {
                return Some(done);
            }
        }
        None
    }

    /// No batch goes in until the guard is dropped.
    pub(super) fn hold(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.lock.read().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests;
