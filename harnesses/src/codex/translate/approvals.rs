//! The translator's approvals: the server requests Codex asks the client to answer
//! (commands, file changes, MCP elicitations), surfaced as Relay approvals or answered
//! at once, and the answers written back once a person (or a policy) decided.

use relay_protocol::domain::{ApprovalDecision, ApprovalKind};
use relay_protocol::harness::HarnessEvent;
use serde_json::value::RawValue;
use serde_json::Value;

use super::super::app_server::{self as wire, error_code, server_request, Message, RequestId};
use super::{Action, Translator};
use crate::access::MCP_SERVER;

/// A server request surfaced as an approval and not yet resolved.
#[derive(Debug)]
pub(super) struct Pending {
    /// Its id on the wire.
    pub(super) id: RequestId,
    /// Relay answered it already (Codex has yet to say it is resolved).
    pub(super) answered: bool,
    /// How its answer is written.
    pub(super) answer: AnswerShape,
}

/// How an approval is answered on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AnswerShape {
    /// `{"decision": ...}` (commands, file changes).
    Decision,
    /// `{"action": ...}` (an MCP tool call, asked as an elicitation).
    ToolCall,
}

/// What Relay does with an `mcpServer/elicitation/request`
/// ([`Translator::elicitation`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Elicitation {
    /// A call of a tool of Relay's own server: accepted at once, since the agent's
    /// scoped token bounds what it can do.
    RunRelayTool,
    /// A call of another server's tool: a Relay approval, decided like a command.
    Approval {
        turn_id: String,
        detail: String,
        reason: Option<String>,
    },
    /// A form to fill in or a URL to open, meant for a person Relay cannot show it to
    /// (or a tool call outside a turn): declined, never answered as if filled in.
    Decline { why: String },
}

impl Translator {
    /// The answer to an unanswered approval request, marking it answered: each is
    /// answered once. `None` when there is no such request, or it was answered.
    pub fn answer(&mut self, request_id: &str, decision: ApprovalDecision) -> Option<Message> {
        let pending = self
            .server_requests
            .get_mut(request_id)
            .filter(|p| !p.answered)?;
        pending.answered = true;
        let result = match pending.answer {
            AnswerShape::Decision => serde_json::to_value(wire::ApprovalResponse {
                decision: decision.into(),
            }),
            AnswerShape::ToolCall => {
                serde_json::to_value(wire::McpServerElicitationResponse::tool_call(decision))
            }
        };
        Some(Message::Response(wire::Response {
            id: pending.id.clone(),
            // Plain structs of strings: they always serialise.
            result: result.unwrap_or_default(),
        }))
    }

    /// What to do with an MCP elicitation: see [`Elicitation`]. Only a tool call
    /// approval (`_meta.codex_approval_kind = "mcp_tool_call"`) of the server named
    /// [`MCP_SERVER`], when Relay wired it in, runs unasked.
    pub fn elicitation(&self, p: &wire::McpServerElicitationRequestParams) -> Elicitation {
        if !p.is_tool_call_approval() {
            let what = match p.approval_kind() {
                Some(kind) => format!("{} {kind}", p.mode),
                None => p.mode.clone(),
            };
            return Elicitation::Decline {
                why: format!(
                    "MCP server {} asked for input only a person can give ({what}: {}); \
                     Relay cannot show it, so it declined",
                    p.server_name, p.message
                ),
            };
        }
        if self.relay_mcp && p.server_name == MCP_SERVER {
            return Elicitation::RunRelayTool;
        }
        let Some(turn_id) = p.turn_id.clone() else {
            return Elicitation::Decline {
                why: format!(
                    "MCP server {} tool call outside a turn: no flight to ask about it; declined",
                    p.server_name
                ),
            };
        };
        // `MCP tool <server>.<tool>`, then the arguments it will run with.
        let mut detail = match p.tool_name() {
            Some(tool) => format!("MCP tool {}.{tool}", p.server_name),
            None => format!("MCP server {}: {}", p.server_name, p.message),
        };
        if let Some(params) = p.meta_field("tool_params") {
            detail.push('\n');
            detail.push_str(&serde_json::to_string_pretty(params).unwrap_or_default());
        }
        Elicitation::Approval {
            turn_id,
            detail,
            reason: None,
        }
    }

    pub(super) fn server_request(
        &mut self,
        id: RequestId,
        method: &str,
        params: Option<&RawValue>,
        line: &str,
    ) -> Vec<Action> {
        if method == server_request::MCP_ELICITATION {
            let Some(p) = self.parse::<wire::McpServerElicitationRequestParams>(params, line)
            else {
                return vec![refuse(
                    id,
                    error_code::INVALID_PARAMS,
                    format!("relay could not read the params of {method}"),
                )];
            };
            return self.answer_elicitation(id, &p);
        }
        let parsed = match method {
            server_request::COMMAND_APPROVAL => self
                .parse::<wire::CommandExecutionRequestApprovalParams>(params, line)
                .map(|p| {
                    let (kind, detail) = command_approval_detail(&p);
                    (p.turn_id, kind, detail, p.reason)
                }),
            server_request::FILE_CHANGE_APPROVAL => self
                .parse::<wire::FileChangeRequestApprovalParams>(params, line)
                .map(|p| {
                    let detail = self.file_change_detail(&p);
                    // Wider write access for the session is a grant, not a file change:
                    // a person decides it, never `accept_file_changes`.
                    let kind = match p.grant_root {
                        Some(_) => ApprovalKind::Other,
                        None => ApprovalKind::FileChange,
                    };
                    (p.turn_id, kind, detail, p.reason)
                }),
            other => {
                tracing::warn!(method = other, id = %id, "codex: unsupported server request refused");
                return vec![refuse(
                    id,
                    error_code::METHOD_NOT_FOUND,
                    format!("relay does not handle {other}"),
                )];
            }
        };
        let Some((turn_id, kind, detail, reason)) = parsed else {
            return vec![refuse(
                id,
                error_code::INVALID_PARAMS,
                format!("relay could not read the params of {}", method),
            )];
        };
        self.surface(id, AnswerShape::Decision, turn_id, kind, detail, reason)
    }

    /// An approval request for a person (or a policy): remembered until answered or
    /// resolved, and announced.
    pub(super) fn surface(
        &mut self,
        id: RequestId,
        answer: AnswerShape,
        turn_id: String,
        kind: ApprovalKind,
        detail: String,
        reason: Option<String>,
    ) -> Vec<Action> {
        let request_id = id.to_string();
        let pending = Pending {
            id,
            answered: false,
            answer,
        };
        self.server_requests.insert(request_id.clone(), pending);
        vec![Action::Event(HarnessEvent::ApprovalRequested {
            turn_id,
            request_id,
            kind,
            detail,
            reason,
        })]
    }

    pub(super) fn answer_elicitation(
        &mut self,
        id: RequestId,
        p: &wire::McpServerElicitationRequestParams,
    ) -> Vec<Action> {
        let respond = |id: RequestId, response: wire::McpServerElicitationResponse| {
            Action::Send(Message::Response(wire::Response {
                id,
                result: serde_json::to_value(response).unwrap_or_default(),
            }))
        };
        match self.elicitation(p) {
            Elicitation::RunRelayTool => {
                tracing::debug!(server = %p.server_name, "codex: relay tool call accepted");
                vec![respond(
                    id,
                    wire::McpServerElicitationResponse::accept_tool_call(),
                )]
            }
            Elicitation::Approval {
                turn_id,
                detail,
                reason,
            } => self.surface(
                id,
                AnswerShape::ToolCall,
                turn_id,
                ApprovalKind::Other,
                detail,
                reason,
            ),
            Elicitation::Decline { why } => {
                tracing::warn!(server = %p.server_name, %why, "codex: elicitation declined");
                vec![
                    respond(
                        id,
                        wire::McpServerElicitationResponse::declined(
                            wire::McpElicitationAction::Decline,
                        ),
                    ),
                    Action::Event(HarnessEvent::Warning { message: why }),
                ]
            }
        }
    }

    pub(super) fn file_change_detail(&self, p: &wire::FileChangeRequestApprovalParams) -> String {
        let mut lines: Vec<String> = self
            .file_changes
            .get(&p.item_id)
            .map(|changes| {
                changes
                    .iter()
                    .map(|c| format!("{} {}", c.kind_name(), c.path))
                    .collect()
            })
            .unwrap_or_default();
        if let Some(root) = &p.grant_root {
            lines.push(format!("write access to {root}"));
        }
        if lines.is_empty() {
            lines.push(format!("file change {}", p.item_id));
        }
        lines.join("\n")
    }
}

fn refuse(id: RequestId, code: i64, message: String) -> Action {
    Action::Send(Message::Error(wire::ErrorResponse {
        id,
        error: wire::ErrorObject {
            code,
            message,
            data: None,
        },
    }))
}

fn command_approval_detail(
    p: &wire::CommandExecutionRequestApprovalParams,
) -> (ApprovalKind, String) {
    if let Some(ctx) = &p.network_approval_context {
        let host = ctx.get("host").and_then(Value::as_str).unwrap_or("?");
        return (ApprovalKind::Other, format!("network access to {host}"));
    }
    match (&p.command, p.kind.as_deref()) {
        // Input to a running process, or a command shown rather than run: what a rule
        // names is a command line, so these go to a person.
        (Some(command), Some(kind)) if kind != "command" => {
            (ApprovalKind::Other, format!("{kind}: {command}"))
        }
        // The whole command, as it will run: policies and people decide on that.
        (Some(command), _) => (ApprovalKind::Command, command.clone()),
        (None, _) => (
            ApprovalKind::Other,
            p.reason
                .clone()
                .unwrap_or_else(|| format!("item {}", p.item_id)),
        ),
    }
}
