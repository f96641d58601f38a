//! What a broker settles at start, over real sled files: flights and agents left by a
//! process that died (`kill -9`) at awkward moments.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use relay_broker::plane::Plane;
use relay_broker::store::{LogTexts, Store};
use relay_broker::{Broker, BrokerConfig, Command};
use relay_protocol::domain::shared::LONG_TEXT;
use relay_protocol::domain::{
    AgentSpec, AgentState, Endpoint, FlightChange, FlightState, Harness, InvokeRequest, SharedStr,
};
use relay_protocol::event::EventBody;
use relay_protocol::runtime::Report;
use relay_runtime::{DispatchState, Runtime, RuntimeConfig, TextSink};
use tokio_util::sync::CancellationToken;

fn spec() -> AgentSpec {
    AgentSpec {
        // Were the flight dispatched again, this would fail it with another reason.
        command: Some("/nonexistent/codex".into()),
        ..AgentSpec::new("codex-1", Harness::CodexAppServer, "/tmp")
    }
}

type Reports = tokio::sync::mpsc::Receiver<relay_protocol::runtime::Report>;

/// The embedded runtime over `dir` (its sled lives in `dir/runtime`).
fn runtime(dir: &std::path::Path) -> (Runtime, Reports) {
    Runtime::start(
        RuntimeConfig::new(dir.to_path_buf()),
        CancellationToken::new(),
    )
    .unwrap()
}

/// The same, its long answers written to `store`'s text files first, as `relay up`'s.
fn runtime_with_texts(dir: &std::path::Path, store: &Store) -> (Runtime, Reports) {
    let mut config = RuntimeConfig::new(dir.to_path_buf());
    config.texts = Some(TextSink::new(LogTexts(store.clone())));
    Runtime::start(config, CancellationToken::new()).unwrap()
}

/// The process that dies: its broker over `store`, with the agent registered.
async fn first_process(
    store: Store,
    stop: &CancellationToken,
) -> (Broker, tokio::task::JoinHandle<()>) {
    let (broker, writer) = Broker::start(store, BrokerConfig::default(), stop.clone())
        .await
        .unwrap();
    broker
        .execute(Command::RegisterAgent(Box::new(spec()), None))
        .await
        .unwrap();
    (broker, writer)
}

/// The next process over `store`: its broker, and its plane over `runtime` (which
/// recorded `invocation` as `recorded`), started: it has settled what the last one left.
async fn restarted(
    store: Store,
    (runtime, reports): (Runtime, Reports),
    invocation: &str,
    recorded: DispatchState,
) -> (Broker, Plane) {
    let (broker, _writer) = Broker::start(store, BrokerConfig::default(), CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(
        runtime.threads().dispatch_state(invocation).await.unwrap(),
        Some(recorded)
    );
    let (plane, _task) = Plane::start(broker.clone(), runtime, reports, None)
        .await
        .unwrap();
    (broker, plane)
}

#[tokio::test]
async fn a_queued_flight_whose_turn_had_started_is_failed_not_run_again() {
    let dir = tempfile::tempdir().unwrap();
    let (flight, invocation) = {
        // The first process: an agent, busy with a live session, and a flight still
        // `queued` at the broker, whose turn the runtime had already recorded as started
        // (on disk, just before handing the task to codex) when the process died.
        let stop = CancellationToken::new();
        let (broker, writer) =
            first_process(Store::open(&dir.path().join("db")).unwrap(), &stop).await;
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
    let store = support::reopen(&dir.path().join("db")).await;
    let (broker, _plane) = restarted(
        store,
        runtime(dir.path()),
        &invocation,
        DispatchState::Started,
    )
    .await;
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

/// A turn that ended with a long answer just before a `kill -9`: the runtime had
/// written the answer to the log's text files and recorded the end, referring to it,
/// but the broker had not committed the end. The next process settles the flight
/// completed with that answer, read back through the reference and stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_that_ended_with_a_long_answer_is_settled_with_it_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let answer: String = "a long answer, \"quoted\", ünïcödé\n".repeat(LONG_TEXT / 20);
    let (flight, invocation) = {
        let stop = CancellationToken::new();
        let store = Store::open(&db).unwrap();
        let (broker, writer) = first_process(store.clone(), &stop).await;
        let accepted = broker.invoke(invoke("say a lot")).await.unwrap();
        let (f, inv) = (accepted.flight.id, accepted.invocation.id);
        let (runtime, _reports) = runtime_with_texts(dir.path(), &store);
        let threads = runtime.threads();
        threads
            .set_dispatch_state(&inv, DispatchState::Started, &f)
            .await
            .unwrap();
        // As the agent's worker does: the answer written first, then its end recorded.
        let text = SharedStr::from(answer.clone());
        TextSink::new(LogTexts(store.clone()))
            .write(&f, &text)
            .unwrap();
        let end = Report::Flight {
            flight: f.clone(),
            change: FlightChange::State {
                to: FlightState::Completed,
                reason: None,
                output: Some(text),
            },
        };
        threads.set_dispatch_ended(&inv, &end).await.unwrap();
        // The record refers to the answer: no second copy of it in a report file.
        let reports = dir.path().join("runtime").join("runtime-reports");
        let copies = std::fs::read_dir(&reports).map(|d| d.count()).unwrap_or(0);
        assert_eq!(copies, 0, "a report file in {}", reports.display());
        drop(runtime);
        stop.cancel();
        drop(broker);
        writer.await.unwrap();
        (f, inv)
    };

    let store = support::reopen(&db).await;
    let (broker, _plane) = restarted(
        store.clone(),
        runtime_with_texts(dir.path(), &store),
        &invocation,
        DispatchState::Ended,
    )
    .await;
    let f = broker.store().flight(&flight).unwrap().unwrap();
    assert_eq!(f.state, FlightState::Completed, "{:?}", f.error);
    assert_eq!(f.output.as_deref(), Some(answer.as_str()));
    let updates = broker.store().flight_updates(&flight, 0).unwrap();
    let last = updates.last().unwrap();
    assert!(
        matches!(&last.change, FlightChange::State { output: Some(o), .. } if **o == *answer),
        "{:?}",
        last.change
    );
    // Stored once: one text file, holding it, and no record of the log holds it again.
    let texts = db.join("log").join("texts");
    let files: Vec<_> = std::fs::read_dir(&texts).unwrap().flatten().collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(std::fs::read_to_string(files[0].path()).unwrap(), answer);
    let mut pos = store.log().start().unwrap();
    while let Some(record) = store.log().read(pos).unwrap() {
        assert!(
            record.payload.len() < 64 * 1024,
            "a record of {} B",
            record.payload.len()
        );
        pos = record.next();
    }
    assert!(store.verify().unwrap().is_consistent());
}

fn invoke(task: &str) -> InvokeRequest {
    InvokeRequest::new("codex-1", task)
}
