//! The broker's calls that register, change and remove agents: the runtime's checks
//! first (and the worktree they make, kept with the registration), then the rules.

use relay_protocol::api::AgentAdded;
use relay_protocol::domain::{Agent, AgentSpec};

use super::{rules, Broker, Command, Outcome};
use crate::error::BrokerError;
use crate::ports::FlightControl;

impl Broker {
    /// Registers an agent as clients do (HTTP, NATS, the CLI): first `checks` (the
    /// runtime's, see [`FlightControl::check_agent`]) refuse it or say what to warn of,
    /// then [`Broker::register_agent`]. The rules run before the checks too, so a name
    /// taken or a bad spec is refused without starting anything.
    pub async fn add_agent(
        &self,
        mut spec: AgentSpec,
        checks: Option<&dyn FlightControl>,
    ) -> Result<AgentAdded, BrokerError> {
        spec.move_secrets();
        let checked = match checks {
            Some(checks) => {
                self.precheck(&spec).await?;
                checks.check_agent(spec.clone()).await?
            }
            None => crate::ports::AgentChecked::default(),
        };
        let name = spec.name.clone();
        let agent = match self.register(spec, checked.worktree.clone()).await {
            Ok(agent) => agent,
            Err(e) => return Err(self.left_worktree(&name, checked.worktree, e).await),
        };
        Ok(AgentAdded {
            agent,
            warnings: checked.warnings,
        })
    }

    /// A registration refused after its worktree was made: the worktree is left (it may
    /// hold files copied in; `relay doctor --fix` removes it, the broker stopped) and the
    /// refusal says so, unless it is another agent's of the same name (registered at
    /// the same time: the same worktree, found made).
    async fn left_worktree(
        &self,
        name: &str,
        made: Option<relay_protocol::domain::WorktreeState>,
        e: BrokerError,
    ) -> BrokerError {
        let Some(made) = made else { return e };
        let owned = self
            .agent(name)
            .await
            .ok()
            .flatten()
            .and_then(|a| a.worktree)
            .is_some_and(|w| w.path == made.path);
        if owned {
            return e;
        }
        tracing::warn!(agent = %name, path = %made.path, error = %e, "registration refused after its worktree was made");
        BrokerError::WorktreeLeft {
            path: made.path,
            source: Box::new(e),
        }
    }

    /// The registration rules that need no runtime, read before the (slower) checks,
    /// which make the worktree: the spec is well formed (a name git would refuse as a
    /// branch, or `..`, never reaches git), the name is free. The command re-checks
    /// everything when it runs.
    async fn precheck(&self, spec: &AgentSpec) -> Result<(), BrokerError> {
        rules::check_spec(spec)?;
        if self.agent(&spec.name).await?.is_some() {
            return Err(BrokerError::AgentExists(spec.name.clone()));
        }
        Ok(())
    }

    /// Registers an agent without the runtime's checks (see [`Broker::add_agent`]).
    pub async fn register_agent(&self, spec: AgentSpec) -> Result<Agent, BrokerError> {
        self.register(spec, None).await
    }

    async fn register(
        &self,
        mut spec: AgentSpec,
        worktree: Option<relay_protocol::domain::WorktreeState>,
    ) -> Result<Agent, BrokerError> {
        // Secrets apart from here on: the command's `Debug` (logs) shows names only.
        spec.move_secrets();
        expect_outcome!(
            self.execute(Command::RegisterAgent(
                Box::new(spec),
                worktree.map(Box::new)
            )),
            Agent
        )
    }

    pub async fn remove_agent(&self, name: &str) -> Result<Agent, BrokerError> {
        self.remove_agent_forced(name, false).await
    }

    /// Removes an agent; `force`: its worktree goes even with uncommitted work (the
    /// caller checked it, see [`crate::workspaces::remove_agent`]).
    pub async fn remove_agent_forced(&self, name: &str, force: bool) -> Result<Agent, BrokerError> {
        expect_outcome!(
            self.execute(Command::RemoveAgent {
                name: name.into(),
                force
            }),
            Agent
        )
    }

    /// `agent.set`: replaces the agent's budget (an empty one removes it), recorded as
    /// `agent_updated`.
    pub async fn set_agent(
        &self,
        name: &str,
        settings: relay_protocol::api::AgentSettings,
    ) -> Result<Agent, BrokerError> {
        expect_outcome!(
            self.execute(Command::SetAgent {
                name: name.into(),
                settings
            }),
            Agent
        )
    }
}
