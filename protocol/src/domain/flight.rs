//! Invocations and the flights that track them: states, changes and updates; the
//! flight after an update is [`fold`]'s.

use serde::{Deserialize, Serialize};

mod fold;
pub use fold::{clip, streamed_bytes, summarize, tail, NOTE_BYTES, SUMMARY_CHARS};

use crate::names::wire_enum;

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
    crate::domain::decider::OPERATOR.to_string()
}

impl InvokeRequest {
    /// The operator asks `target` to do `task`: a root consult in a direct conversation.
    pub fn new(target: impl Into<String>, task: impl Into<String>) -> InvokeRequest {
        InvokeRequest {
            target: target.into(),
            task: task.into(),
            requester: default_requester(),
            action: Action::default(),
            conversation: None,
            parent_flight: None,
            timeout_ms: None,
        }
    }
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
    /// Whether the flight's turn is under way (`running`, or `waiting` for an answer):
    /// what makes its agent `busy` ([`AgentState::shown`](super::AgentState::shown)).
    pub fn runs_turn(self) -> bool {
        matches!(self, FlightState::Running | FlightState::Waiting)
    }

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
    /// The last update was streamed text: the summary is its tail and the next delta
    /// extends it ([`Flight::apply`]). Never set on an ended flight.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub streaming: bool,
    /// The final assistant text (`null` until the flight completes: the field is always
    /// there, so scripts can read `.output` and `.error` without guarding).
    #[serde(default)]
    pub output: Option<super::SharedStr>,
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
    /// The latest note of the flight ([`FlightChange::Note`]: the harness reconnecting,
    /// rate limited, its model unreachable; a steer; a restarted session), with its time.
    /// Kept after the flight ends: a failed flight's last note often says why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<Note>,
    /// Bytes the flight has streamed so far (text, command output, items, plans, diffs,
    /// notes): what the broker's per-flight output cap counts.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub output_bytes: u64,
    /// What the flight changed in its agent's worktree, committed on the agent's branch
    /// (an agent with a worktree; without its patch: see [`FlightChange::Commit`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<super::FlightCommit>,
    /// Tokens and cost of the flight's turn, as last reported ([`FlightChange::Usage`]),
    /// its cost filled in from the price table where the harness gave none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<super::TokenUsage>,
    /// The root of the flight's agent-to-agent tree (`None`: it is a root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_flight: Option<String>,
    pub created_at: u64,
    pub updated_at: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A note and when it came (ms since the UNIX epoch). On an agent, also the flight it
/// came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Note {
    pub text: String,
    pub at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flight: Option<String>,
}

impl Flight {
    /// A copy of it without its output: what keeps a long answer elsewhere needs the
    /// rest, and copying the answer only to drop it cost a 32 MB copy (every field is
    /// named, so a new one is a decision here).
    pub fn without_output(&self) -> Flight {
        let Flight {
            id,
            invocation,
            agent,
            state,
            summary,
            streaming,
            output: _,
            error,
            update_seq,
            thread_id,
            turn_id,
            parent_flight,
            conversation,
            reply_message,
            note,
            output_bytes,
            commit,
            usage,
            root_flight,
            created_at,
            updated_at,
        } = self;
        Flight {
            id: id.clone(),
            invocation: invocation.clone(),
            agent: agent.clone(),
            state: *state,
            summary: summary.clone(),
            streaming: *streaming,
            output: None,
            error: error.clone(),
            update_seq: *update_seq,
            thread_id: thread_id.clone(),
            turn_id: turn_id.clone(),
            parent_flight: parent_flight.clone(),
            conversation: conversation.clone(),
            reply_message: reply_message.clone(),
            note: note.clone(),
            output_bytes: *output_bytes,
            commit: commit.clone(),
            usage: usage.clone(),
            root_flight: root_flight.clone(),
            created_at: *created_at,
            updated_at: *updated_at,
        }
    }

    /// The flight of a new invocation: queued, for its target, in its conversation.
    pub fn queued(id: impl Into<String>, invocation: &Invocation) -> Flight {
        Flight {
            id: id.into(),
            invocation: invocation.id.clone(),
            agent: invocation.target.clone(),
            state: FlightState::Queued,
            summary: None,
            streaming: false,
            output: None,
            error: None,
            update_seq: 0,
            thread_id: None,
            turn_id: None,
            parent_flight: invocation.parent_flight.clone(),
            conversation: invocation.conversation.clone(),
            reply_message: None,
            note: None,
            output_bytes: 0,
            commit: None,
            usage: None,
            root_flight: None,
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
        output: Option<super::SharedStr>,
    },
    /// A piece of streamed assistant text.
    Delta {
        text: String,
    },
    /// A harness item started or completed (command, file change, reasoning...).
    /// `text`: a command's command line, an agent message's text... `exit_code`: a
    /// completed command's exit status, where its harness reports one: Codex (its
    /// `commandExecution`'s `exitCode`, every command that ran), Claude Code (a failed
    /// Bash result's `Exit code N`; a success says no status: `None`); Pi and ACP
    /// agents: `None` (not read yet). A command's output is in
    /// [`FlightChange::CommandOutput`] (Codex), or in the item's `text` after the
    /// command line (Claude Code, ACP agents).
    Item {
        item_id: String,
        item_kind: ItemKind,
        phase: ItemPhase,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<super::SharedStr>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
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
    /// The turn's usage so far (a running total, replacing the last): the
    /// [`super::TokenUsage`] fields beside `kind` (`input_tokens`, `output_tokens` and
    /// the optional others). The harness never sets `cost_source`; the broker does.
    Usage(super::TokenUsage),
    /// The session/turn ids the harness assigned.
    Session {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        thread_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        turn_id: Option<String>,
    },
    /// A note from the harness (Codex's `error {willRetry}` "Reconnecting...", its
    /// warnings, a rate limit) or the runtime (a steer, a thread lost and restarted, a
    /// session respawned...). The flight keeps the latest as [`Flight::note`], its agent
    /// as [`crate::domain::Agent::note`]. `by`: who asked for what it records, where a
    /// client did (a steer, an interrupt): `NAME@dashboard` for a dashboard login,
    /// `operator` for the operator's token, the agent's name for an agent's token, `nats`
    /// for the bus; `None` for what Relay or the harness noted on its own.
    Note {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
    },
    /// The flight's changes, committed on its agent's branch when its turn ended (or,
    /// when that could not be done then, later: after a restart, or with the next turn):
    /// also after the flight ended. Carries the patch; the flight keeps the rest
    /// ([`Flight::commit`]).
    Commit {
        commit: Box<super::FlightCommit>,
    },
    /// The flight's changes were reverted by a commit on its agent's branch
    /// (`relay revert`); also after the flight ended.
    Reverted {
        revert: super::Revert,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A flight without its output is the flight with its output `None`, every other
    /// field kept.
    #[test]
    fn a_flight_without_its_output_keeps_every_other_field() {
        let json = serde_json::json!({
            "id": "flt_1", "invocation": "inv_1", "agent": "a", "state": "completed",
            "summary": "s", "streaming": true, "output": "the answer", "error": "e",
            "update_seq": 7, "thread_id": "t", "turn_id": "u", "parent_flight": "flt_0",
            "conversation": "c", "reply_message": "m", "note": {"text": "n", "at": 3},
            "output_bytes": 10, "usage": {"input_tokens": 5, "output_tokens": 6},
            "root_flight": "flt_0", "created_at": 1, "updated_at": 2
        });
        let flight: Flight = serde_json::from_value(json).unwrap();
        let mut want = flight.clone();
        want.output = None;
        assert_eq!(flight.without_output(), want);
        assert_ne!(flight.without_output(), flight);
    }

    #[test]
    fn item_kinds_are_plain_names_on_the_wire() {
        let item = |kind: ItemKind| FlightChange::Item {
            item_id: "i".into(),
            item_kind: kind,
            phase: ItemPhase::Started,
            text: None,
            exit_code: None,
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
}
