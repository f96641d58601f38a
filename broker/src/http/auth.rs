//! Who is calling: the operator (the token of `api.json`, which can do everything) or an
//! agent (its scoped token, `relay-agent.<name>.<mac>`, which its session has in
//! `RELAY_TOKEN`).
//!
//! An agent's token asks, sends, replies and reads as that agent only:
//! - every read route (`GET`) is open to it, each handler limiting it to what the agent
//!   asked or was asked (`reads`);
//! - it may post messages, invoke, and steer or interrupt the flights it asked for, each
//!   as itself (a handler checks the actor through [`Principal::act_as`]);
//! - everything else (approving, registering, removing or waking agents, creating
//!   conversations, writing flight updates, logging out) is refused here, before the
//!   route runs.
//!
//! Which routes are which is each method's scope in the method table
//! ([`relay_protocol::methods::Scope`]): `Read` and `Agent` are open to an agent's token,
//! `Operator` is not.
//!
//! What an agent asks is linked to the flight it is running ([`Principal::parent_flight`]):
//! a persistent session serves many turns, so no flight id in its environment could be
//! right, but an agent runs one turn at a time.

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use relay_protocol::api::ErrorCode;
use relay_protocol::domain::{Flight, FlightState};

use super::{ApiState, HttpError, Login};
use crate::broker::Broker;
use crate::error::{quote, BrokerError};
use crate::seal::{token_matches, AgentTokens};

/// The caller of a request, put in its extensions by [`require_token`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    Operator,
    Agent(String),
}

impl Principal {
    /// Who this caller's action is recorded as (a requester, an author, an event's or a
    /// note's `by`): a dashboard login as `NAME@dashboard` whatever the body says, the
    /// operator's token as `operator`, an agent's token as the agent.
    pub fn actor(&self, login: Option<&Login>) -> String {
        match (login, self) {
            (Some(web), _) => web.decided_by(),
            (None, Principal::Operator) => relay_protocol::domain::decider::OPERATOR.to_string(),
            (None, Principal::Agent(me)) => me.clone(),
        }
    }

    /// Whether this caller may act as `actor` (a message's author, an ask's requester):
    /// the operator as anyone, an agent only as itself.
    pub fn act_as(&self, actor: &str) -> Result<(), BrokerError> {
        match self {
            Principal::Operator => Ok(()),
            Principal::Agent(me) if actor == me => Ok(()),
            Principal::Agent(me) => Err(BrokerError::Unauthorized(format!(
                "agent {}'s token acts as {} only, not as {}",
                quote(me),
                quote(me),
                quote(actor)
            ))),
        }
    }

    /// The parent flight of what this caller asks: for the operator, `given`; for an
    /// agent, `given` when it is a live flight of its own, else the flight it is running
    /// now (none when it runs none: a root invocation).
    pub async fn parent_flight(
        &self,
        broker: &Broker,
        given: Option<String>,
    ) -> Result<Option<String>, BrokerError> {
        let Principal::Agent(me) = self else {
            return Ok(given);
        };
        if let Some(id) = given {
            let flight = broker
                .flight(&id)
                .await?
                .ok_or_else(|| BrokerError::UnknownFlight(id.clone()))?;
            if &flight.agent != me || flight.state.is_terminal() {
                return Err(BrokerError::Unauthorized(format!(
                    "agent {}'s token can link what it asks only to a live flight of its own, and flight {} is {}",
                    quote(me),
                    quote(&id),
                    if &flight.agent != me {
                        format!("agent {}'s", quote(&flight.agent))
                    } else {
                        format!("{}", flight.state)
                    }
                )));
            }
            return Ok(Some(id));
        }
        Ok(running_flight(broker, me).await?.map(|f| f.id))
    }

    /// Runs `command` (an ask, a post) linked to the parent flight of
    /// [`Principal::parent_flight`]. A parent taken for an agent that named none (the
    /// flight it was running when the request was read) may end before the command is
    /// committed; the command then runs again as a root one, as if the agent had asked
    /// between its turns, instead of being refused for that flight's end.
    pub async fn with_parent<R, F>(
        &self,
        broker: &Broker,
        given: Option<String>,
        command: impl Fn(Option<String>) -> F,
    ) -> Result<R, BrokerError>
    where
        F: std::future::Future<Output = Result<R, BrokerError>>,
    {
        let implicit = given.is_none();
        let parent = self.parent_flight(broker, given).await?;
        let linked = parent.is_some();
        match command(parent).await {
            Err(BrokerError::ParentNotRunning { flight, what, .. }) if implicit && linked => {
                tracing::debug!(%flight, %what, "the flight the agent ran ended before its ask: a root ask");
                command(None).await
            }
            outcome => outcome,
        }
    }

    /// Refuses an agent a flight it did not ask for (steer, interrupt).
    pub async fn may_control(&self, broker: &Broker, flight: &str) -> Result<(), BrokerError> {
        let Principal::Agent(me) = self else {
            return Ok(());
        };
        let id = flight.to_string();
        let requester = broker
            .store()
            .read(move |st| {
                let flight = st
                    .flight(&id)?
                    .ok_or_else(|| BrokerError::UnknownFlight(id.clone()))?;
                Ok(st.invocation(&flight.invocation)?.map(|i| i.requester))
            })
            .await?;
        match requester {
            Some(requester) if &requester == me => Ok(()),
            requester => Err(BrokerError::Unauthorized(format!(
                "agent {}'s token controls only the flights it asked for; flight {} was asked by {}",
                quote(me),
                quote(flight),
                quote(requester.as_deref().unwrap_or("someone else"))
            ))),
        }
    }
}

impl Principal {
    /// Refuses an agent the answer to a flight it does not run (`relay reply`).
    pub async fn may_answer(&self, broker: &Broker, flight: &str) -> Result<(), BrokerError> {
        let Principal::Agent(me) = self else {
            return Ok(());
        };
        let runs = broker
            .flight(flight)
            .await?
            .ok_or_else(|| BrokerError::UnknownFlight(flight.into()))?
            .agent;
        match &runs == me {
            true => Ok(()),
            false => Err(BrokerError::Unauthorized(format!(
                "agent {}'s token answers only its own flights; flight {} runs on {}",
                quote(me),
                quote(flight),
                quote(&runs)
            ))),
        }
    }
}

/// The flight `agent` is running (or waiting in, for an approval), if any.
async fn running_flight(broker: &Broker, agent: &str) -> Result<Option<Flight>, BrokerError> {
    let agent = agent.to_string();
    broker
        .store()
        .read(move |st| {
            Ok(st
                .live_flights_where(|f| {
                    f.agent == agent
                        && matches!(f.state, FlightState::Running | FlightState::Waiting)
                })?
                .into_iter()
                .next())
        })
        .await
}

/// Checks the bearer token, refuses an agent's token the routes it may not use, and puts
/// the [`Principal`] in the request's extensions.
pub(super) async fn require_token(
    State(state): State<ApiState>,
    headers: HeaderMap,
    mut req: Request,
    next: Next,
) -> Response {
    let given = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        // The scheme is case-insensitive (RFC 9110).
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    let principal = match given {
        // A dashboard login's cookie, when no token is given.
        None => match state.web.login(&headers) {
            Some(login) => web_principal(&headers, req.method(), login)
                .map(|login| {
                    req.extensions_mut().insert(login);
                    Principal::Operator
                }),
            None => Err(HttpError::new(
                ErrorCode::Unauthorized,
                "a bearer token is required (Authorization: Bearer <token from api.json>), or a dashboard login (relay open)",
            )),
        },
        Some(t) if token_matches(t.as_bytes(), state.token.as_bytes()) => Ok(Principal::Operator),
        Some(t) if AgentTokens::is_agent_token(t) => {
            agent_principal(
                &state,
                t,
                req.method(),
                req.extensions().get::<MatchedPath>(),
            )
            .await
        }
        Some(_) => Err(HttpError::new(
            ErrorCode::Unauthorized,
            "the bearer token is wrong",
        )),
    };
    match principal {
        Ok(principal) => {
            let dashboard = req.extensions().get::<Login>().is_some();
            req.extensions_mut().insert(principal);
            let response = next.run(req).await;
            if dashboard {
                // A logout or revoke-all must not leave an open stream running.
                state.web.stream_until_logins_end(response)
            } else {
                response
            }
        }
        Err(e) => {
            let mut refused = e.into_response();
            // A client without the token gets no kept-alive connection to hold a slot with.
            refused.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
            refused
        }
    }
}

/// A dashboard login acts as the operator, but its writes must carry the dashboard's
/// header (see `web`): a page of another site can send neither.
fn web_principal(headers: &HeaderMap, method: &Method, login: Login) -> Result<Login, HttpError> {
    let marked = headers
        .get(super::web::DASHBOARD_HEADER)
        .is_some_and(|v| v.as_bytes() == b"1");
    if method != Method::GET && !marked {
        return Err(HttpError::new(
            ErrorCode::Unauthorized,
            format!("a dashboard login's {method} must carry the header X-Relay-Dashboard: 1"),
        ));
    }
    Ok(login)
}

async fn agent_principal(
    state: &ApiState,
    token: &str,
    method: &Method,
    route: Option<&MatchedPath>,
) -> Result<Principal, HttpError> {
    let agent = state
        .agent_tokens
        .as_ref()
        .and_then(|tokens| tokens.agent_of(token))
        .ok_or_else(|| {
            HttpError::new(
                ErrorCode::Unauthorized,
                "the bearer token is not an agent token of this broker",
            )
        })?;
    if state.broker.agent(&agent).await?.is_none() {
        return Err(HttpError::new(
            ErrorCode::Unauthorized,
            format!(
                "the token is agent {}'s, and no such agent is registered (removed?)",
                quote(&agent)
            ),
        ));
    }
    let route = route.map(|r| r.as_str()).unwrap_or("");
    // Its scope in the method table says whether an agent's token may call a route
    // (every read may; an unknown route's GET is answered "not found" after this).
    let open = verb(method)
        .and_then(|v| relay_protocol::methods::by_route(v, route))
        .is_some_and(|m| m.scope.open_to_agents());
    if method != Method::GET && !open {
        return Err(HttpError::new(
            ErrorCode::Unauthorized,
            format!(
                "agent {}'s token cannot {method} {}: an agent's token asks, sends, replies and reads as itself; approving, registering or removing agents and the rest take the operator's token",
                quote(&agent),
                if route.is_empty() { "this route" } else { route }
            ),
        ));
    }
    Ok(Principal::Agent(agent))
}

/// The method table's verb for an HTTP method (`None` for one no route takes).
fn verb(method: &Method) -> Option<relay_protocol::methods::Verb> {
    use relay_protocol::methods::Verb;
    match *method {
        Method::GET => Some(Verb::Get),
        Method::POST => Some(Verb::Post),
        Method::DELETE => Some(Verb::Delete),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::sync::atomic::{AtomicUsize, Ordering};

    use relay_protocol::domain::{
        AgentSpec, FlightChange, Harness, InvokeRequest, MessageClass, MessageMeta, PostMessage,
    };

    use super::*;
    use crate::{BrokerConfig, Store};

    fn to(state: FlightState) -> FlightChange {
        FlightChange::State {
            to: state,
            reason: None,
            output: None,
        }
    }

    /// Agent `me` runs a flight, and asks (and posts) without naming a parent while that
    /// flight ends between the request's read and its commit: the ask and the post become
    /// root ones instead of being refused. Eight agents at once, each with its own race.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn what_an_agent_asks_as_its_flight_ends_becomes_a_root_ask() {
        const AGENTS: usize = 8;
        let stop = tokio_util::sync::CancellationToken::new();
        let (b, _) = Broker::start(Store::temporary().unwrap(), BrokerConfig::default(), stop)
            .await
            .unwrap();
        for name in (0..AGENTS)
            .map(|i| format!("a{i}"))
            .chain(["helper".into()])
        {
            b.register_agent(AgentSpec::new(name, Harness::CodexAppServer, "/w"))
                .await
                .unwrap();
        }
        let race = |i: usize| {
            let b = &b;
            async move {
                let me = format!("a{i}");
                let f = b
                    .invoke(InvokeRequest::new(&me, "go"))
                    .await
                    .unwrap()
                    .flight;
                b.update_flight(&f.id, to(FlightState::Running))
                    .await
                    .unwrap();
                let principal = Principal::Agent(me.clone());
                let tries = AtomicUsize::new(0);
                let asked = principal
                    .with_parent(b, None, |parent| {
                        let (me, f, first) = (&me, &f, tries.fetch_add(1, Ordering::SeqCst) == 0);
                        async move {
                            if first {
                                // Linked to the flight it runs, which ends meanwhile.
                                assert_eq!(parent.as_deref(), Some(f.id.as_str()));
                                b.update_flight(&f.id, to(FlightState::Completed))
                                    .await
                                    .unwrap();
                            }
                            let mut req = InvokeRequest::new("helper", "look");
                            req.requester = me.clone();
                            req.parent_flight = parent;
                            b.invoke(req).await
                        }
                    })
                    .await
                    .unwrap();
                assert_eq!(tries.load(Ordering::SeqCst), 2);
                assert_eq!(asked.flight.parent_flight, None);
                assert_eq!(asked.flight.root_flight, None);
                // With no flight running, a post is a root one at once.
                let posted = principal
                    .with_parent(b, None, |flight| {
                        b.post_message(PostMessage {
                            conversation: asked.flight.conversation.clone(),
                            author: me.clone(),
                            body: "thanks".into(),
                            class: MessageClass::Agent,
                            reply_to: None,
                            meta: MessageMeta {
                                flight,
                                ..MessageMeta::default()
                            },
                        })
                    })
                    .await
                    .unwrap();
                assert_eq!(posted.message.meta.flight, None);
                // A parent the agent names itself, ended, is still refused.
                let named: Result<(), _> = principal
                    .with_parent(b, Some(f.id.clone()), |_| async {
                        panic!("a named parent that ended is refused before the ask runs")
                    })
                    .await;
                assert!(
                    matches!(named, Err(BrokerError::Unauthorized(_))),
                    "{named:?}"
                );
            }
        };
        futures::future::join_all((0..AGENTS).map(race)).await;
    }
}
