//! What runs before every route: the guard (the connection's slot, `Host` and
//! `Origin`), the body read up to its limit, axum's plain-text errors turned into the
//! API's JSON errors, and the cap on each agent's streams (the bearer token is checked
//! in `auth`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::{MatchedPath, Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use relay_protocol::api::ErrorCode;
use relay_protocol::methods::{Answer, Verb};
use tokio_stream::StreamExt;

use super::slots::{Conn, Pool};
use super::{ApiState, HttpError, Principal};

/// How much more of a body over the limit is read (and dropped) before it is refused.
pub(super) const DRAIN_BYTES: usize = 4 * 1024 * 1024;

#[derive(Clone, Copy)]
pub(super) struct BodyLimit(pub(super) usize);

/// Reads the request body, up to the limit, before the route runs. A body over the limit
/// is refused with 413 only once it has been read to its end (up to [`DRAIN_BYTES`]
/// more, dropped as it comes): a connection closed with bytes still unread is reset,
/// and a client still sending its body would get the reset instead of the answer. A
/// client waiting for `100 Continue`, or one that declares a body too large to drain,
/// is answered at once.
pub(super) async fn read_body(
    State(limit): State<BodyLimit>,
    req: Request,
    next: Next,
) -> Response {
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
pub(super) async fn json_errors(req: Request, next: Next) -> Response {
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
        507 => ErrorCode::StorageFull,
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

/// An `overloaded` answer that closes the connection and says when to retry.
pub(super) fn overloaded(message: String) -> Response {
    let mut response = HttpError::new(ErrorCode::Overloaded, message).into_response();
    let headers = response.headers_mut();
    headers.insert(
        axum::http::header::RETRY_AFTER,
        axum::http::HeaderValue::from(super::serve::RETRY_AFTER_SECS),
    );
    headers.insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    response
}

/// Runs first for every request, the page's included: refuses a `Host` or `Origin` that
/// is not this broker's (see [`check_origin`]), and a request that is not the operator's
/// on a slot kept for the operator.
pub(super) async fn guard(State(s): State<ApiState>, req: Request, next: Next) -> Response {
    let conn = req.extensions().get::<Arc<Conn>>().cloned();
    if let Err(e) = check_origin(s.web.origin(), req.headers()) {
        let mut response = e.into_response();
        response.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
        return response;
    }
    if conn.is_some_and(|c| c.pool == Pool::Reserve) {
        match operators(&s, &req) {
            Operator::No => {
                return overloaded(
                    "the broker's connections are all in use; the few it keeps for the operator take the operator's token or a dashboard login"
                        .into(),
                );
            }
            // Anyone may send one (its code is checked by the page): the connection is
            // closed after it, or a client repeating it would keep the operator's slot.
            // A browser that logged in comes back with the cookie.
            Operator::LoginLink => {
                let mut response = next.run(req).await;
                response.headers_mut().insert(
                    axum::http::header::CONNECTION,
                    axum::http::HeaderValue::from_static("close"),
                );
                return response;
            }
            Operator::Yes => {}
        }
    }
    next.run(req).await
}

/// Whose a request on a reserve slot is.
enum Operator {
    /// The operator's token, or a dashboard login's cookie.
    Yes,
    /// A login link being spent (`/login`, no token or cookie): maybe the operator's.
    LoginLink,
    No,
}

/// Whether `req` is the operator's: its token, a dashboard login's cookie, or a login
/// link being spent.
fn operators(s: &ApiState, req: &Request) -> Operator {
    let headers = req.headers();
    let token = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    match token {
        Some(t) if crate::seal::token_matches(t.as_bytes(), s.token.as_bytes()) => Operator::Yes,
        Some(_) => Operator::No,
        None if s.web.login(headers).is_some() => Operator::Yes,
        None if req.uri().path() == "/login" => Operator::LoginLink,
        None => Operator::No,
    }
}

/// Defence in depth against DNS rebinding (a page of another site whose name was made
/// to point at 127.0.0.1): the `Host` must name this broker's port on a loopback name
/// (`127.0.0.1`, `localhost`, `[::1]`, or the address it listens on), and a browser's
/// `Origin`, when sent, must be that same `http://` origin.
pub(super) fn check_origin(origin: &str, headers: &HeaderMap) -> Result<(), HttpError> {
    let listen = origin.strip_prefix("http://").unwrap_or(origin);
    let port = listen.rsplit(':').next().unwrap_or_default();
    let allowed = [
        listen.to_string(),
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
    ];
    let text = |name| {
        headers
            .get(name)
            .map(|v| v.to_str().unwrap_or("(not text)"))
    };
    let host = text(axum::http::header::HOST).unwrap_or("");
    if !allowed.iter().any(|a| a.eq_ignore_ascii_case(host)) {
        return Err(HttpError::new(
            ErrorCode::InvalidRequest,
            format!(
                "the Host header {} is not this broker's address: use {} (other names are refused, against DNS rebinding)",
                crate::error::quote(host),
                allowed[1..].join(", ")
            ),
        ));
    }
    if let Some(from) = text(axum::http::header::ORIGIN) {
        if !from.eq_ignore_ascii_case(&format!("http://{host}")) {
            return Err(HttpError::new(
                ErrorCode::Unauthorized,
                format!(
                    "a request from the page of another origin ({}) is refused: only the dashboard at http://{host} may call the broker from a browser",
                    crate::error::quote(from)
                ),
            ));
        }
    }
    Ok(())
}

/// The SSE streams each agent's token holds open.
#[derive(Clone)]
pub(super) struct Streams {
    max: usize,
    held: Arc<Mutex<HashMap<String, usize>>>,
    /// Counts a stream refused (`relay_overloaded_total{what="streams"}`).
    refusals: crate::broker::Refusals,
}

impl Streams {
    pub(super) fn new(max: usize, refusals: crate::broker::Refusals) -> Streams {
        Streams {
            max,
            held: Arc::default(),
            refusals,
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One stream of an agent, counted until its answer's body is dropped.
struct Held {
    streams: Streams,
    agent: String,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.streams.held();
        if let Some(n) = held.get_mut(&self.agent) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.agent);
            }
        }
    }
}

/// Caps the SSE streams an agent's token holds at once (the operator's are not
/// counted: its connections have their reserve): one past the cap is answered
/// `overloaded`, naming the cap.
pub(super) async fn cap_streams(
    State(streams): State<Streams>,
    req: Request,
    next: Next,
) -> Response {
    let is_stream = req
        .extensions()
        .get::<MatchedPath>()
        .and_then(|route| relay_protocol::methods::by_route(Verb::Get, route.as_str()))
        .is_some_and(|m| m.answer == Answer::Stream && req.method() == axum::http::Method::GET);
    let agent = match req.extensions().get::<Principal>() {
        Some(Principal::Agent(name)) if is_stream => name.clone(),
        _ => return next.run(req).await,
    };
    {
        let mut held = streams.held();
        let n = held.entry(agent.clone()).or_default();
        if *n >= streams.max {
            streams.refusals.count(crate::broker::Full::Streams);
            let max = streams.max;
            return overloaded(format!(
                "agent {}'s token holds {max} streams open already, the most one agent may; close one first",
                crate::error::quote(&agent)
            ));
        }
        *n += 1;
    }
    let held = Held { streams, agent };
    let response = next.run(req).await;
    let (parts, body) = response.into_parts();
    // The count goes down when the stream's body is dropped: its client left, or it ended.
    let body = body.into_data_stream().map(move |chunk| {
        let _ = &held;
        chunk
    });
    Response::from_parts(parts, axum::body::Body::from_stream(body))
}

/// Runs the request in a span `request` naming its method from the method table
/// (`method = "flight.show"`; a route outside the table by its path) and its route, so
/// every line logged while serving it says which call it was.
pub(super) async fn span(req: Request, next: Next) -> Response {
    use tracing::Instrument;
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|r| r.as_str().to_string());
    let verb = match *req.method() {
        axum::http::Method::GET => Some(Verb::Get),
        axum::http::Method::POST => Some(Verb::Post),
        axum::http::Method::DELETE => Some(Verb::Delete),
        _ => None,
    };
    let method = match (verb, route.as_deref()) {
        (Some(v), Some(r)) => relay_protocol::methods::by_route(v, r).map(|m| m.name),
        _ => None,
    };
    let span = tracing::info_span!(
        "request",
        method = method.unwrap_or_else(|| route.as_deref().unwrap_or("unrouted")),
        http = %req.method(),
        route = route.as_deref().unwrap_or(""),
    );
    async {
        let response = next.run(req).await;
        // An access log, for whoever turns debug on.
        tracing::debug!(status = response.status().as_u16(), "answered");
        response
    }
    .instrument(span)
    .await
}
