//! What the broker keeps of a harness's notes and of why an agent is in its state: the
//! latest note on the flight (with its time) and on its agent (with its flight), kept
//! after the flight ends; the reason a runtime gives with a state, cleared by the next
//! state reported without one. Over a real (temporary) sled store, asserting whole
//! records.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_broker::store::Store;
use relay_broker::{Broker, BrokerConfig, Command};
use relay_protocol::domain::{
    AgentSpec, AgentState, FlightChange, FlightState, Harness, InvokeRequest, Note,
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

fn note(text: &str) -> FlightChange {
    FlightChange::Note {
        text: text.into(),
        by: None,
    }
}

#[tokio::test]
async fn the_latest_note_is_kept_on_the_flight_and_its_agent() {
    let b = broker().await;
    b.register_agent(AgentSpec::new("a1", Harness::CodexAppServer, "/tmp"))
        .await
        .unwrap();
    let f = b
        .invoke(InvokeRequest::new("a1", "hi"))
        .await
        .unwrap()
        .flight;
    let running = FlightChange::State {
        to: FlightState::Running,
        reason: None,
        output: None,
    };
    b.update_flight(&f.id, running).await.unwrap();
    b.update_flight(&f.id, note("Reconnecting... 1/5"))
        .await
        .unwrap();
    let after = b
        .update_flight(&f.id, note("Reconnecting... 2/5"))
        .await
        .unwrap()
        .flight;
    let at = after.note.as_ref().unwrap().at;
    assert_eq!(
        after.note,
        Some(Note {
            text: "Reconnecting... 2/5".into(),
            at,
            flight: None,
        })
    );
    // Text after a note does not erase it; the end keeps it (it often says why).
    b.update_flight(&f.id, FlightChange::Delta { text: "x".into() })
        .await
        .unwrap();
    let failed = FlightChange::State {
        to: FlightState::Failed,
        reason: Some("stalled".into()),
        output: None,
    };
    let ended = b.update_flight(&f.id, failed).await.unwrap().flight;
    assert_eq!(ended.note, after.note);
    let agent = b.agent("a1").await.unwrap().unwrap();
    assert_eq!(
        agent.note,
        Some(Note {
            text: "Reconnecting... 2/5".into(),
            at,
            flight: Some(f.id.clone()),
        })
    );
    // The stored record is the one the update answered.
    assert_eq!(b.flight(&f.id).await.unwrap().unwrap(), ended);
}

#[tokio::test]
async fn a_state_keeps_the_reason_it_came_with_until_the_next_state() {
    let b = broker().await;
    b.register_agent(AgentSpec::new("a1", Harness::CodexAppServer, "/tmp"))
        .await
        .unwrap();
    let report = |state: AgentState, reason: Option<&str>| Command::UpdateAgent {
        worktree: None,
        name: "a1".into(),
        state: Some(state),
        thread_id: None,
        endpoint: None,
        reason: reason.map(str::to_string),
        program: None,
    };
    let why = "cannot start codex app-server: the agent's working directory /gone does not exist";
    b.execute(report(AgentState::Failed, Some(why)))
        .await
        .unwrap();
    let agent = b.agent("a1").await.unwrap().unwrap();
    assert_eq!(
        (agent.state, agent.state_reason.as_deref()),
        (AgentState::Failed, Some(why))
    );
    // A thread id alone leaves the state and its reason.
    b.execute(Command::UpdateAgent {
        worktree: None,
        name: "a1".into(),
        state: None,
        thread_id: Some("t1".into()),
        endpoint: None,
        reason: None,
        program: None,
    })
    .await
    .unwrap();
    let agent = b.agent("a1").await.unwrap().unwrap();
    assert_eq!(agent.state_reason.as_deref(), Some(why));
    b.execute(report(AgentState::Starting, None)).await.unwrap();
    let agent = b.agent("a1").await.unwrap().unwrap();
    assert_eq!(
        (agent.state, agent.state_reason),
        (AgentState::Starting, None)
    );
}
