//! Each agent's harness thread/session id, in the runtime's own sled database, so a
//! session resumes the same thread after any restart.

use std::path::Path;

use serde::{Deserialize, Serialize};

const VERSION: u8 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadRecord {
    pub harness: String,
    pub thread_id: String,
    pub updated_at: u64,
}

#[derive(Clone)]
pub struct ThreadStore {
    db: sled::Db,
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
        let db = sled::open(path)?;
        let tree = db.open_tree("threads")?;
        let dispatches = db.open_tree("dispatches")?;
        Ok(ThreadStore {
            db,
            tree,
            dispatches,
        })
    }

    pub fn get(&self, agent: &str) -> Result<Option<ThreadRecord>, crate::RuntimeError> {
        match self.tree.get(agent.as_bytes())? {
            Some(v) if v.first() == Some(&VERSION) => Ok(Some(serde_json::from_slice(&v[1..])?)),
            Some(_) => Ok(None),
            None => Ok(None),
        }
    }

    /// Records the thread and waits until it is on disk.
    pub async fn put(&self, agent: &str, record: &ThreadRecord) -> Result<(), crate::RuntimeError> {
        let mut v = vec![VERSION];
        serde_json::to_writer(&mut v, record)?;
        self.tree.insert(agent.as_bytes(), v)?;
        self.db.flush_async().await?;
        Ok(())
    }

    pub fn dispatch_state(
        &self,
        invocation: &str,
    ) -> Result<Option<DispatchState>, crate::RuntimeError> {
        Ok(
            match self.dispatches.get(invocation.as_bytes())?.as_deref() {
                Some([1, ..]) => Some(DispatchState::Started),
                Some([2, ..]) => Some(DispatchState::Done),
                _ => None,
            },
        )
    }

    /// Records how far an invocation got, and waits until it is on disk.
    pub async fn set_dispatch_state(
        &self,
        invocation: &str,
        state: DispatchState,
        flight: &str,
    ) -> Result<(), crate::RuntimeError> {
        let tag = match state {
            DispatchState::Started => 1u8,
            DispatchState::Done => 2u8,
        };
        let mut v = vec![tag];
        v.extend_from_slice(flight.as_bytes());
        self.dispatches.insert(invocation.as_bytes(), v)?;
        self.db.flush_async().await?;
        Ok(())
    }

    /// Invocations whose turn started but whose flight has not ended: (invocation, flight).
    pub fn unfinished_dispatches(&self) -> Result<Vec<(String, String)>, crate::RuntimeError> {
        let mut out = Vec::new();
        for kv in self.dispatches.iter() {
            let (k, v) = kv?;
            if v.first() == Some(&1) {
                out.push((
                    String::from_utf8_lossy(&k).into_owned(),
                    String::from_utf8_lossy(&v[1..]).into_owned(),
                ));
            }
        }
        Ok(out)
    }

    /// Drops an invocation's record (not flushed: losing it in a crash only keeps a
    /// record that is harmless once its flight has ended).
    pub fn forget_dispatch(&self, invocation: &str) -> Result<(), crate::RuntimeError> {
        self.dispatches.remove(invocation.as_bytes())?;
        Ok(())
    }

    pub fn forget(&self, agent: &str) -> Result<(), crate::RuntimeError> {
        self.tree.remove(agent.as_bytes())?;
        Ok(())
    }
}
