//! A flight's commit as it is recorded: a revert over a trusted NATS bus; a commit whose
//! reports the runtime kept through a crash, recorded once at the next start; never a
//! commit or revert written by a client.

use serde_json::Value;

use super::{stderr, Setup};

#[tokio::test(flavor = "multi_thread")]
async fn a_trusted_bus_reverts_a_flight() {
    let nats = relay_tests::nats::NatsServer::start().unwrap();
    let token_dir = tempfile::tempdir().unwrap();
    let token_file = token_dir.path().join("request-token");
    std::fs::write(&token_file, "req-t0ken").unwrap();
    let url = nats.url();
    let s = Setup::start_with(&[
        "--nats",
        &url,
        "--nats-request-token-file",
        token_file.to_str().unwrap(),
    ]);
    let out = s.add("w", &["--worktree"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let flight = s
        .relay
        .cli_json(&["ask", "w", "write:bus.txt=over the bus", "--json"]);
    let id = flight["id"].as_str().unwrap();
    assert!(flight["commit"].is_object(), "{flight}");

    let client = async_nats::connect(url.as_str()).await.unwrap();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Content-Type", "application/json");
    headers.insert("Relay-Token", "req-t0ken");
    let body = serde_json::to_vec(&serde_json::json!({ "flight": id })).unwrap();
    let reply = client
        .request_with_headers("relay.v1.cmd.revert", headers, body.into())
        .await
        .unwrap();
    let answer: Value = serde_json::from_slice(&reply.payload).unwrap();
    let by = &answer["flight"]["commit"]["reverted_by"];
    assert_eq!(by["by"], "nats", "{answer}");
    let message = s.git(&["log", "-1", "--format=%B", by["commit"].as_str().unwrap()]);
    assert!(
        message.contains(&format!("Relay-Revert-Of: {id}")),
        "{message}"
    );
}

/// A commit whose reports the runtime kept but the broker may not have recorded (a
/// crash between the two: `ThreadStore::put_commit_reports`) is recorded at the next
/// start, once, and the kept record is dropped. The record is written here into the
/// stopped broker's database, as the runtime keeps it.
#[tokio::test(flavor = "multi_thread")]
async fn a_kept_commit_report_is_recorded_at_the_next_start_once() {
    let mut s = Setup::start();
    let out = s.add("w", &["--worktree"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let asked = s.relay.cli(&["ask", "w", "write:a.txt=one", "--json"]);
    assert!(asked.status.success(), "{}", stderr(&asked));
    let first: Value = serde_json::from_slice(&asked.stdout).unwrap();
    let mut commit: relay_protocol::domain::FlightCommit =
        serde_json::from_value(first["commit"].clone()).unwrap();
    // A flight that changed nothing: no commit recorded on it.
    let asked = s.relay.cli(&["ask", "w", "look only", "--json"]);
    let second: Value = serde_json::from_slice(&asked.stdout).unwrap();
    let id = second["id"].as_str().unwrap().to_string();
    assert!(second.get("commit").is_none(), "{second}");
    s.relay.kill9();

    // The runtime's record of a commit of that flight, as kept before it is sent.
    commit.patch = Some("+one\n".into());
    let report = relay_protocol::runtime::Report::Flight {
        flight: id.clone(),
        change: relay_protocol::domain::FlightChange::Commit {
            commit: Box::new(commit.clone()),
        },
    };
    let db = s
        .tmp
        .path()
        .join("data")
        .join(relay_broker::store::STORE_DIR);
    let store = relay_infra::storage::read(move || relay_broker::Store::open(&db))
        .await
        .unwrap()
        .unwrap();
    let threads = {
        let durable = store.durable().clone();
        relay_infra::storage::read(move || relay_runtime::ThreadStore::within(&durable, None))
            .await
            .unwrap()
            .unwrap()
    };
    threads.put_commit_reports(&id, &[report]).await.unwrap();
    assert_eq!(threads.commit_reports_unsent().await.unwrap().len(), 1);
    drop(threads);
    drop(store);

    for _ in 0..2 {
        s.relay.restart().unwrap();
        let shown = s.relay.cli_json(&["flight", "show", &id, "--json"]);
        assert_eq!(
            shown["commit"]["commit"], first["commit"]["commit"],
            "{shown}"
        );
        s.relay.kill9();
    }
    // Recorded once (the second start had nothing kept to send), and the record is gone.
    let db = s
        .tmp
        .path()
        .join("data")
        .join(relay_broker::store::STORE_DIR);
    let store = relay_infra::storage::read(move || relay_broker::Store::open(&db))
        .await
        .unwrap()
        .unwrap();
    let durable = store.durable().clone();
    let threads =
        relay_infra::storage::read(move || relay_runtime::ThreadStore::within(&durable, None))
            .await
            .unwrap()
            .unwrap();
    assert!(threads.commit_reports_unsent().await.unwrap().is_empty());
    drop(threads);
    drop(store);
    s.relay.restart().unwrap();
    let events = s
        .relay
        .cli_json(&["events", "--since", "0", "-n", "100000", "--json"]);
    let commits = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["type"] == "flight_updated"
                && e["update"]["flight"] == id.as_str()
                && e["update"]["kind"] == "commit"
        })
        .count();
    assert_eq!(commits, 1, "{events}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flights_commit_is_the_runtimes_record_and_shown_once() {
    let s = Setup::start();
    let out = s.add("w", &["--worktree"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let asked = s.relay.cli(&["ask", "w", "write:notes.txt=hi", "--json"]);
    assert!(asked.status.success(), "{}", stderr(&asked));
    let flight: Value = serde_json::from_slice(&asked.stdout).unwrap();
    let id = flight["id"].as_str().unwrap().to_string();
    let real = flight["commit"].clone();
    assert!(real.is_object(), "{flight}");

    // `flight show` names the commit once, under its own label.
    let shown = s.relay.cli_ok(&["flight", "show", &id]);
    assert!(shown.contains("changes    commit "), "{shown}");
    assert!(!shown.contains("commit     commit"), "{shown}");

    // A client cannot write a commit (which a revert would then revert) nor a revert.
    let http = s.relay.http();
    let fake = serde_json::json!({"kind": "commit", "commit": {
        "branch": "relay/w", "start": "0".repeat(40), "head": "1".repeat(40),
        "added": 0, "removed": 0, "patch": "+forged\n"
    }});
    let (code, body) = http.post(&format!("/v1/flights/{id}/updates"), &fake).await;
    assert_eq!(code, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("recorded by the runtime"),
        "{body}"
    );
    let forged_revert = serde_json::json!({
        "kind": "reverted", "revert": {"commit": "2".repeat(40), "by": "x", "at": 1}
    });
    let (code, body) = http
        .post(&format!("/v1/flights/{id}/updates"), &forged_revert)
        .await;
    assert_eq!(code, 400, "{body}");
    let after = s.relay.cli_json(&["flight", "show", &id, "--json"]);
    assert_eq!(after["commit"], real, "{after}");
    let diff = s.relay.cli_json(&["diff", &id, "--json"]);
    assert!(
        !diff["commit"]["patch"].as_str().unwrap().contains("forged"),
        "{diff}"
    );
}
