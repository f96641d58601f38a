//! Domain rules over a real (temporary) sled store: the flight state machine, typed
//! errors for bad input, and that a rejected command writes nothing.
//!
//! Over 600 lines: the domain rules' specification, one test per rule, read as one file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use relay_broker::store::Store;
use relay_broker::{Broker, BrokerConfig, BrokerError};
use relay_protocol::api::MentionSkipped;
use relay_protocol::domain::{
    AgentSpec, ApprovalKind, ApprovalRequest, ConversationKind, ConversationSpec, FlightChange,
    FlightState, Harness, InvokeRequest, MentionSkip, PostMessage, DEFAULT_CONVERSATION,
};
use tokio_util::sync::CancellationToken;

use FlightState::*;

async fn broker() -> Broker {
    let store = Store::temporary().unwrap();
    let config = BrokerConfig {
        max_message_bytes: 1000,
        max_depth: 2,
        ..BrokerConfig::default()
    };
    let (b, _task) = Broker::start(store, config, CancellationToken::new())
        .await
        .unwrap();
    b
}

fn spec(name: &str) -> AgentSpec {
    AgentSpec::new(name, Harness::CodexAppServer, "/tmp")
}

fn invoke(target: &str) -> InvokeRequest {
    InvokeRequest::new(target, "do it")
}

/// A message from `author` to the default conversation.
fn said(author: &str, body: &str) -> PostMessage {
    PostMessage {
        conversation: DEFAULT_CONVERSATION.into(),
        author: author.into(),
        body: body.into(),
        class: Default::default(),
        reply_to: None,
        meta: Default::default(),
    }
}

fn to(state: FlightState) -> FlightChange {
    FlightChange::State {
        to: state,
        reason: Some(format!("to {state}")),
        output: Some("the answer".into()),
    }
}

/// The legal transitions, written out independently of the implementation.
fn legal(from: FlightState, to: FlightState) -> bool {
    matches!(
        (from, to),
        (Queued, Waking | Running | Failed | Cancelled)
            | (Waking, Running | Failed | Cancelled)
            | (Running, Waiting | Completed | Failed | Cancelled)
            | (Waiting, Running | Completed | Failed | Cancelled)
    )
}

/// Legal steps that bring a new flight to `state`.
fn path_to(state: FlightState) -> Vec<FlightState> {
    match state {
        Queued => vec![],
        Waking => vec![Waking],
        Running => vec![Running],
        Waiting => vec![Running, Waiting],
        Completed => vec![Running, Completed],
        Failed => vec![Failed],
        Cancelled => vec![Cancelled],
    }
}

#[tokio::test]
async fn every_transition_is_legal_or_a_typed_error() {
    let b = broker().await;
    b.register_agent(spec("a1")).await.unwrap();
    for from in FlightState::ALL {
        for target in FlightState::ALL {
            let f = b.invoke(invoke("a1")).await.unwrap().flight;
            for step in path_to(from) {
                b.update_flight(&f.id, to(step)).await.unwrap();
            }
            let before = b.store().flight(&f.id).unwrap().unwrap();
            assert_eq!(before.state, from);
            let seq_before = b.last_seq();
            let result = b.update_flight(&f.id, to(target)).await;
            let after = b.store().flight(&f.id).unwrap().unwrap();
            if from == target {
                // An identical update is skipped: no event, nothing changes.
                let r = result.unwrap();
                assert!(!r.applied, "{from} -> {target} should be skipped");
                assert_eq!(after, before);
                assert_eq!(b.last_seq(), seq_before);
            } else if legal(from, target) {
                let r = result.unwrap_or_else(|e| panic!("{from} -> {target}: {e}"));
                assert!(r.applied);
                assert_eq!(after.state, target);
                assert_eq!(after.update_seq, before.update_seq + 1);
            } else {
                let err = result.expect_err(&format!("{from} -> {target} must fail"));
                if from.is_terminal() {
                    assert!(
                        matches!(err, BrokerError::FlightTerminal { state, .. } if state == from),
                        "{from} -> {target}: {err:?}"
                    );
                } else {
                    assert!(
                        matches!(err, BrokerError::IllegalTransition { from: f2, to: t2, .. } if f2 == from && t2 == target),
                        "{from} -> {target}: {err:?}"
                    );
                }
                assert_eq!(after, before, "a refused update changes nothing");
                assert_eq!(b.last_seq(), seq_before, "a refused update writes no event");
            }
        }
    }
}

#[tokio::test]
async fn terminal_flights_refuse_every_later_change() {
    let b = broker().await;
    b.register_agent(spec("a1")).await.unwrap();
    let f = b.invoke(invoke("a1")).await.unwrap().flight;
    b.update_flight(&f.id, to(Running)).await.unwrap();
    b.update_flight(&f.id, FlightChange::Delta { text: "hel".into() })
        .await
        .unwrap();
    b.update_flight(&f.id, to(Completed)).await.unwrap();
    for change in [
        FlightChange::Delta { text: "lo".into() },
        FlightChange::Note {
            text: "late".into(),
            by: None,
        },
        to(Running),
        to(Failed),
    ] {
        let err = b.update_flight(&f.id, change).await.unwrap_err();
        assert!(matches!(
            err,
            BrokerError::FlightTerminal {
                state: Completed,
                ..
            }
        ));
    }
    // Completing again is the identical update: skipped, not an error.
    assert!(!b.update_flight(&f.id, to(Completed)).await.unwrap().applied);
    let updates = b.store().flight_updates(&f.id, 0).unwrap();
    assert_eq!(
        updates.iter().map(|u| u.seq).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
}

#[tokio::test]
async fn completion_posts_the_reply_in_the_conversation() {
    let b = broker().await;
    b.register_agent(spec("a1")).await.unwrap();
    let acc = b.invoke(invoke("a1")).await.unwrap();
    b.update_flight(&acc.flight.id, to(Running)).await.unwrap();
    let done = b
        .update_flight(&acc.flight.id, to(Completed))
        .await
        .unwrap();
    let reply_id = done.flight.reply_message.expect("reply message");
    let reply = b.store().message(&reply_id).unwrap().unwrap();
    assert_eq!(reply.body, "the answer");
    assert_eq!(reply.author, "a1");
    assert_eq!(
        reply.reply_to.as_deref(),
        Some(acc.invocation.request_message.as_str())
    );
    assert_eq!(reply.meta.flight.as_deref(), Some(acc.flight.id.as_str()));
    assert_eq!(
        reply.meta.invocation.as_deref(),
        Some(acc.invocation.id.as_str())
    );
    assert_eq!(reply.conversation, "direct.a1.operator");
}

#[tokio::test]
async fn bad_input_is_a_typed_error_and_writes_nothing() {
    let b = broker().await;
    b.register_agent(spec("a1")).await.unwrap();
    let seq = b.last_seq();
    let post = |conversation: &str, body: &str| PostMessage {
        conversation: conversation.into(),
        ..said("me", body)
    };
    assert!(matches!(
        b.post_message(post("nope", "hi")).await,
        Err(BrokerError::UnknownConversation(c)) if c == "nope"
    ));
    assert!(matches!(
        b.post_message(post(DEFAULT_CONVERSATION, &"x".repeat(1001)))
            .await,
        Err(BrokerError::TooLarge {
            size: 1001,
            limit: 1000,
            ..
        })
    ));
    assert!(matches!(
        b.post_message(post(DEFAULT_CONVERSATION, "   ")).await,
        Err(BrokerError::BadInput(_))
    ));
    let mut reply = post(DEFAULT_CONVERSATION, "hi");
    reply.reply_to = Some("msg_missing".into());
    assert!(matches!(
        b.post_message(reply).await,
        Err(BrokerError::UnknownMessage(_))
    ));
    assert!(matches!(
        b.invoke(invoke("ghost")).await,
        Err(BrokerError::UnknownAgent(a)) if a == "ghost"
    ));
    assert!(matches!(
        b.register_agent(spec("a1")).await,
        Err(BrokerError::AgentExists(_))
    ));
    assert!(matches!(
        b.register_agent(spec("no spaces")).await,
        Err(BrokerError::BadInput(_))
    ));
    // Relay's own names and the operator's name no agent, whatever its case: an
    // agent `relay` would author what reads as Relay's messages.
    for reserved in ["operator", "relay", "nats", "Operator", "NATS"] {
        let e = b.register_agent(spec(reserved)).await.unwrap_err();
        assert!(matches!(e, BrokerError::BadInput(_)), "{reserved}: {e}");
        assert!(e.to_string().contains("Relay's own"), "{reserved}: {e}");
    }
    assert!(matches!(
        b.update_flight("flt_missing", to(Running)).await,
        Err(BrokerError::UnknownFlight(_))
    ));
    assert_eq!(b.last_seq(), seq, "nothing was written");
    assert!(b.store().verify().unwrap().is_consistent());
}

/// What a refused command must fail with.
type Expect = fn(&BrokerError) -> bool;

fn invalid(e: &BrokerError) -> bool {
    matches!(e, BrokerError::BadInput(_))
}

#[tokio::test]
async fn empty_and_oversized_fields_are_typed_errors_and_write_nothing() {
    let b = broker().await;
    b.register_agent(spec("a1")).await.unwrap();
    let seq = b.last_seq();
    let post = said;
    let task = |requester: &str, task: &str| InvokeRequest {
        task: task.into(),
        requester: requester.into(),
        ..invoke("a1")
    };
    let agent = |f: fn(&mut AgentSpec)| {
        let mut s = spec("a2");
        f(&mut s);
        s
    };
    let conversation = |id: String| ConversationSpec {
        id,
        kind: ConversationKind::Channel,
        title: None,
        participants: vec![],
        parent: None,
    };
    let max = 1000;
    let cases: Vec<(&str, Result<(), BrokerError>, Expect)> = vec![
        (
            "empty message body",
            b.post_message(post("me", "")).await.map(drop),
            invalid,
        ),
        (
            "message body over the limit",
            b.post_message(post("me", &"x".repeat(max + 1)))
                .await
                .map(drop),
            |e| {
                matches!(
                    e,
                    BrokerError::TooLarge {
                        what: "message body",
                        size: 1001,
                        limit: 1000
                    }
                )
            },
        ),
        (
            "empty author",
            b.post_message(post("", "hi")).await.map(drop),
            invalid,
        ),
        (
            "blank author",
            b.post_message(post(" ", "hi")).await.map(drop),
            invalid,
        ),
        (
            "author over 128 characters",
            b.post_message(post(&"a".repeat(129), "hi")).await.map(drop),
            invalid,
        ),
        (
            "empty task",
            b.invoke(task("operator", "")).await.map(drop),
            invalid,
        ),
        (
            "task over the limit",
            b.invoke(task("operator", &"x".repeat(max + 1)))
                .await
                .map(drop),
            |e| {
                matches!(
                    e,
                    BrokerError::TooLarge {
                        what: "task",
                        size: 1001,
                        limit: 1000
                    }
                )
            },
        ),
        (
            "empty requester",
            b.invoke(task("", "do it")).await.map(drop),
            invalid,
        ),
        (
            "requester over 128 characters",
            b.invoke(task(&"r".repeat(129), "do it")).await.map(drop),
            invalid,
        ),
        (
            "empty agent name",
            b.register_agent(agent(|s| s.name = String::new()))
                .await
                .map(drop),
            invalid,
        ),
        (
            "agent name over 64 bytes",
            b.register_agent(agent(|s| s.name = "a".repeat(65)))
                .await
                .map(drop),
            invalid,
        ),
        (
            "empty cwd",
            b.register_agent(agent(|s| s.cwd = " ".into()))
                .await
                .map(drop),
            invalid,
        ),
        (
            "empty node name",
            b.register_agent(agent(|s| s.node = Some(String::new())))
                .await
                .map(drop),
            invalid,
        ),
        (
            "empty secret name",
            b.register_agent(agent(|s| {
                s.secrets.0.insert(String::new(), "v".into());
            }))
            .await
            .map(drop),
            invalid,
        ),
        (
            "secret name over 256 bytes",
            b.register_agent(agent(|s| {
                s.secrets.0.insert("K".repeat(257), "v".into());
            }))
            .await
            .map(drop),
            invalid,
        ),
        (
            "empty conversation id",
            b.create_conversation(conversation(String::new()))
                .await
                .map(drop),
            invalid,
        ),
        (
            "conversation id over 200 bytes",
            b.create_conversation(conversation("c".repeat(201)))
                .await
                .map(drop),
            invalid,
        ),
        (
            "conversation id with an empty word",
            b.create_conversation(conversation("channel..x".into()))
                .await
                .map(drop),
            invalid,
        ),
    ];
    for (what, result, expected) in cases {
        match result {
            Err(e) => assert!(expected(&e), "{what}: {e:?}"),
            Ok(()) => panic!("{what}: accepted"),
        }
    }
    assert_eq!(b.last_seq(), seq, "nothing was written");
    assert!(b.store().verify().unwrap().is_consistent());

    // At the limits, each is accepted.
    b.post_message(post(&"a".repeat(128), &"x".repeat(max)))
        .await
        .unwrap();
    b.invoke(task(&"r".repeat(128), &"x".repeat(max)))
        .await
        .unwrap();
    b.register_agent(agent(|s| s.name = "a".repeat(64)))
        .await
        .unwrap();
    b.create_conversation(conversation("c".repeat(200)))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_stored_value_of_an_unknown_version_is_a_typed_error() {
    use relay_broker::store::{decode, encode, T};
    let good = encode(&spec("a1")).unwrap();
    let with_version = |v: u8| [&[v][..], &good[1..]].concat();
    let cases: Vec<(&str, Vec<u8>, Expect)> = vec![
        (
            "a version from the future",
            with_version(2),
            |e| matches!(e, BrokerError::Corrupt(m) if m.contains("version 2")),
        ),
        (
            "version 0",
            with_version(0),
            |e| matches!(e, BrokerError::Corrupt(m) if m.contains("version 0")),
        ),
        ("an empty value", Vec::new(), |e| {
            matches!(e, BrokerError::Corrupt(_))
        }),
        ("the right version, no JSON", vec![good[0], b'{'], |e| {
            matches!(e, BrokerError::Json(_))
        }),
    ];
    for (what, bytes, expected) in &cases {
        let e = decode::<AgentSpec>(bytes).unwrap_err();
        assert!(expected(&e), "{what}: {e:?}");
    }
    assert_eq!(decode::<AgentSpec>(&good).unwrap(), spec("a1"));

    // Read through the store, a record of another version is the same typed error, not
    // a value read as if it were this build's.
    let b = broker().await;
    b.register_agent(spec("a1")).await.unwrap();
    let stored = b.store().tree(T::Agents).get("a1").unwrap().unwrap();
    let future = [&[2][..], &stored[1..]].concat();
    b.store().tree(T::Agents).insert("a1", future).unwrap();
    assert!(matches!(
        b.store().agent("a1"),
        Err(BrokerError::Corrupt(m)) if m.contains("version 2")
    ));
}

#[tokio::test]
async fn agent_to_agent_depth_and_cycles_are_limited() {
    let b = broker().await;
    for n in ["a", "b", "c", "d"] {
        b.register_agent(spec(n)).await.unwrap();
    }
    let root = b.invoke(invoke("a")).await.unwrap().flight;
    let child = |parent: &str, target: &str| {
        let mut r = invoke(target);
        r.parent_flight = Some(parent.into());
        r.requester = "agent".into();
        r
    };
    let f_b = b.invoke(child(&root.id, "b")).await.unwrap();
    assert_eq!(f_b.invocation.depth, 1);
    assert!(matches!(
        b.invoke(child(&f_b.flight.id, "a")).await,
        Err(BrokerError::Cycle { agent }) if agent == "a"
    ));
    let f_c = b.invoke(child(&f_b.flight.id, "c")).await.unwrap();
    assert_eq!(f_c.invocation.depth, 2);
    assert!(matches!(
        b.invoke(child(&f_c.flight.id, "d")).await,
        Err(BrokerError::DepthLimit { depth: 3, limit: 2 })
    ));
}

/// The flights of `agent`, oldest first.
fn flights_of(b: &Broker, agent: &str) -> Vec<relay_protocol::domain::Flight> {
    let mut all: Vec<relay_protocol::domain::Flight> =
        b.store().values(relay_broker::store::T::Flights).unwrap();
    all.retain(|f| f.agent == agent);
    all.sort_by(|x, y| x.id.cmp(&y.id));
    all
}

fn deliveries_of(b: &Broker, message: &str) -> Vec<relay_protocol::domain::Delivery> {
    let mut d = b.store().deliveries().unwrap();
    d.retain(|d| d.message == message);
    d.sort_by_key(|d| (d.target.clone(), d.reason as u8));
    d
}

#[tokio::test]
async fn mentions_plan_deterministic_deliveries_once() {
    let b = broker().await;
    b.register_agent(spec("a1")).await.unwrap();
    let m = b
        .post_message(said("me", "@a1 look, @a1 again, @nobody"))
        .await
        .unwrap()
        .message;
    assert_eq!(m.mentions, vec!["a1", "nobody"]);
    let deliveries = b.store().deliveries().unwrap();
    assert_eq!(deliveries.len(), 1);
    assert_eq!(deliveries[0].target, "a1");
    assert_eq!(
        deliveries[0].id,
        relay_protocol::domain::delivery_id(
            &m.id,
            "a1",
            relay_protocol::domain::DeliveryReason::Mention,
            Harness::CodexAppServer
        )
    );
}

#[tokio::test]
async fn a_mention_consults_each_agent_once_and_its_turn_delivers_the_message() {
    use relay_protocol::domain::{Action, DeliveryReason, DeliveryState, Invocation, MessageClass};
    let b = broker().await;
    for n in ["a1", "a2"] {
        b.register_agent(spec(n)).await.unwrap();
    }
    let body = "@a1 look, @a2, @a1 again, @nobody, @me";
    let posted = b.post_message(said("me", body)).await.unwrap();
    let m = posted.message;
    assert!(posted.refused.is_empty());
    assert_eq!(
        posted
            .flights
            .iter()
            .map(|f| f.agent.as_str())
            .collect::<Vec<_>>(),
        vec!["a1", "a2"]
    );
    for f in &posted.flights {
        assert_eq!(f.state, Queued);
        assert_eq!(f.conversation, DEFAULT_CONVERSATION);
        let inv = b.store().invocation(&f.invocation).unwrap().unwrap();
        assert_eq!(
            inv,
            Invocation {
                id: f.invocation.clone(),
                requester: "me".into(),
                target: f.agent.clone(),
                action: Action::Consult,
                task: format!(
                    "me mentioned you in conversation {DEFAULT_CONVERSATION} (message {}); \
                     your answer is posted there, in reply to it:\n\n{body}",
                    m.id
                ),
                conversation: DEFAULT_CONVERSATION.into(),
                request_message: m.id.clone(),
                parent_flight: None,
                depth: 0,
                timeout_ms: None,
                created_at: inv.created_at,
            }
        );
        assert_eq!(b.flight(&f.id).await.unwrap().as_ref(), Some(f));
    }
    // The message itself is the request: no copy of it is posted.
    assert_eq!(
        b.store().messages(DEFAULT_CONVERSATION, 10).unwrap(),
        vec![m.clone()]
    );
    let planned = deliveries_of(&b, &m.id);
    assert_eq!(
        planned
            .iter()
            .map(|d| (d.target.as_str(), d.reason, d.state))
            .collect::<Vec<_>>(),
        vec![
            ("a1", DeliveryReason::Mention, DeliveryState::Pending),
            ("a2", DeliveryReason::Mention, DeliveryState::Pending),
        ]
    );

    // a1's turn runs: its delivery is made; it answers in reply to the message.
    let f1 = &posted.flights[0];
    b.update_flight(&f1.id, to(Running)).await.unwrap();
    let settled = deliveries_of(&b, &m.id);
    assert_eq!(settled[0].state, DeliveryState::Delivered);
    assert!(settled[0].attempts[0].ok);
    assert_eq!(settled[1].state, DeliveryState::Pending);
    let done = b.update_flight(&f1.id, to(Completed)).await.unwrap();
    let reply = b
        .store()
        .message(done.flight.reply_message.as_deref().unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(
        (
            reply.author.as_str(),
            reply.reply_to.as_deref(),
            reply.conversation.as_str()
        ),
        ("a1", Some(m.id.as_str()), DEFAULT_CONVERSATION)
    );
    // a2's flight fails before its turn: so does its delivery.
    b.update_flight(&posted.flights[1].id, to(Failed))
        .await
        .unwrap();
    let d2 = &deliveries_of(&b, &m.id)[1];
    assert_eq!(
        (d2.state, d2.attempts[0].error.as_deref()),
        (DeliveryState::Failed, Some("to failed"))
    );

    // Mentioning oneself, an unknown name, in a machine-made message or in an ask's
    // task consults nobody and plans nothing.
    let before = b.store().deliveries().unwrap().len();
    let own = b
        .post_message(said("a1", "@a1 note to self @ghost"))
        .await
        .unwrap();
    assert!(own.flights.is_empty() && own.refused.is_empty());
    assert_eq!(own.unknown, vec!["ghost"]);
    assert_eq!(
        own.skipped,
        vec![MentionSkipped {
            name: "a1".into(),
            reason: MentionSkip::Author
        }]
    );
    let mut status = said("me", "@a1 @a2 build done");
    status.class = MessageClass::Status;
    assert!(b.post_message(status).await.unwrap().flights.is_empty());
    let mut ask = invoke("a1");
    ask.task = "@a2 what do you think?".into();
    let asked = b.invoke(ask).await.unwrap();
    assert_eq!(flights_of(&b, "a2").len(), 1);
    assert_eq!(
        deliveries_of(&b, &asked.invocation.request_message)
            .iter()
            .map(|d| (d.target.as_str(), d.reason))
            .collect::<Vec<_>>(),
        vec![("a1", DeliveryReason::Invocation)]
    );
    assert_eq!(b.store().deliveries().unwrap().len(), before + 1);
    // A message the asker posts in the same direct conversation, not an ask, is
    // delivered to the other participant.
    let mut aside = said(&asked.invocation.requester, "and one more thing");
    aside.conversation = asked.invocation.conversation.clone();
    let aside = b.post_message(aside).await.unwrap().message;
    assert_eq!(
        deliveries_of(&b, &aside.id)
            .iter()
            .map(|d| (d.target.as_str(), d.reason))
            .collect::<Vec<_>>(),
        vec![("a1", DeliveryReason::DirectMessage)]
    );
}

#[tokio::test]
async fn mentions_in_an_agents_words_are_children_of_its_flight_under_the_loop_rules() {
    use relay_protocol::domain::{DeliveryState, MessageClass, MessageMeta};
    let b = broker().await; // max_depth 2
    for n in ["a", "b", "c", "d"] {
        b.register_agent(spec(n)).await.unwrap();
    }
    let complete = |flight: String, answer: &'static str| {
        let b = b.clone();
        async move {
            b.update_flight(&flight, to(Running)).await.unwrap();
            let done = b
                .update_flight(
                    &flight,
                    FlightChange::State {
                        to: Completed,
                        reason: None,
                        output: Some(answer.into()),
                    },
                )
                .await
                .unwrap();
            b.store()
                .message(done.flight.reply_message.as_deref().unwrap())
                .unwrap()
                .unwrap()
        }
    };
    let root = b.post_message(said("operator", "@a start")).await.unwrap();
    let fa = root.flights[0].clone();
    assert_eq!(fa.parent_flight, None);

    // a's answer mentions b: b is consulted as a child of a's flight.
    let a_said = complete(fa.id.clone(), "@b your turn").await;
    let fb = flights_of(&b, "b").pop().unwrap();
    let inv_b = b.store().invocation(&fb.invocation).unwrap().unwrap();
    assert_eq!(
        (
            inv_b.requester.as_str(),
            inv_b.request_message.as_str(),
            inv_b.parent_flight.as_deref(),
            inv_b.depth
        ),
        ("a", a_said.id.as_str(), Some(fa.id.as_str()), 1)
    );

    // b's answer mentions a: a cycle. The answer stands; the mention is refused, its
    // delivery failed and answered by Relay with why.
    let b_said = complete(fb.id.clone(), "@a back to you").await;
    assert_eq!(flights_of(&b, "a").len(), 1);
    let refusal = b
        .store()
        .messages(DEFAULT_CONVERSATION, 1)
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(
        (
            refusal.author.as_str(),
            refusal.class,
            refusal.reply_to.as_deref()
        ),
        ("relay", MessageClass::System, Some(b_said.id.as_str()))
    );
    assert_eq!(
        refusal.body,
        "a was not consulted: cycle: agent \"a\" is already working on an ancestor flight"
    );
    let d = deliveries_of(&b, &b_said.id).pop().unwrap();
    assert_eq!(
        (d.target.as_str(), d.state, d.attempts[0].error.as_deref()),
        ("a", DeliveryState::Failed, Some(refusal.body.as_str()))
    );
    assert!(deliveries_of(&b, &refusal.id).is_empty());

    // What an agent posts during its flight (`meta.flight`) counts as its words too: c
    // is a's child, d and b c's (depth 2), and anyone d mentions would be one level too
    // deep. The post stands and says so.
    let during = |author: &str, flight: &str, body: &str| {
        let mut p = said(author, body);
        p.meta = MessageMeta {
            flight: Some(flight.into()),
            ..Default::default()
        };
        p
    };
    // (Only the flight the author is running counts: a's first one ended.)
    let fa = b.invoke(invoke("a")).await.unwrap().flight;
    b.update_flight(&fa.id, to(Running)).await.unwrap();
    let from_a = b.post_message(during("a", &fa.id, "@c")).await.unwrap();
    let fc = &from_a.flights[0];
    assert_eq!(
        (
            fc.parent_flight.as_deref(),
            b.store().invocation(&fc.invocation).unwrap().unwrap().depth
        ),
        (Some(fa.id.as_str()), 1)
    );
    b.update_flight(&fc.id, to(Running)).await.unwrap();
    let deep = b
        .post_message(during("c", &fc.id, "@d and @b"))
        .await
        .unwrap();
    let fd = &deep.flights[0];
    assert_eq!(fd.agent, "d");
    assert_eq!(
        b.store().invocation(&fd.invocation).unwrap().unwrap().depth,
        2
    );
    assert_eq!(deep.flights.len(), 2);
    b.update_flight(&fd.id, to(Running)).await.unwrap();
    let too_deep = b.post_message(during("d", &fd.id, "@b ok?")).await.unwrap();
    assert!(too_deep.flights.is_empty());
    assert_eq!(too_deep.refused.len(), 1);
    assert_eq!(
        (
            too_deep.refused[0].agent.as_str(),
            too_deep.refused[0].error.code
        ),
        ("b", relay_protocol::api::ErrorCode::DepthLimit)
    );
    assert_eq!(
        too_deep.refused[0].error.message,
        "invocation depth 3 exceeds the limit of 2"
    );

    // A flight that is not the author's makes no parent: the consult is a root one.
    let not_hers = b
        .post_message(during("operator", &fd.id, "@b hi"))
        .await
        .unwrap();
    assert_eq!(not_hers.flights[0].parent_flight, None);
}

#[tokio::test]
async fn a_redelivered_node_report_is_applied_once() {
    use relay_broker::{Command, Outcome};
    let b = broker().await;
    let mut remote = spec("a1");
    remote.node = Some("n1".into());
    b.register_agent(remote).await.unwrap();
    let f = b.invoke(invoke("a1")).await.unwrap().flight;
    b.update_flight(&f.id, to(Running)).await.unwrap();
    let report_in = |stream: i64, seq: u64, text: &str| Command::FromNode {
        node: "n1".into(),
        stream,
        stream_seq: seq,
        command: Box::new(Command::UpdateFlight {
            flight: f.id.clone(),
            change: FlightChange::Delta { text: text.into() },
        }),
    };
    let report = |seq: u64, text: &str| report_in(1, seq, text);
    assert!(matches!(
        b.execute(report(7, "a")).await.unwrap(),
        Outcome::Flight(_)
    ));
    let seq = b.last_seq();
    // The same report again (a redelivery after a crash), and an older one: skipped.
    assert!(matches!(
        b.execute(report(7, "a")).await.unwrap(),
        Outcome::Done
    ));
    assert!(matches!(
        b.execute(report(3, "old")).await.unwrap(),
        Outcome::Done
    ));
    assert_eq!(b.last_seq(), seq, "nothing written for duplicates");
    // A newer one applies; a refused one still moves the cursor past it.
    assert!(matches!(
        b.execute(report(8, "b")).await.unwrap(),
        Outcome::Flight(_)
    ));
    let deltas: Vec<String> = b
        .store()
        .flight_updates(&f.id, 0)
        .unwrap()
        .into_iter()
        .filter_map(|u| match u.change {
            FlightChange::Delta { text } => Some(text),
            _ => None,
        })
        .collect();
    assert_eq!(deltas, vec!["a", "b"]);
    let refused = Command::FromNode {
        node: "n1".into(),
        stream: 1,
        stream_seq: 9,
        command: Box::new(Command::UpdateFlight {
            flight: "flt_missing".into(),
            change: FlightChange::Delta { text: "x".into() },
        }),
    };
    assert!(b.execute(refused).await.is_err());
    assert!(matches!(
        b.execute(report(9, "again")).await.unwrap(),
        Outcome::Done
    ));
    // A report stream made anew (a nats-server back with an empty store) starts its
    // seqs again: its first report applies, and the cursor follows the new stream.
    assert!(matches!(
        b.execute(report_in(2, 1, "c")).await.unwrap(),
        Outcome::Flight(_)
    ));
    assert!(matches!(
        b.execute(report_in(2, 1, "c")).await.unwrap(),
        Outcome::Done
    ));
    let last = b.store().flight_updates(&f.id, 0).unwrap().pop().unwrap();
    assert!(
        matches!(&last.change, FlightChange::Delta { text } if text == "c"),
        "{last:?}"
    );
    // Another node may not report on n1's agent, nor ask approvals for its flights.
    let seq = b.last_seq();
    for (stream_seq, command) in [
        Command::UpdateFlight {
            flight: f.id.clone(),
            change: to(Failed),
        },
        Command::RequestApproval {
            agent: "a1".into(),
            request: ApprovalRequest {
                flight: f.id.clone(),
                kind: ApprovalKind::Command,
                detail: "cargo test".into(),
                reason: None,
                harness_request_id: "3".into(),
            },
        },
    ]
    .into_iter()
    .enumerate()
    {
        let err = b
            .execute(Command::FromNode {
                node: "n2".into(),
                stream: 1,
                stream_seq: stream_seq as u64 + 1,
                command: Box::new(command),
            })
            .await
            .unwrap_err();
        assert!(err.to_string().contains("its own agents"), "{err}");
    }
    assert_eq!(
        b.last_seq(),
        seq,
        "nothing written for another node's reports"
    );
    assert!(b.store().verify().unwrap().is_consistent());
}

#[tokio::test]
async fn an_approval_is_asked_for_the_asking_agents_flight_only() {
    let b = broker().await;
    b.register_agent(spec("a1")).await.unwrap();
    b.register_agent(spec("a2")).await.unwrap();
    let f = b.invoke(invoke("a1")).await.unwrap().flight;
    let err = b
        .execute(relay_broker::Command::RequestApproval {
            agent: "a2".into(),
            request: ApprovalRequest {
                flight: f.id.clone(),
                kind: ApprovalKind::Command,
                detail: "cargo test".into(),
                reason: None,
                harness_request_id: "0".into(),
            },
        })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not agent"), "{err}");
}

#[tokio::test]
async fn a_burst_of_commands_is_group_committed() {
    let store = Store::temporary().unwrap();
    let (b, _task) = Broker::start(store, BrokerConfig::default(), CancellationToken::new())
        .await
        .unwrap();
    let before = b.store().flushes();
    const N: usize = 500;
    let mut replies = Vec::new();
    for i in 0..N {
        let command = relay_broker::Command::PostMessage(PostMessage {
            conversation: DEFAULT_CONVERSATION.into(),
            author: "me".into(),
            body: format!("message {i}").into(),
            class: Default::default(),
            reply_to: None,
            meta: Default::default(),
        });
        replies.push(b.submit(command).await.unwrap());
    }
    for reply in replies {
        reply.await.unwrap().unwrap();
    }
    let flushes = b.store().flushes() - before;
    // Every command was acknowledged after a flush, yet far fewer flushes than commands.
    assert!(flushes >= 1, "no flush at all");
    assert!(
        flushes * 10 <= N as u64,
        "{flushes} flushes for {N} commands"
    );
    assert_eq!(
        b.store().messages(DEFAULT_CONVERSATION, N).unwrap().len(),
        N
    );
}

#[tokio::test]
async fn a_tasks_delivery_is_settled_by_how_its_flight_starts() {
    use relay_protocol::domain::{DeliveryReason, DeliveryState};
    let b = broker().await;
    b.register_agent(spec("a1")).await.unwrap();
    let of = |message: &str| {
        let mut d: Vec<_> = b
            .store()
            .deliveries()
            .unwrap()
            .into_iter()
            .filter(|d| d.message == message)
            .collect();
        d.sort_by_key(|d| d.reason as u8);
        d
    };
    // Runs: the task reached the agent.
    let ran = b.invoke(invoke("a1")).await.unwrap();
    let pending = of(&ran.invocation.request_message);
    assert!(pending
        .iter()
        .any(|d| d.reason == DeliveryReason::Invocation && d.state == DeliveryState::Pending));
    b.update_flight(&ran.flight.id, to(Waking)).await.unwrap();
    b.update_flight(&ran.flight.id, to(Running)).await.unwrap();
    let settled = of(&ran.invocation.request_message);
    assert_eq!(settled.len(), pending.len());
    for d in &settled {
        assert_eq!(d.state, DeliveryState::Delivered, "{d:?}");
        assert_eq!(d.attempts.len(), 1);
        assert!(d.attempts[0].ok);
    }
    // A later change records nothing more.
    b.update_flight(&ran.flight.id, to(Completed))
        .await
        .unwrap();
    assert_eq!(of(&ran.invocation.request_message), settled);

    // Fails before its turn: the delivery failed, with the flight's reason.
    let failed = b.invoke(invoke("a1")).await.unwrap();
    b.update_flight(&failed.flight.id, to(Failed))
        .await
        .unwrap();
    for d in of(&failed.invocation.request_message) {
        assert_eq!(d.state, DeliveryState::Failed, "{d:?}");
        assert_eq!(d.attempts[0].error.as_deref(), Some("to failed"));
    }
}

#[tokio::test]
async fn status_counts_follow_every_change_and_match_a_scan_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let scan = |store: &Store| {
        let flights: Vec<relay_protocol::domain::Flight> =
            store.values(relay_broker::store::T::Flights).unwrap();
        relay_broker::broker::StatusCounts {
            agents: store.tree(relay_broker::store::T::Agents).len() as u64,
            flights: flights.len() as u64,
            live_flights: flights.iter().filter(|f| !f.state.is_terminal()).count() as u64,
        }
    };
    let expected = {
        let (b, stop, writer) = start_on(&path).await;
        for name in ["a", "b", "c"] {
            b.register_agent(spec(name)).await.unwrap();
        }
        b.remove_agent("c").await.unwrap();
        b.register_agent(spec("c")).await.unwrap();
        b.remove_agent("b").await.unwrap();
        let mut flights = Vec::new();
        for _ in 0..6 {
            flights.push(b.invoke(invoke("a")).await.unwrap().flight.id);
        }
        for state in [Running, Completed] {
            b.update_flight(&flights[0], to(state)).await.unwrap();
        }
        b.update_flight(&flights[1], to(Cancelled)).await.unwrap();
        b.update_flight(&flights[2], to(Failed)).await.unwrap();
        // Refused changes count nothing.
        assert!(b.update_flight(&flights[2], to(Cancelled)).await.is_err());
        b.update_flight(&flights[3], to(Running)).await.unwrap();
        let counts = b.counts();
        assert_eq!(
            counts,
            relay_broker::broker::StatusCounts {
                agents: 2,
                flights: 6,
                live_flights: 3
            }
        );
        assert_eq!(counts, scan(b.store()));
        stop_on(b, stop, writer).await;
        counts
    };
    let (b, stop, writer) = start_on(&path).await;
    assert_eq!(b.counts(), expected);

    // Live listings read an index that follows the flights (and is checked by doctor).
    let live_ids = |store: &Store| -> Vec<String> {
        store
            .live_flights()
            .unwrap()
            .into_iter()
            .map(|f| f.id)
            .collect()
    };
    let scanned: Vec<String> = store_scan_live(b.store());
    assert_eq!(live_ids(b.store()), scanned);
    assert!(b.store().verify().unwrap().is_consistent());
    stop_on(b, stop, writer).await;

    // A database from before the index: built at the first open.
    {
        let store = support::reopen(&path).await;
        store
            .tree(relay_broker::store::T::LiveFlights)
            .clear()
            .unwrap();
        store.tree(relay_broker::store::T::Meta).clear().unwrap();
        store.durable().db().flush().unwrap();
    }
    let store = Store::open(&path).unwrap();
    assert_eq!(live_ids(&store), scanned);
    assert!(store.verify().unwrap().is_consistent());
}

/// Each flight's task is delivered once, as its turn starts (or fails, as it ends before
/// it), whether its delivery was planned by this broker or before a restart, with many
/// flights started at once: asks and mention consults.
#[tokio::test]
async fn deliveries_settle_once_whether_planned_before_or_after_a_restart() {
    use relay_protocol::domain::{DeliveryReason, DeliveryState};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    // Flights to start: (flight, request message, the reason its delivery has).
    let mut flights = Vec::new();
    let plan = |b: Broker| async move {
        let mut planned = Vec::new();
        for _ in 0..8 {
            let asked = b.invoke(invoke("a")).await.unwrap();
            planned.push((
                asked.flight.id,
                asked.invocation.request_message,
                DeliveryReason::Invocation,
            ));
            let posted = b.post_message(said("me", "@a have a look")).await.unwrap();
            planned.push((
                posted.flights[0].id.clone(),
                posted.message.id,
                DeliveryReason::Mention,
            ));
        }
        planned
    };
    {
        let (b, stop, writer) = start_on(&path).await;
        b.register_agent(spec("a")).await.unwrap();
        flights.extend(plan(b.clone()).await);
        stop_on(b, stop, writer).await;
    }
    let (b, stop, writer) = start_on(&path).await;
    flights.extend(plan(b.clone()).await);
    // Half of each start, half fail before their turn: all at once.
    let outcomes: Vec<FlightState> = (0..flights.len())
        .map(|i| if i % 4 < 2 { Running } else { Failed })
        .collect();
    futures::future::join_all(flights.iter().zip(&outcomes).map(|((f, _, _), state)| {
        let b = b.clone();
        async move { b.update_flight(f, to(*state)).await.unwrap() }
    }))
    .await;
    for ((flight, message, reason), state) in flights.iter().zip(&outcomes) {
        let d = deliveries_of(&b, message);
        assert_eq!(d.len(), 1, "{flight}: {d:?}");
        let expected = match state {
            Running => DeliveryState::Delivered,
            _ => DeliveryState::Failed,
        };
        assert_eq!(
            (
                d[0].target.as_str(),
                d[0].reason,
                d[0].state,
                d[0].attempts.len()
            ),
            ("a", *reason, expected, 1),
            "{flight}"
        );
    }
    // Ending a started flight attempts nothing more.
    for ((flight, message, _), state) in flights.iter().zip(&outcomes) {
        if *state == Running {
            b.update_flight(flight, to(Completed)).await.unwrap();
            assert_eq!(deliveries_of(&b, message)[0].attempts.len(), 1);
        }
    }
    assert!(b.store().verify().unwrap().is_consistent());
    stop_on(b, stop, writer).await;
}

/// `busy` is derived from the flights, not stored: an agent is shown busy while a flight
/// of its runs a turn (running or waiting) and idle otherwise, with flights of several
/// agents changing at once and across a restart; a runtime that still reports `busy`
/// (a node from before) writes nothing.
#[tokio::test]
async fn an_agent_is_busy_while_a_flight_of_its_runs_and_busy_is_never_stored() {
    use relay_broker::Command;
    use relay_protocol::domain::AgentState::{self, Busy, Idle};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let report = |name: &str, state: AgentState| Command::UpdateAgent {
        worktree: None,
        name: name.into(),
        state: Some(state),
        thread_id: None,
        endpoint: None,
        reason: None,
        program: None,
    };
    let agents = ["a", "b", "c"];
    let (flights_a, flights_b) = {
        let (b, stop, writer) = start_on(&path).await;
        for n in agents {
            b.register_agent(spec(n)).await.unwrap();
            b.execute(report(n, Idle)).await.unwrap();
        }
        let mut fa = Vec::new();
        let mut fb = Vec::new();
        for _ in 0..3 {
            fa.push(b.invoke(invoke("a")).await.unwrap().flight.id);
            fb.push(b.invoke(invoke("b")).await.unwrap().flight.id);
        }
        assert_eq!(shown(&b, &agents).await, [Idle, Idle, Idle]);
        // Reported busy (as before): nothing written.
        let seq = b.store().last_seq().unwrap();
        b.execute(report("a", Busy)).await.unwrap();
        assert_eq!(b.store().last_seq().unwrap(), seq);
        // All at once: two of a's flights run, one of b's waits.
        let changes = [
            (fa[0].clone(), vec![Running]),
            (fa[1].clone(), vec![Running]),
            (fb[0].clone(), vec![Running, Waiting]),
        ];
        futures::future::join_all(changes.iter().map(|(f, states)| {
            let b = b.clone();
            async move {
                for s in states {
                    b.update_flight(f, to(*s)).await.unwrap();
                }
            }
        }))
        .await;
        assert_eq!(shown(&b, &agents).await, [Busy, Busy, Idle]);
        // One of a's ends: a still has one running.
        b.update_flight(&fa[0], to(Completed)).await.unwrap();
        assert_eq!(shown(&b, &agents).await, [Busy, Busy, Idle]);
        stop_on(b, stop, writer).await;
        (fa, fb)
    };
    // After a restart, from the live flights.
    let (b, stop, writer) = start_on(&path).await;
    assert_eq!(shown(&b, &agents).await, [Busy, Busy, Idle]);
    b.update_flight(&flights_a[1], to(Failed)).await.unwrap();
    b.update_flight(&flights_b[0], to(Running)).await.unwrap();
    assert_eq!(shown(&b, &agents).await, [Idle, Busy, Idle]);
    b.update_flight(&flights_b[0], to(Cancelled)).await.unwrap();
    // Queued flights make no one busy.
    assert_eq!(shown(&b, &agents).await, [Idle, Idle, Idle]);
    stop_on(b, stop, writer).await;
}

/// The agents' states as a client sees them; each stored as `idle` (busy is not stored).
async fn shown(b: &Broker, names: &[&str]) -> Vec<relay_protocol::domain::AgentState> {
    let mut states = Vec::new();
    for n in names {
        let stored = b.agent(n).await.unwrap().unwrap();
        assert_eq!(
            stored.state,
            relay_protocol::domain::AgentState::Idle,
            "{n}: busy is not stored"
        );
        states.push(b.shown(stored).state);
    }
    states
}

/// The bus's check that a client does not speak as an agent (`CODEX-1` for `codex-1`)
/// reads names kept from the published events: it follows agents registered and
/// removed by many clients at once, names that differ only by case among them (each
/// case an agent of its own), and matches the agents tree after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agent_names_in_any_case_follow_many_registrations_at_once_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    // Each name in two cases: `Agent-7` and `agent-7` are two agents. By k % 4, what is
    // removed: 0 both, 1 the lower case, 2 neither, 3 the capitalised one.
    let upper = |k: usize| format!("Agent-{k}");
    let lower = |k: usize| format!("agent-{k}");
    let removed = |k: usize| -> Vec<String> {
        match k % 4 {
            0 => vec![upper(k), lower(k)],
            1 => vec![lower(k)],
            2 => vec![],
            _ => vec![upper(k)],
        }
    };
    // The broker's view against the agents tree: every name refused in any case
    // exactly when an agent has it, and the count is the tree's.
    let check = |b: &Broker, taken: &dyn Fn(usize) -> bool| {
        for k in 0..24 {
            for asked in [format!("AGENT-{k}"), format!("aGeNt-{k}")] {
                assert_eq!(b.agent_named_in_any_case(&asked), taken(k), "{asked}");
            }
        }
        assert!(!b.agent_named_in_any_case("agent-24"));
        let tree = b.store().tree(relay_broker::store::T::Agents);
        assert_eq!(b.counts().agents, tree.len() as u64);
        for key in tree.iter().keys() {
            let name = String::from_utf8(key.unwrap().to_vec()).unwrap();
            assert!(
                b.agent_named_in_any_case(&name.to_ascii_uppercase()),
                "{name}"
            );
        }
    };
    {
        let (b, stop, writer) = start_on(&path).await;
        let register = (0..24).flat_map(|k| [upper(k), lower(k)]).map(|name| {
            let b = b.clone();
            tokio::spawn(async move { b.register_agent(spec(&name)).await.unwrap() })
        });
        for task in futures::future::join_all(register).await {
            task.unwrap();
        }
        check(&b, &|_| true);
        assert_eq!(b.counts().agents, 48);
        let remove = (0..24).flat_map(removed).map(|name| {
            let b = b.clone();
            tokio::spawn(async move { b.remove_agent(&name).await.unwrap() })
        });
        for task in futures::future::join_all(remove).await {
            task.unwrap();
        }
        check(&b, &|k| k % 4 != 0);
        assert_eq!(b.counts().agents, 24);
        stop_on(b, stop, writer).await;
    }
    // After a restart, from one scan of the agents: both cases of `agent-2` counted.
    let (b, stop, writer) = start_on(&path).await;
    check(&b, &|k| k % 4 != 0);
    b.remove_agent(&upper(2)).await.unwrap();
    assert!(b.agent_named_in_any_case("AGENT-2"), "agent-2 is left");
    b.remove_agent(&lower(2)).await.unwrap();
    assert!(!b.agent_named_in_any_case("Agent-2"));
    // The last of a name's cases gone, the name is free.
    b.remove_agent(&upper(1)).await.unwrap();
    check(&b, &|k| k % 4 != 0 && k != 1 && k != 2);
    assert_eq!(b.counts().agents, 21);
    stop_on(b, stop, writer).await;
}

/// A broker on the database at `path`, with what stops it and its writer task.
async fn start_on(
    path: &std::path::Path,
) -> (Broker, CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    let (b, writer) = Broker::start(
        Store::open(path).unwrap(),
        BrokerConfig::default(),
        stop.clone(),
    )
    .await
    .unwrap();
    (b, stop, writer)
}

/// Stops a broker [`start_on`] started and waits for its writer to end.
async fn stop_on(b: Broker, stop: CancellationToken, writer: tokio::task::JoinHandle<()>) {
    stop.cancel();
    drop(b);
    writer.await.unwrap();
}

fn store_scan_live(store: &Store) -> Vec<String> {
    let flights: Vec<relay_protocol::domain::Flight> =
        store.values(relay_broker::store::T::Flights).unwrap();
    flights
        .into_iter()
        .filter(|f| !f.state.is_terminal())
        .map(|f| f.id)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn deltas_that_wait_for_a_commit_are_merged_in_order_and_every_caller_answered() {
    use relay_broker::{Command, Outcome};
    use relay_infra::storage::Storage;
    let b = broker().await;
    b.register_agent(spec("a1")).await.unwrap();
    let f = b.invoke(invoke("a1")).await.unwrap().flight;
    b.update_flight(&f.id, to(Running)).await.unwrap();
    let delta = |text: String| Command::UpdateFlight {
        flight: f.id.clone(),
        change: FlightChange::Delta { text },
    };
    // Hold storage so the commands queue up behind one commit.
    let paused = Storage::global().pause().await;
    let mut replies = Vec::new();
    for i in 0..50 {
        if i == 25 {
            let note = Command::UpdateFlight {
                flight: f.id.clone(),
                change: FlightChange::Note {
                    text: "halfway".into(),
                    by: None,
                },
            };
            replies.push(b.submit(note).await.unwrap());
        }
        replies.push(b.submit(delta(format!("d{i} "))).await.unwrap());
    }
    paused.resume().await;
    for r in replies {
        assert!(matches!(r.await.unwrap().unwrap(), Outcome::Flight(_)));
    }
    let updates = b.store().flight_updates(&f.id, 0).unwrap();
    let texts: Vec<String> = updates
        .iter()
        .filter_map(|u| match &u.change {
            FlightChange::Delta { text } => Some(text.clone()),
            FlightChange::Note { text, .. } => Some(format!("[{text}]")),
            _ => None,
        })
        .collect();
    let expected: String = (0..50)
        .map(|i| {
            if i == 25 {
                format!("[halfway]d{i} ")
            } else {
                format!("d{i} ")
            }
        })
        .collect();
    assert_eq!(texts.concat(), expected, "nothing lost or reordered");
    let deltas = texts.iter().filter(|t| !t.starts_with('[')).count();
    assert!(
        deltas < 50,
        "queued deltas were merged: {deltas} updates for 50"
    );
    // Update seqs stay gap-free.
    let seqs: Vec<u64> = updates.iter().map(|u| u.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    assert!(b.store().verify().unwrap().is_consistent());
}

#[tokio::test(flavor = "multi_thread")]
async fn large_events_reach_followers_whole_from_the_log_and_are_not_kept_in_memory() {
    use relay_broker::broker::{Live, LIVE_EVENT_MAX};
    use relay_protocol::event::EventBody;
    let b = broker().await;
    b.register_agent(spec("a1")).await.unwrap();
    let f = b.invoke(invoke("a1")).await.unwrap().flight;
    let from = b.last_seq();
    let mut live = b.subscribe();
    let mut followed = relay_broker::feed::follow(b.clone(), from);
    b.update_flight(&f.id, to(Running)).await.unwrap();
    let big = "x".repeat(LIVE_EVENT_MAX * 4);
    b.update_flight(&f.id, FlightChange::Delta { text: big.clone() })
        .await
        .unwrap();
    b.update_flight(
        &f.id,
        FlightChange::Delta {
            text: "tail".into(),
        },
    )
    .await
    .unwrap();
    let last = b.last_seq();
    // The live buffer holds a marker for the large event, the small ones themselves.
    let mut markers = 0;
    for _ in from..last {
        match live.recv().await.unwrap() {
            Live::InLog(_) => markers += 1,
            Live::Event(e) => assert!(e.seq > from),
        }
    }
    assert_eq!(markers, 1, "one event was too large to keep in memory");
    // A follower gets every event, in order, the large one whole.
    let mut texts = Vec::new();
    for seq in from + 1..=last {
        let event = followed.recv().await.unwrap().unwrap();
        assert_eq!(event.seq, seq, "no gap, no duplicate");
        if let EventBody::FlightUpdated { update, .. } = &event.body {
            if let FlightChange::Delta { text } = &update.change {
                texts.push(text.clone());
            }
        }
    }
    assert_eq!(texts, vec![big, "tail".to_string()]);
}

#[tokio::test]
async fn an_agents_reply_asks_again_only_the_names_it_addresses() {
    use relay_protocol::domain::MessageMeta;
    let b = broker().await;
    for n in ["a1", "a2", "a3"] {
        b.register_agent(spec(n)).await.unwrap();
    }
    let asked = b
        .post_message(said("me", "@a1 @a2 which is faster?"))
        .await
        .unwrap();
    let question = asked.message.id.clone();
    let f1 = asked.flights[0].clone();
    assert_eq!(f1.agent, "a1");
    b.update_flight(&f1.id, to(Running)).await.unwrap();
    // a1 posts from its flight, in reply to the question: what it repeats asks nobody,
    // what it addresses on a line of its own does, and a new name counts anywhere.
    let reply = |body: &str| PostMessage {
        reply_to: Some(question.clone()),
        meta: MessageMeta {
            flight: Some(f1.id.clone()),
            ..Default::default()
        },
        ..said("a1", body)
    };
    let echoed = b
        .post_message(reply(
            "@a1 @a2 which is faster?\nRust, says `@a3`, as @a2 said.\n> @a2 asked",
        ))
        .await
        .unwrap();
    assert!(echoed.flights.is_empty(), "{echoed:?}");
    assert_eq!(
        echoed.skipped,
        vec![
            MentionSkipped {
                name: "a1".into(),
                reason: MentionSkip::Author
            },
            MentionSkipped {
                name: "a2".into(),
                reason: MentionSkip::Repeated
            },
            MentionSkipped {
                name: "a3".into(),
                reason: MentionSkip::Code
            },
        ]
    );
    assert!(deliveries_of(&b, &echoed.message.id).is_empty());
    let meant = b
        .post_message(reply("Rust.\n@a2 can you measure it? And @a3 too."))
        .await
        .unwrap();
    assert_eq!(
        meant
            .flights
            .iter()
            .map(|f| (f.agent.as_str(), f.parent_flight.as_deref()))
            .collect::<Vec<_>>(),
        vec![("a2", Some(f1.id.as_str())), ("a3", Some(f1.id.as_str()))]
    );
    assert!(meant.skipped.is_empty() && meant.unknown.is_empty());
    // The same text from a person (no flight of theirs) asks everyone it names.
    let mut from_me = said("me", "as @a3 said");
    from_me.reply_to = Some(question.clone());
    let posted = b.post_message(from_me).await.unwrap();
    assert_eq!(posted.flights.len(), 1);
    // And a flight's own answer is held to the rule: a1's answer repeating the question
    // (its output) asks nobody.
    let repeat = FlightChange::State {
        to: Completed,
        reason: None,
        output: Some("@a1 @a2 which is faster?\n\nRust.".into()),
    };
    let before = flights_of(&b, "a2").len();
    let done = b.update_flight(&f1.id, repeat).await.unwrap();
    assert!(done.flight.reply_message.is_some());
    assert_eq!(flights_of(&b, "a2").len(), before);
}
