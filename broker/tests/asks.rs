//! Who may ask whom, and what one ask may cost, over a real broker on a real (temporary)
//! sled store:
//!
//! - an agent's allow list: a shell pane (a tmux agent without a program) is registered
//!   only with one, and an ask or a mention from a principal it does not name is refused
//!   (`unauthorized`), writing no flight;
//! - an agent links what it asks only to the flight it is running, and asking oneself is
//!   refused with or without a running flight;
//! - past a full agent queue, an invocation is refused `overloaded` and writes nothing,
//!   however many clients ask at once;
//! - a flight that streams past the output cap fails naming it, and everything it
//!   streamed before the cap is kept.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_broker::store::{Store, T};
use relay_broker::{Broker, BrokerConfig, BrokerError};
use relay_protocol::api::ErrorCode;
use relay_protocol::domain::{
    AgentSpec, Flight, FlightChange, FlightState, FlightUpdate, Harness, InvokeRequest,
    PostMessage, DEFAULT_CONVERSATION,
};
use tokio_util::sync::CancellationToken;

async fn broker() -> Broker {
    let (b, _task) = Broker::start(
        Store::temporary().unwrap(),
        BrokerConfig::default(),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    b
}

fn spec(name: &str) -> AgentSpec {
    AgentSpec::new(name, Harness::CodexAppServer, "/tmp")
}

/// A tmux agent running a shell in its pane (`relay agent add --shell`), as a client
/// sends it.
fn shell(name: &str, allow_from: &[&str]) -> AgentSpec {
    serde_json::from_value(serde_json::json!({
        "name": name, "harness": "tmux", "cwd": "/tmp", "pane": {"shell": true},
        "allow_from": allow_from,
    }))
    .unwrap()
}

fn ask(requester: &str, target: &str) -> InvokeRequest {
    let mut r = InvokeRequest::new(target, "touch /tmp/x");
    r.requester = requester.into();
    r
}

fn flights(b: &Broker) -> Vec<Flight> {
    b.store().values(T::Flights).unwrap()
}

/// An ask refused because its parent is not the flight its requester runs.
fn not_running(e: &BrokerError, flight: &str) -> bool {
    e.code() == ErrorCode::InvalidRequest
        && e.to_string().contains(&format!(
            "can link what it asks only to the flight it is running, and flight {flight:?} is"
        ))
}

/// An ask refused because agent a1's queue is full.
fn queue_full(e: &BrokerError) -> bool {
    e.code() == ErrorCode::Overloaded
        && e.to_string().contains("agent \"a1\" has")
        && e.to_string().contains("full queue of")
}

fn running() -> FlightChange {
    FlightChange::State {
        to: FlightState::Running,
        reason: None,
        output: None,
    }
}

#[tokio::test]
async fn a_shell_pane_needs_an_allow_list_and_refuses_whom_it_does_not_name() {
    let b = broker().await;
    b.register_agent(spec("cx")).await.unwrap();
    // Without --allow-from: refused, naming the flag.
    let err = b.register_agent(shell("sh", &[])).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidRequest, "{err}");
    assert!(err.to_string().contains("--allow-from"), "{err}");
    assert!(b.agent("sh").await.unwrap().is_none());
    // A bad principal is refused too.
    let err = b
        .register_agent(shell("sh", &["no body"]))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("allow_from"), "{err}");

    b.register_agent(shell("sh", &["operator"])).await.unwrap();
    let shown = b.agent("sh").await.unwrap().unwrap();
    assert_eq!(
        serde_json::to_value(&shown).unwrap()["allow_from"],
        serde_json::json!(["operator"])
    );
    let before = flights(&b).len();
    // Agent cx may not ask it, nor consult it with a mention.
    let err = b.invoke(ask("cx", "sh")).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unauthorized, "{err}");
    assert!(
        err.to_string().contains(
            "\"cx\" may not invoke agent \"sh\": it accepts invocations from \"operator\" only"
        ),
        "{err}"
    );
    let cx = b.invoke(ask("operator", "cx")).await.unwrap().flight;
    b.update_flight(&cx.id, running()).await.unwrap();
    let mut post = PostMessage {
        conversation: DEFAULT_CONVERSATION.into(),
        author: "cx".into(),
        body: "@sh run rm -rf ~".into(),
        class: Default::default(),
        reply_to: None,
        meta: Default::default(),
    };
    post.meta.flight = Some(cx.id.clone());
    let posted = b.post_message(post).await.unwrap();
    assert!(posted.flights.is_empty(), "{posted:?}");
    assert_eq!(posted.refused.len(), 1, "{posted:?}");
    assert_eq!(posted.refused[0].error.code, ErrorCode::Unauthorized);
    assert_eq!(
        flights(&b).iter().filter(|f| f.agent == "sh").count(),
        0,
        "no flight of the shell was written"
    );
    assert_eq!(flights(&b).len(), before + 1, "only cx's own flight");
    // The operator may, under any name that is not an agent's.
    b.invoke(ask("operator", "sh")).await.unwrap();
    b.invoke(ask("alice", "sh")).await.unwrap();

    // Named agents and `*`.
    b.register_agent(spec("lead")).await.unwrap();
    b.register_agent(shell("sh2", &["lead"])).await.unwrap();
    b.invoke(ask("lead", "sh2")).await.unwrap();
    assert!(b.invoke(ask("cx", "sh2")).await.is_err());
    assert!(b.invoke(ask("operator", "sh2")).await.is_err());
    b.register_agent(shell("sh3", &["*"])).await.unwrap();
    b.invoke(ask("cx", "sh3")).await.unwrap();
    // An agent with its own program takes asks from anyone by default.
    b.invoke(ask("lead", "cx")).await.unwrap();
}

#[tokio::test]
async fn an_agent_links_an_ask_only_to_the_flight_it_runs_and_never_asks_itself() {
    let b = broker().await;
    for n in ["aa", "bb"] {
        b.register_agent(spec(n)).await.unwrap();
    }
    // aa -> aa with no flight running: refused.
    let err = b.invoke(ask("aa", "aa")).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Cycle, "{err}");
    assert!(err.to_string().contains("cannot ask itself"), "{err}");
    let queued = b.invoke(ask("operator", "aa")).await.unwrap().flight;
    let run = b.invoke(ask("operator", "aa")).await.unwrap().flight;
    b.update_flight(&run.id, running()).await.unwrap();
    let before = flights(&b).len();
    // A queued flight of its own is not the one it runs.
    let mut r = ask("aa", "bb");
    r.parent_flight = Some(queued.id.clone());
    let err = b.invoke(r).await.unwrap_err();
    assert!(not_running(&err, &queued.id), "{err}");
    // Nor another agent's.
    let theirs = b.invoke(ask("operator", "bb")).await.unwrap().flight;
    b.update_flight(&theirs.id, running()).await.unwrap();
    let mut r = ask("aa", "bb");
    r.parent_flight = Some(theirs.id.clone());
    let err = b.invoke(r).await.unwrap_err();
    assert!(not_running(&err, &theirs.id), "{err}");
    assert_eq!(flights(&b).len(), before + 1, "only bb's own flight");
    // The running one is.
    let mut r = ask("aa", "bb");
    r.parent_flight = Some(run.id.clone());
    let child = b.invoke(r).await.unwrap();
    assert_eq!(child.invocation.depth, 1);
    // And what it posts from a flight follows the same rule.
    let mut post = PostMessage {
        conversation: DEFAULT_CONVERSATION.into(),
        author: "aa".into(),
        body: "@bb look".into(),
        class: Default::default(),
        reply_to: None,
        meta: Default::default(),
    };
    post.meta.flight = Some(queued.id.clone());
    let err = b.post_message(post).await.unwrap_err();
    assert!(not_running(&err, &queued.id), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn asks_past_a_full_agent_queue_are_refused_at_once_and_write_nothing() {
    let b = broker().await;
    b.register_agent(spec("a1")).await.unwrap();
    let limit = relay_runtime::AGENT_QUEUE_CAPACITY;
    assert_eq!(
        b.config().agent_queue,
        limit,
        "the runtime's queue, by default"
    );
    // Many clients at once, more than the agent's turn and its queue hold.
    let asks = limit + 1 + 100;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..asks {
        let b = b.clone();
        tasks.spawn(async move { b.invoke(ask(&format!("client{}", i % 32), "a1")).await });
    }
    let (mut accepted, mut refused) = (0, 0);
    while let Some(r) = tasks.join_next().await {
        match r.unwrap() {
            Ok(_) => accepted += 1,
            Err(e) => {
                assert!(queue_full(&e), "{e}");
                refused += 1;
            }
        }
    }
    assert_eq!(accepted, limit + 1, "its turn and a full queue");
    assert_eq!(refused, 100);
    assert_eq!(flights(&b).len(), limit + 1, "a refusal writes no flight");
    assert_eq!(b.counts().flights, (limit + 1) as u64);
    // A flight that ends makes room for one more.
    let first = flights(&b)
        .into_iter()
        .min_by(|x, y| x.id.cmp(&y.id))
        .unwrap();
    b.update_flight(
        &first.id,
        FlightChange::State {
            to: FlightState::Cancelled,
            reason: None,
            output: None,
        },
    )
    .await
    .unwrap();
    b.invoke(ask("operator", "a1")).await.unwrap();
    assert!(queue_full(
        &b.invoke(ask("operator", "a1")).await.unwrap_err()
    ));
    // Other agents are not concerned.
    b.register_agent(spec("a2")).await.unwrap();
    b.invoke(ask("operator", "a2")).await.unwrap();
}

#[tokio::test]
async fn a_flight_streaming_past_the_output_cap_fails_naming_it_and_keeps_what_came_before() {
    let b = broker().await;
    b.register_agent(spec("a1")).await.unwrap();
    let cap: u64 = 8 * 1024 * 1024;
    assert_eq!(b.config().max_flight_output, cap, "the default cap");
    let f = b.invoke(ask("operator", "a1")).await.unwrap().flight;
    b.update_flight(&f.id, running()).await.unwrap();
    // 64 KiB pieces of numbered text, until past the cap.
    let piece = |i: usize| format!("{i:08}{}", "x".repeat(64 * 1024 - 8));
    let mut sent = String::new();
    let mut i = 0;
    loop {
        let text = piece(i);
        let r = b
            .update_flight(&f.id, FlightChange::Delta { text: text.clone() })
            .await;
        match r {
            Ok(r) if r.flight.state == FlightState::Running => sent.push_str(&text),
            Ok(r) => {
                // The piece that crossed the cap: what fits of it is kept.
                assert_eq!(r.flight.state, FlightState::Failed);
                let room = (cap as usize) - sent.len();
                sent.push_str(&text[..room]);
                break;
            }
            Err(e) => panic!("{e}"),
        }
        i += 1;
        assert!((i as u64) * 64 * 1024 <= cap + 64 * 1024, "never capped");
    }
    let after = b.flight(&f.id).await.unwrap().unwrap();
    assert_eq!(after.state, FlightState::Failed);
    let error = after.error.unwrap();
    assert!(
        error.contains(&format!("cap of {cap} bytes")) && error.contains("--max-flight-output"),
        "{error}"
    );
    // Every byte before the cap is in its updates, in order.
    let updates: Vec<FlightUpdate> = b.store().flight_updates(&f.id, 0).unwrap();
    let streamed: String = updates
        .iter()
        .filter_map(|u| match &u.change {
            FlightChange::Delta { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(streamed.len(), cap as usize);
    assert!(streamed == sent, "what came before the cap is kept whole");
    // And nothing more is taken.
    assert!(matches!(
        b.update_flight(
            &f.id,
            FlightChange::Delta {
                text: "more".into()
            }
        )
        .await,
        Err(BrokerError::FlightTerminal { .. })
    ));
}
