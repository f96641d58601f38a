//! Streams followed across a broker's `kill -9` and restart (on another port), with
//! `Last-Event-ID`: `relay events --follow` processes, `relay_client` followers of the
//! event stream and one of a conversation's watch, all at once, while messages are
//! posted as fast as the broker takes them. Each must end with exactly the log the
//! restarted broker holds: nothing missed, nothing twice, and no follower gone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read};
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use relay_client::{Client, DataDir, Followed, Reconnect};
use relay_protocol::event::{Event, EventBody};
use relay_protocol::watch::{Snapshot, View};
use relay_tests::{wait_until, RelayProcess};
use serde_json::json;

/// Seqs (or message indexes) a follower got, in order.
type Got = Arc<Mutex<Vec<u64>>>;

/// What a `relay_client` follower saw besides its events.
#[derive(Default)]
struct Outages {
    lost: AtomicUsize,
    back: AtomicUsize,
}

async fn post(relay: &RelayProcess, body: &str) -> bool {
    relay
        .http()
        .try_request(
            reqwest::Method::POST,
            "/v1/messages",
            Some(
                json!({"conversation": "channel.shared", "author": "me", "body": body})
                    .to_string()
                    .into_bytes(),
            ),
        )
        .await
        .is_ok_and(|(code, _)| code == 200)
}

async fn last_seq(relay: &RelayProcess) -> u64 {
    relay.http().get("/v1/status").await.1["last_seq"]
        .as_u64()
        .unwrap()
}

/// Every event in the log, in order.
async fn log(relay: &RelayProcess) -> Vec<Event> {
    let (code, body) = relay.http().get("/v1/events?after=0&limit=10000").await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_value(body).unwrap()
}

/// `relay events --follow --since 0 --json`, its printed seqs collected on a thread.
fn events_follow(relay: &RelayProcess) -> (Child, Got) {
    let mut child = relay
        .spawn_cli(&["events", "--follow", "--since", "0", "--json"])
        .unwrap();
    let got = Got::default();
    let stdout = child.stdout.take().unwrap();
    let into = got.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            into.lock().unwrap().push(v["seq"].as_u64().unwrap());
        }
    });
    (child, got)
}

/// A `relay_client` follower of the event stream from the start.
fn client_follow(client: &Client) -> (tokio::task::JoinHandle<()>, Got, Arc<Outages>) {
    let got = Got::default();
    let outages = Arc::new(Outages::default());
    let mut follow = client.follow(
        &["v1", "events", "stream"],
        &[("after", "0".to_string())],
        Reconnect {
            give_up_after: None,
            wait_for_first: false,
        },
    );
    let (into, seen) = (got.clone(), outages.clone());
    let task = tokio::spawn(async move {
        follow
            .run(|f| {
                match f {
                    Followed::Event(e) => {
                        let event: Event = serde_json::from_str(&e.data).unwrap();
                        assert_eq!(e.id, event.seq.to_string(), "the id is the seq");
                        into.lock().unwrap().push(event.seq);
                    }
                    Followed::Lost(_) => {
                        seen.lost.fetch_add(1, Ordering::SeqCst);
                    }
                    Followed::Back => {
                        seen.back.fetch_add(1, Ordering::SeqCst);
                    }
                }
                true
            })
            .await
            .unwrap();
    });
    (task, got, outages)
}

/// A `relay_client` follower of the shared channel's watch: the indexes of the messages
/// it got (the snapshot's, then each posted one), and the kinds of events it got.
fn watch_follow(client: &Client) -> (tokio::task::JoinHandle<()>, Got, Arc<Mutex<Vec<String>>>) {
    let got = Got::default();
    let kinds = Arc::new(Mutex::new(Vec::new()));
    let mut follow = client.follow(
        &["v1", "watch"],
        &[
            ("conversation", "channel.shared".to_string()),
            ("limit", "10000".to_string()),
        ],
        Reconnect {
            give_up_after: None,
            wait_for_first: false,
        },
    );
    let (into, kinds_into) = (got.clone(), kinds.clone());
    let task = tokio::spawn(async move {
        follow
            .run(|f| {
                let Followed::Event(e) = f else { return true };
                kinds_into.lock().unwrap().push(e.event.clone());
                let mut got = into.lock().unwrap();
                match e.event.as_str() {
                    "snapshot" => {
                        let s: Snapshot = serde_json::from_str(&e.data).unwrap();
                        let View::Conversation(v) = s.view else {
                            panic!("not a conversation's snapshot: {}", e.data)
                        };
                        got.extend(v.messages.iter().map(|m| m.index));
                    }
                    "resumed" => {}
                    _ => {
                        let event: Event = serde_json::from_str(&e.data).unwrap();
                        let EventBody::MessagePosted { message, .. } = event.body else {
                            panic!("not a message: {}", e.data)
                        };
                        got.push(message.index);
                    }
                }
                true
            })
            .await
            .unwrap();
    });
    (task, got, kinds)
}

fn len(got: &Got) -> usize {
    got.lock().unwrap().len()
}

#[tokio::test(flavor = "multi_thread")]
async fn followers_miss_nothing_and_see_nothing_twice_across_a_kill_9_and_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut relay = RelayProcess::start(&dir).unwrap();
    for i in 0..5 {
        assert!(post(&relay, &format!("before {i}")).await);
    }
    let client = Client::discover(DataDir::Given(dir.clone()), None, None).unwrap();
    let clis: Vec<(Child, Got)> = (0..3).map(|_| events_follow(&relay)).collect();
    let followers: Vec<_> = (0..3).map(|_| client_follow(&client)).collect();
    let (watch_task, watched, kinds) = watch_follow(&client);
    let every = || {
        clis.iter()
            .map(|(_, g)| g.clone())
            .chain(followers.iter().map(|(_, g, _)| g.clone()))
            .collect::<Vec<Got>>()
    };
    let start = last_seq(&relay).await;
    wait_until(
        "every follower to catch up",
        Duration::from_secs(60),
        || async {
            every()
                .iter()
                .all(|g| g.lock().unwrap().last() == Some(&start))
                .then_some(())
        },
    )
    .await;

    // Messages go on being posted while the broker is killed.
    let stop = Arc::new(AtomicBool::new(false));
    let poster = {
        let (stop, http) = (stop.clone(), relay.http());
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let body = json!({"conversation": "channel.shared", "author": "me", "body": format!("during {i}")});
                let _ = http
                    .try_request(
                        reqwest::Method::POST,
                        "/v1/messages",
                        Some(body.to_string().into_bytes()),
                    )
                    .await;
                i += 1;
            }
        })
    };
    let seen = len(&every()[0]);
    wait_until(
        "followers to get events posted meanwhile",
        Duration::from_secs(60),
        || async { every().iter().all(|g| len(g) >= seen + 10).then_some(()) },
    )
    .await;
    relay.kill9();
    stop.store(true, Ordering::SeqCst);
    poster.await.unwrap();
    relay.restart().unwrap();
    for i in 0..20 {
        assert!(post(&relay, &format!("after {i}")).await);
    }

    // Each follower ends with the log as the restarted broker holds it, exactly.
    let log = log(&relay).await;
    let seqs: Vec<u64> = log.iter().map(|e| e.seq).collect();
    let last = *seqs.last().unwrap();
    assert_eq!(last, last_seq(&relay).await);
    wait_until(
        "every follower to get the last event",
        Duration::from_secs(60),
        || async {
            every()
                .iter()
                .all(|g| g.lock().unwrap().last() == Some(&last))
                .then_some(())
        },
    )
    .await;
    for (i, got) in every().iter().enumerate() {
        assert_eq!(*got.lock().unwrap(), seqs, "follower {i}");
    }
    let messages = log
        .iter()
        .filter(|e| matches!(&e.body, EventBody::MessagePosted { message, .. } if message.conversation == "channel.shared"))
        .count() as u64;
    wait_until(
        "the watch to get the last message",
        Duration::from_secs(60),
        || async { (len(&watched) as u64 >= messages).then_some(()) },
    )
    .await;
    assert_eq!(
        *watched.lock().unwrap(),
        (0..messages).collect::<Vec<_>>(),
        "the watch's messages"
    );
    let kinds = kinds.lock().unwrap().clone();
    assert_eq!(
        kinds.iter().filter(|k| *k == "snapshot").count(),
        1,
        "{kinds:?}"
    );
    assert!(kinds.iter().any(|k| k == "resumed"), "{kinds:?}");
    for (task, _, outages) in &followers {
        assert!(!task.is_finished());
        assert!(outages.lost.load(Ordering::SeqCst) >= 1);
        assert!(outages.back.load(Ordering::SeqCst) >= 1);
    }
    assert!(!watch_task.is_finished());

    // The `relay events --follow` processes are still following (not ended with 0 by the
    // restart), and said what happened.
    for (mut child, _) in clis {
        assert_eq!(
            child.try_wait().unwrap(),
            None,
            "relay events --follow exited"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        assert!(stderr.contains("lost the broker"), "{stderr}");
        assert!(stderr.contains("the broker is back"), "{stderr}");
    }
    for (task, _, _) in followers {
        task.abort();
    }
    watch_task.abort();
}
