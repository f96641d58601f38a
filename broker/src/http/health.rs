//! The two routes outside the method table, for an operator's monitoring rather than the
//! JSON API: `GET /metrics` (Prometheus' text format, the operator's token like the rest:
//! it shows every agent's usage) and `GET /healthz` (no token: it says only `ok`, 200,
//! or 503 when the broker can no longer write or is stopping).

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use relay_protocol::api::ErrorCode;

use super::{ApiState, HttpError, Principal};

/// Prometheus' text exposition format.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

pub(super) async fn metrics(
    State(s): State<ApiState>,
    principal: Option<Extension<Principal>>,
) -> Response {
    // Every agent's tokens and cost: the operator's, as the usage report is.
    if !matches!(principal, Some(Extension(Principal::Operator))) {
        return HttpError::new(
            ErrorCode::Unauthorized,
            "/metrics takes the operator's token (an agent's token reads only its own)",
        )
        .into_response();
    }
    let Some(metrics) = s.metrics.as_ref() else {
        return HttpError::new(ErrorCode::Unavailable, "this broker keeps no metrics")
            .into_response();
    };
    let mut response = metrics.render().await.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(TEXT_FORMAT));
    response
}

pub(super) async fn healthz(State(s): State<ApiState>) -> Response {
    if s.broker.has_failed() || s.shutdown.is_cancelled() {
        (StatusCode::SERVICE_UNAVAILABLE, "unavailable").into_response()
    } else {
        (StatusCode::OK, "ok").into_response()
    }
}
