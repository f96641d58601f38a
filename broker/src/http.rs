//! The local HTTP API: JSON over HTTP/1.1 on loopback, every route behind a bearer token,
//! live streams over SSE. Routes are listed in `broker/README.md`.
//!
//! [`serve`] accepts the connections under [`HttpLimits`] (a deadline for each request
//! head, a cap on connections); [`router`] reads each request's body up to the limit
//! before its route runs, and answers every route.
//!
//! Every error is `{"error":{"code","message"}}` with the status of its code, including
//! the ones axum itself would answer in plain text (bad JSON, body too large).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::Stream;
use relay_protocol::api::{
    ApiError, DecideApproval, ErrorBody, ErrorCode, MessagePosted, NatsStatus, SteerRequest,
    UpdateFlight,
};
use relay_protocol::domain::{
    Agent, AgentSpec, Approval, ApprovalState, Conversation, ConversationSpec, Flight, FlightState,
    InvokeRequest, PostMessage,
};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use crate::broker::Broker;
use crate::error::{clip, quote, BrokerError, MAX_ERROR_MESSAGE};
use crate::ports::FlightControl;
use crate::seal::token_matches;
use crate::store::T;

/// Reports the NATS connection for `GET /v1/status`.
pub type NatsStatusFn = Arc<dyn Fn() -> NatsStatus + Send + Sync>;

#[derive(Clone)]
pub struct ApiState {
    pub broker: Broker,
    pub token: Arc<str>,
    pub data_dir: String,
    pub control: Option<Arc<dyn FlightControl>>,
    pub nats: Option<NatsStatusFn>,
    /// Ends live streams, so a graceful shutdown does not wait on open SSE clients.
    pub shutdown: tokio_util::sync::CancellationToken,
}

/// An error as the API answers it.
pub struct HttpError(ApiError);

impl From<BrokerError> for HttpError {
    fn from(e: BrokerError) -> Self {
        if e.code() == ErrorCode::Internal {
            tracing::error!(error = %e, "internal error");
        }
        HttpError(e.to_api())
    }
}

impl HttpError {
    /// An error; a message longer than [`MAX_ERROR_MESSAGE`] (one that quotes input on
    /// its own, like a JSON parser's) is cut.
    fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        HttpError(ApiError {
            code,
            message: clip(&message.into(), MAX_ERROR_MESSAGE),
        })
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.0.code.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
        (status, Json(ErrorBody { error: self.0 })).into_response()
    }
}

type ApiResult<T> = Result<Json<T>, HttpError>;

/// `axum::Json`, but its rejections are typed API errors.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = HttpError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(ApiJson(v)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

fn json_rejection(r: JsonRejection) -> HttpError {
    if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
        HttpError::new(
            ErrorCode::PayloadTooLarge,
            "the request body is over the broker's size limit",
        )
    } else {
        HttpError::new(ErrorCode::InvalidRequest, r.body_text())
    }
}

/// Limits on the API's connections, against clients that open many and finish none.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    /// A connection that has not sent a whole request head (request line and headers)
    /// this long after it opened, or after its last answer, is closed. Only the head:
    /// a live stream, or a long request in progress, is not cut.
    pub header_read_timeout: Duration,
    /// Connections served at once; one more is answered `overloaded` and closed.
    pub max_connections: usize,
}

/// See [`HttpLimits::header_read_timeout`].
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// See [`HttpLimits::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// Serves `app` on `listener` (HTTP/1.1) until `shutdown` fires, then stops accepting,
/// lets each open connection finish the request it is on (live streams end on
/// `shutdown` too) and returns once every connection is closed. A connection that does
/// not send its request head in time is closed, and one over the cap is refused.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: HttpLimits,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(hyper_util::rt::TokioTimer::new())
        // Capped at a day: a deadline past what `Instant` holds would panic.
        .header_read_timeout(limits.header_read_timeout.min(Duration::from_secs(86_400)));
    let slots = Arc::new(tokio::sync::Semaphore::new(
        limits
            .max_connections
            .min(tokio::sync::Semaphore::MAX_PERMITS),
    ));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut full = false;
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    if !matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionAborted
                            | std::io::ErrorKind::ConnectionReset
                            | std::io::ErrorKind::ConnectionRefused
                    ) {
                        // Out of file descriptors, say: wait for some to close rather
                        // than spin.
                        tracing::error!(error = %e, "cannot accept a connection");
                        tokio::select! {
                            _ = shutdown.cancelled() => break,
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        }
                    }
                    continue;
                }
            },
        };
        // Small writes (an SSE event, a delta) go out at once instead of waiting for
        // the client's delayed ACK (Nagle: ~40 ms on the first delta of `relay ask`).
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            if !full {
                tracing::warn!(
                    max = limits.max_connections,
                    "connection limit reached; refusing new connections until some close"
                );
                full = true;
            }
            refuse(&stream, limits.max_connections);
            continue;
        };
        full = false;
        let conn = http1.serve_connection(
            hyper_util::rt::TokioIo::new(stream),
            hyper_util::service::TowerToHyperService::new(app.clone()),
        );
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Answers a connection over the cap `overloaded` (then it is closed), without reading
/// from it or waiting on it: a new connection's send buffer is empty, so the short
/// answer goes out at once or not at all.
fn refuse(stream: &tokio::net::TcpStream, max: usize) {
    let code = ErrorCode::Overloaded;
    let body = serde_json::to_string(&ErrorBody {
        error: ApiError {
            code,
            message: format!(
                "the broker serves at most {max} connections at once; retry when one has closed"
            ),
        },
    })
    .unwrap_or_default();
    let status =
        StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.try_write(response.as_bytes());
}

/// The router, with the token guard and the body limit applied to every route.
pub fn router(state: ApiState, max_body_bytes: usize) -> Router {
    Router::new()
        .route("/v1/status", get(status))
        .route("/v1/agents", get(list_agents).post(add_agent))
        .route("/v1/agents/{name}", get(show_agent).delete(remove_agent))
        .route("/v1/agents/{name}/wake", post(wake_agent))
        .route(
            "/v1/conversations",
            get(list_conversations).post(add_conversation),
        )
        .route("/v1/conversations/{id}/messages", get(read_messages))
        .route("/v1/messages", post(post_message))
        .route("/v1/invocations", post(invoke))
        .route("/v1/flights", get(list_flights))
        .route("/v1/flights/{id}", get(show_flight))
        .route(
            "/v1/flights/{id}/updates",
            get(flight_updates).post(update_flight),
        )
        .route("/v1/flights/{id}/stream", get(flight_stream))
        .route("/v1/flights/{id}/steer", post(steer))
        .route("/v1/flights/{id}/interrupt", post(interrupt))
        .route("/v1/approvals", get(list_approvals))
        .route("/v1/approvals/{id}", post(decide_approval))
        .route("/v1/events", get(list_events))
        .route("/v1/events/stream", get(event_stream))
        .fallback(|| async {
            HttpError::new(
                ErrorCode::NotFound,
                "no such route (the routes are listed in broker/README.md)",
            )
        })
        .layer(middleware::from_fn_with_state(
            BodyLimit(max_body_bytes),
            read_body,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), require_token))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(middleware::from_fn(json_errors))
        .with_state(state)
}

/// How much more of a body over the limit is read (and dropped) before it is refused.
const DRAIN_BYTES: usize = 4 * 1024 * 1024;

#[derive(Clone, Copy)]
struct BodyLimit(usize);

/// Reads the request body, up to the limit, before the route runs. A body over the limit
/// is refused with 413 only once it has been read to its end (up to [`DRAIN_BYTES`]
/// more, dropped as it comes): a connection closed with bytes still unread is reset,
/// and a client still sending its body would get the reset instead of the answer. A
/// client waiting for `100 Continue`, or one that declares a body too large to drain,
/// is answered at once.
async fn read_body(State(limit): State<BodyLimit>, req: Request, next: Next) -> Response {
    let BodyLimit(limit) = limit;
    let too_large = || {
        HttpError::new(
            ErrorCode::PayloadTooLarge,
            format!("the request body is over the broker's limit of {limit} bytes"),
        )
        .into_response()
    };
    let (parts, body) = req.into_parts();
    let header = |name| parts.headers.get(name).and_then(|v| v.to_str().ok());
    let declared = header(axum::http::header::CONTENT_LENGTH).and_then(|v| v.parse::<usize>().ok());
    let waits_to_send =
        header(axum::http::header::EXPECT).is_some_and(|v| v.eq_ignore_ascii_case("100-continue"));
    let mut data = body.into_data_stream();
    if let Some(size) = declared.filter(|size| *size > limit) {
        if waits_to_send || size > limit.saturating_add(DRAIN_BYTES) {
            // Unread, the body ends the connection: say so, or a client that pools
            // connections would send its next request on one that is closing.
            let mut response = too_large();
            response.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
            return response;
        }
        while data.next().await.is_some_and(|chunk| chunk.is_ok()) {}
        return too_large();
    }
    let mut read = bytes::BytesMut::new();
    while let Some(chunk) = data.next().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(e) => {
                return HttpError::new(
                    ErrorCode::InvalidRequest,
                    format!("the request body could not be read: {e}"),
                )
                .into_response()
            }
        };
        if read.len() + chunk.len() > limit {
            let mut size = read.len() + chunk.len();
            while size <= limit.saturating_add(DRAIN_BYTES) {
                match data.next().await {
                    Some(Ok(chunk)) => size += chunk.len(),
                    _ => break,
                }
            }
            return too_large();
        }
        read.extend_from_slice(&chunk);
    }
    next.run(Request::from_parts(
        parts,
        axum::body::Body::from(read.freeze()),
    ))
    .await
}

/// Turns the errors axum answers in plain text (a bad query string or path parameter, a
/// wrong method) into the API's `{"error":{"code","message"}}`, keeping their status.
async fn json_errors(req: Request, next: Next) -> Response {
    let response = next.run(req).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let body = axum::body::to_bytes(response.into_body(), 64 * 1024)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body).trim().to_string();
    let code = match status.as_u16() {
        401 => ErrorCode::Unauthorized,
        404 => ErrorCode::NotFound,
        413 => ErrorCode::PayloadTooLarge,
        429 => ErrorCode::Overloaded,
        503 => ErrorCode::Unavailable,
        s if s >= 500 => ErrorCode::Internal,
        _ => ErrorCode::InvalidRequest,
    };
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_string()
    } else {
        text
    };
    (status, HttpError::new(code, message)).into_response()
}

async fn require_token(
    State(state): State<ApiState>,
    headers: HeaderMap,
    req: Request,
    next: Next,
) -> Response {
    let given = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        // The scheme is case-insensitive (RFC 9110).
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    let mut refused = match given {
        Some(t) if token_matches(t.as_bytes(), state.token.as_bytes()) => {
            return next.run(req).await
        }
        Some(_) => {
            HttpError::new(ErrorCode::Unauthorized, "the bearer token is wrong").into_response()
        }
        None => HttpError::new(
            ErrorCode::Unauthorized,
            "a bearer token is required (Authorization: Bearer <token from api.json>)",
        )
        .into_response(),
    };
    // A client without the token gets no kept-alive connection to hold a slot with.
    refused.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    refused
}

async fn status(State(s): State<ApiState>) -> ApiResult<relay_protocol::api::Status> {
    // Counters kept by the broker: status never scans, however many flights.
    let counts = s.broker.counts();
    Ok(Json(relay_protocol::api::Status {
        version: env!("CARGO_PKG_VERSION").into(),
        data_dir: s.data_dir.clone(),
        last_seq: s.broker.last_seq(),
        agents: counts.agents,
        flights: counts.flights,
        live_flights: counts.live_flights,
        nats: s.nats.as_ref().map(|f| f()).unwrap_or(NatsStatus::Disabled),
        uptime_ms: s.broker.uptime_ms(),
        flushes: s.broker.flushes(),
    }))
}

/// Starts the agent's session (a `manual` agent needs this before its first turn).
async fn wake_agent(State(s): State<ApiState>, Path(name): Path<String>) -> ApiResult<Agent> {
    let agent = s
        .broker
        .agent(&name)
        .await?
        .ok_or_else(|| BrokerError::UnknownAgent(name.clone()))?;
    let control = s
        .control
        .clone()
        .ok_or_else(|| BrokerError::Unavailable("no runtime serves this broker".into()))?;
    control.wake(agent.clone()).await?;
    Ok(Json(agent))
}

async fn list_agents(State(s): State<ApiState>) -> ApiResult<Vec<Agent>> {
    Ok(Json(
        s.broker.store().read(|st| st.values(T::Agents)).await?,
    ))
}

async fn add_agent(
    State(s): State<ApiState>,
    ApiJson(spec): ApiJson<AgentSpec>,
) -> ApiResult<Agent> {
    Ok(Json(s.broker.register_agent(spec).await?))
}

async fn show_agent(State(s): State<ApiState>, Path(name): Path<String>) -> ApiResult<Agent> {
    Ok(Json(
        s.broker
            .agent(&name)
            .await?
            .ok_or(BrokerError::UnknownAgent(name))?,
    ))
}

async fn remove_agent(State(s): State<ApiState>, Path(name): Path<String>) -> ApiResult<Agent> {
    Ok(Json(s.broker.remove_agent(&name).await?))
}

async fn list_conversations(State(s): State<ApiState>) -> ApiResult<Vec<Conversation>> {
    Ok(Json(
        s.broker
            .store()
            .read(|st| st.values(T::Conversations))
            .await?,
    ))
}

async fn add_conversation(
    State(s): State<ApiState>,
    ApiJson(spec): ApiJson<ConversationSpec>,
) -> ApiResult<Conversation> {
    Ok(Json(s.broker.create_conversation(spec).await?))
}

#[derive(Deserialize)]
struct ReadQuery {
    limit: Option<usize>,
}

async fn read_messages(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    Query(q): Query<ReadQuery>,
) -> ApiResult<Vec<relay_protocol::domain::Message>> {
    let limit = q.limit.unwrap_or(50);
    let messages = s
        .broker
        .store()
        .read(move |store| {
            if store.conversation(&id)?.is_none() {
                return Err(BrokerError::UnknownConversation(id));
            }
            store.messages(&id, limit)
        })
        .await?;
    Ok(Json(messages))
}

async fn post_message(
    State(s): State<ApiState>,
    ApiJson(post): ApiJson<PostMessage>,
) -> ApiResult<MessagePosted> {
    Ok(Json(MessagePosted {
        message: s.broker.post_message(post).await?,
    }))
}

async fn invoke(
    State(s): State<ApiState>,
    ApiJson(req): ApiJson<InvokeRequest>,
) -> ApiResult<relay_protocol::api::InvokeAccepted> {
    Ok(Json(s.broker.invoke(req).await?))
}

#[derive(Deserialize)]
struct FlightQuery {
    agent: Option<String>,
    state: Option<FlightState>,
    /// Only flights not in a terminal state.
    #[serde(default)]
    live: bool,
    limit: Option<usize>,
}

async fn list_flights(
    State(s): State<ApiState>,
    Query(q): Query<FlightQuery>,
) -> ApiResult<Vec<Flight>> {
    // Flight ids are time-ordered; newest last, and `limit` keeps the newest. Live
    // flights come from their index; others from the newest back, up to `limit`.
    let limit = q.limit.unwrap_or(100);
    let keep = move |f: &Flight| {
        q.agent.as_ref().is_none_or(|a| &f.agent == a)
            && q.state.is_none_or(|st| f.state == st)
            && (!q.live || !f.state.is_terminal())
    };
    let live = q.live;
    let out = s
        .broker
        .store()
        .read(move |st| {
            if live {
                let mut out: Vec<Flight> = st.live_flights()?.into_iter().filter(keep).collect();
                out.drain(..out.len().saturating_sub(limit));
                Ok(out)
            } else {
                st.recent_flights(limit, keep)
            }
        })
        .await?;
    Ok(Json(out))
}

async fn show_flight(State(s): State<ApiState>, Path(id): Path<String>) -> ApiResult<Flight> {
    Ok(Json(
        s.broker
            .flight(&id)
            .await?
            .ok_or(BrokerError::UnknownFlight(id))?,
    ))
}

#[derive(Deserialize)]
struct AfterQuery {
    after: Option<u64>,
    limit: Option<usize>,
}

async fn flight_updates(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    Query(q): Query<AfterQuery>,
) -> ApiResult<Vec<relay_protocol::domain::FlightUpdate>> {
    let after = q.after.unwrap_or(0);
    let updates = s
        .broker
        .store()
        .read(move |store| {
            if store.flight(&id)?.is_none() {
                return Err(BrokerError::UnknownFlight(id));
            }
            store.flight_updates(&id, after)
        })
        .await?;
    Ok(Json(updates))
}

async fn update_flight(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<UpdateFlight>,
) -> ApiResult<relay_protocol::api::UpdateResult> {
    Ok(Json(s.broker.update_flight(&id, body.change).await?))
}

fn sse_json<T: serde::Serialize>(id: u64, kind: &str, v: &T) -> SseEvent {
    SseEvent::default()
        .id(id.to_string())
        .event(kind)
        .json_data(v)
        .unwrap_or_else(|_| SseEvent::default().event("error").data("unserializable"))
}

/// Updates of one flight over SSE (`event: update`, `id:` = per-flight seq), from
/// `after`, ending after the update that makes the flight terminal.
async fn flight_stream(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    Query(q): Query<AfterQuery>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, HttpError> {
    let flight = s
        .broker
        .flight(&id)
        .await?
        .ok_or_else(|| BrokerError::UnknownFlight(id.clone()))?;
    let rx = crate::feed::follow_flight(s.broker.clone(), flight, q.after.unwrap_or(0));
    let stream = ReceiverStream::new(rx).map(|item| {
        Ok(match item {
            Ok(update) => sse_json(update.seq, "update", &update),
            Err(e) => sse_json(0, "error", &ErrorBody { error: e.to_api() }),
        })
    });
    let stream = futures::StreamExt::take_until(stream, s.shutdown.clone().cancelled_owned());
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

async fn steer(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<SteerRequest>,
) -> ApiResult<Flight> {
    Ok(Json(
        crate::ops::steer(&s.broker, s.control.as_ref(), &id, body.text).await?,
    ))
}

async fn interrupt(State(s): State<ApiState>, Path(id): Path<String>) -> ApiResult<Flight> {
    Ok(Json(
        crate::ops::interrupt(&s.broker, s.control.as_ref(), &id).await?,
    ))
}

#[derive(Deserialize)]
struct ApprovalQuery {
    /// `pending` (default), `decided`, `expired` or `all`.
    state: Option<String>,
}

async fn list_approvals(
    State(s): State<ApiState>,
    Query(q): Query<ApprovalQuery>,
) -> ApiResult<Vec<Approval>> {
    let all: Vec<Approval> = s.broker.store().read(|st| st.values(T::Approvals)).await?;
    let want = match q.state.as_deref().unwrap_or("pending") {
        "pending" => Some(ApprovalState::Pending),
        "decided" => Some(ApprovalState::Decided),
        "expired" => Some(ApprovalState::Expired),
        "all" => None,
        other => {
            return Err(HttpError::new(
                ErrorCode::InvalidRequest,
                format!(
                    "unknown approval state {}; use pending, decided, expired or all",
                    quote(other)
                ),
            ))
        }
    };
    Ok(Json(
        all.into_iter()
            .filter(|a| want.is_none_or(|w| a.state == w))
            .collect(),
    ))
}

async fn decide_approval(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<DecideApproval>,
) -> ApiResult<Approval> {
    Ok(Json(
        crate::ops::decide(
            &s.broker,
            s.control.as_ref(),
            &id,
            body.decision,
            &body.decided_by,
            false,
        )
        .await?,
    ))
}

async fn list_events(
    State(s): State<ApiState>,
    Query(q): Query<AfterQuery>,
) -> ApiResult<Vec<relay_protocol::event::Event>> {
    let published = s.broker.last_seq();
    let (after, limit) = (q.after.unwrap_or(0), q.limit.unwrap_or(1000).min(10_000));
    let mut events = s
        .broker
        .store()
        .read(move |st| st.events_after(after, limit))
        .await?;
    events.retain(|e| e.seq <= published);
    Ok(Json(events))
}

/// Every committed event over SSE (`id:` = global seq, `event:` = its type), from
/// `after` or the `Last-Event-ID` header, without gaps or duplicates.
async fn event_stream(
    State(s): State<ApiState>,
    headers: HeaderMap,
    Query(q): Query<AfterQuery>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, HttpError> {
    let last_id = last_event_id(&headers)?;
    let after = q.after.or(last_id).unwrap_or(0);
    let rx = crate::feed::follow(s.broker.clone(), after);
    let stream = ReceiverStream::new(rx).map(|item| {
        Ok(match item {
            Ok(event) => sse_json(event.seq, event.body.type_name(), &*event),
            Err(e) => sse_json(0, "error", &ErrorBody { error: e.to_api() }),
        })
    });
    let stream = futures::StreamExt::take_until(stream, s.shutdown.clone().cancelled_owned());
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// The `Last-Event-ID` a reconnecting client sends: the seq of the last event it got.
/// An empty one is no position (SSE clients send none after an empty `id:`); anything
/// else that is not a seq is refused, not taken as "from the start", which would replay
/// the whole log to a client that meant to continue.
fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, HttpError> {
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
