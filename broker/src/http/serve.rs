//! Serving the API: accepting connections on the listener under [`HttpLimits`] (a request
//! head deadline, connection slots with a reserve for the operator, a write stall
//! timeout), and draining them on shutdown.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;
use relay_protocol::api::{ApiError, ErrorBody, ErrorCode};

use super::slots::{Prefixed, Slots, Watched};

/// Limits on the API's connections, against clients that open many and finish none.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    /// A connection that has not sent a whole request head (request line and headers)
    /// this long after it opened, or after its last answer, is closed. Only the head:
    /// a live stream, or a long request in progress, is not cut.
    pub header_read_timeout: Duration,
    /// Connections served at once for every client; past it, a new connection takes
    /// the place of the oldest that has not sent its request head yet, else a reserve
    /// slot, else it is answered `overloaded` and closed.
    pub max_connections: usize,
    /// Connections kept beyond `max_connections` for the operator's token and the
    /// dashboard's login: any other request on one is answered `overloaded`.
    pub reserved_connections: usize,
    /// SSE streams one agent's token may hold open at once; one more is answered
    /// `overloaded`.
    pub streams_per_agent: usize,
    /// A connection whose answer has waited this long for its client to read (a stream
    /// nobody reads) is closed.
    pub write_stall_timeout: Duration,
}

/// See [`HttpLimits::header_read_timeout`].
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// See [`HttpLimits::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// See [`HttpLimits::reserved_connections`].
pub const DEFAULT_RESERVED_CONNECTIONS: usize = 32;
/// See [`HttpLimits::streams_per_agent`].
pub const DEFAULT_STREAMS_PER_AGENT: usize = 32;
/// See [`HttpLimits::write_stall_timeout`].
pub const DEFAULT_WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a client refused for overload is told to wait (`Retry-After`, seconds).
pub(super) const RETRY_AFTER_SECS: u64 = 1;

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            reserved_connections: DEFAULT_RESERVED_CONNECTIONS,
            streams_per_agent: DEFAULT_STREAMS_PER_AGENT,
            write_stall_timeout: DEFAULT_WRITE_STALL_TIMEOUT,
        }
    }
}

/// Serves `app` on `listener` (HTTP/1.1) until `shutdown` fires, then stops accepting,
/// lets each open connection finish the request it is on (live streams end on
/// `shutdown` too) and returns once every connection is closed. A connection that does
/// not send its request head in time is closed, and one over the cap is refused (and
/// counted in `refusals`).
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: HttpLimits,
    shutdown: tokio_util::sync::CancellationToken,
    refusals: crate::broker::Refusals,
) {
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(hyper_util::rt::TokioTimer::new())
        // Capped at a day: a deadline past what `Instant` holds would panic.
        .header_read_timeout(limits.header_read_timeout.min(Duration::from_secs(86_400)));
    let slots = Slots::new(limits.max_connections, limits.reserved_connections);
    // Connections waiting for their first request head (a socket each, no slot), four
    // times as many as the slots; past that a new one pushes out the oldest.
    let unproven = Slots::new(
        (4 * (limits.max_connections + limits.reserved_connections)).max(MIN_UNPROVEN),
        0,
    );
    let head_deadline = limits.header_read_timeout.min(Duration::from_secs(86_400));
    let max = limits.max_connections + limits.reserved_connections;
    // Capped at a day, like the head deadline.
    let stall = limits.write_stall_timeout.min(Duration::from_secs(86_400));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    // Each connection's task, waited for after the graceful shutdown ended them.
    let connections = crate::tasks::Tasks::new(&shutdown);
    let full = Arc::new(std::sync::atomic::AtomicBool::new(false));
    loop {
        let mut stream = tokio::select! {
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
        // Never `None`: the oldest waiting one gives way.
        let Some(waiting) = unproven.admit() else {
            continue;
        };
        let (slots, http1, app, watcher) = (
            slots.clone(),
            http1.clone(),
            app.clone(),
            graceful.watcher(),
        );
        let (stop, full, refusals) = (shutdown.clone(), full.clone(), refusals.clone());
        connections.track(async move {
            // Its first request head, read before it takes a slot.
            let head = tokio::select! {
                head = read_head(&mut stream) => head,
                _ = waiting.conn.close.cancelled() => {
                    tracing::debug!("connection closed: a newer one took its place before it sent a request head");
                    None
                }
                _ = tokio::time::sleep(head_deadline) => None,
                _ = stop.cancelled() => None,
            };
            drop(waiting);
            let Some(head) = head else {
                return;
            };
            let Some(slot) = slots.admit() else {
                refusals.count(crate::broker::Full::Connections);
                if !full.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(
                        max,
                        "connection limit reached; refusing new connections until some close"
                    );
                }
                answer_and_close(&mut stream, &refusal(max)).await;
                return;
            };
            full.store(false, std::sync::atomic::Ordering::Relaxed);
            // Its slot is its own until it closes.
            slot.conn.proven();
            let conn_state = slot.conn.clone();
            let app = hyper_util::service::TowerToHyperService::new(app);
            // Each request carries its connection: the guard layer refuses a reserve
            // slot to anyone but the operator.
            let service = hyper::service::service_fn(
                move |mut req: axum::http::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(conn_state.clone());
                    hyper::service::Service::call(&app, req)
                },
            );
            let io = Prefixed {
                prefix: head,
                inner: Watched {
                    inner: stream,
                    conn: slot.conn.clone(),
                },
            };
            let conn = http1.serve_connection(hyper_util::rt::TokioIo::new(io), service);
            let conn = watcher.watch(conn);
            let state = slot.conn.clone();
            tokio::select! {
                ended = conn => if let Err(e) = ended {
                    tracing::debug!(error = %e, "connection ended");
                },
                _ = stalled(&state, stall) => {
                    tracing::warn!(
                        stalled_ms = stall.as_millis() as u64,
                        "closed a connection whose client stopped reading its answer"
                    );
                }
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    connections.stopped().await;
}

/// Resolves once `conn`'s writes have waited `stall` for its client to read.
async fn stalled(conn: &super::slots::Conn, stall: Duration) {
    let check = (stall / 4).max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(check).await;
        if conn.blocked_for().is_some_and(|waited| waited >= stall) {
            return;
        }
    }
}

/// Connections waiting for their first request head, at least (see `serve`).
const MIN_UNPROVEN: usize = 256;

/// Most bytes of a request head read before a connection takes a slot; a head that goes
/// on past it is answered `payload_too_large` and closed (it would hold a slot, proven,
/// while the HTTP parser waits for the rest).
const MAX_HEAD: usize = 64 * 1024;

/// Reads a connection's first request head (up to its blank line); `None` if it ends
/// first, or goes on past [`MAX_HEAD`] (answered first). Empty lines before the request
/// line are dropped, as HTTP skips them: they are no head, and would get a slot for a
/// connection that has sent nothing yet.
async fn read_head(stream: &mut tokio::net::TcpStream) -> Option<bytes::Bytes> {
    use tokio::io::AsyncReadExt;
    let mut head = bytes::BytesMut::new();
    loop {
        let blank = head
            .iter()
            .take_while(|b| matches!(b, b'\r' | b'\n'))
            .count();
        let _ = head.split_to(blank);
        if head.windows(4).any(|w| w == b"\r\n\r\n") {
            return Some(head.freeze());
        }
        if head.len() >= MAX_HEAD {
            let answer = closing_answer(
                ErrorCode::PayloadTooLarge,
                format!(
                    "the request head is over the broker's limit of {} KiB",
                    MAX_HEAD / 1024
                ),
            );
            answer_and_close(stream, &answer).await;
            return None;
        }
        match stream.read_buf(&mut head).await {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

/// The `overloaded` answer of a connection over the cap.
fn refusal(max: usize) -> String {
    closing_answer(
        ErrorCode::Overloaded,
        format!(
            "the broker serves at most {max} connections at once (some kept for the operator); retry when one has closed"
        ),
    )
}

/// An error answer written before the connection is served (then it is closed); an
/// `overloaded` one says when to retry.
fn closing_answer(code: ErrorCode, message: String) -> String {
    let body = serde_json::to_string(&ErrorBody {
        error: ApiError { code, message },
    })
    .unwrap_or_default();
    let status =
        StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let retry = match code {
        ErrorCode::Overloaded => format!("retry-after: {RETRY_AFTER_SECS}\r\n"),
        _ => String::new(),
    };
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{retry}connection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Writes `answer` to a connection not served (its request head was read: an HTTP client
/// takes an answer that comes before its request was sent as a broken connection), then
/// closes it.
async fn answer_and_close(stream: &mut tokio::net::TcpStream, answer: &str) {
    use tokio::io::AsyncWriteExt;
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(answer.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}
