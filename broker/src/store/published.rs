//! [`Published`]: a committed event with the one encoding of it every subscriber gets.
//! The writer encodes an event once, as it stores it (a version byte, then its JSON);
//! the JSON part of that same buffer is the wire form (SSE `data:`, the NATS events), so
//! no subscriber encodes it again. An event read back from the log is built from its
//! stored bytes the same way ([`Published::from_stored`]): the wire bytes are the log's,
//! whether a subscriber got the event live or caught up.

use bytes::Bytes;
use relay_protocol::event::Event;

use super::keys::decode;
use super::log::EventLog;
use super::shared::{decode_record, has_refs, Newest, Source};
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
        live_max: usize,
    ) -> Result<(Published, Bytes, Newest), BrokerError> {
        let shared = super::shared::encode(&mut event, pos, known, live_max)?;
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

    /// The event stored as `stored` (version byte + JSON), decoded, with `json` the
    /// stored JSON as it is (not encoded again: byte for byte what the writer stored).
    /// A record with a text stored by reference ([`super::shared`]) is filled in from
    /// `log`, and its JSON encoded again (as the writer published it).
    pub fn from_stored(stored: Bytes, log: &EventLog) -> Result<Published, BrokerError> {
        if has_refs(&stored) {
            return Ok(Published::lazy(decode_record(log, &stored)?));
        }
        let event: Event = decode(&stored)?;
        Ok(Published::with_json(event, stored.slice(1..)))
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

    #[test]
    fn bytes_without_the_version_are_refused() {
        let json = Bytes::from(serde_json::to_vec(&event()).unwrap());
        let log = crate::store::Store::temporary().unwrap();
        assert!(Published::from_stored(json, log.log()).is_err());
        assert!(Published::from_stored(Bytes::new(), log.log()).is_err());
    }
}
