//! The invocation and flight routes: invoke, list and show flights, their updates, steer,
//! interrupt, a flight's diff and its revert.

use axum::extract::{Path, Query, State};
use axum::Extension;
use axum::Json;
use relay_protocol::api::ListedFlight;
use relay_protocol::domain::{Flight, FlightChange};
use relay_protocol::methods::call as m;

use super::{ApiJson, ApiResult, ApiState, Login, Principal, Req};
use crate::error::BrokerError;
use crate::store::{FlightScan, Store};

/// An agent's token invokes as that agent, linked to the flight it is running; a
/// dashboard login asks as `NAME@dashboard`, whatever the body says.
pub(super) async fn invoke(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    login: Option<Extension<Login>>,
    ApiJson(mut req): ApiJson<Req<m::Invoke>>,
) -> ApiResult<relay_protocol::api::InvokeAccepted> {
    if let Some(Extension(web)) = login {
        req.requester = web.decided_by();
    }
    principal.act_as(&req.requester)?;
    let given = req.parent_flight.take();
    let accepted = principal
        .with_parent(&s.broker, given, |parent| {
            let mut req = req.clone();
            req.parent_flight = parent;
            s.broker.invoke(req)
        })
        .await?;
    Ok(Json(accepted))
}

/// Most flights a text search (`q`) reads, newest first, matching or not: a search of a
/// large store answers from its newest flights rather than read them all.
const SEARCH_READS: usize = 10_000;

/// An agent's token lists the flights it runs or asked for. `since` and `q` narrow the
/// list by time and text (see [`matches_text`]); it all runs in the store's reader, off
/// the async workers.
pub(super) async fn list_flights(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Query(q): Query<Req<m::FlightList>>,
) -> ApiResult<Vec<ListedFlight>> {
    let me = principal.agent().map(str::to_string);
    let since = match q.since.as_deref() {
        Some(text) => Some(
            relay_protocol::clock::parse_since_or_ms(text, relay_protocol::clock::now_ms())
                .map_err(|e| BrokerError::Invalid(format!("since: {e}")))?,
        ),
        None => None,
    };
    // Any case: both sides lowercased. An empty text is no search.
    let text =
        q.q.as_deref()
            .map(str::to_lowercase)
            .filter(|t| !t.is_empty());
    // Flight ids are time-ordered; newest last, and `limit` keeps the newest. Live
    // flights come from their index; others from the newest back, up to `limit`.
    let scan = FlightScan {
        limit: q.limit.unwrap_or(100),
        since,
        max_read: if text.is_some() {
            SEARCH_READS
        } else {
            usize::MAX
        },
    };
    let keep = move |f: &Flight| {
        q.agent.as_ref().is_none_or(|a| &f.agent == a)
            && q.state.is_none_or(|st| f.state == st)
            && (!q.live || !f.state.is_terminal())
            && since.is_none_or(|s| f.created_at >= s)
    };
    let live = q.live;
    let out = s
        .broker
        .store()
        .read_listing(move |st| {
            // A flight whose invocation cannot be read is left out of an agent's list.
            let visible = |f: &Flight| {
                me.as_deref()
                    .is_none_or(|me| super::reads::own_flight(st, f, me).unwrap_or(false))
            };
            let keep = |f: &Flight| -> Result<bool, BrokerError> {
                Ok(keep(f)
                    && visible(f)
                    && match &text {
                        Some(t) => matches_text(st, f, t)?,
                        None => true,
                    })
            };
            let flights = if live {
                let mut out = Vec::new();
                for f in st.live_flights()? {
                    if keep(&f)? {
                        out.push(f);
                    }
                }
                out.drain(..out.len().saturating_sub(scan.limit));
                out
            } else {
                st.scan_flights(&scan, keep)?
            };
            flights
                .into_iter()
                .map(|f| {
                    let invocation = st.invocation(&f.invocation)?;
                    Ok(ListedFlight::new(f, invocation.as_ref()))
                })
                .collect::<Result<Vec<_>, BrokerError>>()
        })
        .await?;
    Ok(Json(out))
}

/// Whether flight `f`'s id, agent, output, or its invocation's requester or task holds
/// `text` (lowercase already), in any case. The invocation is read only when the
/// flight's own fields do not hold it.
fn matches_text(st: &Store, f: &Flight, text: &str) -> Result<bool, BrokerError> {
    let has = |s: &str| s.to_lowercase().contains(text);
    if has(&f.id) || has(&f.agent) || f.output.as_deref().is_some_and(has) {
        return Ok(true);
    }
    Ok(st
        .invocation(&f.invocation)?
        .is_some_and(|i| has(&i.requester) || has(&i.task)))
}

pub(super) async fn show_flight(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> ApiResult<Flight> {
    principal.may_read_flight(&s.broker, &id).await?;
    Ok(Json(
        s.broker
            .flight(&id)
            .await?
            .ok_or(BrokerError::UnknownFlight(id))?,
    ))
}

pub(super) async fn flight_updates(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    Query(q): Query<Req<m::FlightUpdates>>,
) -> ApiResult<Vec<relay_protocol::domain::FlightUpdate>> {
    principal.may_read_flight(&s.broker, &id).await?;
    let after = q.after.unwrap_or(0);
    let updates = s
        .broker
        .store()
        // A long flight's updates: never held against the writer. A batch going in
        // meanwhile shows a prefix of its updates, each whole, in order.
        .read_listing(move |store| {
            if store.flight(&id)?.is_none() {
                return Err(BrokerError::UnknownFlight(id));
            }
            store.flight_updates(&id, after)
        })
        .await?;
    Ok(Json(updates))
}

pub(super) async fn update_flight(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<Req<m::FlightWrite>>,
) -> ApiResult<relay_protocol::api::UpdateResult> {
    // What a flight did to its agent's worktree is the runtime's record of git's work (a
    // revert reverts what it names, and the rule takes it after the flight ended): a
    // client cannot write one.
    if let FlightChange::Commit { .. } | FlightChange::Reverted { .. } = &body.change {
        return Err(BrokerError::Invalid(format!(
            "a flight's commit and its revert are recorded by the runtime that made them, not written by a client; `relay revert {id}` reverts its commit"
        ))
        .into());
    }
    Ok(Json(s.broker.update_flight(&id, body.change).await?))
}

/// Recorded with the steer's note as its caller ([`Principal::actor`]).
pub(super) async fn steer(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    login: Option<Extension<Login>>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<Req<m::FlightSteer>>,
) -> ApiResult<Flight> {
    principal.may_control(&s.broker, &id).await?;
    let by = principal.actor(login.as_deref());
    Ok(Json(
        crate::ops::steer(&s.broker, s.control.as_ref(), &id, body.text, Some(by)).await?,
    ))
}

/// Noted on the flight as asked by its caller ([`Principal::actor`]).
pub(super) async fn interrupt(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    login: Option<Extension<Login>>,
    Path(id): Path<String>,
) -> ApiResult<Flight> {
    principal.may_control(&s.broker, &id).await?;
    let by = principal.actor(login.as_deref());
    Ok(Json(
        crate::ops::interrupt(&s.broker, s.control.as_ref(), &id, Some(by)).await?,
    ))
}

/// `relay reply`: the agent's answer to its running flight.
pub(super) async fn reply(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<Req<m::FlightReply>>,
) -> ApiResult<Flight> {
    principal.may_answer(&s.broker, &id).await?;
    Ok(Json(
        crate::ops::reply(&s.broker, s.control.as_ref(), &id, body.text).await?,
    ))
}

/// Most flights in one tree answer.
const TREE_LIMIT: usize = 10_000;

pub(super) async fn flight_tree(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> ApiResult<relay_protocol::api::FlightTree> {
    principal.may_read_flight(&s.broker, &id).await?;
    Ok(Json(
        s.broker
            .store()
            .read(move |st| st.flight_tree(&id, TREE_LIMIT))
            .await?,
    ))
}

/// `relay diff FLIGHT`: its commit as recorded, with the patch.
pub(super) async fn flight_diff(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> ApiResult<relay_protocol::api::FlightDiff> {
    principal.may_read_flight(&s.broker, &id).await?;
    Ok(Json(crate::workspaces::flight_diff(&s.broker, &id).await?))
}

/// `relay revert FLIGHT`: a revert commit on its agent's branch (an operator's call).
pub(super) async fn revert(State(s): State<ApiState>, Path(id): Path<String>) -> ApiResult<Flight> {
    Ok(Json(
        crate::workspaces::revert(&s.broker, s.control.as_ref(), &id, "operator").await?,
    ))
}
