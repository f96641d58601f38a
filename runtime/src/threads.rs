//! Each agent's harness thread/session id, in the runtime's own sled database, so a
//! session resumes the same thread after any restart; and how far each dispatched
//! invocation got (started; ended, with the report of its end until that is safely
//! sent), so that a restart neither runs a turn twice nor calls a finished one cut.
//!
//! Writes go through the process's storage thread ([`relay_infra::storage`]): the durable
//! ones (a new thread id, a dispatch started or done) are group-committed with every
//! other write waiting at the same moment, so N workers recording at once cost one
//! flush. Reads run on the blocking pool. Nothing here blocks an async worker.
//!
//! Also the registry of the git worktrees this runtime made ([`WorktreeRecord`]).
//!
//! An ended dispatch's report of [`files::FILE_MIN`] bytes or more (a long answer) is
//! kept in a file beside the records, written on the blocking pool, not in the record
//! ([`files`]).

mod files;

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{RuntimeError, TextSink};
use relay_infra::storage::{self, Durable};
use relay_protocol::runtime::Report;

const VERSION: u8 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadRecord {
    pub harness: String,
    pub thread_id: String,
    pub updated_at: u64,
}

/// A stored thread record: `None` for one of another version (the session starts a new
/// thread), an error for one that does not decode.
pub fn decode_record(v: &[u8]) -> Result<Option<ThreadRecord>, RuntimeError> {
    match v.split_first() {
        Some((&VERSION, json)) => Ok(Some(serde_json::from_slice(json)?)),
        _ => Ok(None),
    }
}

/// A thread record as stored: the version byte, then its JSON.
pub fn encode_record(record: &ThreadRecord) -> Result<Vec<u8>, RuntimeError> {
    let mut v = vec![VERSION];
    serde_json::to_writer(&mut v, record)?;
    Ok(v)
}

#[derive(Clone)]
pub struct ThreadStore {
    db: Durable,
    tree: sled::Tree,
    dispatches: sled::Tree,
    worktrees: sled::Tree,
    /// The reports of a turn's commit (its flight's, and each flight it carried), kept
    /// until the turn's end is with the broker: see [`ThreadStore::put_commit_reports`].
    commits: sled::Tree,
    /// Where long end reports are kept ([`files`]; `None`: a temporary database, which
    /// keeps them in its records).
    files: Option<std::path::PathBuf>,
    /// Where the runtime's long answers are written first (the broker's): an end whose
    /// answer is there refers to it ([`files::WithText`]).
    texts: Option<TextSink>,
}

/// A worktree this runtime made (the registry: `relay doctor` finds the orphans in it),
/// keyed by its path. Written before `git worktree add`, so a crash leaves an entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorktreeRecord {
    /// The repository's top directory.
    pub repo: String,
    pub agent: String,
    pub branch: String,
    /// The base as given or found (`main`, `HEAD@1a2b3c4d5e6f`), and its commit.
    pub base: String,
    pub base_commit: String,
    /// Files copied in when it was made (`--copy`): never committed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copied: Vec<String>,
    /// Times it was made again from its branch.
    #[serde(default)]
    pub recreated: u32,
    pub created_at: u64,
}

/// How far a dispatched invocation got on this runtime (for exactly-once over NATS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DispatchState {
    /// Its turn started: a redelivery must not run it again.
    Started,
    /// Its flight ended.
    Done,
    /// Its flight ended here before its turn started (its session could not start, it
    /// was interrupted while queued...): it is never run. The record keeps the report of
    /// that end until it is sent ([`ThreadStore::set_dispatch_ended`]).
    Ended,
}

/// The tags of a dispatch record (its first byte).
const STARTED: u8 = 1;
const DONE: u8 = 2;
const ENDED: u8 = 3;
/// As [`ENDED`], its report in a file ([`files::InFile`]).
const ENDED_IN_FILE: u8 = 4;
/// As [`ENDED`], its answer in the broker's text files ([`files::WithText`]).
const ENDED_WITH_TEXT: u8 = 5;

/// A turn's end whose texts (reason and answer) are shorter than this is encoded on the
/// async worker that records it: its JSON is far under [`files::FILE_MIN`], so it is
/// never written to a file, and takes microseconds to encode.
const ENCODE_INLINE_MAX: usize = 16 * 1024;

/// The bytes of text a report carries that its encoding grows with: a flight's end's
/// reason and answer (every other report counts as long: it is not a turn's end).
fn ended_text_len(report: &Report) -> usize {
    match report {
        Report::Flight {
            change: relay_protocol::domain::FlightChange::State { reason, output, .. },
            ..
        } => reason.as_deref().map_or(0, str::len) + output.as_ref().map_or(0, |o| o.len()),
        _ => usize::MAX,
    }
}

impl ThreadStore {
    /// A database of its own at `path` (a `relay node`).
    pub fn open(path: &Path) -> Result<ThreadStore, sled::Error> {
        // Private (0700/0600 whatever the umask), never through a planted symlink.
        let db = relay_infra::disk::open_private(storage::config(), path)?;
        let tree = db.open_tree("threads")?;
        let dispatches = db.open_tree("dispatches")?;
        let worktrees = db.open_tree("worktrees")?;
        let commits = db.open_tree("commits")?;
        let files = files::dir_of(path);
        sweep_files(&dispatches, &files)?;
        Ok(ThreadStore {
            db: Durable::private(db, path),
            tree,
            dispatches,
            worktrees,
            commits,
            files: Some(files),
            texts: None,
        })
    }

    /// Trees inside another database (the broker's, for its embedded runtime), so that
    /// one flush makes both durable. Records left in a database of its own at `legacy`
    /// by an earlier version are moved in first (that directory is then renamed
    /// `<legacy>.migrated-<ms>`; a record the shared trees have already wins). Blocking:
    /// call it off the async workers.
    pub fn within(durable: &Durable, legacy: Option<&Path>) -> Result<ThreadStore, sled::Error> {
        let db = durable.db();
        let tree = db.open_tree("runtime.threads")?;
        let dispatches = db.open_tree("runtime.dispatches")?;
        let worktrees = db.open_tree("runtime.worktrees")?;
        let commits = db.open_tree("runtime.commits")?;
        if let Some(legacy) = legacy.filter(|p| p.join("conf").exists()) {
            let old = storage::config().path(legacy).open()?;
            for (name, into) in [("threads", &tree), ("dispatches", &dispatches)] {
                for kv in old.open_tree(name)?.iter() {
                    let (k, v) = kv?;
                    if !into.contains_key(&k)? {
                        into.insert(k, v)?;
                    }
                }
            }
            db.flush()?;
            drop(old);
            // A unique name: an older build may have made `<legacy>` again after an
            // earlier move.
            let mut moved = legacy.as_os_str().to_owned();
            moved.push(format!(".migrated-{}", relay_protocol::clock::now_ms()));
            std::fs::rename(legacy, &moved)?;
            tracing::info!(from = %legacy.display(), "moved the runtime's records into the broker's database");
        }
        let files = durable.dir().map(files::dir_of);
        if let Some(files) = &files {
            sweep_files(&dispatches, files)?;
        }
        Ok(ThreadStore {
            db: durable.clone(),
            tree,
            dispatches,
            worktrees,
            commits,
            files,
            texts: None,
        })
    }

    /// The same store, its ends' long answers read from `texts` where they were written
    /// first ([`files::WithText`]).
    pub fn with_texts(mut self, texts: Option<TextSink>) -> ThreadStore {
        self.texts = texts;
        self
    }

    /// Flushes of this database so far.
    pub fn flushes(&self) -> u64 {
        self.db.flushes()
    }

    pub async fn get(&self, agent: &str) -> Result<Option<ThreadRecord>, RuntimeError> {
        let (tree, agent) = (self.tree.clone(), agent.to_string());
        let v = storage::read(move || tree.get(agent.as_bytes())).await??;
        match v {
            Some(v) => decode_record(&v),
            None => Ok(None),
        }
    }

    /// Records the thread and waits until it is on disk.
    pub async fn put(&self, agent: &str, record: &ThreadRecord) -> Result<(), RuntimeError> {
        let v = encode_record(record)?;
        let (tree, agent) = (self.tree.clone(), agent.to_string());
        self.db
            .write_durably(move || tree.insert(agent.as_bytes(), v))
            .await??;
        Ok(())
    }

    pub async fn dispatch_state(
        &self,
        invocation: &str,
    ) -> Result<Option<DispatchState>, RuntimeError> {
        let (tree, invocation) = (self.dispatches.clone(), invocation.to_string());
        let v = storage::read(move || tree.get(invocation.as_bytes())).await??;
        Ok(match v.as_deref() {
            Some([STARTED, ..]) => Some(DispatchState::Started),
            Some([DONE, ..]) => Some(DispatchState::Done),
            Some([ENDED | ENDED_IN_FILE | ENDED_WITH_TEXT, ..]) => Some(DispatchState::Ended),
            _ => None,
        })
    }

    /// Records how far an invocation got, and waits until it is on disk. (For
    /// [`DispatchState::Ended`], [`ThreadStore::set_dispatch_ended`] keeps the report.)
    pub async fn set_dispatch_state(
        &self,
        invocation: &str,
        state: DispatchState,
        flight: &str,
    ) -> Result<(), RuntimeError> {
        let tag = match state {
            DispatchState::Started => STARTED,
            DispatchState::Done => DONE,
            DispatchState::Ended => ENDED,
        };
        let mut v = vec![tag];
        v.extend_from_slice(flight.as_bytes());
        self.put_dispatch(invocation, v).await
    }

    /// Records that an invocation's flight ended before its turn started, with the
    /// report of that end, and waits until it is on disk: a redelivery of its dispatch is
    /// then never run, and a restart before the report was sent sends it
    /// ([`ThreadStore::ended_unsent`]) instead of calling the flight interrupted.
    pub async fn set_dispatch_ended(
        &self,
        invocation: &str,
        report: &Report,
    ) -> Result<(), RuntimeError> {
        let to_file = match (&self.files, files::name_of(invocation), report) {
            (Some(dir), Some(file), Report::Flight { flight, .. }) => {
                Some((dir.clone(), file, flight.clone()))
            }
            _ => None,
        };
        // Encoded, and a long one written to a file ([`files`]), on the blocking pool: a
        // long answer's JSON is megabytes, too long for an async worker (and the storage
        // thread). The clone shares the answer's text. An answer written to the broker's
        // text files first is referred to: no second copy of it on disk. A short one
        // (most) is encoded here: it never goes to a file, and a job on the blocking pool
        // per flight was 6 % of the async workers' time at 64 flights in flight.
        let inline = ended_text_len(report) < ENCODE_INLINE_MAX;
        let (report, texts) = (report.clone(), self.texts.clone());
        let encode = move || -> Result<Vec<u8>, RuntimeError> {
            if let Some(with) = texts.and_then(|t| files::WithText::of(&t, &report)) {
                let mut v = vec![ENDED_WITH_TEXT];
                serde_json::to_writer(&mut v, &with)?;
                return Ok(v);
            }
            let mut v = vec![ENDED];
            serde_json::to_writer(&mut v, &report)?;
            match to_file {
                Some((dir, file, flight)) if v.len() >= files::FILE_MIN => {
                    files::write(&dir, &file, &v[1..])?;
                    let mut v = vec![ENDED_IN_FILE];
                    serde_json::to_writer(&mut v, &files::InFile { flight, file })?;
                    Ok(v)
                }
                _ => Ok(v),
            }
        };
        let v = if inline {
            encode()?
        } else {
            tokio::task::spawn_blocking(encode)
                .await
                .map_err(|_| RuntimeError::ShuttingDown)??
        };
        self.put_dispatch(invocation, v).await
    }

    async fn put_dispatch(&self, invocation: &str, v: Vec<u8>) -> Result<(), RuntimeError> {
        let (tree, key) = (self.dispatches.clone(), invocation.to_string());
        let keeps = files::in_file(&v).map(|f| f.file);
        let old = self
            .db
            .write_durably(move || tree.insert(key.as_bytes(), v))
            .await??;
        // A report file the record no longer names goes (after the record is on disk).
        let replaced = old.as_deref().and_then(files::in_file).map(|f| f.file);
        if let Some(old) = replaced.filter(|old| Some(old) != keeps.as_ref()) {
            self.remove_files(vec![old]).await;
        }
        Ok(())
    }

    /// Removes report files on the blocking pool.
    async fn remove_files(&self, names: Vec<String>) {
        if let (Some(dir), false) = (self.files.clone(), names.is_empty()) {
            let _ = tokio::task::spawn_blocking(move || files::remove(&dir, &names)).await;
        }
    }

    /// Invocations whose flight ended before its turn started and whose report may not
    /// have been sent: (invocation, that report). A record that cannot be read is
    /// skipped (with a warning): it still keeps its dispatch from running.
    pub async fn ended_unsent(&self) -> Result<Vec<(String, Report)>, RuntimeError> {
        let (tree, dir) = (self.dispatches.clone(), self.files.clone());
        let texts = self.texts.clone();
        storage::read(move || {
            let mut out = Vec::new();
            for kv in tree.iter() {
                let (k, v) = kv?;
                let invocation = String::from_utf8_lossy(&k).into_owned();
                let Some(report) = files::ended_report(&v, dir.as_deref(), texts.as_ref()) else {
                    continue;
                };
                match report {
                    Ok(report) => out.push((invocation, report)),
                    Err(e) => {
                        tracing::warn!(%invocation, error = %e, "unreadable dispatch record")
                    }
                }
            }
            Ok::<_, sled::Error>(out)
        })
        .await?
        .map_err(RuntimeError::from)
    }

    /// Every dispatch record: (invocation, flight, how far it got). Unreadable ones are
    /// left out.
    pub async fn dispatches(&self) -> Result<Vec<(String, String, DispatchState)>, RuntimeError> {
        let tree = self.dispatches.clone();
        storage::read(move || {
            let mut out = Vec::new();
            for kv in tree.iter() {
                let (k, v) = kv?;
                let (state, flight) = match v.first() {
                    Some(&STARTED) => (DispatchState::Started, flight_of(&v[1..])),
                    Some(&DONE) => (DispatchState::Done, flight_of(&v[1..])),
                    Some(&(ENDED | ENDED_IN_FILE | ENDED_WITH_TEXT)) => {
                        match files::ended_flight(&v) {
                            Some(flight) => (DispatchState::Ended, flight),
                            None => continue,
                        }
                    }
                    _ => continue,
                };
                out.push((String::from_utf8_lossy(&k).into_owned(), flight, state));
            }
            Ok::<_, sled::Error>(out)
        })
        .await?
        .map_err(RuntimeError::from)
    }

    /// Invocations whose turn started but whose flight has not ended: (invocation, flight).
    pub async fn unfinished_dispatches(&self) -> Result<Vec<(String, String)>, RuntimeError> {
        let tree = self.dispatches.clone();
        storage::read(move || {
            let mut out = Vec::new();
            for kv in tree.iter() {
                let (k, v) = kv?;
                if v.first() == Some(&STARTED) {
                    out.push((String::from_utf8_lossy(&k).into_owned(), flight_of(&v[1..])));
                }
            }
            Ok::<_, sled::Error>(out)
        })
        .await?
        .map_err(RuntimeError::from)
    }

    /// Drops an invocation's record. Not flushed (losing it in a crash only keeps a
    /// record that is harmless once its flight has ended), so it needs neither the
    /// storage thread nor its next flush: a plain write on the blocking pool.
    pub async fn forget_dispatch(&self, invocation: &str) -> Result<(), RuntimeError> {
        let (tree, invocation) = (self.dispatches.clone(), invocation.to_string());
        let old = storage::read(move || tree.remove(invocation.as_bytes())).await??;
        let file = old.as_deref().and_then(files::in_file).map(|f| f.file);
        self.remove_files(file.into_iter().collect()).await;
        Ok(())
    }

    /// Drops the records of `flight`'s dispatches (its end is with the broker). Not
    /// flushed, as [`ThreadStore::forget_dispatch`].
    pub async fn forget_flight(&self, flight: &str) -> Result<(), RuntimeError> {
        self.forget_flights(vec![flight.to_string()]).await
    }

    /// [`ThreadStore::forget_flight`] of many flights in one job on the blocking pool:
    /// one pass over the dispatch records (the flights that ended at once, forgotten
    /// together, cost one scan, not one each).
    pub async fn forget_flights(&self, flights: Vec<String>) -> Result<(), RuntimeError> {
        if flights.is_empty() {
            return Ok(());
        }
        let (dispatches, commits) = (self.dispatches.clone(), self.commits.clone());
        let files = storage::read(move || {
            let ended: std::collections::HashSet<&[u8]> =
                flights.iter().map(|f| f.as_bytes()).collect();
            let mut gone = Vec::new();
            for kv in dispatches.iter() {
                let (k, v) = kv?;
                let of_ended = match v.split_first() {
                    Some((&(STARTED | DONE), flight)) => ended.contains(flight),
                    Some((&(ENDED | ENDED_IN_FILE | ENDED_WITH_TEXT), _)) => {
                        files::ended_flight(&v).is_some_and(|f| ended.contains(f.as_bytes()))
                    }
                    _ => false,
                };
                if of_ended {
                    gone.push(k);
                }
            }
            let mut files = Vec::new();
            for k in gone {
                let old = dispatches.remove(k)?;
                files.extend(old.as_deref().and_then(files::in_file).map(|f| f.file));
            }
            for flight in &flights {
                commits.remove(flight.as_bytes())?;
            }
            Ok::<_, sled::Error>(files)
        })
        .await??;
        self.remove_files(files).await;
        Ok(())
    }

    /// Keeps the reports of the commit made as `flight`'s turn ended (or of an earlier
    /// turn's, committed late), and waits until they are on disk, before they are sent:
    /// they wait in memory like every report, and a crash before the broker recorded
    /// them would leave a commit on the branch that its flight does not name. Dropped
    /// with `flight`'s dispatch record once its end is with the broker
    /// ([`ThreadStore::forget_flight`]); what is left at a start is sent again
    /// ([`ThreadStore::commit_reports_unsent`]: the broker takes the same commit once).
    pub async fn put_commit_reports(
        &self,
        flight: &str,
        reports: &[Report],
    ) -> Result<(), RuntimeError> {
        let v = serde_json::to_vec(reports)?;
        let (tree, flight) = (self.commits.clone(), flight.to_string());
        self.db
            .write_durably(move || tree.insert(flight.as_bytes(), v))
            .await??;
        Ok(())
    }

    /// The commit reports kept ([`ThreadStore::put_commit_reports`]): (flight, reports).
    /// An unreadable record is skipped, with a warning.
    pub async fn commit_reports_unsent(&self) -> Result<Vec<(String, Vec<Report>)>, RuntimeError> {
        let tree = self.commits.clone();
        storage::read(move || {
            let mut out = Vec::new();
            for kv in tree.iter() {
                let (k, v) = kv?;
                let flight = String::from_utf8_lossy(&k).into_owned();
                match serde_json::from_slice::<Vec<Report>>(&v) {
                    Ok(reports) => out.push((flight, reports)),
                    Err(e) => tracing::warn!(%flight, error = %e, "unreadable commit record"),
                }
            }
            Ok::<_, sled::Error>(out)
        })
        .await?
        .map_err(RuntimeError::from)
    }

    /// Drops the commit reports kept for `flight`. Not flushed, as
    /// [`ThreadStore::forget_dispatch`] (a record kept by a crash is only sent again).
    pub async fn forget_commit_reports(&self, flight: &str) -> Result<(), RuntimeError> {
        let (tree, flight) = (self.commits.clone(), flight.to_string());
        storage::read(move || tree.remove(flight.as_bytes())).await??;
        Ok(())
    }

    /// [`ThreadStore::forget_commit_reports`], on disk before it returns: for the records
    /// a start sent again, so that the next start (after a crash, before sled's next
    /// flush) does not send them once more.
    pub async fn forget_commit_reports_durably(&self, flight: &str) -> Result<(), RuntimeError> {
        self.remove_durably(&self.commits, flight).await
    }

    /// Drops an agent's thread, durably (a new agent of the same name starts afresh).
    pub async fn forget(&self, agent: &str) -> Result<(), RuntimeError> {
        self.remove_durably(&self.tree, agent).await
    }

    /// Removes `key` from `tree` (one of this store's), on disk before it returns.
    async fn remove_durably(&self, tree: &sled::Tree, key: &str) -> Result<(), RuntimeError> {
        let (tree, key) = (tree.clone(), key.to_string());
        self.db
            .write_durably(move || tree.remove(key.as_bytes()))
            .await??;
        Ok(())
    }
}

impl ThreadStore {
    /// Records a worktree (made, or about to be), and waits until it is on disk.
    pub async fn put_worktree(
        &self,
        path: &str,
        record: &WorktreeRecord,
    ) -> Result<(), RuntimeError> {
        let v = serde_json::to_vec(record)?;
        let (tree, path) = (self.worktrees.clone(), path.to_string());
        self.db
            .write_durably(move || tree.insert(path.as_bytes(), v))
            .await??;
        Ok(())
    }

    /// Every worktree recorded: (path, record). Unreadable ones are left out (with a
    /// warning).
    pub async fn worktrees(&self) -> Result<Vec<(String, WorktreeRecord)>, RuntimeError> {
        let tree = self.worktrees.clone();
        storage::read(move || {
            let mut out = Vec::new();
            for kv in tree.iter() {
                let (k, v) = kv?;
                let path = String::from_utf8_lossy(&k).into_owned();
                match serde_json::from_slice(&v) {
                    Ok(record) => out.push((path, record)),
                    Err(e) => tracing::warn!(%path, error = %e, "unreadable worktree record"),
                }
            }
            Ok::<_, sled::Error>(out)
        })
        .await?
        .map_err(RuntimeError::from)
    }

    /// Drops a worktree's record, durably.
    pub async fn forget_worktree(&self, path: &str) -> Result<(), RuntimeError> {
        self.remove_durably(&self.worktrees, path).await
    }
}

fn flight_of(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// At open: removes the report files in `dir` that no record of `dispatches` names
/// (blocking).
fn sweep_files(dispatches: &sled::Tree, dir: &Path) -> Result<(), sled::Error> {
    if !dir.exists() {
        return Ok(());
    }
    let mut keep = std::collections::HashSet::new();
    for kv in dispatches.iter() {
        let (_, v) = kv?;
        keep.extend(files::in_file(&v).map(|f| f.file));
    }
    files::sweep(dir, &keep);
    Ok(())
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod text_tests;
