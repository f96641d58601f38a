//! `relay replay`: a flight, an agent's session and a conversation read back from the
//! log, with a real `relay up`, the REAL pinned codex and the mock model. A flight's
//! transcript holds its command and output, the approval and who decided it, the text,
//! token usage and its end, each entry at the seq of its event in the log; `--from-seq`
//! keeps exactly what came after; the text form reads as a transcript; and the `--json`
//! documents are the same bytes after a `kill -9` and a restart.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use relay_protocol::domain::{ApprovalDecision, ApprovalState, FlightChange, FlightState};
use relay_protocol::replay::{
    AgentEntry, AgentReplay, ApprovalStep, ConversationEntry, ConversationReplay, TurnReplay,
    TurnStep,
};
use relay_tests::agents::{state, Env};
use relay_tests::procs;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// `relay replay WHAT ID --json [--from-seq N]`: the bytes printed, and what they hold.
fn replay<T: DeserializeOwned>(env: &Env, what: &str, id: &str, from: u64) -> (String, T) {
    let from = from.to_string();
    let out = env
        .relay
        .cli_ok(&["replay", what, id, "--json", "--from-seq", &from]);
    let doc = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    (out, doc)
}

/// The whole event log.
fn events(env: &Env) -> Vec<Value> {
    let all = env
        .relay
        .cli_json(&["events", "--since", "0", "-n", "100000", "--json"]);
    all.as_array().unwrap().clone()
}

/// The seqs of the log's events about `flight` after its creation: its updates and its
/// approvals.
fn flight_event_seqs(events: &[Value], flight: &str) -> BTreeSet<u64> {
    events
        .iter()
        .filter(|e| {
            (e["type"] == "flight_updated" && e["update"]["flight"] == flight)
                || (e["type"].as_str().unwrap().starts_with("approval_")
                    && e["approval"]["flight"] == flight)
        })
        .map(|e| e["seq"].as_u64().unwrap())
        .collect()
}

/// A turn as `--from-seq n` documents it: its entries after `n`.
fn turn_after(turn: &TurnReplay, n: u64) -> TurnReplay {
    let mut cut = turn.clone();
    cut.entries.retain(|e| e.seq > n);
    cut
}

/// An agent replay as `--from-seq n` documents it: entries after `n`; a turn asked
/// before `n` only if something of it came after, with only that.
fn agent_after(replay: &AgentReplay, n: u64) -> AgentReplay {
    let mut cut = replay.clone();
    cut.entries = cut
        .entries
        .into_iter()
        .filter_map(|entry| match entry {
            AgentEntry::Turn(turn) => {
                let turn = turn_after(&turn, n);
                (turn.seq > n || !turn.entries.is_empty())
                    .then_some(AgentEntry::Turn(Box::new(turn)))
            }
            other => (other.seq() > n).then_some(other),
        })
        .collect();
    cut
}

fn texts(turn: &TurnReplay, pick: impl Fn(&FlightChange) -> Option<&str>) -> Vec<String> {
    turn.entries
        .iter()
        .filter_map(|e| match &e.step {
            TurnStep::Update(change) => pick(change).map(str::to_string),
            TurnStep::Approval(_) => None,
        })
        .collect()
}

fn approvals(turn: &TurnReplay) -> Vec<(u64, &ApprovalStep)> {
    turn.entries
        .iter()
        .filter_map(|e| match &e.step {
            TurnStep::Approval(a) => Some((e.seq, a)),
            TurnStep::Update(_) => None,
        })
        .collect()
}

/// The line of `text` holding `needle`, by position (panics with the text if none).
fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{text}"))
}

/// Asks codex-1 `exec: CMD` (codex asks first), answers its approval with `decision`,
/// and waits for the flight to complete. Returns the flight id and approval id.
async fn approved_command(
    env: &Env,
    cmd: &str,
    decision: &str,
    extra: &[&str],
) -> (String, String) {
    let task = format!("exec: {cmd}");
    let mut args = vec!["ask", "codex-1", "--no-wait"];
    args.extend_from_slice(extra);
    args.push(&task);
    let id = env.relay.cli_ok(&args).trim().to_string();
    env.wait_flight(&id, 60, |f| state(f) == "waiting").await;
    let approval = env.approval_of(&id)["id"].as_str().unwrap().to_string();
    env.relay.cli_ok(&["approve", &approval, decision]);
    env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    (id, approval)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flight_replays_its_command_approval_text_and_usage() {
    let env = Env::start().await;
    env.add_agent("codex-1", &[]);
    let (id, approval) = approved_command(&env, "echo relay-replayed", "accept", &[]).await;
    let flight = env.flight(&id).await;
    let (_, turn) = replay::<TurnReplay>(&env, "flight", &id, 0);

    // Who asked what, and how it ended.
    assert_eq!(
        (
            turn.flight.as_str(),
            turn.agent.as_str(),
            turn.invocation.requester.as_str(),
            turn.invocation.task.as_str(),
            turn.state,
            turn.error.as_deref(),
        ),
        (
            id.as_str(),
            "codex-1",
            "operator",
            "exec: echo relay-replayed",
            FlightState::Completed,
            None
        )
    );
    let usage = turn.usage.clone().expect("codex reports usage");
    assert!(
        usage.input_tokens > 0 && usage.output_tokens > 0,
        "{usage:?}"
    );

    // The approval, asked and decided by the operator, at their seqs in the log.
    let log = events(&env);
    let seq_of = |kind: &str| {
        log.iter()
            .find(|e| e["type"] == kind && e["approval"]["id"] == approval.as_str())
            .unwrap()["seq"]
            .as_u64()
            .unwrap()
    };
    let asked = approvals(&turn);
    assert_eq!(asked.len(), 2, "{asked:?}");
    let (
        asked_seq,
        ApprovalStep::ApprovalRequested {
            approval: a,
            detail,
            ..
        },
    ) = asked[0]
    else {
        panic!("{asked:?}")
    };
    assert_eq!((a, asked_seq), (&approval, seq_of("approval_requested")));
    assert!(detail.contains("echo relay-replayed"), "{detail}");
    assert_eq!(
        asked[1],
        (
            seq_of("approval_decided"),
            &ApprovalStep::ApprovalDecided {
                approval: approval.clone(),
                state: ApprovalState::Decided,
                decision: Some(ApprovalDecision::Accept),
                decided_by: Some("operator".into()),
            }
        )
    );

    // The command's output, and the text: deltas joined into one entry, the whole reply.
    let output = texts(&turn, |c| match c {
        FlightChange::CommandOutput { text, .. } => Some(text),
        _ => None,
    });
    assert!(output.concat().contains("relay-replayed"), "{output:?}");
    let text = texts(&turn, |c| match c {
        FlightChange::Delta { text } => Some(text),
        _ => None,
    });
    assert_eq!(text.len(), 1, "one run of deltas, one entry: {text:?}");
    assert_eq!(Some(text[0].as_str()), flight["output"].as_str());
    assert!(matches!(
        &turn.entries.last().unwrap().step,
        TurnStep::Update(FlightChange::State {
            to: FlightState::Completed,
            ..
        })
    ));

    // Every event of the flight is in exactly one entry, in log order.
    let mut covered = BTreeSet::new();
    let mut last = turn.seq;
    for e in &turn.entries {
        let end = e.last_seq.unwrap_or(e.seq);
        assert!(e.seq > last && end >= e.seq, "out of order: {e:?}");
        last = end;
        covered.extend(flight_event_seqs(&log, &id).range(e.seq..=end));
    }
    assert_eq!(covered, flight_event_seqs(&log, &id));

    // --from-seq N: exactly the entries after N, N an approval's or an update's seq.
    let decided = seq_of("approval_decided");
    let waiting = turn
        .entries
        .iter()
        .find(|e| {
            matches!(
                e.step,
                TurnStep::Update(FlightChange::State {
                    to: FlightState::Waiting,
                    ..
                })
            )
        })
        .unwrap()
        .seq;
    for n in [decided, waiting] {
        let (_, cut) = replay::<TurnReplay>(&env, "flight", &id, n);
        assert_eq!(cut, turn_after(&turn, n), "from {n}");
        assert!(cut.entries.len() < turn.entries.len());
    }
    let (_, cut) = replay::<TurnReplay>(&env, "flight", &id, decided);

    // The transcript: the request, the command with its output under it, the decision,
    // the text, usage and the end, in that order.
    let shown = env.relay.cli_ok(&["replay", "flight", &id]);
    let lines = [
        line_of(&shown, "operator asked codex-1:"),
        line_of(&shown, "exec: echo relay-replayed"),
        line_of(&shown, &format!("approval {approval} asked to run")),
        line_of(&shown, &format!("approval {approval} accepted by operator")),
        line_of(&shown, "| relay-replayed"),
        line_of(&shown, "codex-1: outputs:"),
        line_of(
            &shown,
            &format!(
                "usage: {} input + {} output tokens",
                usage.input_tokens, usage.output_tokens
            ),
        ),
        line_of(&shown, "-- completed"),
    ];
    assert!(lines.windows(2).all(|w| w[0] < w[1]), "{lines:?}\n{shown}");
    let command = line_of(&shown, "$ ");
    assert!(
        shown
            .lines()
            .nth(command)
            .unwrap()
            .contains("echo relay-replayed"),
        "{shown}"
    );
    assert!(command < line_of(&shown, "| relay-replayed"), "{shown}");
    assert!(
        !shown.contains("\"kind\""),
        "a transcript, not JSON: {shown}"
    );

    // Unknown names are typed errors, on the CLI and over HTTP.
    for (what, code) in [
        ("flight", "unknown_flight"),
        ("agent", "unknown_agent"),
        ("conversation", "unknown_conversation"),
    ] {
        let out = env.relay.cli(&["replay", what, "nope"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(code), "{what}: {err}");
    }
    let http = env.relay.http();
    let (status, body) = http.get("/v1/replay/flights/nope").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("unknown_flight"))
    );
    let (status, body) = http
        .get(&format!("/v1/replay/flights/{id}?from_seq=soon"))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_request"))
    );
    let (status, body) = http
        .get(&format!("/v1/replay/flights/{id}?from_seq={decided}"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_value::<TurnReplay>(body).unwrap(), cut);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_session_and_its_conversation_replay_the_same_after_kill_9() {
    let mut env = Env::start().await;
    env.add_agent("codex-1", &[]);
    env.relay.cli_ok(&["conversation", "add", "team"]);
    env.relay.cli_ok(&["send", "--to", "team", "hello team"]);
    let team = ["--conversation", "team"];
    let out = env
        .relay
        .cli_ok(&["ask", "codex-1", "--conversation", "team", "first question"]);
    assert_eq!(out.trim(), "ok: first question");
    let (second, approval) = approved_command(&env, "echo second-turn", "decline", &team).await;

    // The session is lost (codex forgets its thread) and replaced at the next turn.
    env.relay.terminate().unwrap();
    std::fs::remove_dir_all(env.codex_home.join("sessions")).unwrap();
    env.relay.restart().unwrap();
    let out = env
        .relay
        .cli_ok(&["ask", "codex-1", "--conversation", "team", "after the loss"]);
    assert_eq!(out.trim(), "ok: after the loss");

    let (agent_json, agent) = replay::<AgentReplay>(&env, "agent", "codex-1", 0);
    let (conversation_json, conversation) =
        replay::<ConversationReplay>(&env, "conversation", "team", 0);
    let (flight_json, _) = replay::<TurnReplay>(&env, "flight", &second, 0);

    // The agent's session: registered, three turns with what was asked, the loss.
    let turns: Vec<&TurnReplay> = agent
        .entries
        .iter()
        .filter_map(|e| match e {
            AgentEntry::Turn(t) => Some(t.as_ref()),
            _ => None,
        })
        .collect();
    assert_eq!(
        turns
            .iter()
            .map(|t| (
                t.invocation.task.as_str(),
                t.state,
                t.invocation.conversation.as_str()
            ))
            .collect::<Vec<_>>(),
        vec![
            ("first question", FlightState::Completed, "team"),
            ("exec: echo second-turn", FlightState::Completed, "team"),
            ("after the loss", FlightState::Completed, "team"),
        ]
    );
    assert!(turns.iter().all(|t| t.usage.is_some()), "{turns:?}");
    assert_eq!(turns[1].flight, second);
    assert!(approvals(turns[1]).iter().any(|(_, a)| matches!(a,
        ApprovalStep::ApprovalDecided { decision: Some(ApprovalDecision::Decline), decided_by: Some(by), .. } if by == "operator")));
    let kinds: Vec<&str> = agent
        .entries
        .iter()
        .map(|e| match e {
            AgentEntry::Registered { .. } => "registered",
            AgentEntry::Removed { .. } => "removed",
            AgentEntry::ThreadLost { .. } => "thread_lost",
            AgentEntry::Turn(_) => "turn",
        })
        .collect();
    // The loss is found when the third turn starts its session: after its request.
    assert_eq!(kinds, ["registered", "turn", "turn", "turn", "thread_lost"]);
    let AgentEntry::ThreadLost {
        old_thread_id,
        new_thread_id,
        ..
    } = &agent.entries[4]
    else {
        unreachable!()
    };
    assert_eq!(turns[2].thread_id.as_ref(), Some(new_thread_id));
    assert_eq!(turns[0].thread_id.as_ref(), Some(old_thread_id));

    // The conversation: who said what, replies under the message they answer, and the
    // flights the requests started.
    let said: Vec<(String, String, Option<u64>)> = conversation
        .entries
        .iter()
        .map(|e| match e {
            ConversationEntry::Message { message, .. } => {
                let answers = message.reply_to.as_ref().map(|to| {
                    conversation
                        .entries
                        .iter()
                        .find_map(|e| match e {
                            ConversationEntry::Message { message, .. } if &message.id == to => {
                                Some(message.index)
                            }
                            _ => None,
                        })
                        .unwrap()
                });
                (message.author.clone(), message.body.to_string(), answers)
            }
            ConversationEntry::FlightStarted {
                flight,
                agent,
                state,
                ..
            } => (format!("-> {agent}"), format!("{flight} {state}"), None),
        })
        .collect();
    let reply2 = said[6].1.clone();
    assert!(reply2.contains("rejected"), "the model was told: {reply2}");
    assert_eq!(
        said,
        vec![
            ("operator".into(), "hello team".into(), None),
            ("operator".into(), "first question".into(), None),
            (
                "-> codex-1".into(),
                format!("{} completed", turns[0].flight),
                None
            ),
            ("codex-1".into(), "ok: first question".into(), Some(1)),
            ("operator".into(), "exec: echo second-turn".into(), None),
            ("-> codex-1".into(), format!("{second} completed"), None),
            ("codex-1".into(), reply2, Some(3)),
            ("operator".into(), "after the loss".into(), None),
            (
                "-> codex-1".into(),
                format!("{} completed", turns[2].flight),
                None
            ),
            ("codex-1".into(), "ok: after the loss".into(), Some(5)),
        ]
    );

    // --from-seq: after the first turn's last entry, the first turn is gone; after the
    // first question, the conversation starts at the flight it started.
    let first_end = turns[0]
        .entries
        .iter()
        .map(|e| e.last_seq.unwrap_or(e.seq))
        .max()
        .unwrap();
    let (_, cut) = replay::<AgentReplay>(&env, "agent", "codex-1", first_end);
    assert_eq!(cut, agent_after(&agent, first_end));
    assert_eq!(cut.entries.len(), 3, "{cut:?}");
    let asked = conversation.entries[1].seq();
    let (_, cut) = replay::<ConversationReplay>(&env, "conversation", "team", asked);
    let mut expected = conversation.clone();
    expected.entries.retain(|e| e.seq() > asked);
    assert_eq!(cut, expected);
    assert_eq!(cut.entries.len(), 8);

    // The transcripts read as such.
    // The session lost is shown where it happened: as the third turn woke the agent.
    let shown = env.relay.cli_ok(&["replay", "agent", "codex-1"]);
    let lines = [
        line_of(&shown, "agent codex-1"),
        line_of(&shown, "registered: codex_app_server in "),
        line_of(&shown, "codex-1: ok: first question"),
        line_of(&shown, &format!("flight {second} of codex-1: completed")),
        line_of(&shown, &format!("approval {approval} declined by operator")),
        line_of(&shown, "after the loss"),
        line_of(
            &shown,
            &format!("session lost: {old_thread_id} replaced by {new_thread_id}"),
        ),
        line_of(&shown, "codex-1: ok: after the loss"),
    ];
    assert!(lines.windows(2).all(|w| w[0] < w[1]), "{lines:?}\n{shown}");
    let shown = env.relay.cli_ok(&["replay", "conversation", "team"]);
    let lines = [
        line_of(&shown, "#0 operator: hello team"),
        line_of(&shown, "#1 operator: first question"),
        line_of(
            &shown,
            &format!(
                "-> operator asked codex-1 (consult): flight {}, completed",
                turns[0].flight
            ),
        ),
        line_of(&shown, "#2 codex-1 (reply to #1): ok: first question"),
        line_of(&shown, "#6 codex-1 (reply to #5): ok: after the loss"),
    ];
    assert!(lines.windows(2).all(|w| w[0] < w[1]), "{shown}");

    // kill -9 and a restart: the same documents, byte for byte.
    let codex = env.codex_pid("codex-1").await;
    env.relay.kill9();
    assert!(procs::wait_gone(codex, Duration::from_secs(15)).await);
    env.relay.restart().unwrap();
    assert_eq!(
        replay::<AgentReplay>(&env, "agent", "codex-1", 0).0,
        agent_json
    );
    assert_eq!(
        replay::<ConversationReplay>(&env, "conversation", "team", 0).0,
        conversation_json
    );
    assert_eq!(
        replay::<TurnReplay>(&env, "flight", &second, 0).0,
        flight_json
    );
}

/// Claude Code and Pi sessions replay through the same code as Codex: a Claude command
/// behind an approval accepted by a person, a Pi command run without one, each with its
/// output, and the same `--json` bytes after a `kill -9` and a restart.
#[tokio::test(flavor = "multi_thread")]
async fn claude_and_pi_sessions_replay_their_commands_and_decisions() {
    let mut env = Env::start().await;
    env.add_claude("cl-1", &[]);
    env.add_pi("pi-1", &[]);
    let cl = env.ask_no_wait("cl-1", "exec:touch made-by-claude");
    env.wait_flight(&cl, 120, |f| state(f) == "waiting").await;
    let approval = env.approval_of(&cl);
    env.relay.cli_ok(&[
        "approve",
        approval["id"].as_str().unwrap(),
        "accept",
        "--as",
        "reviewer",
    ]);
    let pi = env.ask_no_wait("pi-1", "exec:echo printed-by-pi");
    for id in [&cl, &pi] {
        let f = env
            .wait_flight(id, 120, |f| {
                matches!(state(f), "completed" | "failed" | "cancelled")
            })
            .await;
        assert_eq!(state(&f), "completed", "{f}");
    }

    let claude = env.relay.cli_ok(&["replay", "agent", "cl-1"]);
    let command = line_of(&claude, "$ ");
    assert!(
        claude
            .lines()
            .nth(command)
            .unwrap()
            .contains("touch made-by-claude"),
        "{claude}"
    );
    let decided = line_of(&claude, "accepted by reviewer");
    assert!(
        line_of(&claude, "exec:touch made-by-claude") < decided,
        "the task comes before the decision:\n{claude}"
    );
    assert!(claude.contains("outputs:"), "the reply is shown:\n{claude}");

    let pi_text = env.relay.cli_ok(&["replay", "flight", &pi]);
    let command = line_of(&pi_text, "$ echo printed-by-pi");
    assert!(
        line_of(&pi_text, "printed-by-pi") <= command + 1,
        "the command's output follows it:\n{pi_text}"
    );
    assert!(
        !pi_text.contains("approval"),
        "pi asks for none:\n{pi_text}"
    );

    let replays = |env: &Env| -> Vec<String> {
        [
            ("agent", "cl-1"),
            ("agent", "pi-1"),
            ("flight", cl.as_str()),
        ]
        .iter()
        .map(|(what, id)| env.relay.cli_ok(&["replay", what, id, "--json"]))
        .collect()
    };
    let before = replays(&env);
    env.relay.kill9();
    env.relay.restart().unwrap();
    let after = replays(&env);
    assert_eq!(before, after);
}
