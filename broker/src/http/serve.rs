//! Serving the API: accepting connections on the listener under [`HttpLimits`] (a request
//! head deadline, a connection cap), and draining them on shutdown.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;
use relay_protocol::api::{ApiError, ErrorBody, ErrorCode};

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
        connections.track(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    connections.stopped().await;
}

/// Answers a connection over the cap `overloaded` (then it is closed), without reading
/// from it or waiting on it: a new connection's send buffer is empty, so the short
/// answer goes out at once or not at all.
pub(super) fn refuse(stream: &tokio::net::TcpStream, max: usize) {
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
