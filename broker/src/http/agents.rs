//! The agent routes: list, add, show, remove, wake.

use axum::extract::{Path, State};
use axum::Json;
use relay_protocol::domain::{Agent, AgentSpec};

use super::{ApiJson, ApiResult, ApiState};
use crate::error::BrokerError;
use crate::store::T;

/// Starts the agent's session (a `manual` agent needs this before its first turn).
pub(super) async fn wake_agent(
    State(s): State<ApiState>,
    Path(name): Path<String>,
) -> ApiResult<Agent> {
    let agent = s
        .broker
        .agent(&name)
        .await?
        .ok_or_else(|| BrokerError::UnknownAgent(name.clone()))?;
    let control = s
        .control
        .clone()
        .ok_or_else(|| BrokerError::Unavailable("no runtime serves this broker".into()))?;
    control.wake(agent.clone()).await?;
    Ok(Json(agent))
}

pub(super) async fn list_agents(State(s): State<ApiState>) -> ApiResult<Vec<Agent>> {
    Ok(Json(
        s.broker.store().read(|st| st.values(T::Agents)).await?,
    ))
}

pub(super) async fn add_agent(
    State(s): State<ApiState>,
    ApiJson(spec): ApiJson<AgentSpec>,
) -> ApiResult<Agent> {
    Ok(Json(s.broker.register_agent(spec).await?))
}

pub(super) async fn show_agent(
    State(s): State<ApiState>,
    Path(name): Path<String>,
) -> ApiResult<Agent> {
    Ok(Json(
        s.broker
            .agent(&name)
            .await?
            .ok_or(BrokerError::UnknownAgent(name))?,
    ))
}

pub(super) async fn remove_agent(
    State(s): State<ApiState>,
    Path(name): Path<String>,
) -> ApiResult<Agent> {
    Ok(Json(s.broker.remove_agent(&name).await?))
}
