//! `flight.list`'s `since` and `q` through the real `relay` binary: over HTTP
//! (`GET /v1/flights?since=&q=`), from the CLI (`relay flight list --since --search`),
//! and from many clients listing at once while flights are written. The agents are
//! `relay-fake-acp` (a turn answers `echo: TASK`), so the test takes seconds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_tests::agents::{state, Env};
use relay_tests::Http;
use serde_json::{json, Value};

const FAKE: &str = env!("CARGO_BIN_EXE_relay-fake-acp");

/// The ids of a flight list, as listed.
fn ids(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(|f| f["id"].as_str().unwrap().to_string())
        .collect()
}

/// `GET /v1/flights` with `query`: its ids, newest last.
async fn list(http: &Http, query: &str) -> Vec<String> {
    let (code, body) = http.get(&format!("/v1/flights?{query}")).await;
    assert_eq!(code, 200, "{query}: {body}");
    ids(&body)
}

/// Asks `agent` for `task` as `requester` over HTTP; the flight's id.
async fn ask(http: &Http, agent: &str, task: &str, requester: &str) -> String {
    let body = json!({"target": agent, "task": task, "requester": requester});
    let (code, asked) = http.post("/v1/invocations", &body).await;
    assert_eq!(code, 200, "{asked}");
    asked["flight"]["id"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn flights_are_found_by_time_and_by_text_over_http_and_from_the_cli() {
    let env = Env::start().await;
    // Names that cannot be part of an id (ids are hex).
    env.add_acp("kit", FAKE);
    env.add_acp("moss", FAKE);
    let http = env.relay.http();
    let zebra = ask(&http, "kit", "Find the Zebra", "operator").await;
    let plain = ask(&http, "moss", "plain work", "operator").await;
    let bot = ask(&http, "moss", "nightly run", "Nightly-Bot").await;
    for id in [&zebra, &plain, &bot] {
        env.wait_flight(id, 60, |f| state(f) == "completed").await;
    }

    // Text, in any case: the task, the requester, the agent, the id, the output.
    assert_eq!(list(&http, "q=zEBRA").await, vec![zebra.clone()]);
    assert_eq!(list(&http, "q=nightly-bot").await, vec![bot.clone()]);
    assert_eq!(list(&http, "q=MOSS").await, [plain.clone(), bot.clone()]);
    assert_eq!(
        list(&http, &format!("q={plain}")).await,
        vec![plain.clone()]
    );
    // Only the output says `echo:` (the fake's answer); no task or name does.
    assert_eq!(
        list(&http, "q=echo%3A").await,
        [zebra.clone(), plain.clone(), bot.clone()]
    );
    assert!(list(&http, "q=giraffe").await.is_empty());
    // With the other filters and the limit (the newest kept).
    assert_eq!(list(&http, "q=moss&limit=1").await, vec![bot.clone()]);
    assert_eq!(list(&http, "q=work&agent=kit").await, Vec::<String>::new());

    // Time: ms since the epoch, a duration, a date; each bound where it says.
    let second = env.flight(&plain).await["created_at"].as_u64().unwrap();
    let third = env.flight(&bot).await["created_at"].as_u64().unwrap();
    let expected: Vec<String> = [(&zebra, 0), (&plain, second), (&bot, third)]
        .into_iter()
        .filter(|(_, at)| *at >= second)
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(list(&http, &format!("since={second}")).await, expected);
    assert_eq!(list(&http, "since=1h").await.len(), 3);
    let today = relay_protocol::clock::utc_date(second);
    assert_eq!(
        list(&http, &format!("since={today}&q=zebra")).await,
        vec![zebra.clone()]
    );
    assert!(list(&http, &format!("since={}", third + 3_600_000))
        .await
        .is_empty());
    let (code, body) = http.get("/v1/flights?since=yesterday").await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_request", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("neither a duration"),
        "{body}"
    );

    // The CLI: the same filters, as `relay usage --since` takes them.
    let found = env.relay.cli_json(&[
        "flight", "list", "--since", "24h", "--search", "ZEBRA", "--json",
    ]);
    assert_eq!(ids(&found), vec![zebra.clone()]);
    let table = env.relay.cli_ok(&["flight", "list", "--search", "nightly"]);
    assert!(table.contains(&bot) && !table.contains(&zebra), "{table}");
    let out = env.relay.cli(&["flight", "list", "--since", "yesterday"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("neither a duration"), "{err}");
}

/// Sixteen clients list by text and time, again and again, while flights are asked:
/// every answer is a well-formed list, newest last, within its limit, each flight in it
/// matching; once the writes are done, the search finds exactly the flights asked.
#[tokio::test(flavor = "multi_thread")]
async fn many_clients_search_while_flights_are_written() {
    let env = Env::start().await;
    env.add_acp("kit", FAKE);
    let http = env.relay.http();
    let asks = 40;
    let writer = {
        let http = http.clone();
        tokio::spawn(async move {
            let mut made = Vec::new();
            for i in 0..asks {
                let task = if i % 2 == 0 { "find Zebra" } else { "plain" };
                made.push((ask(&http, "kit", task, "operator").await, i % 2 == 0));
            }
            made
        })
    };
    let readers: Vec<_> = (0..16)
        .map(|r| {
            let http = http.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                // 15 rounds, and on until it has seen a flight (the writer is still
                // going): each reader lists while flights are written.
                for round in 0..10_000 {
                    if round >= 15 && !seen.is_empty() {
                        break;
                    }
                    let query = if r % 2 == 0 {
                        "q=zebra&limit=7"
                    } else {
                        "since=1h&q=ZEBRA&limit=50"
                    };
                    let (code, body) = http.get(&format!("/v1/flights?{query}")).await;
                    assert_eq!(code, 200, "{body}");
                    let flights = body.as_array().unwrap();
                    assert!(flights.len() <= if r % 2 == 0 { 7 } else { 50 });
                    let listed = ids(&body);
                    let mut sorted = listed.clone();
                    sorted.sort();
                    assert_eq!(listed, sorted, "newest last");
                    for f in flights {
                        assert_eq!(f["agent"], "kit", "{f}");
                    }
                    seen.extend(listed);
                }
                seen
            })
        })
        .collect();
    let mut seen = Vec::new();
    for r in readers {
        seen.extend(r.await.unwrap());
    }
    let made = writer.await.unwrap();
    let zebras: Vec<String> = made
        .iter()
        .filter(|(_, z)| *z)
        .map(|(id, _)| id.clone())
        .collect();
    // Every flight a reader got matched; the search now gives exactly the zebra asks.
    assert!(
        !seen.is_empty(),
        "the readers found flights while they were written"
    );
    for id in &seen {
        assert!(zebras.contains(id), "{id} is no zebra ask");
    }
    assert_eq!(list(&http, "q=zebra&limit=100").await, zebras);
    assert_eq!(
        list(&http, "since=1h&q=plain&limit=100").await.len(),
        asks / 2
    );
}
