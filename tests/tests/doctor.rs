//! `relay doctor`: the rebuild-and-compare check of a stopped data dir finds a damaged
//! projection and a gap in the log, says so, and exits non-zero; it refuses a data dir a
//! running broker holds. A record written behind the broker's back (with the store's
//! own APIs, as a bug or a hand edit would) is reported as exactly the tree it is in,
//! and an event of a version this build does not read stops the check with a typed
//! error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use relay_broker::store::{decode, encode, DoctorReport, VerifyReport, T};
use relay_broker::{BrokerError, Store};
use relay_protocol::domain::{Agent, AgentState, Flight};
use relay_tests::{relay_cmd, wait_until, RelayProcess};
use serde::de::DeserializeOwned;
use serde::Serialize;

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
    let path = data.join(relay_broker::store::STORE_DIR);
    let store = relay_infra::storage::read(move || Store::open(&path).unwrap())
        .await
        .unwrap();
    let s = store.clone();
    relay_infra::storage::Storage::global()
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

    // A running broker holds the database: refused (exit 4, a conflict, not damage),
    // saying what to do.
    let out = relay_cmd(&data, &["doctor"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("in use by another relay process"), "{err}");
    assert!(err.contains("stop the `relay up`"), "{err}");

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

    // An event cut out of the middle of the log (each record whole, checksums right):
    // the log refuses to open past the gap, naming it.
    rewrite_log(&data, |records| {
        records.remove(1);
    });
    let (ok, out, err) = doctor(&data, false);
    assert!(!ok, "{out}");
    assert!(
        err.contains("stored data is corrupt") && err.contains("seq 3 follows seq 1"),
        "{err}"
    );
}

/// Rewrites the stopped store's event log as one segment of the records `edit` leaves
/// (each framed with a right checksum: damage the log's own checks cannot see).
fn rewrite_log(data: &std::path::Path, edit: impl FnOnce(&mut Vec<(u64, Vec<u8>)>)) {
    use relay_broker::store::log::{frame_into, segment_name, EventLog};
    let dir = data.join(relay_broker::store::STORE_DIR).join("log");
    let mut records = Vec::new();
    EventLog::open(&dir)
        .unwrap()
        .scan(0, |r| {
            records.push((r.seq, r.into_stored()));
            Ok::<_, relay_broker::store::LogError>(true)
        })
        .unwrap();
    edit(&mut records);
    for e in std::fs::read_dir(&dir).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    let mut bytes = Vec::new();
    for (seq, payload) in &records {
        frame_into(&mut bytes, *seq, payload);
    }
    std::fs::write(dir.join(segment_name(0, records[0].0)), bytes).unwrap();
}

/// A stopped data dir with an agent, two messages and an ended flight, and what
/// `relay doctor` says of it undamaged.
async fn stopped_data_dir(data: &std::path::Path) -> DoctorReport {
    let mut relay = RelayProcess::start(data).unwrap();
    relay.cli_ok(&[
        "agent",
        "add",
        "a1",
        "--harness",
        "codex_app_server",
        "--cwd",
        "/tmp",
        // No session is ever started: a program that does not run is refused when the
        // agent is added, so its flight fails for want of a session instead.
        "--wake",
        "manual",
    ]);
    relay.cli_ok(&["send", "one"]);
    relay.cli_ok(&["send", "two"]);
    // Dispatched, and failed at once: a manual agent with no live session.
    let flight = relay.cli_ok(&["ask", "a1", "--no-wait", "hello"]);
    let http = relay.http();
    let path = format!("/v1/flights/{}", flight.trim());
    wait_until("the flight to fail", Duration::from_secs(60), || async {
        let (_, f) = http.get(&path).await;
        (f["state"] == "failed").then_some(())
    })
    .await;
    assert!(relay.terminate().unwrap().success());
    let (ok, out, err) = doctor(data, true);
    assert!(ok, "{out}\n{err}");
    let report: DoctorReport = serde_json::from_str(&out).unwrap();
    assert!(report.consistent && report.flights == 1, "{report:?}");
    report
}

/// Rewrites the record of `tree` at `key` with `f`, encoded as the broker would.
fn rewrite<V: DeserializeOwned + Serialize>(
    s: &Store,
    tree: T,
    key: &[u8],
    f: impl FnOnce(&mut V),
) {
    let mut value: V = decode(&s.tree(tree).get(key).unwrap().unwrap()).unwrap();
    f(&mut value);
    s.tree(tree).insert(key, encode(&value).unwrap()).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_record_written_behind_the_brokers_back_is_the_exact_mismatch_reported() {
    type Damage = fn(&Store);
    // (what, the damage, the tree found to differ, flights and live flights it adds)
    let cases: Vec<(&str, Damage, &str, u64, u64)> = vec![
        (
            // The message is in the log; its projection is where it is there.
            "a message pointed at another message's event",
            |s| {
                let mut last_two = s.tree(T::Messages).iter().rev().take(2);
                let (key, _) = last_two.next().unwrap().unwrap();
                let (_, other) = last_two.next().unwrap().unwrap();
                s.tree(T::Messages).insert(key, other).unwrap();
            },
            "messages",
            0,
            0,
        ),
        (
            "an agent made busy",
            |s| {
                rewrite(s, T::Agents, b"a1", |a: &mut Agent| {
                    a.state = AgentState::Busy
                });
            },
            "agents",
            0,
            0,
        ),
        (
            "a flight no event made",
            |s| {
                let (_, f) = s.tree(T::Flights).first().unwrap().unwrap();
                let mut planted: Flight = decode(&f).unwrap();
                planted.id = "flt_planted".into();
                s.tree(T::Flights)
                    .insert(planted.id.as_bytes(), encode(&planted).unwrap())
                    .unwrap();
            },
            "flights",
            1,
            0,
        ),
        (
            "an ended flight indexed as live",
            |s| {
                let (id, _) = s.tree(T::Flights).first().unwrap().unwrap();
                s.tree(T::LiveFlights).insert(id, Vec::<u8>::new()).unwrap();
            },
            "live_flights",
            0,
            1,
        ),
        (
            "an agent's event lost from the replay index",
            |s| {
                let (key, _) = s.tree(T::ReplayIndex).first().unwrap().unwrap();
                s.tree(T::ReplayIndex).remove(key).unwrap();
            },
            "replay_index",
            0,
            0,
        ),
    ];
    let tmp = tempfile::tempdir().unwrap();
    for (i, (what, damage_it, tree, flights, live)) in cases.into_iter().enumerate() {
        let data = tmp.path().join(format!("data-{i}"));
        let before = stopped_data_dir(&data).await;
        damage(&data, damage_it).await;
        let expected = DoctorReport {
            consistent: false,
            flights: before.flights + flights,
            live_flights: before.live_flights + live,
            mismatched_trees: vec![tree.to_string()],
            ..before.clone()
        };

        let (ok, out, err) = doctor(&data, true);
        assert!(!ok, "{what}: the damage must fail the check: {out}\n{err}");
        let report: DoctorReport = serde_json::from_str(&out).unwrap();
        assert_eq!(report, expected, "{what}");
        let (ok, out, _) = doctor(&data, false);
        assert!(!ok, "{what}");
        assert!(
            out.contains(&format!(
                "projections: DIFFER from a rebuild from the log: {tree}\n"
            )),
            "{what}: {out}"
        );
        // The library's own check says the same.
        let db = data.join(relay_broker::store::STORE_DIR);
        let verify = relay_infra::storage::read(move || Store::open(&db).unwrap().verify())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            verify,
            VerifyReport {
                events: before.events,
                gaps: vec![],
                mismatched_trees: vec![tree.to_string()],
            },
            "{what}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_event_of_an_unknown_version_stops_the_check_with_a_typed_error() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    stopped_data_dir(&data).await;
    // The first event, as a build that writes a version after this build's would have
    // stored it (the last this build knows is a posted message in protobuf's; 4 starts
    // a linked record).
    let unknown = relay_broker::store::SHARED_FILE_VERSION + 1;
    rewrite_log(&data, |records| records[0].1[0] = unknown);
    let db = data.join(relay_broker::store::STORE_DIR);
    let verify = relay_infra::storage::read(move || Store::open(&db).unwrap().verify())
        .await
        .unwrap();
    assert!(
        matches!(&verify, Err(BrokerError::Corrupt(m)) if m.contains(&format!("version {unknown}"))),
        "{verify:?}"
    );
    let (ok, out, err) = doctor(&data, false);
    assert!(!ok, "{out}");
    assert!(
        err.contains(&format!(
            "stored data is corrupt: stored event has version {unknown}, this build reads 1, 2, 3, 5 and 6"
        )),
        "{err}"
    );
}
