//! Who may invoke an agent: its allow list ([`AgentSpec::allow_from`]), its default,
//! and which agents must name one (a shell pane, [`AgentSpec::runs_shell`]).

use super::{valid_agent_name, AgentSpec, Harness};

/// In [`AgentSpec::allow_from`]: anyone may invoke the agent.
pub const ALLOW_ANYONE: &str = "*";
/// In [`AgentSpec::allow_from`]: the operator (any requester that is not a registered
/// agent) may invoke the agent.
pub const ALLOW_OPERATOR: &str = "operator";

impl AgentSpec {
    /// Whether the agent runs whatever it is sent as commands, with no approval step:
    /// a tmux agent with no program of its own (a `--shell` pane, or a pane it was
    /// attached to, whose program Relay does not know). Such an agent is invoked only by
    /// the principals its `allow_from` names, which it must name.
    pub fn runs_shell(&self) -> bool {
        self.harness == Harness::Tmux && self.command.is_none()
    }

    /// Who may invoke this agent: `allow_from` when given, else anyone
    /// ([`ALLOW_ANYONE`]: agents asking each other and mentions in shared channels are
    /// how Relay is used, and an agent with its own program still has its own approval
    /// step), except a shell ([`AgentSpec::runs_shell`]): only the operator (one stored
    /// before `allow_from` existed; a new one must name its list).
    pub fn allowed_from(&self) -> Vec<String> {
        match (self.allow_from.is_empty(), self.runs_shell()) {
            (false, _) => self.allow_from.clone(),
            (true, false) => vec![ALLOW_ANYONE.to_string()],
            (true, true) => vec![ALLOW_OPERATOR.to_string()],
        }
    }

    /// Whether `requester` may invoke this agent; `requester_is_agent`: it names a
    /// registered agent (else it is the operator, under whatever name it asks).
    pub fn allows(&self, requester: &str, requester_is_agent: bool) -> bool {
        self.allowed_from().iter().any(|p| {
            p == ALLOW_ANYONE
                || (p == ALLOW_OPERATOR && !requester_is_agent)
                || (requester_is_agent && p == requester)
        })
    }

    /// What is wrong with `allow_from`, if anything: each entry is [`ALLOW_ANYONE`],
    /// [`ALLOW_OPERATOR`] or an agent's name, at most 256 of them.
    pub fn allow_from_problem(&self) -> Option<String> {
        if self.allow_from.len() > 256 {
            return Some(format!(
                "allow_from names {} principals; at most 256",
                self.allow_from.len()
            ));
        }
        self.allow_from
            .iter()
            .find(|p| *p != ALLOW_ANYONE && *p != ALLOW_OPERATOR && !valid_agent_name(p))
            .map(|p| {
                let shown: String = p.chars().take(64).collect();
                format!("allow_from {shown:?} is not `*`, `operator` nor an agent's name")
            })
    }
}
