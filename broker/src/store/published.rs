//! [`Published`]: a committed event with the one encoding of it every subscriber gets.
//! The writer encodes an event once, as it stores it (a version byte, then its JSON);
//! the JSON part of that same buffer is the wire form (SSE `data:`, the NATS events), so
//! no subscriber encodes it again. An event read back from the log is built from its
//! stored bytes the same way ([`Published::from_stored`]): the wire bytes are the log's,
//! whether a subscriber got the event live or caught up. (A record that is not the wire
//! JSON, one with a text by reference or a flight's update stored without its flight,
//! is decoded, and its JSON encoded on first use: the same bytes, from the same event.)

use std::sync::{Arc, Weak};

use bytes::Bytes;
use relay_protocol::event::Event;

use super::keys::decode;
use super::log::EventLog;
use super::shared::{decode_event, has_refs, is_wire_json, Newest, Source};
use crate::error::BrokerError;

/// A committed event and its wire JSON.
#[derive(Debug, Clone)]
pub struct Published {
    pub event: Event,
    /// The JSON of `event` (serde_json of it) ([`Published::json`]): exactly the stored
    /// bytes after their version byte, a slice of the stored buffer sharing its
    /// allocation; or, for an event that stores a long text by reference, encoded on
    /// first use: most of its readers (the NATS publisher, dispatch, telemetry) never
    /// send it as JSON, and the answer it holds may be megabytes.
    json: std::sync::OnceLock<Bytes>,
}

impl Published {
    /// Encodes a new event once: the bytes to store (version byte + JSON), and the
    /// published event whose `json` shares them.
    pub fn encode(event: Event) -> Result<(Published, Bytes), BrokerError> {
        let shared = super::shared::Shared::plain(&event)?;
        Ok((Published::with_json(event, shared.json), shared.stored))
    }

    /// Encodes a new event to be stored at `pos`, with a text its flight repeats stored
    /// as a reference ([`super::shared`]; `known`: the flight's last repeatable text):
    /// the published event, the bytes to store, and the text this event makes the
    /// flight's newest. Without such a text, as [`Published::encode`].
    pub fn encode_sharing(
        mut event: Event,
        pos: super::Pos,
        known: impl Fn(&str) -> Option<Source>,
        texts: &super::log::TextFiles,
        live_max: usize,
    ) -> Result<(Published, Bytes, Newest), BrokerError> {
        let shared = super::shared::encode(&mut event, pos, known, texts, live_max)?;
        // No wire JSON: the texts it refers to are too long to encode here (see
        // [`super::shared::Shared::json`]); encoded on first use.
        let published = if shared.json.is_empty() {
            Published::lazy(event)
        } else {
            Published::with_json(event, shared.json)
        };
        Ok((published, shared.stored, shared.source))
    }

    fn with_json(event: Event, json: Bytes) -> Published {
        Published {
            event,
            json: std::sync::OnceLock::from(json),
        }
    }

    fn lazy(event: Event) -> Published {
        Published {
            event,
            json: std::sync::OnceLock::new(),
        }
    }

    /// The wire JSON (see the field), encoded now if it was not.
    pub fn json(&self) -> &Bytes {
        self.json.get_or_init(|| match serde_json::to_vec(&self.event) {
            Ok(json) => Bytes::from(json),
            // An event is plain data (no map with non-string keys): never seen.
            Err(e) => {
                tracing::error!(seq = self.event.seq, error = %e, "an event could not be encoded as JSON");
                Bytes::new()
            }
        })
    }

    /// The wire JSON's length when it is encoded already.
    pub fn encoded_len(&self) -> Option<usize> {
        self.json.get().map(Bytes::len)
    }

    /// The event stored as `stored` (version byte + JSON), decoded, with its JSON the
    /// stored JSON as it is (not encoded again: byte for byte what the writer stored).
    /// A record with a text stored by reference ([`super::shared`]) is filled in from
    /// `log`, and its JSON is encoded on first use ([`Published::json`]), as the writer
    /// would have published it.
    pub fn from_stored(stored: Bytes, log: &EventLog) -> Result<Published, BrokerError> {
        if !is_wire_json(&stored) {
            return Ok(Published::lazy(decode_event(log, &stored)?));
        }
        let event: Event = decode(&stored)?;
        Ok(Published::with_json(event, stored.slice(1..)))
    }
}

/// Large events read back from the log, decoded once for the readers that want them at
/// the same time. Every follower of the log (the NATS publisher, dispatch, telemetry,
/// each SSE or watch stream) reads an event too large to be handed out in memory back
/// from the log as soon as it is committed: a 32 MB answer's record was read and
/// decoded by each of them, all at once, on two cores, while every other flight's
/// updates waited behind it in each follower. The first decodes it; the others, waiting
/// for it meanwhile, share it. Only a weak reference is kept: the event is in memory
/// as long as a reader holds it, not longer.
#[derive(Debug, Default)]
pub struct ReadBack {
    /// seq -> the event as decoded, while a reader holds it (the lock is held by the one
    /// decoding it).
    recent:
        std::sync::Mutex<std::collections::HashMap<u64, Arc<std::sync::Mutex<Weak<Published>>>>>,
}

/// Records shorter than this (and without references) are decoded by each reader: cheap,
/// and most events.
pub const SHARED_READ_MIN: usize = 64 * 1024;

impl ReadBack {
    /// The event stored as `stored` at `seq`: decoded by `decode`, or shared with the
    /// reader that decoded it (a short record without references is always decoded).
    pub fn get(
        &self,
        seq: u64,
        stored: Bytes,
        decode: impl FnOnce(Bytes) -> Result<Published, BrokerError>,
    ) -> Result<Arc<Published>, BrokerError> {
        if stored.len() < SHARED_READ_MIN && !has_refs(&stored) {
            return decode(stored).map(Arc::new);
        }
        let entry = {
            let Ok(mut recent) = self.recent.lock() else {
                return decode(stored).map(Arc::new);
            };
            // Entries nobody holds or waits for go (one being decoded is locked: kept).
            recent.retain(|_, e| {
                Arc::strong_count(e) > 1
                    || match e.try_lock() {
                        Ok(held) => held.strong_count() > 0,
                        Err(std::sync::TryLockError::WouldBlock) => true,
                        Err(std::sync::TryLockError::Poisoned(_)) => false,
                    }
            });
            recent.entry(seq).or_default().clone()
        };
        let Ok(mut slot) = entry.lock() else {
            return decode(stored).map(Arc::new);
        };
        if let Some(shared) = slot.upgrade() {
            return Ok(shared);
        }
        let published = Arc::new(decode(stored)?);
        *slot = Arc::downgrade(&published);
        Ok(published)
    }
}

/// Most code reads the event: `published.seq`, `published.body`.
impl std::ops::Deref for Published {
    type Target = Event;
    fn deref(&self) -> &Event {
        &self.event
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use relay_protocol::event::EventBody;

    fn event() -> Event {
        Event {
            v: relay_protocol::event::EVENT_VERSION,
            seq: 7,
            at: 1_700_000_000_000,
            by: Some("ann@cli".into()),
            body: EventBody::AgentRemoved {
                name: "a \"quoted\"\nname".into(),
                node: None,
                force: true,
            },
        }
    }

    /// The wire JSON is serde_json of the event, and the stored bytes are it behind the
    /// version byte, in one allocation.
    #[test]
    fn the_wire_json_is_the_stored_bytes_and_serde_json_of_the_event() {
        let (p, stored) = Published::encode(event()).unwrap();
        assert_eq!(p.json(), &serde_json::to_vec(&event()).unwrap());
        assert_eq!(&stored[1..], &p.json()[..]);
        assert_eq!(stored.as_ptr().wrapping_add(1), p.json().as_ptr());
        let log = crate::store::Store::temporary().unwrap();
        let back = Published::from_stored(stored.clone(), log.log()).unwrap();
        assert_eq!(back.json(), p.json());
        assert_eq!(back.json().as_ptr(), p.json().as_ptr());
        assert_eq!(back.seq, 7);
        assert_eq!(serde_json::to_vec(&back.event).unwrap(), p.json()[..]);
    }

    /// Readers that want one large event at once share one decode of it, held as long
    /// as one of them holds it; after that it is decoded again. A short one is decoded
    /// by each reader.
    #[test]
    fn a_large_event_read_back_by_many_at_once_is_decoded_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let mut big = event();
        if let EventBody::AgentRemoved { name, .. } = &mut big.body {
            *name = "n".repeat(SHARED_READ_MIN);
        }
        let (_, stored) = Published::encode(big).unwrap();
        let read_back = ReadBack::default();
        let decodes = AtomicUsize::new(0);
        let decode = |b: Bytes| {
            decodes.fetch_add(1, Ordering::SeqCst);
            let log = crate::store::Store::temporary().unwrap();
            Published::from_stored(b, log.log())
        };
        let readers = 8;
        let barrier = std::sync::Barrier::new(readers);
        let got: Vec<Arc<Published>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..readers)
                .map(|_| {
                    s.spawn(|| {
                        let p = read_back.get(7, stored.clone(), decode).unwrap();
                        // Held until every reader has its own.
                        barrier.wait();
                        p
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(decodes.load(Ordering::SeqCst), 1);
        assert!(got.iter().all(|p| Arc::ptr_eq(p, &got[0])));
        assert_eq!(got[0].seq, 7);
        drop(got);
        // Nobody holds it now: the next reader decodes it again, and the entry is gone.
        let again = read_back.get(7, stored.clone(), decode).unwrap();
        assert_eq!(decodes.load(Ordering::SeqCst), 2);
        drop(again);
        read_back.get(8, stored.clone(), decode).unwrap();
        assert_eq!(
            read_back.recent.lock().unwrap().len(),
            1,
            "seq 7's entry went"
        );
        // A short event is decoded by each reader.
        let (_, short) = Published::encode(event()).unwrap();
        let one = read_back.get(9, short.clone(), decode).unwrap();
        let two = read_back.get(9, short, decode).unwrap();
        assert!(!Arc::ptr_eq(&one, &two));
        assert_eq!(decodes.load(Ordering::SeqCst), 5);
    }

    #[test]
    fn bytes_without_the_version_are_refused() {
        let json = Bytes::from(serde_json::to_vec(&event()).unwrap());
        let log = crate::store::Store::temporary().unwrap();
        assert!(Published::from_stored(json, log.log()).is_err());
        assert!(Published::from_stored(Bytes::new(), log.log()).is_err());
    }
}
