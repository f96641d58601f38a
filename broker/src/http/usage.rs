//! The usage routes: the report of `relay usage` (`GET /v1/usage`), and an agent's
//! budget: set (`POST /v1/agents/{name}`, `relay agent set`) and read with what it used
//! today (`GET /v1/agents/{name}/budget`).

use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use relay_protocol::api::{BudgetStatus, UsageReport};
use relay_protocol::domain::Agent;
use relay_protocol::methods::call as m;

use super::{ApiJson, ApiResult, ApiState, Login, Principal, Req};

/// `relay usage`: an agent's token adds up only the flights it runs or asked for (as
/// its flight list shows them).
pub(super) async fn usage(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Query(q): Query<Req<m::UsageShow>>,
) -> ApiResult<UsageReport> {
    Ok(Json(s.broker.usage(q, principal.agent()).await?))
}

/// Recorded as set by its caller ([`Principal::actor`]).
pub(super) async fn set_agent(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    login: Option<Extension<Login>>,
    Path(name): Path<String>,
    ApiJson(settings): ApiJson<Req<m::AgentSet>>,
) -> ApiResult<Agent> {
    let by = principal.actor(login.as_deref());
    Ok(Json(
        s.broker.set_agent_as(&name, settings, Some(by)).await?,
    ))
}

/// An agent's token reads its own budget only (another's would tell its usage).
pub(super) async fn agent_budget(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> ApiResult<BudgetStatus> {
    principal.may_read_agent(&name)?;
    Ok(Json(s.broker.budget_status(&name).await?))
}
