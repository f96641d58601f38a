//! A crash in the middle of a batch going into sled, over real sled files: the batch is
//! in the event log, and sled got only its first key writes, after each of them in turn
//! (`Store::crash_sled_after`). The next open counts what the batch moves once, as a
//! rebuild from the log does:
//! - a flight's usage report, in the usage counters (by day and by tree);
//! - a decision made by a remembered rule, in the rule's matches;
//! - and when the restart's own catch-up of sled is cut short too, or a rebuild of sled
//!   (`Store::open_crashing`), the open after that still counts the report once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use relay_broker::ops::{self, Via};
use relay_broker::store::Store;
use relay_broker::{remembered, Broker, Command, Outcome};
use relay_protocol::clock::{now_ms, utc_date};
use relay_protocol::domain::{
    AgentSpec, Approval, ApprovalDecision, ApprovalKind, ApprovalRequest, FlightChange,
    FlightState, Harness, InvokeRequest, Remember, RuleScope, TokenUsage,
};

/// Key writes a batch of these tests may have, and more: every cut point is tried.
const MOST_WRITES: usize = 16;

fn consistent(store: &Store) {
    let report = store.verify().unwrap();
    assert!(report.is_consistent(), "{report:?}");
}

async fn update(b: &Broker, flight: &str, change: FlightChange) {
    b.update_flight(flight, change).await.unwrap();
}

fn usage(input: u64, cached: u64, output: u64) -> FlightChange {
    FlightChange::Usage(TokenUsage {
        cached_input_tokens: cached,
        ..TokenUsage::new(input, output)
    })
}

/// A flight that reported 10 input tokens, then 30 (5 cached) whose batch reached sled
/// with only `writes` key writes: its id.
async fn report_cut_short(path: &std::path::Path, writes: usize) -> String {
    let (b, stop, writer) = support::start(Store::open(path).unwrap()).await;
    b.register_agent(AgentSpec::new("a1", Harness::CodexAppServer, "/w"))
        .await
        .unwrap();
    let flight = b.invoke(InvokeRequest::new("a1", "go")).await.unwrap();
    let id = flight.flight.id;
    let running = FlightChange::State {
        to: FlightState::Running,
        reason: None,
        output: None,
    };
    update(&b, &id, running).await;
    update(&b, &id, usage(10, 0, 1)).await;
    b.store().crash_sled_after(writes);
    update(&b, &id, usage(30, 5, 3)).await;
    stop.cancel();
    drop(b);
    writer.await.unwrap();
    id
}

/// The report of [`report_cut_short`] counted once, as a rebuild from the log counts it.
fn counted_once(st: &Store, flight: &str, how: &str) {
    let day = st.usage_of_day("a1", &utc_date(now_ms())).unwrap();
    let got = (
        day.flights,
        day.input_tokens,
        day.cached_input_tokens,
        day.output_tokens,
    );
    assert_eq!(got, (1, 30, 5, 3), "{how}");
    assert_eq!(st.usage_of_tree(flight).unwrap().tokens, 33, "{how}");
    consistent(st);
}

#[tokio::test]
async fn a_usage_report_cut_short_counts_once() {
    for writes in 0..MOST_WRITES {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let flight = report_cut_short(&path, writes).await;
        let st = support::reopen(&path).await;
        counted_once(&st, &flight, &format!("cut after {writes} writes"));
    }
}

/// The restart after the cut batch is itself cut short while it catches sled up (each
/// of a few cut points of the report's batch, then each key write of the catch-up).
#[tokio::test]
async fn a_catch_up_cut_short_too_still_counts_once() {
    for first in [3, 5, 7] {
        for second in 0..MOST_WRITES {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("db");
            let flight = report_cut_short(&path, first).await;
            drop(Store::open_crashing(&path, second).unwrap());
            let st = support::reopen(&path).await;
            let how = format!("cut after {first}, then the catch-up after {second}");
            counted_once(&st, &flight, &how);
        }
    }
}

/// A rebuild of sled (its marker of where it stands damaged) cut short after each of its
/// key writes, with the marker of a batch cut short before it still there: the next
/// open rebuilds again, and never puts that batch's old counters into emptied trees.
#[tokio::test]
async fn a_rebuild_cut_short_rebuilds_again() {
    for writes in 0..40 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let flight = report_cut_short(&path, 5).await;
        {
            let st = support::reopen(&path).await;
            // Where the projections stand, said to be event 1 at the log's end: not
            // what the log holds there, so the next open rebuilds.
            let nowhere = relay_broker::store::pair_value(1, st.log().synced_end());
            let meta = st.tree(relay_broker::store::T::Meta);
            meta.insert(b"log_applied", &nowhere[..]).unwrap();
            meta.flush().unwrap();
        }
        drop(Store::open_crashing(&path, writes).unwrap());
        let st = support::reopen(&path).await;
        counted_once(
            &st,
            &flight,
            &format!("the rebuild cut after {writes} writes"),
        );
    }
}

/// Agent `agent` asks to run `command`, in a new flight.
async fn ask(b: &Broker, agent: &str, command: &str) -> Approval {
    let flight = b.invoke(InvokeRequest::new(agent, "work")).await.unwrap();
    let request = ApprovalRequest {
        flight: flight.flight.id,
        kind: ApprovalKind::Command,
        detail: command.into(),
        reason: None,
        harness_request_id: "1".into(),
    };
    let asked = Command::RequestApproval {
        agent: agent.into(),
        request,
    };
    match b.execute(asked).await.unwrap() {
        Outcome::Approval(a) => a,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_rule_s_decision_cut_short_counts_its_match_once() {
    for writes in 0..MOST_WRITES {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let rule = {
            let (b, stop, writer) = support::start(Store::open(&path).unwrap()).await;
            b.register_agent(AgentSpec::new("a1", Harness::CodexAppServer, "/w"))
                .await
                .unwrap();
            let first = ask(&b, "a1", "cargo test").await;
            let remember = Remember {
                scope: RuleScope::Agent,
                any_arg: None,
            };
            let decided = ops::decide(
                &b,
                None,
                &first.id,
                ApprovalDecision::Accept,
                "ann",
                Some(Via::Client),
                Some(remember),
            )
            .await
            .unwrap();
            let again = ask(&b, "a1", "cargo test").await;
            let agent = b.agent("a1").await.unwrap().unwrap();
            b.store().crash_sled_after(writes);
            let by_rule = remembered::decide(&b, None, &again, &agent).await.unwrap();
            assert!(by_rule.is_some(), "decided by the rule");
            stop.cancel();
            drop(b);
            writer.await.unwrap();
            decided.remembered.expect("remembered")
        };
        let st = support::reopen(&path).await;
        let matched = st.rule(&rule).unwrap().map(|r| r.matched);
        assert_eq!(matched, Some(1), "cut after {writes} writes");
        consistent(&st);
    }
}
