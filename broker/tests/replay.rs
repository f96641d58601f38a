//! Replays built from a real (temporary) sled store through the broker's own commands:
//! a flight's transcript is its log, cut at the published seq; `from` keeps what came
//! after it in an agent's session and a conversation; unknown names are typed errors;
//! and a database made before the replay index gets it at its first open.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
use support::reopen;

use relay_broker::replay::{self, flight_replay};
use relay_broker::store::{Store, T};
use relay_broker::{Broker, BrokerError, Command};
use relay_protocol::domain::{
    AgentSpec, ApprovalDecision, ApprovalKind, ApprovalRequest, ConversationKind, ConversationSpec,
    FlightChange, FlightState, Harness, InvokeRequest, ItemKind, ItemPhase, PostMessage,
};
use relay_protocol::event::EventBody;
use relay_protocol::replay::{AgentEntry, ApprovalStep, ConversationEntry, TurnReplay, TurnStep};

/// A broker on a temporary store with agent a1 registered.
async fn broker_with_a1(harness: Harness) -> Broker {
    let b = support::start(Store::temporary().unwrap()).await.0;
    b.register_agent(AgentSpec::new("a1", harness, "/w"))
        .await
        .unwrap();
    b
}

fn invoke(target: &str, task: &str, conversation: Option<&str>) -> InvokeRequest {
    InvokeRequest {
        conversation: conversation.map(str::to_string),
        ..InvokeRequest::new(target, task)
    }
}

fn state(to: FlightState, output: Option<&str>) -> FlightChange {
    FlightChange::State {
        to,
        reason: None,
        output: output.map(Into::into),
    }
}

fn delta(text: &str) -> FlightChange {
    FlightChange::Delta { text: text.into() }
}

fn item(phase: ItemPhase, text: Option<&str>) -> FlightChange {
    FlightChange::Item {
        item_id: "c1".into(),
        item_kind: ItemKind::CommandExecution,
        phase,
        text: text.map(Into::into),
        exit_code: None,
    }
}

/// Applies `changes` to `flight`, one command each (so no two deltas are merged).
async fn apply(b: &Broker, flight: &str, changes: Vec<FlightChange>) {
    for change in changes {
        b.update_flight(flight, change).await.unwrap();
    }
}

/// A flight of a1 that runs and answers `done`.
async fn answered(b: &Broker, task: &str, conversation: Option<&str>) {
    let f = b
        .invoke(invoke("a1", task, conversation))
        .await
        .unwrap()
        .flight
        .id;
    let end = state(FlightState::Completed, Some("done"));
    apply(b, &f, vec![state(FlightState::Running, None), end]).await;
}

/// A flight of a1 that runs a command behind an approval and answers.
async fn command_turn(b: &Broker) -> String {
    let f = b
        .invoke(invoke("a1", "run it", None))
        .await
        .unwrap()
        .flight
        .id;
    apply(
        b,
        &f,
        vec![
            state(FlightState::Running, None),
            FlightChange::Session {
                thread_id: Some("t1".into()),
                turn_id: Some("u1".into()),
            },
            delta("hel"),
            delta("lo"),
            item(ItemPhase::Started, None),
        ],
    )
    .await;
    let approval = match b
        .execute(Command::RequestApproval {
            agent: "a1".into(),
            request: ApprovalRequest {
                flight: f.clone(),
                kind: ApprovalKind::Command,
                detail: "echo hi".into(),
                reason: None,
                harness_request_id: "7".into(),
            },
        })
        .await
        .unwrap()
    {
        relay_broker::Outcome::Approval(a) => a.id,
        other => panic!("{other:?}"),
    };
    b.decide_approval(&approval, ApprovalDecision::Accept, "ann")
        .await
        .unwrap();
    apply(
        b,
        &f,
        vec![
            FlightChange::CommandOutput {
                item_id: "c1".into(),
                text: "hi\n".into(),
            },
            FlightChange::CommandOutput {
                item_id: "c1".into(),
                text: "there\n".into(),
            },
            item(ItemPhase::Completed, Some("echo hi")),
            FlightChange::Usage(relay_protocol::domain::TokenUsage::new(10, 2)),
            FlightChange::Usage(relay_protocol::domain::TokenUsage::new(20, 4)),
            delta("done"),
            state(FlightState::Completed, Some("hello done")),
        ],
    )
    .await;
    f
}

/// A turn's entries, each as a short line (`seq` left out).
fn steps(turn: &TurnReplay) -> Vec<String> {
    turn.entries
        .iter()
        .map(|e| {
            let joined = if e.last_seq.is_some() {
                " (joined)"
            } else {
                ""
            };
            let what = match &e.step {
                TurnStep::Update(FlightChange::State { to, .. }) => format!("state {to}"),
                TurnStep::Update(FlightChange::Delta { text }) => format!("delta {text}"),
                TurnStep::Update(FlightChange::CommandOutput { text, .. }) => {
                    format!("output {text:?}")
                }
                TurnStep::Update(FlightChange::Item { phase, text, .. }) => {
                    format!("item {phase} {text:?}")
                }
                TurnStep::Update(FlightChange::Usage(u)) => {
                    format!("usage {}/{}", u.input_tokens, u.output_tokens)
                }
                TurnStep::Update(other) => format!("{other:?}"),
                TurnStep::Approval(ApprovalStep::ApprovalRequested { detail, .. }) => {
                    format!("asked {detail}")
                }
                TurnStep::Approval(ApprovalStep::ApprovalDecided {
                    decision,
                    decided_by,
                    ..
                }) => format!("decided {decision:?} by {decided_by:?}"),
            };
            format!("{what}{joined}")
        })
        .collect()
}

#[tokio::test]
async fn a_flight_replays_its_log_and_stops_at_the_published_seq() {
    let b = broker_with_a1(Harness::CodexAppServer).await;
    let f = command_turn(&b).await;
    let turn = replay::flight(&b, f.clone(), 0).await.unwrap();
    assert_eq!(
        steps(&turn),
        [
            "state running",
            "Session { thread_id: Some(\"t1\"), turn_id: Some(\"u1\") }",
            "delta hello (joined)",
            "item started None",
            "asked echo hi",
            "state waiting",
            "decided Some(Accept) by Some(\"ann\")",
            "state running",
            "output \"hi\\nthere\\n\" (joined)",
            "item completed Some(\"echo hi\")",
            "usage 10/2",
            "usage 20/4",
            "delta done",
            "state completed",
        ]
    );
    assert_eq!(
        (
            turn.state,
            turn.thread_id.as_deref(),
            turn.usage
                .as_ref()
                .map(|u| (u.input_tokens, u.output_tokens)),
            turn.invocation.task.as_str(),
        ),
        (FlightState::Completed, Some("t1"), Some((20, 4)), "run it")
    );

    // Each entry sits at the seq of its event in the log.
    let log = b.store().events_after(0, 10_000).unwrap();
    for e in &turn.entries {
        let event = &log[e.seq as usize - 1];
        let fits = match (&e.step, &event.body) {
            (TurnStep::Update(_), EventBody::FlightUpdated { update, .. }) => update.flight == f,
            (
                TurnStep::Approval(ApprovalStep::ApprovalRequested { .. }),
                EventBody::ApprovalRequested { .. },
            )
            | (
                TurnStep::Approval(ApprovalStep::ApprovalDecided { .. }),
                EventBody::ApprovalDecided { .. },
            ) => true,
            _ => false,
        };
        assert!(fits, "{e:?} at {event:?}");
    }

    // Read as the log stood when the approval was asked: what came later is not there,
    // and the flight is as it was then.
    let asked = turn.entries[4].seq;
    let id = f.clone();
    let then = b
        .store()
        .read(move |s| flight_replay(s, &id, 0, asked))
        .await
        .unwrap();
    let mut expected = turn.clone();
    expected.entries.retain(|e| e.seq <= asked);
    (expected.state, expected.usage) = (FlightState::Running, None);
    assert_eq!(then, expected);
}

#[tokio::test]
async fn an_agent_replay_keeps_what_came_after_from() {
    let b = broker_with_a1(Harness::ClaudeStreamJson).await;
    answered(&b, "one", None).await;
    let long = b.invoke(invoke("a1", "two", None)).await.unwrap().flight.id;
    apply(&b, &long, vec![state(FlightState::Running, None)]).await;
    let from = b.last_seq();
    b.execute(Command::ThreadLost {
        agent: "a1".into(),
        old_thread_id: "old".into(),
        new_thread_id: "new".into(),
        reason: "gone".into(),
    })
    .await
    .unwrap();
    apply(
        &b,
        &long,
        vec![delta("x"), state(FlightState::Completed, Some("x"))],
    )
    .await;
    b.remove_agent("a1").await.unwrap();
    b.register_agent(AgentSpec::new("a1", Harness::PiRpc, "/w2"))
        .await
        .unwrap();

    let kinds = |entries: &[AgentEntry]| -> Vec<String> {
        entries
            .iter()
            .map(|e| match e {
                AgentEntry::Registered { harness, .. } => format!("registered {harness}"),
                AgentEntry::Removed { .. } => "removed".into(),
                AgentEntry::ThreadLost { new_thread_id, .. } => format!("lost -> {new_thread_id}"),
                AgentEntry::Turn(t) => {
                    format!("turn {} ({} entries)", t.invocation.task, t.entries.len())
                }
            })
            .collect()
    };
    let all = replay::agent(&b, "a1".into(), 0).await.unwrap();
    assert_eq!(
        kinds(&all.entries),
        [
            "registered claude_stream_json",
            "turn one (2 entries)",
            "turn two (3 entries)",
            "lost -> new",
            "removed",
            "registered pi_rpc",
        ]
    );
    // After `from`: the finished turn is gone; the one still running then shows who
    // asked and only what came later.
    let after = replay::agent(&b, "a1".into(), from).await.unwrap();
    assert_eq!(
        kinds(&after.entries),
        [
            "turn two (2 entries)",
            "lost -> new",
            "removed",
            "registered pi_rpc"
        ]
    );
    let AgentEntry::Turn(two) = &after.entries[0] else {
        unreachable!()
    };
    assert!(two.seq <= from && two.entries.iter().all(|e| e.seq > from));
    assert_eq!(two.state, FlightState::Completed);

    // A removed agent's history is still there.
    b.register_agent(AgentSpec::new("a2", Harness::CodexAppServer, "/w"))
        .await
        .unwrap();
    b.remove_agent("a2").await.unwrap();
    let gone = replay::agent(&b, "a2".into(), 0).await.unwrap();
    assert_eq!(
        kinds(&gone.entries),
        ["registered codex_app_server", "removed"]
    );
}

#[tokio::test]
async fn a_conversation_replay_is_its_messages_and_the_flights_they_started() {
    let b = broker_with_a1(Harness::CodexAppServer).await;
    b.create_conversation(ConversationSpec {
        id: "team".into(),
        kind: ConversationKind::Channel,
        title: Some("the team".into()),
        participants: vec![],
        parent: None,
    })
    .await
    .unwrap();
    b.post_message(PostMessage {
        conversation: "team".into(),
        author: "ann".into(),
        body: "hi".into(),
        class: Default::default(),
        reply_to: None,
        meta: Default::default(),
    })
    .await
    .unwrap();
    let f = b
        .invoke(invoke("a1", "do it", Some("team")))
        .await
        .unwrap()
        .flight
        .id;
    apply(
        &b,
        &f,
        vec![
            state(FlightState::Running, None),
            state(FlightState::Failed, None),
        ],
    )
    .await;
    answered(&b, "again", Some("team")).await;

    let all = replay::conversation(&b, "team".into(), 0).await.unwrap();
    assert_eq!(all.conversation.title.as_deref(), Some("the team"));
    let said: Vec<String> = all
        .entries
        .iter()
        .map(|e| match e {
            ConversationEntry::Message { message, .. } => format!(
                "#{} {}: {} (reply to {:?})",
                message.index,
                message.author,
                message.body,
                message.reply_to.as_ref().map(|r| *r == all_id(&all, 2)),
            ),
            ConversationEntry::FlightStarted {
                flight,
                agent,
                state,
                ..
            } => format!("{agent} {state} {}", *flight == f),
        })
        .collect();
    assert_eq!(
        said,
        [
            "#0 ann: hi (reply to None)",
            "#1 operator: do it (reply to None)",
            "a1 failed true",
            "#2 operator: again (reply to None)",
            "a1 completed false",
            "#3 a1: done (reply to Some(true))",
        ]
    );
    let seqs: Vec<u64> = all.entries.iter().map(|e| e.seq()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");

    let from = all.entries[2].seq();
    let after = replay::conversation(&b, "team".into(), from).await.unwrap();
    assert_eq!(after.entries, all.entries[3..]);
}

#[tokio::test]
async fn unknown_names_are_typed_errors() {
    let b = broker_with_a1(Harness::CodexAppServer).await;
    let nope = || "nope".to_string();
    assert!(matches!(
        replay::flight(&b, nope(), 0).await,
        Err(BrokerError::UnknownFlight(id)) if id == "nope"
    ));
    assert!(matches!(
        replay::agent(&b, nope(), 0).await,
        Err(BrokerError::UnknownAgent(name)) if name == "nope"
    ));
    assert!(matches!(
        replay::conversation(&b, nope(), 0).await,
        Err(BrokerError::UnknownConversation(id)) if id == "nope"
    ));
}

/// The id of the message at `index` in a conversation replay.
fn all_id(replay: &relay_protocol::replay::ConversationReplay, index: u64) -> String {
    replay
        .entries
        .iter()
        .find_map(|e| match e {
            ConversationEntry::Message { message, .. } if message.index == index => {
                Some(message.id.clone())
            }
            _ => None,
        })
        .unwrap()
}

#[tokio::test]
async fn a_database_from_before_the_replay_index_gets_it_at_its_first_open() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("db");
    let replays = |b: Broker, f: String| async move {
        let flight = replay::flight(&b, f, 0).await.unwrap();
        let agent = replay::agent(&b, "a1".into(), 0).await.unwrap();
        let conversation = replay::conversation(&b, "direct.a1.operator".into(), 0)
            .await
            .unwrap();
        (flight, agent, conversation)
    };
    let (b, stop, writer) = support::start(Store::open(&path).unwrap()).await;
    b.register_agent(AgentSpec::new("a1", Harness::CodexAppServer, "/tmp"))
        .await
        .unwrap();
    let f = command_turn(&b).await;
    let before = replays(b.clone(), f.clone()).await;
    stop.cancel();
    drop(b);
    writer.await.unwrap();
    {
        let store = reopen(&path).await;
        store.tree(T::ReplayIndex).clear().unwrap();
        store.tree(T::Meta).remove(b"replay_indexed").unwrap();
        assert!(!store.verify().unwrap().is_consistent());
        store.durable().db().flush().unwrap();
    }
    let store = reopen(&path).await;
    assert!(store.verify().unwrap().is_consistent());
    let (b, stop, writer) = support::start(store).await;
    assert_eq!(replays(b.clone(), f).await, before);
    stop.cancel();
    drop(b);
    writer.await.unwrap();
}
