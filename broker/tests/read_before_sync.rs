//! A reader between a batch's commit and its sync. The writer commits a batch to sled,
//! then syncs the log; in between, a flight's record already shows what the batch did
//! (the flight completed) while the update that did it is not on disk yet. A reader that
//! saw the flight end and then asks for its updates must get the update that ended it:
//! the read waits for the sync instead of stopping short. Shown with the storage
//! thread's test hook holding the sync back (real sled files and log), from many readers
//! at once.
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
        output: output.map(str::to_string),
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
    let ended = seen_completed(&b, &id).await;
    assert_eq!(ended.update_seq, 3);
    // Readers ask for the updates while the sync is held back; once all have asked, it
    // is let go.
    let asked = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = (0..READERS)
        .map(|_| {
            let (b, id, asked) = (b.clone(), id.clone(), asked.clone());
            tokio::spawn(async move {
                b.store()
                    .read(move |store| {
                        asked.fetch_add(1, Ordering::SeqCst);
                        store.flight_updates(&id, 0)
                    })
                    .await
                    .unwrap()
            })
        })
        .collect();
    while asked.load(Ordering::SeqCst) < READERS {
        tokio::task::yield_now().await;
    }
    std::fs::remove_file(&stall).unwrap();
    ending.await.unwrap();
    for r in readers {
        let updates = r.await.unwrap();
        let seqs: Vec<u64> = updates.iter().map(|u| u.seq).collect();
        assert_eq!(seqs, vec![1, 2, 3]);
        assert!(matches!(
            &updates[2].change,
            FlightChange::State { to: FlightState::Completed, output: Some(o), .. } if o == "all done"
        ));
    }
}

/// The flight once its record shows it completed (committed, not yet synced).
async fn seen_completed(b: &relay_broker::Broker, id: &str) -> relay_protocol::domain::Flight {
    loop {
        if let Some(f) = b.flight(id).await.unwrap() {
            if f.state == FlightState::Completed {
                return f;
            }
        }
        tokio::task::yield_now().await;
    }
}
