//! Remembered decisions as every interface offers them (HTTP, NATS, the plane): the
//! rules that apply to an agent now (`rule.list`), one rule (`rule.show`), a removal
//! (`rule.remove`), and deciding a request by them, which the plane does after the
//! agent's static policy. What a rule is and how it matches: [`crate::policy::remember`];
//! how a decision is remembered: [`crate::ops::decide`].

use std::sync::Arc;

use relay_protocol::domain::{decider, rule_decider, Agent, Approval, Rule};

use crate::broker::Broker;
use crate::error::BrokerError;
use crate::ops::{check_client_decider, Via};
use crate::policy::remember;
use crate::ports::FlightControl;

/// Every rule, oldest first; with `agent`, only those that apply to it now (its session,
/// itself, its project, everyone).
pub async fn list(broker: &Broker, agent: Option<&str>) -> Result<Vec<Rule>, BrokerError> {
    let agent = agent.map(str::to_string);
    broker
        .store()
        .read(move |s| {
            let rules = s.rules()?;
            let Some(name) = &agent else {
                return Ok(rules);
            };
            let agent = s
                .agent(name)?
                .ok_or_else(|| BrokerError::UnknownAgent(name.clone()))?;
            Ok(rules
                .into_iter()
                .filter(|r| remember::applies(r, &agent))
                .collect())
        })
        .await
}

pub async fn show(broker: &Broker, id: &str) -> Result<Rule, BrokerError> {
    let key = id.to_string();
    broker
        .store()
        .read(move |s| s.rule(&key))
        .await?
        .ok_or_else(|| BrokerError::UnknownRule(id.into()))
}

/// Removes rule `id` for a client: `removed_by` is checked as a decider is (and recorded
/// as the bus's over NATS: `nats`, `NAME@nats`).
pub async fn remove(
    broker: &Broker,
    id: &str,
    removed_by: &str,
    via: Via,
) -> Result<Rule, BrokerError> {
    check_client_decider(removed_by, via)?;
    let recorded = match via {
        Via::Bus => decider::bus(removed_by),
        _ => removed_by.to_string(),
    };
    broker.remove_rule(id, &recorded).await
}

/// Decides `approval` of `agent` by the remembered rule that matches it, if one does
/// (declines first, then the narrowest scope, then the oldest), recorded as decided by
/// `rule:<id>`. `None`: no rule decides it.
pub async fn decide(
    broker: &Broker,
    control: Option<&Arc<dyn FlightControl>>,
    approval: &Approval,
    agent: &Agent,
) -> Result<Option<Approval>, BrokerError> {
    let rules = broker.store().read(|s| s.rules()).await?;
    let Some(rule) = remember::deciding(&rules, agent, approval) else {
        return Ok(None);
    };
    let decided = crate::ops::decide(
        broker,
        control,
        &approval.id,
        rule.decision,
        &rule_decider(&rule.id),
        None,
        None,
    )
    .await?;
    Ok(Some(decided))
}
