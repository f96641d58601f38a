//! Replays of the log: `GET /v1/replay/flights/{id}`, `/v1/replay/agents/{name}` and
//! `/v1/replay/conversations/{id}`, each with `?from_seq=N` (the entries after global
//! seq N). Built by [`crate::replay`] on the blocking pool.

use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use relay_protocol::methods::call as m;
use relay_protocol::replay::{AgentReplay, ConversationReplay, TurnReplay};

use super::{ApiResult, ApiState, Principal, Req};

pub(super) async fn flight(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    Query(q): Query<Req<m::ReplayFlight>>,
) -> ApiResult<TurnReplay> {
    principal.may_read_flight(&s.broker, &id).await?;
    let from = q.from_seq.unwrap_or(0);
    Ok(Json(crate::replay::flight(&s.broker, id, from).await?))
}

pub(super) async fn agent(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    Query(q): Query<Req<m::ReplayAgent>>,
) -> ApiResult<AgentReplay> {
    principal.may_read_agent(&name)?;
    let from = q.from_seq.unwrap_or(0);
    Ok(Json(crate::replay::agent(&s.broker, name, from).await?))
}

pub(super) async fn conversation(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    Query(q): Query<Req<m::ReplayConversation>>,
) -> ApiResult<ConversationReplay> {
    principal.may_read_conversation(&s.broker, &id).await?;
    let from = q.from_seq.unwrap_or(0);
    Ok(Json(
        crate::replay::conversation(&s.broker, id, from).await?,
    ))
}
