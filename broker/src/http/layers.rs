//! What runs before every route: the body read up to its limit and axum's plain-text
//! errors turned into the API's JSON errors (the bearer token is checked in `auth`).

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use relay_protocol::api::ErrorCode;
use tokio_stream::StreamExt;

use super::HttpError;

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
