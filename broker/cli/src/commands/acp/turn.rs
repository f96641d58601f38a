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
//! token that may not decide (an agent's), found out by the first refusal, after which
//! no approval is asked of the editor.
//! The permission's tool call (its id the approval's) then ends: `completed` when the
//! command was allowed, `failed` when not; one still open when the flight ends (decided
//! elsewhere, or never) ends by the approval's decision, which also closes the editor's
//! dialog.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use relay_protocol::acp::{
    method, ContentBlock, PermissionOption, PermissionOptionKind, PermissionOutcome, PromptRequest,
    RequestPermissionRequest, RequestPermissionResponse, RpcError, SessionUpdate, StopReason,
    ToolCallContent, ToolCallStatus, ToolCallUpdate, ToolKind,
};
use relay_protocol::api::{ApprovalsQuery, DecideApproval, Empty, ErrorCode};
use relay_protocol::domain::{
    Approval, ApprovalDecision, ApprovalKind, FlightChange, FlightState, FlightUpdate,
    InvokeRequest,
};
use relay_protocol::methods::call as m;
use serde_json::{json, Value};
use tokio::task::JoinSet;

use super::updates::{agent_text, Translator, OUTPUT_EVERY};
use super::{broker_error, params_of, Answer, Server, Turn};
use crate::commands::ask;
use crate::terminal::errln;

/// Option ids of a permission request.
const ALLOW: &str = "allow_once";
const REJECT: &str = "reject_once";

/// A prompt whose turn has begun in its session: what [`prompt`] runs. Made when the
/// request's line is read, before any later line, so a `session/cancel` right behind
/// the prompt finds its turn (the request's task may not have run yet). Dropped, it
/// ends the turn.
pub(super) struct Begun {
    text: String,
    conversation: Option<String>,
    end: EndTurn,
}

/// Begins a `session/prompt`: refused for bad params, an empty prompt, no broker, an
/// unknown session or one whose prompt still runs.
pub(super) fn begin(server: &Arc<Server>, params: Value) -> Result<Begun, RpcError> {
    let req: PromptRequest = params_of(params)?;
    let text = prompt_text(&req.prompt)?;
    let conversation = server.begin(&req.session_id)?;
    Ok(Begun {
        text,
        conversation,
        end: EndTurn(server.clone(), req.session_id),
    })
}

/// Serves a begun `session/prompt`. Once cancelled it answers `cancelled`, whatever
/// failed meanwhile (ACP: a cancellation is not shown as an error).
pub(super) async fn prompt(server: &Arc<Server>, begun: Begun) -> Answer {
    let Begun {
        text,
        conversation,
        end,
    } = begun;
    // The session's turn ends with this call, however it ends.
    let session = end.1.clone();
    match run(server, &session, text, conversation).await {
        Err(e) if server.was_cancelled(&session) => {
            errln!("relay acp: a cancelled prompt ended with an error: {e}");
            Ok(stop(StopReason::Cancelled))
        }
        answer => answer,
    }
}

async fn run(
    server: &Arc<Server>,
    session: &str,
    text: String,
    conversation: Option<String>,
) -> Answer {
    let session = session.to_string();
    let invoke = InvokeRequest {
        requester: server.actor.clone(),
        conversation,
        ..InvokeRequest::new(server.agent.clone(), text)
    };
    let accepted = server
        .call::<m::Invoke>(&[], &invoke)
        .await
        .map_err(broker_error)?;
    let flight = accepted.flight.id;
    if server.running(&session, &flight) {
        // Cancelled while the invocation was on its way.
        interrupt(server, &flight).await;
    }
    // The broker the invocation reached (found again if it had to be).
    let client = server.client().await.map_err(broker_error)?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<FlightUpdate>();
    let followed = ask::follow(&client, &flight, move |f| {
        if let ask::Followed::Update(u) = f {
            let _ = tx.send(u.clone());
        }
    });
    tokio::pin!(followed);
    let mut tr = Translator::default();
    let mut asks: JoinSet<Option<String>> = JoinSet::new();
    let mut asked = HashSet::new();
    let mut closed = HashSet::new();
    let mut held = tokio::time::interval(OUTPUT_EVERY);
    held.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ended = loop {
        tokio::select! {
            biased;
            Some(u) = rx.recv() => {
                for update in tr.apply(&u.change) {
                    server.update(&session, update);
                }
                if matches!(u.change, FlightChange::State { to: FlightState::Waiting, .. }) {
                    ask_approvals(server, &session, &flight, &mut asked, &mut asks).await;
                }
            }
            // A decision made: another approval may wait (a flight already waiting
            // does not say so again).
            Some(done) = asks.join_next() => {
                closed.extend(done.ok().flatten());
                ask_approvals(server, &session, &flight, &mut asked, &mut asks).await;
            }
            // Command output held back, shown once its time has come.
            _ = held.tick() => {
                for update in tr.flush() {
                    server.update(&session, update);
                }
            }
            ended = &mut followed => break ended,
        }
    };
    while let Ok(u) = rx.try_recv() {
        for update in tr.apply(&u.change) {
            server.update(&session, update);
        }
    }
    for update in tr.flush_all() {
        server.update(&session, update);
    }
    // The flight ended: a question still open in the editor has no one to answer.
    asks.abort_all();
    while let Some(done) = asks.join_next().await {
        closed.extend(done.ok().flatten());
    }
    close_open_asks(server, &session, asked.difference(&closed)).await;
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
pub(super) async fn interrupt(server: &Server, flight: &str) {
    if let Err(e) = server
        .call::<m::FlightInterrupt>(&[flight], &Empty {})
        .await
    {
        errln!("relay acp: cannot interrupt flight {flight}: {e}");
    }
}

/// Asks the editor about each pending approval of `flight` not asked yet.
async fn ask_approvals(
    server: &Arc<Server>,
    session: &str,
    flight: &str,
    asked: &mut HashSet<String>,
    asks: &mut JoinSet<Option<String>>,
) {
    if !server.may_decide.load(Ordering::Relaxed) {
        // Its token may not decide (an agent's): the approvals wait for whoever may.
        return;
    }
    let pending = server
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
        let (server, session) = (server.clone(), session.to_string());
        asks.spawn(async move { ask_one(&server, &session, approval).await });
    }
}

/// Asks the editor about one approval and decides it by the answer, then ends the
/// permission's tool call (an editor shows it running until then). Its id when it did;
/// `None` when the editor gave no answer (the approval is decided elsewhere and the
/// tool call ended with the flight).
async fn ask_one(server: &Server, session: &str, approval: Approval) -> Option<String> {
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
            return None;
        }
        Err(e) => {
            errln!(
                "relay acp: the editor did not decide approval {} ({e}); it waits for a decision elsewhere",
                approval.id
            );
            return None;
        }
    };
    let decide = DecideApproval {
        decision,
        decided_by: server.actor.clone(),
        remember: None,
    };
    let decided = server
        .call::<m::ApprovalDecide>(&[&approval.id], &decide)
        .await;
    let status = match decided {
        Ok(a) => ask_status(a.decision),
        Err(e) if e.code() == Some(ErrorCode::Unauthorized) => {
            // Not ours to decide: no more are asked; this one's tool call ends with
            // the flight, by the decision made elsewhere.
            server.may_decide.store(false, Ordering::Relaxed);
            errln!(
                "relay acp: {} may not decide approvals ({e}); approval {} waits for a decision elsewhere (relay approval decide, the dashboard)",
                server.actor,
                approval.id
            );
            return None;
        }
        Err(e) => {
            errln!(
                "relay acp: cannot decide approval {} ({}): {e}",
                approval.id,
                decision.as_str()
            );
            ToolCallStatus::Failed
        }
    };
    server.update(session, ask_end(&approval.id, status));
    Some(approval.id)
}

/// How a permission's tool call ends: completed when the command was allowed, failed
/// when not (declined, cancelled, or never decided).
fn ask_status(decision: Option<ApprovalDecision>) -> ToolCallStatus {
    match decision {
        Some(ApprovalDecision::Accept) => ToolCallStatus::Completed,
        _ => ToolCallStatus::Failed,
    }
}

fn ask_end(approval: &str, status: ToolCallStatus) -> SessionUpdate {
    SessionUpdate::ToolCallUpdate(ToolCallUpdate {
        tool_call_id: approval.to_string(),
        status: Some(status),
        ..Default::default()
    })
}

/// The flight ended with permission requests still open in the editor (not answered,
/// or decided elsewhere): ends their tool calls by the approvals' decisions, which also
/// closes an editor's dialog that waits for an answer no one takes any more.
async fn close_open_asks<'a>(
    server: &Server,
    session: &str,
    open: impl Iterator<Item = &'a String>,
) {
    let open: Vec<&String> = open.collect();
    if open.is_empty() {
        return;
    }
    let all = server
        .call::<m::ApprovalList>(
            &[],
            &ApprovalsQuery {
                state: Some("all".into()),
            },
        )
        .await
        .unwrap_or_default();
    for id in open {
        let decision = all.iter().find(|a| &a.id == id).and_then(|a| a.decision);
        server.update(session, ask_end(id, ask_status(decision)));
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

/// Clears the session's turn when the prompt's call ends (or never runs).
struct EndTurn(Arc<Server>, String);

impl Drop for EndTurn {
    fn drop(&mut self) {
        if let Ok(mut sessions) = self.0.sessions.lock() {
            if let Some(s) = sessions.get_mut(&self.1) {
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
