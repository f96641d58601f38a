//! The trees as a batch of the writer sees them: in one sled transaction, or written
//! directly, without one ([`Store::direct`](super::Store::direct)).
//!
//! # Why a batch of deltas needs no sled transaction
//! Every sled transaction, however small, seals sled's I/O buffer and hands it to sled's
//! thread pool, which wakes all 7 of its waiting threads to write it and
//! `sync_file_range` it. At one delta a millisecond that was a third of the broker's
//! CPU samples (ops/BENCHMARKS.md part 22), on 2 cores and beside the log's `fdatasync`.
//!
//! A batch of streamed text writes few keys: a flight's update positions (each
//! meaningful alone, and read only up to the log's synced end), sometimes a seq's
//! position, at every 32nd update the flight's record (after its update positions), and
//! where the projections stand ([`APPLIED_KEY`](super::recover::APPLIED_KEY)), last.
//! - **Readers:** before its first key, the batch's last seq counts as committed
//!   ([`Store::committed_seq`](super::Store::committed_seq)), so a reader that sees any
//!   of its keys waits for its sync, as it waits for a transaction's
//!   ([`Store::read`](super::Store::read)).
//! - **A crash of the process:** the log holds the batch before any of it reaches sled,
//!   so a crash between two of these writes is caught up at the next start as any crash
//!   after the log's write is: from `APPLIED`, applying each event again (applying twice
//!   changes nothing).
//! - **A power cut:** sled may keep the first keys of a batch whose log record, not yet
//!   synced, is lost. So the batch's last seq goes into `meta` first
//!   ([`APPLYING_KEY`]); at open, one above the log's last seq has every projection
//!   rebuilt from the log.
//! - **A write that fails midway** (a disk error): the batch's callers are told it
//!   failed, the log's append is taken back, and the writer stops, as after any storage
//!   error. Its first keys in sled are then above the log's last seq, as after a power
//!   cut: the next start rebuilds sled.
//!
//! Only the storage thread writes, so nothing else can change a key between the batch's
//! reads and its writes: no conflict to detect.

use std::cell::RefCell;
use std::collections::BTreeMap;

use sled::transaction::TransactionalTree;
use sled::IVec;

use super::recover::APPLYING_KEY;
use super::T;
use crate::error::BrokerError;

pub(super) enum Trees<'a> {
    /// A sled transaction over every tree.
    Tx(&'a [TransactionalTree]),
    /// Plain writes, held until the batch is applied ([`Direct::apply`]).
    Direct(&'a Direct<'a>),
}

impl Trees<'_> {
    pub(super) fn get(&self, t: T, key: &[u8]) -> Result<Option<IVec>, BrokerError> {
        match self {
            Trees::Tx(trees) => trees[t as usize].get(key).map_err(unabortable),
            Trees::Direct(direct) => direct.get(t, key),
        }
    }

    pub(super) fn insert(&self, t: T, key: &[u8], value: Vec<u8>) -> Result<(), BrokerError> {
        match self {
            Trees::Tx(trees) => trees[t as usize]
                .insert(key, value)
                .map(|_| ())
                .map_err(unabortable),
            Trees::Direct(direct) => {
                direct.write(t, key, Some(value.into()));
                Ok(())
            }
        }
    }

    pub(super) fn remove(&self, t: T, key: &[u8]) -> Result<(), BrokerError> {
        match self {
            Trees::Tx(trees) => trees[t as usize]
                .remove(key)
                .map(|_| ())
                .map_err(unabortable),
            Trees::Direct(direct) => {
                direct.write(t, key, None);
                Ok(())
            }
        }
    }
}

/// A batch's writes to the trees, held (and read back by the batch) until applied.
pub(super) struct Direct<'a> {
    trees: &'a [sled::Tree],
    /// Per tree: key -> its new value (`None`: removed).
    writes: RefCell<Vec<BTreeMap<Vec<u8>, Option<IVec>>>>,
}

impl<'a> Direct<'a> {
    pub(super) fn new(trees: &'a [sled::Tree]) -> Direct<'a> {
        Direct {
            trees,
            writes: RefCell::new(vec![BTreeMap::new(); trees.len()]),
        }
    }

    fn get(&self, t: T, key: &[u8]) -> Result<Option<IVec>, BrokerError> {
        if let Some(written) = self.writes.borrow()[t as usize].get(key) {
            return Ok(written.clone());
        }
        Ok(self.trees[t as usize].get(key)?)
    }

    fn write(&self, t: T, key: &[u8], value: Option<IVec>) {
        self.writes.borrow_mut()[t as usize].insert(key.to_vec(), value);
    }

    /// Writes the batch, whose last seq is `last`, to sled: first that seq as the batch
    /// being applied ([`APPLYING_KEY`]), then every tree, a flight's record after its
    /// update positions, and `meta` (where the projections stand) last, so that `APPLIED`
    /// never says more than sled holds.
    /// A batch that wrote nothing (every delta of it refused) writes nothing here either.
    pub(super) fn apply(self, last: u64) -> Result<(), BrokerError> {
        let mut writes = self.writes.into_inner();
        if writes.iter().all(BTreeMap::is_empty) {
            return Ok(());
        }
        self.trees[T::Meta as usize].insert(APPLYING_KEY, &last.to_be_bytes())?;
        let later =
            [T::Flights, T::Meta].map(|t| (t as usize, std::mem::take(&mut writes[t as usize])));
        let trees = writes.into_iter().enumerate().chain(later);
        for (t, keys) in trees {
            let tree = &self.trees[t];
            for (key, value) in keys {
                match value {
                    Some(v) => tree.insert(key, v)?,
                    None => tree.remove(key)?,
                };
            }
        }
        Ok(())
    }
}

fn unabortable(e: sled::transaction::UnabortableTransactionError) -> BrokerError {
    match e {
        sled::transaction::UnabortableTransactionError::Storage(e) => BrokerError::Storage(e),
        sled::transaction::UnabortableTransactionError::Conflict => BrokerError::TxConflict,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::store::{Sink, Store};

    #[test]
    fn a_batch_reads_its_own_writes_and_reaches_sled_only_when_kept() {
        let store = Store::temporary().unwrap();
        let key: &[u8] = b"f1";
        store
            .tree(T::Agents)
            .insert(b"gone", b"x".to_vec())
            .unwrap();
        let batch = |keep: bool| {
            store
                .direct(
                    |tx| {
                        Sink::put(tx, T::FlightUpdates, key, b"v1".to_vec())?;
                        Sink::del(tx, T::Agents, b"gone")?;
                        // The batch reads what it wrote; sled has none of it yet.
                        assert_eq!(
                            Sink::get(tx, T::FlightUpdates, key)?.as_deref(),
                            Some(&b"v1"[..])
                        );
                        assert_eq!(Sink::get(tx, T::Agents, b"gone")?, None);
                        assert_eq!(store.tree(T::FlightUpdates).get(key).unwrap(), None);
                        Ok(7)
                    },
                    |_| keep,
                )
                .unwrap()
        };
        assert_eq!(batch(false), None);
        assert_eq!(store.tree(T::FlightUpdates).get(key).unwrap(), None);
        assert!(store.tree(T::Agents).get(b"gone").unwrap().is_some());
        assert_eq!(batch(true), Some(7));
        assert_eq!(
            store.tree(T::FlightUpdates).get(key).unwrap().as_deref(),
            Some(&b"v1"[..])
        );
        assert_eq!(store.tree(T::Agents).get(b"gone").unwrap(), None);
    }

    /// Once a batch's keys start going in, its last seq counts as committed (readers
    /// wait for its sync), whether or not its marker ever follows.
    #[test]
    fn a_batch_being_applied_counts_as_committed_before_its_marker() {
        let store = Store::temporary().unwrap();
        assert_eq!(store.committed_seq().unwrap(), 0);
        let appended = store
            .direct(
                |tx| {
                    Sink::put(tx, T::FlightUpdates, b"f1", b"v1".to_vec())?;
                    let payloads = [b"one".as_slice(), b"two", b"three"];
                    store.log().append((1..=3).zip(payloads))?;
                    Ok(())
                },
                |_| true,
            )
            .unwrap();
        assert_eq!(appended, Some(()));
        // Its marker was never written (as after a failure midway): seq 3 is committed
        // for readers, and marked in sled as being applied.
        assert_eq!(store.committed_seq().unwrap(), 3);
        assert_eq!(
            store.tree(T::Meta).get(APPLYING_KEY).unwrap().as_deref(),
            Some(&3u64.to_be_bytes()[..])
        );
    }
}
