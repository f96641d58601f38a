//! The feed of committed events as its followers read it in their own task
//! (`relay_broker::feed::Feed`, as the NATS publisher does: in a `select!` beside a
//! timer that cancels its read): from the log, live, and from the log again after
//! falling behind the live buffer, every event once and in order, while many clients
//! write at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use futures::future::join_all;
use relay_broker::broker::EVENT_BUFFER;
use relay_broker::feed::Feed;
use relay_broker::store::Store;
use relay_broker::Broker;
use relay_protocol::domain::{FlightChange, FlightState};
use tokio::sync::broadcast::error::TryRecvError;

const CLIENTS: usize = 8;

/// Each client streams `n` deltas into its own flight, all at once.
async fn stream(b: &Broker, flights: &[String], n: usize) {
    join_all(flights.iter().map(|id| async move {
        for k in 0..n {
            let text = format!("{k} ");
            b.update_flight(id, FlightChange::Delta { text })
                .await
                .unwrap();
        }
    }))
    .await;
}

/// Reads `feed` into `seqs` up to seq `last`, in a `select!` beside a timer (of 50 µs,
/// so tokio's next tick: at most 1 ms) that cancels a read still waiting, as the NATS
/// publisher's does.
async fn read_until(feed: &mut Feed, seqs: &mut Vec<u64>, last: u64) {
    let reading = async {
        while seqs.last().copied().unwrap_or(0) < last {
            tokio::select! {
                biased;
                item = feed.recv() => seqs.push(item.expect("the feed ended").unwrap().seq),
                _ = tokio::time::sleep(Duration::from_micros(50)) => {}
            }
        }
    };
    if tokio::time::timeout(Duration::from_secs(60), reading)
        .await
        .is_err()
    {
        panic!(
            "the feed stopped short of seq {last}: {} events",
            seqs.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cancelled_between_events_gets_each_once_and_in_order() {
    let (b, _stop, _writer) = support::start(Store::temporary().unwrap()).await;
    let flights = support::one_flight_each(&b, CLIENTS).await;
    for id in &flights {
        let running = FlightChange::State {
            to: FlightState::Running,
            reason: None,
            output: None,
        };
        b.update_flight(id, running).await.unwrap();
    }
    // Before the feed: read back from the log.
    stream(&b, &flights, 20).await;
    let mut feed = Feed::new(b.clone(), 0);
    // Its first read from the log, cancelled at once: it goes on for the next call.
    assert!(
        futures::FutureExt::now_or_never(feed.recv()).is_none(),
        "the log is read on the blocking pool"
    );
    let mut seqs = Vec::new();
    read_until(&mut feed, &mut seqs, b.last_seq()).await;

    // Live, while eight clients write at once.
    let writing = {
        let (b, flights) = (b.clone(), flights.clone());
        tokio::spawn(async move { stream(&b, &flights, 100).await })
    };
    while !writing.is_finished() || seqs.last() < Some(&b.last_seq()) {
        read_until(&mut feed, &mut seqs, b.last_seq()).await;
        tokio::task::yield_now().await;
    }
    writing.await.unwrap();

    // Fallen behind the live buffer: read back from the log again.
    let before = b.last_seq();
    let mut behind = b.subscribe();
    for k in 0..EVENT_BUFFER + 100 {
        b.update_flight(
            &flights[k % CLIENTS],
            FlightChange::Delta { text: "x".into() },
        )
        .await
        .unwrap();
    }
    assert!(
        b.last_seq() - before > EVENT_BUFFER as u64,
        "the follower lags"
    );
    assert!(
        matches!(behind.try_recv(), Err(TryRecvError::Lagged(_))),
        "a receiver as far behind has lost the oldest from the live buffer"
    );
    read_until(&mut feed, &mut seqs, b.last_seq()).await;

    assert_eq!(
        seqs,
        (1..=b.last_seq()).collect::<Vec<_>>(),
        "every event once, in order"
    );
}
