//! Each agent's harness thread/session id, in the runtime's own sled database, so a
//! session resumes the same thread after any restart; and how far each dispatched
//! invocation got (for exactly-once over NATS).
//!
//! Writes go through the process's storage thread ([`crate::storage`]): the durable
//! ones (a new thread id, a dispatch started or done) are group-committed with every
//! other write waiting at the same moment, so N workers recording at once cost one
//! flush. Reads run on the blocking pool. Nothing here blocks an async worker.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::storage::{self, Durable};
use crate::RuntimeError;

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
    pub fn open(path: &Path) -> Result<ThreadStore, sled::Error> {
        let db = storage::config().path(path).open()?;
        let tree = db.open_tree("threads")?;
        let dispatches = db.open_tree("dispatches")?;
        Ok(ThreadStore {
            db: Durable::new(db),
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

    /// Drops an invocation's record (not flushed on its own: losing it in a crash only
    /// keeps a record that is harmless once its flight has ended).
    pub async fn forget_dispatch(&self, invocation: &str) -> Result<(), RuntimeError> {
        let (tree, invocation) = (self.dispatches.clone(), invocation.to_string());
        storage::Storage::global()
            .run(move || tree.remove(invocation.as_bytes()))
            .await??;
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
