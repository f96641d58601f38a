//! The disk under the databases: free space kept above a reserve, a watchdog for a
//! storage thread that cannot finish, and databases opened private.
//!
//! # Why refuse before the disk is full
//! sled 0.34 does not survive ENOSPC: a write of its log that fails leaves the I/O
//! buffer it was writing unstable, and every later `flush` waits in `make_stable` for it
//! forever (seen with gdb on a full 40 MB filesystem; sled's own issue #376, "full-disk
//! causes stall", is open with no fix). Nothing after that can be made durable, and
//! space coming back does not help. So the storage thread checks the free space
//! ([`space`], one `statvfs` per group commit) and refuses clients' durable writes while
//! it is under the reserve ([`guard_space`]); Relay's own writes (a turn's reports, so a
//! turn that ends is stored as ended) may go on down to a floor, a [`FLOOR_DIVISOR`]th
//! of the reserve, and are refused below it. sled never sees ENOSPC, everything
//! acknowledged stays durable, and writes resume by themselves as soon as space returns.
//!
//! If sled hangs anyway (the reserve was too small, another process filled the disk
//! between the check and the write, a dying disk), [`stalled`] tells: the broker then
//! exits with an error instead of wedging (a supervisor restarts it; the lock dies with
//! the process).

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Free bytes kept on the data dir's filesystem unless `relay up --disk-reserve-mb`
/// says otherwise: room for the group commit in flight past the check and for sled's
/// own segment rewrites.
pub const DEFAULT_RESERVE: u64 = 16 << 20;

struct Guard {
    dir: PathBuf,
    reserve: u64,
}

static GUARD: Mutex<Option<Guard>> = Mutex::new(None);

/// From now on, durable writes are refused ([`Full`]) while the
/// filesystem holding `dir` has less than `reserve` bytes free for us.
pub fn guard_space(dir: &Path, reserve: u64) {
    *GUARD.lock().unwrap_or_else(|e| e.into_inner()) = Some(Guard {
        dir: dir.to_path_buf(),
        reserve,
    });
}

/// The free space of the guarded filesystem, as `relay status` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Space {
    pub dir: PathBuf,
    /// Bytes an unprivileged writer may still use.
    pub free: u64,
    pub reserve: u64,
}

impl Space {
    /// Under the reserve: clients' writes are refused.
    pub fn full(&self) -> bool {
        self.free < self.reserve
    }

    /// How far Relay's own writes may go into the reserve (see [`Room`]).
    pub fn floor(&self) -> u64 {
        self.reserve / FLOOR_DIVISOR
    }

    /// Why a write with `room` is refused now (`None`: it may go ahead).
    pub(crate) fn refusal(&self, room: Room) -> Option<Full> {
        self.refusal_of(room, 0)
    }

    /// Why writing `len` more bytes with `room` is refused (`None`: they fit): a file
    /// written outside the storage thread's guard (a long text, a long report), whose
    /// bytes are not in `free` yet.
    pub fn refusal_of(&self, room: Room, len: u64) -> Option<Full> {
        let kept = match room {
            Room::AboveReserve => self.reserve,
            Room::DownToFloor => self.floor(),
        };
        (self.free < kept.saturating_add(len)).then(|| Full {
            dir: self.dir.display().to_string(),
            free: self.free,
            reserve: kept,
        })
    }
}

/// Relay's own writes may use the reserve down to `reserve / FLOOR_DIVISOR`.
pub const FLOOR_DIVISOR: u64 = 4;

/// Where a durable write may stop. Clients' commands stop at the reserve. Relay's own
/// reports (a turn's output, its end, a flight's state) may go on into the reserve down
/// to its floor: refusing them would leave a flight `running` that has ended, and what
/// they add is bounded (one turn's output by `--max-flight-output`; a turn ends once).
/// The floor still leaves sled room for the group commit in flight and its rewrites.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    AboveReserve,
    DownToFloor,
}

/// The guarded filesystem's space now (`None`: no guard, or `statvfs` failed). Blocking:
/// one `statvfs`.
pub fn space() -> Option<Space> {
    let (dir, reserve) = {
        let guard = GUARD.lock().unwrap_or_else(|e| e.into_inner());
        let g = guard.as_ref()?;
        (g.dir.clone(), g.reserve)
    };
    match rustix::fs::statvfs(&dir) {
        // `f_bavail`: what is left for a process without root's reserved blocks.
        Ok(s) => Some(Space {
            free: s.f_bavail.saturating_mul(s.f_frsize),
            dir,
            reserve,
        }),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot read the free space");
            None
        }
    }
}

/// Why a durable write was refused: the disk is under its reserve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the disk holding {dir} is full ({free} bytes free, {reserve} kept in reserve): writes are refused until space is freed")]
pub struct Full {
    pub dir: String,
    pub free: u64,
    pub reserve: u64,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// When the storage thread's current group began (ms since [`epoch`], plus one); 0 while
/// it waits for work.
static BUSY_SINCE: AtomicU64 = AtomicU64::new(0);

pub(crate) fn busy() {
    let ms = epoch().elapsed().as_millis() as u64;
    BUSY_SINCE.store(ms + 1, Ordering::Release);
}

pub(crate) fn idle() {
    BUSY_SINCE.store(0, Ordering::Release);
}

/// How long the storage thread has been on its current group of jobs (`None`: idle).
pub fn busy_for() -> Option<Duration> {
    match BUSY_SINCE.load(Ordering::Acquire) {
        0 => None,
        since => {
            let now = epoch().elapsed().as_millis() as u64;
            Some(Duration::from_millis((now + 1).saturating_sub(since)))
        }
    }
}

/// Resolves once the storage thread has spent more than `bound` on one group of jobs
/// (a transaction and a flush take milliseconds; sled stuck in `make_stable` never
/// returns), with how long it has.
pub async fn stalled(bound: Duration) -> Duration {
    let every = (bound / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    loop {
        if let Some(d) = busy_for().filter(|d| *d > bound) {
            return d;
        }
        tokio::time::sleep(every).await;
    }
}

/// TEST ONLY: while the file this variable names exists, the storage thread's flushes
/// block (as sled's do on a full disk), so that tests can show the watchdog ends the
/// process. Never set it outside a test.
pub const TEST_STALL_ENV: &str = "RELAY_TEST_STALL_STORAGE_WHILE";

/// Blocks while the test hook's file exists (see [`TEST_STALL_ENV`]).
pub(crate) fn test_stall_hook() {
    static PATH: OnceLock<Option<PathBuf>> = OnceLock::new();
    let Some(path) = PATH.get_or_init(|| std::env::var_os(TEST_STALL_ENV).map(PathBuf::from))
    else {
        return;
    };
    while path.exists() {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Why [`write_private`] failed: what it was doing, and the system's error.
#[derive(Debug, thiserror::Error)]
#[error("{doing}")]
pub struct WriteError {
    pub doing: String,
    #[source]
    pub source: std::io::Error,
}

fn doing(what: impl FnOnce() -> String) -> impl FnOnce(std::io::Error) -> WriteError {
    move |source| WriteError {
        doing: what(),
        source,
    }
}

/// [`write_private`] of file `name` in directory `dir`, made first (mode 0700, its
/// parent fsynced: its name is on disk before the file is) if it is not there; a `dir`
/// that is a symlink is refused, never followed. (Blocking.)
pub fn write_private_in(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), WriteError> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {
            let parent = dir.parent().unwrap_or(Path::new("."));
            std::fs::File::open(parent)
                .and_then(|d| d.sync_all())
                .map_err(doing(|| {
                    format!("cannot sync directory {}", parent.display())
                }))?;
        }
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(doing(|| format!("cannot create {}", dir.display()))(e))
        }
        Err(_) => {}
    }
    let meta = std::fs::symlink_metadata(dir)
        .map_err(doing(|| format!("cannot stat {}", dir.display())))?;
    if meta.is_symlink() {
        return Err(doing(|| {
            format!("{} is a symlink: refusing to follow it", dir.display())
        })(std::io::Error::other("a symlink")));
    }
    write_private(dir, &dir.join(name), bytes)
}

/// Writes `bytes` to `path` (in directory `dir`) whole, mode 0600, atomically and
/// durably: a fresh temporary file beside it, of a random name, created with `O_EXCL |
/// O_NOFOLLOW` (a planted file or symlink is never followed nor reused), written and
/// fsynced, renamed over `path`, and the directory fsynced: after a crash the file is
/// the old one or the new one, whole. (Blocking.)
pub fn write_private(dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(path.file_name().unwrap_or_default());
    prefix.push(".");
    let mut tmp = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".tmp")
        .make_in(dir, |p| {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
                .open(p)
        })
        .map_err(doing(|| {
            format!("cannot create a temporary file in {}", dir.display())
        }))?;
    tmp.write_all(bytes)
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(doing(|| format!("cannot write {}", tmp.path().display())))?;
    tmp.persist(path).map_err(|e| e.error).map_err(doing(|| {
        format!("cannot rename a temporary file over {}", path.display())
    }))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(doing(|| format!("cannot sync directory {}", dir.display())))
}

/// Opens the database at `path` private: its directory is created 0700, a symlink there
/// is refused (it would put the database where its owner points), and every file and
/// directory sled made is 0600/0700, whatever the umask.
pub fn open_private(config: sled::Config, path: &Path) -> sled::Result<sled::Db> {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(symlink_error(path));
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)?;
    let key = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let ours_before = OPENED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&key);
    let deadline = Instant::now() + REOPEN_WAIT;
    let config = config.path(path);
    let db = loop {
        // sled creates its files with the process's umask. The window is the open only:
        // at start, before any agent process is spawned to inherit it.
        let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
        let db = config.open();
        rustix::process::umask(old);
        match db {
            Err(e) if ours_before && is_lock_error(&e) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => break other?,
        }
    };
    OPENED.lock().unwrap_or_else(|e| e.into_inner()).insert(key);
    make_private(path)?;
    Ok(db)
}

/// The database at `to` is one this process opened elsewhere and moved there (the
/// migration's `store.migrating` renamed `store`): a reopen waits for its lock as for
/// one opened at `to` ([`OPENED`]).
pub fn moved_here(to: &Path) {
    let key = to.canonicalize().unwrap_or_else(|_| to.to_path_buf());
    OPENED.lock().unwrap_or_else(|e| e.into_inner()).insert(key);
}

/// The databases this process has opened. sled 0.34 releases its file lock after
/// `Db`'s drop returns, once its own threads let go (sled's issues #1234 and #1289):
/// reopening a database this process just closed can find it still locked, by
/// ourselves. Such a reopen waits up to [`REOPEN_WAIT`]; a lock held by another
/// process on a database this one never opened is refused at once.
static OPENED: Mutex<std::collections::BTreeSet<PathBuf>> =
    Mutex::new(std::collections::BTreeSet::new());

/// How long reopening a database this process closed waits for sled to release it.
const REOPEN_WAIT: Duration = Duration::from_secs(5);

/// Whether sled refused to open because the database is locked.
pub fn is_lock_error(e: &sled::Error) -> bool {
    match e {
        sled::Error::Io(io) => {
            io.kind() == std::io::ErrorKind::WouldBlock || io.to_string().contains("lock")
        }
        _ => false,
    }
}

fn symlink_error(path: &Path) -> sled::Error {
    sled::Error::Io(std::io::Error::other(format!(
        "{} is a symlink: refusing to follow it (a database must be a directory of its own)",
        path.display()
    )))
}

/// Keeps the files sled makes after the open private: a value over ~128 KiB becomes a
/// file of its own under `blobs/`, made with the process's umask. The database's
/// directory is 0700 already, so this is a second wall, not the first: after a flush, if
/// `blobs/` changed (one `stat`; only a value that large changes it), its files are made
/// 0600.
#[derive(Debug)]
pub struct Sweeper {
    dir: PathBuf,
    last: Mutex<Option<std::time::SystemTime>>,
}

impl Sweeper {
    pub fn new(dir: &Path) -> Sweeper {
        Sweeper {
            dir: dir.to_path_buf(),
            last: Mutex::new(None),
        }
    }

    /// After a flush, on the storage thread.
    pub fn after_flush(&self) {
        let blobs = self.dir.join("blobs");
        let Ok(modified) = std::fs::metadata(&blobs).and_then(|m| m.modified()) else {
            return;
        };
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if *last == Some(modified) {
            return;
        }
        *last = Some(modified);
        if let Err(e) = make_private(&blobs) {
            tracing::warn!(dir = %blobs.display(), error = %e, "cannot make sled's blobs private");
        }
    }
}

/// Makes `dir` and what is under it 0700 (directories) and 0600 (files), refusing
/// symlinks. Also run after sled's later files (snapshots, blobs) may have appeared.
pub fn make_private(dir: &Path) -> sled::Result<()> {
    let meta = std::fs::symlink_metadata(dir)?;
    if meta.file_type().is_symlink() {
        return Err(symlink_error(dir));
    }
    let mode = if meta.is_dir() { 0o700 } else { 0o600 };
    if meta.mode() & 0o777 != mode {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))?;
    }
    if meta.is_dir() {
        for entry in std::fs::read_dir(dir)? {
            make_private(&entry?.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o777
    }

    #[test]
    fn a_database_is_opened_private_whatever_the_umask() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("db");
        // A permissive umask, as a user's shell may have.
        let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o002));
        let db = open_private(crate::storage::config(), &path);
        rustix::process::umask(old);
        let db = db.unwrap();
        db.insert(b"k", b"v").unwrap();
        db.flush().unwrap();
        let mut seen = 0;
        let mut dirs = vec![path.clone()];
        while let Some(dir) = dirs.pop() {
            assert_eq!(mode(&dir), 0o700, "{}", dir.display());
            for e in std::fs::read_dir(&dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    dirs.push(p);
                } else {
                    assert_eq!(mode(&p), 0o600, "{}", p.display());
                    seen += 1;
                }
            }
        }
        // sled's `db` and `conf` at least.
        assert!(seen >= 2, "{seen}");
    }

    #[test]
    fn a_planted_symlink_is_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let path = tmp.path().join("db");
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        let e = open_private(crate::storage::config(), &path).unwrap_err();
        assert!(e.to_string().contains("symlink"), "{e}");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        // Nor one inside the database's directory.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        std::os::unix::fs::symlink(&elsewhere, path.join("blobs")).unwrap();
        let e = open_private(crate::storage::config(), &path).unwrap_err();
        assert!(e.to_string().contains("symlink"), "{e}");
    }

    #[test]
    fn a_database_this_process_closed_reopens_at_once_again_and_again() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("db");
        for i in 0u32..40 {
            let db = open_private(crate::storage::config(), &path)
                .unwrap_or_else(|e| panic!("reopen {i}: {e}"));
            db.insert(i.to_be_bytes(), b"v").unwrap();
            db.flush().unwrap();
            assert_eq!(db.len(), i as usize + 1);
        }
    }

    #[test]
    fn a_database_another_process_holds_is_refused_at_once() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("db");
        drop(open_private(crate::storage::config(), &tmp.path().join("other")).unwrap());
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("db"), b"").unwrap();
        // `flock` (util-linux) takes the lock sled takes, then becomes the shell that says
        // it holds it.
        let mut holder = std::process::Command::new("flock")
            .arg("--no-fork")
            .arg(path.join("db"))
            .args(["sh", "-c", "echo held; exec sleep 60"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(holder.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line, "held\n");
        let opened = open_private(crate::storage::config(), &path);
        holder.kill().unwrap();
        holder.wait().unwrap();
        let e = opened.unwrap_err();
        assert!(is_lock_error(&e), "{e}");
        // This process never opened it: no wait for a release that is not ours.
        assert!(!OPENED
            .lock()
            .unwrap()
            .contains(&path.canonicalize().unwrap()));
    }
}
