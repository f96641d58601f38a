//! Tests of the thread store: records, dispatch marks and their group commit.

#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;

/// These tests count or hold the storage thread's jobs: under `cargo test` (one
/// process, tests in parallel) they take this lock so as not to count each other's.
async fn exclusive() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_runtime_moves_its_old_database_into_the_shared_one() {
    let _serial = exclusive().await;
    let dir = tempfile::tempdir().unwrap();
    let legacy = dir.path().join("runtime");
    let record = ThreadRecord {
        harness: "codex_app_server".into(),
        thread_id: "thr_1".into(),
        updated_at: 7,
    };
    {
        let old = ThreadStore::open(&legacy).unwrap();
        old.put("codex-1", &record).await.unwrap();
        old.set_dispatch_state("inv_1", DispatchState::Started, "flt_1")
            .await
            .unwrap();
    }
    let shared = Durable::new(
        storage::config()
            .path(dir.path().join("db"))
            .open()
            .unwrap(),
    );
    let store = ThreadStore::within(&shared, Some(&legacy)).unwrap();
    assert_eq!(store.get("codex-1").await.unwrap(), Some(record.clone()));
    assert_eq!(
        store.unfinished_dispatches().await.unwrap(),
        vec![("inv_1".to_string(), "flt_1".to_string())]
    );
    assert!(!legacy.exists());
    let moved: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("runtime.migrated-"))
        .collect();
    assert_eq!(moved.len(), 1, "{moved:?}");
    // Writes land in the shared database, made durable by its flushes.
    let before = shared.flushes();
    store.forget("codex-1").await.unwrap();
    assert!(shared.flushes() > before);
    assert_eq!(store.get("codex-1").await.unwrap(), None);
    // Opening again finds nothing left to move, and keeps what it has.
    drop(store);
    let again = ThreadStore::within(&shared, Some(&legacy)).unwrap();
    assert_eq!(again.unfinished_dispatches().await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_dispatch_keeps_its_report_until_done_and_is_never_unstarted() {
    use relay_protocol::domain::{FlightChange, FlightState};
    let _serial = exclusive().await;
    let dir = tempfile::tempdir().unwrap();
    let store = ThreadStore::open(&dir.path().join("runtime")).unwrap();
    let report = Report::Flight {
        flight: "flt_1".into(),
        change: FlightChange::State {
            to: FlightState::Completed,
            reason: None,
            output: Some("the answer".into()),
        },
    };
    store
        .set_dispatch_state("inv_1", DispatchState::Started, "flt_1")
        .await
        .unwrap();
    store.set_dispatch_ended("inv_1", &report).await.unwrap();
    // Ended: not running (a restart does not fail it), not unstarted (a redelivery
    // does not run it), and its report is there to be sent.
    assert_eq!(
        store.dispatch_state("inv_1").await.unwrap(),
        Some(DispatchState::Ended)
    );
    assert!(store.unfinished_dispatches().await.unwrap().is_empty());
    assert_eq!(
        store.ended_unsent().await.unwrap(),
        vec![("inv_1".to_string(), report)]
    );
    assert_eq!(
        store.dispatches().await.unwrap(),
        vec![("inv_1".into(), "flt_1".into(), DispatchState::Ended)]
    );
    store
        .set_dispatch_state("inv_1", DispatchState::Done, "flt_1")
        .await
        .unwrap();
    assert!(store.ended_unsent().await.unwrap().is_empty());
    store.forget_flight("flt_1").await.unwrap();
    assert_eq!(store.dispatch_state("inv_1").await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flights_that_ended_together_are_forgotten_in_one_pass_and_only_they() {
    use relay_protocol::domain::{FlightChange, FlightState};
    let _serial = exclusive().await;
    let dir = tempfile::tempdir().unwrap();
    let store = ThreadStore::open(&dir.path().join("runtime")).unwrap();
    // 40 flights, each with a dispatch record in one of the three states and a
    // commit report kept; the even ones end.
    let mut marks = Vec::new();
    for i in 0..40 {
        let (store, inv, flight) = (store.clone(), format!("inv_{i}"), format!("flt_{i}"));
        marks.push(tokio::spawn(async move {
            let report = Report::Flight {
                flight: flight.clone(),
                change: FlightChange::State {
                    to: FlightState::Completed,
                    reason: None,
                    output: Some(format!("answer {i}")),
                },
            };
            match i % 3 {
                0 => {
                    store
                        .set_dispatch_state(&inv, DispatchState::Started, &flight)
                        .await
                }
                1 => {
                    store
                        .set_dispatch_state(&inv, DispatchState::Done, &flight)
                        .await
                }
                _ => store.set_dispatch_ended(&inv, &report).await,
            }
            .unwrap();
            store.put_commit_reports(&flight, &[report]).await.unwrap();
        }));
    }
    for m in marks {
        m.await.unwrap();
    }
    let ended: Vec<String> = (0..40).step_by(2).map(|i| format!("flt_{i}")).collect();
    store.forget_flights(ended).await.unwrap();
    store.forget_flights(Vec::new()).await.unwrap();
    let mut left: Vec<String> = store
        .dispatches()
        .await
        .unwrap()
        .into_iter()
        .map(|(_, flight, _)| flight)
        .collect();
    left.sort();
    let mut odd: Vec<String> = (1..40).step_by(2).map(|i| format!("flt_{i}")).collect();
    odd.sort();
    assert_eq!(left, odd);
    let mut kept: Vec<String> = store
        .commit_reports_unsent()
        .await
        .unwrap()
        .into_iter()
        .map(|(flight, _)| flight)
        .collect();
    kept.sort();
    assert_eq!(kept, odd);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_dispatch_marks_are_group_committed() {
    let _serial = exclusive().await;
    let dir = tempfile::tempdir().unwrap();
    let store = ThreadStore::open(&dir.path().join("runtime")).unwrap();
    const N: usize = 400;
    // N workers recording at the same moment: held storage lets them all line up.
    let paused = storage::Storage::global().pause().await;
    let before = store.flushes();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..N {
        let store = store.clone();
        tasks.spawn(async move {
            store
                .set_dispatch_state(&format!("inv_{i}"), DispatchState::Started, "flt")
                .await
        });
    }
    tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while storage::Storage::global().queued() < N {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the marks never reached the storage thread");
    paused.resume().await;
    while let Some(r) = tasks.join_next().await {
        r.unwrap().unwrap();
    }
    // Each mark was on disk when its call returned; one flush served all N.
    assert_eq!(store.flushes() - before, 1);
    assert_eq!(store.unfinished_dispatches().await.unwrap().len(), N);
}
