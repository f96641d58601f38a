//! A forked agent (`AgentSpec::fork`, `relay agent fork`) through the worker, on the
//! scripted harness (`support`): its first session is the harness's fork of the source's,
//! stored and resumed like any other afterwards; a fork that fails fails the flight with
//! its reason, and no fresh session is opened in its place.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use relay_harnesses::seam::{Endpoint, OpenedSession};
use relay_harnesses::HarnessError;
use relay_protocol::domain::{AgentState, FlightState, ForkSpec, Harness};
use relay_protocol::harness::{HarnessEvent, TurnOutcome};
use relay_protocol::runtime::Dispatch;
use support::*;

const H: Harness = Harness::ClaudeStreamJson;

fn from() -> ForkSpec {
    ForkSpec {
        agent: "src".into(),
        thread_id: "th-src".into(),
        flight: Some("flt_src1".into()),
        keep_turns: Some(1),
        turns: 2,
        cwd: "/work/src".into(),
    }
}

fn forked(flight: &str, task: &str) -> Dispatch {
    let mut d = dispatch(H, flight, task);
    d.agent.spec.fork = Some(from());
    d
}

#[tokio::test(start_paused = true)]
async fn a_forked_agents_first_session_is_the_fork_and_later_ones_resume_it() {
    let (launcher, mut script) = full();
    let (_dir, runtime, mut reports, _stop) = runtime(launcher, None);
    runtime.dispatch(forked("f1", "go on")).await.unwrap();
    let events = expect_call!(script, Call::Spawn { events, reply, .. } => {
        reply.send(Ok(())).unwrap();
        events
    });
    expect_call!(script, Call::Fork { from: asked, reply } => {
        assert_eq!(*asked, from());
        reply.send(Ok(OpenedSession { id: "c-fork".into(), lost: None })).unwrap();
    });
    assert_eq!(script.turn_started("t1").await, "go on");
    events
        .send(HarnessEvent::TurnCompleted {
            turn_id: "t1".into(),
            outcome: TurnOutcome::Completed { text: "ok".into() },
        })
        .await
        .unwrap();
    let mut want = vec![state("f1", FlightState::Waking, None)];
    want.extend(came_up(H, "c-fork", &Endpoint::Process { pid: PID }));
    want.extend(turn_began("f1", "c-fork", "t1"));
    want.push(completed("f1", "ok"));
    assert_eq!(reports.take(want.len()).await, want);
    assert_eq!(
        runtime
            .threads()
            .get("a1")
            .await
            .unwrap()
            .map(|r| r.thread_id),
        Some("c-fork".to_string())
    );

    // The session ends; the next one resumes the fork, not a second fork.
    events
        .send(HarnessEvent::ProcessExited {
            code: Some(0),
            signal: None,
            stderr_tail: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(reports.next().await, agent(AgentState::Offline));
    runtime.dispatch(forked("f2", "more")).await.unwrap();
    script.session_up(Some("c-fork"), "c-fork").await;
    assert_eq!(script.turn_started("t2").await, "more");
}

#[tokio::test(start_paused = true)]
async fn a_failed_fork_fails_the_flight_with_its_reason_and_opens_nothing_else() {
    let (launcher, mut script) = full();
    let (_dir, runtime, mut reports, _stop) = runtime(launcher, None);
    runtime.dispatch(forked("f1", "go on")).await.unwrap();
    expect_call!(script, Call::Spawn { reply, .. } => reply.send(Ok(())).unwrap());
    expect_call!(script, Call::Fork { reply, .. } => {
        reply
            .send(Err(HarnessError::Fork {
                detail: "codex has no thread th-src (agent src)".into(),
            }))
            .unwrap();
    });
    expect_call!(script, Call::Shutdown => ());
    let why = "cannot fork the session: codex has no thread th-src (agent src)";
    let want = vec![
        state("f1", FlightState::Waking, None),
        agent(AgentState::Starting),
        agent_because(AgentState::Failed, why),
        state("f1", FlightState::Failed, Some(why)),
    ];
    assert_eq!(reports.take(want.len()).await, want);
    assert!(script.quiet(), "no other session was opened");
    assert_eq!(runtime.threads().get("a1").await.unwrap(), None);
}
