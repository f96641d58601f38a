//! A long answer (1 MiB or more) of an agent of `relay up`'s own runtime is written to the
//! log's text files before it is reported, and the log's records refer to it there: no
//! record holds it, the item, the completion, its flight and the reply read it back whole,
//! across a `kill -9` and a restart, from several agents at once; `relay doctor` checks
//! out. A short answer stays in the log. A burst of short deltas from several agents at
//! once (the streams held until all have started, so that they surely run together)
//! reaches the log joined into slices, none over `DELTA_MERGE_MAX`, with nothing of its
//! text lost or reordered.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use relay_broker::store::{Store, STORE_DIR};
use relay_protocol::domain::shared::LONG_TEXT;
use relay_protocol::runtime::DELTA_MERGE_MAX;
use relay_tests::load::{instant_codex_bin, STREAM_BARRIER_VAR};
use relay_tests::{relay_cmd, wait_until, Http, RelayProcess};
use serde_json::{json, Value};

/// Deltas of 64 KiB: 24 of them make an answer of 1.5 MiB.
const DELTAS: usize = 24;
const DELTA: usize = 64 * 1024;
const AGENTS: usize = 4;

async fn ask(http: &Http, agent: &str, task: &str) -> String {
    let (code, v) = http
        .post("/v1/invocations", &json!({"target": agent, "task": task}))
        .await;
    assert_eq!(code, 200, "{v}");
    v["flight"]["id"].as_str().unwrap().to_string()
}

async fn completed(http: &Http, id: &str) -> Value {
    wait_until(
        format!("flight {id} to complete"),
        Duration::from_secs(60),
        || async {
            let (code, f) = http.get(&format!("/v1/flights/{id}")).await;
            (code == 200 && f["state"] == "completed").then_some(f)
        },
    )
    .await
}

/// The answer of flight `id` as each of its readers has it: its output, its last agent
/// message item, its streamed deltas joined, and the reply posted with it. All the same.
async fn answer(http: &Http, id: &str) -> String {
    let f = completed(http, id).await;
    let output = f["output"].as_str().unwrap().to_string();
    let (code, updates) = http.get(&format!("/v1/flights/{id}/updates")).await;
    assert_eq!(code, 200, "{updates}");
    let mut deltas = String::new();
    let mut item = None;
    for u in updates.as_array().unwrap() {
        let change = u; // flattened into the update
        match change["kind"].as_str().unwrap() {
            "delta" => deltas.push_str(change["text"].as_str().unwrap()),
            "item" if change["phase"] == "completed" => {
                item = change["text"].as_str().map(str::to_string)
            }
            "state" if change["to"] == "completed" => {
                assert_eq!(change["output"].as_str(), Some(output.as_str()));
            }
            _ => {}
        }
    }
    assert_eq!(item.as_deref(), Some(output.as_str()), "the item's text");
    assert_eq!(deltas, output, "the deltas joined");
    let conversation = f["conversation"].as_str().unwrap();
    let (code, messages) = http
        .get(&format!(
            "/v1/conversations/{conversation}/messages?limit=1000"
        ))
        .await;
    assert_eq!(code, 200, "{messages}");
    let reply = messages
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["meta"]["flight"] == id && m["author"] != "operator")
        .unwrap_or_else(|| panic!("no reply of {id}"));
    assert_eq!(reply["body"].as_str(), Some(output.as_str()), "the reply");
    output
}

#[tokio::test(flavor = "multi_thread")]
async fn long_answers_are_written_first_and_referred_to_across_a_kill_9() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut relay = RelayProcess::start(&data).unwrap();
    let http = relay.http();
    let command = instant_codex_bin().display().to_string();
    let cwd = tmp.path().display().to_string();
    let names: Vec<String> = (0..=AGENTS).map(|i| format!("long-{i}")).collect();
    for name in &names {
        let spec =
            json!({"name": name, "harness": "codex_app_server", "cwd": cwd, "command": command});
        let (code, v) = http.post("/v1/agents", &spec).await;
        assert_eq!(code, 200, "{v}");
    }
    // AGENTS long answers at once, and a short one beside them.
    let task = format!("stream:{DELTAS}:{DELTA}");
    let mut asked = Vec::new();
    for name in &names[..AGENTS] {
        let (http, name, task) = (http.clone(), name.clone(), task.clone());
        asked.push(tokio::spawn(async move { ask(&http, &name, &task).await }));
    }
    let short = ask(&http, &names[AGENTS], "hello").await;
    let mut flights = Vec::new();
    for a in asked {
        flights.push(a.await.unwrap());
    }
    let mut answers = BTreeMap::new();
    for id in &flights {
        let a = answer(&http, id).await;
        assert_eq!(a.len(), DELTAS * DELTA);
        answers.insert(id.clone(), a);
    }
    assert_eq!(answer(&http, &short).await, "ok: hello");

    // Acknowledged, so on disk: a kill -9 loses none of it.
    relay.kill9();
    relay.restart().unwrap();
    let http = relay.http();
    for (id, a) in &answers {
        assert_eq!(&answer(&http, id).await, a, "flight {id} after the restart");
    }
    relay.terminate().unwrap();

    // One file per long answer, holding it; no record of the log holds one.
    let store_dir = data.join(STORE_DIR);
    let texts = store_dir.join("log").join("texts");
    let mut files: Vec<String> = std::fs::read_dir(&texts)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(files.len(), AGENTS, "{files:?}");
    for (id, a) in &answers {
        let name = files
            .iter()
            .find(|f| f.starts_with(&format!("{id}.")))
            .unwrap_or_else(|| panic!("no file of {id}: {files:?}"));
        assert_eq!(&std::fs::read_to_string(texts.join(name)).unwrap(), a);
    }
    let store = Store::open(&store_dir).unwrap();
    let mut longest = 0;
    store
        .log()
        .scan(0, |r| {
            longest = longest.max(r.payload.len());
            Ok::<_, relay_broker::store::LogError>(true)
        })
        .unwrap();
    assert!(longest < LONG_TEXT / 4, "a record of {longest} bytes");
    drop(store);
    let out = relay_cmd(&data, &["doctor", "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["consistent"], true, "{report}");
}

#[tokio::test(flavor = "multi_thread")]
async fn bursts_of_short_deltas_from_several_agents_are_joined_whole_and_in_order() {
    const BURST: usize = 20_000;
    const SIZE: usize = 32;
    let tmp = tempfile::tempdir().unwrap();
    let mut relay = RelayProcess::start(&tmp.path().join("data")).unwrap();
    let http = relay.http();
    let command = instant_codex_bin().display().to_string();
    let cwd = tmp.path().display().to_string();
    let names: Vec<String> = (0..AGENTS).map(|i| format!("burst-{i}")).collect();
    // Each stream waits until all the agents' streams have reached their first delta.
    let barrier_dir = tmp.path().join("barrier");
    let barrier = format!("{}:{AGENTS}", barrier_dir.display());
    for name in &names {
        let spec = json!({
            "name": name, "harness": "codex_app_server", "cwd": cwd, "command": command,
            "env": {STREAM_BARRIER_VAR: barrier},
        });
        let (code, v) = http.post("/v1/agents", &spec).await;
        assert_eq!(code, 200, "{v}");
    }
    let asked = names.iter().map(|name| {
        let (http, name) = (http.clone(), name.clone());
        tokio::spawn(async move { ask(&http, &name, &format!("stream:{BURST}:{SIZE}")).await })
    });
    let mut flights = Vec::new();
    for a in asked.collect::<Vec<_>>() {
        flights.push(a.await.unwrap());
    }
    // When each stream's first and last deltas were written (each delta starts with
    // its time in ns: see relay-instant-codex).
    let mut spans = Vec::new();
    for id in &flights {
        // Its deltas joined are its answer, its item and its reply (see `answer`).
        let answer = answer(&http, id).await;
        assert_eq!(answer.len(), BURST * SIZE, "{id}");
        let written = |at: usize| answer[at..at + 20].parse::<u128>().unwrap();
        spans.push((written(0), written(answer.len() - SIZE)));
        let (_, updates) = http.get(&format!("/v1/flights/{id}/updates")).await;
        let slices: Vec<usize> = updates
            .as_array()
            .unwrap()
            .iter()
            .filter(|u| u["kind"] == "delta")
            .map(|u| u["text"].as_str().unwrap().len())
            .collect();
        assert!(
            slices.iter().all(|len| *len <= DELTA_MERGE_MAX),
            "{id}: a slice over the cap: {slices:?}"
        );
        // Streamed far faster than one commit a delta: joined on the way (by the
        // runtime's worker, the plane or the writer: any of them may join a run).
        assert!(slices.len() * 4 < BURST, "{id}: {} updates", slices.len());
    }
    // The barrier held them (each stream's process reached it)...
    let reached = std::fs::read_dir(&barrier_dir).unwrap().count();
    assert_eq!(reached, AGENTS, "processes at the streams' barrier");
    // ...and the streams ran together: every one began before any ended.
    let last_first = spans.iter().map(|s| s.0).max().unwrap();
    let first_last = spans.iter().map(|s| s.1).min().unwrap();
    assert!(
        last_first < first_last,
        "the streams did not overlap (first and last delta written, ns): {spans:?}"
    );
    relay.terminate().unwrap();
}
