//! `relay replay` as a transcript a person reads: who asked what, the agent's text,
//! each command with its output under it, approvals and who decided them, token usage
//! and how the turn ended; a conversation as who said what, replies marked with the
//! message they answer. Every line starts with the global seq of its entry.
//!
//! Lines are built as text first ([`turn_lines`]...) and printed through [`outln`], so
//! whatever an agent or model wrote is shown escaped (`terminal`), never obeyed.

use std::collections::{HashMap, VecDeque};

use relay_protocol::domain::{
    ApprovalDecision, ApprovalKind, ApprovalState, FlightChange, FlightState, ItemKind, ItemPhase,
    Message,
};
use relay_protocol::replay::{
    AgentEntry, AgentReplay, ApprovalStep, ConversationEntry, ConversationReplay, TurnEntry,
    TurnReplay, TurnStep,
};

use crate::terminal::outln;

/// Width of the seq column; continuation lines are indented past it.
const SEQ: usize = 6;

/// A transcript being written: lines, each under a seq or continuing the one above.
#[derive(Default)]
struct Lines(Vec<String>);

impl Lines {
    /// `text` at `seq`; its further lines indented under the first, by `indent` more.
    fn at(&mut self, seq: u64, indent: &str, text: &str) {
        let mut rest = text.lines();
        let first = rest.next().unwrap_or("");
        self.0.push(format!("{seq:>SEQ$}  {indent}{first}"));
        for line in rest {
            self.more(indent, line);
        }
    }

    /// A line under the last, with no seq of its own.
    fn more(&mut self, indent: &str, text: &str) {
        self.0.push(format!("{:SEQ$}  {indent}{text}", ""));
    }

    /// Lines of output (a command's), each marked as output.
    fn output(&mut self, seq: u64, text: &str) {
        for (i, line) in text.lines().enumerate() {
            if i == 0 {
                self.0.push(format!("{seq:>SEQ$}    | {line}"));
            } else {
                self.0.push(format!("{:SEQ$}    | {line}", ""));
            }
        }
    }

    fn print(self) {
        for line in self.0 {
            outln!("{line}");
        }
    }
}

pub fn print_turn(turn: &TurnReplay) {
    let mut out = Lines::default();
    out.0.push(turn_title(turn));
    turn_lines(turn, &mut out, &mut |_, _| {});
    out.print();
}

pub fn print_agent(replay: &AgentReplay) {
    let mut out = Lines::default();
    out.0.push(format!("agent {}", replay.agent));
    // What happened to the agent itself is shown where it happened: a session lost
    // while a turn woke it is shown inside that turn (turns of an agent never overlap).
    let mut pending: VecDeque<&AgentEntry> = replay
        .entries
        .iter()
        .filter(|e| !matches!(e, AgentEntry::Turn(_)))
        .collect();
    let mut due = |before: u64, out: &mut Lines| {
        while let Some(e) = pending.front().filter(|e| e.seq() < before) {
            agent_line(e, out);
            pending.pop_front();
        }
    };
    for entry in &replay.entries {
        match entry {
            AgentEntry::Turn(turn) => {
                due(turn.seq, &mut out);
                out.0.push(String::new());
                out.at(turn.seq, "", &turn_title(turn));
                turn_lines(turn, &mut out, &mut due);
            }
            other => due(other.seq() + 1, &mut out),
        }
    }
    out.print();
}

/// An entry of an agent's own: registered, removed, its session lost.
fn agent_line(entry: &AgentEntry, out: &mut Lines) {
    match entry {
        AgentEntry::Registered {
            seq,
            harness,
            cwd,
            model,
            node,
            worktree,
            by,
            ..
        } => {
            let mut line = super::by_whom(&format!("registered: {harness} in {cwd}"), by);
            if let Some(m) = model {
                line.push_str(&format!(", model {m}"));
            }
            if let Some(n) = node {
                line.push_str(&format!(", on node {n}"));
            }
            if let Some(w) = worktree {
                line.push_str(&format!(
                    ", worktree {} on {} from {}",
                    w.path, w.branch, w.base
                ));
            }
            out.at(*seq, "", &line);
        }
        AgentEntry::Removed { seq, by, .. } => out.at(*seq, "", &super::by_whom("removed", by)),
        AgentEntry::ThreadLost {
            seq,
            old_thread_id,
            new_thread_id,
            reason,
            ..
        } => out.at(
            *seq,
            "",
            &format!(
                "session lost: {old_thread_id} replaced by {new_thread_id} \
                 (the new session does not remember the turns before)\n{reason}"
            ),
        ),
        AgentEntry::Turn(_) => {}
    }
}

pub fn print_conversation(replay: &ConversationReplay) {
    let c = &replay.conversation;
    let mut out = Lines::default();
    let mut title = format!("conversation {} ({})", c.id, c.kind);
    if let Some(t) = &c.title {
        title.push_str(&format!(": {t}"));
    }
    out.0.push(title);
    let index: HashMap<&str, u64> = replay
        .entries
        .iter()
        .filter_map(|e| match e {
            ConversationEntry::Message { message, .. } => {
                Some((message.id.as_str(), message.index))
            }
            _ => None,
        })
        .collect();
    for entry in &replay.entries {
        match entry {
            ConversationEntry::Message { seq, message } => {
                out.at(*seq, "", &message_line(message, &index));
            }
            ConversationEntry::FlightStarted {
                seq,
                flight,
                agent,
                requester,
                action,
                state,
                error,
                ..
            } => {
                let mut line =
                    format!("  -> {requester} asked {agent} ({action}): flight {flight}, {state}");
                if let Some(e) = error {
                    line.push_str(&format!(": {e}"));
                }
                out.at(*seq, "", &line);
            }
        }
    }
    out.print();
}

/// `#3 codex-1 (reply to #2): text`.
/// The letters and digits of `text` without its escape sequences: what two texts must
/// share to read the same.
fn letters(text: &str) -> String {
    strip_ansi_escapes::strip_str(text)
        .chars()
        .filter(|c| c.is_alphanumeric())
        .collect()
}

fn message_line(m: &Message, index: &HashMap<&str, u64>) -> String {
    let mut line = format!("#{} {}", m.index, m.author);
    if let Some(to) = &m.reply_to {
        match index.get(to.as_str()) {
            Some(i) => line.push_str(&format!(" (reply to #{i})")),
            None => line.push_str(&format!(" (reply to {to})")),
        }
    }
    if m.class != relay_protocol::domain::MessageClass::Agent {
        line.push_str(&format!(" [{}]", m.class));
    }
    line.push_str(": ");
    line.push_str(&m.body);
    line
}

fn turn_title(turn: &TurnReplay) -> String {
    let mut line = format!("flight {} of {}: {}", turn.flight, turn.agent, turn.state);
    if let Some(u) = &turn.usage {
        line.push_str(&format!(
            ", {} input + {} output tokens",
            u.input_tokens, u.output_tokens
        ));
    }
    line
}

/// The request, then the entries, of one turn; `due(seq, out)` is called before each
/// entry, to show what else happened before it.
fn turn_lines(turn: &TurnReplay, out: &mut Lines, due: &mut dyn FnMut(u64, &mut Lines)) {
    let mut asked = format!("{} asked {}", turn.invocation.requester, turn.agent);
    if let Some(parent) = &turn.invocation.parent_flight {
        asked.push_str(&format!(" (from flight {parent})"));
    }
    out.at(turn.seq, "", &format!("{asked}:\n{}", turn.invocation.task));
    let calls = calls(&turn.entries);
    let mut shown: Vec<&str> = Vec::new();
    let mut streamed: Vec<&str> = Vec::new();
    // Everything the agent streamed as text in this turn.
    let mut said = String::new();
    let mut text_since_item = false;
    for entry in &turn.entries {
        let seq = entry.seq;
        due(seq, out);
        match &entry.step {
            TurnStep::Approval(step) => approval_line(seq, step, out),
            TurnStep::Update(change) => match change {
                FlightChange::Delta { text } => {
                    text_since_item = true;
                    said.push_str(text);
                    out.at(seq, "", &format!("{}: {text}", turn.agent));
                }
                FlightChange::CommandOutput { item_id, text } => {
                    streamed.push(item_id);
                    out.output(seq, text);
                }
                FlightChange::Item {
                    item_id,
                    item_kind,
                    phase,
                    text,
                    ..
                } => {
                    let tool = is_tool(item_kind);
                    match phase {
                        ItemPhase::Started if tool => {
                            shown.push(item_id);
                            out.at(
                                seq,
                                "",
                                &call_line(item_kind, calls.get(item_id.as_str()).copied()),
                            );
                        }
                        ItemPhase::Started => {
                            if *item_kind == ItemKind::AgentMessage {
                                text_since_item = false;
                            }
                        }
                        ItemPhase::Completed if tool => {
                            let (call, result) = split_call(text.as_deref());
                            if !shown.contains(&item_id.as_str()) {
                                out.at(seq, "", &call_line(item_kind, call));
                            }
                            if !streamed.contains(&item_id.as_str()) && !result.is_empty() {
                                out.output(seq, result);
                            }
                        }
                        ItemPhase::Completed => {
                            completed_line(seq, turn, item_kind, text, text_since_item, out)
                        }
                    }
                }
                FlightChange::State { to, reason, output } => {
                    // An answer that is not what the agent streamed (a tmux agent's
                    // `relay reply`, after what its pane printed) is shown as such.
                    if let Some(answer) = output.as_deref().filter(|o| {
                        *to == FlightState::Completed && !letters(&said).ends_with(&letters(o))
                    }) {
                        out.at(seq, "", &format!("{} answered: {answer}", turn.agent));
                    }
                    let mut line = format!("-- {to}");
                    if matches!(to, FlightState::Failed | FlightState::Cancelled) {
                        if let Some(r) = reason {
                            line.push_str(&format!(": {r}"));
                        }
                    }
                    out.at(seq, "", &line);
                }
                FlightChange::Usage(u) => out.at(
                    seq,
                    "",
                    &format!(
                        "usage: {} input + {} output tokens",
                        u.input_tokens, u.output_tokens
                    ),
                ),
                FlightChange::Plan { text } => out.at(seq, "  ", &format!("plan:\n{text}")),
                FlightChange::Diff { text } => out.at(seq, "  ", &format!("diff:\n{text}")),
                FlightChange::Note { text, by } => out.at(seq, "", &super::note_line(text, by)),
                FlightChange::Commit { commit } => out.at(seq, "", &commit.summary()),
                FlightChange::Reverted { revert } => out.at(seq, "", &revert.summary()),
                FlightChange::Session { thread_id, turn_id } => {
                    let mut line = "session".to_string();
                    if let Some(t) = thread_id {
                        line.push_str(&format!(" {t}"));
                    }
                    if let Some(t) = turn_id {
                        line.push_str(&format!(", turn {t}"));
                    }
                    out.at(seq, "", &line);
                }
            },
        }
    }
}

/// The completion of an item that is not a tool call: an agent message not streamed
/// as deltas, reasoning, a plan, a user message that is not the task (a steer).
fn completed_line(
    seq: u64,
    turn: &TurnReplay,
    kind: &ItemKind,
    text: &Option<relay_protocol::domain::SharedStr>,
    text_since_item: bool,
    out: &mut Lines,
) {
    let Some(text) = text.as_deref().filter(|t| !t.trim().is_empty()) else {
        return;
    };
    match kind {
        ItemKind::AgentMessage if !text_since_item => {
            out.at(seq, "", &format!("{}: {text}", turn.agent))
        }
        ItemKind::Reasoning => out.at(seq, "", &format!("(thinking) {text}")),
        ItemKind::Plan => out.at(seq, "  ", &format!("plan:\n{text}")),
        ItemKind::UserMessage if text.trim() != turn.invocation.task.trim() => {
            out.at(seq, "", &format!("{}: {text}", turn.invocation.requester))
        }
        _ => {}
    }
}

fn is_tool(kind: &ItemKind) -> bool {
    matches!(
        kind,
        ItemKind::CommandExecution | ItemKind::FileChange | ItemKind::ToolCall
    )
}

/// What each tool item called (the first line of its completion), by item id: a
/// command's line is shown when it starts, before its output.
fn calls(entries: &[TurnEntry]) -> HashMap<&str, &str> {
    entries
        .iter()
        .filter_map(|e| match &e.step {
            TurnStep::Update(FlightChange::Item {
                item_id,
                phase: ItemPhase::Completed,
                text,
                ..
            }) => Some((item_id.as_str(), split_call(text.as_deref()).0?)),
            _ => None,
        })
        .collect()
}

/// A tool item's completion text: the call, then (Claude Code, Pi) its result.
fn split_call(text: Option<&str>) -> (Option<&str>, &str) {
    match text {
        None => (None, ""),
        Some(t) => match t.split_once('\n') {
            Some((call, rest)) => (Some(call), rest),
            None => (Some(t), ""),
        },
    }
}

fn call_line(kind: &ItemKind, call: Option<&str>) -> String {
    let call = call.unwrap_or("(not recorded)");
    match kind {
        // Claude Code's item already reads `$ command`; Codex's and Pi's the bare command.
        ItemKind::CommandExecution => format!("$ {}", call.strip_prefix("$ ").unwrap_or(call)),
        ItemKind::FileChange => format!("file change: {call}"),
        _ => format!("tool call: {call}"),
    }
}

fn approval_line(seq: u64, step: &ApprovalStep, out: &mut Lines) {
    match step {
        ApprovalStep::ApprovalRequested {
            approval,
            approval_kind,
            detail,
            reason,
        } => {
            let what = match approval_kind {
                ApprovalKind::Command => "to run",
                ApprovalKind::FileChange => "to change files:",
                ApprovalKind::Other => "for",
            };
            let mut line = format!("approval {approval} asked {what} {detail}");
            if let Some(r) = reason {
                line.push_str(&format!("\nreason: {r}"));
            }
            out.at(seq, "", &line);
        }
        ApprovalStep::ApprovalDecided {
            approval,
            state,
            decision,
            decided_by,
        } => {
            let by = decided_by.as_deref().unwrap_or("unknown");
            let line = match (state, decision) {
                (ApprovalState::Decided, Some(d)) => {
                    format!("approval {approval} {} by {by}", decided(*d))
                }
                (ApprovalState::Expired, _) => {
                    format!("approval {approval} expired undecided (closed by {by})")
                }
                (state, _) => format!("approval {approval} {state} by {by}"),
            };
            out.at(seq, "", &line);
        }
    }
}

fn decided(d: ApprovalDecision) -> &'static str {
    match d {
        ApprovalDecision::Accept => "accepted",
        ApprovalDecision::AcceptForSession => "accepted for the session",
        ApprovalDecision::Decline => "declined",
        ApprovalDecision::Cancel => "cancelled",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_protocol::domain::{Action, Invocation};
    use relay_protocol::replay::Usage;

    fn entry(seq: u64, step: TurnStep) -> TurnEntry {
        TurnEntry {
            seq,
            last_seq: None,
            at: 0,
            step,
        }
    }

    fn item(id: &str, kind: ItemKind, phase: ItemPhase, text: Option<&str>) -> TurnStep {
        TurnStep::Update(FlightChange::Item {
            item_id: id.into(),
            item_kind: kind,
            phase,
            text: text.map(Into::into),
            exit_code: None,
        })
    }

    /// A command is shown by its line when it starts, its output under it, the
    /// approval with who decided it, the text, usage and the end.
    #[test]
    fn a_turn_reads_as_a_transcript() {
        let turn = TurnReplay {
            flight: "flt_1".into(),
            agent: "codex-1".into(),
            seq: 4,
            at: 0,
            invocation: Invocation {
                id: "inv_1".into(),
                requester: "operator".into(),
                target: "codex-1".into(),
                action: Action::Consult,
                task: "run it".into(),
                conversation: "direct.codex-1.operator".into(),
                request_message: "msg_1".into(),
                parent_flight: None,
                depth: 0,
                timeout_ms: None,
                created_at: 0,
            },
            state: FlightState::Completed,
            error: None,
            thread_id: None,
            turn_id: None,
            usage: Some(Usage {
                input_tokens: 10,
                output_tokens: 2,
                ..Usage::default()
            }),
            entries: vec![
                entry(
                    8,
                    item("c1", ItemKind::CommandExecution, ItemPhase::Started, None),
                ),
                entry(
                    9,
                    TurnStep::Approval(ApprovalStep::ApprovalRequested {
                        approval: "apr_1".into(),
                        approval_kind: ApprovalKind::Command,
                        detail: "echo hi".into(),
                        reason: None,
                    }),
                ),
                entry(
                    11,
                    TurnStep::Approval(ApprovalStep::ApprovalDecided {
                        approval: "apr_1".into(),
                        state: ApprovalState::Decided,
                        decision: Some(ApprovalDecision::Accept),
                        decided_by: Some("operator".into()),
                    }),
                ),
                entry(
                    12,
                    TurnStep::Update(FlightChange::CommandOutput {
                        item_id: "c1".into(),
                        text: "hi\nthere\n".into(),
                    }),
                ),
                entry(
                    13,
                    item(
                        "c1",
                        ItemKind::CommandExecution,
                        ItemPhase::Completed,
                        Some("echo hi"),
                    ),
                ),
                entry(
                    14,
                    TurnStep::Update(FlightChange::Delta {
                        text: "said \x1b[2Khi".into(),
                    }),
                ),
                entry(
                    15,
                    TurnStep::Update(FlightChange::Usage(
                        relay_protocol::domain::TokenUsage::new(10, 2),
                    )),
                ),
                entry(
                    16,
                    TurnStep::Update(FlightChange::State {
                        to: FlightState::Completed,
                        reason: None,
                        output: Some("said hi".into()),
                    }),
                ),
            ],
        };
        let mut out = Lines::default();
        out.0.push(turn_title(&turn));
        turn_lines(&turn, &mut out, &mut |_, _| {});
        assert_eq!(
            out.0,
            vec![
                "flight flt_1 of codex-1: completed, 10 input + 2 output tokens",
                "     4  operator asked codex-1:",
                "        run it",
                "     8  $ echo hi",
                "     9  approval apr_1 asked to run echo hi",
                "    11  approval apr_1 accepted by operator",
                "    12    | hi",
                "          | there",
                "    14  codex-1: said \x1b[2Khi",
                "    15  usage: 10 input + 2 output tokens",
                "    16  -- completed",
            ]
        );
        // Printed through `outln!`, which makes the escape inert.
        assert_eq!(
            crate::terminal::inert(&out.0[8]),
            "    14  codex-1: said \\x1b[2Khi"
        );
    }
}
