//! `relay up --notify-command` under a burst: one turn raising 400 approvals at once
//! runs at most [`NOTIFY_POOL`] commands at a time (real `/bin/sh` processes), and what
//! waits meanwhile goes to one command that says how many it stands for; every approval
//! is told of.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use relay_broker::alerts::Notifier;
use relay_broker::tasks::Tasks;
use relay_protocol::domain::{Approval, ApprovalKind, ApprovalRequest, ApprovalState};
use relay_tests::wait_until;
use tokio_util::sync::CancellationToken;

/// Commands at once, at most (`relay_broker::alerts::NOTIFY_POOL`).
const POOL: usize = 4;
const APPROVALS: usize = 400;
/// A deadline against a hang, not a measure.
const DEADLINE: Duration = Duration::from_secs(120);

fn approval(i: usize) -> Approval {
    Approval {
        id: format!("apr_{i:04}"),
        agent: "cx".into(),
        request: ApprovalRequest {
            flight: "flt_1".into(),
            kind: ApprovalKind::Command,
            detail: format!("touch /tmp/{i}"),
            reason: None,
            harness_request_id: i.to_string(),
        },
        state: ApprovalState::Pending,
        decision: None,
        decided_by: None,
        created_at: 1,
        decided_at: None,
        remembered: None,
    }
}

/// The log's lines: `start COUNT ID` when a command starts, `end` when it ends.
fn lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_approvals_runs_a_bounded_pool_of_notify_commands_batched_when_over() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let release = dir.path().join("release");
    // Each command logs its start, holds its slot until the test releases it, logs its end.
    let command = format!(
        "echo \"start ${{RELAY_APPROVAL_COUNT:-1}} $RELAY_APPROVAL_ID\" >> '{log}'; \
         while [ ! -e '{release}' ]; do sleep 0.05; done; echo end >> '{log}'",
        log = log.display(),
        release = release.display()
    );
    let notifier = Notifier::new(&command, "http://127.0.0.1:1");
    let stop = CancellationToken::new();
    let tasks = Tasks::new(&stop);
    for i in 0..APPROVALS {
        notifier.approval_waits(&approval(i), &tasks);
    }
    // The pool fills...
    wait_until("the first commands to start", DEADLINE, || async {
        let n = lines(&log)
            .iter()
            .filter(|l| l.starts_with("start"))
            .count();
        (n >= POOL).then_some(())
    })
    .await;
    // ...and once they may end, the rest is told of.
    std::fs::write(&release, b"").unwrap();
    let done = wait_until("every approval to be told of", DEADLINE, || async {
        let lines = lines(&log);
        let starts: Vec<&String> = lines.iter().filter(|l| l.starts_with("start")).collect();
        let ends = lines.iter().filter(|l| *l == "end").count();
        let told: usize = starts
            .iter()
            .map(|l| l.split(' ').nth(1).unwrap().parse::<usize>().unwrap())
            .sum();
        (told >= APPROVALS && ends == starts.len()).then_some(lines)
    })
    .await;
    // Never more than the pool at once.
    let mut running: i64 = 0;
    let mut most = 0;
    for line in &done {
        running += if line.starts_with("start") { 1 } else { -1 };
        most = most.max(running);
    }
    assert!(
        most <= POOL as i64,
        "{most} notify commands ran at once (the pool is {POOL})"
    );
    let starts: Vec<&String> = done.iter().filter(|l| l.starts_with("start")).collect();
    assert_eq!(
        starts.len(),
        POOL + 1,
        "{POOL} commands, then one for everything that waited: {starts:?}"
    );
    let batch = starts.last().unwrap();
    assert_eq!(
        batch.as_str(),
        format!("start {} apr_{POOL:04}", APPROVALS - POOL),
        "the batch names the first approval that waited, and counts all of them"
    );
    // Each approval is told of once: a second report of the same one runs nothing.
    notifier.approval_waits(&approval(0), &tasks);
    let before = lines(&log).len();
    stop.cancel();
    tasks.stopped().await;
    assert_eq!(lines(&log).len(), before);
}
