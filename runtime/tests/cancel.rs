//! Interrupting a flight before its turn: whatever the order of the interrupt and the
//! dispatch, the turn never starts and the flight is reported cancelled. No harness is
//! spawned: the agent names a program that does not exist, so a turn that did start
//! would be reported `waking`, then `failed`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use relay_protocol::domain::{FlightChange, FlightState, Harness};
use relay_protocol::runtime::{Control, Dispatch, Report};
use relay_runtime::{Runtime, RuntimeConfig};
use tokio::sync::mpsc::Receiver;
use tokio_util::sync::CancellationToken;

/// A dispatch to an agent whose program does not exist.
fn dispatch(flight: &str, task: &str) -> Dispatch {
    let mut d = support::dispatch(Harness::CodexAppServer, flight, task);
    d.agent.spec.command = Some("/nonexistent/codex".into());
    d.agent.spec.cwd = "/tmp".into();
    d
}

/// The state changes reported for `flight` until one is terminal.
async fn states(reports: &mut Receiver<Report>, flight: &str) -> Vec<(FlightState, String)> {
    let mut out = Vec::new();
    loop {
        let r = tokio::time::timeout(Duration::from_secs(10), reports.recv())
            .await
            .expect("no report")
            .expect("reports closed");
        if let Report::Flight {
            flight: f,
            change: FlightChange::State { to, reason, .. },
        } = r
        {
            if f == flight {
                out.push((to, reason.unwrap_or_default()));
                if to.is_terminal() {
                    return out;
                }
            }
        }
    }
}

fn start() -> (tempfile::TempDir, Runtime, Receiver<Report>) {
    let dir = tempfile::tempdir().unwrap();
    let (runtime, reports) = Runtime::start(
        RuntimeConfig::new(dir.path().to_path_buf()),
        CancellationToken::new(),
    )
    .unwrap();
    (dir, runtime, reports)
}

#[tokio::test]
async fn an_interrupt_before_the_dispatch_drops_it() {
    let (_dir, runtime, mut reports) = start();
    // The interrupt comes first (the dispatch is still on its way, over NATS say).
    runtime
        .control(Control::Interrupt {
            agent: "a1".into(),
            flight: "f1".into(),
        })
        .await
        .unwrap();
    // Dispatched, then again (a redelivery): dropped each time, never started.
    for _ in 0..2 {
        runtime.dispatch(dispatch("f1", "never")).await.unwrap();
        assert_eq!(
            states(&mut reports, "f1").await,
            vec![(
                FlightState::Cancelled,
                "interrupted before its turn started".to_string()
            )]
        );
    }
    // Another flight of the agent still runs (and fails: its program does not exist).
    runtime.dispatch(dispatch("f2", "runs")).await.unwrap();
    let s = states(&mut reports, "f2").await;
    assert_eq!(s.first().map(|x| x.0), Some(FlightState::Waking), "{s:?}");
    assert_eq!(s.last().map(|x| x.0), Some(FlightState::Failed), "{s:?}");
}

#[tokio::test]
async fn an_interrupt_of_a_queued_flight_takes_it_out_of_the_queue() {
    let (_dir, runtime, mut reports) = start();
    // f1 holds the worker (its session start fails after a moment); f2 and f3 wait.
    runtime.dispatch(dispatch("f1", "first")).await.unwrap();
    runtime.dispatch(dispatch("f2", "second")).await.unwrap();
    runtime.dispatch(dispatch("f3", "third")).await.unwrap();
    runtime
        .control(Control::Interrupt {
            agent: "a1".into(),
            flight: "f2".into(),
        })
        .await
        .unwrap();
    runtime
        .control(Control::Steer {
            agent: "a1".into(),
            flight: "f3".into(),
            text: "and more".into(),
            max_task_bytes: None,
            by: None,
        })
        .await
        .unwrap();
    assert_eq!(
        states(&mut reports, "f2").await,
        vec![(
            FlightState::Cancelled,
            "interrupted before its turn started".to_string()
        )]
    );
    // f3 still runs after f1.
    let s = states(&mut reports, "f3").await;
    assert_eq!(s.first().map(|x| x.0), Some(FlightState::Waking), "{s:?}");
}
