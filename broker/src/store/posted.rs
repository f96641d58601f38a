//! A posted message stored in protobuf, not JSON: version byte [`POSTED_VERSION`], then
//! a [`Posted`] (the event's version, seq, time and author of the change, and the
//! message as [`pb::Message`]). A message of 160 bytes took about 400 in the log as
//! JSON, most of it field names, the event's envelope and its times written out
//! (ops/BENCHMARKS.md part 18); in protobuf its texts and a few bytes more.
//!
//! The writer stores a `message_posted` event so only when reading it back gives the
//! very event it wrote (checked as it is stored): its JSON, encoded again from the
//! event, is the same bytes, so replays and subscribers see nothing of it. Anything
//! else (a message with a reference to a text earlier in the log, an event from a
//! build before this one) stays as it was.

use prost::Message as _;
use relay_protocol::convert::{message_from_pb, message_to_pb};
use relay_protocol::event::{Event, EventBody};
use relay_protocol::pb;

use super::keys::VALUE_VERSION;
use super::shared::{SHARED_FILE_VERSION, SHARED_VERSION};
use crate::error::BrokerError;

/// Version byte of a posted message stored in protobuf.
pub const POSTED_VERSION: u8 = 5;

/// A `message_posted` event without its conversation.
#[derive(Clone, PartialEq, prost::Message)]
struct Posted {
    #[prost(uint32, tag = "1")]
    v: u32,
    #[prost(uint64, tag = "2")]
    seq: u64,
    #[prost(uint64, tag = "3")]
    at: u64,
    #[prost(string, optional, tag = "4")]
    by: Option<String>,
    #[prost(message, optional, tag = "5")]
    message: Option<pb::Message>,
}

/// `event` stored in protobuf, when it is a `message_posted` that reads back as itself.
fn encode(event: &Event) -> Option<Vec<u8>> {
    let EventBody::MessagePosted {
        message,
        conversation: None,
    } = &event.body
    else {
        return None;
    };
    let posted = Posted {
        v: event.v.into(),
        seq: event.seq,
        at: event.at,
        by: event.by.clone(),
        message: Some(message_to_pb(message)),
    };
    let mut stored = Vec::with_capacity(1 + posted.encoded_len());
    stored.push(POSTED_VERSION);
    posted.encode(&mut stored).ok()?;
    decode(&stored).ok().filter(|back| back == event)?;
    Some(stored)
}

/// What the log stores of `event` given `stored`, its payload so far: in protobuf where
/// that is its wire JSON and [`encode`] takes it; else `stored` as it is.
pub fn compact(event: &Event, stored: bytes::Bytes) -> bytes::Bytes {
    match super::shared::is_wire_json(&stored) {
        true => encode(event).map_or(stored, bytes::Bytes::from),
        false => stored,
    }
}

/// Whether a stored payload is a posted message in protobuf.
pub fn is_posted(payload: &[u8]) -> bool {
    payload.first() == Some(&POSTED_VERSION)
}

/// The largest record without protobuf [`may_be_posted`] reads the type of: a posted
/// message's is smaller (its body is at most `--max-message-bytes`, 256 KiB unless set,
/// and a long answer posted as a reply is a reference, not its text).
const PEEK_MAX: usize = 1 << 20;

/// Whether a record may be a `message_posted`, judged before it is decoded, so that an
/// id naming another event's seq (a completion of megabytes, say) costs a look, not a
/// decode: a posted message in protobuf is; a slim update is not; a record with
/// references or plain JSON, up to [`PEEK_MAX`] bytes, if its type says so (read
/// without filling any reference in).
pub(super) fn may_be_posted(payload: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Typed {
        #[serde(rename = "type")]
        kind: String,
    }
    #[derive(serde::Deserialize)]
    struct WithRefs {
        event: Typed,
    }
    let posted = |kind: &str| kind == "message_posted";
    match payload.split_first() {
        Some((&POSTED_VERSION, _)) => true,
        Some((_, json)) if json.len() > PEEK_MAX => false,
        Some((&(SHARED_VERSION | SHARED_FILE_VERSION), json)) => {
            serde_json::from_slice::<WithRefs>(json).is_ok_and(|r| posted(&r.event.kind))
        }
        Some((&VALUE_VERSION, json)) => {
            serde_json::from_slice::<Typed>(json).is_ok_and(|t| posted(&t.kind))
        }
        _ => false,
    }
}

/// The event of a payload [`encode`] stored.
pub fn decode(payload: &[u8]) -> Result<Event, BrokerError> {
    let corrupt = |what: String| BrokerError::Corrupt(format!("a stored posted message {what}"));
    let Some((&POSTED_VERSION, bytes)) = payload.split_first() else {
        return Err(corrupt("has another version".into()));
    };
    let posted = Posted::decode(bytes).map_err(|e| corrupt(format!("does not decode: {e}")))?;
    let message = posted
        .message
        .ok_or_else(|| corrupt("has no message".into()))?;
    Ok(Event {
        v: u8::try_from(posted.v).map_err(|_| corrupt(format!("has version {}", posted.v)))?,
        seq: posted.seq,
        at: posted.at,
        by: posted.by,
        body: EventBody::MessagePosted {
            message: message_from_pb(message).map_err(|e| corrupt(e.to_string()))?,
            conversation: None,
        },
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use relay_protocol::domain::{
        Conversation, ConversationKind, ConversationSpec, Harness, Message, MessageClass,
        MessageMeta,
    };

    fn posted(meta: MessageMeta, by: Option<&str>) -> Event {
        Event {
            v: relay_protocol::event::EVENT_VERSION,
            seq: 12_345,
            at: 1_795_952_749_003,
            by: by.map(str::to_string),
            body: EventBody::MessagePosted {
                message: Message {
                    id: "msg_01a2272029cb73a2945383afdee95bed".into(),
                    conversation: "bench.talk".into(),
                    index: 7,
                    author: "operator".into(),
                    class: MessageClass::Agent,
                    body: "x".repeat(160).into(),
                    mentions: vec!["codex-1".into()],
                    reply_to: Some("msg_0".into()),
                    meta,
                    created_at: 1_795_952_749_003,
                },
                conversation: None,
            },
        }
    }

    #[test]
    fn a_posted_message_reads_back_as_itself_and_its_json_is_the_same_bytes() {
        let full = MessageMeta {
            invocation: Some("inv_1".into()),
            flight: Some("flt_1".into()),
            harness: Some(Harness::ClaudeStreamJson),
            thread_id: Some("th".into()),
            turn_id: Some("tu".into()),
        };
        for event in [
            posted(MessageMeta::default(), None),
            posted(full, Some("ann@dashboard")),
        ] {
            let stored = encode(&event).unwrap();
            let json = serde_json::to_vec(&event).unwrap();
            assert!(
                stored.len() + 100 < json.len(),
                "{} {}",
                stored.len(),
                json.len()
            );
            let back = decode(&stored).unwrap();
            assert_eq!(back, event);
            assert_eq!(serde_json::to_vec(&back).unwrap(), json);
        }
    }

    #[test]
    fn other_events_and_damaged_payloads_are_not_taken_for_one() {
        let mut with_conversation = posted(MessageMeta::default(), None);
        if let EventBody::MessagePosted { conversation, .. } = &mut with_conversation.body {
            *conversation = Some(Conversation {
                spec: ConversationSpec {
                    id: "bench.talk".into(),
                    kind: ConversationKind::Channel,
                    title: None,
                    participants: vec![],
                    parent: None,
                },
                created_at: 1,
                message_count: 8,
            });
        }
        assert_eq!(encode(&with_conversation), None, "kept as JSON");
        let stored = encode(&posted(MessageMeta::default(), None)).unwrap();
        for cut in [1, 5, stored.len() / 2, stored.len() - 1] {
            assert!(matches!(
                decode(&stored[..cut]),
                Err(BrokerError::Corrupt(_))
            ));
        }
        assert!(matches!(
            decode(b"\x05\xff\xff"),
            Err(BrokerError::Corrupt(_))
        ));
        assert!(matches!(decode(b"\x01{}"), Err(BrokerError::Corrupt(_))));
    }

    #[test]
    fn only_a_record_that_may_be_a_posted_message_is_decoded_to_see() {
        let event = posted(MessageMeta::default(), None);
        let json = |e: &Event| [&[VALUE_VERSION][..], &serde_json::to_vec(e).unwrap()].concat();
        assert!(may_be_posted(&encode(&event).unwrap()));
        assert!(may_be_posted(&json(&event)), "plain JSON, as before");
        let with_refs = |kind: &str| {
            let refs = format!(r#"{{"refs":[],"event":{{"type":"{kind}","seq":1}}}}"#);
            [&[SHARED_VERSION][..], refs.as_bytes()].concat()
        };
        assert!(may_be_posted(&with_refs("message_posted")));
        assert!(!may_be_posted(&with_refs("flight_updated")));
        let mut other = event.clone();
        other.body = EventBody::AgentRemoved {
            name: "a".into(),
            node: None,
            force: false,
        };
        assert!(!may_be_posted(&json(&other)));
        // A long one is not read to see, whatever it is.
        let mut long = event;
        if let EventBody::MessagePosted { message, .. } = &mut long.body {
            message.body = "x".repeat(PEEK_MAX).into();
        }
        assert!(!may_be_posted(&json(&long)));
        assert!(!may_be_posted(&[super::super::SLIM_VERSION, b'{']));
        assert!(!may_be_posted(b""));
    }
}
