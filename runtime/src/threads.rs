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
}

impl ThreadStore {
    pub fn open(path: &Path) -> Result<ThreadStore, sled::Error> {
        let db = sled::open(path)?;
        let tree = db.open_tree("threads")?;
        Ok(ThreadStore { db, tree })
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

    pub fn forget(&self, agent: &str) -> Result<(), crate::RuntimeError> {
        self.tree.remove(agent.as_bytes())?;
        Ok(())
    }
}
