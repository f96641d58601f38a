//! The worker, driven through the harness seam by a scripted harness (`support`): queue
//! order, interrupts of queued and running turns, steer, approvals, capabilities the
//! harness lacks, the harness dying mid-turn, the idle watchdog, and a restart whose
//! conversation was lost. Every test runs on paused time and waits for calls and
//! reports, never for time to pass; each asserts whole reports.
//!
//! Over 600 lines: one test per worker behaviour, each with its whole report sequence.
//! The fake and the shared set-up are in `support`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use relay_harnesses::seam::{Capabilities, Endpoint, Lost, OpenedSession};
use relay_harnesses::HarnessError;
use relay_protocol::domain::{
    AgentState, ApprovalDecision, ApprovalKind, ApprovalRequest, FlightChange, FlightState, Harness,
};
use relay_protocol::harness::{HarnessEvent, TurnOutcome};
use relay_protocol::runtime::{Control, Report};
use relay_runtime::RuntimeError;
use support::*;

const H: Harness = Harness::ClaudeStreamJson;

fn done(turn_id: &str, text: &str) -> HarnessEvent {
    HarnessEvent::TurnCompleted {
        turn_id: turn_id.into(),
        outcome: TurnOutcome::Completed { text: text.into() },
    }
}

fn delta(turn_id: &str, text: &str) -> HarnessEvent {
    HarnessEvent::TextDelta {
        turn_id: turn_id.into(),
        item_id: "i1".into(),
        delta: text.into(),
    }
}

fn interrupt(f: &str) -> Control {
    Control::Interrupt {
        agent: "a1".into(),
        flight: f.into(),
    }
}

fn steer(f: &str, text: &str) -> Control {
    Control::Steer {
        agent: "a1".into(),
        flight: f.into(),
        text: text.into(),
        max_task_bytes: None,
        by: None,
    }
}

fn cancelled_before_its_turn(f: &str) -> Report {
    state(
        f,
        FlightState::Cancelled,
        Some("interrupted before its turn started"),
    )
}

/// A turn from dispatch to reply: every report in order, the session opened with no
/// stored conversation, the turn started with its task and the flight's id for a
/// harness that might have none, the reply made of the deltas when the end has no text.
#[tokio::test(start_paused = true)]
async fn a_turn_runs_through_the_seam_and_is_reported_in_order() {
    let (launcher, mut script) = full();
    let (_dir, runtime, mut reports, _stop) = runtime(launcher, None);
    runtime
        .dispatch(dispatch(H, "f1", "say hello"))
        .await
        .unwrap();
    let events = script.session_up(None, "c1").await;
    let (conversation, text, relay_turn_id) = expect_call!(script,
    Call::StartTurn { conversation, text, relay_turn_id, reply } => {
        reply.send(Ok("t1".into())).unwrap();
        (conversation, text, relay_turn_id)
    });
    assert_eq!(
        (conversation.as_str(), text.as_str(), relay_turn_id.as_str()),
        ("c1", "say hello", "f1")
    );
    events.send(delta("t1", "hel")).await.unwrap();
    events.send(delta("other-turn", "stray")).await.unwrap();
    events.send(delta("t1", "lo")).await.unwrap();
    events.send(done("t1", "")).await.unwrap();

    let mut want = vec![state("f1", FlightState::Waking, None)];
    want.extend(came_up(H, "c1", &Endpoint::Process { pid: PID }));
    want.extend(turn_began("f1", "c1", "t1"));
    want.extend([
        flight("f1", FlightChange::Delta { text: "hel".into() }),
        flight("f1", FlightChange::Delta { text: "lo".into() }),
        completed("f1", "hello"),
    ]);
    assert_eq!(reports.take(want.len()).await, want);
    assert!(reports.quiet() && script.quiet());
    // The conversation is stored for the next session.
    assert_eq!(
        runtime
            .threads()
            .get("a1")
            .await
            .unwrap()
            .map(|r| (r.harness, r.thread_id)),
        Some(("claude_stream_json".to_string(), "c1".to_string()))
    );
}

/// Turns of one agent run one at a time, in the order they came; a flight still queued
/// can be interrupted (it never starts) or steered (its task grows), and neither
/// touches the turn that runs.
#[tokio::test(start_paused = true)]
async fn queued_turns_run_in_order_and_can_be_interrupted_or_steered_while_they_wait() {
    let (launcher, mut script) = full();
    let (_dir, runtime, mut reports, _stop) = runtime(launcher, None);
    for (f, task) in [("f1", "first"), ("f2", "second"), ("f3", "third")] {
        runtime.dispatch(dispatch(H, f, task)).await.unwrap();
    }
    let events = script.session_up(None, "c1").await;
    assert_eq!(script.turn_started("t1").await, "first");
    events.send(delta("t1", "one")).await.unwrap();
    let mut want = vec![state("f1", FlightState::Waking, None)];
    want.extend(came_up(H, "c1", &Endpoint::Process { pid: PID }));
    want.extend(turn_began("f1", "c1", "t1"));
    want.push(flight("f1", FlightChange::Delta { text: "one".into() }));
    assert_eq!(reports.take(want.len()).await, want);
    // f1's turn runs (its delta is through); f2 and f3 wait, untouched.
    assert!(script.quiet());

    runtime.control(interrupt("f2")).await.unwrap();
    runtime.control(steer("f3", "and a fourth")).await.unwrap();
    assert_eq!(
        reports.take(2).await,
        vec![
            cancelled_before_its_turn("f2"),
            flight(
                "f3",
                FlightChange::Note {
                    text: "steered while queued (added to the task): and a fourth".into(),
                    by: None,
                }
            ),
        ]
    );
    assert!(script.quiet(), "the running turn was not disturbed");

    events.send(done("t1", "one")).await.unwrap();
    // Next is f3, with the steer in its task: f2 never starts.
    assert_eq!(script.turn_started("t3").await, "third\n\nand a fourth");
    events.send(done("t3", "three")).await.unwrap();
    let mut want = vec![completed("f1", "one")];
    want.extend(turn_began("f3", "c1", "t3"));
    want.push(completed("f3", "three"));
    assert_eq!(reports.take(want.len()).await, want);
    assert!(reports.quiet() && script.quiet());
}

/// An interrupt of the running turn reaches the harness; one refused because the turn
/// is not active yet (typed, not read from a message) is tried again 100 ms later; the
/// flight is cancelled when the harness ends the turn as interrupted.
#[tokio::test(start_paused = true)]
async fn an_interrupt_of_the_running_turn_is_retried_while_the_harness_has_no_active_turn() {
    let mut r = running("long", None).await;

    let control = control_soon(&r.runtime, interrupt("f1"));
    let first = expect_call!(r.script, Call::Interrupt { conversation, turn_id, reply } => {
        assert_eq!((conversation.as_str(), turn_id.as_str()), ("c1", "t1"));
        reply
            .send(Err(HarnessError::NoActiveTurn {
                detail: "no active turn to interrupt".into(),
            }))
            .unwrap();
        tokio::time::Instant::now()
    });
    expect_call!(r.script, Call::Interrupt { reply, .. } => reply.send(Ok(())).unwrap());
    assert_eq!(first.elapsed(), Duration::from_millis(100));
    control.await.unwrap().unwrap();

    r.events
        .send(HarnessEvent::TurnCompleted {
            turn_id: "t1".into(),
            outcome: TurnOutcome::Interrupted,
        })
        .await
        .unwrap();
    let want = vec![state("f1", FlightState::Cancelled, Some("interrupted"))];
    assert_eq!(r.reports.take(want.len()).await, want);
}

/// A steer of the running turn reaches the harness with its conversation and turn, and
/// is noted on the flight; a control naming a flight that is not running is refused.
#[tokio::test(start_paused = true)]
async fn a_steer_reaches_the_running_turn_and_a_control_of_another_flight_is_refused() {
    let mut r = running("poem", None).await;

    let control = control_soon(&r.runtime, steer("f1", "about rust"));
    expect_call!(r.script, Call::Steer { conversation, turn_id, text, reply } => {
        assert_eq!(
            (conversation.as_str(), turn_id.as_str(), text.as_str()),
            ("c1", "t1", "about rust")
        );
        reply.send(Ok(())).unwrap();
    });
    control.await.unwrap().unwrap();
    assert_eq!(
        r.reports.next().await,
        flight(
            "f1",
            FlightChange::Note {
                text: "steered: about rust".into(),
                by: None,
            }
        )
    );

    let err = r.runtime.control(steer("f9", "x")).await.unwrap_err();
    assert!(
        matches!(&err, RuntimeError::NotRunning { flight, agent } if flight == "f9" && agent == "a1"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "flight f9 is not the turn running on agent \"a1\""
    );
    assert!(r.script.quiet());
}

/// An approval request becomes a report; Relay's answer reaches the harness, and the
/// harness settling it while the answer is on its way is that answer, not a
/// withdrawal. A request the harness settles by itself is closed as withdrawn and the
/// flight runs again. Whatever is still open expires when the turn ends.
#[tokio::test(start_paused = true)]
async fn approvals_are_answered_through_the_seam_and_withdrawals_are_told_apart() {
    let mut r = running("run it", None).await;

    let ask = |request: &str| HarnessEvent::ApprovalRequested {
        turn_id: "t1".into(),
        request_id: request.into(),
        kind: ApprovalKind::Command,
        detail: "cargo test".into(),
        reason: Some("needs the network".into()),
    };
    let asked = |request: &str| Report::ApprovalRequested {
        agent: "a1".into(),
        request: ApprovalRequest {
            flight: "f1".into(),
            kind: ApprovalKind::Command,
            detail: "cargo test".into(),
            reason: Some("needs the network".into()),
            harness_request_id: request.into(),
        },
    };
    r.events.send(ask("r1")).await.unwrap();
    assert_eq!(r.reports.next().await, asked("r1"));

    let control = control_soon(
        &r.runtime,
        Control::Approval {
            agent: "a1".into(),
            flight: "f1".into(),
            harness_request_id: "r1".into(),
            decision: ApprovalDecision::Accept,
        },
    );
    expect_call!(r.script, Call::Approve { request_id, decision, reply } => {
        assert_eq!((request_id.as_str(), decision), ("r1", ApprovalDecision::Accept));
        // The harness settles it before the answer's call returns.
        r.events
            .send(HarnessEvent::ApprovalResolved { request_id: "r1".into() })
            .await
            .unwrap();
        r.events.send(delta("t1", "ran")).await.unwrap();
        reply.send(Ok(())).unwrap();
    });
    control.await.unwrap().unwrap();
    // No expiry for r1: the delta is the next report.
    assert_eq!(
        r.reports.next().await,
        flight("f1", FlightChange::Delta { text: "ran".into() })
    );

    r.events.send(ask("r2")).await.unwrap();
    r.events
        .send(HarnessEvent::ApprovalResolved {
            request_id: "r2".into(),
        })
        .await
        .unwrap();
    // r3 is never answered: it expires with the turn, by itself (answered ones do not:
    // their decision is recorded by whoever answered).
    r.events.send(ask("r3")).await.unwrap();
    r.events.send(done("t1", "ran")).await.unwrap();
    let want = vec![
        asked("r2"),
        Report::ApprovalsExpired {
            flight: "f1".into(),
            // Recorded under the harness's short name (the fake registers as H).
            by: Some(relay_protocol::domain::decider::withdrawn(H)),
            request: Some("r2".into()),
        },
        state(
            "f1",
            FlightState::Running,
            Some("fake withdrew its approval request"),
        ),
        asked("r3"),
        completed("f1", "ran"),
        Report::ApprovalsExpired {
            flight: "f1".into(),
            by: None,
            request: Some("r3".into()),
        },
    ];
    assert_eq!(r.reports.take(want.len()).await, want);
}

/// A harness declares what it cannot do: the worker refuses such a control with the
/// reason and never calls the harness for it; a turn it cannot interrupt (the idle
/// watchdog's) ends with its session instead. A pane is reported as the endpoint.
#[tokio::test(start_paused = true)]
async fn what_a_harness_cannot_do_is_refused_with_a_reason_not_attempted() {
    let none = Capabilities {
        fork: false,
        steer: false,
        approvals: false,
        resume: false,
        interrupt: false,
        turn_ids: false,
        reply: false,
    };
    let pane = Endpoint::Pane {
        pane: "relay:a1.0".into(),
    };
    let (launcher, mut script) = scripted(Harness::Tmux, none, pane.clone());
    let (_dir, runtime, mut reports, _stop) = runtime(launcher, Some(Duration::from_secs(60)));
    runtime
        .dispatch(dispatch(Harness::Tmux, "f1", "task"))
        .await
        .unwrap();
    let _events = script.session_up(None, "c1").await;
    script.turn_started("f1").await;
    let mut want = vec![state("f1", FlightState::Waking, None)];
    want.extend(came_up(Harness::Tmux, "c1", &pane));
    want.extend(turn_began("f1", "c1", "f1"));
    assert_eq!(reports.take(want.len()).await, want);

    let approval = Control::Approval {
        agent: "a1".into(),
        flight: "f1".into(),
        harness_request_id: "r1".into(),
        decision: ApprovalDecision::Accept,
    };
    for (control, what) in [
        (
            steer("f1", "more"),
            "steer a running turn: interrupt it (`relay interrupt FLIGHT`) and ask again with the added text, or ask a follow-up once it ends",
        ),
        (interrupt("f1"), "interrupt a running turn"),
        (approval, "answer approval requests"),
        (
            Control::Reply {
                agent: "a1".into(),
                flight: "f1".into(),
                text: "done".into(),
            },
            "take an answer through Relay (its turns end on their own, with the agent's reply)",
        ),
    ] {
        let err = runtime.control(control).await.unwrap_err();
        assert!(
            matches!(err, RuntimeError::Unsupported { harness: Harness::Tmux, what: w } if w == what),
            "{err:?}"
        );
        assert_eq!(err.to_string(), format!("harness tmux cannot {what}"));
    }
    assert!(script.quiet(), "the harness was never asked");

    // Nothing for 60 s: the turn cannot be interrupted, so its session is stopped.
    let started = tokio::time::Instant::now();
    expect_call!(script, Call::Shutdown => ());
    assert_eq!(started.elapsed(), Duration::from_secs(60));
    let want = vec![
        agent(AgentState::Offline),
        state(
            "f1",
            FlightState::Failed,
            Some("fake sent nothing for 60 s (is its model reachable?); the turn was interrupted"),
        ),
    ];
    assert_eq!(reports.take(want.len()).await, want);
}

/// The idle watchdog on paused time: after exactly the limit without an event (a
/// warning does not count), the worker interrupts the turn itself and fails the flight.
#[tokio::test(start_paused = true)]
async fn a_turn_that_hears_nothing_is_interrupted_by_the_idle_watchdog() {
    let mut r = running("hang", Some(Duration::from_secs(600))).await;
    let started = tokio::time::Instant::now();
    r.events
        .send(HarnessEvent::Warning {
            message: "reconnecting".into(),
        })
        .await
        .unwrap();
    expect_call!(r.script, Call::Interrupt { turn_id, reply, .. } => {
        assert_eq!(turn_id, "t1");
        reply.send(Ok(())).unwrap();
    });
    assert_eq!(started.elapsed(), Duration::from_secs(600));
    let want = vec![
        flight(
            "f1",
            FlightChange::Note {
                text: "reconnecting".into(),
                by: None,
            },
        ),
        state(
            "f1",
            FlightState::Failed,
            Some("fake sent nothing for 600 s (is its model reachable?); the turn was interrupted"),
        ),
    ];
    assert_eq!(r.reports.take(want.len()).await, want);
}

/// The harness dies mid-turn: the flight fails with how it died and its stderr tail, a
/// control still waiting on it is answered, the agent goes offline; the next turn spawns
/// a new session that resumes the same conversation.
#[tokio::test(start_paused = true)]
async fn a_harness_dying_mid_turn_fails_the_flight_and_the_next_turn_resumes() {
    let mut r = running("work", None).await;

    let control = control_soon(&r.runtime, steer("f1", "faster"));
    // The steer waits on the harness, which dies instead of answering.
    let unanswered = expect_call!(r.script, Call::Steer { reply, .. } => reply);
    r.events
        .send(HarnessEvent::ProcessExited {
            code: None,
            signal: Some(9),
            stderr_tail: "panic: boom\n".into(),
        })
        .await
        .unwrap();
    let err = control.await.unwrap().unwrap_err();
    assert!(
        matches!(&err, RuntimeError::TurnEnded { flight, harness: "fake" } if flight == "f1"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "the turn of flight f1 ended before fake took this"
    );
    drop(unanswered);
    let want = vec![
        state(
            "f1",
            FlightState::Failed,
            Some("fake-cli was killed by signal 9 mid-turn; stderr tail:\npanic: boom"),
        ),
        agent(AgentState::Offline),
    ];
    assert_eq!(r.reports.take(want.len()).await, want);

    r.runtime
        .dispatch(dispatch(H, "f2", "again"))
        .await
        .unwrap();
    let events = r.script.session_up(Some("c1"), "c1").await;
    r.script.turn_started("t2").await;
    events.send(done("t2", "back")).await.unwrap();
    let mut want = vec![state("f2", FlightState::Waking, None)];
    want.extend(came_up(H, "c1", &Endpoint::Process { pid: PID }));
    want.extend(turn_began("f2", "c1", "t2"));
    want.push(completed("f2", "back"));
    assert_eq!(r.reports.take(want.len()).await, want);
}

/// A session that cannot start fails the flight with the harness's error and the agent
/// is reported failed, not left starting; an agent whose harness this runtime has no
/// launcher for fails with the harnesses it has.
#[tokio::test(start_paused = true)]
async fn a_session_that_cannot_start_fails_the_flight_with_the_reason() {
    let (launcher, mut script) = full();
    let (_dir, runtime, mut reports, _stop) = runtime(launcher, None);
    runtime.dispatch(dispatch(H, "f1", "x")).await.unwrap();
    expect_call!(script, Call::Spawn { reply, .. } => {
        reply
            .send(Err(HarnessError::Spawn {
                program: "/opt/fake".into(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            }))
            .unwrap();
    });
    runtime
        .dispatch(dispatch(Harness::PiRpc, "f2", "y"))
        .await
        .unwrap();
    let want = vec![
        state("f1", FlightState::Waking, None),
        agent(AgentState::Starting),
        agent_because(
            AgentState::Failed,
            "cannot start fake-cli: cannot start /opt/fake: entity not found",
        ),
        state(
            "f1",
            FlightState::Failed,
            Some("cannot start fake-cli: cannot start /opt/fake: entity not found"),
        ),
        state("f2", FlightState::Waking, None),
        state(
            "f2",
            FlightState::Failed,
            Some("harness pi_rpc is not supported by this runtime yet (only claude_stream_json)"),
        ),
    ];
    assert_eq!(reports.take(want.len()).await, want);
    assert!(script.quiet());
}

/// A restart: the new runtime's session is asked to resume the stored conversation;
/// when the harness has lost it, the loss is reported (not hidden) and the new id is
/// stored. A harness that cannot resume is not asked to: the worker records the loss.
#[tokio::test(start_paused = true)]
async fn after_a_restart_the_stored_conversation_is_resumed_or_its_loss_reported() {
    let dir = tempfile::tempdir().unwrap();
    let db = relay_infra::storage::Durable::new(
        relay_infra::storage::config()
            .path(dir.path().join("db"))
            .open()
            .unwrap(),
    );
    // First life: the conversation c1 is stored.
    {
        let (launcher, mut script) = full();
        let (runtime, mut reports, stop) = runtime_in(dir.path(), Some(db.clone()), launcher, None);
        runtime.dispatch(dispatch(H, "f1", "one")).await.unwrap();
        let events = script.session_up(None, "c1").await;
        script.turn_started("t1").await;
        events.send(done("t1", "ok")).await.unwrap();
        reports.take(1 + 2 + 2 + 1).await; // waking, the session up, the turn began, completed
        stop.cancel();
        runtime.stopped().await;
        expect_call!(script, Call::Shutdown => ());
        assert_eq!(reports.next().await, agent(AgentState::Offline));
    }
    // Second life: the harness no longer has c1 and starts c2.
    {
        let (launcher, mut script) = full();
        let (runtime, mut reports, stop) = runtime_in(dir.path(), Some(db.clone()), launcher, None);
        runtime.dispatch(dispatch(H, "f2", "two")).await.unwrap();
        expect_call!(script, Call::Spawn { reply, .. } => reply.send(Ok(())).unwrap());
        expect_call!(script, Call::Open { stored, reply } => {
            assert_eq!(stored.as_deref(), Some("c1"));
            reply
                .send(Ok(OpenedSession {
                    id: "c2".into(),
                    lost: Some(Lost {
                        old_id: "c1".into(),
                        reason: "fake lost c1".into(),
                    }),
                }))
                .unwrap();
        });
        let want = vec![
            state("f2", FlightState::Waking, None),
            agent(AgentState::Starting),
            Report::ThreadLost {
                agent: "a1".into(),
                old_thread_id: "c1".into(),
                new_thread_id: "c2".into(),
                reason: "fake lost c1".into(),
            },
        ];
        assert_eq!(reports.take(want.len()).await, want);
        assert_eq!(
            reports.next().await,
            came_up(H, "c2", &Endpoint::Process { pid: PID })[1]
        );
        assert_eq!(
            runtime
                .threads()
                .get("a1")
                .await
                .unwrap()
                .map(|r| r.thread_id),
            Some("c2".to_string())
        );
        stop.cancel();
        runtime.stopped().await;
    }
    // Third life, on a harness that cannot resume: never asked to; the loss is Relay's
    // to report.
    {
        let no_resume = Capabilities {
            resume: false,
            ..Capabilities::ALL
        };
        let (launcher, mut script) = scripted(H, no_resume, Endpoint::Process { pid: PID });
        let (runtime, mut reports, _stop) =
            runtime_in(dir.path(), Some(db.clone()), launcher, None);
        runtime.dispatch(dispatch(H, "f3", "three")).await.unwrap();
        script.session_up(None, "c3").await;
        let want = vec![
            state("f3", FlightState::Waking, None),
            agent(AgentState::Starting),
            Report::ThreadLost {
                agent: "a1".into(),
                old_thread_id: "c2".into(),
                new_thread_id: "c3".into(),
                reason:
                    "fake cannot resume a conversation; started c3 without the earlier conversation"
                        .into(),
            },
        ];
        assert_eq!(reports.take(want.len()).await, want);
    }
}
