//! The broker on NATS: request/reply subjects for invoking agents and for commands, and
//! every flight update and message published as it commits. The subject scheme is the
//! manual in `broker/README.md` ("The bus"); [`subjects`] is its one definition in code.
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
use relay_protocol::convert;
use relay_protocol::domain::{Action, ApprovalDecision, InvokeRequest, PostMessage};
use relay_protocol::event::EventBody;
use relay_protocol::pb;
use serde::Deserialize;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::broker::Broker;
use crate::error::BrokerError;
use crate::http::FlightControl;

/// Requests handled at once; more are answered `overloaded`.
pub const MAX_INFLIGHT_REQUESTS: usize = 1024;
/// Queue group of the broker's request subscriptions (several brokers would share load).
const QUEUE_GROUP: &str = "relay-broker";

/// The subject scheme, version 1.
pub mod subjects {
    pub const PREFIX: &str = "relay.v1";
    /// Request/reply: invoke `<agent>`.
    pub fn invoke(agent: &str) -> String {
        format!("relay.v1.invoke.{agent}")
    }
    pub const INVOKE_ALL: &str = "relay.v1.invoke.*";
    /// Published: every update of a flight, protobuf `FlightUpdate`.
    pub fn flight(agent: &str, flight: &str) -> String {
        format!("relay.v1.flight.{agent}.{flight}")
    }
    pub const FLIGHTS_ALL: &str = "relay.v1.flight.>";
    /// Published: the same updates as JSON, for clients without protobuf.
    pub fn flight_json(agent: &str, flight: &str) -> String {
        format!("relay.v1.json.flight.{agent}.{flight}")
    }
    /// Published: every message posted to a conversation, protobuf `Message`.
    pub fn conversation(id: &str) -> String {
        format!("relay.v1.conversation.{id}")
    }
    pub const CMD_POST: &str = "relay.v1.cmd.post";
    pub const CMD_STEER: &str = "relay.v1.cmd.steer";
    pub const CMD_INTERRUPT: &str = "relay.v1.cmd.interrupt";
    pub const CMD_APPROVE: &str = "relay.v1.cmd.approve";
    pub const CMD_ALL: &str = "relay.v1.cmd.*";
    /// The JetStream stream that keeps flight updates for late joiners.
    pub const FLIGHT_STREAM: &str = "RELAY_FLIGHTS";
}

/// The header that names a payload's protobuf message.
pub const TYPE_HEADER: &str = "Relay-Type";
/// The header with the global event seq of a published event.
pub const SEQ_HEADER: &str = "Relay-Seq";

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
}

/// The connection's state for `relay status`.
#[derive(Clone)]
pub struct Tracker {
    state: Arc<Mutex<NatsStatus>>,
}

impl Tracker {
    pub fn status(&self) -> NatsStatus {
        self.state
            .lock()
            .map(|s| s.clone())
            .unwrap_or(NatsStatus::Disabled)
    }
}

/// Connects, failing at once on refused credentials (they will not get better) and
/// retrying other failures for up to `patience`. Once connected, the client reconnects
/// forever with backoff.
pub async fn connect(
    config: &NatsConfig,
    name: &str,
    patience: Duration,
) -> anyhow::Result<(async_nats::Client, Tracker)> {
    let tracker = Tracker {
        state: Arc::new(Mutex::new(NatsStatus::Disconnected {
            url: config.url.clone(),
            since_ms: crate::broker::now_ms(),
        })),
    };
    let deadline = tokio::time::Instant::now() + patience;
    let mut delay = Duration::from_millis(100);
    loop {
        let t = tracker.clone();
        let url = config.url.clone();
        let mut options = async_nats::ConnectOptions::new()
            .name(name)
            .max_reconnects(None)
            .event_callback(move |event| {
                let t = t.clone();
                let url = url.clone();
                async move {
                    let next = match event {
                        async_nats::Event::Connected => Some(NatsStatus::Connected { url }),
                        async_nats::Event::Disconnected => Some(NatsStatus::Disconnected {
                            url,
                            since_ms: crate::broker::now_ms(),
                        }),
                        other => {
                            tracing::info!(event = %other, "nats");
                            None
                        }
                    };
                    if let Some(next) = next {
                        tracing::info!(state = ?next, "nats connection");
                        if let Ok(mut s) = t.state.lock() {
                            *s = next;
                        }
                    }
                }
            });
        options = match &config.auth {
            NatsAuth::None => options,
            NatsAuth::Creds(path) => options.credentials_file(path).await.map_err(|e| {
                anyhow::anyhow!("cannot read NATS credentials {}: {e}", path.display())
            })?,
            NatsAuth::UserPassword(u, p) => options.user_and_password(u.clone(), p.clone()),
            NatsAuth::Token(t) => options.token(t.clone()),
        };
        match options.connect(config.url.as_str()).await {
            Ok(client) => {
                if let Ok(mut s) = tracker.state.lock() {
                    *s = NatsStatus::Connected {
                        url: config.url.clone(),
                    };
                }
                return Ok((client, tracker));
            }
            Err(e) => {
                let auth = matches!(
                    e.kind(),
                    async_nats::ConnectErrorKind::AuthorizationViolation
                        | async_nats::ConnectErrorKind::Authentication
                );
                if auth {
                    anyhow::bail!(
                        "NATS at {} refused the credentials ({e}); check --nats-creds, --nats-user/--nats-password or --nats-token",
                        config.url
                    );
                }
                if tokio::time::Instant::now() + delay > deadline {
                    anyhow::bail!("cannot connect to NATS at {}: {e}", config.url);
                }
                tracing::warn!(url = %config.url, error = %e, "NATS not reachable yet; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
        }
    }
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
        duplicate_window: Duration::from_secs(120),
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
}

#[derive(Clone)]
pub struct Service {
    client: async_nats::Client,
    broker: Broker,
    control: Option<Arc<dyn FlightControl>>,
    permits: Arc<Semaphore>,
    pub counters: Arc<Counters>,
}

impl Service {
    pub fn new(
        client: async_nats::Client,
        broker: Broker,
        control: Option<Arc<dyn FlightControl>>,
    ) -> Service {
        Service {
            client,
            broker,
            control,
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
            let json = is_json(&msg);
            match self.permits.clone().try_acquire_owned() {
                Ok(permit) => {
                    let this = self.clone();
                    tokio::spawn(async move {
                        let answer = this.handle(&msg, json).await;
                        this.respond(reply, answer, json).await;
                        drop(permit);
                    });
                }
                Err(_) => {
                    self.counters.overloaded.fetch_add(1, Ordering::Relaxed);
                    let e = BrokerError::Overloaded(format!(
                        "{MAX_INFLIGHT_REQUESTS} requests are in progress"
                    ));
                    self.respond(reply, Answer::Error(e.to_api()), json).await;
                }
            }
        }
        Ok(())
    }

    async fn respond(&self, reply: async_nats::Subject, answer: Answer, json: bool) {
        if let Answer::Error(e) = &answer {
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(error = %e, "NATS request refused");
        }
        let (type_name, payload) = if json {
            ("json", answer.to_json())
        } else {
            answer.to_pb()
        };
        let mut headers = HeaderMap::new();
        headers.insert(TYPE_HEADER, type_name);
        if json {
            headers.insert("Content-Type", "application/json");
        }
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
        let limit = self.broker.config().max_message_bytes + 64 * 1024;
        if msg.payload.len() > limit {
            return Err(BrokerError::TooLarge {
                what: "request payload",
                size: msg.payload.len(),
                limit,
            });
        }
        let subject = msg.subject.as_str();
        if let Some(agent) = subject.strip_prefix("relay.v1.invoke.") {
            let req = if json {
                let body: InvokeJson = from_json(&msg.payload)?;
                body.into_request(agent)
            } else {
                let r: pb::InvokeRequest = from_pb(msg, "relay.v1.InvokeRequest")?;
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
                    let p: pb::PostMessage = from_pb(msg, "relay.v1.PostMessage")?;
                    convert::post_from_pb(&p).map_err(|e| BrokerError::Invalid(e.to_string()))?
                };
                Ok(Answer::Message(self.broker.post_message(post).await?))
            }
            subjects::CMD_STEER => {
                let (flight, text) = if json {
                    let b: SteerJson = from_json(&msg.payload)?;
                    (b.flight, b.text)
                } else {
                    let r: pb::SteerRequest = from_pb(msg, "relay.v1.SteerRequest")?;
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
                    from_pb::<pb::InterruptRequest>(msg, "relay.v1.InterruptRequest")?.flight
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
                    let r: pb::ApproveRequest = from_pb(msg, "relay.v1.ApproveRequest")?;
                    let d = convert::decision_from_pb(r.decision)
                        .map_err(|e| BrokerError::Invalid(e.to_string()))?;
                    let by = if r.decided_by.is_empty() {
                        "nats".to_string()
                    } else {
                        r.decided_by
                    };
                    (r.approval, d, by)
                };
                Ok(Answer::Approval(
                    crate::ops::decide(&self.broker, control, &id, decision, &by).await?,
                ))
            }
            other => Err(BrokerError::Invalid(format!(
                "no such request subject {other:?}"
            ))),
        }
    }
}

fn is_json(msg: &NatsMessage) -> bool {
    msg.headers
        .as_ref()
        .and_then(|h| h.get("Content-Type"))
        .is_some_and(|v| v.as_str().starts_with("application/json"))
}

fn from_json<T: serde::de::DeserializeOwned>(payload: &Bytes) -> Result<T, BrokerError> {
    serde_json::from_slice(payload)
        .map_err(|e| BrokerError::Invalid(format!("the JSON payload is not valid: {e}")))
}

/// Decodes a protobuf request, refusing a `Relay-Type` header that names another message.
fn from_pb<T: prost::Message + Default>(
    msg: &NatsMessage,
    expected: &str,
) -> Result<T, BrokerError> {
    if let Some(t) = msg.headers.as_ref().and_then(|h| h.get(TYPE_HEADER)) {
        if t.as_str() != expected {
            return Err(BrokerError::Invalid(format!(
                "this subject takes {expected}, the {TYPE_HEADER} header says {}",
                t.as_str()
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

    fn to_pb(&self) -> (&'static str, Bytes) {
        use pb::command_reply::Result as C;
        use pb::invoke_reply::Result as I;
        let (name, bytes) = match self {
            Answer::Invoked(a) => (
                "relay.v1.InvokeReply",
                pb::InvokeReply {
                    result: Some(I::Accepted(pb::InvokeAccepted {
                        invocation_id: a.invocation.id.clone(),
                        flight_id: a.flight.id.clone(),
                        flight: Some(convert::flight_to_pb(&a.flight)),
                    })),
                }
                .encode_to_vec(),
            ),
            Answer::Message(m) => (
                "relay.v1.CommandReply",
                pb::CommandReply {
                    result: Some(C::Message(convert::message_to_pb(m))),
                }
                .encode_to_vec(),
            ),
            Answer::Flight(f) => (
                "relay.v1.CommandReply",
                pb::CommandReply {
                    result: Some(C::Flight(convert::flight_to_pb(f))),
                }
                .encode_to_vec(),
            ),
            Answer::Approval(a) => (
                "relay.v1.CommandReply",
                pb::CommandReply {
                    result: Some(C::Approval(convert::approval_to_pb(a))),
                }
                .encode_to_vec(),
            ),
            // An error answers both kinds of request; clients of either decode it from
            // the oneof's `error` field (same field number in both replies).
            Answer::Error(e) => (
                "relay.v1.Error",
                pb::InvokeReply {
                    result: Some(I::Error(convert::error_to_pb(e))),
                }
                .encode_to_vec(),
            ),
        };
        (name, Bytes::from(bytes))
    }
}

/// Publishes every committed flight update and message, from the seq saved in
/// `cursor_file` (or the current end of the log), until `shutdown` fires.
pub async fn publish(
    client: async_nats::Client,
    broker: Broker,
    cursor_file: PathBuf,
    counters: Arc<Counters>,
    shutdown: CancellationToken,
) {
    let start = std::fs::read_to_string(&cursor_file)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or_else(|| broker.last_seq());
    let mut feed = crate::feed::follow(broker, start);
    let mut saved = start;
    let mut last = start;
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        let item = tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tick.tick() => {
                // Only what NATS has taken counts as published.
                if last != saved && client.flush().await.is_ok() {
                    save_cursor(&cursor_file, last);
                    saved = last;
                }
                continue;
            }
            i = feed.recv() => i,
        };
        let Some(Ok(event)) = item else { break };
        let mut delay = Duration::from_millis(50);
        while let Err(e) = publish_event(&client, &event).await {
            tracing::warn!(seq = event.seq, error = %e, "NATS publish failed; retrying");
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(Duration::from_secs(2));
        }
        counters.published.fetch_add(1, Ordering::Relaxed);
        last = event.seq;
    }
    if client.flush().await.is_ok() {
        save_cursor(&cursor_file, last);
    }
}

/// Publishes one committed event on its subjects (nothing for most event types).
async fn publish_event(
    client: &async_nats::Client,
    event: &relay_protocol::event::Event,
) -> Result<(), async_nats::PublishError> {
    {
        let mut headers = HeaderMap::new();
        headers.insert(SEQ_HEADER, event.seq.to_string().as_str());
        let published = match &event.body {
            EventBody::FlightUpdated { update, flight } => {
                headers.insert(TYPE_HEADER, "relay.v1.FlightUpdate");
                // JetStream drops a re-publish of the same update (after a restart).
                headers.insert(
                    "Nats-Msg-Id",
                    format!("{}:{}", update.flight, update.seq).as_str(),
                );
                let pb_bytes = convert::update_to_pb(update, flight).encode_to_vec();
                let r1 = client
                    .publish_with_headers(
                        subjects::flight(&update.agent, &update.flight),
                        headers.clone(),
                        pb_bytes.into(),
                    )
                    .await;
                let mut json_headers = headers.clone();
                json_headers.insert(TYPE_HEADER, "json");
                json_headers.insert("Content-Type", "application/json");
                let json = serde_json::to_vec(&serde_json::json!({
                    "update": update,
                    "flight": flight,
                }))
                .unwrap_or_default();
                let r2 = client
                    .publish_with_headers(
                        subjects::flight_json(&update.agent, &update.flight),
                        json_headers,
                        json.into(),
                    )
                    .await;
                r1.and(r2)
            }
            EventBody::MessagePosted { message, .. } => {
                headers.insert(TYPE_HEADER, "relay.v1.Message");
                client
                    .publish_with_headers(
                        subjects::conversation(&message.conversation),
                        headers,
                        convert::message_to_pb(message).encode_to_vec().into(),
                    )
                    .await
            }
            _ => Ok(()),
        };
        published
    }
}

fn save_cursor(path: &std::path::Path, seq: u64) {
    let tmp = path.with_extension("tmp");
    if std::fs::write(&tmp, seq.to_string()).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}
