//! [`Published`]: a committed event with the one encoding of it every subscriber gets.
//! The writer encodes an event once, as it stores it (a version byte, then its JSON);
//! the JSON part of that same buffer is the wire form (SSE `data:`, the NATS events), so
//! no subscriber encodes it again. An event read back from the log is built from its
//! stored bytes the same way ([`Published::from_stored`]): the wire bytes are the log's,
//! whether a subscriber got the event live or caught up.

use bytes::Bytes;
use relay_protocol::event::Event;

use super::keys::{decode, encode};
use crate::error::BrokerError;

/// A committed event and its wire JSON.
#[derive(Debug, Clone)]
pub struct Published {
    pub event: Event,
    /// The JSON of `event` (serde_json of it), exactly the stored bytes after their
    /// version byte: a slice of the stored buffer, sharing its allocation.
    pub json: Bytes,
}

impl Published {
    /// Encodes a new event once: the bytes to store (version byte + JSON), and the
    /// published event whose `json` shares them.
    pub fn encode(event: Event) -> Result<(Published, Bytes), BrokerError> {
        let stored = Bytes::from(encode(&event)?);
        let json = stored.slice(1..);
        Ok((Published { event, json }, stored))
    }

    /// The event stored as `stored` (version byte + JSON), decoded, with `json` the
    /// stored JSON as it is (not encoded again: byte for byte what the writer stored).
    pub fn from_stored(stored: Bytes) -> Result<Published, BrokerError> {
        let event: Event = decode(&stored)?;
        let json = stored.slice(1..);
        Ok(Published { event, json })
    }

    /// The size it takes in the log (the stored bytes, version byte included).
    pub fn stored_len(&self) -> usize {
        self.json.len() + 1
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
        assert_eq!(p.json, serde_json::to_vec(&event()).unwrap());
        assert_eq!(&stored[1..], &p.json[..]);
        assert_eq!(stored.as_ptr().wrapping_add(1), p.json.as_ptr());
        assert_eq!(p.stored_len(), stored.len());
        let back = Published::from_stored(stored.clone()).unwrap();
        assert_eq!(back.json, p.json);
        assert_eq!(back.json.as_ptr(), p.json.as_ptr());
        assert_eq!(back.seq, 7);
        assert_eq!(serde_json::to_vec(&back.event).unwrap(), p.json);
    }

    #[test]
    fn bytes_without_the_version_are_refused() {
        let json = Bytes::from(serde_json::to_vec(&event()).unwrap());
        assert!(Published::from_stored(json).is_err());
        assert!(Published::from_stored(Bytes::new()).is_err());
    }
}
