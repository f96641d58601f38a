//! Serving the API: accepting connections on the listener under [`HttpLimits`] (a request
//! head deadline, connection slots with a reserve for the operator, a write stall
//! timeout), and draining them on shutdown.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;
use relay_protocol::api::{ApiError, ErrorBody, ErrorCode};

use super::slots::{Slots, Watched};

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
    let slots = Slots::new(limits.max_connections, limits.reserved_connections);
    let patience = Arc::new(tokio::sync::Semaphore::new(PATIENT_REFUSALS));
    // Capped at a day, like the head deadline.
    let stall = limits.write_stall_timeout.min(Duration::from_secs(86_400));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    // Each connection's task, waited for after the graceful shutdown ended them.
    let connections = crate::tasks::Tasks::new(&shutdown);
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
        let Some(slot) = slots.admit() else {
            if !full {
                tracing::warn!(
                    max = limits.max_connections,
                    "connection limit reached; refusing new connections until some close"
                );
                full = true;
            }
            refuse(
                stream,
                limits.max_connections + limits.reserved_connections,
                &patience,
                &connections,
            );
            continue;
        };
        full = false;
        let conn_state = slot.conn.clone();
        let app = hyper_util::service::TowerToHyperService::new(app.clone());
        // Each request carries its connection: the guard layer marks it proven and
        // refuses a reserve slot to anyone but the operator.
        let service = hyper::service::service_fn(
            move |mut req: axum::http::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(conn_state.clone());
                hyper::service::Service::call(&app, req)
            },
        );
        let io = Watched {
            inner: stream,
            conn: slot.conn.clone(),
        };
        let conn = http1.serve_connection(hyper_util::rt::TokioIo::new(io), service);
        let conn = graceful.watch(conn);
        connections.track(async move {
            let state = slot.conn.clone();
            tokio::select! {
                ended = conn => if let Err(e) = ended {
                    tracing::debug!(error = %e, "connection ended");
                },
                _ = state.close.cancelled() => {
                    tracing::debug!("connection closed: a new one took its slot before it sent a request");
                }
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

/// Refusals that wait for the request head before answering, at most at once; past
/// that a refusal is answered at once (see [`refuse`]).
const PATIENT_REFUSALS: usize = 64;
/// How long a refusal waits for the request head.
const REFUSAL_WAIT: Duration = Duration::from_millis(500);
/// Most bytes of a refused request read (and dropped).
const REFUSAL_READ: usize = 16 * 1024;

/// Answers a connection over the cap `overloaded` (then it is closed). An HTTP client
/// takes an answer that comes before its request was sent as a broken connection, so
/// the refusal first reads the request head, for a moment, on a bounded number of tasks
/// (`patience`); past that, or if the head does not come, it answers at once.
fn refuse(
    mut stream: tokio::net::TcpStream,
    max: usize,
    patience: &Arc<tokio::sync::Semaphore>,
    tasks: &crate::tasks::Tasks,
) {
    let response = refusal(max);
    let Ok(permit) = patience.clone().try_acquire_owned() else {
        let _ = stream.try_write(response.as_bytes());
        return;
    };
    tasks.track(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        let _ = tokio::time::timeout(REFUSAL_WAIT, async {
            while head.len() < REFUSAL_READ && !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await;
        let _ = tokio::time::timeout(REFUSAL_WAIT, async {
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        })
        .await;
        drop(permit);
    });
}

/// The `overloaded` answer of a connection over the cap.
fn refusal(max: usize) -> String {
    let code = ErrorCode::Overloaded;
    let body = serde_json::to_string(&ErrorBody {
        error: ApiError {
            code,
            message: format!(
                "the broker serves at most {max} connections at once (some kept for the operator); retry when one has closed"
            ),
        },
    })
    .unwrap_or_default();
    let status =
        StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: {RETRY_AFTER_SECS}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}
