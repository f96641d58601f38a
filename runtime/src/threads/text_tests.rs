//! Tests of an end whose answer the broker's text files hold ([`super::files::WithText`]).

#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;
use relay_protocol::domain::SharedStr;

/// The broker's text files, as a test holds them: what was written, by buffer.
#[derive(Default)]
struct Texts(std::sync::Mutex<Vec<(String, SharedStr)>>);

impl crate::TextStore for std::sync::Arc<Texts> {
    fn write(&self, flight: &str, text: &SharedStr) -> Result<(), String> {
        let mut all = self.0.lock().unwrap();
        let reference = format!("{flight}.{}", all.len());
        all.push((reference, text.clone()));
        Ok(())
    }

    fn written(&self, text: &SharedStr) -> Option<String> {
        let all = self.0.lock().unwrap();
        let found = all.iter().find(|(_, t)| SharedStr::same_buffer(t, text));
        found.map(|(r, _)| r.clone())
    }

    fn read(&self, reference: &str) -> Result<SharedStr, String> {
        let all = self.0.lock().unwrap();
        let found = all.iter().find(|(r, _)| r == reference);
        found
            .map(|(_, t)| t.clone())
            .ok_or_else(|| "no such file".into())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_whose_answer_was_written_first_refers_to_it_and_is_read_back_whole() {
    use relay_protocol::domain::{FlightChange, FlightState};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runtime");
    let reports_dir = files::dir_of(&path);
    let texts = std::sync::Arc::new(Texts::default());
    let sink = crate::TextSink::new(texts.clone());
    let end = |i: usize, output: SharedStr| Report::Flight {
        flight: format!("flt_{i}"),
        change: FlightChange::State {
            to: FlightState::Completed,
            reason: Some(format!("reason {i}")),
            output: Some(output),
        },
    };
    // 0, 3, 6, 9: long, written first (a reference); 1, 4, 7, 10: long, an equal text in
    // another buffer (not the one written: a report file); the rest short (inline).
    let n = 12;
    let mut reports = Vec::new();
    for i in 0..n {
        let text = format!("{i}\"é\n").repeat(files::FILE_MIN / 4 + i);
        let output = SharedStr::from(match i % 3 {
            2 => format!("answer {i}"),
            _ => text.clone(),
        });
        match i % 3 {
            0 => sink.write(&format!("flt_{i}"), &output).unwrap(),
            1 => sink
                .write(&format!("flt_{i}"), &SharedStr::from(text))
                .unwrap(),
            _ => {}
        }
        reports.push(end(i, output));
    }
    let store = ThreadStore::open(&path)
        .unwrap()
        .with_texts(Some(sink.clone()));
    let mut tasks = tokio::task::JoinSet::new();
    for (i, report) in reports.iter().cloned().enumerate() {
        let store = store.clone();
        tasks.spawn(async move { store.set_dispatch_ended(&format!("inv_{i}"), &report).await });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap().unwrap();
    }
    for i in 0..n {
        let v = store.dispatches.get(format!("inv_{i}")).unwrap().unwrap();
        let tag = [ENDED_WITH_TEXT, ENDED_IN_FILE, ENDED][i % 3];
        assert_eq!(v[0], tag, "record {i}");
        assert!(v.len() < 1024, "record {i}: {} bytes", v.len());
    }
    let mut files_there: Vec<String> = std::fs::read_dir(&reports_dir)
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    files_there.sort();
    let mut want_files: Vec<String> = [1, 4, 7, 10]
        .iter()
        .map(|i| files::name_of(&format!("inv_{i}")).unwrap())
        .collect();
    want_files.sort();
    assert_eq!(
        files_there, want_files,
        "no report file for a referred answer"
    );

    let unsent = |store: ThreadStore| async move {
        let mut got = store.ended_unsent().await.unwrap();
        got.sort_by_key(|(inv, _)| inv[4..].parse::<usize>().unwrap());
        got
    };
    let want: Vec<(String, Report)> = reports
        .iter()
        .enumerate()
        .map(|(i, r)| (format!("inv_{i}"), r.clone()))
        .collect();
    assert_eq!(unsent(store.clone()).await, want);
    drop(store);
    let store = ThreadStore::open(&path)
        .unwrap()
        .with_texts(Some(sink.clone()));
    assert_eq!(
        unsent(store.clone()).await,
        want,
        "read whole after a reopen"
    );
    let flights = store.dispatches().await.unwrap();
    assert_eq!(flights.len(), n);
    assert!(flights
        .iter()
        .all(|(inv, f, s)| *s == DispatchState::Ended && inv[4..] == f[4..]));

    // Its text gone, or no text files to read it from: that report is skipped (a
    // warning), the others are read, and the dispatch still never runs.
    texts
        .0
        .lock()
        .unwrap()
        .retain(|(r, _)| !r.starts_with("flt_3."));
    let got = unsent(store.clone()).await;
    assert_eq!(got.len(), n - 1);
    assert!(got.iter().all(|(inv, _)| inv != "inv_3"));
    assert_eq!(
        store.dispatch_state("inv_3").await.unwrap(),
        Some(DispatchState::Ended)
    );
    drop(store);
    let without = ThreadStore::open(&path).unwrap();
    assert_eq!(unsent(without.clone()).await.len(), n - 4);

    // Dropped with its record.
    without
        .forget_flights(vec!["flt_0".into(), "flt_6".into()])
        .await
        .unwrap();
    without.forget_dispatch("inv_9").await.unwrap();
    assert_eq!(without.dispatches().await.unwrap().len(), n - 3);
}

/// A long end report in a file is Relay's own write: into the disk's reserve down to its
/// floor, not below.
#[test]
fn a_report_file_never_takes_the_disk_under_its_floor() {
    let space = |free| relay_infra::disk::Space {
        dir: "/data".into(),
        free,
        reserve: 16 << 20,
    };
    // The floor of a 16 MiB reserve: 4 MiB.
    assert_eq!(files::under_floor(None, 1 << 40), None, "no guard");
    assert_eq!(files::under_floor(Some(space(8 << 20)), 4 << 20), None);
    let why = files::under_floor(Some(space(8 << 20)), (4 << 20) + 1).unwrap();
    assert!(why.contains("under the floor"), "{why}");
}
