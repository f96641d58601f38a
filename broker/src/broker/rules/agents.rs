//! The rules of agents: registration (its secrets kept apart), removal, the state the
//! runtime reports, and a lost thread.

use std::collections::BTreeMap;

use relay_protocol::domain::{
    valid_agent_name, Agent, AgentSpec, AgentState, Endpoint, Harness, ProgramInfo, WorktreeState,
};
use relay_protocol::event::EventBody;

use super::Ctx;
use crate::broker::Outcome;
use crate::error::{clip, BadInput, BrokerError};
use crate::store::{encode, T};

/// The longest reason kept with an agent's state (a stderr tail can be long).
const STATE_REASON_BYTES: usize = 4096;

impl Ctx<'_, '_> {
    pub(super) fn register_agent(
        &mut self,
        spec: &AgentSpec,
        worktree: &Option<Box<WorktreeState>>,
    ) -> Result<Outcome, BrokerError> {
        check_spec(spec)?;
        if self.tx.contains(T::Agents, spec.name.as_bytes())? {
            return Err(BrokerError::AgentExists(spec.name.clone()));
        }
        let (spec, secrets) = split_secrets(spec)?;
        if !secrets.is_empty() {
            crate::store::Sink::put(self.tx, T::Secrets, spec.name.as_bytes(), encode(&secrets)?)?;
        }
        let agent = Agent {
            worktree: worktree.as_deref().cloned(),
            spec,
            state: AgentState::Offline,
            session_id: None,
            thread_id: None,
            endpoint: None,
            state_reason: None,
            note: None,
            program: None,
            created_at: self.now,
            updated_at: self.now,
        };
        self.emit(EventBody::AgentRegistered {
            agent: agent.clone(),
        })?;
        Ok(Outcome::Agent(agent))
    }

    /// `agent.wake` asked: kept as the agent's note (no flight's), its event naming who
    /// asked ([`crate::broker::Command::As`]); the session's start is the runtime's to report.
    pub(super) fn wake_asked(&mut self, name: &str) -> Result<Outcome, BrokerError> {
        let mut agent = self.agent(name)?;
        agent.note = Some(relay_protocol::domain::Note {
            text: "wake asked".into(),
            at: self.now,
            flight: None,
        });
        agent.updated_at = self.now;
        self.emit(EventBody::AgentUpdated {
            agent: agent.clone(),
        })?;
        Ok(Outcome::Agent(agent))
    }

    pub(super) fn remove_agent(&mut self, name: &str, force: bool) -> Result<Outcome, BrokerError> {
        let agent = self.agent(name)?;
        crate::store::Sink::del(self.tx, T::Secrets, name.as_bytes())?;
        self.emit(EventBody::AgentRemoved {
            name: name.to_owned(),
            node: agent.spec.node.clone(),
            force,
        })?;
        Ok(Outcome::Agent(agent))
    }

    /// The runtime reports an agent's session state (and why), thread id or endpoint: an
    /// event only if something changed. A state reported without a reason clears the
    /// previous one: it explained a state the agent has left.
    // One parameter per field of `Command::UpdateAgent`, each optional.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn update_agent(
        &mut self,
        name: &str,
        state: Option<AgentState>,
        thread_id: &Option<String>,
        endpoint: &Option<Option<Endpoint>>,
        reason: &Option<String>,
        program: &Option<ProgramInfo>,
        worktree: &Option<relay_protocol::domain::WorktreeState>,
    ) -> Result<Outcome, BrokerError> {
        let mut agent = self.agent(name)?;
        let before = agent.clone();
        if let Some(s) = state {
            // `busy` is derived from the flights, not stored (`AgentState::shown`): a
            // runtime from before that still reports it around each turn.
            agent.state = match s {
                AgentState::Busy => AgentState::Idle,
                s => s,
            };
            agent.state_reason = reason.as_deref().map(|r| clip(r, STATE_REASON_BYTES));
        }
        if let Some(t) = thread_id {
            agent.session_id = Some(t.clone());
            // Codex calls its session a thread; other harnesses have none.
            agent.thread_id = (agent.spec.harness == Harness::CodexAppServer).then(|| t.clone());
        }
        if let Some(e) = endpoint {
            agent.endpoint = e.clone();
        }
        if let Some(p) = program {
            agent.program = Some(p.clone());
        }
        if let Some(w) = worktree {
            agent.worktree = Some(w.clone());
        }
        if agent != before {
            agent.updated_at = self.now;
            self.emit(EventBody::AgentUpdated {
                agent: agent.clone(),
            })?;
        }
        Ok(Outcome::Agent(agent))
    }

    pub(super) fn thread_lost(
        &mut self,
        agent: &str,
        old_thread_id: &str,
        new_thread_id: &str,
        reason: &str,
    ) -> Result<Outcome, BrokerError> {
        self.agent(agent)?;
        self.emit(EventBody::ThreadLost {
            agent: agent.to_owned(),
            old_thread_id: old_thread_id.to_owned(),
            new_thread_id: new_thread_id.to_owned(),
            reason: reason.to_owned(),
        })?;
        Ok(Outcome::Done)
    }
}

/// What a registration's spec must be, whatever is registered already: its name, node,
/// cwd, policy, worktree, pane and who may invoke it. Checked again by the rule, and
/// before the runtime's checks (which make the worktree: git must never run on a name
/// the rule refuses).
pub(in crate::broker) fn check_spec(spec: &AgentSpec) -> Result<(), BrokerError> {
    if !valid_agent_name(&spec.name) {
        return Err(BadInput::AgentName(spec.name.clone()).into());
    }
    // An agent speaks under its name: as `relay` or `operator` it would author
    // what reads as Relay's or the operator's (checked at registration only, not
    // in `valid_agent_name`, so an existing store still loads).
    if let Some(why) = relay_protocol::domain::decider::reserved_name(&spec.name) {
        return Err(BadInput::ReservedAgentName {
            name: spec.name.clone(),
            why,
        }
        .into());
    }
    if let Some(node) = &spec.node {
        if !valid_agent_name(node) {
            return Err(BadInput::NodeName(node.clone()).into());
        }
    }
    if spec.cwd.trim().is_empty() {
        return Err(BadInput::Empty("agent's cwd").into());
    }
    crate::policy::validate(&spec.approval_policy).map_err(BadInput::Policy)?;
    check_worktree(spec)?;
    check_pane(spec)?;
    if let Some(problem) = spec.allow_from_problem() {
        return Err(BadInput::AllowFrom(problem).into());
    }
    // A shell runs any task as commands, with no approval step: who may send it one
    // is said, never a default.
    if spec.runs_shell() && spec.allow_from.is_empty() {
        return Err(BadInput::ShellNeedsAllowFrom(spec.name.clone()).into());
    }
    Ok(())
}

/// A pane is only a tmux agent's, and well formed: its ready pattern a regular
/// expression, and a pane Relay starts runs a named program or, asked for
/// explicitly, a shell (never a shell by default: it runs each task as commands).
fn check_pane(spec: &AgentSpec) -> Result<(), BrokerError> {
    if let Some(problem) = spec.pane_program_problem() {
        return Err(BadInput::Pane(problem).into());
    }
    let Some(pane) = &spec.pane else {
        return Ok(());
    };
    if spec.harness != Harness::Tmux {
        return Err(BadInput::PaneNotTmux {
            agent: spec.name.clone(),
            harness: spec.harness,
        }
        .into());
    }
    if let Some(problem) = pane.problem() {
        return Err(BadInput::Pane(problem).into());
    }
    if let Some(pattern) = &pane.ready_pattern {
        relay_harnesses::tmux::screens::ReadyPattern::new(pattern).map_err(|e| {
            BadInput::ReadyPattern {
                agent: spec.name.clone(),
                error: e.to_string(),
            }
        })?;
    }
    Ok(())
}

/// The worktree a registration asks for is well formed, before any git runs on it:
/// the repository (`cwd`) an absolute path (the runtime runs git there, from wherever it
/// was started), the base a ref (never an option: git reads a leading `-` as one), the
/// directory absolute, and what is copied in relative to the repository, never out of it.
fn check_worktree(spec: &AgentSpec) -> Result<(), BrokerError> {
    let Some(w) = &spec.worktree else {
        return Ok(());
    };
    let bad = |why: String| -> Result<(), BrokerError> { Err(BadInput::Worktree(why).into()) };
    if !std::path::Path::new(&spec.cwd).is_absolute() {
        return bad(format!(
            "the repository (cwd) {:?} must be an absolute path",
            spec.cwd
        ));
    }
    if spec.cwd.contains('\0') {
        return bad("the repository (cwd) holds a NUL byte".into());
    }
    if let Some(base) = &w.base {
        if base.trim().is_empty() || base.starts_with('-') || base.contains(['\0', '\n']) {
            return bad(format!(
                "--base {base:?} is not a branch, tag or commit name"
            ));
        }
    }
    if let Some(dir) = &w.dir {
        if dir.contains('\0') || !std::path::Path::new(dir).is_absolute() {
            return bad(format!("--worktree-dir {dir:?} must be an absolute path"));
        }
    }
    for pattern in &w.copy {
        let path = std::path::Path::new(pattern);
        if pattern.trim().is_empty()
            || pattern.contains('\0')
            || path.is_absolute()
            || path
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return bad(format!(
                "--copy {pattern:?}: name files relative to the repository, inside it (no `..`, not absolute)"
            ));
        }
    }
    Ok(())
}

/// A registration's spec as it is stored and published, and its secret variables: the
/// values of `secrets` and of every `env` variable whose name looks secret, each left
/// in `env` as [`relay_protocol::domain::SECRET_SHOWN`].
fn split_secrets(spec: &AgentSpec) -> Result<(AgentSpec, BTreeMap<String, String>), BrokerError> {
    let mut spec = spec.clone();
    spec.move_secrets();
    let secrets = std::mem::take(&mut spec.secrets).0;
    for name in secrets.keys() {
        if name.is_empty() || name.len() > 256 || name.contains(['=', '\0']) {
            let shown: String = name.chars().take(64).collect();
            return Err(BadInput::SecretName(shown).into());
        }
    }
    Ok((spec, secrets))
}
