//! The agent routes: list, add, show, remove, wake, peek at a tmux agent's pane, fork, and
//! an agent's diff.

use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use relay_protocol::api::{AgentAdded, Peek};
use relay_protocol::domain::Agent;
use relay_protocol::methods::call as m;

use super::{ApiJson, ApiResult, ApiState, Login, Principal, Req};
use crate::error::BrokerError;
use crate::store::T;

/// Starts the agent's session (a `manual` agent needs this before its first turn).
/// Noted on the agent as asked by its caller ([`Principal::actor`]), before the runtime is
/// asked: a wake that then fails is still on record as asked.
pub(super) async fn wake_agent(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    login: Option<Extension<Login>>,
    Path(name): Path<String>,
) -> ApiResult<Agent> {
    let control = s.control.clone().ok_or(BrokerError::NoRuntime)?;
    let by = principal.actor(login.as_deref());
    let agent = s.broker.wake_asked(&name, Some(by)).await?;
    control.wake(agent.clone()).await?;
    Ok(Json(agent))
}

pub(super) async fn list_agents(State(s): State<ApiState>) -> ApiResult<Vec<Agent>> {
    let agents: Vec<Agent> = s.broker.store().read(|st| st.values(T::Agents)).await?;
    Ok(Json(
        agents.into_iter().map(|a| s.broker.shown(a)).collect(),
    ))
}

/// Registered as added by its caller ([`Principal::actor`]).
pub(super) async fn add_agent(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    login: Option<Extension<Login>>,
    ApiJson(spec): ApiJson<Req<m::AgentAdd>>,
) -> ApiResult<AgentAdded> {
    let by = principal.actor(login.as_deref());
    if let Some(pane) = spec.pane.clone().filter(|p| p.target.is_some()) {
        // Two agents answering through one pane would take each other's tasks.
        let name = spec.name.clone();
        let taken = s
            .broker
            .store()
            .read(move |st| {
                let agents: Vec<Agent> = st.values(T::Agents)?;
                Ok(agents
                    .into_iter()
                    .find(|a| a.spec.pane.as_ref() == Some(&pane) && a.spec.name != name))
            })
            .await?;
        if let Some(other) = taken {
            let pane = other.spec.pane.clone().unwrap_or_default();
            return Err(BrokerError::Invalid(format!(
                "pane {} of tmux server {} is agent {}'s already",
                pane.target.unwrap_or_default(),
                pane.socket,
                other.spec.name
            ))
            .into());
        }
    }
    Ok(Json(
        s.broker
            .add_agent_as(spec, s.control.as_deref(), Some(by))
            .await?,
    ))
}

pub(super) async fn show_agent(
    State(s): State<ApiState>,
    Path(name): Path<String>,
) -> ApiResult<Agent> {
    let agent = s
        .broker
        .agent(&name)
        .await?
        .ok_or(BrokerError::UnknownAgent(name))?;
    Ok(Json(s.broker.shown(agent)))
}

/// How many lines `peek` shows when the caller does not say, and at most.
const PEEK_DEFAULT: usize = 40;
const PEEK_MAX: usize = 10_000;

/// `relay agent peek`: what a tmux agent's pane shows now, as plain text, read by the
/// runtime (the port's `peek`). Only for a pane on this broker's host (the embedded
/// runtime's agents).
pub(super) async fn peek_agent(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    Query(q): Query<Req<m::AgentPeek>>,
) -> ApiResult<Peek> {
    principal.may_read_agent(&name)?;
    let agent = s
        .broker
        .agent(&name)
        .await?
        .ok_or_else(|| BrokerError::UnknownAgent(name.clone()))?;
    let control = s.control.clone().ok_or(BrokerError::NoRuntime)?;
    let lines = q.lines.unwrap_or(PEEK_DEFAULT).clamp(1, PEEK_MAX);
    Ok(Json(control.peek(agent, lines).await?))
}

/// `relay agent remove [--force]` (`?force=true`): refused while its worktree holds
/// uncommitted work, unless forced.
/// Recorded as removed by its caller ([`Principal::actor`]).
pub(super) async fn remove_agent(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    login: Option<Extension<Login>>,
    Path(name): Path<String>,
    Query(q): Query<Req<m::AgentRemove>>,
) -> ApiResult<Agent> {
    let by = Some(principal.actor(login.as_deref()));
    Ok(Json(
        crate::workspaces::remove_agent(&s.broker, s.control.as_ref(), &name, q.force, by).await?,
    ))
}

/// `relay agent fork SRC NEW [--at FLIGHT]`.
/// The new agent is registered as added by the caller ([`Principal::actor`]).
pub(super) async fn fork_agent(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    login: Option<Extension<Login>>,
    Path(name): Path<String>,
    ApiJson(req): ApiJson<Req<m::AgentFork>>,
) -> ApiResult<AgentAdded> {
    let by = Some(principal.actor(login.as_deref()));
    Ok(Json(
        crate::workspaces::fork_as(&s.broker, s.control.as_ref(), &name, req, by).await?,
    ))
}

/// `relay diff AGENT`: its branch against its base, read by its runtime.
pub(super) async fn agent_diff(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> ApiResult<relay_protocol::api::AgentDiff> {
    principal.may_read_agent(&name)?;
    Ok(Json(
        crate::workspaces::agent_diff(&s.broker, s.control.as_ref(), &name).await?,
    ))
}
