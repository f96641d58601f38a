//! The trees as a batch of the writer sees them: in one sled transaction, or written
//! directly, without one ([`Store::direct`](super::Store::direct)).
//!
//! # Why a batch of deltas needs no sled transaction
//! Every sled transaction, however small, seals sled's I/O buffer and hands it to sled's
//! thread pool, which wakes all 7 of its waiting threads to write it and
//! `sync_file_range` it. At one delta a millisecond that was a third of the broker's
//! CPU samples (ops/BENCHMARKS.md part 22), on 2 cores and beside the log's `fdatasync`.
//! A batch of streamed text writes keys that no reader needs to see together: a
//! flight's update positions (each meaningful alone, and read only up to the log's
//! synced end), sometimes a seq's position, and where the projections stand
//! ([`APPLIED_KEY`](super::recover::APPLIED_KEY)), written last. The log holds the batch
//! before any of it reaches sled, so a crash between two of these writes is caught up at
//! the next start as any crash after the log's write is: from `APPLIED`, applying each
//! event again (applying twice changes nothing).
//!
//! Only the storage thread writes, so nothing else can change a key between the batch's
//! reads and its writes: no conflict to detect.

use std::cell::RefCell;
use std::collections::BTreeMap;

use sled::transaction::TransactionalTree;
use sled::IVec;

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

    /// Writes the batch to sled: every tree, then `meta` (where the projections stand)
    /// last, so that `APPLIED` never says more than sled holds.
    pub(super) fn apply(self) -> Result<(), BrokerError> {
        let mut writes = self.writes.into_inner();
        let meta = std::mem::take(&mut writes[T::Meta as usize]);
        let trees = writes
            .into_iter()
            .enumerate()
            .chain([(T::Meta as usize, meta)]);
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
}
