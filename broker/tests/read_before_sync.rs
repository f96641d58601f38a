//! A reader between a batch's commit and its sync. The writer commits a batch to sled,
//! then syncs the log; in between, a flight's record already shows what the batch did
//! (the flight completed) while the update that did it is not on disk yet. A read then
//! answers only once the sync is done: the flight as completed, never before a crash
//! could no longer take it back, and its updates with the one that ended it (not
//! stopping short). Shown with the storage thread's test hook holding the sync back
//! (real sled files and log), from many readers at once.
//!
//! In its own test binary: the hook is read from the environment once per process.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use relay_broker::store::Store;
use relay_protocol::domain::{FlightChange, FlightState};

const READERS: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flight_seen_ended_has_the_update_that_ended_it() {
    let dir = tempfile::tempdir().unwrap();
    let stall = dir.path().join("stall");
    std::env::set_var(relay_infra::disk::TEST_STALL_ENV, &stall);
    let (b, _stop, _writer) = support::start(Store::open(&dir.path().join("store")).unwrap()).await;
    let id = support::one_flight_each(&b, 1).await.remove(0);
    let state = |to, output: Option<&str>| FlightChange::State {
        to,
        reason: None,
        output: output.map(Into::into),
    };
    b.update_flight(&id, state(FlightState::Running, None))
        .await
        .unwrap();
    b.update_flight(
        &id,
        FlightChange::Delta {
            text: "all done".into(),
        },
    )
    .await
    .unwrap();

    let store = b.store().clone();
    let before = tokio::task::spawn_blocking(move || store.committed_seq().unwrap())
        .await
        .unwrap();
    // The sync is held back from here: the completion commits, and waits for it.
    std::fs::write(&stall, "").unwrap();
    let ending = tokio::spawn({
        let (b, id) = (b.clone(), id.clone());
        async move {
            b.update_flight(&id, state(FlightState::Completed, Some("all done")))
                .await
                .unwrap()
        }
    });
    let committed = committed_past(&b, before).await;
    // Readers come while the sync is held back: half read the flight, half its updates.
    // Once all have read, the sync is let go.
    let asked = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = (0..READERS)
        .map(|n| {
            let (b, id, asked) = (b.clone(), id.clone(), asked.clone());
            tokio::spawn(async move {
                let read = b
                    .store()
                    .read(move |store| {
                        asked.fetch_add(1, Ordering::SeqCst);
                        Ok(if n % 2 == 0 {
                            Read::Flight(Box::new(store.flight(&id)?.unwrap()))
                        } else {
                            Read::Updates(store.flight_updates(&id, 0)?)
                        })
                    })
                    .await
                    .unwrap();
                // What was read is on disk by the time the read answers.
                (read, b.store().log().last_seq())
            })
        })
        .collect();
    while asked.load(Ordering::SeqCst) < READERS {
        tokio::task::yield_now().await;
    }
    std::fs::remove_file(&stall).unwrap();
    ending.await.unwrap();
    for r in readers {
        let (read, on_disk) = r.await.unwrap();
        assert!(
            on_disk >= committed,
            "answered at {on_disk}, before {committed} was on disk"
        );
        match read {
            Read::Flight(f) => {
                assert_eq!(f.state, FlightState::Completed);
                assert_eq!(f.update_seq, 3);
            }
            Read::Updates(updates) => {
                let seqs: Vec<u64> = updates.iter().map(|u| u.seq).collect();
                assert_eq!(seqs, vec![1, 2, 3]);
                assert!(matches!(
                    &updates[2].change,
                    FlightChange::State { to: FlightState::Completed, output: Some(o), .. } if o == "all done"
                ));
            }
        }
    }
}

enum Read {
    Flight(Box<relay_protocol::domain::Flight>),
    Updates(Vec<relay_protocol::domain::FlightUpdate>),
}

/// The seq sled has committed once it passed `before` (the completion, not yet synced),
/// read from sled directly: a `Store::read` would wait for the sync.
async fn committed_past(b: &relay_broker::Broker, before: u64) -> u64 {
    loop {
        let store = b.store().clone();
        let seq = tokio::task::spawn_blocking(move || store.committed_seq().unwrap())
            .await
            .unwrap();
        if seq > before {
            return seq;
        }
        tokio::task::yield_now().await;
    }
}
