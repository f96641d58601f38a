//! A conversation's message count is not stored in its record. Each posted message
//! wrote its conversation's record again (for the count alone): a sled put and an
//! encoding per message (one hot key, so little of sled's file: ops/BENCHMARKS.md part
//! 15). The count is the index of the conversation's last message
//! plus one, and `messages` holds that as its last key under the conversation
//! ([`child_key`](super::child_key)), so it is read from there:
//! - by the writer's rules, from [`Counts`]: every conversation's count, read from
//!   `messages` before the store's first transaction (a sled transaction cannot read a
//!   tree outside itself: it would wait for itself) and moved on only when a
//!   transaction commits (a transaction's own posts sit in its overlay until then);
//! - by every other reader ([`Store::conversation`], [`Store::conversations`]), from
//!   `messages` on disk.
//!
//! The stored record keeps the count it was created with (0). The `message_posted`
//! event carries the message alone: its index says the count (a broker before
//! 2026-11-29 put the conversation after it in the event too).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Mutex;

use relay_protocol::domain::Conversation;

use super::keys::{child_prefix, decode, parse_u64, T};
use super::{unabortable, Store, Tx};
use crate::error::BrokerError;

/// The message count of every conversation, as the writer's transactions committed
/// them (`None` until the first: see [`Counts::load`]).
#[derive(Default)]
pub struct Counts(Mutex<Option<HashMap<String, u64>>>);

/// A transaction's posts and new conversations: each one's count after them, applied
/// when it commits.
pub type CountOverlay = RefCell<HashMap<String, u64>>;

impl Counts {
    fn get(&self, id: &str) -> Option<u64> {
        self.0.lock().ok()?.as_ref()?.get(id).copied()
    }

    /// Reads every conversation's count from `store`, once: before its first
    /// transaction, outside it.
    pub fn load(&self, store: &Store) -> Result<(), BrokerError> {
        let mut counts = self.0.lock().map_err(|_| poisoned())?;
        if counts.is_none() {
            let mut all = HashMap::new();
            for id in store.tree(T::Conversations).iter().keys() {
                let id = String::from_utf8_lossy(&id?).into_owned();
                let n = counted(store.tree(T::Messages), &id)?;
                all.insert(id, n);
            }
            *counts = Some(all);
        }
        Ok(())
    }

    /// A committed transaction's posts.
    pub fn commit(&self, overlay: &CountOverlay) {
        if let Ok(mut counts) = self.0.lock() {
            if let Some(counts) = counts.as_mut() {
                counts.extend(overlay.borrow_mut().drain());
            }
        }
    }
}

fn poisoned() -> BrokerError {
    BrokerError::Internal("the conversations' counts were poisoned".into())
}

/// The count of `id`'s messages in `messages` (the last key's index plus one).
pub(super) fn counted(messages: &sled::Tree, id: &str) -> Result<u64, BrokerError> {
    let prefix = child_prefix(id);
    match messages.scan_prefix(&prefix).keys().next_back() {
        Some(key) => Ok(parse_u64(&key?[prefix.len()..])?.saturating_add(1)),
        None => Ok(0),
    }
}

impl Store {
    /// Conversation `id` with its message count.
    pub fn conversation(&self, id: &str) -> Result<Option<Conversation>, BrokerError> {
        self.get::<Conversation>(T::Conversations, id.as_bytes())?
            .map(|c| self.counted(c))
            .transpose()
    }

    /// Every conversation, with its message count.
    pub fn conversations(&self) -> Result<Vec<Conversation>, BrokerError> {
        self.values::<Conversation>(T::Conversations)?
            .into_iter()
            .map(|c| self.counted(c))
            .collect()
    }

    fn counted(&self, mut c: Conversation) -> Result<Conversation, BrokerError> {
        c.message_count = counted(self.tree(T::Messages), &c.spec.id)?;
        Ok(c)
    }
}

impl Tx<'_> {
    /// Conversation `id` with its message count, as this transaction sees it.
    pub fn conversation(&self, id: &str) -> Result<Option<Conversation>, BrokerError> {
        let Some(v) = self.trees[T::Conversations as usize]
            .get(id.as_bytes())
            .map_err(unabortable)?
        else {
            return Ok(None);
        };
        let mut c: Conversation = decode(&v)?;
        let kept = self.counts_overlay.borrow().get(id).copied();
        c.message_count = kept.or_else(|| self.counts.get(id)).ok_or_else(|| {
            BrokerError::Internal(format!("no message count is kept for conversation {id}"))
        })?;
        Ok(Some(c))
    }

    /// Conversation `id` has `count` messages after this transaction's post (or
    /// creation).
    pub(super) fn set_count(&self, id: &str, count: u64) {
        self.counts_overlay
            .borrow_mut()
            .insert(id.to_string(), count);
    }
}
