//! The broker's reads of usage: the report of `relay usage` and an agent's budget with
//! what it used today. Both read the store on the blocking pool.

use relay_protocol::api::{UsageQuery, UsageReport};

use super::Broker;
use crate::error::BrokerError;

impl Broker {
    /// `relay usage`; `me`: an agent's token, which adds up only the flights it runs or
    /// asked for (as its flight list shows them).
    pub async fn usage(&self, q: UsageQuery, me: Option<&str>) -> Result<UsageReport, BrokerError> {
        let me = me.map(str::to_string);
        self.inner
            .store
            .read_listing(move |s| {
                s.usage_report(&q, |st, f| match &me {
                    None => Ok(true),
                    Some(me) => st.runs_or_asked(f, me),
                })
            })
            .await
    }

    /// `agent.budget`: the agent's budget and what its flights created today (UTC) used.
    pub async fn budget_status(
        &self,
        name: &str,
    ) -> Result<relay_protocol::api::BudgetStatus, BrokerError> {
        let name = name.to_string();
        self.inner
            .store
            .read(move |s| {
                let agent = s
                    .agent(&name)?
                    .ok_or_else(|| BrokerError::UnknownAgent(name.clone()))?;
                let now = relay_protocol::clock::now_ms();
                Ok(relay_protocol::api::BudgetStatus {
                    today: s.usage_of_day(&name, &relay_protocol::clock::utc_date(now))?,
                    agent: name.clone(),
                    budget: agent.spec.budget,
                    resets_at: relay_protocol::clock::next_utc_midnight(now),
                })
            })
            .await
    }
}
