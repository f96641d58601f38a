//! Storage: the event log (segment files, the source of truth) and, in sled, one tree
//! per projection, rebuildable from the log.
//!
//! On disk (a store's root, `<data dir>/store`):
//! - `log/`: the event log ([`log`]: what is synced when is in its header). Each record
//!   is one [`Event`], stored as its version byte and its wire JSON; or (version 2) with
//!   a flight's repeated answer as a reference to where it is already ([`shared`]); or
//!   (version 3) a flight's update without its flight, which the update before it folds
//!   into ([`slim`]); or (version 5) a posted message in protobuf ([`posted`]). A posted
//!   message's record starts with a link to the record of the message before it in its
//!   conversation ([`log::Link`]), which the log hands apart.
//! - `db/`: sled, with the trees below. Every value starts with a version byte, then
//!   JSON, unless said otherwise.
//!
//! Trees:
//! - `event_pos`: global seq (u64 big-endian) -> the event's position in the log (u64 BE),
//!   for one event in [`EVENT_POS_EVERY`]: another is found from the nearest before it
//!   by the headers of the records between ([`EventLog::find`])
//! - `agents`: name -> [`Agent`]
//! - `conversations`: id -> [`Conversation`] as created: its message count is read from
//!   `messages` (`counts`), not written for each message
//! - `messages`: conversation id, 0, index (u64 BE) -> the global seq and log position
//!   of the event that posted the [`Message`] (two u64 BE; the message is stored once,
//!   in the log), only for a message whose record links to none: the rest are found
//!   from the one after them, whose record links to them ([`log::Link`]); and
//!   conversation id, 0, `u64::MAX` -> the seq, position and index of its last message
//!   (`counts::walk_back` reads them, newest first)
//! - `message_ids`: message id -> key in `messages`, only for a message whose id does not
//!   carry the seq of the event that posted it (made before 2026-11-29: [`message_id`])
//! - `invocations`, `flights`, `deliveries`, `approvals`, `bindings`: id -> record (a
//!   completed flight's record with a long output: version 2, the output read from its
//!   completion in the log, [`decode_flight`]). A live flight's record is written for
//!   a change of state or usage, not for each delta, item or other update: those after
//!   it are folded on when it is read (`heads`)
//! - `flight_updates`: flight id, 0, per-flight seq (u64 BE) -> the global seq and the
//!   log position of the event that made the [`FlightUpdate`] (two u64 BE): the update
//!   itself is stored once, in the log
//! - `flight_children` (an index): parent flight id, 0, child flight id -> nothing
//! - `usage_daily`: agent, 0, UTC day (`YYYY-MM-DD`) -> `UsageTotals`; `usage_trees`:
//!   root flight id -> `UsageTotals` (the usage counters budgets read: see `usage`)
//! - `replay_index`: scope letter + id, 0, global seq (u64 BE) -> nothing: the events a
//!   replay of an agent (`a`), a conversation (`c`) or a flight (`f`) reads besides the
//!   flight's updates and the conversation's messages ([`Scope`], [`replay_scopes`]).
//!   Deltas and messages are not in it: they are read from `flight_updates` and
//!   `messages`, which hold each one's global seq.
//! - `rules`: rule id -> remembered [`Rule`](relay_protocol::domain::Rule), its `matched`
//!   and `last_matched_at` folded from the `approval_decided` events decided by
//!   `rule:<id>`; deleted by `rule_removed`.
//!
//! - `meta`: markers of one-time work, and `log_applied`: the seq and the end position of
//!   the last event the projections hold (the log past it is applied at open).
//! - `agent_secrets`, `report_cursors` (and the embedded runtime's `runtime.*` trees):
//!   state that is not in the log; a batch that writes it has sled flushed and its file
//!   `fdatasync`ed in the same group commit, before it is acknowledged.
//!
//! Projections are written only by [`apply`], when a batch commits (one key after the
//! other, `meta` last, readers kept from seeing part of it, no sled transaction:
//! [`Store::direct`], whose module says why that is safe), when the log past
//! `log_applied` is caught up at open ([`recover`], the same way), and when
//! [`Store::verify`] rebuilds them from the log, so they cannot drift apart. sled is
//! flushed only at checkpoints (every [`CHECKPOINT_EVENTS`] events or
//! [`CHECKPOINT_INTERVAL`]) and for the state above: after a crash, what it lost is
//! applied again from the log (up to a checkpoint's worth of events: no sled
//! transaction writes its buffer out between checkpoints any more); if it holds more
//! than the log (a batch never acknowledged) or cannot be opened, it is rebuilt.
//!
//! Who touches sled, and where (see [`relay_infra::storage`] for why):
//! - Writes and flushes run only on the process's storage thread: the broker's writer
//!   hands each batch over as one job ([`Store::durable`]).
//! - Reads from async code go through [`Store::read`], on the blocking pool. The plain
//!   getters (`queries`) are for code already off the async workers.
//!
//! One concern per file: [`Store`] (here) opens the database and holds its trees, the
//! batch's view [`Tx`] and the blocking-pool reads; `keys` lays out the trees, keys
//! and versioned values; `projections` applies events to the trees ([`apply`]) and
//! builds the indexes a database made before them lacks; `queries` reads the records
//! back; `usage` folds the flights' usage into its counters and reads them (and the
//! report of `relay usage`); `doctor` rebuilds the projections from the log and compares
//! ([`Store::verify`]); `published` pairs an event with its stored JSON, the one
//! encoding every subscriber gets ([`Published`]); `shared` stores a flight's answer
//! once ([`decode_record`] reads every record back); `slim` stores a flight's update
//! without its flight (`shared` reads it back through `slim`); `heads` keeps the newest state of
//! the live flights whose record lags, and folds their updates on for readers; `counts`
//! keeps the conversations' message counts and reads them for readers. They
//! layer one way: `keys` <- `slim` <- `shared` <- `published`, `usage` <-> `projections` <-
//! `queries` <-> `heads` (a read folds a lagging record's updates on, reading them as
//! `queries` reads updates), `doctor` (`projections` calls the fold, which writes through
//! its `Sink`).
//!
//! [`Event`]: relay_protocol::event::Event
//! [`Agent`]: relay_protocol::domain::Agent
//! [`Conversation`]: relay_protocol::domain::Conversation
//! [`Message`]: relay_protocol::domain::Message
//! [`FlightUpdate`]: relay_protocol::domain::FlightUpdate

mod counts;
mod direct;
mod doctor;
mod heads;
mod keys;
pub mod log;
pub mod migrate;
mod posted;
mod projections;
mod published;
mod queries;
mod recover;
mod shared;
mod slim;
mod usage;

use std::sync::Arc;

use relay_infra::storage::{self, Durable};
use relay_protocol::clock::now_ms;
use relay_protocol::domain::Flight;
use serde::de::DeserializeOwned;

use crate::error::BrokerError;

pub use doctor::{DoctorReport, VerifyReport};
pub use keys::{
    child_key, decode, encode, last_message_key, message_id, message_id_seq, pair_key, pair_value,
    parse_pair, seq_key, Scope, T,
};
pub use log::{EventLog, LogError, LogTexts, Pos};
pub use posted::{compact as compact_posted, POSTED_VERSION};
pub use projections::{apply, replay_scopes, Sink, StoredUpdate, EVENT_POS_EVERY};
pub use published::Published;
pub use queries::FlightScan;
pub(crate) use recover::APPLIED_KEY;
pub use recover::{CHECKPOINT_EVENTS, CHECKPOINT_INTERVAL};
pub use shared::{
    decode_event, decode_flight, decode_flight_without_output, decode_record, Source,
    FLIGHT_OUTPUT_IN_LOG, SHARED_FILE_VERSION, SHARED_MIN, SHARED_VERSION,
};
pub use slim::{store as slim_store, Last, SLIM_RUN, SLIM_VERSION};
pub use usage::{day_key, tree_root};

use keys::TREE_NAMES;

/// Where a store lives in a data dir (a v1 data dir has only `db/`: see [`migrate`]).
pub const STORE_DIR: &str = "store";

/// The event log and the sled database of projections. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    durable: Durable,
    trees: Vec<sled::Tree>,
    log: Arc<EventLog>,
    /// Large events read back, shared by the readers that want them at once.
    read_back: Arc<published::ReadBack>,
    /// The newest state of the flights whose record lags (the writer's: see `heads`).
    heads: Arc<heads::Heads>,
    /// The message count of each conversation posted in (the writer's: see `counts`).
    counts: Arc<counts::Counts>,
    /// The last seq of a batch being written to sled without a transaction (see
    /// [`Store::direct`]): readers count it as committed before its keys are all in.
    applying: Arc<std::sync::atomic::AtomicU64>,
    /// Readers see a batch written without a transaction whole or not at all.
    gate: Arc<direct::Gate>,
    /// The key writes sled may still get (see [`Store::crash_sled_after`]).
    crash: Arc<std::sync::atomic::AtomicUsize>,
    /// Keeps a temporary store's directory alive.
    _temp: Option<Arc<tempfile::TempDir>>,
}

impl Store {
    /// Opens the store whose root is `root` (made if missing): the log in `root/log`,
    /// sled in `root/db`, caught up with the log ([`recover`]).
    pub fn open(root: &std::path::Path) -> Result<Store, BrokerError> {
        Self::open_crashing(root, usize::MAX)
    }

    /// Test support: [`Store::open`] whose catch-up or rebuild of sled reaches it with
    /// only `writes` key writes, as if the process died during it (see
    /// [`Store::crash_sled_after`]). Drop the store it gives and open it again, as a
    /// restart after that crash would.
    #[doc(hidden)]
    pub fn open_crashing(root: &std::path::Path, writes: usize) -> Result<Store, BrokerError> {
        crate::files::private_dir(root).map_err(|e| BrokerError::Log(e.to_string()))?;
        // sled first: its lock keeps a second process off the log too.
        let db_path = root.join("db");
        let db = match open_sled(&db_path) {
            Ok(db) => db,
            Err(e @ BrokerError::Locked(_)) => return Err(e),
            // The projections are rebuilt from the log; the state that is only in sled
            // (agent secrets, node cursors, runtime records) is lost with them.
            Err(e) => {
                let aside = db_path.with_extension(format!("damaged-{}", now_ms()));
                tracing::error!(error = %e, moved_to = %aside.display(), "the projections database cannot be opened: it is moved aside and rebuilt from the event log (agent secrets and runtime records kept only there are lost)");
                std::fs::rename(&db_path, &aside)
                    .map_err(|e| BrokerError::Log(format!("move {}: {e}", db_path.display())))?;
                open_sled(&db_path)?
            }
        };
        let log = Arc::new(EventLog::open(&root.join("log"))?);
        let journal = Arc::new(recover::LogJournal::new(log.clone()));
        let durable = Durable::journaled(db, Some(&db_path), Some(journal));
        let store = Self::with_db(durable, log, None)?;
        store.crash_sled_after(writes);
        store.recover()?;
        Ok(store)
    }

    /// An in-memory database over a log in a temporary directory, for unit tests and
    /// rebuild checks.
    pub fn temporary() -> Result<Store, BrokerError> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Log(e.to_string()))?;
        let log = Arc::new(EventLog::open(dir.path())?);
        let journal = Arc::new(recover::LogJournal::new(log.clone()));
        let db = storage::config().temporary(true).open()?;
        let durable = Durable::journaled(db, None, Some(journal));
        Self::with_db(durable, log, Some(Arc::new(dir)))
    }

    fn with_db(
        durable: Durable,
        log: Arc<EventLog>,
        temp: Option<Arc<tempfile::TempDir>>,
    ) -> Result<Store, BrokerError> {
        let db = durable.db();
        let trees = TREE_NAMES
            .iter()
            .map(|n| db.open_tree(n))
            .collect::<Result<Vec<_>, _>>()?;
        let store = Store {
            durable,
            trees,
            log,
            read_back: Arc::default(),
            heads: Arc::default(),
            counts: Arc::default(),
            applying: Arc::default(),
            gate: Arc::default(),
            crash: Arc::new(std::sync::atomic::AtomicUsize::new(usize::MAX)),
            _temp: temp,
        };
        store.index_once_each()?;
        Ok(store)
    }

    /// The event log.
    pub fn log(&self) -> &EventLog {
        &self.log
    }

    pub fn tree(&self, t: T) -> &sled::Tree {
        &self.trees[t as usize]
    }

    /// The seq of the last event on disk (0: none).
    pub fn last_seq(&self) -> Result<u64, BrokerError> {
        Ok(self.log.last_seq())
    }

    /// A batch's view of the store over `trees`, with its own overlays.
    fn tx<'a>(
        &'a self,
        trees: &'a direct::Direct<'a>,
        overlay: &'a heads::Overlay,
        counts_overlay: &'a counts::CountOverlay,
    ) -> Tx<'a> {
        Tx {
            trees,
            durable: &self.durable,
            log: &self.log,
            heads: &self.heads,
            overlay,
            counts: &self.counts,
            counts_overlay,
        }
    }

    /// Runs `f`, the writer's batch, over every tree: its writes are held, read back by
    /// `f`, and, if it succeeds, applied to sled one by one
    /// (`meta` last) behind the gate readers check, so that none sees part of them. An
    /// error while applying may leave part of the batch in sled (see [`direct`]).
    pub fn direct<R>(
        &self,
        f: impl FnOnce(&Tx<'_>) -> Result<R, BrokerError>,
    ) -> Result<R, BrokerError> {
        let overlay = heads::Overlay::default();
        let counts_overlay = counts::CountOverlay::default();
        self.counts.load(self)?;
        let writes = direct::Direct::new(&self.trees);
        let done = f(&self.tx(&writes, &overlay, &counts_overlay))?;
        let last = self.log.appended_seq()?;
        self.gate.write(|| {
            // Before any key: a reader that sees one of them waits for the batch's sync.
            // (Behind the gate: a reader holding it back sees no new batch committed.)
            self.applying
                .fetch_max(last, std::sync::atomic::Ordering::AcqRel);
            writes.apply(last, &self.crash)?;
            self.heads.commit(&overlay);
            self.counts.commit(&counts_overlay);
            Ok(done)
        })
    }

    /// Test support: from now on the batches of this store's writer reach sled with only
    /// `writes` more key writes among them, as if the process died then; the log still
    /// gets them all. Reopened, the store shows what a restart after such a crash does.
    #[doc(hidden)]
    pub fn crash_sled_after(&self, writes: usize) {
        self.crash
            .store(writes, std::sync::atomic::Ordering::Relaxed);
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

    /// Runs reads (point reads, scans) on the blocking pool, off the async workers, and
    /// answers only once what they could see is on disk. `f` sees each of the writer's
    /// batches whole or not at all: it runs again when one went in meanwhile (see
    /// [`direct`]), so it must not have side effects.
    ///
    /// sled commits a batch before its group commit syncs the log, so for that moment
    /// a read sees events not yet durable (a flight as completed, say). Handing that out
    /// would show a client what a crash can still take back, and let it ask for what
    /// follows (the flight's updates, `/metrics`, the feed) before any of it is
    /// published. So the read waits for the sync already under way: at most one
    /// `fdatasync`, and nothing when no batch is between its commit and its sync.
    pub async fn read<R, F>(&self, f: F) -> Result<R, BrokerError>
    where
        F: Fn(&Store) -> Result<R, BrokerError> + Send + 'static,
        R: Send + 'static,
    {
        let store = self.clone();
        storage::read(move || {
            // Whole batches only: `f` runs again when one went in meanwhile.
            let read = match store.gate.read(|| f(&store)) {
                Some(read) => read?,
                None => store.read_held(&f)?,
            };
            store.on_disk(read)
        })
        .await?
    }

    /// [`Store::read`] for a read over whole trees (a listing, a report): one that would
    /// hold the writer back for all its length whenever it raced batches. It sees each
    /// key whole, and may see part of a batch, as every read could when batches were
    /// sled transactions (atomic key by key for a reader outside them). A batch's
    /// flights go into sled after its other records: a flight seen has its invocation.
    pub async fn read_listing<R, F>(&self, f: F) -> Result<R, BrokerError>
    where
        F: FnOnce(&Store) -> Result<R, BrokerError> + Send + 'static,
        R: Send + 'static,
    {
        let store = self.clone();
        storage::read(move || {
            let read = f(&store)?;
            store.on_disk(read)
        })
        .await?
    }

    /// `read`, once what it could see is on disk.
    fn on_disk<R>(&self, read: R) -> Result<R, BrokerError> {
        let committed = self.committed_seq()?;
        if self.log.last_seq() < committed {
            self.wait_on_disk(committed)?;
        }
        Ok(read)
    }

    /// Runs `f` with the writer held back, so that no batch goes in meanwhile, once all
    /// that is committed is on disk: `f` may wait for a committed batch's sync (a
    /// snapshot rolling forward over the log does), which the storage thread, stopped at
    /// the gate with the next batch, could not make.
    fn read_held<R>(&self, f: impl Fn(&Store) -> Result<R, BrokerError>) -> Result<R, BrokerError> {
        loop {
            self.wait_on_disk(self.committed_seq()?)?;
            let _held = self.gate.hold();
            if self.committed_seq()? <= self.log.last_seq() {
                return f(self);
            }
            // A batch went in before the hold: wait for its sync too, unheld.
        }
    }

    /// The value at `key` of tree `t` (a flight: as it is now, see [`Store::flight`]).
    pub fn get<V: DeserializeOwned>(&self, t: T, key: &[u8]) -> Result<Option<V>, BrokerError> {
        self.tree(t)
            .get(key)?
            .map(|v| self.decode_in(t, &v))
            .transpose()
    }

    /// Every value of tree `t` (flights: as they are now).
    pub fn values<V: DeserializeOwned>(&self, t: T) -> Result<Vec<V>, BrokerError> {
        self.tree(t)
            .iter()
            .values()
            .map(|v| self.decode_in(t, &v?))
            .collect()
    }

    /// A value of tree `t`; a `flights` record with its output read from the log (see
    /// [`decode_flight`]) and its later deltas folded on (`heads`), whatever type it is
    /// read as.
    fn decode_in<V: DeserializeOwned>(&self, t: T, value: &[u8]) -> Result<V, BrokerError> {
        if matches!(t, T::Flights) {
            let flight = self.current(decode_flight(&self.log, value)?)?;
            return Ok(serde_json::from_value(serde_json::to_value(flight)?)?);
        }
        decode(value)
    }
}

/// A batch's view of every tree: what it wrote so far over what sled holds (see
/// [`direct`]).
pub struct Tx<'a> {
    trees: &'a direct::Direct<'a>,
    /// Told when the batch writes state that is not in the log.
    durable: &'a Durable,
    log: &'a EventLog,
    /// The flights whose record lags, as committed, and this batch's changes to
    /// them (see `heads`).
    heads: &'a heads::Heads,
    overlay: &'a heads::Overlay,
    /// The conversations' message counts, as committed, and this batch's posts
    /// (see `counts`).
    counts: &'a counts::Counts,
    counts_overlay: &'a counts::CountOverlay,
}

impl Tx<'_> {
    /// The long texts in files of their own ([`log::TextFiles`]).
    pub fn texts(&self) -> &log::TextFiles {
        self.log.texts()
    }

    /// A flight as it is now: its newest state (see `heads`), its output read from the
    /// log where it is kept there, or given by `pending` for an event of this batch (by
    /// its seq: not in the log yet).
    pub fn flight(
        &self,
        id: &str,
        pending: impl Fn(u64) -> Option<relay_protocol::domain::SharedStr>,
    ) -> Result<Option<Flight>, BrokerError> {
        if let Some(head) = self.head(id)? {
            return Ok(Some(head));
        }
        self.trees
            .get(T::Flights, id.as_bytes())?
            .map(|v| self.caught_up(shared::decode_flight_from(self.log, &v, pending)?))
            .transpose()
    }

    /// A flight as it is now without its output where that is kept in the log (`None`
    /// there): for a check of its state, agent or parent, which need not read (and
    /// decode) a long answer back.
    pub fn flight_without_output(&self, id: &str) -> Result<Option<Flight>, BrokerError> {
        if let Some(head) = self.head(id)? {
            return Ok(Some(head));
        }
        self.trees
            .get(T::Flights, id.as_bytes())?
            .map(|v| self.caught_up(shared::decode_flight_without_output(&v)?))
            .transpose()
    }

    /// The value at `key` of tree `t` (a flight: as [`Tx::flight`] reads it).
    pub fn read<V: DeserializeOwned>(&self, t: T, key: &[u8]) -> Result<Option<V>, BrokerError> {
        if matches!(t, T::Flights) {
            return self
                .flight(&String::from_utf8_lossy(key), |_| None)?
                .map(|f| Ok(serde_json::from_value(serde_json::to_value(f)?)?))
                .transpose();
        }
        self.trees.get(t, key)?.map(|v| decode(&v)).transpose()
    }

    /// Update `seq` of `flight`, read from the log (`None`: there is none, or it is not
    /// on disk yet: rules keep what they just wrote themselves).
    pub fn stored_update(
        &self,
        flight: &str,
        seq: u64,
    ) -> Result<Option<StoredUpdate>, BrokerError> {
        match self.update_pos(flight, seq)? {
            Some((event_seq, pos)) => queries::update_at(self.log, event_seq, pos, false),
            None => Ok(None),
        }
    }

    /// The global seq and log position of update `seq` of `flight` (`None`: no such).
    fn update_pos(&self, flight: &str, seq: u64) -> Result<Option<(u64, Pos)>, BrokerError> {
        self.trees
            .get(T::FlightUpdates, &child_key(flight, seq))?
            .map(|v| parse_pair(&v))
            .transpose()
    }

    /// The message with id `id`, read from the log where the writer appended it (synced
    /// or not: the running batch's own events are not there yet; rules look there first).
    pub fn message(
        &self,
        id: &str,
    ) -> Result<Option<relay_protocol::domain::Message>, BrokerError> {
        let get = |t: T, key: &[u8]| -> Result<Option<sled::IVec>, BrokerError> {
            self.trees.get(t, key)
        };
        queries::message_of_id(&get, self.log, id, true)
    }

    pub fn contains(&self, t: T, key: &[u8]) -> Result<bool, BrokerError> {
        Ok(self.trees.get(t, key)?.is_some())
    }
}

/// Opens sled at `path` (private: 0700/0600, never through a planted symlink).
fn open_sled(path: &std::path::Path) -> Result<sled::Db, BrokerError> {
    relay_infra::disk::open_private(storage::config().mode(sled::Mode::HighThroughput), path)
        .map_err(|e| {
            if relay_infra::disk::is_lock_error(&e) {
                BrokerError::Locked(path.display().to_string())
            } else {
                BrokerError::Storage(e)
            }
        })
}
