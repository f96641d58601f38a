//! One `session/prompt`: an invocation of the agent in the session's conversation, its
//! flight followed over SSE ([`ask::follow`], across broker restarts) and told to the
//! editor as `session/update`s ([`Translator`]), its approvals asked of the editor, and
//! its end as the prompt's answer:
//!
//! - completed: `end_turn` (the reply is sent as one chunk first when nothing streamed:
//!   a tmux agent's answer, say);
//! - cancelled, or any end after `session/cancel`: `cancelled`;
//! - failed: a JSON-RPC error (`-32603`) with the flight's error, and the flight's id,
//!   state and error in `data`, so the editor shows it as the failure it is.
//!
//! Approvals: when the flight waits (`waiting`) the pending approvals of the flight are
//! read and each is asked of the editor (`session/request_permission`, options
//! `allow_once` and `reject_once`, the tool call titled by its command with its kind):
//! allow decides `accept`, reject `decline`, a prompt cancelled before the choice
//! `cancel`, each decided by the actor `relay acp` runs as. An editor's error leaves the
//! approval to be decided elsewhere (`relay approval decide`, the dashboard); so does a
//! token that may not decide (an agent's).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use relay_client::Client;
use relay_protocol::acp::{
    method, ContentBlock, ContentChunk, PermissionOption, PermissionOptionKind, PermissionOutcome,
    Plan, PlanEntry, PromptRequest, RequestPermissionRequest, RequestPermissionResponse, RpcError,
    SessionUpdate, StopReason, ToolCall, ToolCallContent, ToolCallStatus, ToolCallUpdate, ToolKind,
};
use relay_protocol::api::{ApprovalsQuery, DecideApproval, Empty};
use relay_protocol::domain::{
    Approval, ApprovalDecision, ApprovalKind, FlightChange, FlightState, FlightUpdate,
    InvokeRequest, ItemKind, ItemPhase,
};
use relay_protocol::methods::call as m;
use serde_json::{json, Value};
use tokio::task::JoinSet;

use super::{broker_error, Answer, Server, Turn};
use crate::commands::ask;
use crate::terminal::errln;

/// The most of a command's output a tool call shows (its last bytes): each output
/// update resends the whole content, as ACP's `tool_call_update` replaces it.
const TOOL_OUTPUT: usize = 64 << 10;

/// Option ids of a permission request.
const ALLOW: &str = "allow_once";
const REJECT: &str = "reject_once";

/// Serves `session/prompt`.
pub(super) async fn prompt(server: &Arc<Server>, req: PromptRequest) -> Answer {
    let client = server.client()?.clone();
    let text = prompt_text(&req.prompt)?;
    let session = req.session_id;
    let conversation = server.begin(&session)?;
    // The session's turn ends with this call, however it ends.
    let _end = EndTurn(server, &session);
    let invoke = InvokeRequest {
        requester: server.actor.clone(),
        conversation,
        ..InvokeRequest::new(server.agent.clone(), text)
    };
    let accepted = ask::invoke(&client, &invoke).await.map_err(broker_error)?;
    let flight = accepted.flight.id;
    if server.running(&session, &flight) {
        // Cancelled while the invocation was on its way.
        interrupt(&client, &flight).await;
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<FlightUpdate>();
    let followed = ask::follow(&client, &flight, move |f| {
        if let ask::Followed::Update(u) = f {
            let _ = tx.send(u.clone());
        }
    });
    tokio::pin!(followed);
    let mut tr = Translator::default();
    let mut asks: JoinSet<()> = JoinSet::new();
    let mut asked = HashSet::new();
    let ended = loop {
        tokio::select! {
            biased;
            Some(u) = rx.recv() => {
                for update in tr.apply(&u.change) {
                    server.update(&session, update);
                }
                if matches!(u.change, FlightChange::State { to: FlightState::Waiting, .. }) {
                    ask_approvals(server, &client, &session, &flight, &mut asked, &mut asks).await;
                }
            }
            // A decision made: another approval may wait (a flight already waiting
            // does not say so again).
            Some(_) = asks.join_next() => {
                ask_approvals(server, &client, &session, &flight, &mut asked, &mut asks).await;
            }
            ended = &mut followed => break ended,
        }
    };
    while let Ok(u) = rx.try_recv() {
        for update in tr.apply(&u.change) {
            server.update(&session, update);
        }
    }
    // The flight ended: a question still open in the editor has no one to answer.
    asks.shutdown().await;
    let f = ended.map_err(|e| {
        RpcError::new(
            RpcError::INTERNAL_ERROR,
            format!("lost track of flight {flight}: {e:#}"),
        )
    })?;
    if server.was_cancelled(&session) || f.state == FlightState::Cancelled {
        return Ok(stop(StopReason::Cancelled));
    }
    match f.state {
        FlightState::Completed => {
            if !tr.streamed {
                if let Some(output) = f.output.as_deref().filter(|o| !o.is_empty()) {
                    server.update(&session, agent_text(output));
                }
            }
            Ok(stop(StopReason::EndTurn))
        }
        state => {
            let error = f.error.clone().unwrap_or_else(|| "no reason given".into());
            let mut e = RpcError::new(
                RpcError::INTERNAL_ERROR,
                format!("flight {} of agent {} {state}: {error}", f.id, f.agent),
            );
            e.data = Some(json!({"flight": f.id, "state": state.as_str(), "error": error}));
            Err(e)
        }
    }
}

fn stop(reason: StopReason) -> Value {
    json!({ "stopReason": reason.as_str() })
}

/// The prompt as one task: its text blocks, and its resource links (which every ACP
/// agent must take) as their URIs; other blocks are not offered in `initialize`.
fn prompt_text(blocks: &[ContentBlock]) -> Result<String, RpcError> {
    let parts: Vec<&str> = blocks
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Text { text } => Some(text.as_str()),
            ContentBlock::ResourceLink { uri, .. } => Some(uri.as_str()),
            _ => None,
        })
        .filter(|t| !t.trim().is_empty())
        .collect();
    if parts.is_empty() {
        return Err(RpcError::new(
            RpcError::INVALID_PARAMS,
            "the prompt has no text (relay acp takes text and resource links)",
        ));
    }
    Ok(parts.join("\n\n"))
}

/// Interrupts `flight`, saying on stderr when it cannot (it may have just ended).
pub(super) async fn interrupt(client: &Client, flight: &str) {
    if let Err(e) = client
        .call::<m::FlightInterrupt>(&[flight], &Empty {})
        .await
    {
        errln!("relay acp: cannot interrupt flight {flight}: {e}");
    }
}

/// Asks the editor about each pending approval of `flight` not asked yet.
async fn ask_approvals(
    server: &Arc<Server>,
    client: &Client,
    session: &str,
    flight: &str,
    asked: &mut HashSet<String>,
    asks: &mut JoinSet<()>,
) {
    let pending = client
        .call::<m::ApprovalList>(
            &[],
            &ApprovalsQuery {
                state: Some("pending".into()),
            },
        )
        .await;
    let pending = match pending {
        Ok(p) => p,
        Err(e) => {
            errln!("relay acp: cannot list the approvals of flight {flight}: {e}");
            return;
        }
    };
    for approval in pending {
        if approval.request.flight != flight || !asked.insert(approval.id.clone()) {
            continue;
        }
        let (server, client, session) = (server.clone(), client.clone(), session.to_string());
        asks.spawn(async move { ask_one(&server, &client, &session, approval).await });
    }
}

/// Asks the editor about one approval and decides it by the answer.
async fn ask_one(server: &Server, client: &Client, session: &str, approval: Approval) {
    let answer = server
        .request(
            method::REQUEST_PERMISSION,
            permission_request(session, &approval),
        )
        .await;
    let decision = match answer.map(serde_json::from_value::<RequestPermissionResponse>) {
        Ok(Ok(r)) => match r.outcome {
            PermissionOutcome::Selected { option_id } if option_id == ALLOW => {
                ApprovalDecision::Accept
            }
            PermissionOutcome::Selected { .. } => ApprovalDecision::Decline,
            PermissionOutcome::Cancelled => ApprovalDecision::Cancel,
        },
        Ok(Err(e)) => {
            errln!(
                "relay acp: the editor's answer about approval {} cannot be read ({e}); it waits for a decision elsewhere",
                approval.id
            );
            return;
        }
        Err(e) => {
            errln!(
                "relay acp: the editor did not decide approval {} ({e}); it waits for a decision elsewhere",
                approval.id
            );
            return;
        }
    };
    let decide = DecideApproval {
        decision,
        decided_by: server.actor.clone(),
    };
    if let Err(e) = client
        .call::<m::ApprovalDecide>(&[&approval.id], &decide)
        .await
    {
        errln!(
            "relay acp: cannot decide approval {} ({}): {e}",
            approval.id,
            decision.as_str()
        );
    }
}

/// The permission request of an approval: the tool call it is about, titled by its
/// command (or change), with the options Relay maps back to a decision.
pub(super) fn permission_request(session: &str, approval: &Approval) -> RequestPermissionRequest {
    let r = &approval.request;
    let kind = match r.kind {
        ApprovalKind::Command => ToolKind::Execute,
        ApprovalKind::FileChange => ToolKind::Edit,
        ApprovalKind::Other => ToolKind::Other,
    };
    let mut raw = json!({ "command": r.detail, "approval": approval.id, "flight": r.flight });
    if let Some(reason) = &r.reason {
        raw["reason"] = json!(reason);
    }
    let shown = match &r.reason {
        Some(reason) => format!("{}\n\n{reason}", r.detail),
        None => r.detail.clone(),
    };
    RequestPermissionRequest {
        session_id: session.to_string(),
        tool_call: ToolCallUpdate {
            tool_call_id: approval.id.clone(),
            title: Some(r.detail.clone()),
            kind: Some(kind),
            status: Some(ToolCallStatus::Pending),
            content: Some(vec![ToolCallContent::Content {
                content: ContentBlock::text(shown),
            }]),
            raw_input: Some(raw),
            ..Default::default()
        },
        options: vec![
            PermissionOption {
                option_id: ALLOW.into(),
                name: "Allow once".into(),
                kind: PermissionOptionKind::AllowOnce,
            },
            PermissionOption {
                option_id: REJECT.into(),
                name: "Reject".into(),
                kind: PermissionOptionKind::RejectOnce,
            },
        ],
    }
}

fn agent_text(text: &str) -> SessionUpdate {
    SessionUpdate::AgentMessageChunk(ContentChunk {
        content: ContentBlock::text(text),
        message_id: None,
        meta: None,
    })
}

/// A flight's updates as ACP session updates.
#[derive(Default)]
pub(super) struct Translator {
    /// Text was streamed (a delta): the final reply need not be sent again.
    pub streamed: bool,
    /// The tool calls shown so far, by item id, with their output (its last
    /// [`TOOL_OUTPUT`] bytes).
    tools: HashMap<String, String>,
}

impl Translator {
    pub fn apply(&mut self, change: &FlightChange) -> Vec<SessionUpdate> {
        match change {
            FlightChange::Delta { text } if !text.is_empty() => {
                self.streamed = true;
                vec![agent_text(text)]
            }
            FlightChange::Item {
                item_id,
                item_kind,
                phase,
                text,
            } => self.item(item_id, item_kind, *phase, text.as_deref()),
            FlightChange::CommandOutput { item_id, text } => {
                let output = self.tools.entry(item_id.clone()).or_default();
                output.push_str(text);
                if output.len() > TOOL_OUTPUT {
                    let mut cut = output.len() - TOOL_OUTPUT;
                    while !output.is_char_boundary(cut) {
                        cut += 1;
                    }
                    output.drain(..cut);
                }
                vec![SessionUpdate::ToolCallUpdate(ToolCallUpdate {
                    tool_call_id: item_id.clone(),
                    status: Some(ToolCallStatus::InProgress),
                    content: Some(vec![text_content(output)]),
                    ..Default::default()
                })]
            }
            FlightChange::Plan { text } => vec![SessionUpdate::Plan(plan(text))],
            // Not shown: a diff (the file change's tool call says what changed), usage
            // (ACP's is the context window's fill), notes, sessions, other states.
            _ => Vec::new(),
        }
    }

    fn item(
        &mut self,
        id: &str,
        kind: &ItemKind,
        phase: ItemPhase,
        text: Option<&str>,
    ) -> Vec<SessionUpdate> {
        let text = text.filter(|t| !t.is_empty());
        let tool_kind = match kind {
            ItemKind::Reasoning => {
                return match (phase, text) {
                    (ItemPhase::Completed, Some(t)) => {
                        vec![SessionUpdate::AgentThoughtChunk(ContentChunk {
                            content: ContentBlock::text(t),
                            message_id: None,
                            meta: None,
                        })]
                    }
                    _ => Vec::new(),
                };
            }
            ItemKind::CommandExecution => ToolKind::Execute,
            ItemKind::FileChange => ToolKind::Edit,
            ItemKind::ToolCall => ToolKind::Other,
            // Messages stream as deltas; a plan comes as its own change; a kind Relay
            // has no name for is not claimed to be a tool.
            _ => return Vec::new(),
        };
        let title = text.unwrap_or(kind.as_str()).to_string();
        let raw_input = (tool_kind == ToolKind::Execute)
            .then(|| text.map(|t| json!({ "command": t })))
            .flatten();
        let known = self.tools.contains_key(id);
        match phase {
            ItemPhase::Started if !known => {
                self.tools.insert(id.to_string(), String::new());
                vec![SessionUpdate::ToolCall(ToolCall {
                    tool_call_id: id.to_string(),
                    title,
                    kind: tool_kind,
                    status: ToolCallStatus::InProgress,
                    content: Vec::new(),
                    locations: Vec::new(),
                    raw_input,
                    raw_output: None,
                    meta: None,
                })]
            }
            ItemPhase::Started => Vec::new(),
            ItemPhase::Completed => {
                let output = self.tools.remove(id);
                let content: Vec<ToolCallContent> = output
                    .as_deref()
                    .filter(|o| !o.is_empty())
                    .map(|o| vec![text_content(o)])
                    .unwrap_or_default();
                let raw_output = output
                    .as_deref()
                    .filter(|o| !o.is_empty())
                    .map(|o| json!({ "output": o }));
                if output.is_none() {
                    // Completed without a start seen: the whole call at once.
                    return vec![SessionUpdate::ToolCall(ToolCall {
                        tool_call_id: id.to_string(),
                        title,
                        kind: tool_kind,
                        status: ToolCallStatus::Completed,
                        content,
                        locations: Vec::new(),
                        raw_input,
                        raw_output,
                        meta: None,
                    })];
                }
                vec![SessionUpdate::ToolCallUpdate(ToolCallUpdate {
                    tool_call_id: id.to_string(),
                    title: text.map(str::to_string),
                    status: Some(ToolCallStatus::Completed),
                    content: (!content.is_empty()).then_some(content),
                    raw_output,
                    ..Default::default()
                })]
            }
        }
    }
}

fn text_content(text: &str) -> ToolCallContent {
    ToolCallContent::Content {
        content: ContentBlock::text(text),
    }
}

/// A plan's text as ACP plan entries: Codex's `[x]`/`[>]`/`[ ]` steps by their marks;
/// a plan without marks, each line as a pending entry.
fn plan(text: &str) -> Plan {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let marked = |l: &str| -> Option<(&'static str, String)> {
        [
            ("[x]", "completed"),
            ("[>]", "in_progress"),
            ("[ ]", "pending"),
        ]
        .into_iter()
        .find_map(|(mark, status)| {
            l.strip_prefix(mark)
                .map(|rest| (status, rest.trim().to_string()))
        })
    };
    let any_marked = lines.iter().any(|l| marked(l).is_some());
    let entries = lines
        .iter()
        .filter_map(|l| match marked(l) {
            Some((status, content)) => Some((status, content)),
            None if !any_marked => Some(("pending", l.to_string())),
            None => None,
        })
        .map(|(status, content)| PlanEntry {
            content,
            priority: "medium".into(),
            status: status.into(),
        })
        .collect();
    Plan { entries }
}

/// Clears the session's turn when the prompt's call ends.
struct EndTurn<'a>(&'a Server, &'a str);

impl Drop for EndTurn<'_> {
    fn drop(&mut self) {
        if let Ok(mut sessions) = self.0.sessions.lock() {
            if let Some(s) = sessions.get_mut(self.1) {
                s.turn = None;
            }
        }
    }
}

impl Server {
    /// Starts a prompt in `session`: the conversation to invoke in; refused for an
    /// unknown session or one whose prompt still runs.
    fn begin(&self, session: &str) -> Result<Option<String>, RpcError> {
        let mut sessions = self
            .sessions
            .lock()
            .map_err(|_| RpcError::new(RpcError::INTERNAL_ERROR, "the session table is lost"))?;
        let Some(s) = sessions.get_mut(session) else {
            return Err(RpcError::new(
                RpcError::INVALID_PARAMS,
                format!(
                    "unknown session {session:?}: open it with session/new or session/load first"
                ),
            ));
        };
        if s.turn.is_some() {
            return Err(RpcError::new(
                RpcError::INVALID_REQUEST,
                format!("a prompt is already running in session {session:?}: wait for its answer or cancel it"),
            ));
        }
        s.turn = Some(Turn::default());
        Ok(s.conversation.clone())
    }

    /// Records the prompt's flight; true when the prompt was cancelled meanwhile.
    fn running(&self, session: &str, flight: &str) -> bool {
        let Ok(mut sessions) = self.sessions.lock() else {
            return false;
        };
        match sessions.get_mut(session).and_then(|s| s.turn.as_mut()) {
            Some(turn) => {
                turn.flight = Some(flight.to_string());
                turn.cancelled
            }
            None => false,
        }
    }

    fn was_cancelled(&self, session: &str) -> bool {
        self.sessions
            .lock()
            .ok()
            .and_then(|s| {
                s.get(session)
                    .and_then(|s| s.turn.as_ref().map(|t| t.cancelled))
            })
            .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::super::to_value;
    use super::*;

    fn item(id: &str, kind: ItemKind, phase: ItemPhase, text: Option<&str>) -> FlightChange {
        FlightChange::Item {
            item_id: id.into(),
            item_kind: kind,
            phase,
            text: text.map(str::to_string),
        }
    }

    fn kinds(updates: &[SessionUpdate]) -> Vec<Value> {
        updates
            .iter()
            .map(|u| to_value(u)["sessionUpdate"].clone())
            .collect()
    }

    #[test]
    fn a_flight_reads_as_chunks_thoughts_and_tool_calls() {
        let mut tr = Translator::default();
        let mut all = Vec::new();
        for change in [
            item("r", ItemKind::Reasoning, ItemPhase::Started, None),
            item(
                "r",
                ItemKind::Reasoning,
                ItemPhase::Completed,
                Some("think"),
            ),
            item(
                "c",
                ItemKind::CommandExecution,
                ItemPhase::Started,
                Some("ls"),
            ),
            FlightChange::CommandOutput {
                item_id: "c".into(),
                text: "a\n".into(),
            },
            FlightChange::CommandOutput {
                item_id: "c".into(),
                text: "b\n".into(),
            },
            item(
                "c",
                ItemKind::CommandExecution,
                ItemPhase::Completed,
                Some("ls"),
            ),
            item("m", ItemKind::AgentMessage, ItemPhase::Started, None),
            FlightChange::Delta { text: "Hi ".into() },
            FlightChange::Delta {
                text: "there".into(),
            },
            item(
                "m",
                ItemKind::AgentMessage,
                ItemPhase::Completed,
                Some("Hi there"),
            ),
            FlightChange::Usage {
                input_tokens: 1,
                output_tokens: 2,
            },
        ] {
            all.extend(tr.apply(&change));
        }
        assert_eq!(
            kinds(&all),
            vec![
                "agent_thought_chunk",
                "tool_call",
                "tool_call_update",
                "tool_call_update",
                "tool_call_update",
                "agent_message_chunk",
                "agent_message_chunk"
            ]
        );
        assert!(tr.streamed);
        let call = to_value(&all[1]);
        assert_eq!(call["kind"], "execute");
        assert_eq!(call["status"], "in_progress");
        assert_eq!(call["rawInput"]["command"], "ls");
        // The output so far, whole, each time; then the end with all of it.
        assert_eq!(to_value(&all[3])["content"][0]["content"]["text"], "a\nb\n");
        let done = to_value(&all[4]);
        assert_eq!(done["status"], "completed");
        assert_eq!(done["rawOutput"]["output"], "a\nb\n");
        assert_eq!(to_value(&all[6])["content"]["text"], "there");
    }

    #[test]
    fn a_tool_completed_unseen_is_shown_whole_and_output_is_kept_to_its_tail() {
        let mut tr = Translator::default();
        let u = tr.apply(&item(
            "f",
            ItemKind::FileChange,
            ItemPhase::Completed,
            Some("add a.rs"),
        ));
        let v = to_value(&u[0]);
        assert_eq!(
            (&v["sessionUpdate"], &v["kind"], &v["status"], &v["title"]),
            (
                &json!("tool_call"),
                &json!("edit"),
                &json!("completed"),
                &json!("add a.rs")
            )
        );
        tr.apply(&item(
            "c",
            ItemKind::CommandExecution,
            ItemPhase::Started,
            Some("yes"),
        ));
        let big = "é".repeat(TOOL_OUTPUT);
        let u = tr.apply(&FlightChange::CommandOutput {
            item_id: "c".into(),
            text: big,
        });
        let shown = to_value(&u[0])["content"][0]["content"]["text"]
            .as_str()
            .unwrap()
            .len();
        assert!(shown <= TOOL_OUTPUT && shown > TOOL_OUTPUT - 4, "{shown}");
        // Unknown kinds are no tool calls.
        assert!(tr
            .apply(&item(
                "x",
                ItemKind::Other("imageView".into()),
                ItemPhase::Started,
                None
            ))
            .is_empty());
    }

    #[test]
    fn plans_read_by_their_marks() {
        let p = to_value(plan("Why\n[x] one\n[>] two\n[ ] three"));
        assert_eq!(
            p["entries"],
            json!([
                {"content": "one", "priority": "medium", "status": "completed"},
                {"content": "two", "priority": "medium", "status": "in_progress"},
                {"content": "three", "priority": "medium", "status": "pending"},
            ])
        );
        let p = to_value(plan("first\n\nsecond"));
        assert_eq!(p["entries"][1]["content"], "second");
        assert_eq!(p["entries"][1]["status"], "pending");
    }

    #[test]
    fn a_prompt_takes_text_and_resource_links_and_nothing_else_is_no_prompt() {
        let blocks: Vec<ContentBlock> = serde_json::from_value(json!([
            {"type": "text", "text": "look at"},
            {"type": "resource_link", "uri": "file:///a.rs", "name": "a.rs"},
            {"type": "image", "data": "", "mimeType": "image/png"}
        ]))
        .unwrap();
        assert_eq!(prompt_text(&blocks).unwrap(), "look at\n\nfile:///a.rs");
        let e = prompt_text(&blocks[2..]).unwrap_err();
        assert_eq!(e.code, RpcError::INVALID_PARAMS);
    }

    #[test]
    fn a_permission_request_names_the_command_and_offers_once_only() {
        let approval: Approval = serde_json::from_value(json!({
            "id": "apr-1", "agent": "cx", "flight": "flt-1", "kind": "command",
            "detail": "touch x", "reason": "the test asks", "harness_request_id": "0",
            "state": "pending", "created_at": 1
        }))
        .unwrap();
        let r = to_value(permission_request("s", &approval));
        assert_eq!(r["toolCall"]["title"], "touch x");
        assert_eq!(r["toolCall"]["kind"], "execute");
        assert_eq!(r["toolCall"]["rawInput"]["command"], "touch x");
        let kinds: Vec<&Value> = r["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| &o["kind"])
            .collect();
        assert_eq!(kinds, vec!["allow_once", "reject_once"]);
    }
}
