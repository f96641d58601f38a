//! The NATS connection: its settings ([`NatsConfig`]), [`connect`] with backoff, the
//! [`Tracker`] of its state for `relay status`, and the flight stream's setup.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use relay_infra::retry::{self, Retryable};
use relay_protocol::api::NatsStatus;
use relay_protocol::bus::subjects;
use relay_protocol::clock::now_ms;
use tokio_util::sync::CancellationToken;

/// How long the flight stream remembers `Nats-Msg-Id`s to drop a re-published update.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

#[derive(Debug, Clone)]
pub enum NatsAuth {
    None,
    Creds(PathBuf),
    UserPassword(String, String),
    Token(String),
}

#[derive(Debug, Clone)]
pub struct NatsConfig {
    pub url: String,
    pub auth: NatsAuth,
    /// How long the flight stream keeps updates.
    pub stream_max_age: Duration,
    /// Most bytes the flight stream keeps (oldest dropped first).
    pub stream_max_bytes: i64,
    /// When set, every request must carry it in the [`TOKEN_HEADER`].
    pub request_token: Option<String>,
    /// Where replies to this connection go instead of `_INBOX.>` (a node uses its own,
    /// so NATS permissions can give it only its replies).
    pub inbox_prefix: Option<String>,
}

impl NatsConfig {
    /// Whether anyone who reaches the server may publish requests the broker takes:
    /// no credentials (so the server lets strangers in) and no request token. An open
    /// bus is served for what a client does as itself only (see `service`).
    pub fn is_open(&self) -> bool {
        self.request_token.is_none() && matches!(self.auth, NatsAuth::None)
    }

    /// A connection to `url`, with the default stream limits and no request token.
    pub fn new(url: String, auth: NatsAuth) -> NatsConfig {
        NatsConfig {
            url,
            auth,
            stream_max_age: Duration::from_secs(7 * 24 * 3600),
            stream_max_bytes: 1 << 30,
            request_token: None,
            inbox_prefix: None,
        }
    }
}

/// The connection's state for `relay status`, kept current by the client's events.
#[derive(Clone)]
pub struct Tracker {
    url: String,
    state: Arc<Mutex<NatsStatus>>,
}

impl Tracker {
    /// Starts out disconnected from `url` (its credentials left out).
    pub fn new(url: &str) -> Tracker {
        let url = redact_url(url);
        Tracker {
            state: Arc::new(Mutex::new(NatsStatus::Disconnected {
                url: url.clone(),
                since_ms: now_ms(),
                error: None,
            })),
            url,
        }
    }

    pub fn status(&self) -> NatsStatus {
        self.state
            .lock()
            .map(|s| s.clone())
            .unwrap_or(NatsStatus::Disabled)
    }

    fn set_connected(&self) {
        self.set(NatsStatus::Connected {
            url: self.url.clone(),
        });
    }

    fn set_disconnected(&self, error: Option<String>) {
        let since_ms = match self.status() {
            NatsStatus::Disconnected { since_ms, .. } => since_ms,
            _ => now_ms(),
        };
        self.set(NatsStatus::Disconnected {
            url: self.url.clone(),
            since_ms,
            error,
        });
    }

    fn set(&self, next: NatsStatus) {
        if let Ok(mut s) = self.state.lock() {
            if *s != next {
                tracing::info!(state = ?next, "nats connection");
            }
            *s = next;
        }
    }
}

/// `url` without the user and password it may carry (`nats://u:p@host` -> `nats://host`),
/// for status and logs; each of a comma-separated list.
pub fn redact_url(url: &str) -> String {
    url.split(',')
        .map(|one| {
            let (scheme, rest) = match one.split_once("://") {
                Some((scheme, rest)) => (Some(scheme), rest),
                None => (None, one),
            };
            let host_end = rest.find('/').unwrap_or(rest.len());
            let rest = match rest[..host_end].rfind('@') {
                Some(at) => &rest[at + 1..],
                None => rest,
            };
            match scheme {
                Some(scheme) => format!("{scheme}://{rest}"),
                None => rest.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Why [`connect`] gave up.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The server refused the credentials: retrying will not help.
    #[error("NATS at {url} refused the credentials ({reason}); check --nats-creds, --nats-user/--nats-password or --nats-token")]
    Refused { url: String, reason: String },
    /// No connection within the patience given.
    #[error("cannot connect to NATS at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    /// The credentials file or another option is unusable.
    #[error("{0}")]
    Config(String),
    #[error("stopped before NATS was reachable")]
    Stopped,
}

/// Waits between tries to reach NATS.
const CONNECT_BACKOFF: retry::ExponentialBuilder =
    retry::forever(Duration::from_millis(100), Duration::from_secs(5));

/// Connects, failing at once on refused credentials and retrying other failures with
/// backoff for up to `patience` (`None`: until `stop` fires). Once connected, the client
/// reconnects by itself forever, with backoff, and `tracker` follows its state.
pub async fn connect(
    config: &NatsConfig,
    name: &str,
    tracker: &Tracker,
    patience: Option<Duration>,
    stop: &CancellationToken,
) -> Result<async_nats::Client, ConnectError> {
    let url = redact_url(&config.url);
    let deadline = patience.map(|p| tokio::time::Instant::now() + p);
    // Each try owns what it needs: a future borrowing from this one would not be `Send`
    // to the compiler, through backon's generic types.
    let attempt = || {
        connect_once(
            config.clone(),
            name.to_string(),
            tracker.clone(),
            url.clone(),
        )
    };
    retry::until_stopped(stop, |sleeper| {
        attempt
            .retry(CONNECT_BACKOFF)
            .sleep(sleeper)
            .when(|e| matches!(e, ConnectError::Unreachable { .. }))
            // With a patience, no wait that would end past it: give up instead.
            .adjust(|_, wait| {
                wait.filter(|w| deadline.is_none_or(|d| tokio::time::Instant::now() + *w <= d))
            })
            .notify(|e, wait| {
                if let ConnectError::Unreachable { reason, .. } = e {
                    tracing::warn!(%url, error = %reason, retry_in = ?wait, "NATS not reachable yet; retrying");
                }
            })
    })
    .await
    .unwrap_or(Err(ConnectError::Stopped))
}

/// One try of [`connect`]: `Unreachable` is worth another.
async fn connect_once(
    config: NatsConfig,
    name: String,
    tracker: Tracker,
    url: String,
) -> Result<async_nats::Client, ConnectError> {
    let t = tracker.clone();
    let mut options = async_nats::ConnectOptions::new()
        .name(name)
        .max_reconnects(None)
        .event_callback(move |event| {
            let t = t.clone();
            async move {
                match event {
                    async_nats::Event::Connected => t.set_connected(),
                    async_nats::Event::Disconnected => t.set_disconnected(None),
                    other => tracing::info!(event = %other, "nats"),
                }
            }
        });
    if let Some(prefix) = &config.inbox_prefix {
        options = options.custom_inbox_prefix(prefix.as_str());
    }
    options = match &config.auth {
        NatsAuth::None => options,
        NatsAuth::Creds(path) => options.credentials_file(path).await.map_err(|e| {
            ConnectError::Config(format!(
                "cannot read NATS credentials {}: {e}",
                path.display()
            ))
        })?,
        NatsAuth::UserPassword(u, p) => options.user_and_password(u.clone(), p.clone()),
        NatsAuth::Token(t) => options.token(t.clone()),
    };
    let error = match options.connect(config.url.as_str()).await {
        Ok(client) => {
            tracker.set_connected();
            return Ok(client);
        }
        Err(e) => e,
    };
    if matches!(
        error.kind(),
        async_nats::ConnectErrorKind::AuthorizationViolation
            | async_nats::ConnectErrorKind::Authentication
    ) {
        tracker.set_disconnected(Some("credentials refused".into()));
        return Err(ConnectError::Refused {
            url,
            reason: error.to_string(),
        });
    }
    tracker.set_disconnected(Some(error.to_string()));
    Err(ConnectError::Unreachable {
        url,
        reason: error.to_string(),
    })
}

/// Creates (or updates) the stream that keeps flight updates.
pub async fn ensure_flight_stream(
    client: &async_nats::Client,
    config: &NatsConfig,
) -> Result<(), StreamError> {
    let js = async_nats::jetstream::new(client.clone());
    let stream_config = async_nats::jetstream::stream::Config {
        name: subjects::FLIGHT_STREAM.to_string(),
        subjects: vec![subjects::FLIGHTS_ALL.to_string()],
        max_age: config.stream_max_age,
        max_bytes: config.stream_max_bytes,
        storage: async_nats::jetstream::stream::StorageType::File,
        // JetStream refuses a duplicate window longer than the age limit (0: no limit).
        duplicate_window: match config.stream_max_age {
            age if age.is_zero() => DUPLICATE_WINDOW,
            age => age.min(DUPLICATE_WINDOW),
        },
        ..Default::default()
    };
    let made = match js.get_stream(subjects::FLIGHT_STREAM).await {
        Ok(_) => js.update_stream(stream_config).await.map(drop),
        Err(_) => js.create_stream(stream_config).await.map(drop),
    };
    made.map_err(|e| stream_error(e, config.stream_max_bytes))
}

/// Why the flight stream could not be made.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("creating the flight stream")]
    Refused(#[source] async_nats::jetstream::context::CreateStreamError),
    /// The server has less storage than the stream's byte limit: the user lowers the
    /// limit or gives the server more (the message says how).
    #[error(
        "the NATS server has less JetStream storage than {wanted} ({error}): lower \
         --nats-stream-max-bytes, free disk space where the server stores (without \
         `max_file_store` it offers 75% of the free disk), or set `max_file_store` in its \
         `jetstream` block"
    )]
    TooLittleStorage {
        wanted: String,
        error: async_nats::jetstream::context::CreateStreamError,
    },
}

/// A refused flight stream, with what to do when the server has too little storage for
/// its byte limit: a nats-server without `max_file_store` offers JetStream 75% of the
/// disk that is free when it starts, so a full disk refuses the default 1 GiB.
fn stream_error(
    error: async_nats::jetstream::context::CreateStreamError,
    max_bytes: i64,
) -> StreamError {
    use async_nats::jetstream::context::CreateStreamErrorKind;
    use async_nats::jetstream::ErrorCode;
    let short = match error.kind() {
        CreateStreamErrorKind::JetStream(e) => [
            ErrorCode::STORAGE_RESOURCES_EXCEEDED,
            ErrorCode::INSUFFICIENT_RESOURCES,
            ErrorCode::ACCOUNT_RESOURCES_EXCEEDED,
        ]
        .contains(&e.error_code()),
        _ => false,
    };
    if !short {
        return StreamError::Refused(error);
    }
    // -1 reserves nothing, so only an account's own limit can refuse it.
    let wanted = match max_bytes {
        n if n > 0 => format!("the flight stream's limit of {n} bytes"),
        _ => "the flight stream".to_string(),
    };
    StreamError::TooLittleStorage { wanted, error }
}
