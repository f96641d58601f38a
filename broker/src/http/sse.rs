//! SSE streams of events encoded once: each event's frame is written around the JSON the
//! writer stored ([`Published::json`]), copied once into the frame, never serialized
//! again per client. axum's `Sse` takes only its own `Event`s, which would serialize
//! (or copy through a growing buffer) per client, so these streams make their body
//! themselves: the same bytes axum writes (`id: `, `event: `, `data: ` lines, a blank
//! line), the same headers, and the same keep-alive (an empty comment after 15 s with
//! nothing sent).

use std::convert::Infallible;
use std::time::Duration;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};
use futures::{Stream, StreamExt};

use crate::broker::Published;

/// What axum's default keep-alive sends, as often.
const KEEP_ALIVE: Bytes = Bytes::from_static(b":\n\n");
const KEEP_ALIVE_AFTER: Duration = Duration::from_secs(15);

/// One SSE event as axum frames it: `id: ID` (if any), `event: KIND`, `data: ` before
/// each line of `data` (split at each `\n` or `\r`, as axum splits), then a blank line.
/// One allocation of the exact size.
pub(super) fn frame(id: Option<u64>, kind: &str, data: &[u8]) -> Bytes {
    let id = id.map(|id| id.to_string());
    // Stored JSON has no line break (serde_json escapes them), so this finds none; it
    // is looked for all the same (memchr: as fast as a copy), as axum does.
    let breaks = memchr::memchr2_iter(b'\n', b'\r', data).count();
    let len = id.as_ref().map_or(0, |id| 5 + id.len())
        + 8
        + kind.len()
        + if data.is_empty() { 0 } else { 7 + breaks * 6 }
        + data.len()
        + 1;
    let mut out = BytesMut::with_capacity(len);
    if let Some(id) = &id {
        out.put_slice(b"id: ");
        out.put_slice(id.as_bytes());
        out.put_u8(b'\n');
    }
    out.put_slice(b"event: ");
    out.put_slice(kind.as_bytes());
    out.put_u8(b'\n');
    // An empty `data` writes no line, as axum's `data("")`.
    if !data.is_empty() {
        out.put_slice(b"data: ");
        let mut from = 0;
        for i in memchr::memchr2_iter(b'\n', b'\r', data) {
            out.put_slice(&data[from..=i]);
            out.put_slice(b"data: ");
            from = i + 1;
        }
        out.put_slice(&data[from..]);
        out.put_u8(b'\n');
    }
    out.put_u8(b'\n');
    // The size computed up front is the size written (tests check it): no regrowth.
    debug_assert_eq!(out.len(), len);
    out.freeze()
}

/// A committed event: `id:` its seq, `event:` its type, `data:` its stored JSON.
pub(super) fn event_frame(event: &Published) -> Bytes {
    frame(Some(event.seq), event.body.type_name(), event.json())
}

/// A value serialized for one client (a snapshot, an error), framed as axum's
/// `json_data` would; `unserializable` as the events' streams said before.
pub(super) fn json_frame<T: serde::Serialize>(id: Option<u64>, kind: &str, v: &T) -> Bytes {
    match serde_json::to_vec(v) {
        Ok(json) => frame(id, kind, &json),
        Err(_) => frame(None, "error", b"unserializable"),
    }
}

/// The response streaming `frames`, with axum's SSE headers and keep-alive.
pub(super) fn response(frames: impl Stream<Item = Bytes> + Send + 'static) -> Response {
    let timer = Box::pin(tokio::time::sleep(KEEP_ALIVE_AFTER));
    let body = futures::stream::unfold(
        (Box::pin(frames), timer),
        |(mut frames, mut timer)| async move {
            // A frame ready goes first; the keep-alive only when there is none.
            let next = tokio::select! {
                biased;
                frame = frames.next() => frame?,
                () = &mut timer => KEEP_ALIVE,
            };
            timer
                .as_mut()
                .reset(tokio::time::Instant::now() + KEEP_ALIVE_AFTER);
            Some((Ok::<_, Infallible>(next), (frames, timer)))
        },
    );
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use axum::response::sse::Event as SseEvent;

    /// What axum writes for an event, read through its own response.
    async fn axum_bytes(event: SseEvent) -> Vec<u8> {
        let sse =
            axum::response::sse::Sse::new(futures::stream::iter([Ok::<_, Infallible>(event)]));
        let body = sse.into_response().into_body();
        axum::body::to_bytes(body, usize::MAX)
            .await
            .unwrap()
            .to_vec()
    }

    /// The frames are axum's, byte for byte: with and without an id, with data on one
    /// line, over several (`\n`, `\r`, `\r\n`), and empty.
    #[tokio::test]
    async fn frames_are_the_bytes_axum_writes() {
        for data in [
            "{\"a\":1}",
            "one\ntwo",
            "one\r\ntwo\rthree\n",
            "\n",
            "",
            "é ünïcode",
        ] {
            let ours = frame(Some(42), "flight_updated", data.as_bytes());
            let theirs = axum_bytes(
                SseEvent::default()
                    .id("42")
                    .event("flight_updated")
                    .data(data),
            )
            .await;
            assert_eq!(ours, theirs, "{data:?}");
            let ours = frame(None, "error", data.as_bytes());
            let theirs = axum_bytes(SseEvent::default().event("error").data(data)).await;
            assert_eq!(ours, theirs, "{data:?}");
        }
        let v = serde_json::json!({ "seq": 3, "text": "a\nb" });
        let theirs = axum_bytes(
            SseEvent::default()
                .id("3")
                .event("resumed")
                .json_data(&v)
                .unwrap(),
        )
        .await;
        assert_eq!(json_frame(Some(3), "resumed", &v), theirs);
    }

    /// A delta's event as the writer publishes it: the update and the whole flight.
    fn delta_event() -> Published {
        let flight = serde_json::json!({
            "id": "flt_01JD8Q6W5YJ6", "invocation": "inv_01JD8Q6W5YJ6", "agent": "codex-1",
            "state": "running", "update_seq": 41, "conversation": "direct.operator.codex-1",
            "thread_id": "019a7c2e-5b0b-7d42-9a51-5f3f0c8e2b11", "turn_id": "1",
            "created_at": 1_700_000_000_000u64, "updated_at": 1_700_000_004_000u64,
        });
        let event = serde_json::json!({
            "v": relay_protocol::event::EVENT_VERSION, "seq": 12_345, "at": 1_700_000_004_000u64,
            "type": "flight_updated",
            "update": {"flight": "flt_01JD8Q6W5YJ6", "agent": "codex-1", "seq": 41,
                       "at": 1_700_000_004_000u64, "kind": "delta", "text": "the next 32 bytes of an answer.."},
            "flight": flight,
        });
        let event: relay_protocol::event::Event = serde_json::from_value(event).unwrap();
        Published::encode(event).unwrap().0
    }

    /// What one client costs per event, before (axum's `json_data`: the event serialized
    /// for each client) and now (its stored JSON framed): the same bytes, and the time
    /// per client and event is printed for the record (unoptimized test build: a
    /// measurement, not a check of time).
    #[tokio::test]
    async fn a_clients_frame_is_the_serialized_event_without_serializing_it() {
        let p = delta_event();
        let theirs = axum_bytes(
            SseEvent::default()
                .id(p.seq.to_string())
                .event(p.body.type_name())
                .json_data(&p.event)
                .unwrap(),
        )
        .await;
        assert_eq!(event_frame(&p), theirs);
        let rounds = 20_000u32;
        let started = std::time::Instant::now();
        for _ in 0..rounds {
            let e = SseEvent::default()
                .id(p.seq.to_string())
                .event(p.body.type_name())
                .json_data(&p.event)
                .unwrap();
            drop(std::hint::black_box(e));
        }
        let before = started.elapsed() / rounds;
        let started = std::time::Instant::now();
        for _ in 0..rounds {
            drop(std::hint::black_box(event_frame(std::hint::black_box(&p))));
        }
        let now = started.elapsed() / rounds;
        eprintln!(
            "per client per event ({} B of JSON): serialized {before:?}, framed from the stored bytes {now:?}",
            p.json().len()
        );
    }
}
