//! Each agent's harness thread/session id, in the runtime's own sled database, so a
//! session resumes the same thread after any restart; and how far each dispatched
//! invocation got (for exactly-once over NATS).
//!
//! Writes go through the process's storage thread ([`relay_infra::storage`]): the durable
//! ones (a new thread id, a dispatch started or done) are group-committed with every
//! other write waiting at the same moment, so N workers recording at once cost one
//! flush. Reads run on the blocking pool. Nothing here blocks an async worker.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::RuntimeError;
use relay_infra::storage::{self, Durable};

const VERSION: u8 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadRecord {
    pub harness: String,
    pub thread_id: String,
    pub updated_at: u64,
}

#[derive(Clone)]
pub struct ThreadStore {
    db: Durable,
    tree: sled::Tree,
    dispatches: sled::Tree,
}

/// How far a dispatched invocation got on this runtime (for exactly-once over NATS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DispatchState {
    /// Its turn started: a redelivery must not run it again.
    Started,
    /// Its flight ended.
    Done,
}

impl ThreadStore {
    /// A database of its own at `path` (a `relay node`).
    pub fn open(path: &Path) -> Result<ThreadStore, sled::Error> {
        // Private (0700/0600 whatever the umask), never through a planted symlink.
        let db = relay_infra::disk::open_private(storage::config(), path)?;
        let tree = db.open_tree("threads")?;
        let dispatches = db.open_tree("dispatches")?;
        Ok(ThreadStore {
            db: Durable::private(db, path),
            tree,
            dispatches,
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
        Ok(ThreadStore {
            db: durable.clone(),
            tree,
            dispatches,
        })
    }

    /// Flushes of this database so far.
    pub fn flushes(&self) -> u64 {
        self.db.flushes()
    }

    pub async fn get(&self, agent: &str) -> Result<Option<ThreadRecord>, RuntimeError> {
        let (tree, agent) = (self.tree.clone(), agent.to_string());
        let v = storage::read(move || tree.get(agent.as_bytes())).await??;
        match v {
            Some(v) if v.first() == Some(&VERSION) => Ok(Some(serde_json::from_slice(&v[1..])?)),
            Some(_) => Ok(None),
            None => Ok(None),
        }
    }

    /// Records the thread and waits until it is on disk.
    pub async fn put(&self, agent: &str, record: &ThreadRecord) -> Result<(), RuntimeError> {
        let mut v = vec![VERSION];
        serde_json::to_writer(&mut v, record)?;
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
            Some([1, ..]) => Some(DispatchState::Started),
            Some([2, ..]) => Some(DispatchState::Done),
            _ => None,
        })
    }

    /// Records how far an invocation got, and waits until it is on disk.
    pub async fn set_dispatch_state(
        &self,
        invocation: &str,
        state: DispatchState,
        flight: &str,
    ) -> Result<(), RuntimeError> {
        let tag = match state {
            DispatchState::Started => 1u8,
            DispatchState::Done => 2u8,
        };
        let mut v = vec![tag];
        v.extend_from_slice(flight.as_bytes());
        let (tree, invocation) = (self.dispatches.clone(), invocation.to_string());
        self.db
            .write_durably(move || tree.insert(invocation.as_bytes(), v))
            .await??;
        Ok(())
    }

    /// Invocations whose turn started but whose flight has not ended: (invocation, flight).
    pub async fn unfinished_dispatches(&self) -> Result<Vec<(String, String)>, RuntimeError> {
        let tree = self.dispatches.clone();
        storage::read(move || {
            let mut out = Vec::new();
            for kv in tree.iter() {
                let (k, v) = kv?;
                if v.first() == Some(&1) {
                    out.push((
                        String::from_utf8_lossy(&k).into_owned(),
                        String::from_utf8_lossy(&v[1..]).into_owned(),
                    ));
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
        storage::read(move || tree.remove(invocation.as_bytes())).await??;
        Ok(())
    }

    /// Drops an agent's thread, durably (a new agent of the same name starts afresh).
    pub async fn forget(&self, agent: &str) -> Result<(), RuntimeError> {
        let (tree, agent) = (self.tree.clone(), agent.to_string());
        self.db
            .write_durably(move || tree.remove(agent.as_bytes()))
            .await??;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// These tests count or hold the storage thread's jobs: under `cargo test` (one
    /// process, tests in parallel) they take this lock so as not to count each other's.
    async fn exclusive() -> tokio::sync::MutexGuard<'static, ()> {
        static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        LOCK.lock().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_embedded_runtime_moves_its_old_database_into_the_shared_one() {
        let _serial = exclusive().await;
        let dir = tempfile::tempdir().unwrap();
        let legacy = dir.path().join("runtime");
        let record = ThreadRecord {
            harness: "codex_app_server".into(),
            thread_id: "thr_1".into(),
            updated_at: 7,
        };
        {
            let old = ThreadStore::open(&legacy).unwrap();
            old.put("codex-1", &record).await.unwrap();
            old.set_dispatch_state("inv_1", DispatchState::Started, "flt_1")
                .await
                .unwrap();
        }
        let shared = Durable::new(
            storage::config()
                .path(dir.path().join("db"))
                .open()
                .unwrap(),
        );
        let store = ThreadStore::within(&shared, Some(&legacy)).unwrap();
        assert_eq!(store.get("codex-1").await.unwrap(), Some(record.clone()));
        assert_eq!(
            store.unfinished_dispatches().await.unwrap(),
            vec![("inv_1".to_string(), "flt_1".to_string())]
        );
        assert!(!legacy.exists());
        let moved: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("runtime.migrated-"))
            .collect();
        assert_eq!(moved.len(), 1, "{moved:?}");
        // Writes land in the shared database, made durable by its flushes.
        let before = shared.flushes();
        store.forget("codex-1").await.unwrap();
        assert!(shared.flushes() > before);
        assert_eq!(store.get("codex-1").await.unwrap(), None);
        // Opening again finds nothing left to move, and keeps what it has.
        drop(store);
        let again = ThreadStore::within(&shared, Some(&legacy)).unwrap();
        assert_eq!(again.unfinished_dispatches().await.unwrap().len(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_dispatch_marks_are_group_committed() {
        let _serial = exclusive().await;
        let dir = tempfile::tempdir().unwrap();
        let store = ThreadStore::open(&dir.path().join("runtime")).unwrap();
        const N: usize = 400;
        // N workers recording at the same moment: held storage lets them all line up.
        let paused = storage::Storage::global().pause().await;
        let before = store.flushes();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..N {
            let store = store.clone();
            tasks.spawn(async move {
                store
                    .set_dispatch_state(&format!("inv_{i}"), DispatchState::Started, "flt")
                    .await
            });
        }
        tokio::time::timeout(std::time::Duration::from_secs(60), async {
            while storage::Storage::global().queued() < N {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the marks never reached the storage thread");
        paused.resume().await;
        while let Some(r) = tasks.join_next().await {
            r.unwrap().unwrap();
        }
        // Each mark was on disk when its call returned; one flush served all N.
        assert_eq!(store.flushes() - before, 1);
        assert_eq!(store.unfinished_dispatches().await.unwrap().len(), N);
    }
}
