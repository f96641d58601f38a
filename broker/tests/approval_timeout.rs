//! An approval's timeout is a task the plane owns: it ends as soon as the approval is
//! decided, and with the plane at a shutdown; it is never left sleeping behind. Counted
//! (the plane's live approval timers), never timed: the timeout itself is an hour.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use relay_broker::broker::Live;
use relay_broker::plane::Plane;
use relay_broker::store::Store;
use relay_broker::{Broker, BrokerConfig, Command};
use relay_protocol::domain::{
    AgentSpec, Approval, ApprovalDecision, ApprovalKind, ApprovalRequest, ApprovalState, Harness,
    InvokeRequest,
};
use relay_protocol::event::EventBody;
use relay_protocol::runtime::Report;
use relay_runtime::{Runtime, RuntimeConfig};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

/// Waits (with a deadline against a hang, not a measure) until `done` holds.
async fn until(what: &str, done: impl Fn() -> bool) {
    tokio::time::timeout(Duration::from_secs(60), async {
        while !done() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("never: {what}"));
}

/// The next approval requested on the broker's live feed.
async fn requested(live: &mut broadcast::Receiver<Live>) -> Approval {
    loop {
        if let Live::Event(event) = live.recv().await.unwrap() {
            if let EventBody::ApprovalRequested { approval } = &event.body {
                return approval.clone();
            }
        }
    }
}

fn asks(flight: &str, n: u32) -> Report {
    Report::ApprovalRequested {
        agent: "remote-1".into(),
        request: ApprovalRequest {
            flight: flight.into(),
            kind: ApprovalKind::Command,
            detail: "cargo test".into(),
            reason: None,
            harness_request_id: n.to_string(),
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_timeout_ends_when_the_approval_is_decided_and_with_the_plane() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, _writer) = Broker::start(
        Store::temporary().unwrap(),
        BrokerConfig::default(),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let (runtime, _runtime_reports) = Runtime::start(
        RuntimeConfig::new(dir.path().to_path_buf()),
        CancellationToken::new(),
    )
    .unwrap();
    // The reports the plane consumes come from this test.
    let (reports, reports_rx) = mpsc::channel(16);
    let (plane, plane_task) = Plane::start(broker.clone(), runtime, reports_rx, None)
        .await
        .unwrap();
    // An agent of another node, whose flights wait for NATS: queued, never run here.
    plane.expect_nats();
    let mut spec = AgentSpec::new("remote-1", Harness::CodexAppServer, "/tmp");
    spec.node = Some("n1".into());
    spec.approval_policy.timeout_secs = Some(3600);
    broker.register_agent(spec).await.unwrap();
    let flight = broker
        .invoke(InvokeRequest::new("remote-1", "do it"))
        .await
        .unwrap()
        .flight;
    let mut live = broker.subscribe();

    // No rule decides it: its timeout starts, as a task.
    reports.send(asks(&flight.id, 1)).await.unwrap();
    let first = requested(&mut live).await;
    until("the first approval's timeout started", || {
        plane.approval_timers() == 1
    })
    .await;
    // Decided by a person long before its hour: the timeout's task ends with it.
    broker
        .execute(Command::DecideApproval {
            id: first.id.clone(),
            decision: ApprovalDecision::Accept,
            decided_by: "alice".into(),
            remember: None,
        })
        .await
        .unwrap();
    until("the decided approval's timeout ended", || {
        plane.approval_timers() == 0
    })
    .await;
    let first = broker
        .store()
        .read(move |s| s.approval(&first.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.state, ApprovalState::Decided);
    assert_eq!(first.decided_by.as_deref(), Some("alice"));

    // Another one, still pending when the plane stops (the runtime's reports end): its
    // timeout ends with the plane, which waits for it.
    reports.send(asks(&flight.id, 2)).await.unwrap();
    let second = requested(&mut live).await;
    until("the second approval's timeout started", || {
        plane.approval_timers() == 1
    })
    .await;
    drop(reports);
    tokio::time::timeout(Duration::from_secs(60), plane_task)
        .await
        .expect("the plane never stopped")
        .unwrap();
    assert_eq!(plane.approval_timers(), 0);
    let second = broker
        .store()
        .read(move |s| s.approval(&second.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        second.state,
        ApprovalState::Pending,
        "stopped, not declined"
    );
}
