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
                    output: Some(format!("answer {i}").into()),
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

/// A long end report goes to a file (its record stays small), is read back whole, also
/// after a reopen, and goes with its record however that is dropped; a file no record
/// names (a crash between the two) is swept at the next open. Many at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_end_report_is_kept_in_a_file_and_goes_with_its_record() {
    use relay_protocol::domain::{FlightChange, FlightState};
    let _serial = exclusive().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runtime");
    let reports_dir = files::dir_of(&path);
    let report = |i: usize| Report::Flight {
        flight: format!("flt_{i}"),
        change: FlightChange::State {
            to: FlightState::Completed,
            reason: None,
            // Even: long (a file); odd: short (in the record).
            output: Some(match i % 2 {
                0 => format!("{i}\"é\n").repeat(files::FILE_MIN / 4 + i).into(),
                _ => format!("answer {i}").into(),
            }),
        },
    };
    let n = 12;
    let store = ThreadStore::open(&path).unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let store = store.clone();
        tasks.spawn(async move {
            store
                .set_dispatch_ended(&format!("inv_{i}"), &report(i))
                .await
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap().unwrap();
    }
    let on_disk = || {
        let mut names: Vec<String> = std::fs::read_dir(&reports_dir)
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };
    let named = |is: &[usize]| {
        let mut names: Vec<String> = is
            .iter()
            .map(|i| files::name_of(&format!("inv_{i}")).unwrap())
            .collect();
        names.sort();
        names
    };
    assert_eq!(on_disk(), named(&[0, 2, 4, 6, 8, 10]));
    for i in 0..n {
        let v = store.dispatches.get(format!("inv_{i}")).unwrap().unwrap();
        let tag = if i % 2 == 0 { ENDED_IN_FILE } else { ENDED };
        assert_eq!(v[0], tag, "record {i}");
        assert!(v.len() < 1024, "record {i}: {} bytes", v.len());
    }
    let mut want: Vec<(String, Report)> = (0..n).map(|i| (format!("inv_{i}"), report(i))).collect();
    want.sort_by(|a, b| a.0.cmp(&b.0));
    let unsent = |store: ThreadStore| async move {
        let mut got = store.ended_unsent().await.unwrap();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        got
    };
    assert_eq!(unsent(store.clone()).await, want);
    let mut flights: Vec<String> = store
        .dispatches()
        .await
        .unwrap()
        .into_iter()
        .map(|(_, f, state)| {
            assert_eq!(state, DispatchState::Ended);
            f
        })
        .collect();
    flights.sort();
    let mut all: Vec<String> = (0..n).map(|i| format!("flt_{i}")).collect();
    all.sort();
    assert_eq!(flights, all);

    // A crash between a file and its record, or a temporary file left: swept at open.
    std::fs::write(reports_dir.join("6465616401"), b"{}").unwrap();
    std::fs::write(reports_dir.join("6465616402.tmp"), b"{").unwrap();
    drop(store);
    let store = ThreadStore::open(&path).unwrap();
    assert_eq!(on_disk(), named(&[0, 2, 4, 6, 8, 10]));
    assert_eq!(
        unsent(store.clone()).await,
        want,
        "read whole after a reopen"
    );

    // Dropped with its record: by flight, by invocation, or replaced by another mark.
    store
        .forget_flights(vec!["flt_0".into(), "flt_1".into(), "flt_2".into()])
        .await
        .unwrap();
    store.forget_dispatch("inv_4").await.unwrap();
    store
        .set_dispatch_state("inv_6", DispatchState::Done, "flt_6")
        .await
        .unwrap();
    // Ended again with the same long report: the same file, kept.
    store.set_dispatch_ended("inv_8", &report(8)).await.unwrap();
    assert_eq!(on_disk(), named(&[8, 10]));
    let left: Vec<String> = unsent(store.clone())
        .await
        .into_iter()
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        left,
        ["inv_10", "inv_11", "inv_3", "inv_5", "inv_7", "inv_8", "inv_9"]
    );

    // A file gone from under its record: that report is skipped (a warning), the others
    // are read, and the dispatch still never runs.
    std::fs::remove_file(reports_dir.join(&named(&[10])[0])).unwrap();
    assert_eq!(unsent(store.clone()).await.len(), 6);
    assert_eq!(
        store.dispatch_state("inv_10").await.unwrap(),
        Some(DispatchState::Ended)
    );
}

/// The broker's embedded runtime (records in the broker's database) keeps its long
/// reports in that database's directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_runtime_keeps_long_reports_beside_the_shared_database() {
    use relay_protocol::domain::{FlightChange, FlightState};
    let _serial = exclusive().await;
    let dir = tempfile::tempdir().unwrap();
    let db_dir = dir.path().join("db");
    let db = relay_infra::disk::open_private(storage::config(), &db_dir).unwrap();
    let store = ThreadStore::within(&Durable::private(db, &db_dir), None).unwrap();
    let report = Report::Flight {
        flight: "flt_1".into(),
        change: FlightChange::State {
            to: FlightState::Completed,
            reason: None,
            output: Some("x".repeat(files::FILE_MIN).into()),
        },
    };
    store.set_dispatch_ended("inv_1", &report).await.unwrap();
    assert!(files::dir_of(&db_dir)
        .join(files::name_of("inv_1").unwrap())
        .exists());
    assert_eq!(
        store.ended_unsent().await.unwrap(),
        vec![("inv_1".to_string(), report)]
    );
}

/// The environment that makes [`a_kill_9_never_leaves_a_record_without_its_report`]'s
/// child process the writer (the directory of its database).
const KILLED_WRITER: &str = "RELAY_TEST_KILLED_REPORT_WRITER";

/// A process writing long end reports (in files) and short ones, many at once, killed
/// with `kill -9` in the middle: at the next open, every report it said was recorded is
/// read back whole, every record read is whole, and no file is left that no record
/// names. (In the child, run as itself: it writes until it is killed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_never_leaves_a_record_without_its_report() {
    use std::io::{BufRead, Write};
    if let Some(dir) = std::env::var_os(KILLED_WRITER) {
        let store = ThreadStore::open(std::path::Path::new(&dir)).unwrap();
        let mut tasks = tokio::task::JoinSet::new();
        for worker in 0..4 {
            let store = store.clone();
            tasks.spawn(async move {
                for i in (worker..).step_by(4) {
                    let inv = format!("inv_{i}");
                    store
                        .set_dispatch_ended(&inv, &killed_report(i))
                        .await
                        .unwrap();
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "{inv}").unwrap();
                    out.flush().unwrap();
                }
            });
        }
        while tasks.join_next().await.is_some() {}
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("runtime");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "threads::tests::a_kill_9_never_leaves_a_record_without_its_report",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(KILLED_WRITER, &path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Killed once it has recorded a good number of reports, long ones among them.
    let mut recorded = Vec::new();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let long = |r: &[String]| {
        r.iter()
            .filter(|i| i.ends_with(['0', '2', '4', '6', '8']))
            .count()
    };
    while recorded.len() < 40 || long(&recorded) < 12 {
        match lines.next() {
            // (The test harness's own lines are not reports.)
            Some(line) => recorded.extend(line.ok().filter(|l| l.starts_with("inv_"))),
            None => panic!("the writer stopped after {} reports", recorded.len()),
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let store = ThreadStore::open(&path).unwrap();
    let unsent: std::collections::HashMap<String, Report> =
        store.ended_unsent().await.unwrap().into_iter().collect();
    for inv in &recorded {
        let i: usize = inv["inv_".len()..].parse().unwrap();
        assert_eq!(unsent.get(inv), Some(&killed_report(i)), "{inv}");
    }
    // Every record there is whole (a record is on disk only after its file).
    for (inv, report) in &unsent {
        let i: usize = inv["inv_".len()..].parse().unwrap();
        assert_eq!(report, &killed_report(i), "{inv}");
    }
    // The files every record names, read or not.
    let named: std::collections::HashSet<String> = store
        .dispatches
        .iter()
        .filter_map(|kv| files::in_file(&kv.unwrap().1).map(|f| f.file))
        .collect();
    let on_disk: std::collections::HashSet<String> = std::fs::read_dir(files::dir_of(&path))
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    assert_eq!(
        on_disk, named,
        "no file without its record, no record without its file"
    );
    assert!(named.len() >= 12, "{} long reports recorded", named.len());
}

/// Report `i` of the killed writer: every other one long.
fn killed_report(i: usize) -> Report {
    use relay_protocol::domain::{FlightChange, FlightState};
    Report::Flight {
        flight: format!("flt_{i}"),
        change: FlightChange::State {
            to: FlightState::Completed,
            reason: None,
            output: Some(match i % 2 {
                0 => format!("answer {i} ").repeat(files::FILE_MIN / 8).into(),
                _ => format!("answer {i}").into(),
            }),
        },
    }
}
