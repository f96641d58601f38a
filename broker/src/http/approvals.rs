//! The approval routes: list approvals and decide one.

use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use relay_protocol::api::ErrorCode;
use relay_protocol::domain::{Approval, ApprovalState};
use relay_protocol::methods::call as m;

use super::{ApiJson, ApiResult, ApiState, HttpError, Login, Principal, Req};
use crate::error::quote;
use crate::store::T;

/// An agent's token lists the approvals of the flights it runs or asked for.
pub(super) async fn list_approvals(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Query(q): Query<Req<m::ApprovalList>>,
) -> ApiResult<Vec<Approval>> {
    let me = principal.agent().map(str::to_string);
    let all: Vec<Approval> = s
        .broker
        .store()
        .read_listing(move |st| {
            let all: Vec<Approval> = st.values(T::Approvals)?;
            let Some(me) = &me else {
                return Ok(all);
            };
            let mut mine = Vec::new();
            for a in all {
                if super::reads::own_approval(st, &a, me)? {
                    mine.push(a);
                }
            }
            Ok(mine)
        })
        .await?;
    let want = match q.state.as_deref().unwrap_or("pending") {
        "pending" => Some(ApprovalState::Pending),
        "decided" => Some(ApprovalState::Decided),
        "expired" => Some(ApprovalState::Expired),
        "all" => None,
        other => {
            return Err(HttpError::new(
                ErrorCode::InvalidRequest,
                format!(
                    "unknown approval state {}; use pending, decided, expired or all",
                    quote(other)
                ),
            ))
        }
    };
    Ok(Json(
        all.into_iter()
            .filter(|a| want.is_none_or(|w| a.state == w))
            .collect(),
    ))
}

/// Decides an approval; a dashboard login's decision is recorded under its name
/// (`alice@dashboard`), whatever the body says.
pub(super) async fn decide_approval(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    login: Option<Extension<Login>>,
    ApiJson(body): ApiJson<Req<m::ApprovalDecide>>,
) -> ApiResult<Approval> {
    let (decided_by, via) = match login {
        Some(Extension(web)) => (web.decided_by(), crate::ops::Via::Dashboard),
        None => (body.decided_by, crate::ops::Via::Client),
    };
    Ok(Json(
        crate::ops::decide(
            &s.broker,
            s.control.as_ref(),
            &id,
            body.decision,
            &decided_by,
            Some(via),
            body.remember,
        )
        .await?,
    ))
}
