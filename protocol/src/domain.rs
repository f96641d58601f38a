//! The domain: agents, conversations, messages, invocations, flights, deliveries,
//! bindings and approvals, in their serde JSON forms (the CLI, HTTP and sled use these).
//!
//! Timestamps are milliseconds since the Unix epoch. Ids are opaque strings.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::names::wire_enum;

wire_enum! {
    /// Which adapter drives an agent. Also the transport of its endpoint.
    pub enum Harness("harness") {
        CodexAppServer = "codex_app_server",
        ClaudeStreamJson = "claude_stream_json",
        PiRpc = "pi_rpc",
        Tmux = "tmux",
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
        Busy = "busy",
        /// The session died and has not been restarted.
        Failed = "failed",
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
}

/// What a secret variable's value is shown as, everywhere.
pub const SECRET_SHOWN: &str = "***";

/// Secret environment variables, name -> value. Never printed by `Debug`.
#[derive(Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secrets(pub BTreeMap<String, String>);

impl Secrets {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set()
            .entries(self.0.keys().map(|k| format!("{k}={SECRET_SHOWN}")))
            .finish()
    }
}

/// Whether a variable's name says it holds a secret (`OPENAI_API_KEY`, `GH_TOKEN`,
/// `DB_PASSWORD`...): such `--env` values are kept as secrets without being asked.
pub fn looks_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    [
        "KEY",
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "PASS",
        "CREDENTIAL",
        "AUTH",
        "COOKIE",
        "SESSION",
        "PRIVATE",
        "SIGNATURE",
    ]
    .iter()
    .any(|w| upper.contains(w))
        || ["PWD", "DSN", "PAT", "CRED"]
            .iter()
            .any(|w| upper.ends_with(w) || upper.contains(&format!("{w}_")))
}

/// Whether a variable's value says it holds a secret: a URL with credentials in it
/// (`postgres://user:password@host/db`).
pub fn looks_secret_value(value: &str) -> bool {
    value
        .split_once("://")
        .and_then(|(_, rest)| rest.split(['/', '?', '#']).next())
        .is_some_and(|authority| authority.contains('@'))
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
        }
    }
}

/// A registered agent: its spec plus what Relay knows of its session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Agent {
    #[serde(flatten)]
    pub spec: AgentSpec,
    pub state: AgentState,
    /// The harness's persistent thread/session id (Codex thread id, Claude session id...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<Endpoint>,
    pub created_at: u64,
    pub updated_at: u64,
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

wire_enum! {
    pub enum ConversationKind("conversation kind") {
        Channel = "channel",
        Direct = "direct",
        Group = "group",
        Thread = "thread",
        System = "system",
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConversationSpec {
    pub id: String,
    pub kind: ConversationKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub participants: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conversation {
    #[serde(flatten)]
    pub spec: ConversationSpec,
    pub created_at: u64,
    /// Number of messages posted so far; also the next message's index.
    pub message_count: u64,
}

/// The conversation every broker starts with; `relay send` posts here by default.
pub const DEFAULT_CONVERSATION: &str = "channel.shared";

wire_enum! {
    /// `agent` is a conversational message from any actor (person or agent); the others
    /// are machine-made.
    #[derive(Default)]
    pub enum MessageClass("message class") {
        #[default]
        Agent = "agent",
        Status = "status",
        System = "system",
        Log = "log",
        Artifact = "artifact",
    }
}

/// Links from a message to the work it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MessageMeta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flight: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harness: Option<Harness>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
}

impl MessageMeta {
    pub fn is_empty(&self) -> bool {
        self == &MessageMeta::default()
    }
}

/// What a client sends to post a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PostMessage {
    pub conversation: String,
    pub author: String,
    pub body: String,
    #[serde(default)]
    pub class: MessageClass,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    #[serde(default, skip_serializing_if = "MessageMeta::is_empty")]
    pub meta: MessageMeta,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub id: String,
    pub conversation: String,
    /// Position in its conversation, from 0.
    pub index: u64,
    pub author: String,
    pub class: MessageClass,
    pub body: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mentions: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    #[serde(default, skip_serializing_if = "MessageMeta::is_empty")]
    pub meta: MessageMeta,
    pub created_at: u64,
}

/// `@name` tokens in a message body, in order of first appearance, without duplicates.
/// A name is ASCII letters, digits, `-`, `_` and `.` (a trailing `.` is punctuation).
pub fn parse_mentions(body: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let bytes = body.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let at_word_start = i == 0 || !is_name_byte(bytes[i - 1]);
        if bytes[i] == b'@' && at_word_start {
            let start = i + 1;
            let mut end = start;
            while end < bytes.len() && is_name_byte(bytes[end]) {
                end += 1;
            }
            let name = body[start..end].trim_end_matches('.');
            if !name.is_empty() && !out.iter().any(|n| n == name) {
                out.push(name.to_string());
            }
            i = end.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')
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

/// Cuts `text` to at most `max` bytes, at a char boundary; `true` if it was cut.
pub fn truncate_bytes(text: &mut String, max: usize) -> bool {
    if text.len() <= max {
        return false;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    true
}

/// `true` when `id` is a valid conversation id: 1..=200 bytes of dot-separated tokens,
/// each one or more of `[A-Za-z0-9_-]` (`channel.shared`, `direct.operator.codex-1`).
/// Ids are the tail of the conversation's NATS subject, so each token is a subject token.
pub fn valid_conversation_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 200
        && id.split('.').all(|token| {
            !token.is_empty()
                && token
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// `name` as one conversation-id token: every byte outside `[A-Za-z0-9_-]` becomes `_`
/// (an actor named `ci bot` talks to agents in `direct.ci_bot.<agent>`).
pub fn id_token(name: &str) -> String {
    let token: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if token.is_empty() {
        "_".to_string()
    } else {
        token
    }
}

wire_enum! {
    #[derive(Default)]
    pub enum Action("action") {
        /// Answer a question; read-only work.
        #[default]
        Consult = "consult",
        /// Do the work.
        Execute = "execute",
    }
}

/// What a client sends to invoke an agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvokeRequest {
    pub target: String,
    pub task: String,
    #[serde(default = "default_requester")]
    pub requester: String,
    #[serde(default)]
    pub action: Action,
    /// Conversation the request and reply are posted in; defaults to a direct one
    /// between the requester and the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<String>,
    /// The flight this invocation was made from (agent-to-agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_flight: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

fn default_requester() -> String {
    "operator".to_string()
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Invocation {
    pub id: String,
    pub requester: String,
    pub target: String,
    pub action: Action,
    pub task: String,
    pub conversation: String,
    /// The message that carries the task in the conversation.
    pub request_message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_flight: Option<String>,
    /// 0 for a root invocation, parent's depth + 1 for agent-to-agent.
    pub depth: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    pub created_at: u64,
}

wire_enum! {
    /// The tracked execution of one invocation.
    pub enum FlightState("flight state") {
        Queued = "queued",
        Waking = "waking",
        Running = "running",
        Waiting = "waiting",
        Completed = "completed",
        Failed = "failed",
        Cancelled = "cancelled",
    }
}

impl FlightState {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            FlightState::Completed | FlightState::Failed | FlightState::Cancelled
        )
    }

    /// The state machine: `queued -> waking -> running <-> waiting -> completed | failed |
    /// cancelled`. Any live state may fail or be cancelled; a running or waiting flight
    /// completes; waking may be skipped when the session is already up. Staying in the
    /// same state is not a transition (see [`Flight`] for how duplicates are skipped).
    pub fn can_transition(self, to: FlightState) -> bool {
        use FlightState::*;
        if self.is_terminal() || self == to {
            return false;
        }
        match to {
            Queued => false,
            Waking => self == Queued,
            Running => matches!(self, Queued | Waking | Waiting),
            Waiting => self == Running,
            // A turn may end while an approval is still open (codex settled it itself).
            Completed => matches!(self, Running | Waiting),
            Failed | Cancelled => true,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Flight {
    pub id: String,
    pub invocation: String,
    pub agent: String,
    pub state: FlightState,
    /// Live, one-line progress: the tail of the streamed text or the current item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// The final assistant text (`null` until the flight completes: the field is always
    /// there, so scripts can read `.output` and `.error` without guarding).
    #[serde(default)]
    pub output: Option<String>,
    /// Why the flight failed or was cancelled (`null` otherwise).
    #[serde(default)]
    pub error: Option<String>,
    /// Sequence number of the last update of this flight (1-based; 0 = none yet).
    pub update_seq: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_flight: Option<String>,
    pub conversation: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_message: Option<String>,
    pub created_at: u64,
    pub updated_at: u64,
}

impl Flight {
    /// The flight of a new invocation: queued, for its target, in its conversation.
    pub fn queued(id: impl Into<String>, invocation: &Invocation) -> Flight {
        Flight {
            id: id.into(),
            invocation: invocation.id.clone(),
            agent: invocation.target.clone(),
            state: FlightState::Queued,
            summary: None,
            output: None,
            error: None,
            update_seq: 0,
            thread_id: None,
            turn_id: None,
            parent_flight: invocation.parent_flight.clone(),
            conversation: invocation.conversation.clone(),
            reply_message: None,
            created_at: invocation.created_at,
            updated_at: invocation.created_at,
        }
    }
}

/// One change to a flight, as a client reports it to the broker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FlightChange {
    /// Move to a new state. `output` is the final text on completion; `reason` says why
    /// on failure or cancellation.
    State {
        to: FlightState,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<String>,
    },
    /// A piece of streamed assistant text.
    Delta {
        text: String,
    },
    /// A harness item started or completed (command, file change, reasoning...).
    Item {
        item_id: String,
        item_kind: ItemKind,
        phase: ItemPhase,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
    },
    /// Output of a running command.
    CommandOutput {
        item_id: String,
        text: String,
    },
    /// The harness's plan or diff changed.
    Plan {
        text: String,
    },
    Diff {
        text: String,
    },
    Usage {
        input_tokens: u64,
        output_tokens: u64,
    },
    /// The session/turn ids the harness assigned.
    Session {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        thread_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        turn_id: Option<String>,
    },
    /// A note from the runtime (thread lost and restarted, session respawned...).
    Note {
        text: String,
    },
}

/// The kind of a harness item (one step of a turn). A kind Relay has no name for keeps
/// the harness's own name ([`ItemKind::Other`]).
///
/// On every wire (JSON, sled, the protobuf `Item.item_kind`) it is its name as a plain
/// string, [`ItemKind::as_str`]: `"command_execution"`, or the harness's own name. Reading
/// a name back gives the named kind, so `Other` never holds one of the names above.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ItemKind {
    AgentMessage,
    Reasoning,
    CommandExecution,
    FileChange,
    ToolCall,
    UserMessage,
    Plan,
    Other(String),
}

impl ItemKind {
    const NAMED: [ItemKind; 7] = [
        ItemKind::AgentMessage,
        ItemKind::Reasoning,
        ItemKind::CommandExecution,
        ItemKind::FileChange,
        ItemKind::ToolCall,
        ItemKind::UserMessage,
        ItemKind::Plan,
    ];

    pub fn as_str(&self) -> &str {
        match self {
            ItemKind::AgentMessage => "agent_message",
            ItemKind::Reasoning => "reasoning",
            ItemKind::CommandExecution => "command_execution",
            ItemKind::FileChange => "file_change",
            ItemKind::ToolCall => "tool_call",
            ItemKind::UserMessage => "user_message",
            ItemKind::Plan => "plan",
            ItemKind::Other(name) => name,
        }
    }

    /// The kind a name stands for: one of the named kinds, else [`ItemKind::Other`].
    pub fn from_name(name: &str) -> ItemKind {
        Self::NAMED
            .into_iter()
            .find(|k| k.as_str() == name)
            .unwrap_or_else(|| ItemKind::Other(name.to_string()))
    }
}

impl std::fmt::Display for ItemKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ItemKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ItemKind {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Ok(ItemKind::from_name(&name))
    }
}

wire_enum! {
    pub enum ItemPhase("item phase") {
        Started = "started",
        Completed = "completed",
    }
}

/// A persisted flight update: the change, its per-flight sequence number and time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlightUpdate {
    pub flight: String,
    pub agent: String,
    pub seq: u64,
    pub at: u64,
    #[serde(flatten)]
    pub change: FlightChange,
}

wire_enum! {
    /// Why a message is delivered to an agent.
    pub enum DeliveryReason("delivery reason") {
        Mention = "mention",
        DirectMessage = "direct_message",
        Invocation = "invocation",
    }
}

wire_enum! {
    pub enum DeliveryState("delivery state") {
        Pending = "pending",
        Delivered = "delivered",
        Failed = "failed",
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryAttempt {
    pub at: u64,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// Deterministic: see [`delivery_id`].
    pub id: String,
    pub message: String,
    pub target: String,
    pub reason: DeliveryReason,
    pub transport: Harness,
    pub state: DeliveryState,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<DeliveryAttempt>,
}

/// The same message, target, reason and transport always give the same id, so planning
/// twice (a retry, a replay) never makes a second delivery.
pub fn delivery_id(
    message: &str,
    target: &str,
    reason: DeliveryReason,
    transport: Harness,
) -> String {
    // FNV-1a 64: stable across builds and platforms, unlike std's RandomState hashers.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [message, target, reason.as_str(), transport.as_str()] {
        for b in part.bytes().chain(std::iter::once(0u8)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("dlv_{h:016x}")
}

/// A conversation mirrored to an outside channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    pub id: String,
    pub conversation: String,
    /// For example `nats`.
    pub kind: String,
    /// For example the NATS subject.
    pub target: String,
    pub created_at: u64,
}

wire_enum! {
    pub enum ApprovalKind("approval kind") {
        Command = "command",
        FileChange = "file_change",
        Other = "other",
    }
}

wire_enum! {
    /// On the command line Codex's own spelling `acceptForSession` is taken too.
    pub enum ApprovalDecision("decision") {
        Accept = "accept",
        AcceptForSession = "accept_for_session" | "acceptForSession",
        Decline = "decline",
        Cancel = "cancel",
    }
}

wire_enum! {
    pub enum ApprovalState("approval state") {
        Pending = "pending",
        Decided = "decided",
        /// Its turn ended (or its session died) before anyone decided.
        Expired = "expired",
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    pub flight: String,
    pub kind: ApprovalKind,
    /// The command line, or a description of the change.
    pub detail: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The harness's own id for the request (JSON-RPC id, request_id...).
    pub harness_request_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    pub id: String,
    pub agent: String,
    #[serde(flatten)]
    pub request: ApprovalRequest,
    pub state: ApprovalState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<ApprovalDecision>,
    /// Who or what decided: `operator`, `policy:auto-accept:<rule>`, an agent name...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    pub created_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_variables_are_found_by_name_or_by_value_and_moved_apart() {
        for name in [
            "OPENAI_API_KEY",
            "GH_TOKEN",
            "DB_PASSWORD",
            "MYSQL_PWD",
            "SENTRY_DSN",
            "GITHUB_PAT",
            "AWS_SECRET_ACCESS_KEY",
        ] {
            assert!(looks_secret(name), "{name}");
        }
        for name in ["PATH", "RUST_LOG", "LANG", "CODEX_HOME", "PATH_INFO"] {
            assert!(!looks_secret(name), "{name}");
        }
        assert!(looks_secret_value("postgres://u:pw@db:5432/x"));
        assert!(!looks_secret_value("http://127.0.0.1:9/x@y"));
        let mut spec = AgentSpec::new("a", Harness::CodexAppServer, "/w");
        spec.env.insert("OPENAI_API_KEY".into(), "sk-1".into());
        spec.env
            .insert("DATABASE_URL".into(), "postgres://u:pw@h/db".into());
        spec.env.insert("PLAIN".into(), "x".into());
        spec.secrets.0.insert("GIVEN".into(), "g".into());
        spec.move_secrets();
        spec.move_secrets();
        assert_eq!(spec.env["OPENAI_API_KEY"], SECRET_SHOWN);
        assert_eq!(spec.env["DATABASE_URL"], SECRET_SHOWN);
        assert_eq!(spec.env["GIVEN"], SECRET_SHOWN);
        assert_eq!(spec.env["PLAIN"], "x");
        assert_eq!(spec.secrets.0["OPENAI_API_KEY"], "sk-1");
        assert_eq!(spec.secrets.0["DATABASE_URL"], "postgres://u:pw@h/db");
        assert!(
            !format!("{spec:?}").contains("sk-1"),
            "Debug shows no value"
        );
    }

    #[test]
    fn mentions_are_parsed_in_order_without_duplicates() {
        assert_eq!(
            parse_mentions("@codex-1 and @pi_2, ask @codex-1 again. mail a@b.c @x."),
            vec!["codex-1", "pi_2", "x"]
        );
        assert_eq!(parse_mentions("no mentions @ here"), Vec::<String>::new());
    }

    #[test]
    fn delivery_ids_are_deterministic_and_distinct() {
        let a = delivery_id(
            "m1",
            "codex",
            DeliveryReason::Mention,
            Harness::CodexAppServer,
        );
        let b = delivery_id(
            "m1",
            "codex",
            DeliveryReason::Mention,
            Harness::CodexAppServer,
        );
        let c = delivery_id(
            "m1",
            "codex",
            DeliveryReason::Invocation,
            Harness::CodexAppServer,
        );
        let d = delivery_id(
            "m1c",
            "odex",
            DeliveryReason::Mention,
            Harness::CodexAppServer,
        );
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
    }

    #[test]
    fn truncation_keeps_whole_chars() {
        let mut s = "héllo".to_string();
        assert!(truncate_bytes(&mut s, 2));
        assert_eq!(s, "h");
        let mut s = "abc".to_string();
        assert!(!truncate_bytes(&mut s, 3));
        assert_eq!(s, "abc");
    }

    #[test]
    fn conversation_ids_are_subject_tokens() {
        for ok in ["channel.shared", "direct.operator.codex-1", "a", "x_y-z.1"] {
            assert!(valid_conversation_id(ok), "{ok}");
        }
        let long = "a".repeat(201);
        for bad in [
            "",
            "a..b",
            ".a",
            "a.",
            "a b",
            "a*",
            "a.>",
            "a\0b",
            "é",
            long.as_str(),
        ] {
            assert!(!valid_conversation_id(bad), "{bad:?}");
        }
        assert_eq!(id_token("ci bot.v2"), "ci_bot_v2");
        assert_eq!(id_token(""), "_");
        assert!(valid_conversation_id(&format!(
            "direct.{}.x",
            id_token("wé ird*")
        )));
    }

    #[test]
    fn agent_names_fit_in_subjects() {
        assert!(valid_agent_name("codex-1"));
        assert!(valid_agent_name("Pi_2"));
        for bad in ["", "-x", "a b", "a.b", "a*", "a>", &"x".repeat(65)] {
            assert!(!valid_agent_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn item_kinds_are_plain_names_on_the_wire() {
        let item = |kind: ItemKind| FlightChange::Item {
            item_id: "i".into(),
            item_kind: kind,
            phase: ItemPhase::Started,
            text: None,
        };
        for (kind, name) in [
            (ItemKind::AgentMessage, "agent_message"),
            (ItemKind::CommandExecution, "command_execution"),
            (ItemKind::Other("imageView".into()), "imageView"),
        ] {
            let json = serde_json::to_value(item(kind.clone())).unwrap();
            assert_eq!(
                json,
                serde_json::json!({
                    "kind": "item", "item_id": "i", "item_kind": name, "phase": "started"
                })
            );
            assert_eq!(
                serde_json::from_value::<FlightChange>(json).unwrap(),
                item(kind)
            );
        }
        for kind in ItemKind::NAMED {
            assert_eq!(ItemKind::from_name(kind.as_str()), kind);
        }
    }

    #[test]
    fn agent_json_is_flat() {
        let agent = Agent {
            spec: AgentSpec {
                name: "codex-1".into(),
                harness: Harness::CodexAppServer,
                cwd: "/tmp".into(),
                model: None,
                node: None,
                wake: WakePolicy::OnDemand,
                command: None,
                args: vec![],
                env: BTreeMap::new(),
                secrets: Default::default(),
                approval_policy: ApprovalPolicy::default(),
            },
            state: AgentState::Idle,
            thread_id: Some("t1".into()),
            endpoint: None,
            created_at: 1,
            updated_at: 2,
        };
        let v = serde_json::to_value(&agent).unwrap();
        assert_eq!(v["name"], "codex-1");
        assert_eq!(v["harness"], "codex_app_server");
        assert_eq!(v["thread_id"], "t1");
        let back: Agent = serde_json::from_value(v).unwrap();
        assert_eq!(back, agent);
    }
}
