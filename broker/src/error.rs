//! The broker's typed error, and the one place it maps to wire error codes.

use relay_protocol::api::{ApiError, ErrorCode};
use relay_protocol::domain::{FlightState, Harness};
use relay_runtime::RuntimeError;

/// Errors of broker commands and storage. `Overloaded` and `Storage` are worth retrying;
/// the others will fail the same way again.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// Bad input the interfaces find before it reaches the domain (a malformed body).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A field of the request is not valid: the client fixes it and asks again.
    #[error("invalid request: {0}")]
    BadInput(BadInput),
    /// A watch or feed asked to resume past the log's end: the client resumes from the
    /// last event it received.
    #[error("invalid request: after {after} is past the log's last seq {last}: resume from the last event received")]
    PastTheLog { after: u64, last: u64 },
    /// An approval asked by another agent than the one running its flight: refused.
    #[error("invalid request: flight {flight} is not agent {agent:?}'s: an approval is asked by the agent running the flight")]
    NotAgentsFlight { flight: String, agent: String },
    /// A node reported what nodes do not send: refused, never applied.
    #[error("invalid request: node {node:?} reported a command nodes do not send")]
    NodeCommand { node: String },
    /// A node reported on another node's agent: refused (its key speaks for it alone).
    #[error("invalid request: node {node:?} may only report on its own agents, not {agent:?}")]
    NotNodesAgent { node: String, agent: String },
    #[error("{what} is {size} bytes, over the limit of {limit} bytes")]
    TooLarge {
        what: &'static str,
        size: usize,
        limit: usize,
    },
    #[error("unknown agent {}", quote(.0))]
    UnknownAgent(String),
    #[error("unknown conversation {}", quote(.0))]
    UnknownConversation(String),
    #[error("unknown flight {}{}", quote(.0), flight_id_hint(.0))]
    UnknownFlight(String),
    #[error("unknown message {}", quote(.0))]
    UnknownMessage(String),
    #[error("unknown approval {}", quote(.0))]
    UnknownApproval(String),
    #[error("agent {} is already registered", quote(.0))]
    AgentExists(String),
    #[error("conversation {} already exists", quote(.0))]
    ConversationExists(String),
    #[error("flight {flight}: illegal transition {from} -> {to}")]
    IllegalTransition {
        flight: String,
        from: FlightState,
        to: FlightState,
    },
    #[error("flight {flight} is {state}, a terminal state; it does not change any more")]
    FlightTerminal { flight: String, state: FlightState },
    #[error("approval {} is already closed", quote(.0))]
    ApprovalClosed(String),
    #[error("unknown rule {} (`relay rule list` shows the rules)", quote(.0))]
    UnknownRule(String),
    /// A flight would start past a budget (`--budget`). `what` names the budget and
    /// what was used of it (`agent "a": 200000 tokens/day, 201337 used`); `resets`
    /// says when it resets or how to go on.
    #[error("budget_exceeded: {what}; {resets}")]
    BudgetExceeded { what: String, resets: String },
    /// `relay approve` named a flight of an agent whose harness never asks (Pi).
    #[error("flight {} has nothing to approve: agent {} runs {harness}, which has no approval step (its tools run without asking)", quote(.flight), quote(.agent))]
    NoApprovalStep {
        flight: String,
        agent: String,
        harness: Harness,
    },
    /// The checks before registering an agent refused it (its directory is missing,
    /// its program does not run). Not retryable until that is fixed.
    #[error("agent {} cannot be added: {source}", quote(.name))]
    AgentCheck {
        name: String,
        #[source]
        source: relay_harnesses::HarnessError,
    },
    /// An agent's worktree could not be made, committed, reverted or removed: says what
    /// to do.
    #[error(transparent)]
    Workspace(relay_runtime::workspace::WorkspaceError),
    /// A registration refused after the agent's worktree was made: the worktree is left
    /// for `relay doctor --fix` (the refusal's code is the cause's).
    #[error("{source} (the worktree made for it, {path}, is left: `relay doctor --fix` removes it with the broker stopped, or `git worktree remove {path}`)")]
    WorktreeLeft {
        path: String,
        #[source]
        source: Box<BrokerError>,
    },
    #[error("{0}")]
    Unavailable(String),
    /// This broker has no runtime to steer, interrupt or wake with: nothing to retry.
    #[error("no runtime serves this broker")]
    NoRuntime,
    /// The node serving an agent could not be reached with a control: retry once it is.
    #[error("{0}")]
    NodeUnreachable(NodeUnreachable),
    /// The runtime refused a control or failed it (the agent's session could not do it);
    /// see [`runtime_error`].
    #[error("{0}")]
    Runtime(RuntimeError),
    #[error("invocation depth {depth} exceeds the limit of {limit}")]
    DepthLimit { depth: u32, limit: u32 },
    #[error(
        "cycle: agent {} is already working on an ancestor flight",
        quote(agent)
    )]
    Cycle { agent: String },
    #[error(
        "agent {} cannot ask itself: the flight it asks from is its own",
        quote(agent)
    )]
    SelfAsk { agent: String },
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// A bus request that decides, acts on someone's turn or speaks for the operator or
    /// an agent, on a bus anyone may publish on: refused, with the flags that trust it.
    #[error("unauthorized: {what} is refused on this bus: NATS has no credentials and the broker no request token, so anyone who reaches the server could do it; start relay up with {}", relay_protocol::bus::TRUST_FLAGS)]
    OpenBus { what: String },
    /// The target's allow list does not name the requester (`relay agent add
    /// --allow-from`): refused before anything is written.
    #[error("unauthorized: {} may not invoke agent {}: it accepts invocations from {allowed} only (relay agent add {} --allow-from ...)", quote(.requester), quote(.target), quote(.target))]
    NotAllowed {
        requester: String,
        target: String,
        /// The list, as shown (`"operator", "lead"`).
        allowed: String,
    },
    /// An agent linked what it asks to a flight that is not the one it is running.
    #[error("invalid request: {} can link what it asks only to the flight it is running, and flight {} is {what}", quote(.agent), quote(.flight))]
    ParentNotRunning {
        agent: String,
        flight: String,
        /// What the flight is instead ("queued", "agent \"b\"'s").
        what: String,
    },
    /// The agent has as many flights waiting as its queue holds: refused before any is
    /// written, so a flood of asks stores nothing.
    #[error("the broker is overloaded: agent {} has {live} flights not yet ended, its turn and a full queue of {limit}; retry later", quote(.agent))]
    AgentQueueFull {
        agent: String,
        live: u64,
        limit: usize,
    },
    #[error("the broker is overloaded: {0}")]
    Overloaded(String),
    #[error("the data directory {0} is in use by another relay process")]
    Locked(String),
    #[error("the broker is shutting down")]
    ShuttingDown,
    #[error("storage: {0}")]
    Storage(#[from] sled::Error),
    /// The event log could not be read or written (the disk failed, or the log is
    /// damaged): like a storage error, the broker stops taking commands.
    #[error("event log: {0}")]
    Log(String),
    /// The storage thread failed a job (a flush failed, or it is gone).
    #[error("storage: {0}")]
    StorageThread(#[from] relay_infra::storage::StorageError),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    #[error("internal: {0}")]
    Internal(String),
    /// What a runtime node answered a control with, with the code it gave
    /// (`unavailable` from a node that gives no other).
    #[error("{}", .0.message)]
    Node(ApiError),
}

impl BrokerError {
    /// The same error for another caller (merged deltas share one outcome): the
    /// variants a flight update fails with are copied, any other keeps its code and
    /// message.
    pub fn duplicate(&self) -> BrokerError {
        match self {
            BrokerError::UnknownFlight(f) => BrokerError::UnknownFlight(f.clone()),
            BrokerError::FlightTerminal { flight, state } => BrokerError::FlightTerminal {
                flight: flight.clone(),
                state: *state,
            },
            BrokerError::IllegalTransition { flight, from, to } => BrokerError::IllegalTransition {
                flight: flight.clone(),
                from: *from,
                to: *to,
            },
            BrokerError::ShuttingDown => BrokerError::ShuttingDown,
            other => BrokerError::Node(other.to_api()),
        }
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            BrokerError::Invalid(_)
            | BrokerError::BadInput(_)
            | BrokerError::PastTheLog { .. }
            | BrokerError::NotAgentsFlight { .. }
            | BrokerError::NodeCommand { .. }
            | BrokerError::NotNodesAgent { .. }
            | BrokerError::ParentNotRunning { .. }
            | BrokerError::Json(_) => ErrorCode::InvalidRequest,
            BrokerError::TooLarge { .. } => ErrorCode::PayloadTooLarge,
            BrokerError::UnknownAgent(_) => ErrorCode::UnknownAgent,
            BrokerError::UnknownConversation(_) => ErrorCode::UnknownConversation,
            BrokerError::UnknownFlight(_) => ErrorCode::UnknownFlight,
            BrokerError::UnknownMessage(_) => ErrorCode::UnknownMessage,
            BrokerError::UnknownApproval(_) => ErrorCode::UnknownApproval,
            BrokerError::AgentExists(_) => ErrorCode::AgentExists,
            BrokerError::ConversationExists(_) => ErrorCode::ConversationExists,
            BrokerError::IllegalTransition { .. } => ErrorCode::IllegalTransition,
            BrokerError::FlightTerminal { .. } => ErrorCode::FlightTerminal,
            BrokerError::ApprovalClosed(_) => ErrorCode::ApprovalClosed,
            BrokerError::UnknownRule(_) => ErrorCode::UnknownRule,
            BrokerError::BudgetExceeded { .. } => ErrorCode::BudgetExceeded,
            BrokerError::NoApprovalStep { .. } | BrokerError::AgentCheck { .. } => {
                ErrorCode::InvalidRequest
            }
            BrokerError::WorktreeLeft { source, .. } => source.code(),
            BrokerError::Workspace(w) => {
                use relay_runtime::workspace::WorkspaceError as W;
                match w {
                    W::GitMissing | W::Locked { .. } => ErrorCode::Unavailable,
                    W::Git { .. } | W::Io(_) => ErrorCode::Internal,
                    W::NoCommits { .. }
                    | W::PathTaken { .. }
                    | W::InsideRepo { .. }
                    | W::NothingToRevert { .. }
                    | W::Running { .. }
                    | W::NoWorktree { .. }
                    | W::OnNode { .. }
                    | W::NotARepo { .. }
                    | W::UnknownRef { .. }
                    | W::BranchTaken { .. }
                    | W::DirtyBase { .. }
                    | W::Dirty { .. }
                    | W::RevertConflict { .. } => ErrorCode::InvalidRequest,
                }
            }
            BrokerError::Unavailable(_)
            | BrokerError::NoRuntime
            | BrokerError::NodeUnreachable(_)
            | BrokerError::Runtime(_)
            | BrokerError::ShuttingDown => ErrorCode::Unavailable,
            BrokerError::DepthLimit { .. } => ErrorCode::DepthLimit,
            BrokerError::Cycle { .. } | BrokerError::SelfAsk { .. } => ErrorCode::Cycle,
            BrokerError::Overloaded(_) | BrokerError::AgentQueueFull { .. } => {
                ErrorCode::Overloaded
            }
            BrokerError::Unauthorized(_)
            | BrokerError::OpenBus { .. }
            | BrokerError::NotAllowed { .. } => ErrorCode::Unauthorized,
            BrokerError::Node(e) => e.code,
            BrokerError::StorageThread(relay_infra::storage::StorageError::Full(_)) => {
                ErrorCode::StorageFull
            }
            BrokerError::Locked(_)
            | BrokerError::Storage(_)
            | BrokerError::Log(_)
            | BrokerError::StorageThread(_)
            | BrokerError::Corrupt(_)
            | BrokerError::Internal(_) => ErrorCode::Internal,
        }
    }

    pub fn to_api(&self) -> ApiError {
        ApiError {
            code: self.code(),
            message: clip(&self.to_string(), MAX_ERROR_MESSAGE),
        }
    }
}

/// The longest piece of a client's input an error message quotes.
pub const QUOTE_BYTES: usize = 100;

/// The longest error message an interface answers. Ours quote input with [`quote`] and
/// stay far below it; this bounds the ones that quote input on their own (a JSON
/// parser's "unknown variant `...`").
pub const MAX_ERROR_MESSAGE: usize = 1024;

/// A runtime's error as the broker answers it (also what a node answers the broker).
pub(crate) fn runtime_error(e: RuntimeError) -> BrokerError {
    match e {
        RuntimeError::Overloaded(a) => {
            BrokerError::Overloaded(format!("agent {a:?} queue is full"))
        }
        RuntimeError::TooLarge { size, limit, .. } => BrokerError::TooLarge {
            what: "the queued flight's task with its steers",
            size,
            limit,
        },
        RuntimeError::ShuttingDown => BrokerError::ShuttingDown,
        RuntimeError::Workspace(w) => BrokerError::Workspace(w),
        // Every other refusal or fault of the runtime: the agent's session could not do
        // it (named one by one, so that a new variant is a decision here).
        e @ (RuntimeError::NotRunning { .. }
        | RuntimeError::NoSession { .. }
        | RuntimeError::Unsupported { .. }
        | RuntimeError::TurnEnded { .. }
        | RuntimeError::Poisoned
        | RuntimeError::Harness(_)
        | RuntimeError::Storage(_)
        | RuntimeError::Json(_)
        | RuntimeError::StorageThread(_)
        | RuntimeError::ReportFile { .. }
        | RuntimeError::ReportText { .. }) => BrokerError::Runtime(e),
    }
}

/// What is wrong with a field of a request (the message after "invalid request: ").
/// Client input is quoted with [`quote`].
#[derive(Debug, thiserror::Error)]
pub enum BadInput {
    /// A text that must say something (`what`: "message body", "task", "agent's cwd"...).
    #[error("the {0} is empty")]
    Empty(&'static str),
    /// A name of someone (`what`: "requester", "message author") out of 1 to 128 characters.
    #[error("a {0} is 1 to 128 characters")]
    Length(&'static str),
    #[error("agent name {} is not valid: use 1 to 64 letters, digits, '-' or '_', starting with a letter or digit", quote(.0))]
    AgentName(String),
    #[error("node name {} is not valid: use letters, digits, '-' or '_'", quote(.0))]
    NodeName(String),
    /// One of Relay's own names (`operator`, `relay`, `nats`...), which no agent takes.
    #[error("agent name {} is not allowed: {why}; name the agent otherwise", quote(.name))]
    ReservedAgentName { name: String, why: String },
    #[error("conversation id {}: 1 to 200 bytes of dot-separated words of letters, digits, `-` and `_` (like channel.shared)", quote(.0))]
    ConversationId(String),
    /// Its start (64 characters), as shown.
    #[error("secret variable name {0:?} is not valid: 1 to 256 bytes, no '=' or NUL")]
    SecretName(String),
    #[error("decided_by {} is not valid: name who decides in 1 to 128 letters, digits or ._@:+-/", quote(.0))]
    Decider(String),
    /// One of Relay's own identities, which no client may decide as.
    #[error("decided_by {} is not allowed: {why}; decide under your own name, or leave decided_by out", quote(.decided_by))]
    ReservedDecider { decided_by: String, why: String },
    /// What is wrong with the worktree an agent's registration asks for.
    #[error("--worktree: {0}")]
    Worktree(String),
    #[error("agent {} runs {harness}: only a tmux agent has a pane", quote(.agent))]
    PaneNotTmux { agent: String, harness: Harness },
    /// What the spec says is wrong with its pane or the program it runs.
    #[error("{0}")]
    Pane(String),
    #[error("agent {}: {error}", quote(.agent))]
    ReadyPattern { agent: String, error: String },
    /// What is wrong with an agent's allow list.
    #[error("{0}")]
    AllowFrom(String),
    /// A shell pane registered without naming who may invoke it.
    #[error("agent {}'s tmux pane runs no --command of Relay's (a --shell, or a pane attached to): each task typed there may run as shell commands, with no approval step, so name who may invoke it with --allow-from (\"allow_from\": [\"operator\"] for you only; an agent's name; * for anyone)", quote(.0))]
    ShellNeedsAllowFrom(String),
    /// What is wrong with the approval policy ([`crate::policy::validate`]).
    #[error("{0}")]
    Policy(String),
}

impl From<BadInput> for BrokerError {
    fn from(e: BadInput) -> BrokerError {
        BrokerError::BadInput(e)
    }
}

/// Why a control could not reach the node serving an agent.
#[derive(Debug, thiserror::Error)]
pub enum NodeUnreachable {
    #[error("node {node:?} did not answer: {error}")]
    NoAnswer {
        node: String,
        error: async_nats::RequestError,
    },
    /// A plain answer (only the node can seal one): a refusal, or not the node's.
    #[error("node {node:?} refused the control: {why} (is its key the one `relay node-key` derives from this broker's bus key?)")]
    Refused { node: String, why: String },
    #[error("node {node:?} answered the control with something unreadable: {error}")]
    Unreadable {
        node: String,
        error: serde_json::Error,
    },
    #[error("node {node:?} is only reachable over NATS, and this broker has none")]
    NoNats { node: String },
}

impl From<NodeUnreachable> for BrokerError {
    fn from(e: NodeUnreachable) -> BrokerError {
        BrokerError::NodeUnreachable(e)
    }
}

/// Client input as an error message quotes it: `"name"`, or when it is longer than
/// [`QUOTE_BYTES`], its start and its size: `"aaaa…"…(102400 bytes)`. An error never
/// echoes a client's 100 KB back to it (or into a log).
/// What to say of a flight id that is not one at all (an agent's name, say): what flight
/// ids look like, and where to find one.
fn flight_id_hint(id: &str) -> &'static str {
    if id.starts_with("flt_") {
        ""
    } else {
        ": flight ids look like flt_... (`relay flight list --agent NAME` lists an agent's flights)"
    }
}

pub fn quote(input: &str) -> String {
    if input.len() <= QUOTE_BYTES {
        return format!("{input:?}");
    }
    format!(
        "{:?}…({} bytes)",
        &input[..floor_char_boundary(input, QUOTE_BYTES)],
        input.len()
    )
}

/// The one rule for cutting text to a size, shared with the flights' fold.
pub use relay_protocol::domain::clip;

/// The largest char boundary of `s` at or below `i` (`str::floor_char_boundary` is not
/// stable yet).
fn floor_char_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_input_is_quoted_whole_and_long_input_by_its_start_and_size() {
        assert_eq!(quote("codex-1"), "\"codex-1\"");
        let long = "a".repeat(100_000);
        assert_eq!(
            quote(&long),
            format!("\"{}\"…(100000 bytes)", "a".repeat(QUOTE_BYTES))
        );
        // Cut at a character boundary, never inside one.
        let wide = "é".repeat(QUOTE_BYTES);
        let q = quote(&wide);
        assert!(
            q.starts_with(&format!("\"{}\"", "é".repeat(QUOTE_BYTES / 2))),
            "{q}"
        );
        assert!(q.ends_with(&format!("…({} bytes)", wide.len())), "{q}");
    }

    #[test]
    fn an_unknown_id_of_100_kb_makes_a_short_error() {
        let e = BrokerError::UnknownAgent("x".repeat(100_000));
        let api = e.to_api();
        assert!(api.message.len() < 200, "{}", api.message);
        assert!(api.message.ends_with("…(100000 bytes)"), "{}", api.message);
    }
}
