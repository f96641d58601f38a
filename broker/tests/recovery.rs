//! What a broker settles at start, over real sled files: flights and agents left by a
//! process that died (`kill -9`) at awkward moments.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use relay_broker::plane::Plane;
use relay_broker::store::Store;
use relay_broker::{Broker, BrokerConfig, Command};
use relay_protocol::domain::{
    AgentSpec, AgentState, Endpoint, FlightState, Harness, InvokeRequest,
};
use relay_protocol::event::EventBody;
use relay_runtime::{DispatchState, Runtime, RuntimeConfig};
use tokio_util::sync::CancellationToken;

fn spec() -> AgentSpec {
    AgentSpec {
        // Were the flight dispatched again, this would fail it with another reason.
        command: Some("/nonexistent/codex".into()),
        ..AgentSpec::new("codex-1", Harness::CodexAppServer, "/tmp")
    }
}

/// The embedded runtime over `dir` (its sled lives in `dir/runtime`).
fn runtime(
    dir: &std::path::Path,
) -> (
    Runtime,
    tokio::sync::mpsc::Receiver<relay_protocol::runtime::Report>,
) {
    Runtime::start(
        RuntimeConfig::new(dir.to_path_buf()),
        CancellationToken::new(),
    )
    .unwrap()
}

#[tokio::test]
async fn a_queued_flight_whose_turn_had_started_is_failed_not_run_again() {
    let dir = tempfile::tempdir().unwrap();
    let (flight, invocation) = {
        // The first process: an agent, busy with a live session, and a flight still
        // `queued` at the broker, whose turn the runtime had already recorded as started
        // (on disk, just before handing the task to codex) when the process died.
        let stop = CancellationToken::new();
        let (broker, writer) = Broker::start(
            Store::open(&dir.path().join("db")).unwrap(),
            BrokerConfig::default(),
            stop.clone(),
        )
        .await
        .unwrap();
        broker
            .execute(Command::RegisterAgent(Box::new(spec()), None))
            .await
            .unwrap();
        broker
            .execute(Command::UpdateAgent {
                worktree: None,
                name: "codex-1".into(),
                state: Some(AgentState::Busy),
                thread_id: Some("thr_1".into()),
                endpoint: Some(Some(Endpoint {
                    transport: Harness::CodexAppServer,
                    node: None,
                    session_id: Some("thr_1".into()),
                    pid: Some(999_999),
                    pane: None,
                })),
                reason: None,
                program: None,
            })
            .await
            .unwrap();
        let accepted = broker
            .invoke(invoke("rm -rf the world, once"))
            .await
            .unwrap();
        assert_eq!(accepted.flight.state, FlightState::Queued);
        let (runtime, _reports) = runtime(dir.path());
        runtime
            .threads()
            .set_dispatch_state(
                &accepted.invocation.id,
                DispatchState::Started,
                &accepted.flight.id,
            )
            .await
            .unwrap();
        drop(runtime);
        stop.cancel();
        drop(broker);
        writer.await.unwrap();
        (accepted.flight.id, accepted.invocation.id)
    };

    // The next process settles it.
    let (broker, _writer) = Broker::start(
        support::reopen(&dir.path().join("db")).await,
        BrokerConfig::default(),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let (runtime, reports) = runtime(dir.path());
    assert_eq!(
        runtime.threads().dispatch_state(&invocation).await.unwrap(),
        Some(DispatchState::Started)
    );
    let (_plane, _task) = Plane::start(broker.clone(), runtime, reports, None)
        .await
        .unwrap();
    let f = broker.store().flight(&flight).unwrap().unwrap();
    assert_eq!(f.state, FlightState::Failed, "{f:?}");
    let reason = f.error.unwrap_or_default();
    assert!(reason.contains("relay stopped"), "{reason}");
    // The agent's session died with the old process: it is offline, without endpoint.
    let a = broker.store().agent("codex-1").unwrap().unwrap();
    assert_eq!((a.state, a.endpoint), (AgentState::Offline, None));
    assert_eq!(a.thread_id.as_deref(), Some("thr_1"), "the thread is kept");
    // Nothing else happens to the flight afterwards (no dispatch, no second failure).
    // A later flight of the same agent is the barrier: dispatches reach the agent's queue
    // in the order of their invocations and its reports come back in order, so once that
    // flight has ended (its /nonexistent program fails it), anything done to the first
    // one has been committed too.
    let mut feed = relay_broker::feed::follow(broker.clone(), broker.last_seq());
    let barrier = broker.invoke(invoke("after the restart")).await.unwrap();
    let ended = async {
        while let Some(event) = feed.recv().await {
            if let EventBody::FlightUpdated { flight, .. } = &event.unwrap().body {
                if flight.id == barrier.flight.id && flight.state.is_terminal() {
                    return flight.clone();
                }
            }
        }
        panic!("the event feed ended");
    };
    let barrier = tokio::time::timeout(Duration::from_secs(60), ended)
        .await
        .expect("the barrier flight never ended");
    // Failed by its dispatch: the runtime could not start the agent's program.
    assert_eq!(barrier.state, FlightState::Failed, "{barrier:?}");
    let reason = barrier.error.unwrap_or_default();
    assert!(reason.contains("/nonexistent/codex"), "{reason}");
    let again = broker.store().flight(&flight).unwrap().unwrap();
    assert_eq!(again.update_seq, f.update_seq);
}

fn invoke(task: &str) -> InvokeRequest {
    InvokeRequest::new("codex-1", task)
}
