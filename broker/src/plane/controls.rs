//! Controls: steer, interrupt, an agent's reply, approval decisions, wake and a flight's revert, sent to the runtime that
//! serves the agent (this one, or its node's over NATS), what an agent's screen shows
//! (this runtime's agents only), an agent's worktree (made at its registration, its
//! uncommitted files, its diff: this runtime's agents only), and the checks of an agent
//! before it is registered:
//! the plane as the domain's [`FlightControl`].

use futures::future::BoxFuture;
use relay_harnesses::HarnessError;
use relay_protocol::api::{AgentDiff, Peek};
use relay_protocol::domain::{Agent, AgentSpec, Approval, Flight, FlightCommit};
use relay_protocol::runtime::Control;
use relay_runtime::RuntimeError;

use super::Plane;
use crate::error::{runtime_error, BrokerError, NodeUnreachable};
use crate::ports::{AgentChecked, FlightControl, Reverting};

impl Plane {
    /// Sends a control to the runtime that serves its agent: this one or a node's.
    fn route(&self, control: Control) -> BoxFuture<'static, Result<(), BrokerError>> {
        let this = self.clone();
        Box::pin(async move {
            let agent = this.broker.agent(control.agent()).await?;
            let node = agent.filter(|a| !this.local(a)).and_then(|a| a.spec.node);
            this.route_to(node, control).await
        })
    }

    /// Sends a control to the runtime of `node` (`None`: this one).
    pub(super) fn route_to(
        &self,
        node: Option<String>,
        control: Control,
    ) -> BoxFuture<'static, Result<(), BrokerError>> {
        let this = self.clone();
        Box::pin(async move {
            match node {
                Some(node) => {
                    let (client, key) = this
                        .nats
                        .get()
                        .cloned()
                        .ok_or_else(|| NodeUnreachable::NoNats { node: node.clone() })?;
                    crate::node::wire::send_control(&client, &key, &node, &control).await
                }
                None => this.runtime.control(control).await.map_err(runtime_error),
            }
        })
    }
}

impl Plane {
    /// Starts an agent's session now, in whichever runtime serves it.
    pub(super) fn wake(&self, agent: Agent) -> BoxFuture<'static, Result<(), BrokerError>> {
        let this = self.clone();
        Box::pin(async move {
            let agent = this.with_secrets(agent).await;
            if this.local(&agent) {
                return this.runtime.warm(&agent).map_err(runtime_error);
            }
            this.route(Control::Wake {
                spec: Box::new(agent),
            })
            .await
        })
    }
}

impl Plane {
    /// The checks of an agent before it is registered, by the runtime that would serve
    /// it: this one's, on this host. A node's agent is not checked here (this host is
    /// not its host): a warning says so, and the node says what is wrong when its
    /// session cannot start (its directory, its program: the flight fails with it), and
    /// makes its worktree then (reported with [`relay_protocol::runtime::Report::Agent`]).
    ///
    /// An agent with a worktree here: the harness is checked first (in the repository,
    /// where the worktree's files come from), so a refusal leaves nothing made; then the
    /// worktree is made (or found, made before for it).
    fn check_agent(
        &self,
        spec: AgentSpec,
    ) -> BoxFuture<'static, Result<AgentChecked, BrokerError>> {
        let this = self.clone();
        Box::pin(async move {
            if spec.node.as_deref() != this.runtime.node() {
                let node = spec.node.clone().unwrap_or_default();
                let mut warning = format!(
                    "agent {} runs on node {node}: its directory, program and credentials are on that host and were not checked here; the node checks the directory and the program when it starts the session (a flight then fails saying what is wrong)",
                    spec.name
                );
                if spec.worktree.is_some() {
                    warning.push_str("; the node makes its worktree then too");
                }
                return Ok(AgentChecked {
                    warnings: vec![warning],
                    worktree: None,
                });
            }
            let warnings = match this.runtime.preflight(&spec).await {
                Ok(found) => found.warnings,
                Err(source) => {
                    return Err(BrokerError::AgentCheck {
                        name: spec.name.clone(),
                        source,
                    })
                }
            };
            let worktree = match &spec.worktree {
                Some(_) => Some(
                    this.runtime
                        .prepare_worktree(&spec)
                        .await
                        .map_err(runtime_error)?,
                ),
                None => None,
            };
            Ok(AgentChecked { warnings, worktree })
        })
    }

    /// A local agent's worktree's uncommitted files; a node's agent's worktree is on its
    /// host (its node keeps it, dirty, rather than lose work: see the removal there).
    fn worktree_dirty(&self, agent: Agent) -> BoxFuture<'static, Result<Vec<String>, BrokerError>> {
        let this = self.clone();
        Box::pin(async move {
            if agent.spec.worktree.is_none() || !this.local(&agent) {
                return Ok(Vec::new());
            }
            this.runtime
                .worktree_dirty(&agent)
                .await
                .map_err(runtime_error)
        })
    }

    /// A local agent's branch against its base, read here; a node's agent's branch is on
    /// its node's host: a control over NATS carries no answer back, so it is refused with
    /// the git command to run there.
    fn agent_diff(&self, agent: Agent) -> BoxFuture<'static, Result<AgentDiff, BrokerError>> {
        let this = self.clone();
        Box::pin(async move {
            let name = agent.spec.name.clone();
            if agent.spec.worktree.is_none() {
                return Err(BrokerError::Invalid(format!(
                    "agent {name} has no worktree (it was added without --worktree): its changes are in {} itself; see `git -C {} diff`",
                    agent.spec.cwd, agent.spec.cwd
                )));
            }
            if !this.local(&agent) {
                let node = agent.spec.node.clone().unwrap_or_default();
                let how = match &agent.worktree {
                    Some(w) => format!(
                        "`git -C {} diff {}...{}`",
                        agent.spec.cwd, w.base_commit, w.branch
                    ),
                    None => format!(
                        "`git -C {} diff BASE...{}`",
                        agent.spec.cwd,
                        relay_protocol::domain::branch_of(&name)
                    ),
                };
                return Err(BrokerError::Unavailable(format!(
                    "agent {name}'s worktree is on node {node}'s host: run {how} there (`relay diff FLIGHT` shows a flight's changes from here)"
                )));
            }
            this.runtime.agent_diff(&agent).await.map_err(runtime_error)
        })
    }

    /// Routes a revert to the runtime that serves the flight's agent. This one answers
    /// when it is done (its report of the revert is then on its way); a node's gets it
    /// over NATS and reports it when done.
    fn revert(
        &self,
        flight: Flight,
        commit: FlightCommit,
        by: String,
    ) -> BoxFuture<'static, Result<Reverting, BrokerError>> {
        let this = self.clone();
        Box::pin(async move {
            let agent = this
                .broker
                .agent(&flight.agent)
                .await?
                .ok_or_else(|| BrokerError::UnknownAgent(flight.agent.clone()))?;
            let node = agent.spec.node.clone().filter(|_| !this.local(&agent));
            let control = Control::Revert {
                agent: flight.agent.clone(),
                flight: flight.id.clone(),
                commit: Box::new(commit),
                by,
            };
            this.route_to(node.clone(), control).await?;
            Ok(match node {
                Some(node) => Reverting::Sent { node },
                None => Reverting::Done,
            })
        })
    }
}

impl Plane {
    /// What an agent's screen shows, read by this runtime. A node's agent's pane is on
    /// the node's host: a control over NATS carries no answer back, so it is refused
    /// with where to look instead.
    fn peek(&self, agent: Agent, lines: usize) -> BoxFuture<'static, Result<Peek, BrokerError>> {
        let this = self.clone();
        Box::pin(async move {
            let name = agent.spec.name.clone();
            if !this.runtime.has_screen(agent.spec.harness) {
                return Err(BrokerError::Invalid(format!(
                    "agent {name} runs {}, not in a tmux pane: there is no pane to peek at (`relay watch --agent {name}` follows its flights)",
                    agent.spec.harness
                )));
            }
            if !this.local(&agent) {
                let node = agent.spec.node.clone().unwrap_or_default();
                return Err(BrokerError::Unavailable(format!(
                    "agent {name}'s pane is on node {node}'s host; peek at it there"
                )));
            }
            let screen = this
                .runtime
                .peek(&agent, lines)
                .await
                .map_err(|e| match e {
                    // Says which agent and pane, for a person.
                    RuntimeError::Harness(HarnessError::NoScreen { detail }) => {
                        BrokerError::Unavailable(detail)
                    }
                    other => runtime_error(other),
                })?;
            Ok(Peek {
                agent: name,
                pane: screen.pane,
                attach: screen.attach,
                lines: screen.lines,
            })
        })
    }
}

impl FlightControl for Plane {
    fn peek(&self, agent: Agent, lines: usize) -> BoxFuture<'static, Result<Peek, BrokerError>> {
        Plane::peek(self, agent, lines)
    }

    fn wake(&self, agent: Agent) -> BoxFuture<'static, Result<(), BrokerError>> {
        Plane::wake(self, agent)
    }

    fn check_agent(
        &self,
        spec: AgentSpec,
    ) -> BoxFuture<'static, Result<AgentChecked, BrokerError>> {
        Plane::check_agent(self, spec)
    }

    fn worktree_dirty(&self, agent: Agent) -> BoxFuture<'static, Result<Vec<String>, BrokerError>> {
        Plane::worktree_dirty(self, agent)
    }

    fn agent_diff(&self, agent: Agent) -> BoxFuture<'static, Result<AgentDiff, BrokerError>> {
        Plane::agent_diff(self, agent)
    }

    fn revert(
        &self,
        flight: Flight,
        commit: FlightCommit,
        by: String,
    ) -> BoxFuture<'static, Result<Reverting, BrokerError>> {
        Plane::revert(self, flight, commit, by)
    }

    fn steer(
        &self,
        flight: Flight,
        text: String,
        by: Option<String>,
    ) -> BoxFuture<'static, Result<(), BrokerError>> {
        self.route(Control::Steer {
            agent: flight.agent,
            flight: flight.id,
            text,
            // A task with the steers added to it obeys the message limit, like the task.
            max_task_bytes: Some(self.broker.config().max_message_bytes),
            by,
        })
    }

    fn interrupt(&self, flight: Flight) -> BoxFuture<'static, Result<(), BrokerError>> {
        self.route(Control::Interrupt {
            agent: flight.agent,
            flight: flight.id,
        })
    }

    fn reply(&self, flight: Flight, text: String) -> BoxFuture<'static, Result<(), BrokerError>> {
        self.route(Control::Reply {
            agent: flight.agent,
            flight: flight.id,
            text,
        })
    }

    fn approval_decided(&self, approval: Approval) -> BoxFuture<'static, Result<(), BrokerError>> {
        let Some(decision) = approval.decision else {
            return Box::pin(async { Ok(()) });
        };
        self.route(Control::Approval {
            agent: approval.agent,
            flight: approval.request.flight,
            harness_request_id: approval.request.harness_request_id,
            decision,
        })
    }
}
