//! The event log and the live streams: `GET /v1/events`, and over SSE every committed
//! event, one flight's updates, and a watch (a snapshot, then its scope's events:
//! [`crate::watch`]). Every event of a stream has an `id:` (its position: a global
//! seq, a flight's own seq for a flight's stream), and every stream takes it back as
//! `Last-Event-ID` to resume right after it, as it takes `after`.

use relay_protocol::methods::call as m;
use std::convert::Infallible;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::Response;
use axum::Extension;
use axum::Json;
use futures::Stream;
use relay_protocol::api::{ErrorBody, ErrorCode};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use super::{sse, ApiResult, ApiState, HttpError, Principal, Req};
use crate::error::{quote, BrokerError};

pub(super) fn sse_json<T: serde::Serialize>(id: u64, kind: &str, v: &T) -> SseEvent {
    SseEvent::default()
        .id(id.to_string())
        .event(kind)
        .json_data(v)
        .unwrap_or_else(|_| SseEvent::default().event("error").data("unserializable"))
}

/// An `event: error` (the stream ends after it). It has no `id:`, so a client's last
/// event id stays that of the last event it got: one that reconnects resumes from
/// there, not from the start.
fn sse_error(e: &BrokerError) -> SseEvent {
    SseEvent::default()
        .event("error")
        .json_data(ErrorBody { error: e.to_api() })
        .unwrap_or_else(|_| SseEvent::default().event("error").data("unserializable"))
}

/// [`sse_error`], framed for the streams of events ([`sse`]).
fn error_frame(e: &BrokerError) -> bytes::Bytes {
    sse::json_frame(None, "error", &ErrorBody { error: e.to_api() })
}

/// The frame of a committed event from a feed ([`sse::event_frame`]), or of the error
/// that ended it. An event whose JSON is not encoded yet (a long answer stored by
/// reference: megabytes) is encoded off the async workers.
async fn committed_frame(
    item: Result<std::sync::Arc<crate::broker::Published>, BrokerError>,
) -> bytes::Bytes {
    let event = match item {
        Ok(event) if event.encoded_len().is_some() => return sse::event_frame(&event),
        Ok(event) => event,
        Err(e) => return error_frame(&e),
    };
    let seq = event.seq;
    match tokio::task::spawn_blocking(move || sse::event_frame(&event)).await {
        Ok(frame) => frame,
        Err(e) => error_frame(&BrokerError::Internal(format!(
            "event {seq} could not be encoded: {e}"
        ))),
    }
}

/// Where a stream starts: the `Last-Event-ID` a reconnecting client sends, else the
/// `after` it asked for first. The header wins: a browser's EventSource reconnects to
/// the same URL, `after` and all, with the header saying how far it got since.
fn resume_at(headers: &HeaderMap, after: Option<u64>) -> Result<Option<u64>, HttpError> {
    Ok(last_event_id(headers)?.or(after))
}

/// Updates of one flight over SSE (`event: update`, `id:` = per-flight seq), from
/// `after` or the `Last-Event-ID` header (a per-flight seq too), ending after the
/// update that makes the flight terminal.
pub(super) async fn flight_stream(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Query(q): Query<Req<m::FlightStream>>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, HttpError> {
    principal.may_read_flight(&s.broker, &id).await?;
    let after = resume_at(&headers, q.after)?;
    let flight = s
        .broker
        .flight(&id)
        .await?
        .ok_or_else(|| BrokerError::UnknownFlight(id.clone()))?;
    let rx = crate::feed::follow_flight(s.broker.clone(), flight, after.unwrap_or(0));
    let stream = ReceiverStream::new(rx).map(|item| {
        Ok(match item {
            Ok(update) => sse_json(update.seq, "update", &update),
            Err(e) => sse_error(&e),
        })
    });
    let stream = futures::StreamExt::take_until(stream, s.shutdown.clone().cancelled_owned());
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

pub(super) async fn list_events(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Query(q): Query<Req<m::EventList>>,
) -> ApiResult<Vec<relay_protocol::event::Event>> {
    principal.may_read_all("the event log")?;
    let published = s.broker.last_seq();
    let (after, limit) = (q.after.unwrap_or(0), q.limit.unwrap_or(1000).min(10_000));
    let mut events = s
        .broker
        .store()
        .read_listing(move |st| st.events_after(after, limit))
        .await?;
    events.retain(|e| e.seq <= published);
    Ok(Json(events))
}

/// Every committed event over SSE (`id:` = global seq, `event:` = its type, `data:`
/// its JSON as the writer stored it: [`sse::event_frame`]), from `after` or the
/// `Last-Event-ID` header, without gaps or duplicates.
pub(super) async fn event_stream(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    Query(q): Query<Req<m::EventStream>>,
) -> Result<Response, HttpError> {
    principal.may_read_all("the event log")?;
    let after = resume_at(&headers, q.after)?.unwrap_or(0);
    let rx = crate::feed::follow(s.broker.clone(), after);
    let stream = ReceiverStream::new(rx).then(committed_frame);
    let stream = futures::StreamExt::take_until(stream, s.shutdown.clone().cancelled_owned());
    Ok(sse::response(stream))
}

/// `GET /v1/watch?flight=ID|agent=NAME|conversation=ID[&limit=N]` over SSE: first
/// `event: snapshot` (`id:` = the seq it is valid at), then each event of the scope
/// (`id:` = global seq, `event:` = its type). A flight's stream ends after the update
/// that makes it terminal; the others run until the client leaves. With `after=SEQ`
/// (not a flight's) the watch is resumed: `event: resumed`, then the scope's events
/// after SEQ. A `Last-Event-ID` header (a reconnecting client's: the id of the last
/// event it got, the snapshot's or an event's) resumes the same way.
pub(super) async fn watch_stream(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    Query(q): Query<Req<m::Watch>>,
) -> Result<Response, HttpError> {
    let scope = q
        .scope()
        .map_err(|m| HttpError::new(ErrorCode::InvalidRequest, m))?;
    {
        use relay_protocol::watch::Scope;
        match &scope {
            Scope::Fleet => principal.may_read_all("the fleet's watch")?,
            Scope::Flight(id) => principal.may_read_flight(&s.broker, id).await?,
            Scope::Agent(name) => principal.may_read_agent(name)?,
            Scope::Conversation { id, .. } => {
                principal.may_read_conversation(&s.broker, id).await?
            }
        }
    }
    let (first, rx) = match resume_at(&headers, q.after)? {
        // A watch that broke, resumed: a `resumed` event (`id:` = the seq resumed
        // after) instead of a snapshot, then the events after it.
        Some(after) => {
            let rx = crate::watch::resume(&s.broker, scope, after).await?;
            let first =
                sse::json_frame(Some(after), "resumed", &serde_json::json!({ "seq": after }));
            (first, rx)
        }
        None => {
            let (snapshot, rx) = crate::watch::watch(&s.broker, scope).await?;
            (
                sse::json_frame(Some(snapshot.seq), "snapshot", &snapshot),
                rx,
            )
        }
    };
    // The scope's events as the writer stored them, as `event_stream` sends them.
    let events = ReceiverStream::new(rx).then(committed_frame);
    let stream = tokio_stream::once(first).chain(events);
    let stream = futures::StreamExt::take_until(stream, s.shutdown.clone().cancelled_owned());
    Ok(sse::response(stream))
}

/// The `Last-Event-ID` a reconnecting client sends: the seq of the last event it got.
/// An empty one is no position (SSE clients send none after an empty `id:`); anything
/// else that is not a seq is refused, not taken as "from the start", which would replay
/// the whole log to a client that meant to continue.
pub(super) fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, HttpError> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    let text = value.to_str().map_err(|_| {
        HttpError::new(
            ErrorCode::InvalidRequest,
            "the Last-Event-ID header is not text; it is the seq of the last event received (a whole number)",
        )
    })?;
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse::<u64>().map(Some).map_err(|_| {
        HttpError::new(
            ErrorCode::InvalidRequest,
            format!(
                "the Last-Event-ID header {} is not an event seq; it is the seq of the last event received (a whole number), or leave it out to start from `after` (default 0)",
                quote(text)
            ),
        )
    })
}
