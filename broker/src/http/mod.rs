//! The local HTTP API: JSON over HTTP/1.1 on loopback, every route behind a bearer token,
//! live streams over SSE. Routes are listed in `broker/README.md`.
//!
//! [`serve`] accepts the connections under [`HttpLimits`] (a deadline for each request
//! head, a cap on connections); [`router`] reads each request's body up to the limit
//! before its route runs, and answers every route.
//!
//! Every error is `{"error":{"code","message"}}` with the status of its code, including
//! the ones axum itself would answer in plain text (bad JSON, body too large).
//!
//! Its parts: [`serve`] (the listener and its limits), `layers` (what runs before every
//! route: body limit, error shape), `auth` (the token: the operator or an agent, and
//! what an agent's token may do), and the handlers by resource: `agents`,
//! `messages` (conversations and messages), `flights` (invocations, flights, steer,
//! interrupt), `approvals`, `events` (the event log, the SSE streams and watches) and
//! `replay` (a flight, an agent or a conversation read back from the log), and `web`
//! (the dashboard's page and its login).

mod agents;
mod approvals;
mod auth;
mod events;
mod flights;
mod layers;
mod messages;
mod replay;
mod serve;
mod web;

pub use auth::Principal;
pub use serve::{serve, HttpLimits, DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_MAX_CONNECTIONS};
pub use web::{WebAuth, WebSession, CODE_LIFETIME};

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use relay_protocol::api::{ApiError, ErrorBody, ErrorCode, NatsStatus};
use serde::de::DeserializeOwned;
use serde::Deserialize;

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
    /// The dashboard's login links and sessions.
    pub web: Arc<WebAuth>,
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

/// The router, with the token guard and the body limit applied to every route.
pub fn router(state: ApiState, max_body_bytes: usize) -> Router {
    Router::new()
        .route("/v1/status", get(status))
        .route(
            "/v1/agents",
            get(agents::list_agents).post(agents::add_agent),
        )
        .route(
            "/v1/agents/{name}",
            get(agents::show_agent).delete(agents::remove_agent),
        )
        .route("/v1/agents/{name}/wake", post(agents::wake_agent))
        .route("/v1/agents/{name}/peek", get(agents::peek_agent))
        .route(
            "/v1/conversations",
            get(messages::list_conversations).post(messages::add_conversation),
        )
        .route(
            "/v1/conversations/{id}/messages",
            get(messages::read_messages),
        )
        .route("/v1/messages", post(messages::post_message))
        .route("/v1/invocations", post(flights::invoke))
        .route("/v1/flights", get(flights::list_flights))
        .route("/v1/flights/{id}", get(flights::show_flight))
        .route(
            "/v1/flights/{id}/updates",
            get(flights::flight_updates).post(flights::update_flight),
        )
        .route("/v1/flights/{id}/stream", get(events::flight_stream))
        .route("/v1/flights/{id}/tree", get(flights::flight_tree))
        .route("/v1/flights/{id}/steer", post(flights::steer))
        .route("/v1/flights/{id}/interrupt", post(flights::interrupt))
        .route("/v1/flights/{id}/reply", post(flights::reply))
        .route("/v1/approvals", get(approvals::list_approvals))
        .route("/v1/approvals/{id}", post(approvals::decide_approval))
        .route("/v1/events", get(events::list_events))
        .route("/v1/events/stream", get(events::event_stream))
        .route("/v1/watch", get(events::watch_stream))
        .route("/v1/replay/flights/{id}", get(replay::flight))
        .route("/v1/replay/agents/{name}", get(replay::agent))
        .route("/v1/replay/conversations/{id}", get(replay::conversation))
        .route("/v1/login", post(web::new_login))
        .route("/v1/logout", post(web::logout))
        .route("/v1/session", get(web::whoami))
        .fallback(|| async {
            HttpError::new(
                ErrorCode::NotFound,
                "no such route (the routes are listed in broker/README.md)",
            )
        })
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
        // The page: after the layers above, so it takes the session cookie, not the token.
        .merge(web::routes())
        .with_state(state)
}

async fn status(State(s): State<ApiState>) -> ApiResult<relay_protocol::api::Status> {
    // Counters kept by the broker: status never scans, however many flights.
    let counts = s.broker.counts();
    Ok(Json(relay_protocol::api::Status {
        version: env!("CARGO_PKG_VERSION").into(),
        data_dir: s.data_dir.clone(),
        last_seq: s.broker.last_seq(),
        agents: counts.agents,
        flights: counts.flights,
        live_flights: counts.live_flights,
        nats: s.nats.as_ref().map(|f| f()).unwrap_or(NatsStatus::Disabled),
        uptime_ms: s.broker.uptime_ms(),
        flushes: s.broker.flushes(),
    }))
}

#[derive(Deserialize)]
struct AfterQuery {
    after: Option<u64>,
    limit: Option<usize>,
}
