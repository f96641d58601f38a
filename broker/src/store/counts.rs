//! A conversation's message count is not stored in its record. Each posted message
//! wrote its conversation's record again (for the count alone): a sled put and an
//! encoding per message (one hot key, so little of sled's file: ops/BENCHMARKS.md part
//! 15). The count is the index of the conversation's last message
//! plus one, and `messages` holds that as its last key under the conversation
//! ([`child_key`](super::child_key)), so it is read from there:
//! - by the writer's rules, from [`Counts`]: every conversation's count, read from
//!   `messages` before the store's first batch, and moved on only when a batch commits
//!   (a batch's own posts sit in its overlay until then);
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

use super::keys::{
    child_key, child_prefix, decode, last_message_key, parse_last_message, parse_pair, parse_u64, T,
};
use super::log::{EventLog, Pos};
use super::{Store, Tx};
use crate::error::BrokerError;

/// The message count of every conversation, as the writer's batches committed
/// them (`None` until the first: see [`Counts::load`]).
#[derive(Default)]
pub struct Counts(Mutex<Option<HashMap<String, u64>>>);

/// A batch's posts and new conversations: each one's count after them, applied
/// when it commits.
pub type CountOverlay = RefCell<HashMap<String, u64>>;

impl Counts {
    fn get(&self, id: &str) -> Option<u64> {
        self.0.lock().ok()?.as_ref()?.get(id).copied()
    }

    /// Reads every conversation's count from `store`, once: before its first
    /// batch, outside it.
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

    /// A committed batch's posts.
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

/// The count of `id`'s messages in `messages`: the last message's index plus one (the
/// index in its key, or in the value of the conversation's [`last_message_key`]).
pub(super) fn counted(messages: &sled::Tree, id: &str) -> Result<u64, BrokerError> {
    let index = match last_key(messages, id)? {
        None => return Ok(0),
        Some((u64::MAX, value)) => parse_last_message(&value)?.2,
        Some((index, _)) => index,
    };
    Ok(index.saturating_add(1))
}

/// The last key of conversation `id` in `messages`: its index (`u64::MAX` for the
/// conversation's [`last_message_key`]) and its value.
pub(super) fn last_key(
    messages: &sled::Tree,
    id: &str,
) -> Result<Option<(u64, sled::IVec)>, BrokerError> {
    let prefix = child_prefix(id);
    let Some(kv) = messages.scan_prefix(&prefix).next_back() else {
        return Ok(None);
    };
    let (key, value) = kv?;
    Ok(Some((parse_u64(&key[prefix.len()..])?, value)))
}

/// Conversation `id`'s messages, newest first, as the seq and log position of the
/// event that posted each, to `f` until it returns `false`: from the conversation's
/// last (its [`last_message_key`]) back along the records' links
/// ([`Link`](super::log::Link)), then, from the first whose record has no
/// link, by their keys in `messages` (the messages posted before records were linked;
/// their indexes run down to 0 with no gap). A record followed may be appended but not
/// yet on disk: `f` is given it as any other, and a reader of what is shown leaves it
/// out.
pub(super) fn walk_back(
    messages: &sled::Tree,
    log: &EventLog,
    id: &str,
    mut f: impl FnMut(u64, Pos) -> Result<bool, BrokerError>,
) -> Result<(), BrokerError> {
    let below = match messages.get(last_message_key(id))? {
        None => u64::MAX,
        Some(v) => {
            let (mut seq, mut pos, mut index) = parse_last_message(&v)?;
            loop {
                if !f(seq, pos)? {
                    return Ok(());
                }
                match log.link_at(pos)? {
                    Some((at, _)) if at != seq => {
                        return Err(BrokerError::Corrupt(format!(
                            "message of event {seq} of conversation {id} points at event {at}"
                        )))
                    }
                    Some((_, Some(link))) if index > 0 => {
                        (seq, pos, index) = (link.seq, link.pos, index - 1);
                    }
                    Some(_) => break index,
                    None => {
                        return Err(BrokerError::Corrupt(format!(
                            "message of event {seq} of conversation {id} is past the log's end"
                        )))
                    }
                }
            }
        }
    };
    let keys = messages.range(child_key(id, 0)..child_key(id, below));
    for v in keys.values().rev() {
        let (seq, pos) = parse_pair(&v?)?;
        if !f(seq, pos)? {
            break;
        }
    }
    Ok(())
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
    /// Conversation `id` with its message count, as this batch sees it.
    pub fn conversation(&self, id: &str) -> Result<Option<Conversation>, BrokerError> {
        let Some(v) = self.trees.get(T::Conversations, id.as_bytes())? else {
            return Ok(None);
        };
        let mut c: Conversation = decode(&v)?;
        let kept = self.counts_overlay.borrow().get(id).copied();
        c.message_count = kept.or_else(|| self.counts.get(id)).ok_or_else(|| {
            BrokerError::Internal(format!("no message count is kept for conversation {id}"))
        })?;
        Ok(Some(c))
    }

    /// The seq, log position and index of conversation `id`'s last message (its
    /// [`last_message_key`]), as this batch sees it (its own posts included).
    pub fn last_message(&self, id: &str) -> Result<Option<(u64, Pos, u64)>, BrokerError> {
        self.trees
            .get(T::Messages, &last_message_key(id))?
            .map(|v| parse_last_message(&v))
            .transpose()
    }

    /// Conversation `id` has `count` messages after this batch's post (or
    /// creation).
    pub(super) fn set_count(&self, id: &str, count: u64) {
        self.counts_overlay
            .borrow_mut()
            .insert(id.to_string(), count);
    }
}
