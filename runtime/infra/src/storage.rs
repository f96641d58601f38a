//! The storage thread: the one owner of every sled write and flush in this process.
//!
//! Over 600 lines: the thread, its group commit, its job queue and the tests of the three.
//!
//! # Why one thread for the whole process
//! sled 0.34 guards every operation with ONE process-wide reader/writer lock
//! (`concurrency_control`), shared by all databases the process opens. A flush holds it
//! shared while it waits for its I/O buffers to be written; a transaction takes it
//! exclusive; and a reader (or sled's own background flusher) that arrives while a
//! transaction waits queues behind it. Seen in a wedged `relay up` (gdb): every sled I/O
//! thread in `flush_async -> make_stable` holding the lock shared, the broker's
//! transaction waiting for it exclusive on a tokio worker, the other worker's
//! `Tree::get` and both `log flusher` threads waiting behind that, and the buffers the
//! flushes waited for never written. Two tokio workers blocked in sled stop everything.
//!
//! So here:
//! - Every transaction, durable write and flush of every database runs on this one
//!   thread ([`Storage::run`]), never on the async runtime's workers, and never two at
//!   once: a flush can no longer hold the lock while a transaction waits for it.
//! - sled's periodic background flusher is off ([`config`]); the only flushes are ours.
//! - Group commit: the thread takes every job that is waiting (up to [`MAX_GROUP`]),
//!   runs them one after another, then flushes each database that a job asked to make
//!   durable ONCE, and only then answers those jobs. N concurrent durable writes cost one
//!   flush per database, not N.
//! - Reads do not come here: they go to the blocking pool ([`read`]), where waiting for
//!   a running transaction blocks no async worker.
//!
//! Jobs are closures; a job that panics is answered with [`StorageError::Panicked`] and
//! the thread goes on.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::{mpsc, oneshot};

use crate::disk::{Full, Room};

/// Jobs waiting for the storage thread; a caller past this waits for room.
pub const JOB_QUEUE_CAPACITY: usize = 4096;
/// Most jobs run before one round of flushes.
pub const MAX_GROUP: usize = 1024;
/// How many times the idle storage thread looks for a job (yielding the CPU between
/// looks) before it parks.
const SPIN_BEFORE_PARK: usize = 64;

#[derive(Debug, Clone, thiserror::Error)]
pub enum StorageError {
    /// The flush after the job failed: the job ran, but its writes may not be on disk.
    #[error("disk flush failed: {0}")]
    Flush(Arc<sled::Error>),
    /// The journal in front of the database could not be synced: the job ran, but its
    /// writes may not be on disk.
    #[error("journal sync failed: {0}")]
    Journal(String),
    #[error("a storage job panicked: {0}")]
    Panicked(String),
    /// The storage thread is gone (the process is ending).
    #[error("the storage thread has stopped")]
    Stopped,
    /// The disk is (nearly) full: the write was refused before it reached sled, and
    /// nothing of it was stored ([`crate::disk`]). Writes resume once space is freed.
    #[error(transparent)]
    Full(#[from] crate::disk::Full),
}

/// What became of a job: it ran and returned `R`, with the outcome of the flush after
/// it (`Ok` when it asked for none); or it did not run, or panicked (the outer error).
pub type Ran<R> = Result<(R, Result<(), StorageError>), StorageError>;

/// The cache each database of the process gets, in bytes, unless
/// [`set_cache_capacity`] said otherwise: sled's own default (1 GiB) made a broker's
/// memory grow with its history. sled holds projections and indexes only (events are
/// read from the broker's log, through the OS's page cache), and sled's nodes take
/// about twice what it counts: the fleet of ops/bench 10 ended at 77, 61 and 57 MB of
/// RSS with 16, 8 and 4 MiB, while flights per second (3), restart and listings at
/// 100,000 flights (5) and replay (6) did not move beyond their noise (BENCHMARKS part
/// 16). 64 MiB had kept about 25 MB more than 16 MiB, for no gain either.
pub const DEFAULT_CACHE_CAPACITY: u64 = 8 << 20;

static CACHE_CAPACITY: AtomicU64 = AtomicU64::new(DEFAULT_CACHE_CAPACITY);

/// Sets the cache of databases opened from now on (`relay up --cache-mb`).
pub fn set_cache_capacity(bytes: u64) {
    CACHE_CAPACITY.store(bytes, Ordering::Relaxed);
}

/// The sled settings every Relay database opens with: no background flusher (see the
/// module header), and a bounded cache ([`set_cache_capacity`]).
pub fn config() -> sled::Config {
    sled::Config::new()
        .flush_every_ms(None)
        .cache_capacity(CACHE_CAPACITY.load(Ordering::Relaxed))
}

/// A database whose writes can be made durable by the storage thread.
#[derive(Clone)]
pub struct Durable {
    inner: Arc<DurableInner>,
}

struct DurableInner {
    db: sled::Db,
    flushes: AtomicU64,
    /// For a database opened with [`crate::disk::open_private`].
    sweeper: Option<crate::disk::Sweeper>,
    /// sled's data file (`<dir>/db`), `fdatasync`ed after each of sled's flushes: sled
    /// flushes with `sync_file_range`, which neither writes the file's size nor flushes
    /// the drive's cache, so on its own it does not survive a power loss.
    data_file: Option<std::path::PathBuf>,
    /// What the group's flush makes durable first, when the database has a journal.
    journal: Option<Arc<dyn Journal>>,
    /// A write the journal does not hold went into the database since its last flush
    /// (with a journal: the next group flush must flush the database too).
    db_dirty: std::sync::atomic::AtomicBool,
}

/// A write-ahead journal in front of a database (the broker's event log): the storage
/// thread's group flush syncs the journal, and flushes the database only when the
/// journal asks for it (a checkpoint), since the journal alone can redo what the
/// database lost.
pub trait Journal: Send + Sync {
    /// Makes everything appended so far durable. `Ok(true)`: flush the database now too.
    fn sync(&self) -> Result<bool, String>;
}

impl std::fmt::Debug for Durable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Durable")
            .field("flushes", &self.flushes())
            .finish_non_exhaustive()
    }
}

impl Durable {
    pub fn new(db: sled::Db) -> Durable {
        Durable {
            inner: Arc::new(DurableInner {
                db,
                flushes: AtomicU64::new(0),
                sweeper: None,
                data_file: None,
                journal: None,
                db_dirty: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// A database opened with [`crate::disk::open_private`] at `dir`: the files sled
    /// makes later are kept private too ([`crate::disk::Sweeper`]).
    pub fn private(db: sled::Db, dir: &std::path::Path) -> Durable {
        Self::journaled(db, Some(dir), None)
    }

    /// [`Durable::private`], with a `journal` synced by each group flush in its place
    /// (see [`Journal`]).
    /// `dir`: where the database is on disk (`None`: a temporary one).
    pub fn journaled(
        db: sled::Db,
        dir: Option<&std::path::Path>,
        journal: Option<Arc<dyn Journal>>,
    ) -> Durable {
        Durable {
            inner: Arc::new(DurableInner {
                db,
                flushes: AtomicU64::new(0),
                sweeper: dir.map(crate::disk::Sweeper::new),
                data_file: dir.map(|d| d.join("db")),
                journal,
                db_dirty: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// The next group flush flushes the database itself too, journal or not: it holds a
    /// write the journal cannot redo.
    pub fn want_db_flush(&self) {
        self.inner.db_dirty.store(true, Ordering::Release);
    }

    pub fn db(&self) -> &sled::Db {
        &self.inner.db
    }

    /// The database's directory (`None`: a temporary one).
    pub fn dir(&self) -> Option<&std::path::Path> {
        self.inner
            .data_file
            .as_deref()
            .and_then(std::path::Path::parent)
    }

    /// Flushes of this database so far (group commit keeps this far below the writes).
    pub fn flushes(&self) -> u64 {
        self.inner.flushes.load(Ordering::Relaxed)
    }

    fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// Flushes now, on the calling thread (the storage thread).
    fn flush_now(&self) -> Result<(), StorageError> {
        crate::disk::test_stall_hook();
        let r = match &self.inner.journal {
            None => self.flush_db(),
            Some(journal) => match journal.sync() {
                // A write the journal cannot redo must survive a power loss itself.
                Ok(_) if self.inner.db_dirty.swap(false, Ordering::AcqRel) => self.flush_db(),
                // A checkpoint only bounds the journal's replay at the next open: the
                // journal holds what it would lose, so no fdatasync of sled's file.
                Ok(true) => {
                    let t = std::time::Instant::now();
                    let flushed = self.flush_sled();
                    let ms = t.elapsed().as_secs_f64() * 1e3;
                    tracing::debug!(ms, "checkpoint: sled flushed");
                    flushed
                }
                Ok(false) => Ok(()),
                Err(e) => Err(StorageError::Journal(e)),
            },
        };
        self.inner.flushes.fetch_add(1, Ordering::Relaxed);
        r
    }

    /// Flushes sled (`sync_file_range`), and makes the files it made private.
    fn flush_sled(&self) -> Result<(), StorageError> {
        let flushed = self.inner.db.flush();
        if let Some(s) = &self.inner.sweeper {
            s.after_flush();
        }
        flushed
            .map(|_| ())
            .map_err(|e| StorageError::Flush(Arc::new(e)))
    }

    /// Flushes sled, then `fdatasync`s its data file (see `data_file`).
    fn flush_db(&self) -> Result<(), StorageError> {
        self.flush_sled()?;
        if let Some(path) = &self.inner.data_file {
            std::fs::File::open(path)
                .and_then(|f| f.sync_data())
                .map_err(|e| StorageError::Flush(Arc::new(sled::Error::Io(e))))?;
        }
        Ok(())
    }

    /// Runs `work` on the storage thread, then makes this database durable (one flush
    /// for the whole group) before answering. The outer error: the job did not run or
    /// panicked; the inner one: it ran, and the flush after it failed.
    pub async fn write<R, F>(&self, work: F) -> Ran<R>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let this = self.clone();
        Storage::global()
            .submit(Some(self.clone()), move || {
                // Not a journal's write: the database itself must be flushed.
                this.want_db_flush();
                work()
            })
            .await
    }

    /// [`Durable::write`] for callers that need the write on disk before going on.
    pub async fn write_durably<R, F>(&self, work: F) -> Result<R, StorageError>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let (r, flushed) = self.write(work).await?;
        flushed.map(|()| r)
    }

    /// Waits until everything written to this database so far is on disk. Never
    /// refused for a full disk: it writes nothing new, and what it makes durable may
    /// have been acknowledged already.
    pub async fn flush(&self) -> Result<(), StorageError> {
        let (tx, rx) = oneshot::channel();
        let this = self.clone();
        Storage::global()
            .queue(
                Some(self.clone()),
                None,
                move |_| this.want_db_flush(),
                |_| true,
                move |r| {
                    let _ = tx.send(r);
                },
            )
            .await?;
        let ((), flushed) = rx.await.map_err(|_| StorageError::Stopped)??;
        flushed
    }
}

/// Runs `work` (a point read or a scan) on the blocking pool, off the async workers.
pub async fn read<R, F>(work: F) -> Result<R, StorageError>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    tokio::task::spawn_blocking(work).await.map_err(|e| {
        if e.is_panic() {
            StorageError::Panicked(panic_text(e.into_panic().as_ref()))
        } else {
            StorageError::Stopped
        }
    })
}

/// The storage thread, held by [`Storage::pause`] until this drops or is resumed.
pub struct Paused {
    release: Option<std::sync::mpsc::Sender<()>>,
    job: Option<tokio::task::JoinHandle<Result<(), StorageError>>>,
}

impl Paused {
    /// Lets the storage thread go on, and waits until it has.
    pub async fn resume(mut self) {
        self.release.take();
        if let Some(job) = self.job.take() {
            let _ = job.await;
        }
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        // Dropping the sender ends the held job's wait.
        self.release.take();
    }
}

type Finish = Box<dyn FnOnce(Result<(), StorageError>) + Send>;

struct Job {
    flush: Option<Durable>,
    /// Refused without running while the disk has less free than this room allows
    /// ([`crate::disk::Room`]); `None`: never refused.
    guard: Option<Room>,
    /// Runs the work (told whether the disk is under its reserve), or with `Err(refusal)`
    /// answers that instead of running it; says whether it wrote (a job that wrote
    /// nothing needs no flush).
    run: Box<dyn FnOnce(Admitted) -> (Finish, bool) + Send>,
}

/// Whether a job may run: `Ok(Some(full))` it may, though the disk is under its reserve.
type Admitted = Result<Option<Full>, StorageError>;

/// A handle to the process's storage thread.
#[derive(Clone)]
pub struct Storage {
    jobs: mpsc::Sender<Job>,
}

impl Storage {
    /// The process's storage thread, started on first use.
    pub fn global() -> &'static Storage {
        static STORAGE: OnceLock<Storage> = OnceLock::new();
        STORAGE.get_or_init(|| {
            let (jobs, rx) = mpsc::channel(JOB_QUEUE_CAPACITY);
            let spawned = std::thread::Builder::new()
                .name("relay-storage".into())
                .spawn(move || run(rx));
            if let Err(e) = spawned {
                // Every job then fails with `Stopped` (its receiver is gone).
                tracing::error!(error = %e, "cannot start the storage thread");
            }
            Storage { jobs }
        })
    }

    /// Holds the storage thread until the returned guard drops: nothing commits or
    /// flushes meanwhile. For tests of what happens while storage cannot move
    /// (backpressure, group commit).
    pub async fn pause(&'static self) -> Paused {
        let (held_tx, held_rx) = oneshot::channel();
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let job = tokio::spawn(self.run(move || {
            let _ = held_tx.send(());
            let _ = wait.recv();
        }));
        let _ = held_rx.await;
        Paused {
            release: Some(release),
            job: Some(job),
        }
    }

    /// Jobs waiting for the storage thread right now.
    pub fn queued(&self) -> usize {
        self.jobs.max_capacity() - self.jobs.capacity()
    }

    /// Runs `work` on the storage thread, without a flush of its own (it is made durable
    /// by the next flush of its database).
    pub async fn run<R, F>(&self, work: F) -> Result<R, StorageError>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        self.submit(None, work).await.map(|(r, _)| r)
    }

    async fn submit<R, F>(&self, flush: Option<Durable>, work: F) -> Ran<R>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        self.submit_then(
            flush,
            work,
            |_| true,
            move |r| {
                let _ = tx.send(r);
            },
        )
        .await?;
        rx.await.map_err(|_| StorageError::Stopped)?
    }

    /// Queues `work`; once it ran and (with `flush`) its database is flushed, `then`
    /// gets the outcome ON THE STORAGE THREAD, so it can answer waiting callers without
    /// another thread hop (keep it short: it holds up the next group). Returns once the
    /// job is queued; `then` is not called if the storage thread is gone.
    /// With `flush`, the job's database is flushed unless `wrote` says the work's outcome
    /// wrote nothing (a batch of commands that were all refused): such a job needs no
    /// flush of its own and costs none.
    /// With `flush`, the job is refused ([`StorageError::Full`], `then` told so, `work`
    /// never run) while the disk is under its reserve (for Relay's own writes, see
    /// [`Storage::submit_relay_then`]).
    pub async fn submit_then<R, F, W, T>(
        &self,
        flush: Option<Durable>,
        work: F,
        wrote: W,
        then: T,
    ) -> Result<(), StorageError>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
        W: FnOnce(&R) -> bool + Send + 'static,
        T: FnOnce(Ran<R>) + Send + 'static,
    {
        let guard = flush.is_some().then_some(Room::AboveReserve);
        self.queue(flush, guard, move |_| work(), wrote, then).await
    }

    /// As [`Storage::submit_then`], for Relay's own writes: refused only below the
    /// reserve's floor ([`Room::DownToFloor`]). `work` is told (`Some`) when the disk is
    /// under the reserve, so that what it does for clients it refuses with that.
    pub async fn submit_relay_then<R, F, W, T>(
        &self,
        flush: Durable,
        work: F,
        wrote: W,
        then: T,
    ) -> Result<(), StorageError>
    where
        F: FnOnce(Option<Full>) -> R + Send + 'static,
        R: Send + 'static,
        W: FnOnce(&R) -> bool + Send + 'static,
        T: FnOnce(Ran<R>) + Send + 'static,
    {
        self.queue(Some(flush), Some(Room::DownToFloor), work, wrote, then)
            .await
    }

    async fn queue<R, F, W, T>(
        &self,
        flush: Option<Durable>,
        guard: Option<Room>,
        work: F,
        wrote: W,
        then: T,
    ) -> Result<(), StorageError>
    where
        F: FnOnce(Option<Full>) -> R + Send + 'static,
        R: Send + 'static,
        W: FnOnce(&R) -> bool + Send + 'static,
        T: FnOnce(Ran<R>) + Send + 'static,
    {
        let run = Box::new(
            move |admitted: Result<Option<Full>, StorageError>| -> (Finish, bool) {
                let short = match admitted {
                    Ok(short) => short,
                    Err(e) => {
                        let finish: Finish = Box::new(move |_| then(Err(e)));
                        return (finish, false);
                    }
                };
                match catch_unwind(AssertUnwindSafe(move || work(short))) {
                    Ok(r) => {
                        let wrote = wrote(&r);
                        (Box::new(move |flushed| then(Ok((r, flushed)))), wrote)
                    }
                    Err(panic) => {
                        let text = panic_text(panic.as_ref());
                        // A failed flush of the group matters more than the panic: say it.
                        let finish: Finish = Box::new(move |flushed: Result<(), StorageError>| {
                            then(Err(flushed.err().unwrap_or(StorageError::Panicked(text))))
                        });
                        (finish, true)
                    }
                }
            },
        );
        self.jobs
            .send(Job { flush, guard, run })
            .await
            .map_err(|_| StorageError::Stopped)
    }
}

fn run(mut rx: mpsc::Receiver<Job>) {
    loop {
        let Some(first) = next_job(&mut rx) else {
            return;
        };
        crate::disk::busy();
        // The disk's free space, read once per group (one `statvfs`), when the first
        // guarded job comes.
        let mut space: Option<Option<crate::disk::Space>> = None;
        // Run this job and every one waiting or arriving meanwhile (up to MAX_GROUP),
        // then flush each database they asked for once, then answer them all.
        let mut to_flush: Vec<Durable> = Vec::new();
        let mut finishes: Vec<(Option<usize>, Finish)> = Vec::new();
        let mut next = Some(first);
        while let Some(job) = next {
            let admitted = match job.guard {
                None => Ok(None),
                Some(room) => match space.get_or_insert_with(crate::disk::space) {
                    // A filesystem whose space cannot be read is not refused (sled then
                    // says what is wrong).
                    None => Ok(None),
                    Some(s) => match s.refusal(room) {
                        Some(full) => Err(StorageError::Full(full)),
                        None => Ok(s.refusal(Room::AboveReserve)),
                    },
                },
            };
            let (finish, wrote) = (job.run)(admitted);
            let flush = job.flush.filter(|_| wrote);
            let id = flush.as_ref().map(Durable::id);
            if let Some(d) = flush {
                if !to_flush.iter().any(|f| f.id() == d.id()) {
                    to_flush.push(d);
                }
            }
            finishes.push((id, finish));
            next = if finishes.len() < MAX_GROUP {
                rx.try_recv().ok()
            } else {
                None
            };
        }
        let flushed: Vec<(usize, Result<(), StorageError>)> =
            to_flush.iter().map(|d| (d.id(), d.flush_now())).collect();
        // Let go of the databases before answering: a caller that closes its database
        // once answered must not find it still open here.
        drop(to_flush);
        for (id, finish) in finishes {
            let result = flushed
                .iter()
                .find(|(f, _)| Some(*f) == id)
                .map_or(Ok(()), |(_, r)| r.clone());
            if catch_unwind(AssertUnwindSafe(|| finish(result))).is_err() {
                tracing::error!("a storage job's answer panicked");
            }
        }
        crate::disk::idle();
    }
}

/// The next job; when none waits, looks again a few times (a job often follows the last
/// within microseconds: the rest of a turn's stream, the next request) before parking.
/// `None` once every sender is gone.
fn next_job(rx: &mut mpsc::Receiver<Job>) -> Option<Job> {
    for _ in 0..SPIN_BEFORE_PARK {
        match rx.try_recv() {
            Ok(job) => return Some(job),
            Err(mpsc::error::TryRecvError::Empty) => std::thread::yield_now(),
            Err(mpsc::error::TryRecvError::Disconnected) => return None,
        }
    }
    rx.blocking_recv()
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// Tests that count or hold the storage thread's jobs take this lock, so that under
/// `cargo test` (one process, tests in parallel) they do not count each other's jobs.
#[cfg(test)]
pub(crate) async fn exclusive() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    use std::time::Duration;

    /// A deadline against a hang: the test fails instead of holding CI.
    async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(120), f)
            .await
            .expect("storage wedged: the work did not finish")
    }

    fn temp_db() -> Durable {
        Durable::new(config().temporary(true).open().unwrap())
    }

    /// Waits (with a deadline against a hang) until `n` more jobs wait for the thread.
    async fn wait_queued(n: usize) {
        tokio::time::timeout(Duration::from_secs(60), async {
            while Storage::global().queued() < n {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the jobs never reached the storage thread");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn durable_writes_waiting_together_cost_one_flush() {
        let _serial = exclusive().await;
        let d = temp_db();
        let paused = Storage::global().pause().await;
        let before = d.flushes();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..512u32 {
            let d = d.clone();
            tasks.spawn(async move {
                let db = d.db().clone();
                d.write_durably(move || db.insert(i.to_be_bytes(), vec![1]).map(|_| ()))
                    .await
            });
        }
        wait_queued(512).await;
        paused.resume().await;
        within(async {
            while let Some(r) = tasks.join_next().await {
                r.unwrap().unwrap().unwrap();
            }
        })
        .await;
        assert_eq!(d.db().len(), 512);
        // Every write was on disk when it was answered; they waited together, so one
        // flush served them all.
        assert_eq!(d.flushes() - before, 1);
    }

    /// A journal that counts its syncs (a fake: the broker's event log is tested with
    /// real files in its own crate).
    struct CountingJournal(AtomicU64);

    impl Journal for CountingJournal {
        fn sync(&self) -> Result<bool, String> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(false)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn journaled_writes_waiting_together_cost_one_journal_sync_before_their_answers() {
        let _serial = exclusive().await;
        let journal = Arc::new(CountingJournal(AtomicU64::new(0)));
        let d = Durable::journaled(
            config().temporary(true).open().unwrap(),
            None,
            Some(journal.clone()),
        );
        let paused = Storage::global().pause().await;
        let mut answers = Vec::new();
        for i in 0..256u32 {
            let (tx, rx) = oneshot::channel();
            let (db, counted) = (d.db().clone(), journal.clone());
            Storage::global()
                .submit_relay_then(
                    d.clone(),
                    move |_| db.insert(i.to_be_bytes(), vec![1]).is_ok(),
                    |wrote| *wrote,
                    move |ran: Ran<bool>| {
                        let (wrote, synced) = ran.unwrap();
                        // Answered after the sync that covers it.
                        let _ = tx.send((wrote, synced.is_ok(), counted.0.load(Ordering::SeqCst)));
                    },
                )
                .await
                .unwrap();
            answers.push(rx);
        }
        paused.resume().await;
        for rx in answers {
            assert_eq!(within(rx).await.unwrap(), (true, true, 1));
        }
        assert_eq!(
            journal.0.load(Ordering::SeqCst),
            1,
            "one sync for the group"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_that_wrote_nothing_costs_no_flush() {
        let _serial = exclusive().await;
        let d = temp_db();
        // Runs a job that says whether it wrote; answers with that and the flushes made
        // by the time it was answered.
        let job = |d: &Durable, wrote: bool| {
            let (tx, rx) = oneshot::channel();
            let counter = d.clone();
            let db = d.db().clone();
            let d = d.clone();
            async move {
                Storage::global()
                    .submit_then(
                        Some(d.clone()),
                        move || wrote && db.insert(b"k", b"v".to_vec()).is_ok(),
                        |w| *w,
                        move |ran: Ran<bool>| {
                            let (w, flushed) = ran.unwrap();
                            let _ = tx.send((w, flushed.is_ok(), counter.flushes()));
                        },
                    )
                    .await
                    .unwrap();
                rx.await.unwrap()
            }
        };
        let before = d.flushes();
        // Refused work: nothing written, nothing flushed.
        assert_eq!(job(&d, false).await, (false, true, before));
        // Work that wrote is flushed before it is answered.
        assert_eq!(job(&d, true).await, (true, true, before + 1));
        assert_eq!(d.db().get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_disk_refuses_durable_writes_unrun_and_they_resume_with_space() {
        let _serial = exclusive().await;
        let tmp = tempfile::tempdir().unwrap();
        let d = temp_db();
        // No filesystem has u64::MAX bytes free: full.
        crate::disk::guard_space(tmp.path(), u64::MAX);
        let db = d.db().clone();
        let r = d
            .write_durably(move || db.insert(b"k", b"v".to_vec()))
            .await;
        let refused = matches!(
            r,
            Err(StorageError::Full(crate::disk::Full {
                reserve: u64::MAX,
                ..
            }))
        );
        // A flush writes nothing new: never refused.
        let flushed = d.flush().await;
        // Space returns.
        crate::disk::guard_space(tmp.path(), 0);
        assert!(refused, "{r:?}");
        assert!(r.unwrap_err().to_string().contains("is full"));
        flushed.unwrap();
        // The refused work never ran.
        assert_eq!(d.db().get(b"k").unwrap(), None);
        let db = d.db().clone();
        d.write_durably(move || db.insert(b"k", b"v".to_vec()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(d.db().get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_job_is_answered_and_the_thread_goes_on() {
        let _serial = exclusive().await;
        let d = temp_db();
        let r = d.write(|| -> () { panic!("boom") }).await;
        assert!(
            matches!(r, Err(StorageError::Panicked(ref t)) if t == "boom"),
            "{r:?}"
        );
        let db = d.db().clone();
        d.write_durably(move || db.insert(b"k", b"v".to_vec()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(d.db().get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn transactions_reads_and_flushes_of_two_databases_at_once_never_wedge() {
        let _serial = exclusive().await;
        // The shape that wedged `relay up`: many writers flushing two databases while
        // transactions run and async tasks read. All of it must finish.
        let (a, b) = (temp_db(), temp_db());
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..2000u32 {
            let (a, b) = (a.clone(), b.clone());
            tasks.spawn(async move {
                match i % 4 {
                    0 => {
                        let tree = a.db().open_tree("t").unwrap();
                        a.write_durably(move || {
                            use sled::Transactional;
                            [&tree]
                                .transaction(|trees| {
                                    trees[0].insert(&i.to_be_bytes(), vec![0])?;
                                    Ok(())
                                })
                                .map_err(|e: sled::transaction::TransactionError| e.to_string())
                        })
                        .await
                        .unwrap()
                        .unwrap();
                    }
                    1 => {
                        let db = b.db().clone();
                        b.write_durably(move || db.insert(i.to_be_bytes(), vec![1]).map(|_| ()))
                            .await
                            .unwrap()
                            .unwrap();
                    }
                    _ => {
                        let db = a.db().clone();
                        read(move || db.open_tree("t").unwrap().get(i.to_be_bytes()))
                            .await
                            .unwrap()
                            .unwrap();
                    }
                }
            });
        }
        within(async {
            while let Some(r) = tasks.join_next().await {
                r.unwrap();
            }
        })
        .await;
        assert_eq!(a.db().open_tree("t").unwrap().len(), 500);
        assert_eq!(b.db().len(), 500);
    }
}
