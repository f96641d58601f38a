//! Reading a harness session's event stream in the tests of the real agent CLIs
//! (`harnesses/tests/{codex,claude,pi}.rs`): waiting for an event with a timeout,
//! collecting events up to one that matches, and looking into what a turn sent.
//!
//! Every wait takes its timeout from the caller (each CLI's tests have their own), and
//! panics when it runs out, so a bug fails the test instead of hanging it. A timeout is
//! a limit against a hang, never a measure.

// Test support: a failed wait or a broken stream is the test's failure, as a panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::time::Duration;

use relay_harnesses::HarnessSession;
use relay_protocol::harness::{HarnessEvent, ItemKind, TurnOutcome};
use tokio::sync::mpsc::Receiver;

use crate::procs;

/// `f`'s output; panics with "`what` timed out" if it takes longer than `wait`.
pub async fn within<T>(wait: Duration, what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(wait, f)
        .await
        .unwrap_or_else(|_| panic!("{what} timed out"))
}

/// The next event; panics if none comes within `wait` or the stream has ended.
pub async fn next(events: &mut Receiver<HarnessEvent>, wait: Duration) -> HarnessEvent {
    within(wait, "waiting for an event", events.recv())
        .await
        .expect("event stream ended")
}

/// Events up to and including the first one matching `done`, each within `wait` of the
/// one before.
pub async fn until(
    events: &mut Receiver<HarnessEvent>,
    wait: Duration,
    done: impl Fn(&HarnessEvent) -> bool,
) -> Vec<HarnessEvent> {
    let mut seen = Vec::new();
    loop {
        let event = next(events, wait).await;
        let stop = done(&event);
        seen.push(event);
        if stop {
            return seen;
        }
    }
}

/// Asserts that the stream ends (its sender is gone) within `wait`, with no more events.
pub async fn assert_ended(events: &mut Receiver<HarnessEvent>, wait: Duration) {
    if let Some(event) = within(wait, "the end of the event stream", events.recv()).await {
        panic!("expected the event stream to end, got {event:?}");
    }
}

/// Whether `event` ends a turn (`TurnCompleted`): [`until`] it, a turn's events.
pub fn is_turn_completed(event: &HarnessEvent) -> bool {
    matches!(event, HarnessEvent::TurnCompleted { .. })
}

/// Whether `event` reports the CLI's exit (`ProcessExited`), a session's last event.
pub fn is_process_exited(event: &HarnessEvent) -> bool {
    matches!(event, HarnessEvent::ProcessExited { .. })
}

/// Whether `event` is a text delta (`TextDelta`): the turn is streaming.
pub fn is_text_delta(event: &HarnessEvent) -> bool {
    matches!(event, HarnessEvent::TextDelta { .. })
}

/// Whether `event` asks for an approval (`ApprovalRequested`).
pub fn is_approval_requested(event: &HarnessEvent) -> bool {
    matches!(event, HarnessEvent::ApprovalRequested { .. })
}

/// The outcome of the turn whose events these are; panics unless the last one is its
/// `TurnCompleted`.
pub fn outcome(events: &[HarnessEvent]) -> TurnOutcome {
    match events.last() {
        Some(HarnessEvent::TurnCompleted { outcome, .. }) => outcome.clone(),
        other => panic!("expected TurnCompleted last, got {other:?}"),
    }
}

/// The turn-level events: its start, its text deltas and its end (no items, approvals,
/// warnings or usage).
pub fn turn_level(events: &[HarnessEvent]) -> Vec<HarnessEvent> {
    events
        .iter()
        .filter(|e| {
            matches!(
                e,
                HarnessEvent::TurnStarted { .. }
                    | HarnessEvent::TextDelta { .. }
                    | HarnessEvent::TurnCompleted { .. }
            )
        })
        .cloned()
        .collect()
}

/// The turn-level events (as [`turn_level`] keeps them) of turn `turn` streaming
/// `chunks` as the text deltas of item `item_id`, then completing with `text`.
pub fn streamed_turn(turn: &str, item_id: &str, chunks: &[&str], text: &str) -> Vec<HarnessEvent> {
    let mut events = vec![HarnessEvent::TurnStarted {
        turn_id: turn.to_string(),
    }];
    events.extend(chunks.iter().map(|c| HarnessEvent::TextDelta {
        turn_id: turn.to_string(),
        item_id: item_id.to_string(),
        delta: c.to_string(),
    }));
    events.push(HarnessEvent::TurnCompleted {
        turn_id: turn.to_string(),
        outcome: TurnOutcome::Completed {
            text: text.to_string(),
        },
    });
    events
}

/// The item of the first text delta, if any.
pub fn first_delta_item(events: &[HarnessEvent]) -> Option<String> {
    events.iter().find_map(|e| match e {
        HarnessEvent::TextDelta { item_id, .. } => Some(item_id.clone()),
        _ => None,
    })
}

/// The kind and text the first `ItemCompleted` of item `id` reports, if any.
pub fn completed_item(events: &[HarnessEvent], id: &str) -> Option<(ItemKind, Option<String>)> {
    events.iter().find_map(|e| match e {
        HarnessEvent::ItemCompleted {
            item_id,
            kind,
            text,
            ..
        } if item_id == id => Some((kind.clone(), text.clone())),
        _ => None,
    })
}

/// Whether every turn start, text delta, item, usage and turn end among `events` is of
/// turn `turn` (other events name no turn and pass).
pub fn all_in_turn(events: &[HarnessEvent], turn: &str) -> bool {
    events.iter().all(|e| match e {
        HarnessEvent::TurnStarted { turn_id }
        | HarnessEvent::TextDelta { turn_id, .. }
        | HarnessEvent::ItemStarted { turn_id, .. }
        | HarnessEvent::ItemCompleted { turn_id, .. }
        | HarnessEvent::TokenUsage { turn_id, .. }
        | HarnessEvent::TurnCompleted { turn_id, .. } => turn_id == turn,
        _ => true,
    })
}

/// Starts turn `turn` of `conversation` with `text` through the seam and returns its
/// events up to its `TurnCompleted`. For a CLI without turn ids of its own: the turn
/// must be called by Relay's id.
pub async fn run_turn(
    session: &dyn HarnessSession,
    events: &mut Receiver<HarnessEvent>,
    wait: Duration,
    conversation: &str,
    text: &str,
    turn: &str,
) -> Vec<HarnessEvent> {
    let id = within(
        wait,
        "start_turn",
        session.start_turn(conversation, text, turn),
    )
    .await
    .unwrap();
    assert_eq!(id, turn, "the CLI has no turn ids: Relay's is the turn's");
    until(events, wait, is_turn_completed).await
}

/// Shuts `session` down through the seam and returns the events up to its
/// `ProcessExited`, once its process group is gone (a session with no process, pid 0,
/// has none to wait for).
pub async fn shut_down(
    session: &dyn HarnessSession,
    events: &mut Receiver<HarnessEvent>,
    wait: Duration,
) -> Vec<HarnessEvent> {
    let pid = session
        .endpoint()
        .pid()
        .expect("the session runs as a process");
    within(wait, "shutdown", session.shutdown()).await.unwrap();
    let rest = until(events, wait, is_process_exited).await;
    if pid != 0 {
        procs::wait_group_gone(pid, wait).await;
    }
    rest
}
