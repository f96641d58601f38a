//! Snapshot, then follow, over a real (temporary) sled store and the real writer: while
//! flights stream deltas, an agent changes state and messages are posted, watchers of a
//! flight, an agent, a conversation and the fleet join at spread moments (after the k-th event
//! committed). Each snapshot must equal the scope rebuilt from the log up to its seq
//! (written out here, independently of the implementation), and the events each
//! watcher follows must be exactly the scope's events in the log after that seq.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use relay_broker::broker::Published;
use relay_broker::store::Store;
use relay_broker::watch::watch;
use relay_broker::{Broker, BrokerConfig, BrokerError, Command};
use relay_protocol::domain::{
    AgentSpec, AgentState, Approval, ApprovalDecision, ApprovalKind, ApprovalRequest,
    ApprovalState, FlightChange, FlightState, Harness, InvokeRequest, PostMessage,
    DEFAULT_CONVERSATION,
};
use relay_protocol::event::{Event, EventBody};
use relay_protocol::watch::{
    AgentView, ConversationView, FleetView, FlightView, Scope, Snapshot, View, MAX_MESSAGES,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

type Followed = mpsc::Receiver<Result<Arc<Published>, BrokerError>>;

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

fn invoke(target: &str, task: &str) -> InvokeRequest {
    InvokeRequest::new(target, task)
}

fn state(to: FlightState) -> FlightChange {
    FlightChange::State {
        to,
        reason: None,
        output: Some("done".into()),
    }
}

/// Flights streaming deltas one after another (submitted without waiting, so the
/// writer merges and batches them), the agent busy then idle around each, and a
/// message posted every few deltas. Returns the flight ids.
async fn drive(b: &Broker, flights: usize, deltas: usize) -> Vec<String> {
    let mut ids = Vec::new();
    let agent_state = |s: AgentState| Command::UpdateAgent {
        worktree: None,
        name: "a1".into(),
        state: Some(s),
        thread_id: None,
        endpoint: None,
        reason: None,
        program: None,
    };
    for f in 0..flights {
        let id = b
            .invoke(invoke("a1", &format!("task {f}")))
            .await
            .unwrap()
            .flight
            .id;
        b.execute(agent_state(AgentState::Busy)).await.unwrap();
        b.update_flight(&id, state(FlightState::Running))
            .await
            .unwrap();
        let mut pending = Vec::new();
        for d in 0..deltas {
            let delta = FlightChange::Delta {
                text: format!("{f}.{d} "),
            };
            pending.push(
                b.submit(Command::UpdateFlight {
                    flight: id.clone(),
                    change: delta,
                })
                .await
                .unwrap(),
            );
            // An approval asked now and then, decided a little later: the fleet's.
            if d % 50 == 5 {
                let request = ApprovalRequest {
                    flight: id.clone(),
                    kind: ApprovalKind::Command,
                    detail: format!("cargo test {f}.{d}"),
                    reason: None,
                    harness_request_id: format!("r{f}.{d}"),
                };
                let asked = Command::RequestApproval {
                    agent: "a1".into(),
                    request,
                };
                pending.push(b.submit(asked).await.unwrap());
            }
            if d % 50 == 30 {
                let open: Vec<_> = b
                    .store()
                    .read(|s| s.values::<Approval>(relay_broker::store::T::Approvals))
                    .await
                    .unwrap();
                for a in open
                    .into_iter()
                    .filter(|a| a.state == ApprovalState::Pending)
                {
                    b.decide_approval(&a.id, ApprovalDecision::Accept, "operator")
                        .await
                        .unwrap();
                }
            }
            if d % 10 == 0 {
                let post = PostMessage {
                    conversation: DEFAULT_CONVERSATION.into(),
                    author: "operator".into(),
                    body: format!("note {f}.{d}").into(),
                    class: Default::default(),
                    reply_to: None,
                    meta: Default::default(),
                };
                pending.push(b.submit(Command::PostMessage(post)).await.unwrap());
            }
            // Every few deltas, wait for their commit: many commits, each racing the
            // snapshots being read.
            if d % 4 == 3 {
                for p in pending.drain(..) {
                    p.await.unwrap().unwrap();
                }
            }
        }
        for p in pending {
            p.await.unwrap().unwrap();
        }
        b.update_flight(&id, state(FlightState::Completed))
            .await
            .unwrap();
        b.execute(agent_state(AgentState::Idle)).await.unwrap();
        ids.push(id);
    }
    ids
}

/// The scope rebuilt from the log's events up to `seq`, written out from what each
/// event means (not with the broker's code).
fn rebuilt(log: &[Event], scope: &Scope, seq: u64) -> View {
    let upto = || log.iter().filter(move |e| e.seq <= seq);
    match scope {
        Scope::Fleet => {
            let mut agents = BTreeMap::new();
            let mut flights = BTreeMap::new();
            let mut approvals = BTreeMap::new();
            for e in upto() {
                match &e.body {
                    EventBody::AgentRegistered { agent } | EventBody::AgentUpdated { agent } => {
                        agents.insert(agent.spec.name.clone(), agent.clone());
                    }
                    EventBody::AgentRemoved { name, .. } => {
                        agents.remove(name);
                    }
                    EventBody::InvocationCreated { flight, .. }
                    | EventBody::FlightUpdated { flight, .. } => {
                        flights.insert(flight.id.clone(), flight.clone());
                    }
                    EventBody::ApprovalRequested { approval }
                    | EventBody::ApprovalDecided { approval } => {
                        approvals.insert(approval.id.clone(), approval.clone());
                    }
                    _ => {}
                }
            }
            View::Fleet(FleetView {
                agents: agents.into_values().collect(),
                flights: flights
                    .into_values()
                    .filter(|f| !f.state.is_terminal())
                    .collect(),
                approvals: approvals
                    .into_values()
                    .filter(|a| a.state == ApprovalState::Pending)
                    .collect(),
            })
        }
        Scope::Flight(id) => {
            let mut view = None;
            for e in upto() {
                match &e.body {
                    EventBody::InvocationCreated { flight, .. } if flight.id == *id => {
                        view = Some(FlightView {
                            flight: flight.clone(),
                            updates: vec![],
                        })
                    }
                    EventBody::FlightUpdated { update, flight } if flight.id == *id => {
                        let v = view.as_mut().unwrap();
                        v.flight = flight.clone();
                        v.updates.push(update.clone());
                    }
                    _ => {}
                }
            }
            View::Flight(view.unwrap())
        }
        Scope::Agent(name) => {
            let mut agent = None;
            let mut flights: BTreeMap<String, FlightView> = BTreeMap::new();
            for e in upto() {
                match &e.body {
                    EventBody::AgentRegistered { agent: a }
                    | EventBody::AgentUpdated { agent: a }
                        if a.spec.name == *name =>
                    {
                        agent = Some(a.clone())
                    }
                    EventBody::InvocationCreated { flight, .. } if flight.agent == *name => {
                        let v = FlightView {
                            flight: flight.clone(),
                            updates: vec![],
                        };
                        flights.insert(flight.id.clone(), v);
                    }
                    EventBody::FlightUpdated { update, flight } if flight.agent == *name => {
                        let v = flights.get_mut(&flight.id).unwrap();
                        v.flight = flight.clone();
                        v.updates.push(update.clone());
                    }
                    _ => {}
                }
            }
            View::Agent(AgentView {
                agent: agent.unwrap(),
                flights: flights
                    .into_values()
                    .filter(|v| !v.flight.state.is_terminal())
                    .collect(),
            })
        }
        Scope::Conversation { id, limit } => {
            let mut conversation = None;
            let mut messages = Vec::new();
            for e in upto() {
                match &e.body {
                    EventBody::ConversationCreated { conversation: c } if c.spec.id == *id => {
                        conversation = Some(c.clone())
                    }
                    // The message alone: its index says its conversation's count.
                    EventBody::MessagePosted { message, .. } if message.conversation == *id => {
                        if let Some(c) = conversation.as_mut() {
                            c.message_count = message.index + 1;
                        }
                        messages.push(message.clone());
                    }
                    _ => {}
                }
            }
            let extra = messages.len().saturating_sub(*limit);
            messages.drain(..extra);
            View::Conversation(ConversationView {
                conversation: conversation.unwrap(),
                messages,
            })
        }
    }
}

/// Whether an event is of the scope, written out.
fn of_scope(scope: &Scope, e: &Event) -> bool {
    match (scope, &e.body) {
        (
            Scope::Fleet,
            EventBody::AgentRegistered { .. }
            | EventBody::AgentUpdated { .. }
            | EventBody::AgentRemoved { .. }
            | EventBody::ThreadLost { .. }
            | EventBody::InvocationCreated { .. }
            | EventBody::FlightUpdated { .. }
            | EventBody::ApprovalRequested { .. }
            | EventBody::ApprovalDecided { .. }
            | EventBody::RuleAdded { .. }
            | EventBody::RuleRemoved { .. },
        ) => true,
        (Scope::Flight(id), EventBody::FlightUpdated { update, .. }) => update.flight == *id,
        (
            Scope::Agent(n),
            EventBody::AgentUpdated { agent } | EventBody::AgentRegistered { agent },
        ) => agent.spec.name == *n,
        (Scope::Agent(n), EventBody::InvocationCreated { flight, .. }) => flight.agent == *n,
        (Scope::Agent(n), EventBody::FlightUpdated { update, .. }) => update.agent == *n,
        (Scope::Conversation { id, .. }, EventBody::MessagePosted { message, .. }) => {
            message.conversation == *id
        }
        _ => false,
    }
}

async fn whole_log(b: &Broker) -> Vec<Event> {
    b.store()
        .read(|s| s.events_after(0, usize::MAX))
        .await
        .unwrap()
}

/// Checks one watcher: its snapshot against the log, then that it follows exactly the
/// scope's events after the snapshot's seq (each once, in order), then nothing.
async fn check(log: &[Event], scope: &Scope, snapshot: &Snapshot, followed: &mut Followed) {
    assert_eq!(
        snapshot.view,
        rebuilt(log, scope, snapshot.seq),
        "{scope:?} at {}",
        snapshot.seq
    );
    let expected: Vec<&Event> = log
        .iter()
        .filter(|e| e.seq > snapshot.seq && of_scope(scope, e))
        .collect();
    for want in expected {
        let got = tokio::time::timeout(Duration::from_secs(10), followed.recv())
            .await
            .expect("the watcher's next event")
            .expect("the watch went on")
            .unwrap();
        assert_eq!(got.event, *want, "{scope:?} from {}", snapshot.seq);
        // What a watcher is sent: the event's JSON as serde_json writes it.
        assert_eq!(*got.json(), serde_json::to_vec(want).unwrap(), "{scope:?}");
    }
    match followed.try_recv() {
        Err(mpsc::error::TryRecvError::Empty | mpsc::error::TryRecvError::Disconnected) => {}
        Ok(extra) => panic!("{scope:?}: an event past the log's scope: {extra:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watchers_joining_under_load_get_an_exact_snapshot_then_every_event_once() {
    let b = broker().await;
    b.execute(Command::Bootstrap).await.unwrap();
    b.register_agent(AgentSpec::new("a1", Harness::CodexAppServer, "/tmp"))
        .await
        .unwrap();
    let mut observed = relay_broker::feed::follow(b.clone(), b.last_seq());
    let driver = {
        let b = b.clone();
        tokio::spawn(async move { drive(&b, 3, 200).await })
    };
    // At thirty moments spread over the run (once k events have committed since the
    // start; the driver commits at least ~70 events per flight), a watcher of the agent,
    // one of the conversation and one of the flight streaming last join.
    let mut watchers = Vec::new();
    let mut streaming: Option<String> = None;
    let mut count = 0u64;
    for i in 0..30u64 {
        while count < 2 + i * 7 {
            let event = observed.recv().await.unwrap().unwrap();
            count += 1;
            if let EventBody::InvocationCreated { flight, .. } = &event.body {
                streaming = Some(flight.id.clone());
            }
        }
        let mut scopes = vec![
            Scope::Fleet,
            Scope::Agent("a1".into()),
            Scope::Conversation {
                id: DEFAULT_CONVERSATION.into(),
                limit: MAX_MESSAGES,
            },
        ];
        scopes.extend(streaming.clone().map(Scope::Flight));
        for scope in scopes {
            let b = b.clone();
            watchers.push(tokio::spawn(async move {
                let (snapshot, followed) = watch(&b, scope.clone()).await.unwrap();
                (scope, snapshot, followed)
            }));
        }
    }
    let flights = driver.await.unwrap();
    assert_eq!(flights.len(), 3);
    let log = whole_log(&b).await;
    let asked = |e: &&Event| matches!(e.body, EventBody::ApprovalRequested { .. });
    assert!(
        log.iter().filter(asked).count() >= 6,
        "approvals came and went"
    );
    let mut scopes = BTreeMap::new();
    for w in watchers {
        let (scope, snapshot, mut followed) = w.await.unwrap();
        check(&log, &scope, &snapshot, &mut followed).await;
        let kind = match scope {
            Scope::Fleet => "fleet",
            Scope::Flight(_) => "flight",
            Scope::Agent(_) => "agent",
            Scope::Conversation { .. } => "conversation",
        };
        *scopes.entry(kind).or_insert(0) += 1;
    }
    assert_eq!(scopes.len(), 4, "every scope was watched: {scopes:?}");
}

#[tokio::test]
async fn a_conversation_snapshot_keeps_its_last_messages_and_unknown_scopes_are_typed_errors() {
    let b = broker().await;
    b.execute(Command::Bootstrap).await.unwrap();
    for n in 0..5 {
        b.post_message(PostMessage {
            conversation: DEFAULT_CONVERSATION.into(),
            author: "operator".into(),
            body: format!("m{n}").into(),
            class: Default::default(),
            reply_to: None,
            meta: Default::default(),
        })
        .await
        .unwrap();
    }
    let scope = Scope::Conversation {
        id: DEFAULT_CONVERSATION.into(),
        limit: 2,
    };
    let (snapshot, mut followed) = watch(&b, scope.clone()).await.unwrap();
    assert_eq!(snapshot.seq, b.last_seq());
    let View::Conversation(v) = &snapshot.view else {
        panic!("{snapshot:?}")
    };
    let bodies: Vec<&str> = v.messages.iter().map(|m| m.body.as_str()).collect();
    assert_eq!(bodies, ["m3", "m4"]);
    assert_eq!(v.conversation.message_count, 5);
    check(&whole_log(&b).await, &scope, &snapshot, &mut followed).await;

    for (scope, code) in [
        (Scope::Flight("flt_nope".into()), "unknown_flight"),
        (Scope::Agent("nobody".into()), "unknown_agent"),
        (
            Scope::Conversation {
                id: "channel.nope".into(),
                limit: 1,
            },
            "unknown_conversation",
        ),
    ] {
        let e = watch(&b, scope).await.map(|_| ()).unwrap_err();
        assert_eq!(e.to_api().code.as_str(), code);
    }
}
