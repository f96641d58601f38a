//! The local HTTP API: JSON over HTTP/1.1 on loopback, every route behind a bearer token,
//! live streams over SSE. The routes are the method table's
//! ([`relay_protocol::methods`]); `broker/README.md` documents them (a test keeps the two
//! the same).
//!
//! [`serve`] accepts the connections under [`HttpLimits`] (a deadline for each request
//! head, connection slots with a reserve for the operator, a cap on each agent's
//! streams, a stall timeout); [`router`] checks `Host` and `Origin`, reads each
//! request's body up to the limit before its route runs, and answers every route.
//!
//! Every error is `{"error":{"code","message"}}` with the status of its code, including
//! the ones axum itself would answer in plain text (bad JSON, body too large).
//!
//! Its parts: [`serve`] (the listener and its limits), `slots` (the connection slots:
//! a general pool and a reserve for the operator; writes that wait on a client),
//! `layers` (what runs before every route: the guard of slots, `Host` and `Origin`, body
//! limit, error shape, the cap on each agent's streams), `auth` (the token: the operator
//! or an agent, and what an agent's token may do), `reads` (what an agent's token may
//! read), and the handlers by resource: `agents`,
//! `messages` (conversations and messages), `flights` (invocations, flights, steer,
//! interrupt), `approvals`, `rules` (remembered decisions), `events` (the event log, the
//! SSE streams and watches), `sse` (the frames and body of the streams of events: each
//! event's stored JSON as it is, not serialized per client), `replay` (a flight, an agent or a conversation read back
//! from the log), `usage` (the usage report, an agent's budget), `web` (the dashboard's
//! page and its login routes), `login` (the dashboard's logins: codes, cookies, their
//! end), `login_keys` (the login cookies' key and revocations, kept in the data dir), and `health` (`/metrics` and `/healthz`, outside the method
//! table: not JSON).
//!
//! Each request runs in a tracing span `request` with its method's name from the table
//! (`method = "flight.show"`) and its route, so every line it logs says which call it was.

mod agents;
mod approvals;
mod auth;
mod events;
mod flights;
mod health;
mod layers;
mod login;
mod login_keys;
mod messages;
mod reads;
mod replay;
mod rules;
mod serve;
mod slots;
mod sse;
mod usage;
mod web;

pub use auth::Principal;
pub use login::{Login, WebAuth, CODE_LIFETIME};
pub use serve::{
    serve, HttpLimits, DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_RESERVED_CONNECTIONS, DEFAULT_STREAMS_PER_AGENT, DEFAULT_WRITE_STALL_TIMEOUT,
};

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::{Json, Router};
use relay_protocol::api::{ApiError, ErrorBody, ErrorCode, NatsStatus};
use relay_protocol::methods::{MethodId, Verb, METHODS};
use serde::de::DeserializeOwned;

use crate::broker::Broker;
use crate::error::{clip, BrokerError, MAX_ERROR_MESSAGE};
use crate::ports::FlightControl;

/// Reports the NATS connection for `GET /v1/status`.
pub type NatsStatusFn = Arc<dyn Fn() -> NatsStatus + Send + Sync>;

#[derive(Clone)]
pub struct ApiState {
    pub broker: Broker,
    pub token: Arc<str>,
    /// Makes and checks each agent's scoped token (`None`: only the operator's token).
    pub agent_tokens: Option<crate::seal::AgentTokens>,
    pub data_dir: String,
    pub control: Option<Arc<dyn FlightControl>>,
    pub nats: Option<NatsStatusFn>,
    /// Ends live streams, so a graceful shutdown does not wait on open SSE clients.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// The dashboard's login links and logins.
    pub web: Arc<WebAuth>,
    /// The connections' limits (the router takes its cap on each agent's streams).
    pub limits: HttpLimits,
    /// The series `/metrics` renders (`None`: it answers `unavailable`).
    pub metrics: Option<crate::telemetry::Metrics>,
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

/// The router, with the token guard and the body limit applied to every route. Its
/// routes are the method table's ([`relay_protocol::methods`]): each method's verb and
/// route from the table, its handler from [`handler`].
pub fn router(state: ApiState, max_body_bytes: usize) -> Router {
    // Methods that share a route (GET and POST /v1/agents) share its MethodRouter.
    let mut routes: Vec<(&'static str, MethodRouter<ApiState>)> = Vec::new();
    for m in METHODS {
        let h = handler(m.id);
        match routes.iter_mut().find(|(route, _)| *route == m.route) {
            Some((_, existing)) => *existing = std::mem::take(existing).merge(h),
            None => routes.push((m.route, h)),
        }
    }
    let mut router = Router::new();
    for (route, methods) in routes {
        router = router.route(route, methods);
    }
    // Not the JSON API (not in the method table), but behind the token like it.
    router = router.route("/metrics", axum::routing::get(health::metrics));
    router
        .fallback(|| async {
            HttpError::new(
                ErrorCode::NotFound,
                "no such route (the routes are listed in broker/README.md)",
            )
        })
        // Inside the token guard: it counts each agent's streams by its principal.
        .layer(middleware::from_fn_with_state(
            layers::Streams::new(
                state.limits.streams_per_agent,
                state.broker.refusals().clone(),
            ),
            layers::cap_streams,
        ))
        .layer(middleware::from_fn_with_state(
            layers::BodyLimit(max_body_bytes),
            layers::read_body,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(middleware::from_fn(layers::json_errors))
        // The page: after the layers above, so it takes the login cookie, not the token.
        .merge(web::routes())
        // No token: a monitor's probe says only up or not.
        .route("/healthz", axum::routing::get(health::healthz))
        // Outermost, the page's routes included: the connection's slot, Host and Origin.
        .layer(middleware::from_fn_with_state(state.clone(), layers::guard))
        // Around all of it: the request's span.
        .layer(middleware::from_fn(layers::span))
        .with_state(state)
}

/// The request type the method table gives method `M` (a `POST`'s body, a `GET`'s
/// query): each handler takes its method's, so the table and the handlers cannot
/// disagree on what a route reads.
pub(super) type Req<M> = <M as relay_protocol::methods::Call>::Request;

/// Each method's handler: the one place a method meets its code. The match is
/// exhaustive, so a method added to the table without a handler does not compile.
fn handler(id: MethodId) -> MethodRouter<ApiState> {
    let filter = match id.method().verb {
        Verb::Get => MethodFilter::GET,
        Verb::Post => MethodFilter::POST,
        Verb::Delete => MethodFilter::DELETE,
    };
    use MethodId as M;
    match id {
        M::StatusShow => on(filter, status),
        M::AgentList => on(filter, agents::list_agents),
        M::AgentAdd => on(filter, agents::add_agent),
        M::AgentShow => on(filter, agents::show_agent),
        M::AgentRemove => on(filter, agents::remove_agent),
        M::AgentWake => on(filter, agents::wake_agent),
        M::AgentPeek => on(filter, agents::peek_agent),
        M::AgentFork => on(filter, agents::fork_agent),
        M::AgentDiffShow => on(filter, agents::agent_diff),
        M::FlightDiffShow => on(filter, flights::flight_diff),
        M::FlightRevert => on(filter, flights::revert),
        M::ConversationList => on(filter, messages::list_conversations),
        M::ConversationAdd => on(filter, messages::add_conversation),
        M::ConversationRead => on(filter, messages::read_messages),
        M::MessagePost => on(filter, messages::post_message),
        M::Invoke => on(filter, flights::invoke),
        M::FlightList => on(filter, flights::list_flights),
        M::FlightShow => on(filter, flights::show_flight),
        M::FlightUpdates => on(filter, flights::flight_updates),
        M::FlightWrite => on(filter, flights::update_flight),
        M::FlightStream => on(filter, events::flight_stream),
        M::FlightTreeShow => on(filter, flights::flight_tree),
        M::FlightSteer => on(filter, flights::steer),
        M::FlightInterrupt => on(filter, flights::interrupt),
        M::FlightReply => on(filter, flights::reply),
        M::ApprovalList => on(filter, approvals::list_approvals),
        M::ApprovalDecide => on(filter, approvals::decide_approval),
        M::EventList => on(filter, events::list_events),
        M::EventStream => on(filter, events::event_stream),
        M::Watch => on(filter, events::watch_stream),
        M::ReplayFlight => on(filter, replay::flight),
        M::ReplayAgent => on(filter, replay::agent),
        M::ReplayConversation => on(filter, replay::conversation),
        M::LoginCreate => on(filter, web::new_login),
        M::LoginShow => on(filter, web::whoami),
        M::LoginEnd => on(filter, web::logout),
        M::LoginRevokeAll => on(filter, web::revoke_all),
        M::RuleList => on(filter, rules::list_rules),
        M::RuleShow => on(filter, rules::show_rule),
        M::RuleRemove => on(filter, rules::remove_rule),
        M::AgentSet => on(filter, usage::set_agent),
        M::AgentBudget => on(filter, usage::agent_budget),
        M::UsageShow => on(filter, usage::usage),
    }
}

async fn status(
    State(s): State<ApiState>,
    principal: Option<axum::Extension<auth::Principal>>,
) -> ApiResult<relay_protocol::api::Status> {
    // Counters kept by the broker: status never scans, however many flights.
    let counts = s.broker.counts();
    let nats = s.nats.as_ref().map(|f| f()).unwrap_or(NatsStatus::Disabled);
    // An agent's token learns whether the bus is up, not where it is.
    let nats = match principal {
        Some(axum::Extension(auth::Principal::Agent(_))) => nats.without_address(),
        _ => nats,
    };
    // One `statvfs`, off the async workers (never through the storage thread: status
    // answers even while it is busy or stuck).
    let disk = relay_infra::storage::read(relay_infra::disk::space)
        .await
        .ok()
        .flatten()
        .map(|d| relay_protocol::api::DiskStatus {
            free_bytes: d.free,
            reserve_bytes: d.reserve,
            full: d.full(),
        });
    Ok(Json(relay_protocol::api::Status {
        version: env!("CARGO_PKG_VERSION").into(),
        data_dir: s.data_dir.clone(),
        last_seq: s.broker.last_seq(),
        agents: counts.agents,
        flights: counts.flights,
        live_flights: counts.live_flights,
        nats,
        uptime_ms: s.broker.uptime_ms(),
        flushes: s.broker.flushes(),
        disk,
    }))
}
