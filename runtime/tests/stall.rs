//! The stall watchdog (`RuntimeConfig::turn_stall_timeout`), on paused time with the
//! scripted harness of `support`: after a harness retry note ("Reconnecting..."; a plain
//! warning does not count), a turn that
//! makes no progress for the limit, counted from that first note, is interrupted and
//! fails with the latest note as its cause; progress disarms it, and the next note arms
//! it afresh; waiting for an approval does not count. Each test asserts whole reports.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use relay_protocol::domain::{ApprovalKind, ApprovalRequest, FlightChange, FlightState};
use relay_protocol::harness::{HarnessEvent, TurnOutcome};
use relay_protocol::runtime::Report;
use support::*;

const STALL: Duration = Duration::from_secs(60);
const IDLE: Duration = Duration::from_secs(600);

fn retrying(text: &str) -> HarnessEvent {
    HarnessEvent::Retrying {
        message: text.into(),
    }
}

fn note(text: &str) -> Report {
    flight(
        f(),
        FlightChange::Note {
            text: text.into(),
            by: None,
        },
    )
}

fn f() -> &'static str {
    "f1"
}

/// The reports of a turn the watchdog failed with `latest` as its cause (after its
/// interrupt).
async fn failed_stalled(r: &mut Running, latest: &str) {
    let why =
        format!("fake could not reach its model for 60 s: {latest}; the turn was interrupted");
    let want = vec![state(f(), FlightState::Failed, Some(&why))];
    assert_eq!(r.reports.take(want.len()).await, want);
}

/// The turn ends on its own (`done`), and nothing interrupted it; the approval
/// requests in `unanswered` expire with it.
async fn completes_uninterrupted(r: &mut Running, unanswered: &[&str]) {
    r.events
        .send(HarnessEvent::TurnCompleted {
            turn_id: "t1".into(),
            outcome: TurnOutcome::Completed {
                text: "done".into(),
            },
        })
        .await
        .unwrap();
    let mut want = vec![completed(f(), "done")];
    want.extend(unanswered.iter().map(|request| Report::ApprovalsExpired {
        flight: f().into(),
        by: None,
        request: Some(request.to_string()),
    }));
    assert_eq!(r.reports.take(want.len()).await, want);
    assert!(r.script.quiet(), "the harness was interrupted");
}

/// Notes keep coming (codex retries with a growing pause) but nothing else: the turn
/// fails exactly the limit after the FIRST note, with the latest one as its cause; the
/// idle watchdog (600 s) never gets its turn.
#[tokio::test(start_paused = true)]
async fn a_turn_that_only_retries_fails_with_its_latest_note_after_the_limit() {
    let mut r = running_stalling("hang", Some(IDLE), Some(STALL)).await;
    let started = tokio::time::Instant::now();
    r.events
        .send(retrying("Reconnecting... 1/5"))
        .await
        .unwrap();
    assert_eq!(r.reports.take(1).await, vec![note("Reconnecting... 1/5")]);
    tokio::time::sleep(Duration::from_secs(40)).await;
    r.events
        .send(retrying("Reconnecting... 2/5"))
        .await
        .unwrap();
    assert_eq!(r.reports.take(1).await, vec![note("Reconnecting... 2/5")]);
    expect_call!(r.script, Call::Interrupt { turn_id, reply, .. } => {
        assert_eq!(turn_id, "t1");
        reply.send(Ok(())).unwrap();
    });
    assert_eq!(started.elapsed(), STALL);
    failed_stalled(&mut r, "Reconnecting... 2/5").await;
}

/// Progress after a note disarms the watchdog: a turn that recovered (text streams
/// again) and then thinks quietly for longer than the limit is not failed; a new note
/// arms it again, from that note.
#[tokio::test(start_paused = true)]
async fn progress_after_a_note_disarms_it_and_the_next_note_arms_it_afresh() {
    let mut r = running_stalling("recovers", Some(IDLE), Some(STALL)).await;
    r.events
        .send(retrying("Reconnecting... 1/5"))
        .await
        .unwrap();
    assert_eq!(r.reports.take(1).await, vec![note("Reconnecting... 1/5")]);
    tokio::time::sleep(Duration::from_secs(50)).await;
    r.events
        .send(HarnessEvent::TextDelta {
            turn_id: "t1".into(),
            item_id: "i1".into(),
            delta: "back".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        r.reports.take(1).await,
        vec![flight(
            f(),
            FlightChange::Delta {
                text: "back".into()
            }
        )]
    );
    // Quiet for 5 minutes: longer than the stall limit, shorter than the idle one.
    tokio::time::sleep(Duration::from_secs(300)).await;
    let armed = tokio::time::Instant::now();
    r.events.send(retrying("rate limited")).await.unwrap();
    assert_eq!(r.reports.take(1).await, vec![note("rate limited")]);
    expect_call!(r.script, Call::Interrupt { reply, .. } => {
        reply.send(Ok(())).unwrap();
    });
    assert_eq!(armed.elapsed(), STALL);
    failed_stalled(&mut r, "rate limited").await;
}

/// A note, then an approval request: the turn waits for a person, which is not a stall,
/// however long; the turn then completes.
#[tokio::test(start_paused = true)]
async fn waiting_for_an_approval_is_not_a_stall() {
    let mut r = running_stalling("asks", None, Some(STALL)).await;
    r.events.send(retrying("slow network")).await.unwrap();
    r.events
        .send(HarnessEvent::ApprovalRequested {
            turn_id: "t1".into(),
            request_id: "r1".into(),
            kind: ApprovalKind::Command,
            detail: "ls".into(),
            reason: None,
        })
        .await
        .unwrap();
    let want = vec![
        note("slow network"),
        Report::ApprovalRequested {
            agent: "a1".into(),
            request: ApprovalRequest {
                flight: f().into(),
                kind: ApprovalKind::Command,
                detail: "ls".into(),
                reason: None,
                harness_request_id: "r1".into(),
            },
        },
    ];
    assert_eq!(r.reports.take(want.len()).await, want);
    tokio::time::sleep(STALL * 10).await;
    completes_uninterrupted(&mut r, &["r1"]).await;
}

/// A plain warning (codex's "Model metadata ... not found", an MCP server that did not
/// start) is a note, not a retry: it does not start the watchdog, however quiet the turn
/// is afterwards (shorter than the idle limit).
#[tokio::test(start_paused = true)]
async fn a_plain_warning_is_a_note_but_not_a_stall() {
    let mut r = running_stalling("warned", Some(IDLE), Some(STALL)).await;
    r.events
        .send(HarnessEvent::Warning {
            message: "Model metadata for `m` not found".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        r.reports.take(1).await,
        vec![note("Model metadata for `m` not found")]
    );
    tokio::time::sleep(STALL * 5).await;
    completes_uninterrupted(&mut r, &[]).await;
}

/// The quiet note (`RuntimeConfig::turn_quiet_note`): a turn its harness says nothing of
/// for the limit gets a note saying so and naming how to stop it, again every minute
/// while it stays quiet; anything from the harness starts the count afresh; the turn
/// goes on (only the idle watchdog ends a quiet turn).
#[tokio::test(start_paused = true)]
async fn a_quiet_turn_gets_a_note_saying_so_and_goes_on() {
    let quiet = Duration::from_secs(30);
    let mut r = running_watched("hang", Some(IDLE), None, Some(quiet)).await;
    let started = tokio::time::Instant::now();
    let said = |secs: u64| {
        note(&format!(
            "no word from fake for {secs} s: its model may be slow or unreachable (it may be retrying); `relay interrupt f1` stops the turn"
        ))
    };
    assert_eq!(r.reports.take(1).await, vec![said(30)]);
    assert_eq!(started.elapsed(), quiet, "the note came at the limit");
    assert_eq!(r.reports.take(1).await, vec![said(90)]);
    // A word from the harness: the count starts again from it.
    r.events
        .send(HarnessEvent::Warning {
            message: "still here".into(),
        })
        .await
        .unwrap();
    assert_eq!(r.reports.take(1).await, vec![note("still here")]);
    let spoke = tokio::time::Instant::now();
    assert_eq!(r.reports.take(1).await, vec![said(30)]);
    assert_eq!(spoke.elapsed(), quiet);
    completes_uninterrupted(&mut r, &[]).await;
}
