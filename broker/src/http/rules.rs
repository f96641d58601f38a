//! The remembered rules' routes: list (an agent's token: the rules that apply to it),
//! show, remove (recorded as removed by the operator, or `NAME@dashboard` for a
//! dashboard login).

use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use relay_protocol::domain::{decider, Rule};
use relay_protocol::methods::call as m;

use super::{ApiResult, ApiState, Login, Principal, Req};
use crate::error::{quote, BrokerError};

pub(super) async fn list_rules(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Query(q): Query<Req<m::RuleList>>,
) -> ApiResult<Vec<Rule>> {
    let agent = match (principal.agent(), q.agent) {
        (None, agent) => agent,
        (Some(me), None) => Some(me.to_string()),
        (Some(me), Some(other)) if other == me => Some(other),
        (Some(me), Some(other)) => return Err(not_its_own(me, &other).into()),
    };
    Ok(Json(
        crate::remembered::list(&s.broker, agent.as_deref()).await?,
    ))
}

/// An agent's token sees a rule only if it applies to that agent now.
pub(super) async fn show_rule(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> ApiResult<Rule> {
    if let Some(me) = principal.agent() {
        let mine = crate::remembered::list(&s.broker, Some(me)).await?;
        return match mine.into_iter().find(|r| r.id == id) {
            Some(rule) => Ok(Json(rule)),
            None => Err(BrokerError::UnknownRule(id).into()),
        };
    }
    Ok(Json(crate::remembered::show(&s.broker, &id).await?))
}

pub(super) async fn remove_rule(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    login: Option<Extension<Login>>,
) -> ApiResult<Rule> {
    let (by, via) = match login {
        Some(Extension(web)) => (web.decided_by(), crate::ops::Via::Dashboard),
        None => (decider::OPERATOR.to_string(), crate::ops::Via::Client),
    };
    Ok(Json(
        crate::remembered::remove(&s.broker, &id, &by, via).await?,
    ))
}

fn not_its_own(me: &str, other: &str) -> BrokerError {
    BrokerError::Unauthorized(format!(
        "agent {}'s token lists the rules that apply to it, not agent {}'s",
        quote(me),
        quote(other)
    ))
}
