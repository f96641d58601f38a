//! The rules of usage and budgets: a usage change's cost (the harness's, else the
//! user's price table: [`crate::prices`]), an agent's budget set or removed
//! (`agent.set`), the refusal of an invocation past a budget (an ask, a mention, an
//! agent-to-agent ask: [`Ctx::check_budget`]), and what a running turn does when its
//! usage reaches its agent's budget ([`Ctx::after_usage`]: finish with a note, or be
//! cancelled, which the plane follows by interrupting the turn).
//!
//! A limit is reached when what was used is at or above it. Days are UTC days and a
//! flight counts in the day it was created (see `store/usage.rs`); a tree's limit
//! counts every flight of the tree (all agents'), and a root flight starts a new tree.

use relay_protocol::api::AgentSettings;
use relay_protocol::clock::{next_utc_midnight, utc_date};
use relay_protocol::domain::{
    format_usd, Agent, Budget, Flight, FlightChange, FlightState, OnBudget, TokenUsage, UsageTotals,
};
use relay_protocol::event::EventBody;

use super::Ctx;
use crate::broker::Outcome;
use crate::error::BrokerError;
use crate::prices::PriceTable;
use crate::store::{day_key, tree_root, T};

/// What a flight's usage counts against: its agent's day and its tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Counted {
    day: UsageTotals,
    tree: UsageTotals,
}

impl Ctx<'_, '_> {
    /// A usage change of `flight` as it is recorded: its cost from the harness (source
    /// `harness`), else from the price table by the usage's model or its agent's.
    pub(super) fn costed(
        &self,
        flight: &Flight,
        usage: &TokenUsage,
    ) -> Result<TokenUsage, BrokerError> {
        let agent: Option<Agent> = self.tx.read(T::Agents, flight.agent.as_bytes())?;
        let model = agent.and_then(|a| a.spec.model);
        Ok(PriceTable::fill(
            self.config.prices.as_deref(),
            usage.clone(),
            model.as_deref(),
        ))
    }

    /// A usage change of flight `id` (the turn's running total): costed, recorded (the
    /// same total again changes nothing), then checked against its agent's budget.
    pub(super) fn report_usage(
        &mut self,
        id: &str,
        usage: &TokenUsage,
    ) -> Result<Outcome, BrokerError> {
        let flight = self.flight(id)?;
        let usage = self.costed(&flight, usage)?;
        if flight.usage.as_ref() == Some(&usage) {
            return Ok(Outcome::Flight(relay_protocol::api::UpdateResult {
                applied: false,
                flight,
            }));
        }
        let before = self.counted(&flight)?;
        let outcome = self.update_flight(id, &FlightChange::Usage(usage))?;
        self.after_usage(before, outcome)
    }

    /// The root of the tree a flight asked from `parent` joins (`None`: a root).
    pub(super) fn root_of(&self, parent: Option<&str>) -> Result<Option<String>, BrokerError> {
        let Some(parent) = parent else {
            return Ok(None);
        };
        Ok(Some(tree_root(&self.flight(parent)?).to_string()))
    }

    /// Refuses to start a flight of `target` (asked from `parent`, if any) past one of
    /// its limits: today's (UTC) usage of its flights, or, for a child flight, its tree's.
    pub(super) fn check_budget(
        &self,
        target: &Agent,
        parent: Option<&str>,
    ) -> Result<(), BrokerError> {
        let Some(budget) = &target.spec.budget else {
            return Ok(());
        };
        let name = &target.spec.name;
        let counted = Counted {
            day: self.day_usage(name, self.now)?,
            tree: match self.root_of(parent)? {
                Some(root) => self.tree_usage(&root)?,
                None => UsageTotals::default(),
            },
        };
        match reached(name, budget, &counted, parent.is_some(), self.now) {
            Some((what, resets)) => Err(BrokerError::BudgetExceeded { what, resets }),
            None => Ok(()),
        }
    }

    /// What `flight` counts against now (read inside the batch: this batch's
    /// changes included).
    pub(super) fn counted(&self, flight: &Flight) -> Result<Counted, BrokerError> {
        Ok(Counted {
            day: self.day_usage(&flight.agent, flight.created_at)?,
            tree: self.tree_usage(tree_root(flight))?,
        })
    }

    /// After a usage change of `flight` (recorded as `outcome`) moved its counters from
    /// `before`: if that reached one of its agent's limits, a running turn finishes with
    /// a note saying so (once, as it crosses the limit) or is cancelled (`budget_exceeded:
    /// ...`; the plane interrupts a turn its broker ended), as the budget says.
    pub(super) fn after_usage(
        &mut self,
        before: Counted,
        outcome: Outcome,
    ) -> Result<Outcome, BrokerError> {
        let Outcome::Flight(result) = &outcome else {
            return Ok(outcome);
        };
        let flight = &result.flight;
        if !result.applied || flight.state.is_terminal() {
            return Ok(outcome);
        }
        let Some(agent) = self.tx.read::<Agent>(T::Agents, flight.agent.as_bytes())? else {
            return Ok(outcome);
        };
        let Some(budget) = agent.spec.budget.clone() else {
            return Ok(outcome);
        };
        let after = self.counted(flight)?;
        if after == before {
            return Ok(outcome);
        }
        let (now, was) = (
            reached(&flight.agent, &budget, &after, true, flight.created_at),
            reached(&flight.agent, &budget, &before, true, flight.created_at),
        );
        let Some((what, resets)) = now else {
            return Ok(outcome);
        };
        let id = flight.id.clone();
        match budget.on_exceed {
            OnBudget::Interrupt => {
                tracing::info!(flight = %id, agent = %flight.agent, "a turn reached its agent's budget; it is interrupted");
                self.update_flight(
                    &id,
                    &FlightChange::State {
                        to: FlightState::Cancelled,
                        reason: Some(format!("budget_exceeded: {what}; {resets}")),
                        output: None,
                    },
                )
            }
            OnBudget::Finish if was.is_none() => self.update_flight(
                &id,
                &FlightChange::Note {
                    text: format!("budget exceeded: {what}; this turn finishes ({resets})"),
                    by: None,
                },
            ),
            OnBudget::Finish => Ok(outcome),
        }
    }

    /// `agent.set`: replaces the agent's budget (an empty one removes it).
    pub(super) fn set_agent(
        &mut self,
        name: &str,
        settings: &AgentSettings,
    ) -> Result<Outcome, BrokerError> {
        let mut agent = self.agent(name)?;
        if let Some(budget) = &settings.budget {
            agent.spec.budget = Some(budget.clone()).filter(|b| !b.is_empty());
        }
        agent.updated_at = self.now;
        self.emit(EventBody::AgentUpdated {
            agent: agent.clone(),
        })?;
        Ok(Outcome::Agent(agent))
    }

    fn day_usage(&self, agent: &str, at: u64) -> Result<UsageTotals, BrokerError> {
        Ok(self
            .tx
            .read(T::UsageDaily, &day_key(agent, &utc_date(at)))?
            .unwrap_or_default())
    }

    fn tree_usage(&self, root: &str) -> Result<UsageTotals, BrokerError> {
        Ok(self
            .tx
            .read(T::UsageTrees, root.as_bytes())?
            .unwrap_or_default())
    }
}

/// The first limit of `budget` that `counted` reached, as (what: the agent, the limit
/// and what was used; when it resets and how to raise it). The day is the UTC day of
/// `day_of`; tree limits apply only to a flight in a tree (`in_tree`).
pub(super) fn reached(
    agent: &str,
    budget: &Budget,
    counted: &Counted,
    in_tree: bool,
    day_of: u64,
) -> Option<(String, String)> {
    let day = &counted.day;
    let tree = &counted.tree;
    let resets_day = || {
        let midnight = next_utc_midnight(day_of);
        format!(
            "it resets at {} 00:00 UTC; to raise it: relay agent set {agent} --budget AMOUNT/day",
            utc_date(midnight)
        )
    };
    let resets_tree = || {
        format!(
            "a new flight tree starts fresh; to raise it: relay agent set {agent} --budget AMOUNT/tree"
        )
    };
    let on_day = format!("on {} (UTC)", utc_date(day_of));
    let tokens = |used: u64| format!("{used} tokens");
    let over = |used: String, limit: String, tree: bool| {
        if tree {
            format!("agent {agent:?}'s flight tree used {used}, its budget is {limit}/tree")
        } else {
            format!("agent {agent:?} used {used} {on_day}, its budget is {limit}/day")
        }
    };
    if let Some(limit) = budget.tokens_per_day.filter(|&l| day.tokens >= l) {
        return Some((over(tokens(day.tokens), tokens(limit), false), resets_day()));
    }
    if let Some(limit) = budget
        .cost_micro_usd_per_day
        .filter(|&l| day.cost_micro_usd >= l)
    {
        let (used, limit) = (format_usd(day.cost_micro_usd), format_usd(limit));
        return Some((over(used, limit, false), resets_day()));
    }
    if !in_tree {
        return None;
    }
    if let Some(limit) = budget.tokens_per_tree.filter(|&l| tree.tokens >= l) {
        return Some((
            over(tokens(tree.tokens), tokens(limit), true),
            resets_tree(),
        ));
    }
    if let Some(limit) = budget
        .cost_micro_usd_per_tree
        .filter(|&l| tree.cost_micro_usd >= l)
    {
        let (used, limit) = (format_usd(tree.cost_micro_usd), format_usd(limit));
        return Some((over(used, limit, true), resets_tree()));
    }
    None
}
