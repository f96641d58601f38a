//! The usage counters (`usage_daily`: agent, 0, UTC day -> [`UsageTotals`];
//! `usage_trees`: root flight -> [`UsageTotals`]), folded from the flights' usage by
//! [`fold`] inside [`super::apply`], and the reads of them and of the flights' usage: an
//! agent's day, a tree, and the report of `relay usage` (a scan of the flights).
//!
//! A flight's usage is its turn's running total, reported again and again: the fold
//! takes out what the flight's previous record counted and adds its new one, so a total
//! reported twice counts once, and a flight counts as one of `flights` from its first
//! report on. A flight counts in the UTC day it was created (a turn running past
//! midnight stays in its first day), and in its tree's root (its own id for a root).

use std::collections::HashMap;

use relay_protocol::api::{UsageQuery, UsageReport, UsageRow};
use relay_protocol::clock::utc_date;
use relay_protocol::domain::{Agent, Flight, TokenUsage, UsageBy, UsageTotals};

use super::keys::{decode, encode, pair_key, T};
use super::projections::Sink;
use super::Store;
use crate::error::BrokerError;

/// The key of an agent's day in `usage_daily`.
pub fn day_key(agent: &str, day: &str) -> Vec<u8> {
    pair_key(agent, day)
}

/// The root of a flight's tree: the key of its tree in `usage_trees`.
pub fn tree_root(flight: &Flight) -> &str {
    flight.root_flight.as_deref().unwrap_or(&flight.id)
}

/// Moves the counters by what `flight`'s usage changed since `previous` (its record
/// before this event): nothing when the usage is the same.
pub(super) fn fold(
    sink: &dyn Sink,
    previous: Option<&Flight>,
    flight: &Flight,
) -> Result<(), BrokerError> {
    let before = previous.and_then(|p| p.usage.as_ref());
    if before == flight.usage.as_ref() {
        return Ok(());
    }
    let day = day_key(&flight.agent, &utc_date(flight.created_at));
    let root = tree_root(flight).as_bytes().to_vec();
    for (tree, key) in [(T::UsageDaily, day), (T::UsageTrees, root)] {
        let mut totals: UsageTotals = match sink.get(tree, &key)? {
            Some(v) => decode(&v)?,
            None => UsageTotals::default(),
        };
        if let Some(before) = before {
            take_out(&mut totals, before);
        }
        if let Some(now) = &flight.usage {
            totals.add(now);
        }
        sink.put(tree, &key, encode(&totals)?)?;
    }
    Ok(())
}

/// The reverse of [`UsageTotals::add`] (saturating: the counters hold what was added).
fn take_out(t: &mut UsageTotals, u: &TokenUsage) {
    t.flights = t.flights.saturating_sub(1);
    t.input_tokens = t.input_tokens.saturating_sub(u.input_tokens);
    t.cached_input_tokens = t.cached_input_tokens.saturating_sub(u.cached_input_tokens);
    t.output_tokens = t.output_tokens.saturating_sub(u.output_tokens);
    t.reasoning_tokens = t
        .reasoning_tokens
        .saturating_sub(u.reasoning_tokens.unwrap_or(0));
    t.tokens = t.tokens.saturating_sub(u.tokens());
    match u.cost_micro_usd {
        Some(c) => t.cost_micro_usd = t.cost_micro_usd.saturating_sub(c),
        None => t.flights_without_cost = t.flights_without_cost.saturating_sub(1),
    }
}

impl Store {
    /// What agent `agent`'s flights created on UTC day `day` (`YYYY-MM-DD`) used.
    pub fn usage_of_day(&self, agent: &str, day: &str) -> Result<UsageTotals, BrokerError> {
        Ok(self
            .get(T::UsageDaily, &day_key(agent, day))?
            .unwrap_or_default())
    }

    /// What the flights of the tree rooted at flight `root` used.
    pub fn usage_of_tree(&self, root: &str) -> Result<UsageTotals, BrokerError> {
        Ok(self
            .get(T::UsageTrees, root.as_bytes())?
            .unwrap_or_default())
    }

    /// `relay usage`: the flights created at or after `q.since` (of `q.agent`, and that
    /// `visible` lets through) with usage, added up by `q.by`; rows by cost, then
    /// tokens (largest first), then key. One scan of the flights.
    pub fn usage_report(
        &self,
        q: &UsageQuery,
        visible: impl Fn(&Store, &Flight) -> Result<bool, BrokerError>,
    ) -> Result<UsageReport, BrokerError> {
        let agents: HashMap<String, Agent> = self
            .values::<Agent>(T::Agents)?
            .into_iter()
            .map(|a| (a.spec.name.clone(), a))
            .collect();
        let mut groups: HashMap<String, UsageTotals> = HashMap::new();
        let mut total = UsageTotals::default();
        for value in self.tree(T::Flights).iter().values() {
            let flight = super::decode_flight_without_output(&value?)?;
            let Some(usage) = &flight.usage else { continue };
            if q.since.is_some_and(|s| flight.created_at < s)
                || q.agent.as_ref().is_some_and(|a| &flight.agent != a)
                || !visible(self, &flight)?
            {
                continue;
            }
            let key = match q.by {
                UsageBy::Agent => flight.agent.clone(),
                UsageBy::Conversation => self
                    .invocation(&flight.invocation)?
                    .map_or_else(|| "unknown".to_string(), |i| i.conversation),
                UsageBy::Tree => tree_root(&flight).to_string(),
                UsageBy::Day => utc_date(flight.created_at),
                UsageBy::Node => match agents.get(&flight.agent) {
                    Some(a) => a.spec.node.clone().unwrap_or_else(|| "local".into()),
                    None => "unknown".into(),
                },
            };
            groups.entry(key).or_default().add(usage);
            total.add(usage);
        }
        let mut rows: Vec<UsageRow> = groups
            .into_iter()
            .map(|(key, totals)| UsageRow { key, totals })
            .collect();
        rows.sort_by(|a, b| {
            (b.totals.cost_micro_usd, b.totals.tokens, &a.key).cmp(&(
                a.totals.cost_micro_usd,
                a.totals.tokens,
                &b.key,
            ))
        });
        Ok(UsageReport {
            by: q.by,
            since: q.since,
            rows,
            total,
        })
    }
}
