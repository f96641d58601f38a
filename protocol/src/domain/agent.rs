//! Agents: which harness drives each, how it is started, its secrets, its approval
//! policy and what Relay knows of its session.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::pane::PaneSpec;
use super::secrets::{looks_secret, looks_secret_value, Secrets, SECRET_SHOWN};
use crate::names::wire_enum;

wire_enum! {
    /// Which adapter drives an agent. Also the transport of its endpoint.
    pub enum Harness("harness") {
        CodexAppServer = "codex_app_server",
        ClaudeStreamJson = "claude_stream_json",
        PiRpc = "pi_rpc",
        Tmux = "tmux",
        /// Any Agent Client Protocol agent, started by its `command` and `args`.
        Acp = "acp",
        /// The ACP presets: the verified CLIs with the command, arguments and settings
        /// that keep them offline-quiet and asking before tools (`HARNESSES.md`).
        GeminiAcp = "gemini_acp",
        OpencodeAcp = "opencode_acp",
        QwenAcp = "qwen_acp",
    }
}

/// What a harness can do. The runtime answers a control the harness cannot carry out
/// as unavailable, saying so, and never asks the adapter; the CLI and the API say it
/// up front (`relay agent show`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// Text can be added to the running turn.
    pub steer: bool,
    /// The CLI asks before it runs things, and takes an answer.
    pub approvals: bool,
    /// A new process can continue a stored conversation. Without, the runtime starts a
    /// new one and records the old one as lost.
    pub resume: bool,
    /// The running turn can be stopped.
    pub interrupt: bool,
    /// The CLI names its turns. Without, a turn goes by the id Relay gives it.
    pub turn_ids: bool,
    /// A turn ends only when the agent answers it through Relay (`relay reply FLIGHT
    /// TEXT`, or the MCP `reply` tool with the flight): the program says nothing of its
    /// turns (a tmux pane). Such a turn fails at its timeout when no answer comes
    /// (the ask's `--timeout`, else the agent's `turn_timeout_secs`, else
    /// [`DEFAULT_REPLY_TIMEOUT_SECS`]). Without, turns end on their own and an answer
    /// through Relay is refused.
    #[serde(default)]
    pub reply: bool,
    /// A new session can start as a copy of one of its sessions, cut after a given
    /// turn (`relay agent fork`).
    #[serde(default)]
    pub fork: bool,
}

/// How long a turn of a harness that ends turns by reply ([`Capabilities::reply`]) waits
/// for its answer when neither the ask nor the agent says: 30 minutes.
pub const DEFAULT_REPLY_TIMEOUT_SECS: u64 = 30 * 60;

impl Capabilities {
    /// Everything (Codex app-server).
    pub const ALL: Capabilities = Capabilities {
        steer: true,
        approvals: true,
        resume: true,
        interrupt: true,
        turn_ids: true,
        reply: false,
        fork: true,
    };
}

impl Harness {
    /// The short name a person types (`relay agent add --harness codex`) and the name
    /// Relay records a harness's own decisions under (`codex:withdrawn`).
    pub const fn short_name(self) -> &'static str {
        match self {
            Harness::CodexAppServer => "codex",
            Harness::ClaudeStreamJson => "claude",
            Harness::PiRpc => "pi",
            Harness::Tmux => "tmux",
            Harness::Acp => "acp",
            Harness::GeminiAcp => "gemini",
            Harness::OpencodeAcp => "opencode",
            Harness::QwenAcp => "qwen",
        }
    }

    /// It speaks the Agent Client Protocol (the generic `acp` or one of its presets).
    pub const fn is_acp(self) -> bool {
        use Harness::*;
        matches!(self, Acp | GeminiAcp | OpencodeAcp | QwenAcp)
    }

    /// The harness named by its short name or its wire name.
    pub fn from_name(name: &str) -> Option<Harness> {
        Harness::ALL
            .into_iter()
            .find(|h| h.short_name() == name || h.as_str() == name)
    }

    /// What the harness's CLI can do (facts in `HARNESSES.md`):
    ///
    /// | | steer | approvals | resume | interrupt | turn ids | fork |
    /// | --- | --- | --- | --- | --- | --- | --- |
    /// | Codex app-server | `turn/steer` | server requests | `thread/resume` | `turn/interrupt` | yes | `thread/fork` |
    /// | Claude Code stream-json | no | `can_use_tool` | `--resume` | control request | no | `--fork-session` |
    /// | Pi RPC | `steer` | none: tools run at once | `--session` | `abort` | no | its session fork |
    /// | tmux pane | no | none | no | keys | no | no |
    /// | ACP agent (and presets) | no | `session/request_permission` | `session/resume` or `session/load` | `session/cancel` | no | no |
    ///
    /// Only a tmux pane's turns end by a reply through Relay ([`Capabilities::reply`]).
    pub const fn capabilities(self) -> Capabilities {
        match self {
            Harness::CodexAppServer => Capabilities::ALL,
            Harness::ClaudeStreamJson => Capabilities {
                steer: false,
                approvals: true,
                resume: true,
                interrupt: true,
                turn_ids: false,
                reply: false,
                fork: true,
            },
            Harness::PiRpc => Capabilities {
                steer: true,
                approvals: false,
                resume: true,
                interrupt: true,
                turn_ids: false,
                reply: false,
                fork: true,
            },
            Harness::Tmux => Capabilities {
                steer: false,
                approvals: false,
                resume: false,
                interrupt: true,
                turn_ids: false,
                reply: true,
                fork: false,
            },
            Harness::Acp | Harness::GeminiAcp | Harness::OpencodeAcp | Harness::QwenAcp => {
                Capabilities {
                    steer: false,
                    approvals: true,
                    resume: true,
                    interrupt: true,
                    turn_ids: false,
                    reply: false,
                    fork: false,
                }
            }
        }
    }
}

wire_enum! {
    /// When the runtime starts an agent's session.
    #[derive(Default)]
    pub enum WakePolicy("wake policy") {
        /// Started by the first invocation, kept while the runtime lives.
        #[default]
        OnDemand = "on_demand",
        /// Started with the runtime and restarted if it dies.
        KeepWarm = "keep_warm",
        /// Never started by Relay: something else (a person, tmux) runs it.
        Manual = "manual",
    }
}

wire_enum! {
    /// The agent's session state as last reported by its runtime.
    #[derive(Default)]
    pub enum AgentState("agent state") {
        /// No live session.
        #[default]
        Offline = "offline",
        Starting = "starting",
        Idle = "idle",
        /// Idle, with a flight running a turn (`running` or `waiting`): derived from the
        /// flights when an agent is shown ([`AgentState::shown`]), not stored (a broker
        /// before 2026-11-29 stored it, from the runtime's reports).
        Busy = "busy",
        /// The session died and has not been restarted.
        Failed = "failed",
    }
}

impl AgentState {
    /// The state to show for an agent whose stored session state is `self`, given
    /// whether one of its flights runs a turn: `busy` while a live session has one,
    /// else the stored state (a stored `busy` is a live session: `idle` without a turn).
    pub fn shown(self, turning: bool) -> AgentState {
        match self {
            AgentState::Idle | AgentState::Busy if turning => AgentState::Busy,
            AgentState::Busy => AgentState::Idle,
            other => other,
        }
    }
}

/// How an approval request is decided when no person answers.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ApprovalPolicy {
    /// Rules (see `relay_broker::policy`): a command one of them matches whole is
    /// accepted automatically.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        alias = "accept_command_prefixes"
    )]
    pub accept_commands: Vec<String>,
    /// Rules: a command that starts with one of them is declined automatically.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        alias = "decline_command_prefixes"
    )]
    pub decline_commands: Vec<String>,
    /// Accept every file change automatically.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub accept_file_changes: bool,
    /// An approval no rule decided and nobody answered within this many seconds is
    /// declined, recorded as decided by `policy:timeout:<N>s`. `None`: it waits for a
    /// person, however long (until its turn ends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
}

/// What a client sends to register an agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentSpec {
    pub name: String,
    pub harness: Harness,
    pub cwd: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The runtime node that serves this agent; `None` means the broker's embedded runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default)]
    pub wake: WakePolicy,
    /// Program to run instead of the harness's default binary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Variables for the program. A secret one (see [`Secrets`]) is kept here as
    /// [`SECRET_SHOWN`], its name only.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Secret variables' values: taken from a registration, then kept apart from the
    /// event log; filled in only for the runtime that starts the agent.
    #[serde(default, skip_serializing_if = "Secrets::is_empty")]
    pub secrets: Secrets,
    #[serde(default)]
    pub approval_policy: ApprovalPolicy,
    /// Where a tmux agent's pane is: Relay's own server, or a pane it was attached to.
    /// Only for [`Harness::Tmux`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pane: Option<PaneSpec>,
    /// A turn that has not ended after this many seconds fails (and is interrupted),
    /// unless the ask gave its own timeout. `None`: no limit, except for a harness whose
    /// turns end by reply ([`DEFAULT_REPLY_TIMEOUT_SECS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_timeout_secs: Option<u64>,
    /// Who may invoke this agent (ask it, or consult it with a mention): [`ALLOW_ANYONE`],
    /// [`ALLOW_OPERATOR`] (whoever is not a registered agent: the operator's token, a
    /// person, the bus) or agents by name. Empty: [`AgentSpec::allowed_from`]'s default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_from: Vec<String>,
    /// A git worktree of its own, on branch `relay/NAME`, made from the repository
    /// `cwd` ([`WorktreeSpec`]); `None`: the agent works in `cwd` itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree: Option<super::WorktreeSpec>,
    /// The agent was forked from another's session ([`super::ForkSpec`]): its first
    /// session is that fork.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork: Option<super::ForkSpec>,
    /// Its limits per day and per flight tree (`--budget`); `None`: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<super::Budget>,
}

impl AgentSpec {
    /// Moves every secret variable of `env` (by [`looks_secret`] name or
    /// [`looks_secret_value`] value, or already named in `secrets`) into `secrets`,
    /// leaving [`SECRET_SHOWN`] in `env`; names given only in `secrets` are added to
    /// `env` the same way. Idempotent.
    pub fn move_secrets(&mut self) {
        for (name, value) in self.env.iter_mut() {
            let secret = looks_secret(name)
                || looks_secret_value(value)
                || self.secrets.0.contains_key(name);
            if secret && value != SECRET_SHOWN {
                let value = std::mem::replace(value, SECRET_SHOWN.to_string());
                self.secrets.0.entry(name.clone()).or_insert(value);
            }
        }
        for name in self.secrets.0.keys() {
            self.env.insert(name.clone(), SECRET_SHOWN.to_string());
        }
    }

    /// Why a tmux agent's pane cannot be started as given, if it cannot: Relay starts
    /// it (no pane to attach to) and it names no program (`command`) and did not ask for
    /// a shell ([`PaneSpec::shell`]), or it asks for both. A shell is never the silent
    /// default: it would run each task as shell commands.
    pub fn pane_program_problem(&self) -> Option<String> {
        if self.harness != Harness::Tmux {
            return None;
        }
        let pane = self.pane.clone().unwrap_or_default();
        if pane.target.is_some() {
            return None;
        }
        match (&self.command, pane.shell) {
            (None, false) => Some(format!(
                "tmux agent {:?} names no program to start in its pane: pass --command CMD (the \"command\" field; e.g. --command codex), or --shell (\"pane\": {{\"shell\": true}}) to run a shell there, which runs each task as shell commands",
                self.name
            )),
            (Some(_), true) => Some(format!(
                "tmux agent {:?} names a program and asks for a shell: give one of --command and --shell",
                self.name
            )),
            _ => None,
        }
    }

    /// An agent with every option at its default: on-demand wake, the harness's own
    /// program and model, the embedded runtime, no approval policy.
    pub fn new(name: impl Into<String>, harness: Harness, cwd: impl Into<String>) -> AgentSpec {
        AgentSpec {
            name: name.into(),
            harness,
            cwd: cwd.into(),
            model: None,
            node: None,
            wake: WakePolicy::default(),
            command: None,
            args: Vec::new(),
            env: BTreeMap::new(),
            secrets: Secrets::default(),
            approval_policy: ApprovalPolicy::default(),
            pane: None,
            turn_timeout_secs: None,
            allow_from: Vec::new(),
            worktree: None,
            fork: None,
            budget: None,
        }
    }
}

/// A registered agent: its spec plus what Relay knows of its session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Agent {
    #[serde(flatten)]
    pub spec: AgentSpec,
    pub state: AgentState,
    /// The harness's persistent session: Codex's thread id, Claude Code's or Pi's
    /// session id. Stored, and resumed after any restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The Codex thread id (the same as `session_id`); only for Codex agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<Endpoint>,
    /// Why the agent is in its state, as its runtime said with it: for `failed`, the
    /// error its session could not start with (a spawn error, an exit status and the
    /// stderr tail); for `offline` after its process died, how it ended. Cleared by the
    /// next state reported without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_reason: Option<String>,
    /// The latest note of any of its flights (see [`crate::domain::FlightChange::Note`]),
    /// with its time and flight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<crate::domain::Note>,
    /// What the agent's program said of itself when its session last started (an ACP
    /// agent's `initialize`: its name, version and capabilities); kept while it is
    /// offline. `None` for a harness that says nothing of itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<ProgramInfo>,
    /// The agent's worktree as its runtime made it (only with [`AgentSpec::worktree`];
    /// `None` until the runtime that serves it has made it). `worktree_state` in JSON:
    /// beside its (flattened) spec's `worktree`, what was asked.
    #[serde(
        rename = "worktree_state",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub worktree: Option<super::WorktreeState>,
    pub created_at: u64,
    pub updated_at: u64,
}

/// What an agent's program says of itself at start ([`Agent::program`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ProgramInfo {
    /// Its name (`gemini-cli`, `opencode`).
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// The protocol version it speaks (ACP's `protocolVersion`), where it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<u32>,
    /// What it offers, by name (`load_session`, `resume`, `image`...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
}

/// How an agent is reachable right now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    pub transport: Harness,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pane: Option<String>,
}

/// `true` when `name` is a valid agent name: 1..=64 of `[A-Za-z0-9_.-]`, starting with an
/// alphanumeric. Names appear in NATS subjects, so no spaces, `*`, `>` or wildcards.
pub fn valid_agent_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests;
