//! The NATS service: the invoke and command request subjects, answered in protobuf or
//! JSON, at most [`MAX_INFLIGHT_REQUESTS`] at once; `relay.v1.cmd.snapshot`, in JSON
//! only, a watch's snapshot with where to follow it from ([`snapshot`]); the remembered
//! rules, in JSON only (`rules.rs`); and `relay.v1.cmd.usage`, in JSON only, the usage
//! report ([`USAGE_REPLY_TYPE`]).
//!
//! Who the bus is: NATS does not say who published a request, so the broker trusts the
//! bus only as far as its setup does. A trusted bus (NATS credentials, whose server's
//! permissions say who may publish, or a request token every request must carry) may do
//! all the subjects offer, and its decisions are recorded as the bus's (`nats`,
//! `NAME@nats`), never as the operator's. An open bus (neither: anyone who reaches the
//! server) may read, ask and post under its own names only: approving, steering,
//! interrupting, linking an ask or a message to a flight (`parent_flight`, `meta`), and
//! asking or posting as the operator, an agent or one of Relay's own identities are
//! refused ([`BrokerError::OpenBus`], naming
//! the flags that trust it); so is reverting a flight's changes (`relay.v1.cmd.revert`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_nats::{HeaderMap, Message as NatsMessage};
use bytes::Bytes;
use futures::StreamExt;
use prost::Message as _;
use relay_protocol::api::{ApiError, ErrorBody};
use relay_protocol::bus::{
    json_type_name, subjects, type_name, ApprovalAnswer, FlightAnswer, BUS_ACTOR,
    CONTENT_TYPE_HEADER, JSON_CONTENT_TYPE, SNAPSHOT_REPLY_TYPE, TOKEN_HEADER, TYPE_HEADER,
};
use relay_protocol::convert::{self, ProtoEnum};
use relay_protocol::domain::{ApprovalDecision, MessageClass, PostMessage};
use relay_protocol::methods::{self, call as m, BusCall, MethodId};
use relay_protocol::pb;
use relay_protocol::watch::{CatchUp, Scope, SnapshotReply, View};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::MAX_INFLIGHT_REQUESTS;
use crate::broker::Broker;
use crate::error::{quote, BrokerError};
use crate::ports::FlightControl;

mod rules;

/// Queue group of the broker's request subscriptions (several brokers would share load).
const QUEUE_GROUP: &str = "relay-broker";

/// Counters of the NATS service, for logs and benchmarks.
#[derive(Default)]
pub struct Counters {
    pub requests: AtomicU64,
    pub overloaded: AtomicU64,
    pub errors: AtomicU64,
    pub published: AtomicU64,
    /// Events NATS could never take (skipped, still in the log).
    pub unpublishable: AtomicU64,
    /// Flight updates the stream dropped as duplicates of a message the broker never
    /// published (an alarm: someone else made its keyed ids).
    pub forged_ids: AtomicU64,
}

#[derive(Clone)]
pub struct Service {
    client: async_nats::Client,
    js: async_nats::jetstream::Context,
    broker: Broker,
    control: Option<Arc<dyn FlightControl>>,
    request_token: Option<Arc<str>>,
    /// Anyone may publish requests: see the module docs.
    open: bool,
    permits: Arc<Semaphore>,
    pub counters: Arc<Counters>,
}

impl Service {
    pub fn new(
        client: async_nats::Client,
        broker: Broker,
        control: Option<Arc<dyn FlightControl>>,
        config: &super::NatsConfig,
    ) -> Service {
        Service {
            js: async_nats::jetstream::new(client.clone()),
            client,
            broker,
            control,
            request_token: config.request_token.as_deref().map(Arc::from),
            open: config.is_open(),
            permits: Arc::new(Semaphore::new(MAX_INFLIGHT_REQUESTS)),
            counters: Arc::new(Counters::default()),
        }
    }

    /// Serves the request subjects until `shutdown` fires.
    pub async fn serve(
        self,
        shutdown: CancellationToken,
    ) -> Result<(), async_nats::SubscribeError> {
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
            let reply_to = match methods::by_subject(&msg.subject).map(|(m, _)| m.id) {
                Some(MethodId::Invoke) => ReplyTo::Invoke,
                Some(MethodId::Watch) => ReplyTo::Snapshot,
                Some(MethodId::UsageShow) => ReplyTo::Json(USAGE_REPLY_TYPE),
                _ => ReplyTo::Command,
            };
            let form = Form {
                json: is_json(&msg)
                    || matches!(reply_to, ReplyTo::Snapshot | ReplyTo::Json(_))
                    || rules::json_only(&msg.subject),
                reply_to,
            };
            match self.permits.clone().try_acquire_owned() {
                Ok(permit) => {
                    let this = self.clone();
                    self.broker.tasks().track(async move {
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
        // CommandReply (a snapshot's a SnapshotReply), errors included; JSON replies say
        // `<type>+json`.
        let name = match (form.reply_to, form.json) {
            (ReplyTo::Snapshot, _) => SNAPSHOT_REPLY_TYPE.to_string(),
            (ReplyTo::Json(name), _) => name.to_string(),
            (ReplyTo::Invoke, false) => type_name::<pb::InvokeReply>(),
            (ReplyTo::Invoke, true) => json_type_name::<pb::InvokeReply>(),
            (ReplyTo::Command, false) => type_name::<pb::CommandReply>(),
            (ReplyTo::Command, true) => json_type_name::<pb::CommandReply>(),
        };
        let mut headers = HeaderMap::new();
        headers.insert(TYPE_HEADER, name.as_str());
        if form.json {
            headers.insert(CONTENT_TYPE_HEADER, JSON_CONTENT_TYPE);
        }
        let encode = |answer: &Answer| {
            if form.json {
                answer.to_json()
            } else {
                answer.to_pb(form.reply_to == ReplyTo::Invoke)
            }
        };
        let mut payload = encode(&answer);
        // A reply over the server's limit (a long flight's snapshot) would never arrive:
        // say so instead, with room for the headers.
        let max = self.client.max_payload();
        if max > 0 && payload.len() + 1024 > max {
            let e = BrokerError::TooLarge {
                what: "the reply (a long snapshot: read it over HTTP, GET /v1/watch)",
                size: payload.len(),
                limit: max.saturating_sub(1024),
            };
            payload = encode(&Answer::Error(e.to_api()));
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
        // The method table names the method each subject serves.
        let Some((method, param)) = methods::by_subject(subject) else {
            return Err(BrokerError::Invalid(format!(
                "no such request subject {}",
                quote(subject)
            )));
        };
        let control = self.control.as_ref();
        match method.id {
            MethodId::Invoke => {
                let req = if json {
                    bus_body::<m::Invoke>(msg)?.into_request(param)
                } else {
                    let r: pb::InvokeRequest = from_pb(msg)?;
                    // Unnamed, the bus asks as itself, as in JSON.
                    convert::invoke_request_from_pb(param, &r, BUS_ACTOR)
                        .map_err(|e| BrokerError::Invalid(e.to_string()))?
                };
                if self.open {
                    self.as_itself("asking", &req.requester).await?;
                    if req.parent_flight.is_some() {
                        return Err(BrokerError::OpenBus {
                            what: "linking an ask to a flight (parent_flight)".into(),
                        });
                    }
                }
                Ok(Answer::Invoked(self.broker.invoke(req).await?))
            }
            MethodId::MessagePost => {
                let mut post: PostMessage = if json {
                    bus_body::<m::MessagePost>(msg)?
                } else {
                    let p: pb::PostMessage = from_pb(msg)?;
                    convert::post_from_pb(&p).map_err(|e| BrokerError::Invalid(e.to_string()))?
                };
                // Unnamed (JSON's absent author, protobuf's empty one), the bus posts as
                // itself, as it asks.
                if post.author.is_empty() {
                    post.author = BUS_ACTOR.to_string();
                }
                if self.open {
                    self.as_itself("posting", &post.author).await?;
                    // Status, system, log and artifact messages are Relay's and the
                    // harnesses' own records: a stranger only talks.
                    if post.class != MessageClass::Agent {
                        return Err(BrokerError::OpenBus {
                            what: format!("posting a `{}` message", post.class.as_str()),
                        });
                    }
                    // Its meta says which flight, invocation or harness session a
                    // message came from: a mention in it is asked within that flight.
                    if !post.meta.is_empty() {
                        return Err(BrokerError::OpenBus {
                            what: "a message naming the flight or session it came from (meta)"
                                .into(),
                        });
                    }
                }
                Ok(Answer::Posted(self.broker.post_message(post).await?))
            }
            MethodId::FlightSteer => {
                let (flight, text) = if json {
                    let b = bus_body::<m::FlightSteer>(msg)?;
                    (b.flight, b.text)
                } else {
                    let r: pb::SteerRequest = from_pb(msg)?;
                    (r.flight, r.text)
                };
                self.trusted("steering a flight")?;
                let by = Some(BUS_ACTOR.to_string());
                let f = crate::ops::steer(&self.broker, control, &flight, text, by).await?;
                Ok(Answer::Flight(f))
            }
            MethodId::FlightInterrupt => {
                let flight = if json {
                    bus_body::<m::FlightInterrupt>(msg)?.flight
                } else {
                    from_pb::<pb::InterruptRequest>(msg)?.flight
                };
                self.trusted("interrupting a flight")?;
                let by = Some(BUS_ACTOR.to_string());
                let f = crate::ops::interrupt(&self.broker, control, &flight, by).await?;
                Ok(Answer::Flight(f))
            }
            MethodId::FlightRevert => {
                let flight = if json {
                    bus_body::<m::FlightRevert>(msg)?.flight
                } else {
                    from_pb::<pb::RevertRequest>(msg)?.flight
                };
                self.trusted("reverting a flight's changes")?;
                Ok(Answer::Flight(
                    crate::workspaces::revert(&self.broker, control, &flight, BUS_ACTOR).await?,
                ))
            }
            MethodId::RuleList | MethodId::RuleRemove => self.rules(method.id, msg).await,
            MethodId::ApprovalDecide => {
                // Remembering is asked in JSON (`remember`); protobuf has no field for it.
                let (id, decision, by, remember) = if json {
                    let b = bus_body::<m::ApprovalDecide>(msg)?;
                    (b.approval, b.decision, b.decided_by, b.remember)
                } else {
                    let r: pb::ApproveRequest = from_pb(msg)?;
                    let d = ApprovalDecision::from_pb(r.decision)
                        .map_err(|e| BrokerError::Invalid(e.to_string()))?;
                    let by = if r.decided_by.is_empty() {
                        BUS_ACTOR.to_string()
                    } else {
                        r.decided_by
                    };
                    (r.approval, d, by, None)
                };
                self.trusted("deciding an approval")?;
                Ok(Answer::Approval(
                    crate::ops::decide(
                        &self.broker,
                        control,
                        &id,
                        decision,
                        &by,
                        Some(crate::ops::Via::Bus),
                        remember,
                    )
                    .await?,
                ))
            }
            MethodId::UsageShow => {
                let q = bus_body::<m::UsageShow>(msg)?;
                let report = self.broker.usage(q, None).await?;
                let body = serde_json::to_vec(&report)
                    .map_err(|e| BrokerError::Internal(format!("a usage report's JSON: {e}")))?;
                Ok(Answer::Json(Bytes::from(body)))
            }
            MethodId::Watch => {
                let req = bus_body::<m::Watch>(msg)?;
                let scope = req.scope().map_err(BrokerError::Invalid)?;
                if req.after.is_some() {
                    return Err(BrokerError::Invalid(
                        "`after` resumes an HTTP watch; over NATS, a watcher resumes its JetStream consumer from the last sequence it had".into(),
                    ));
                }
                Ok(Answer::Snapshot(Box::new(self.snapshot(scope).await?)))
            }
            // The table gives no other method a subject.
            other => Err(BrokerError::Invalid(format!(
                "{} is not served on the bus (use {} {})",
                other.method().name,
                other.method().verb.as_str(),
                other.method().route
            ))),
        }
    }
}

impl Service {
    /// Refuses `what` on an open bus: it decides or acts on someone's turn.
    fn trusted(&self, what: &str) -> Result<(), BrokerError> {
        if self.open {
            return Err(BrokerError::OpenBus { what: what.into() });
        }
        Ok(())
    }

    /// On an open bus, a client asks and posts under its own names only: not as the
    /// operator, an agent or one of Relay's own identities, whom the broker
    /// authenticates elsewhere (their tokens, its policies), nor as a look-alike of one
    /// (the printable-ASCII rule of every client name: [`crate::ops::check_client_name`]).
    async fn as_itself(&self, doing: &str, name: &str) -> Result<(), BrokerError> {
        let refused = |why: String| BrokerError::OpenBus {
            what: format!("{doing} as {} ({why})", quote(name)),
        };
        crate::ops::check_client_name(name, crate::ops::Via::Bus, crate::ops::Claim::Stranger)
            .map_err(|e| refused(e.to_string()))?;
        // Without case: `CODEX-1` reads as codex-1 to whoever reads the conversation.
        if self.broker.agent_named_in_any_case(name) {
            return Err(refused("an agent's name".into()));
        }
        Ok(())
    }

    /// A watch's snapshot and where a NATS client follows it. A flight's or an agent's
    /// updates are in the flight stream: the stream's last sequence is read BEFORE the
    /// snapshot, when every update in the stream is already published by the broker,
    /// so at or below the snapshot's seq (the publisher sends only published events);
    /// every update after the snapshot is therefore stored past that sequence. The
    /// client starts a consumer there and drops what has `Relay-Seq` <= the seq.
    async fn snapshot(&self, scope: Scope) -> Result<SnapshotReply, BrokerError> {
        let stream_last = match scope {
            // Its events are on many subjects and in no one stream.
            Scope::Fleet => {
                return Err(BrokerError::Invalid(
                    "the fleet is watched over HTTP (GET /v1/watch?fleet=true), not on the bus: watch a flight, an agent or a conversation".into(),
                ))
            }
            Scope::Flight(_) | Scope::Agent(_) => Some(
                self.js
                    .get_stream(subjects::FLIGHT_STREAM)
                    .await
                    .map_err(|e| {
                        BrokerError::Unavailable(format!("the flight stream cannot be read: {e}"))
                    })?
                    .cached_info()
                    .state
                    .last_sequence,
            ),
            Scope::Conversation { .. } => None,
        };
        let (snapshot, _) = crate::watch::watch(&self.broker, scope).await?;
        let subject = match &snapshot.view {
            View::Fleet(_) => {
                return Err(BrokerError::Invalid(
                    "the fleet is not watched on the bus".into(),
                ))
            }
            View::Flight(v) => subjects::flight(&v.flight.agent, &v.flight.id),
            View::Agent(v) => subjects::agent_flights(&v.agent.spec.name),
            View::Conversation(v) => subjects::conversation(&v.conversation.spec.id),
        };
        let catch_up = CatchUp {
            subject,
            stream: stream_last.map(|_| subjects::FLIGHT_STREAM.to_string()),
            start_sequence: stream_last.map(|q| q + 1),
        };
        Ok(SnapshotReply { snapshot, catch_up })
    }
}

fn is_json(msg: &NatsMessage) -> bool {
    msg.headers
        .as_ref()
        .and_then(|h| h.get(CONTENT_TYPE_HEADER))
        .is_some_and(|v| v.as_str().starts_with(JSON_CONTENT_TYPE))
}

/// The JSON body of a request to method `M`'s subject, as the method table types it.
fn bus_body<M: BusCall>(msg: &NatsMessage) -> Result<<M as BusCall>::Request, BrokerError> {
    from_json(&msg.payload)
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

/// How a request is answered: in JSON or protobuf, as an invoke, a command or a
/// snapshot reply.
#[derive(Clone, Copy)]
struct Form {
    json: bool,
    reply_to: ReplyTo,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ReplyTo {
    Invoke,
    Command,
    /// JSON only.
    Snapshot,
    /// JSON only, of this `Relay-Type`: the subjects added in JSON alone.
    Json(&'static str),
}

/// The `Relay-Type` of the reply to `relay.v1.cmd.usage`: a
/// [`relay_protocol::api::UsageReport`] or an `{"error"}`, JSON only.
pub const USAGE_REPLY_TYPE: &str = "relay.v1.UsageReport+json";

enum Answer {
    Invoked(relay_protocol::api::InvokeAccepted),
    /// The JSON answer carries the consults the mentions started; the protobuf one the
    /// message only (the flights are on the event stream).
    Posted(relay_protocol::api::MessagePosted),
    Flight(relay_protocol::domain::Flight),
    Approval(relay_protocol::domain::Approval),
    Snapshot(Box<SnapshotReply>),
    /// A JSON-only subject's reply, encoded.
    Json(Bytes),
    Error(ApiError),
}

impl Answer {
    fn to_json(&self) -> Bytes {
        let v = match self {
            Answer::Invoked(a) => serde_json::to_vec(a),
            Answer::Posted(p) => serde_json::to_vec(p),
            Answer::Flight(f) => serde_json::to_vec(&FlightAnswer { flight: f.clone() }),
            Answer::Approval(a) => serde_json::to_vec(&ApprovalAnswer {
                approval: a.clone(),
            }),
            Answer::Snapshot(r) => serde_json::to_vec(r),
            Answer::Json(b) => return b.clone(),
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
            Answer::Posted(p) => pb::CommandReply {
                result: Some(C::Message(convert::message_to_pb(&p.message))),
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
            // Never asked for: snapshot and JSON-only replies are always JSON.
            Answer::Snapshot(_) | Answer::Json(_) => pb::CommandReply {
                result: Some(C::Error(pb::Error {
                    code: "invalid_request".into(),
                    message: "this subject is answered in JSON only".into(),
                })),
            }
            .encode_to_vec(),
        };
        Bytes::from(bytes)
    }
}
