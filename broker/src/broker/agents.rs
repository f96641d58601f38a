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
        spec: AgentSpec,
        checks: Option<&dyn FlightControl>,
    ) -> Result<AgentAdded, BrokerError> {
        self.add_agent_as(spec, checks, None).await
    }

    /// [`Broker::add_agent`] as `by` asked (its registration's event names them).
    pub async fn add_agent_as(
        &self,
        mut spec: AgentSpec,
        checks: Option<&dyn FlightControl>,
        by: Option<String>,
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
        let agent = match self.register(spec, checked.worktree.clone(), by).await {
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
        self.register(spec, None, None).await
    }

    async fn register(
        &self,
        mut spec: AgentSpec,
        worktree: Option<relay_protocol::domain::WorktreeState>,
        by: Option<String>,
    ) -> Result<Agent, BrokerError> {
        // Secrets apart from here on: the command's `Debug` (logs) shows names only.
        spec.move_secrets();
        expect_outcome!(
            self.execute(asked_by(
                by,
                Command::RegisterAgent(Box::new(spec), worktree.map(Box::new))
            )),
            Agent
        )
    }

    pub async fn remove_agent(&self, name: &str) -> Result<Agent, BrokerError> {
        self.remove_agent_forced(name, false, None).await
    }

    /// Removes an agent as `by` asked; `force`: its worktree goes even with uncommitted
    /// work (the caller checked it, see [`crate::workspaces::remove_agent`]).
    pub async fn remove_agent_forced(
        &self,
        name: &str,
        force: bool,
        by: Option<String>,
    ) -> Result<Agent, BrokerError> {
        expect_outcome!(
            self.execute(asked_by(
                by,
                Command::RemoveAgent {
                    name: name.into(),
                    force
                }
            )),
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
        self.set_agent_as(name, settings, None).await
    }

    /// [`Broker::set_agent`] as `by` asked (its event names them).
    pub async fn set_agent_as(
        &self,
        name: &str,
        settings: relay_protocol::api::AgentSettings,
        by: Option<String>,
    ) -> Result<Agent, BrokerError> {
        expect_outcome!(
            self.execute(asked_by(
                by,
                Command::SetAgent {
                    name: name.into(),
                    settings
                }
            )),
            Agent
        )
    }

    /// `agent.wake` asked by `by`: noted on the agent (its event names them), before the
    /// runtime is asked to start its session.
    pub async fn wake_asked(&self, name: &str, by: Option<String>) -> Result<Agent, BrokerError> {
        expect_outcome!(
            self.execute(asked_by(by, Command::WakeAsked { name: name.into() })),
            Agent
        )
    }
}

/// `command` as a client asked it ([`Command::As`]), when one did.
fn asked_by(by: Option<String>, command: Command) -> Command {
    match by {
        Some(by) => Command::As {
            by,
            command: Box::new(command),
        },
        None => command,
    }
}
