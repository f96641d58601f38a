//! The broker on NATS: request/reply subjects for invoking agents and for commands, and
//! every flight update and message published as it commits. The subject scheme is the
//! manual in `broker/README.md` ("The bus"); [`relay_protocol::bus`] is its one
//! definition in code.
//!
//! Payloads are the protobuf messages of `protocol/proto/relay/v1/relay.proto`, with a
//! `Relay-Type` header naming the message. A request whose `Content-Type` header is
//! `application/json` is read as JSON and answered in JSON.
//!
//! Requests are handled concurrently up to [`MAX_INFLIGHT_REQUESTS`]; past that they are
//! answered `overloaded` at once (and counted), never queued without bound.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::{HeaderMap, Message as NatsMessage};
use bytes::Bytes;
use futures::StreamExt;
use prost::Message as _;
use relay_protocol::api::{ApiError, ErrorBody, NatsStatus};
use relay_protocol::bus::{
    json_type_name, subjects, type_name, CONTENT_TYPE_HEADER, JSON_CONTENT_TYPE, SEQ_HEADER,
    TOKEN_HEADER, TYPE_HEADER,
};
use relay_protocol::clock::now_ms;
use relay_protocol::convert::{self, ProtoEnum};
use relay_protocol::domain::{Action, ApprovalDecision, InvokeRequest, PostMessage};
use relay_protocol::event::{Event, EventBody};
use relay_protocol::pb;
use relay_runtime::retry::{self, Retryable, RetryableWithContext};
use serde::Deserialize;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::broker::Broker;
use crate::error::{quote, BrokerError};
use crate::ports::FlightControl;

/// Requests handled at once; more are answered `overloaded`.
pub const MAX_INFLIGHT_REQUESTS: usize = 1024;
/// How long the flight stream remembers `Nats-Msg-Id`s to drop a re-published update.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// Queue group of the broker's request subscriptions (several brokers would share load).
const QUEUE_GROUP: &str = "relay-broker";

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
) -> anyhow::Result<()> {
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
    match js.get_stream(subjects::FLIGHT_STREAM).await {
        Ok(_) => {
            js.update_stream(stream_config).await?;
        }
        Err(_) => {
            js.create_stream(stream_config).await?;
        }
    }
    Ok(())
}

/// Counters of the NATS service, for logs and benchmarks.
#[derive(Default)]
pub struct Counters {
    pub requests: AtomicU64,
    pub overloaded: AtomicU64,
    pub errors: AtomicU64,
    pub published: AtomicU64,
    /// Events NATS could never take (skipped, still in the log).
    pub unpublishable: AtomicU64,
}

#[derive(Clone)]
pub struct Service {
    client: async_nats::Client,
    broker: Broker,
    control: Option<Arc<dyn FlightControl>>,
    request_token: Option<Arc<str>>,
    permits: Arc<Semaphore>,
    pub counters: Arc<Counters>,
}

impl Service {
    pub fn new(
        client: async_nats::Client,
        broker: Broker,
        control: Option<Arc<dyn FlightControl>>,
        request_token: Option<String>,
    ) -> Service {
        Service {
            client,
            broker,
            control,
            request_token: request_token.map(Arc::from),
            permits: Arc::new(Semaphore::new(MAX_INFLIGHT_REQUESTS)),
            counters: Arc::new(Counters::default()),
        }
    }

    /// Serves the request subjects until `shutdown` fires.
    pub async fn serve(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let mut invoke = self
            .client
            .queue_subscribe(subjects::INVOKE_ALL, QUEUE_GROUP.into())
            .await?;
        let mut cmd = self
            .client
            .queue_subscribe(subjects::CMD_ALL, QUEUE_GROUP.into())
            .await?;
        loop {
            let msg = tokio::select! {
                _ = shutdown.cancelled() => break,
                m = invoke.next() => m,
                m = cmd.next() => m,
            };
            let Some(msg) = msg else { break };
            self.counters.requests.fetch_add(1, Ordering::Relaxed);
            let Some(reply) = msg.reply.clone() else {
                continue; // a publish without a reply subject: nobody to answer
            };
            let form = Form {
                json: is_json(&msg),
                invoke: subjects::invoke_target(&msg.subject).is_some(),
            };
            match self.permits.clone().try_acquire_owned() {
                Ok(permit) => {
                    let this = self.clone();
                    tokio::spawn(async move {
                        let answer = this.handle(&msg, form.json).await;
                        this.respond(reply, answer, form).await;
                        drop(permit);
                    });
                }
                Err(_) => {
                    self.counters.overloaded.fetch_add(1, Ordering::Relaxed);
                    let e = BrokerError::Overloaded(format!(
                        "{MAX_INFLIGHT_REQUESTS} requests are in progress"
                    ));
                    self.respond(reply, Answer::Error(e.to_api()), form).await;
                }
            }
        }
        Ok(())
    }

    async fn respond(&self, reply: async_nats::Subject, answer: Answer, form: Form) {
        if let Answer::Error(e) = &answer {
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(error = %e, "NATS request refused");
        }
        // Every reply to an invoke subject is an InvokeReply, to a cmd subject a
        // CommandReply, errors included; JSON replies say `<type>+json`.
        let name = match (form.invoke, form.json) {
            (true, false) => type_name::<pb::InvokeReply>(),
            (true, true) => json_type_name::<pb::InvokeReply>(),
            (false, false) => type_name::<pb::CommandReply>(),
            (false, true) => json_type_name::<pb::CommandReply>(),
        };
        let mut headers = HeaderMap::new();
        headers.insert(TYPE_HEADER, name.as_str());
        let payload = if form.json {
            headers.insert(CONTENT_TYPE_HEADER, JSON_CONTENT_TYPE);
            answer.to_json()
        } else {
            answer.to_pb(form.invoke)
        };
        if let Err(e) = self
            .client
            .publish_with_headers(reply, headers, payload)
            .await
        {
            tracing::warn!(error = %e, "cannot answer a NATS request");
        }
    }

    async fn handle(&self, msg: &NatsMessage, json: bool) -> Answer {
        match self.dispatch(msg, json).await {
            Ok(a) => a,
            Err(e) => Answer::Error(e.to_api()),
        }
    }

    async fn dispatch(&self, msg: &NatsMessage, json: bool) -> Result<Answer, BrokerError> {
        if let Some(want) = &self.request_token {
            let given = msg.headers.as_ref().and_then(|h| h.get(TOKEN_HEADER));
            match given {
                Some(t) if crate::seal::token_matches(t.as_str().as_bytes(), want.as_bytes()) => {}
                Some(_) => {
                    return Err(BrokerError::Unauthorized(format!(
                        "the {TOKEN_HEADER} header is wrong"
                    )))
                }
                None => {
                    return Err(BrokerError::Unauthorized(format!(
                        "this broker wants a {TOKEN_HEADER} header on every request"
                    )))
                }
            }
        }
        let limit = self.broker.config().max_message_bytes + 64 * 1024;
        if msg.payload.len() > limit {
            return Err(BrokerError::TooLarge {
                what: "request payload",
                size: msg.payload.len(),
                limit,
            });
        }
        let subject = msg.subject.as_str();
        if let Some(agent) = subjects::invoke_target(subject) {
            let req = if json {
                let body: InvokeJson = from_json(&msg.payload)?;
                body.into_request(agent)
            } else {
                let r: pb::InvokeRequest = from_pb(msg)?;
                convert::invoke_request_from_pb(agent, &r)
                    .map_err(|e| BrokerError::Invalid(e.to_string()))?
            };
            return Ok(Answer::Invoked(self.broker.invoke(req).await?));
        }
        let control = self.control.as_ref();
        match subject {
            subjects::CMD_POST => {
                let post: PostMessage = if json {
                    from_json(&msg.payload)?
                } else {
                    let p: pb::PostMessage = from_pb(msg)?;
                    convert::post_from_pb(&p).map_err(|e| BrokerError::Invalid(e.to_string()))?
                };
                Ok(Answer::Message(self.broker.post_message(post).await?))
            }
            subjects::CMD_STEER => {
                let (flight, text) = if json {
                    let b: SteerJson = from_json(&msg.payload)?;
                    (b.flight, b.text)
                } else {
                    let r: pb::SteerRequest = from_pb(msg)?;
                    (r.flight, r.text)
                };
                Ok(Answer::Flight(
                    crate::ops::steer(&self.broker, control, &flight, text).await?,
                ))
            }
            subjects::CMD_INTERRUPT => {
                let flight = if json {
                    from_json::<InterruptJson>(&msg.payload)?.flight
                } else {
                    from_pb::<pb::InterruptRequest>(msg)?.flight
                };
                Ok(Answer::Flight(
                    crate::ops::interrupt(&self.broker, control, &flight).await?,
                ))
            }
            subjects::CMD_APPROVE => {
                let (id, decision, by) = if json {
                    let b: ApproveJson = from_json(&msg.payload)?;
                    (b.approval, b.decision, b.decided_by)
                } else {
                    let r: pb::ApproveRequest = from_pb(msg)?;
                    let d = ApprovalDecision::from_pb(r.decision)
                        .map_err(|e| BrokerError::Invalid(e.to_string()))?;
                    let by = if r.decided_by.is_empty() {
                        "nats".to_string()
                    } else {
                        r.decided_by
                    };
                    (r.approval, d, by)
                };
                Ok(Answer::Approval(
                    crate::ops::decide(&self.broker, control, &id, decision, &by, false).await?,
                ))
            }
            other => Err(BrokerError::Invalid(format!(
                "no such request subject {}",
                quote(other)
            ))),
        }
    }
}

fn is_json(msg: &NatsMessage) -> bool {
    msg.headers
        .as_ref()
        .and_then(|h| h.get(CONTENT_TYPE_HEADER))
        .is_some_and(|v| v.as_str().starts_with(JSON_CONTENT_TYPE))
}

fn from_json<T: serde::de::DeserializeOwned>(payload: &Bytes) -> Result<T, BrokerError> {
    serde_json::from_slice(payload)
        .map_err(|e| BrokerError::Invalid(format!("the JSON payload is not valid: {e}")))
}

/// Decodes a protobuf request, refusing a `Relay-Type` header that names another message.
fn from_pb<T: prost::Name + Default>(msg: &NatsMessage) -> Result<T, BrokerError> {
    let expected = type_name::<T>();
    if let Some(t) = msg.headers.as_ref().and_then(|h| h.get(TYPE_HEADER)) {
        if t.as_str() != expected {
            return Err(BrokerError::Invalid(format!(
                "this subject takes {expected}, the {TYPE_HEADER} header says {}",
                quote(t.as_str())
            )));
        }
    }
    T::decode(msg.payload.as_ref())
        .map_err(|e| BrokerError::Invalid(format!("the payload is not a valid {expected}: {e}")))
}

#[derive(Deserialize)]
struct InvokeJson {
    task: String,
    #[serde(default)]
    requester: Option<String>,
    #[serde(default)]
    action: Action,
    #[serde(default)]
    conversation: Option<String>,
    #[serde(default)]
    parent_flight: Option<String>,
    #[serde(default)]
    timeout_ms: Option<u64>,
}

impl InvokeJson {
    fn into_request(self, agent: &str) -> InvokeRequest {
        InvokeRequest {
            target: agent.to_string(),
            task: self.task,
            requester: self.requester.unwrap_or_else(|| "nats".into()),
            action: self.action,
            conversation: self.conversation,
            parent_flight: self.parent_flight,
            timeout_ms: self.timeout_ms,
        }
    }
}

#[derive(Deserialize)]
struct SteerJson {
    flight: String,
    text: String,
}

#[derive(Deserialize)]
struct InterruptJson {
    flight: String,
}

#[derive(Deserialize)]
struct ApproveJson {
    approval: String,
    decision: ApprovalDecision,
    #[serde(default = "nats_actor")]
    decided_by: String,
}

fn nats_actor() -> String {
    "nats".into()
}

/// How a request is answered: in JSON or protobuf, as an invoke or a command reply.
#[derive(Clone, Copy)]
struct Form {
    json: bool,
    invoke: bool,
}

enum Answer {
    Invoked(relay_protocol::api::InvokeAccepted),
    Message(relay_protocol::domain::Message),
    Flight(relay_protocol::domain::Flight),
    Approval(relay_protocol::domain::Approval),
    Error(ApiError),
}

impl Answer {
    fn to_json(&self) -> Bytes {
        let v = match self {
            Answer::Invoked(a) => serde_json::to_vec(a),
            Answer::Message(m) => serde_json::to_vec(&serde_json::json!({ "message": m })),
            Answer::Flight(f) => serde_json::to_vec(&serde_json::json!({ "flight": f })),
            Answer::Approval(a) => serde_json::to_vec(&serde_json::json!({ "approval": a })),
            Answer::Error(e) => serde_json::to_vec(&ErrorBody { error: e.clone() }),
        };
        Bytes::from(v.unwrap_or_default())
    }

    /// The protobuf reply: an `InvokeReply` to an invoke request, else a `CommandReply`.
    fn to_pb(&self, invoke: bool) -> Bytes {
        use pb::command_reply::Result as C;
        use pb::invoke_reply::Result as I;
        let bytes = match self {
            Answer::Invoked(a) => pb::InvokeReply {
                result: Some(I::Accepted(pb::InvokeAccepted {
                    invocation_id: a.invocation.id.clone(),
                    flight_id: a.flight.id.clone(),
                    flight: Some(convert::flight_to_pb(&a.flight)),
                })),
            }
            .encode_to_vec(),
            Answer::Error(e) if invoke => pb::InvokeReply {
                result: Some(I::Error(convert::error_to_pb(e))),
            }
            .encode_to_vec(),
            Answer::Error(e) => pb::CommandReply {
                result: Some(C::Error(convert::error_to_pb(e))),
            }
            .encode_to_vec(),
            Answer::Message(m) => pb::CommandReply {
                result: Some(C::Message(convert::message_to_pb(m))),
            }
            .encode_to_vec(),
            Answer::Flight(f) => pb::CommandReply {
                result: Some(C::Flight(convert::flight_to_pb(f))),
            }
            .encode_to_vec(),
            Answer::Approval(a) => pb::CommandReply {
                result: Some(C::Approval(convert::approval_to_pb(a))),
            }
            .encode_to_vec(),
        };
        Bytes::from(bytes)
    }
}

/// Flight updates published to the stream whose acknowledgement is outstanding, at most.
const ACK_WINDOW: usize = 4096;
/// How long to wait for the stream to acknowledge an update before publishing again.
const ACK_TIMEOUT: Duration = Duration::from_secs(10);
/// How many times in a row the stream may refuse one update before it is skipped.
const STREAM_REFUSALS: u32 = 5;
/// How long a stopping publisher waits for NATS to take what it was given.
const FINAL_FLUSH: Duration = Duration::from_secs(3);
/// Waits between tries to publish an event while NATS is unreachable.
const PUBLISH_BACKOFF: retry::ExponentialBuilder =
    retry::forever(Duration::from_millis(50), Duration::from_secs(2));

/// Publishes every committed flight update and message, from the seq saved in
/// `cursor_file` (or the current end of the log), until `shutdown` fires.
///
/// Flight updates go to the `RELAY_FLIGHTS` stream (and its subscribers) with
/// acknowledgement; the cursor only moves past an update once the stream has it, and an
/// update not acknowledged is published again from there (`Nats-Msg-Id` makes the stream
/// keep one copy; plain subscribers may see it twice and drop it by `seq`). An event that
/// NATS can never take (a subject it refuses, a payload over its limit even trimmed) is
/// logged, counted and skipped: one bad event must not stop the bus.
pub async fn publish(
    client: async_nats::Client,
    broker: Broker,
    cursor_file: PathBuf,
    counters: Arc<Counters>,
    shutdown: CancellationToken,
) {
    let js = async_nats::jetstream::new(client.clone());
    let start = std::fs::read_to_string(&cursor_file)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or_else(|| broker.last_seq());
    let mut publisher = Publisher {
        client: client.clone(),
        js,
        counters,
        acks: std::collections::VecDeque::new(),
        handed: start,
        failing: (0, 0),
        done: start,
    };
    let mut feed = crate::feed::follow(broker.clone(), start);
    let mut saved = start;
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        if publisher.acks.len() >= ACK_WINDOW {
            if let Err(from) = publisher.settle().await {
                feed = crate::feed::follow(broker.clone(), from);
            }
            continue;
        }
        let item = tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tick.tick() => {
                match publisher.settle().await {
                    Ok(()) => {
                        if publisher.done != saved {
                            save_cursor(&cursor_file, publisher.done).await;
                            saved = publisher.done;
                        }
                    }
                    Err(from) => feed = crate::feed::follow(broker.clone(), from),
                }
                continue;
            }
            i = feed.recv() => i,
        };
        let event = match item {
            Some(Ok(event)) => event,
            Some(Err(e)) => {
                tracing::error!(error = %e, "cannot read the event log; NATS publishing stopped");
                break;
            }
            None => break,
        };
        // Tried until NATS takes it (what it never will is skipped inside `publish`), so
        // the outcome is `Ok`; only a stop while waiting between tries ends it. Each try
        // owns the publisher and the event and hands them back: a future borrowing them
        // is not `Send` to the compiler through backon's generic types.
        let seq = event.seq;
        let published = retry::until_stopped(&shutdown, |sleeper| {
            (|(mut p, event): (Publisher, Arc<Event>)| async move {
                let outcome = p.publish(&event).await;
                ((p, event), outcome)
            })
            .retry(PUBLISH_BACKOFF)
            .sleep(sleeper)
            .context((publisher, event))
            .notify(|e, _| {
                tracing::warn!(seq, error = %e, "NATS publish failed; retrying");
            })
        })
        .await;
        let Some(((p, _), _taken)) = published else {
            return;
        };
        publisher = p;
    }
    if tokio::time::timeout(FINAL_FLUSH, publisher.settle())
        .await
        .is_ok_and(|r| r.is_ok())
    {
        save_cursor(&cursor_file, publisher.done).await;
    } else {
        tracing::warn!("NATS did not take the last events before the stop; they are published again at the next start");
    }
}

struct Publisher {
    client: async_nats::Client,
    js: async_nats::jetstream::Context,
    counters: Arc<Counters>,
    /// Flight updates handed to the stream, oldest first, with their event seq.
    acks: std::collections::VecDeque<(u64, async_nats::jetstream::context::PublishAckFuture)>,
    /// The last event handed to NATS.
    handed: u64,
    /// The update whose acknowledgement failed last, and how many times in a row.
    failing: (u64, u32),
    /// Every event up to this one is with NATS (acknowledged by the stream where it
    /// goes to the stream).
    done: u64,
}

impl Publisher {
    /// Publishes one committed event on its subjects (nothing for most event types). An
    /// error is a connection problem worth retrying; what can never be published is
    /// skipped here.
    async fn publish(&mut self, event: &relay_protocol::event::Event) -> Result<(), String> {
        match &event.body {
            EventBody::FlightUpdated { update, flight } => {
                let mut update = update.clone();
                let mut flight = flight.clone();
                let mut trimmed = false;
                loop {
                    match self.publish_update(event.seq, &update, &flight).await {
                        Ok(()) => break,
                        Err(Unpublishable::TooLarge) if !trimmed => {
                            trim_texts(&mut update, &mut flight);
                            trimmed = true;
                        }
                        Err(Unpublishable::Retry(e)) => return Err(e),
                        Err(e) => {
                            self.skip(event, &e);
                            break;
                        }
                    }
                }
            }
            EventBody::MessagePosted { message, .. } => {
                let mut headers = HeaderMap::new();
                headers.insert(SEQ_HEADER, event.seq.to_string().as_str());
                headers.insert(TYPE_HEADER, type_name::<pb::Message>().as_str());
                let result = self
                    .client
                    .publish_with_headers(
                        subjects::conversation(&message.conversation),
                        headers,
                        convert::message_to_pb(message).encode_to_vec().into(),
                    )
                    .await;
                if let Err(e) = result {
                    match e.kind() {
                        async_nats::client::PublishErrorKind::Send => return Err(e.to_string()),
                        _ => self.skip(event, &Unpublishable::Refused(e.to_string())),
                    }
                }
            }
            _ => {}
        }
        self.counters.published.fetch_add(1, Ordering::Relaxed);
        self.handed = event.seq;
        Ok(())
    }

    async fn publish_update(
        &mut self,
        seq: u64,
        update: &relay_protocol::domain::FlightUpdate,
        flight: &relay_protocol::domain::Flight,
    ) -> Result<(), Unpublishable> {
        let max = self.client.server_info().max_payload;
        let pb_bytes = convert::update_to_pb(update, flight).encode_to_vec();
        let json = serde_json::to_vec(&serde_json::json!({ "update": update, "flight": flight }))
            .map_err(|e| Unpublishable::Refused(e.to_string()))?;
        // Room for the headers; the server's limit covers them too.
        if max > 0 && pb_bytes.len().max(json.len()) + 1024 > max {
            return Err(Unpublishable::TooLarge);
        }
        let mut headers = HeaderMap::new();
        headers.insert(SEQ_HEADER, seq.to_string().as_str());
        headers.insert(TYPE_HEADER, type_name::<pb::FlightUpdate>().as_str());
        // The stream drops a re-publish of the same update (after a restart, a lost ack).
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            format!("{}:{}", update.flight, update.seq).as_str(),
        );
        let ack = self
            .js
            .publish_with_headers(
                subjects::flight(&update.agent, &update.flight),
                headers.clone(),
                pb_bytes.into(),
            )
            .await
            .map_err(|e| match e.kind() {
                async_nats::jetstream::context::PublishErrorKind::MaxPayloadExceeded => {
                    Unpublishable::TooLarge
                }
                _ => Unpublishable::Retry(e.to_string()),
            })?;
        self.acks.push_back((seq, ack));
        let mut json_headers = headers;
        json_headers.insert(TYPE_HEADER, json_type_name::<pb::FlightUpdate>().as_str());
        json_headers.insert(CONTENT_TYPE_HEADER, JSON_CONTENT_TYPE);
        // The JSON mirror rides on the same connection: if it breaks, the stream's
        // acknowledgement fails too and both are published again from there.
        if let Err(e) = self
            .client
            .publish_with_headers(
                subjects::flight_json(&update.agent, &update.flight),
                json_headers,
                json.into(),
            )
            .await
        {
            tracing::debug!(error = %e, "JSON flight update not published");
        }
        Ok(())
    }

    fn skip(&self, event: &relay_protocol::event::Event, why: &Unpublishable) {
        self.counters.unpublishable.fetch_add(1, Ordering::Relaxed);
        tracing::error!(seq = event.seq, event = event.body.type_name(), error = %why, "event not published on NATS; skipped (the log still has it)");
    }

    /// Waits for the stream's acknowledgements of everything handed so far. On a missing
    /// one, returns the seq to publish again after. An update the stream keeps refusing
    /// ([`STREAM_REFUSALS`] times in a row: a stream deleted or limited under it) is
    /// skipped, so the publisher never loops on it.
    async fn settle(&mut self) -> Result<(), u64> {
        while let Some((seq, ack)) = self.acks.pop_front() {
            let why = match tokio::time::timeout(ACK_TIMEOUT, ack).await {
                Ok(Ok(_)) => continue,
                Ok(Err(e)) => e.to_string(),
                Err(_) => "no acknowledgement in time".into(),
            };
            self.failing = match self.failing {
                (s, n) if s == seq => (s, n + 1),
                _ => (seq, 1),
            };
            if self.failing.1 >= STREAM_REFUSALS {
                self.counters.unpublishable.fetch_add(1, Ordering::Relaxed);
                tracing::error!(seq, error = %why, "the flight stream keeps refusing an update; it is skipped (the log still has it)");
                continue;
            }
            tracing::warn!(seq, error = %why, "the flight stream did not take an update; publishing again from it");
            self.acks.clear();
            let from = seq - 1;
            self.handed = from;
            self.done = from;
            return Err(from);
        }
        // Plain publishes count once NATS has them.
        if self.done != self.handed {
            if self.client.flush().await.is_err() {
                return Ok(());
            }
            self.done = self.handed;
        }
        Ok(())
    }
}

/// Why an event did not go out.
#[derive(Debug, thiserror::Error)]
enum Unpublishable {
    #[error("over the NATS server's max_payload")]
    TooLarge,
    #[error("refused: {0}")]
    Refused(String),
    #[error("{0}")]
    Retry(String),
}

/// Longest text kept in a flight update that is too large for NATS.
const TRIMMED_TEXT: usize = 16 * 1024;

/// Cuts the long texts of an update and its flight (output, deltas) so it fits a NATS
/// message; the full text stays in the log (`relay flight ID`).
fn trim_texts(
    update: &mut relay_protocol::domain::FlightUpdate,
    flight: &mut relay_protocol::domain::Flight,
) {
    use relay_protocol::domain::FlightChange;
    fn cut(text: &mut String) {
        if relay_protocol::domain::truncate_bytes(text, TRIMMED_TEXT) {
            text.push_str("\n[... cut for NATS; the whole text is in the log]");
        }
    }
    for text in [&mut flight.output, &mut flight.error, &mut flight.summary]
        .into_iter()
        .flatten()
    {
        cut(text);
    }
    match &mut update.change {
        FlightChange::State { reason, output, .. } => {
            for text in [reason, output].into_iter().flatten() {
                cut(text);
            }
        }
        FlightChange::Delta { text }
        | FlightChange::Plan { text }
        | FlightChange::Diff { text }
        | FlightChange::CommandOutput { text, .. }
        | FlightChange::Item {
            text: Some(text), ..
        } => cut(text),
        _ => {}
    }
}

/// Saves the publisher's cursor ([`crate::files::write_private`]), off the async
/// workers; a cursor not saved only means some updates are published again.
async fn save_cursor(path: &std::path::Path, seq: u64) {
    let path = path.to_owned();
    let saved = tokio::task::spawn_blocking(move || {
        crate::files::write_private(&path, seq.to_string().as_bytes())
    })
    .await;
    if let Ok(Err(e)) = saved {
        tracing::debug!(error = %e, "NATS cursor not saved");
    }
}
