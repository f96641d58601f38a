//! Operations that every interface (HTTP, NATS) offers the same way, so their rules live
//! in one place: steer, interrupt and decide an approval (remembering the decision as a
//! rule, and answering each harness in its own terms).

use std::sync::Arc;

use relay_protocol::domain::{
    decider, Approval, ApprovalDecision, ApprovalState, Flight, FlightChange, FlightState,
    Remember, RuleScope,
};

use crate::broker::Broker;
use crate::error::{BadInput, BrokerError};
use crate::policy::remember;
use crate::ports::FlightControl;

/// A live (non-terminal) flight and the runtime control that can act on it.
async fn live_flight(
    broker: &Broker,
    control: Option<&Arc<dyn FlightControl>>,
    id: &str,
) -> Result<(Flight, Arc<dyn FlightControl>), BrokerError> {
    let flight = broker
        .flight(id)
        .await?
        .ok_or_else(|| BrokerError::UnknownFlight(id.into()))?;
    if flight.state.is_terminal() {
        return Err(BrokerError::FlightTerminal {
            flight: flight.id,
            state: flight.state,
        });
    }
    let control = control.cloned().ok_or(BrokerError::NoRuntime)?;
    Ok((flight, control))
}

/// Steers a flight's turn; `by` (who asked: a client, see `http::actor`) is recorded with the steer's
/// note.
pub async fn steer(
    broker: &Broker,
    control: Option<&Arc<dyn FlightControl>>,
    flight: &str,
    text: String,
    by: Option<String>,
) -> Result<Flight, BrokerError> {
    // The message limit, like a message or a task; a queued flight's task with its
    // steers is held to it too, where the steers are added (the runtime's queue).
    check_text(broker, "steer text", &text)?;
    let (flight, control) = live_flight(broker, control, flight).await?;
    control.steer(flight.clone(), text, by).await?;
    Ok(flight)
}

/// A text a client sends into a flight (a steer, an answer): not blank, and within the
/// message limit.
fn check_text(broker: &Broker, what: &'static str, text: &str) -> Result<(), BrokerError> {
    if text.trim().is_empty() {
        return Err(BadInput::Empty(what).into());
    }
    let limit = broker.config().max_message_bytes;
    if text.len() > limit {
        return Err(BrokerError::TooLarge {
            what,
            size: text.len(),
            limit,
        });
    }
    Ok(())
}

/// The agent's answer to a running flight (`relay reply`), for a harness whose turns end
/// only that way (a tmux pane): the runtime ends the turn with `text` as its output, and
/// the flight's completion posts it as the reply, like any other agent's. Returns the
/// flight as it was when the runtime took the answer; its completion follows.
pub async fn reply(
    broker: &Broker,
    control: Option<&Arc<dyn FlightControl>>,
    flight: &str,
    text: String,
) -> Result<Flight, BrokerError> {
    check_text(broker, "answer", &text)?;
    let (flight, control) = live_flight(broker, control, flight).await?;
    // Even a flight the log shows `queued` may have its task in the pane already (the
    // runtime's report of it is on its way): the runtime that runs it decides, and
    // refuses a flight that is not its running turn.
    control.reply(flight.clone(), text).await?;
    Ok(flight)
}

/// Interrupts a flight's turn. A flight still `queued` has no turn yet: the broker
/// cancels it at once, and the runtime is told to drop it (from its queue, or when its
/// dispatch arrives), without waiting for that.
///
/// `by` (who asked: a client, see `http::actor`) is recorded first, as a note of the flight
/// (`interrupt asked`): the turn's end follows from the harness, which does not say who
/// interrupted it; noted after the control the flight could be over already, and its
/// note refused.
pub async fn interrupt(
    broker: &Broker,
    control: Option<&Arc<dyn FlightControl>>,
    flight: &str,
    by: Option<String>,
) -> Result<Flight, BrokerError> {
    let (flight, control) = live_flight(broker, control, flight).await?;
    if by.is_some() {
        broker
            .update_flight(
                &flight.id,
                FlightChange::Note {
                    text: "interrupt asked".into(),
                    by,
                },
            )
            .await?;
    }
    if flight.state == FlightState::Queued {
        let cancelled = broker
            .update_flight(
                &flight.id,
                FlightChange::State {
                    to: FlightState::Cancelled,
                    reason: Some("interrupted before its turn started".into()),
                    output: None,
                },
            )
            .await?
            .flight;
        broker.tasks().spawn(async move {
            if let Err(e) = control.interrupt(flight).await {
                tracing::debug!(error = %e, "runtime told of a cancelled queued flight");
            }
        });
        return Ok(cancelled);
    }
    control.interrupt(flight.clone()).await?;
    Ok(flight)
}

/// Where a client's decision comes from: the API (its `decided_by` as given), a
/// dashboard login (recorded as `NAME@dashboard`) or the bus (recorded as the bus's:
/// `nats`, or `NAME@nats`; NATS does not say who published a request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Client,
    Dashboard,
    Bus,
}

/// What a client's name is for: deciding an approval (`operator` and `nats` are
/// the operator's token's and the bus's decisions), or speaking on an open bus (an
/// ask's requester, a message's author), where it may not be Relay's, the
/// operator's or (but for the bus's own `nats`) any of [`decider::NAMES`].
///
/// [`decider::NAMES`]: relay_protocol::domain::decider::NAMES
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    Decider,
    Stranger,
}

/// Checks the `decided_by` a client (HTTP, NATS, a dashboard login) gives: 1 to 128
/// bytes, and not one of Relay's own identities
/// ([`decider::reserved`](relay_protocol::domain::decider::reserved), the one list).
pub fn check_client_decider(decided_by: &str, via: Via) -> Result<(), BrokerError> {
    check_client_name(decided_by, via, Claim::Decider)
}

/// The one check of a name a client gives (a decider, an open bus's author or
/// requester): 1 to 128 bytes of printable ASCII, and none of Relay's own identities.
pub fn check_client_name(name: &str, via: Via, claim: Claim) -> Result<(), BrokerError> {
    use relay_protocol::domain::decider;
    // Printable ASCII names only: an invisible or look-alike character must not make
    // a reserved identity pass for another.
    let printable = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "._@:+-/".contains(c));
    if name.is_empty() || name.len() > 128 || !printable {
        return Err(BadInput::Decider(name.to_string()).into());
    }
    let why = match claim {
        Claim::Decider => decider::reserved(name, via == Via::Dashboard),
        // The bus speaks as itself, exactly `nats`; `NATS` is a look-alike.
        Claim::Stranger if via == Via::Bus && name == decider::BUS_NAME => None,
        Claim::Stranger => decider::reserved_name(name),
    };
    if let Some(why) = why {
        return Err(BadInput::ReservedDecider {
            decided_by: name.to_string(),
            why,
        }
        .into());
    }
    Ok(())
}

/// Decides an approval: the harness gets the answer first, and only once it has it is
/// the decision recorded, so the record never claims an answer the agent did not get.
/// `by`: `None` for Relay's own policies and remembered rules, which wait for room in
/// the command queue and may record a reserved identity; a client's `decided_by` is
/// checked first ([`check_client_decider`]).
///
/// `remember`: the decision is remembered as a rule ([`crate::policy::remember`]), built
/// before the harness is answered: one that cannot be remembered exactly is refused
/// (`invalid_request`) and the approval stays pending. A client's `accept_for_session`
/// without it is remembered for the session (a Relay rule records every "always"); if
/// it cannot be, it is a plain accept, answered and recorded as one. The harness gets
/// its own form of the answer ([`crate::policy::remember::harness_answer`]).
pub async fn decide(
    broker: &Broker,
    control: Option<&Arc<dyn FlightControl>>,
    approval: &str,
    decision: ApprovalDecision,
    decided_by: &str,
    by: Option<Via>,
    remember: Option<Remember>,
) -> Result<Approval, BrokerError> {
    let internal = by.is_none();
    if let Some(via) = by {
        check_client_decider(decided_by, via)?;
    }
    // Checked as given, recorded as the bus's: `operator` over the bus is `operator@nats`.
    let recorded = match by {
        Some(Via::Bus) => relay_protocol::domain::decider::bus(decided_by),
        _ => decided_by.to_string(),
    };
    let decided_by = recorded.as_str();
    let id = approval.to_string();
    // The rule an internal decision names (`rule:<id>`), for the harness's answer.
    let by_rule = match internal {
        true => decided_by.strip_prefix(decider::RULE).map(str::to_string),
        false => None,
    };
    let (pending, flight_agent, agent, matched) = broker
        .store()
        .read(move |s| {
            let pending = s.approval(&id)?;
            // Not an approval id: perhaps a flight's, whose agent may never ask.
            let flight_agent = match &pending {
                Some(_) => None,
                None => match s.flight(&id)? {
                    Some(f) => s.agent(&f.agent)?,
                    None => None,
                },
            };
            let agent = match &pending {
                Some(a) => s.agent(&a.agent)?,
                None => None,
            };
            let matched = match &by_rule {
                Some(rule) => s.rule(rule)?,
                None => None,
            };
            Ok::<_, BrokerError>((pending, flight_agent, agent, matched))
        })
        .await?;
    let Some(pending) = pending else {
        return Err(match flight_agent {
            Some(agent) if !agent.spec.harness.capabilities().approvals => {
                BrokerError::NoApprovalStep {
                    flight: approval.into(),
                    agent: agent.spec.name,
                    harness: agent.spec.harness,
                }
            }
            _ => BrokerError::UnknownApproval(approval.into()),
        });
    };
    if pending.state != ApprovalState::Pending {
        return Err(BrokerError::ApprovalClosed(approval.into()));
    }
    let implicit =
        remember.is_none() && !internal && decision == ApprovalDecision::AcceptForSession;
    let asked = remember.or(implicit.then_some(Remember {
        scope: RuleScope::Session,
        any_arg: None,
    }));
    let rule = match (asked, &agent) {
        (None, _) => None,
        (Some(_), None) if implicit => None,
        (Some(_), None) => return Err(BrokerError::UnknownAgent(pending.agent.clone())),
        (Some(r), Some(agent)) => {
            match remember::remembered_rule(&pending, agent, decision, r, decided_by) {
                Ok(rule) => Some(rule),
                Err(why) if implicit => {
                    tracing::debug!(approval = %pending.id, %why, "accept_for_session not remembered: a plain accept");
                    None
                }
                Err(why) => return Err(BrokerError::Invalid(why)),
            }
        }
    };
    // "For the session" is recorded only with the session rule that says so: remembered
    // for the agent, the project or everywhere it is the accept that rule records (and
    // the one the harness gets).
    let decision = match decision {
        ApprovalDecision::AcceptForSession
            if rule.as_ref().is_none_or(|r| r.scope != RuleScope::Session) =>
        {
            ApprovalDecision::Accept
        }
        d => d,
    };
    // Codex's `acceptForSession` only for a session rule already committed (one that
    // matched), never for the decision that makes the rule: that decision is recorded
    // after the harness has its answer, and a crash (or a failed write) in between would
    // leave Codex an "always" with no Relay rule to show or remove. The second identical
    // command is then decided by the rule, and Codex caches it from there.
    let session_rule = matched
        .as_ref()
        .is_some_and(|r| r.scope == RuleScope::Session && r.decision == ApprovalDecision::Accept);
    if let Some(control) = control {
        let mut answer = pending;
        answer.decision = Some(match &agent {
            Some(a) => remember::harness_answer(
                a.spec.harness,
                answer.request.kind,
                decision,
                session_rule,
            ),
            None => decision,
        });
        control.approval_decided(answer).await?;
    }
    // Once the harness has its answer, the record follows whatever the queue holds: a
    // client's decision refused `overloaded` now would leave the agent going on with
    // nothing recorded, not even its rule.
    let wait_for_room = internal || control.is_some();
    broker
        .decide(approval, decision, decided_by, rule, wait_for_room)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_decides_under_its_own_name_only() {
        for ok in [
            "operator",
            "nats",
            "alice",
            "ci-bot",
            "policy",
            "relayer:x",
            "dashboard",
            "alice@example",
        ] {
            assert!(check_client_decider(ok, Via::Client).is_ok(), "{ok}");
        }
        for refused in [
            "policy:auto-accept:echo",
            "relay:turn-ended",
            "codex:withdrawn",
            "claude:withdrawn",
            "pi:withdrawn",
            "tmux:withdrawn",
            "claude_stream_json:x",
            "Policy:x",
            " RELAY:restart",
            "alice@dashboard",
            "ALICE@Dashboard",
            "alice@nats",
            "",
            "  ",
            &"a".repeat(129),
        ] {
            assert!(
                matches!(
                    check_client_decider(refused, Via::Client),
                    Err(BrokerError::BadInput(
                        BadInput::Decider(_) | BadInput::ReservedDecider { .. }
                    ))
                ),
                "{refused:?}"
            );
        }
        // A dashboard login decides as NAME@dashboard, and as nothing else reserved.
        assert!(check_client_decider("alice@dashboard", Via::Dashboard).is_ok());
        assert!(check_client_decider("codex:withdrawn", Via::Dashboard).is_err());
    }

    #[test]
    fn a_stranger_speaks_as_none_of_relays_names_nor_a_look_alike() {
        for refused in [
            "operator",
            "Operator",
            "relay",
            " relay",
            "NATS",
            "operator\u{200B}",
            "\u{43e}perator",
            "policy:x",
            "bob@nats",
        ] {
            assert!(
                check_client_name(refused, Via::Bus, Claim::Stranger).is_err(),
                "{refused:?}"
            );
        }
        assert!(check_client_name("nats", Via::Bus, Claim::Stranger).is_ok());
        assert!(check_client_name("ci-bot", Via::Bus, Claim::Stranger).is_ok());
        // A decision may still be the operator's token's or the bus's.
        assert!(check_client_decider("operator", Via::Client).is_ok());
        assert!(check_client_decider("nats", Via::Bus).is_ok());
    }

    #[test]
    fn every_identity_relay_records_is_reserved() {
        use relay_protocol::domain::{decider, Harness};
        for h in Harness::ALL {
            let by = decider::withdrawn(h);
            assert!(decider::reserved(&by, false).is_some(), "{by}");
        }
        assert!(decider::reserved(&decider::dashboard("bob"), false).is_some());
        assert!(decider::reserved(&decider::dashboard("bob"), true).is_none());
        // What the bus records is Relay's to write: no surface may claim it.
        assert_eq!(decider::bus("operator"), "operator@nats");
        assert_eq!(decider::bus(relay_protocol::bus::BUS_ACTOR), "nats");
        for via in [Via::Client, Via::Dashboard, Via::Bus] {
            assert!(check_client_decider(&decider::bus("bob"), via).is_err());
        }
    }
}
