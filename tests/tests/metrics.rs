//! `/metrics`, `/healthz` and `relay up --log-format json`, against a real `relay up`
//! with agents on `relay-fake-acp` (an ACP agent that answers at once, and asks for
//! `rm -rf /tmp/x` when told `ask`).
//!
//! Each scrape is parsed by a Prometheus text-format parser (`prometheus-parse`), and
//! the counters are compared before and after a known load: exact where what moves them
//! is deterministic (flights created and completed, approvals by person and by policy,
//! usage written as running totals, refusals counted against the 429s the clients got).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use relay_tests::agents::{state, Env};
use relay_tests::wait_until;
use serde_json::{json, Value};

const FAKE: &str = env!("CARGO_BIN_EXE_relay-fake-acp");

/// One scrape: each series (name and sorted labels) and its value.
#[derive(Debug, Clone)]
struct Scrape(BTreeMap<String, f64>);

impl Scrape {
    /// Parses `text` as Prometheus would: every sample line must be understood, and
    /// typed (its `# TYPE` line read) as a counter or a gauge.
    fn parse(text: &str) -> Scrape {
        let lines = text.lines().map(|l| Ok(l.to_string()));
        let parsed = prometheus_parse::Scrape::parse(lines).unwrap();
        let sample_lines = text
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .count();
        assert_eq!(
            parsed.samples.len(),
            sample_lines,
            "every sample line parses:\n{text}"
        );
        let mut series = BTreeMap::new();
        for s in parsed.samples {
            let value = match s.value {
                prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) => v,
                other => panic!("{} is untyped or not a counter/gauge: {other:?}", s.metric),
            };
            assert!(
                parsed.docs.contains_key(&s.metric),
                "{} has its HELP line",
                s.metric
            );
            let labels: BTreeMap<_, _> = s.labels.iter().collect();
            let key = format!("{}{labels:?}", s.metric);
            assert!(series.insert(key.clone(), value).is_none(), "{key} twice");
        }
        Scrape(series)
    }

    /// A series' value (0 when absent: a counter not yet registered).
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let labels: BTreeMap<&String, &String> = labels.iter().collect();
        self.0
            .get(&format!("{name}{labels:?}"))
            .copied()
            .unwrap_or(0.0)
    }

    fn has(&self, name: &str, labels: &[(&str, &str)]) -> bool {
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let labels: BTreeMap<&String, &String> = labels.iter().collect();
        self.0.contains_key(&format!("{name}{labels:?}"))
    }
}

/// Scrapes `/metrics` with the operator's token.
async fn scrape(env: &Env) -> Scrape {
    let (code, body) = env.relay.http().get("/metrics").await;
    assert_eq!(code, 200, "{body}");
    Scrape::parse(body.as_str().unwrap())
}

/// Raw GET without any token: status and body text.
async fn get_untokened(env: &Env, path: &str) -> (u16, String, String) {
    let resp = reqwest::get(format!("{}{path}", env.relay.api.url))
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let ctype = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, ctype, resp.text().await.unwrap())
}

fn add_acp(env: &Env, name: &str, extra: &[&str]) {
    let work = env.work.display().to_string();
    let args = [
        "agent",
        "add",
        name,
        "--harness",
        "acp",
        "--cwd",
        &work,
        "--command",
        FAKE,
    ];
    env.relay.cli_ok(&[&args[..], extra].concat());
}

const LIVE: [&str; 4] = ["queued", "waking", "running", "waiting"];

/// The tokens and cost an agent's flights recorded: the last usage update of each
/// (a running total), summed.
async fn recorded_usage(env: &Env, flights: &[String]) -> [f64; 5] {
    let mut sum = [0.0; 5];
    for id in flights {
        let updates = env.updates(id).await;
        if let Some(u) = updates.iter().rev().find(|u| u["kind"] == "usage") {
            let n = |k: &str| u[k].as_u64().unwrap_or(0) as f64;
            for (i, k) in [
                "input_tokens",
                "cached_input_tokens",
                "output_tokens",
                "reasoning_tokens",
                "cost_micro_usd",
            ]
            .iter()
            .enumerate()
            {
                sum[i] += n(k);
            }
        }
    }
    sum
}

#[tokio::test(flavor = "multi_thread")]
async fn the_counters_move_by_exactly_what_a_small_load_did() {
    let env = Env::start().await;
    add_acp(&env, "person", &[]);
    add_acp(&env, "policy", &["--auto-accept", "rm -rf /tmp/x"]);
    add_acp(&env, "echo", &[]);

    // Health without a token; metrics without one refused; with an agent's token too.
    let (code, _, body) = get_untokened(&env, "/healthz").await;
    assert_eq!((code, body.as_str()), (200, "ok"));
    let (code, _, body) = get_untokened(&env, "/metrics").await;
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("unauthorized"), "{body}");
    let (code, ctype, _) = {
        let resp = reqwest::Client::new()
            .get(format!("{}/metrics", env.relay.api.url))
            .bearer_auth(&env.relay.api.token)
            .send()
            .await
            .unwrap();
        let ctype = resp.headers()["content-type"].to_str().unwrap().to_string();
        (resp.status().as_u16(), ctype, resp.text().await.unwrap())
    };
    assert_eq!(code, 200);
    assert!(ctype.starts_with("text/plain; version=0.0.4"), "{ctype}");

    let before = scrape(&env).await;
    for state in LIVE {
        assert_eq!(before.get("relay_flights", &[("state", state)]), 0.0);
    }
    assert!(before.has("relay_queue_depth", &[("queue", "writer")]));
    assert_eq!(before.get("relay_approvals_pending", &[]), 0.0);

    // A person's approval: pending while it waits, with usage written meanwhile as a
    // running total (the same total twice counts once).
    let asked = env.ask_no_wait("person", "ask");
    let approval = env.wait_approval(&asked).await;
    let during = scrape(&env).await;
    assert_eq!(during.get("relay_approvals_pending", &[]), 1.0);
    assert!(during.get("relay_flights", &[("state", "waiting")]) >= 1.0);
    let usage = |input: u64, output: u64, cost: u64| {
        json!({"kind": "usage", "input_tokens": input, "cached_input_tokens": 40,
            "output_tokens": output, "reasoning_tokens": 5, "cost_micro_usd": cost})
    };
    for u in [
        usage(100, 20, 1000),
        usage(150, 30, 1500),
        usage(150, 30, 1500),
    ] {
        let (code, r) = env
            .relay
            .http()
            .post(&format!("/v1/flights/{asked}/updates"), &u)
            .await;
        assert_eq!(code, 200, "{r}");
    }
    env.relay
        .cli_ok(&["approve", approval["id"].as_str().unwrap(), "accept"]);
    // A policy's approval, and two plain flights.
    let by_policy = env.ask_no_wait("policy", "ask");
    let plain: Vec<String> = (0..2)
        .map(|n| env.ask_no_wait("echo", &format!("hello {n}")))
        .collect();
    let all: Vec<String> = [asked.clone(), by_policy.clone()]
        .into_iter()
        .chain(plain.clone())
        .collect();
    for id in &all {
        env.wait_flight(id, 60, |f| state(f) == "completed").await;
    }
    let policy = env.approval_of(&by_policy);
    assert_eq!(policy["decided_by"], "policy:auto-accept:rm -rf /tmp/x");

    let after = scrape(&env).await;
    let moved =
        |name: &str, labels: &[(&str, &str)]| after.get(name, labels) - before.get(name, labels);
    assert_eq!(moved("relay_flights_total", &[("state", "queued")]), 4.0);
    assert_eq!(moved("relay_flights_total", &[("state", "completed")]), 4.0);
    assert_eq!(moved("relay_flights_total", &[("state", "failed")]), 0.0);
    assert_eq!(moved("relay_flights_total", &[("state", "cancelled")]), 0.0);
    // Each ran at least once (and the two that asked waited, then ran again).
    assert!(moved("relay_flights_total", &[("state", "running")]) >= 4.0);
    assert!(moved("relay_flights_total", &[("state", "waiting")]) >= 1.0);
    for state in LIVE {
        assert_eq!(
            after.get("relay_flights", &[("state", state)]),
            0.0,
            "{state}"
        );
    }
    for agent in ["person", "policy", "echo"] {
        let queue = [("queue", "agent"), ("agent", agent)];
        assert!(after.has("relay_queue_depth", &queue), "{agent}");
        assert_eq!(after.get("relay_queue_depth", &queue), 0.0);
    }
    assert_eq!(after.get("relay_approvals_pending", &[]), 0.0);
    let decided = |kind| moved("relay_approvals_decided_total", &[("kind", kind)]);
    assert_eq!(decided("person"), 1.0);
    assert_eq!(decided("policy"), 1.0);
    for kind in ["rule", "timeout", "relay", "harness"] {
        assert_eq!(decided(kind), 0.0, "{kind}");
    }
    // The person's agent: only the usage written above (its flight reports none).
    let tokens = |agent, kind| moved("relay_tokens_total", &[("agent", agent), ("kind", kind)]);
    assert_eq!(tokens("person", "input"), 150.0);
    assert_eq!(tokens("person", "cached_input"), 40.0);
    assert_eq!(tokens("person", "output"), 30.0);
    assert_eq!(tokens("person", "reasoning"), 5.0);
    assert_eq!(
        moved("relay_cost_micro_usd_total", &[("agent", "person")]),
        1500.0
    );
    // The others: what their flights recorded, whatever the harness reports.
    for (agent, flights) in [("echo", plain.clone()), ("policy", vec![by_policy.clone()])] {
        let recorded = recorded_usage(&env, &flights).await;
        let shown = [
            tokens(agent, "input"),
            tokens(agent, "cached_input"),
            tokens(agent, "output"),
            tokens(agent, "reasoning"),
            moved("relay_cost_micro_usd_total", &[("agent", agent)]),
        ];
        assert_eq!(shown, recorded, "{agent}");
    }
    // Every commit was flushed; nothing refused.
    assert!(moved("relay_durable_flushes_total", &[]) >= 1.0);
    let (_, status) = env.relay.http().get("/v1/status").await;
    assert!(after.get("relay_durable_flushes_total", &[]) <= status["flushes"].as_f64().unwrap());
    for what in ["command_queue", "agent_queue", "connections", "streams"] {
        assert!(after.has("relay_overloaded_total", &[("what", what)]));
        assert_eq!(moved("relay_overloaded_total", &[("what", what)]), 0.0);
    }
}

/// Many clients invoke at once (through a small writer queue, so some are refused),
/// while another scrapes over and over: every scrape parses and no counter goes back;
/// at the end the counters are exact: a flight created and completed for each accepted
/// invocation, a refusal counted for each 429.
#[tokio::test(flavor = "multi_thread")]
async fn scrapes_during_many_invocations_at_once_end_exact() {
    let env = Env::start_with(&["--command-queue", "12"]).await;
    let agents = ["c1", "c2", "c3", "c4"];
    for a in agents {
        add_acp(&env, a, &[]);
    }
    let before = scrape(&env).await;
    let http = env.relay.http();
    let stop = tokio_util::sync::CancellationToken::new();
    let scraper = {
        let (http, stop) = (http.clone(), stop.clone());
        tokio::spawn(async move {
            let mut last = BTreeMap::new();
            let mut scrapes = 0;
            while !stop.is_cancelled() {
                let (code, body) = http.get("/metrics").await;
                assert_eq!(code, 200, "{body}");
                let s = Scrape::parse(body.as_str().unwrap());
                for (k, v) in &s.0 {
                    if k.contains("_total") {
                        assert!(*v >= last.get(k).copied().unwrap_or(0.0), "{k} went back");
                    }
                }
                last = s.0;
                scrapes += 1;
            }
            scrapes
        })
    };
    let calls = agents
        .iter()
        .flat_map(|a| (0..8).map(move |n| (*a, format!("task {a} {n}"))))
        .map(|(a, task)| {
            let http = http.clone();
            tokio::spawn(async move {
                let body = json!({"target": a, "task": task});
                http.post("/v1/invocations", &body).await
            })
        })
        .collect::<Vec<_>>();
    let mut accepted = Vec::new();
    let mut refused = 0;
    for call in calls {
        let (code, body) = call.await.unwrap();
        match code {
            200 => accepted.push(body["flight"]["id"].as_str().unwrap().to_string()),
            429 => {
                assert_eq!(body["error"]["code"], "overloaded", "{body}");
                refused += 1;
            }
            other => panic!("{other}: {body}"),
        }
    }
    for id in &accepted {
        env.wait_flight(id, 60, |f| state(f) == "completed").await;
    }
    stop.cancel();
    let scrapes = scraper.await.unwrap();
    // The first invocations fit the queue (nothing else writes then).
    assert!(!accepted.is_empty());
    assert!(scrapes >= 1);
    let after = scrape(&env).await;
    let moved =
        |name: &str, labels: &[(&str, &str)]| after.get(name, labels) - before.get(name, labels);
    let n = accepted.len() as f64;
    assert_eq!(moved("relay_flights_total", &[("state", "queued")]), n);
    assert_eq!(moved("relay_flights_total", &[("state", "completed")]), n);
    let overloaded: f64 = ["command_queue", "agent_queue", "connections", "streams"]
        .iter()
        .map(|what| moved("relay_overloaded_total", &[("what", what)]))
        .sum();
    assert_eq!(overloaded, refused as f64);
    for state in LIVE {
        assert_eq!(
            after.get("relay_flights", &[("state", state)]),
            0.0,
            "{state}"
        );
    }
    assert_eq!(after.get("relay_queue_depth", &[("queue", "writer")]), 0.0);
}

/// `--log-format json`: every line on stderr is one JSON object; the lines a flight
/// caused (its turn in the runtime, the plane's handling of its reports) carry its id in
/// their `flight` span, and a request's lines name its method from the method table.
#[tokio::test(flavor = "multi_thread")]
async fn json_logs_are_json_and_a_flights_lines_carry_its_id() {
    let env = Env::start_with(&["--log-format", "json"]).await;
    add_acp(&env, "j1", &[]);
    let id = env.ask_no_wait("j1", "hello");
    // Polls `GET /v1/flights/{id}`: `flight.show` requests.
    env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    let parse = |text: &str| -> Vec<Value> {
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str::<Value>(l)
                    .unwrap_or_else(|e| panic!("not JSON ({e}): {l}\nlog:\n{text}"))
            })
            .collect()
    };
    let flights_line = |lines: &[Value], target: &str, message: &str| {
        lines.iter().any(|l| {
            l["target"].as_str().unwrap_or("").starts_with(target)
                && l["fields"]["message"] == message
                && in_span(l, "flight", "flight", &id)
        })
    };
    // The plane logs the flight's end once its commit is answered: maybe just after
    // the flight reads completed.
    let lines = wait_until(
        "the flight's end in the log",
        Duration::from_secs(30),
        || async {
            let lines = parse(&env.relay.log_text());
            flights_line(&lines, "relay_broker::plane", "flight ended").then_some(lines)
        },
    )
    .await;
    assert!(flights_line(&lines, "relay_runtime", "turn starts"));
    assert!(flights_line(&lines, "relay_runtime", "turn ended"));
    assert!(
        lines.iter().any(|l| l["fields"]["message"] == "answered"
            && in_span(l, "request", "method", "flight.show")
            && in_span(l, "request", "route", "/v1/flights/{id}")),
        "a request's line names its method"
    );
    assert!(lines
        .iter()
        .any(|l| l["fields"]["message"] == "relay broker up"));
    for l in &lines {
        assert!(l["level"].is_string() && l["timestamp"].is_string(), "{l}");
    }
    // No banner or other plain text (checked line by line above).
    assert!(!env.relay.log_text().contains("relay: serving on"));
}

/// Whether `line` was logged inside a span `name` whose `field` is `value`.
fn in_span(line: &Value, name: &str, field: &str, value: &str) -> bool {
    line["spans"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(std::iter::once(&line["span"]))
        .any(|s| s["name"] == name && s[field] == value)
}
