//! `relay doctor`: the rebuild-and-compare check of a stopped data dir finds a damaged
//! projection and a gap in the log, says so, and exits non-zero; it refuses a data dir a
//! running broker holds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_broker::store::{seq_key, T};
use relay_broker::Store;
use relay_tests::{relay_cmd, RelayProcess};

fn doctor(data: &std::path::Path, json: bool) -> (bool, String, String) {
    let args: &[&str] = if json {
        &["doctor", "--json"]
    } else {
        &["doctor"]
    };
    let out = relay_cmd(data, args);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Changes the stopped store directly, as damage on disk would.
async fn damage(data: &std::path::Path, f: impl FnOnce(&Store) + Send + 'static) {
    let path = data.join("db");
    let store = relay_runtime::storage::read(move || Store::open(&path).unwrap())
        .await
        .unwrap();
    let s = store.clone();
    relay_runtime::storage::Storage::global()
        .run(move || f(&s))
        .await
        .unwrap();
    store.flush().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn doctor_finds_damage_and_a_gap_and_refuses_a_running_broker() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut relay = RelayProcess::start(&data).unwrap();
    relay.cli_ok(&["send", "one"]);
    relay.cli_ok(&["send", "two"]);

    // A running broker holds the database.
    let (ok, _, err) = doctor(&data, false);
    assert!(!ok);
    assert!(err.contains("in use by another relay process"), "{err}");

    relay.terminate().unwrap();
    let (ok, out, err) = doctor(&data, false);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("event log: no gaps"), "{out}");
    assert!(out.contains("projections: all equal a rebuild"), "{out}");
    assert_eq!(out.lines().last(), Some("consistent"), "{out}");

    // A message lost from its projection (but not from the log).
    damage(&data, |s| {
        let (k, _) = s.tree(T::Messages).last().unwrap().unwrap();
        s.tree(T::Messages).remove(k).unwrap();
    })
    .await;
    let (ok, out, _) = doctor(&data, true);
    assert!(!ok, "damage must fail the check: {out}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["consistent"], false);
    assert_eq!(report["mismatched_trees"], serde_json::json!(["messages"]));
    assert_eq!(report["gaps"], serde_json::json!([]));

    // An event cut out of the middle of the log.
    damage(&data, |s| {
        s.tree(T::Events).remove(seq_key(2)).unwrap();
    })
    .await;
    let (ok, out, _) = doctor(&data, false);
    assert!(!ok);
    assert!(
        out.contains("event log: GAP, expected seq 2, found 3"),
        "{out}"
    );
    assert_eq!(out.lines().last(), Some("NOT consistent"), "{out}");
}
