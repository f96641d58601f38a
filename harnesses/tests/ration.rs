//! Fair reading beside a burst (`relay_harnesses::ration`), with real child processes:
//! two children writing 50,000 lines as fast as they can, while a third streams a line
//! every few milliseconds, are read at the shared pace, each line whole and in order;
//! every child is gone at the end.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::Duration;

use relay_harnesses::process::ProcessSpec;
use relay_harnesses::stdio::{Action, StdioChild, Wire};
use relay_protocol::harness::HarnessEvent;
use relay_tests::procs;
use tokio::sync::mpsc;

const LINES: u64 = 50_000;
const WAIT: Duration = Duration::from_secs(120);

/// Each stdout line becomes a delta of the turn named after the child.
struct Lines(&'static str);

impl Wire for Lines {
    const NAME: &'static str = "lines";
    fn line(&mut self, line: &str, out: &mut Vec<Action>) {
        out.push(Action::Event(HarnessEvent::TextDelta {
            turn_id: self.0.into(),
            item_id: String::new(),
            delta: line.into(),
        }));
    }
}

fn spawn(
    name: &'static str,
    script: &str,
    events: &mpsc::Sender<HarnessEvent>,
) -> StdioChild<Lines> {
    let spec = ProcessSpec {
        program: "/bin/sh".into(),
        args: vec!["-c".into(), script.into()],
        ..Default::default()
    };
    StdioChild::spawn(
        &spec,
        Lines(name),
        events.clone(),
        Duration::from_secs(30),
        Duration::from_millis(200),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bursts_beside_a_stream_are_read_at_a_shared_pace_whole_and_in_order() {
    let (tx, mut rx) = mpsc::channel(1024);
    let stream = spawn("b", "while :; do echo b; sleep 0.005; done", &tx);
    // The stream has started before the bursts do.
    let first = tokio::time::timeout(WAIT, rx.recv()).await.unwrap();
    assert!(matches!(first, Some(HarnessEvent::TextDelta { ref turn_id, .. }) if turn_id == "b"));

    let script = format!("seq 1 {LINES}");
    let bursts = [spawn("a1", &script, &tx), spawn("a2", &script, &tx)];
    // Each burst's lines, checked in order as they come; the stream's, counted.
    let mut next: HashMap<String, u64> = HashMap::new();
    let mut streamed = 0u64;
    let read_all = async {
        while next.values().filter(|&&n| n == LINES).count() < 2 {
            let Some(HarnessEvent::TextDelta { turn_id, delta, .. }) = rx.recv().await else {
                panic!("the events ended before the bursts were read");
            };
            if turn_id == "b" {
                streamed += 1;
                continue;
            }
            let n = next.entry(turn_id.clone()).or_default();
            *n += 1;
            assert_eq!(
                delta,
                n.to_string(),
                "{turn_id}: line {n} lost or out of order"
            );
        }
    };
    tokio::time::timeout(WAIT, read_all)
        .await
        .expect("the bursts were not read whole");
    // Both bursts were held to the shared pace, and the stream went on meanwhile.
    for (burst, name) in bursts.iter().zip(["a1", "a2"]) {
        assert!(burst.rationed_windows() > 0, "{name} was never held");
    }
    assert!(streamed > 0, "the stream was not read during the bursts");
    // A stream at a few hundred lines a second is never held.
    assert_eq!(stream.rationed_windows(), 0);

    let pids: Vec<u32> = bursts
        .iter()
        .chain([&stream])
        .map(StdioChild::pid)
        .collect();
    for child in bursts.iter().chain([&stream]) {
        child.shutdown().await;
    }
    for pid in pids {
        assert!(
            procs::wait_gone(pid, Duration::from_secs(20)).await,
            "child {pid} outlived its shutdown"
        );
    }
}
