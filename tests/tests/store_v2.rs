//! The event log v2 over real files: sled's projections caught up with the log, or
//! rebuilt from it, whatever state a crash left them in; a v1 data dir migrated copy
//! then switch (and a `kill -9` in the middle of it); writers from many clients at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use relay_broker::store::migrate::{self, Layout};
use relay_broker::store::{pair_value, Store, STORE_DIR, T};
use relay_broker::{Broker, BrokerConfig};
use relay_protocol::domain::{
    AgentSpec, FlightChange, FlightState, Harness, InvokeRequest, PostMessage, DEFAULT_CONVERSATION,
};
use relay_tests::relay_cmd;
use tokio_util::sync::CancellationToken;

/// A broker over the store at `root`, with some of everything done by `clients` at once:
/// an agent, flights that stream and end, messages. Stopped (its writer done) on return.
async fn filled(root: &Path, clients: usize, messages: usize) {
    let stop = CancellationToken::new();
    let store = Store::open(root).unwrap();
    let (b, writer) = Broker::start(store, BrokerConfig::default(), stop.clone())
        .await
        .unwrap();
    b.register_agent(AgentSpec::new("a1", Harness::CodexAppServer, "/tmp"))
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let b = b.clone();
        tasks.push(tokio::spawn(async move {
            let f = b
                .invoke(InvokeRequest::new("a1", format!("task {c}")))
                .await
                .unwrap()
                .flight;
            b.update_flight(&f.id, state(FlightState::Running))
                .await
                .unwrap();
            for i in 0..5 {
                b.update_flight(
                    &f.id,
                    FlightChange::Delta {
                        text: format!("{c}.{i} "),
                    },
                )
                .await
                .unwrap();
            }
            let end = if c % 3 == 0 {
                FlightState::Failed
            } else {
                FlightState::Completed
            };
            b.update_flight(&f.id, state(end)).await.unwrap();
            for m in 0..messages / clients.max(1) {
                b.post_message(PostMessage {
                    conversation: DEFAULT_CONVERSATION.into(),
                    author: format!("client-{c}"),
                    body: format!("message {m} from {c}").into(),
                    class: Default::default(),
                    reply_to: None,
                    meta: Default::default(),
                })
                .await
                .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    stop.cancel();
    writer.await.unwrap();
}

fn state(to: FlightState) -> FlightChange {
    FlightChange::State {
        to,
        reason: (to == FlightState::Failed).then(|| "it broke".into()),
        output: (to == FlightState::Completed).then(|| "done".into()),
    }
}

/// A tree's entries (key, value).
type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// Everything a reader sees of a store: its events as stored, and its projections.
#[derive(Debug, PartialEq)]
struct Seen {
    events: Vec<(u64, Vec<u8>)>,
    trees: Vec<(String, Entries)>,
}

fn seen(store: &Store) -> Seen {
    let mut events = Vec::new();
    store
        .log()
        .scan(0, |r| {
            events.push((r.seq, r.into_stored()));
            Ok::<_, relay_broker::store::LogError>(true)
        })
        .unwrap();
    let trees = [
        (T::Agents, "agents"),
        (T::Flights, "flights"),
        (T::Messages, "messages"),
        (T::Conversations, "conversations"),
        (T::Invocations, "invocations"),
        (T::FlightUpdates, "flight_updates"),
        (T::LiveFlights, "live_flights"),
        (T::ReplayIndex, "replay_index"),
        (T::UsageDaily, "usage_daily"),
        (T::EventPos, "event_pos"),
    ]
    .into_iter()
    .map(|(t, name)| {
        let entries = store
            .tree(t)
            .iter()
            .map(|kv| {
                let (k, v) = kv.unwrap();
                (k.to_vec(), v.to_vec())
            })
            .collect();
        (name.to_string(), entries)
    })
    .collect();
    Seen { events, trees }
}

fn consistent(store: &Store) {
    let report = store.verify().unwrap();
    assert!(report.is_consistent(), "{report:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn projections_ahead_of_the_log_or_lost_are_rebuilt_from_it_at_open() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join(STORE_DIR);
    filled(&root, 16, 64).await;
    let before = {
        let store = Store::open(&root).unwrap();
        consistent(&store);
        seen(&store)
    };
    assert!(
        before.events.len() > 16 * 8,
        "{} events",
        before.events.len()
    );

    // sled kept a batch the log did not (a crash between the transaction and the log's
    // sync: never acknowledged): it says it is past the log's end.
    {
        let store = Store::open(&root).unwrap();
        let last = store.last_seq().unwrap();
        store
            .tree(T::Meta)
            .insert(
                "log_applied",
                pair_value(last + 3, store.log().end() + 999).to_vec(),
            )
            .unwrap();
        store.tree(T::Flights).clear().unwrap();
        store.durable().db().flush().unwrap();
    }
    let store = Store::open(&root).unwrap();
    consistent(&store);
    assert_eq!(seen(&store), before, "rebuilt from the log");
    drop(store);

    // sled lost whole: made again from the log.
    std::fs::remove_dir_all(root.join("db")).unwrap();
    let store = Store::open(&root).unwrap();
    consistent(&store);
    assert_eq!(seen(&store), before, "made again from the log");
    drop(store);

    // sled damaged so that it cannot open: moved aside, then made again.
    std::fs::write(root.join("db").join("conf"), b"\xff\xfe not a sled config").unwrap();
    let store = Store::open(&root).unwrap();
    consistent(&store);
    assert_eq!(seen(&store), before, "made again after damage");
    let aside = std::fs::read_dir(&root)
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().starts_with("db.damaged-")
        })
        .count();
    assert_eq!(aside, 1, "the damaged database is kept aside");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_behind_its_log_is_caught_up_from_where_it_stood() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join(STORE_DIR);
    filled(&root, 8, 16).await;
    let (before, last) = {
        let store = Store::open(&root).unwrap();
        (seen(&store), store.last_seq().unwrap())
    };
    // sled as a crash leaves it after a checkpoint at `k`: the projections of the
    // events up to `k`, and `log_applied` there. Made by rebuilding a copy of the log cut
    // after `k`, then giving it the whole log back.
    let k = last / 2;
    let cut = tmp.path().join("cut");
    let mut kept = 0u64;
    {
        let whole = Store::open(&root).unwrap();
        let mut records = Vec::new();
        whole
            .log()
            .scan(0, |r| {
                let seq = r.seq;
                records.push((seq, r.into_stored()));
                Ok::<_, relay_broker::store::LogError>(seq < k)
            })
            .unwrap();
        let store = Store::open(&cut).unwrap();
        store
            .log()
            .append(records.iter().map(|(s, p)| (*s, p.as_slice())))
            .unwrap();
        store.log().sync().unwrap();
        kept += records.len() as u64;
    }
    assert_eq!(kept, k);
    // The cut store's log has k events and its projections (caught up at its next
    // open) stand at k.
    drop(Store::open(&cut).unwrap());
    std::fs::remove_dir_all(cut.join("log")).unwrap();
    copy_dir(&root.join("log"), &cut.join("log"));
    let store = Store::open(&cut).unwrap();
    assert_eq!(store.last_seq().unwrap(), last);
    consistent(&store);
    assert_eq!(seen(&store), before, "caught up from seq {k}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// A v1 data dir holding the events of a filled store (as v1 stored them: the version
/// byte and the wire JSON, also for what v2 stores otherwise: a flight update without
/// its flight, a text by reference), a secret and a runtime record; and what a v2 store
/// of those events holds.
async fn v1_data_dir(data: &Path, clients: usize, messages: usize) -> Seen {
    let scratch = data.with_extension("scratch");
    filled(&scratch, clients, messages).await;
    let store = Store::open(&scratch).unwrap();
    let events: Vec<(u64, Vec<u8>)> = seen(&store)
        .events
        .into_iter()
        .map(|(seq, payload)| match payload.first() {
            Some(1) => (seq, payload),
            _ => {
                let event = store.event(seq).unwrap().unwrap();
                let mut v1 = vec![1];
                v1.extend(serde_json::to_vec(&event).unwrap());
                (seq, v1)
            }
        })
        .collect();
    assert!(events.len() > 100, "{}", events.len());
    // What a v2 store of them holds: its log given them, its projections made at open.
    let plain = data.with_extension("plain");
    {
        let store = Store::open(&plain).unwrap();
        let log = store.log();
        log.append(events.iter().map(|(s, p)| (*s, p.as_slice())))
            .unwrap();
        log.sync().unwrap();
    }
    let want = seen(&Store::open(&plain).unwrap());
    assert_eq!(want.events, events);
    relay_tests::v1store::write(
        data,
        &want.events,
        &[
            (
                "agent_secrets",
                vec![(b"a1".to_vec(), b"\x01{\"TOKEN\":\"s3cret\"}".to_vec())],
            ),
            ("runtime.threads", vec![(b"a1".to_vec(), b"thr_1".to_vec())]),
            // A v1 projection: not copied (v2 makes its own from the events).
            ("flights", vec![(b"junk".to_vec(), b"\x01{}".to_vec())]),
        ],
    )
    .unwrap();
    want
}

#[tokio::test(flavor = "multi_thread")]
async fn a_v1_data_dir_migrates_to_the_same_events_and_projections_and_keeps_v1() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let want = v1_data_dir(&data, 8, 32).await;
    assert_eq!(migrate::layout(&data), Layout::V1);
    let (store, report) = migrate::open_data_dir(&data, &mut |_, _| {}).unwrap();
    let report = report.expect("a migration");
    assert_eq!(report.events, want.events.len() as u64);
    assert_eq!(report.last_seq, want.events.last().unwrap().0);
    assert_eq!(
        seen(&store),
        want,
        "the same bytes in the log, the same projections"
    );
    consistent(&store);
    let db = store.durable().db();
    assert_eq!(
        db.open_tree("agent_secrets")
            .unwrap()
            .get("a1")
            .unwrap()
            .unwrap()
            .as_ref(),
        b"\x01{\"TOKEN\":\"s3cret\"}"
    );
    assert_eq!(
        db.open_tree("runtime.threads")
            .unwrap()
            .get("a1")
            .unwrap()
            .unwrap()
            .as_ref(),
        b"thr_1"
    );
    assert!(
        report.copied.contains(&("agent_secrets".into(), 1)),
        "{report:?}"
    );
    drop(store);
    assert_eq!(migrate::layout(&data), Layout::V2);
    assert!(!data.join("db").exists());
    assert_eq!(
        relay_tests::v1store::events(&data.join(migrate::V1_KEPT)).unwrap(),
        want.events,
        "v1 is kept as it was"
    );
    // Opened again: nothing more to migrate.
    let (store, again) = migrate::open_data_dir(&data, &mut |_, _| {}).unwrap();
    assert!(again.is_none());
    assert_eq!(seen(&store), want);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kill_9_in_the_middle_of_a_migration_leaves_v1_which_migrates_next_time() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    // More events than one chunk of the migration: it pauses after the first.
    let want = v1_data_dir(&data, 8, 4400).await;
    assert!(want.events.len() > 4096, "{}", want.events.len());
    let mut doctor = std::process::Command::new(relay_tests::relay_bin())
        .args(["doctor", "--migrate"])
        .env("RELAY_DATA_DIR", &data)
        .env("RELAY_TEST_MIGRATE_PAUSE", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = doctor.stderr.take().unwrap();
    let paused = std::thread::spawn(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .find(|l| l.contains("migration paused after"))
    });
    let line = tokio::task::spawn_blocking(move || paused.join().unwrap())
        .await
        .unwrap();
    assert!(line.is_some(), "the migration never reached its pause");
    assert!(data.join(migrate::MIGRATING_DIR).exists(), "it was midway");
    // SIGKILL: `kill -9`.
    doctor.kill().unwrap();
    doctor.wait().unwrap();
    // v1 untouched, no v2 store.
    assert_eq!(migrate::layout(&data), Layout::V1);
    assert_eq!(
        relay_tests::v1store::events(&data.join("db")).unwrap(),
        want.events
    );
    // The next run migrates from scratch and checks it.
    let out = relay_cmd(&data, &["doctor", "--migrate", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["consistent"], true, "{report}");
    assert_eq!(
        report["migrated"]["events"],
        want.events.len() as u64,
        "{report}"
    );
    assert!(!data.join(migrate::MIGRATING_DIR).exists());
    let store = Store::open(&data.join(STORE_DIR)).unwrap();
    assert_eq!(seen(&store), want);
}

/// `kill -9` while 16 clients post at once: every acknowledged message is there after the
/// restart, the log is caught up into sled (the log gets a batch before sled commits it,
/// so it is never behind sled after a crash: no rebuild), and the store checks out.
#[tokio::test(flavor = "multi_thread")]
async fn a_kill_9_under_load_is_caught_up_at_restart_never_rebuilt() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut relay = relay_tests::RelayProcess::start(&data).unwrap();
    let http = relay.http();
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut clients = Vec::new();
    for c in 0..16 {
        let (http, acked) = (http.clone(), acked.clone());
        clients.push(tokio::spawn(async move {
            for n in 0.. {
                let body = format!("client {c} message {n}");
                let post = serde_json::json!({"conversation": "channel.shared", "author": "me", "body": body});
                let sent = http
                    .try_request(
                        reqwest::Method::POST,
                        "/v1/messages",
                        Some(serde_json::to_vec(&post).unwrap()),
                    )
                    .await;
                if !matches!(sent, Ok((200, _))) {
                    break; // the broker is gone
                }
                acked.lock().unwrap().push(body);
            }
        }));
    }
    relay_tests::wait::wait_until(
        "200 messages acknowledged",
        std::time::Duration::from_secs(60),
        || {
            let n = acked.lock().unwrap().len();
            async move { (n >= 200).then_some(()) }
        },
    )
    .await;
    relay.kill9();
    for c in clients {
        c.await.unwrap();
    }
    relay.restart().unwrap();
    let (code, v) = relay
        .http()
        .get("/v1/conversations/channel.shared/messages?limit=100000")
        .await;
    assert_eq!(code, 200, "{v}");
    let stored: std::collections::HashSet<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap().to_string())
        .collect();
    let acked = acked.lock().unwrap().clone();
    let lost: Vec<&String> = acked.iter().filter(|b| !stored.contains(*b)).collect();
    assert!(lost.is_empty(), "acknowledged, then lost: {lost:?}");
    let log = relay.log_text();
    assert!(!log.contains("rebuilding them from it"), "{log}");
    eprintln!(
        "caught up at restart: {}",
        log.lines()
            .any(|l| l.contains("applying the event log's last events"))
    );
    relay.terminate().unwrap();
    let out = relay_cmd(&data, &["doctor", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["consistent"], true, "{report}");
}
