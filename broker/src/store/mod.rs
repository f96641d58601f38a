//! sled storage: the append-only event log and one tree per projection.
//!
//! Layout (every value starts with a version byte, then JSON):
//! - `events`: global seq (u64 big-endian) -> [`Event`]
//! - `agents`: name -> [`Agent`]
//! - `conversations`: id -> [`Conversation`]
//! - `messages`: conversation id, 0, index (u64 BE) -> [`Message`]
//! - `message_ids`: message id -> key in `messages`
//! - `invocations`, `flights`, `deliveries`, `approvals`, `bindings`: id -> record
//! - `flight_updates`: flight id, 0, per-flight seq (u64 BE) -> [`FlightUpdate`]
//! - `flight_children` (an index): parent flight id, 0, child flight id -> nothing
//! - `usage_daily`: agent, 0, UTC day (`YYYY-MM-DD`) -> `UsageTotals`; `usage_trees`:
//!   root flight id -> `UsageTotals` (the usage counters budgets read: see `usage`)
//! - `replay_index`: scope letter + id, 0, global seq (u64 BE) -> nothing: the events a
//!   replay of an agent (`a`), a conversation (`c`) or a flight (`f`) reads besides the
//!   flight's updates ([`Scope`], [`replay_scopes`]). Deltas are not in it: a flight's
//!   updates are read from `flight_updates`, which holds each one's global seq.
//! - `rules`: rule id -> remembered [`Rule`](relay_protocol::domain::Rule), its `matched`
//!   and `last_matched_at` folded from the `approval_decided` events decided by
//!   `rule:<id>`; deleted by `rule_removed`.
//!
//! Projections are written only by [`apply`], both when a batch commits and when
//! [`Store::verify`] rebuilds them from the log, so the two cannot drift apart.
//!
//! Who touches sled, and where (see [`relay_infra::storage`] for why):
//! - Transactions and flushes run only on the process's storage thread: the broker's
//!   writer hands each batch over as one job ([`Store::durable`]).
//! - Reads from async code go through [`Store::read`], on the blocking pool. The plain
//!   getters (`queries`) are for code already off the async workers.
//!
//! One concern per file: [`Store`] (here) opens the database and holds its trees, the
//! transaction view [`Tx`] and the blocking-pool reads; `keys` lays out the trees, keys
//! and versioned values; `projections` applies events to the trees ([`apply`]) and
//! builds the indexes a database made before them lacks; `queries` reads the records
//! back; `usage` folds the flights' usage into its counters and reads them (and the
//! report of `relay usage`); `doctor` rebuilds the projections from the log and compares
//! ([`Store::verify`]); `published` pairs an event with its stored JSON, the one
//! encoding every subscriber gets ([`Published`]). They layer one way: `keys` <-
//! `published`, `usage` <-> `projections` <- `queries`, `doctor` (`projections` calls
//! the fold, which writes through its `Sink`).
//!
//! [`Event`]: relay_protocol::event::Event
//! [`Agent`]: relay_protocol::domain::Agent
//! [`Conversation`]: relay_protocol::domain::Conversation
//! [`Message`]: relay_protocol::domain::Message
//! [`FlightUpdate`]: relay_protocol::domain::FlightUpdate

mod doctor;
mod keys;
mod projections;
mod published;
mod queries;
mod usage;

use relay_infra::storage::{self, Durable};
use serde::de::DeserializeOwned;
use sled::transaction::{ConflictableTransactionError, TransactionalTree};
use sled::Transactional;

use crate::error::BrokerError;

pub use doctor::{DoctorReport, VerifyReport};
pub use keys::{child_key, decode, encode, pair_key, seq_key, Scope, T};
pub use projections::{apply, replay_scopes, Sink, StoredUpdate};
pub use published::Published;
pub use queries::FlightScan;
pub use usage::{day_key, tree_root};

use keys::TREE_NAMES;

/// The sled database and its trees. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    durable: Durable,
    trees: Vec<sled::Tree>,
}

impl Store {
    pub fn open(path: &std::path::Path) -> Result<Store, BrokerError> {
        // Private (0700/0600 whatever the umask), and never through a planted symlink.
        let db = relay_infra::disk::open_private(
            storage::config().mode(sled::Mode::HighThroughput),
            path,
        )
        .map_err(|e| match e {
            sled::Error::Io(io) if io.kind() == std::io::ErrorKind::WouldBlock => {
                BrokerError::Locked(path.display().to_string())
            }
            sled::Error::Io(io) if io.to_string().contains("lock") => {
                BrokerError::Locked(path.display().to_string())
            }
            other => BrokerError::Storage(other),
        })?;
        Self::with_db(Durable::private(db, path))
    }

    /// An in-memory store, for unit tests and rebuild checks.
    pub fn temporary() -> Result<Store, BrokerError> {
        Self::with_db(Durable::new(storage::config().temporary(true).open()?))
    }

    fn with_db(durable: Durable) -> Result<Store, BrokerError> {
        let db = durable.db();
        let trees = TREE_NAMES
            .iter()
            .map(|n| db.open_tree(n))
            .collect::<Result<Vec<_>, _>>()?;
        let store = Store { durable, trees };
        store.index_once_each()?;
        Ok(store)
    }

    pub fn tree(&self, t: T) -> &sled::Tree {
        &self.trees[t as usize]
    }

    pub fn last_seq(&self) -> Result<u64, BrokerError> {
        Ok(match self.tree(T::Events).last()? {
            Some((k, _)) => u64::from_be_bytes(
                k.as_ref()
                    .try_into()
                    .map_err(|_| BrokerError::Corrupt("event key is not 8 bytes".into()))?,
            ),
            None => 0,
        })
    }

    /// Runs `f` in one transaction over every tree. `f` may be re-run by sled, so it must
    /// not have side effects outside the transaction.
    pub fn transaction<R>(
        &self,
        f: impl Fn(&Tx<'_>) -> Result<R, BrokerError>,
    ) -> Result<R, BrokerError> {
        self.trees
            .as_slice()
            .transaction(|trees| {
                f(&Tx { trees }).map_err(|e| match e {
                    // Let sled retry the whole closure, as it expects.
                    BrokerError::TxConflict => ConflictableTransactionError::Conflict,
                    e => ConflictableTransactionError::Abort(e),
                })
            })
            .map_err(|e| match e {
                sled::transaction::TransactionError::Abort(e) => e,
                sled::transaction::TransactionError::Storage(e) => BrokerError::Storage(e),
            })
    }

    /// The database as the storage thread writes and flushes it.
    pub fn durable(&self) -> &Durable {
        &self.durable
    }

    /// Waits until everything written so far is on disk.
    pub async fn flush(&self) -> Result<(), BrokerError> {
        Ok(self.durable.flush().await?)
    }

    /// How many flushes this store has made since it was opened.
    pub fn flushes(&self) -> u64 {
        self.durable.flushes()
    }

    /// Runs reads (point reads, scans) on the blocking pool, off the async workers.
    pub async fn read<R, F>(&self, f: F) -> Result<R, BrokerError>
    where
        F: FnOnce(&Store) -> Result<R, BrokerError> + Send + 'static,
        R: Send + 'static,
    {
        let store = self.clone();
        storage::read(move || f(&store)).await?
    }

    pub fn get<V: DeserializeOwned>(&self, t: T, key: &[u8]) -> Result<Option<V>, BrokerError> {
        self.tree(t).get(key)?.map(|v| decode(&v)).transpose()
    }

    pub fn values<V: DeserializeOwned>(&self, t: T) -> Result<Vec<V>, BrokerError> {
        self.tree(t).iter().values().map(|v| decode(&v?)).collect()
    }
}

/// A view of every tree inside one transaction.
pub struct Tx<'a> {
    trees: &'a [TransactionalTree],
}

impl Tx<'_> {
    pub fn read<V: DeserializeOwned>(&self, t: T, key: &[u8]) -> Result<Option<V>, BrokerError> {
        self.trees[t as usize]
            .get(key)
            .map_err(unabortable)?
            .map(|v| decode(&v))
            .transpose()
    }

    pub fn contains(&self, t: T, key: &[u8]) -> Result<bool, BrokerError> {
        Ok(self.trees[t as usize]
            .get(key)
            .map_err(unabortable)?
            .is_some())
    }
}

fn unabortable(e: sled::transaction::UnabortableTransactionError) -> BrokerError {
    match e {
        sled::transaction::UnabortableTransactionError::Storage(e) => BrokerError::Storage(e),
        sled::transaction::UnabortableTransactionError::Conflict => BrokerError::TxConflict,
    }
}
