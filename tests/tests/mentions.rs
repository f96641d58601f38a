//! Mentions end to end: a real `relay up`, the real pinned Codex and Claude Code CLIs
//! against the mock model. `@name` in a message consults each mentioned agent, whose
//! answer is posted under the message; an agent's answer that mentions another agent
//! consults it as a child of its flight; the loop rules stop a mention loop without
//! failing a post; what an agent sends from its shell (`relay send`) consults within
//! the flight it runs, and it reads a refusal as the command's output; a mention of
//! oneself or of an unknown name starts nothing; a consult still queued when the broker
//! is killed runs after the restart.
//!
//! Over 600 lines: the mention rules end to end, one test per rule, read as one file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use relay_mock_model::{RecordedRequest, Reply};
use relay_tests::agents::{state, Env};
use relay_tests::wait_until;
use serde_json::Value;

/// Answers by what the task says (a mentioned agent's task is the whole message with a
/// line of context before it): the `(needle, answer)` of the first needle it contains,
/// `hang` (at the start) never ends, anything else is a plain `ok` (never an echo: an
/// echo of a task would mention its agents again).
fn answers(table: &'static [(&'static str, &'static str)]) -> impl Fn(&RecordedRequest) -> Reply {
    move |req| {
        let text = req.last_user_text().unwrap_or_default();
        if text.starts_with("hang") {
            return Reply::hang();
        }
        let answer = table
            .iter()
            .find(|(needle, _)| text.contains(needle))
            .map_or("ok", |(_, answer)| answer);
        Reply::text(answer)
    }
}

/// A broker with two agents, `codex-1` (Codex) and `claude-1` (Claude Code), whose
/// model answers by `table` (see [`answers`]).
async fn codex_and_claude(table: &'static [(&'static str, &'static str)]) -> Env {
    let env = Env::start().await;
    env.mock.set_handler(answers(table));
    env.add_agent("codex-1", &[]);
    env.add_claude("claude-1", &[]);
    env
}

/// `relay send --json TEXT` as `author`: the post's answer.
fn send(env: &Env, author: &str, text: &str) -> Value {
    env.relay
        .cli_json(&["send", "--as", author, "--json", text])
}

/// `relay send ARGS` as text: the message id (stdout, alone) and the lines saying what
/// its mentions did (stderr).
fn send_text(env: &Env, args: &[&str]) -> (String, Vec<String>) {
    let mut all = vec!["send"];
    all.extend_from_slice(args);
    let out = env.relay.cli(&all);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{stdout}{stderr}");
    let ids: Vec<&str> = stdout.lines().collect();
    assert!(
        matches!(&ids[..], [id] if id.starts_with("msg_")),
        "stdout is the message id alone: {stdout:?}"
    );
    (
        ids[0].to_string(),
        stderr.lines().map(str::to_string).collect(),
    )
}

/// The flight id in `relay send`'s line saying it asked `agent`, checking the line.
fn asked_in(line: &str, agent: &str) -> String {
    let id = line
        .strip_prefix(&format!("asked {agent} ("))
        .and_then(|rest| rest.split_once("): relay watch --flight "))
        .filter(|(id, again)| id == again && id.starts_with("flt_"))
        .map(|(id, _)| id.to_string());
    id.unwrap_or_else(|| panic!("not a consult of {agent}: {line:?}"))
}

/// The flights a post's answer lists, as (agent, flight id).
fn started(posted: &Value) -> Vec<(String, String)> {
    posted["flights"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["agent"].as_str().unwrap().to_string(),
                f["id"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The operator sends `text`, which mentions `agent` only: the message id and the
/// consult's flight.
fn consult_one(env: &Env, agent: &str, text: &str) -> (String, String) {
    let posted = send(env, "operator", text);
    match &started(&posted)[..] {
        [(consulted, flight)] if consulted == agent => (
            posted["message"]["id"].as_str().unwrap().to_string(),
            flight.clone(),
        ),
        _ => panic!("not one consult of {agent}: {posted}"),
    }
}

/// The operator consults codex-1 with `text`, and its answer consults claude-1: the
/// message id and the two flights, once both completed.
async fn codex_then_claude(env: &Env, text: &str) -> (String, Value, Value) {
    let (msg, first) = consult_one(env, "codex-1", text);
    let first = completed(env, &first).await;
    let second = only_flight_of(env, "claude-1").await;
    let second = completed(env, second["id"].as_str().unwrap()).await;
    (msg, first, second)
}

async fn completed(env: &Env, id: &str) -> Value {
    let f = env
        .wait_flight(id, 120, |f| {
            ["completed", "failed", "cancelled"].contains(&state(f))
        })
        .await;
    assert_eq!(state(&f), "completed", "{f}");
    f
}

fn messages(env: &Env) -> Vec<Value> {
    env.relay
        .cli_json(&["read", "-n", "100", "--json"])
        .as_array()
        .unwrap()
        .clone()
}

fn message<'a>(all: &'a [Value], id: &str) -> &'a Value {
    all.iter()
        .find(|m| m["id"] == id)
        .unwrap_or_else(|| panic!("no message {id} in {all:?}"))
}

/// The whole event log.
async fn events(env: &Env) -> Vec<Value> {
    let (code, events) = env
        .relay
        .http()
        .get("/v1/events?after=0&limit=100000")
        .await;
    assert_eq!(code, 200, "{events}");
    events.as_array().unwrap().clone()
}

/// Every delivery of message `id`, by target, as last recorded.
async fn deliveries_of(env: &Env, id: &str) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for e in events(env).await {
        if e["type"] == "delivery_planned" || e["type"] == "delivery_attempted" {
            let d = &e["delivery"];
            if d["message"] == id {
                out.insert(d["target"].as_str().unwrap().to_string(), d.clone());
            }
        }
    }
    out
}

/// The invocation of a flight, from the event that created it.
async fn invocation_of(env: &Env, flight: &str) -> Value {
    events(env)
        .await
        .into_iter()
        .find(|e| e["type"] == "invocation_created" && e["flight"]["id"] == flight)
        .map(|e| e["invocation"].clone())
        .unwrap_or_else(|| panic!("no invocation for {flight}"))
}

/// The flights of agent `agent`, oldest first.
async fn flights_of(env: &Env, agent: &str) -> Vec<Value> {
    let (code, list) = env
        .relay
        .http()
        .get(&format!("/v1/flights?agent={agent}"))
        .await;
    assert_eq!(code, 200, "{list}");
    list.as_array().unwrap().clone()
}

/// Waits for agent `agent`'s only flight to appear, and returns it.
async fn only_flight_of(env: &Env, agent: &str) -> Value {
    wait_until(
        format!("a flight of {agent}"),
        Duration::from_secs(120),
        || async {
            let list = flights_of(env, agent).await;
            assert!(
                list.len() <= 1,
                "{agent} has more than one flight: {list:?}"
            );
            list.into_iter().next()
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn each_mentioned_agent_answers_under_the_message() {
    let env = codex_and_claude(&[("what is the answer", "forty-two")]).await;

    let (msg, said) = send_text(
        &env,
        &["@codex-1 @claude-1 what is the answer? (@codex-1, you too)"],
    );
    assert_eq!(said.len(), 2, "{said:?}");
    let f_codex = asked_in(&said[0], "codex-1");
    let f_claude = asked_in(&said[1], "claude-1");

    let mut replies = BTreeMap::new();
    for (agent, id) in [("codex-1", &f_codex), ("claude-1", &f_claude)] {
        let f = completed(&env, id).await;
        assert_eq!(f["agent"], agent);
        assert_eq!(f["conversation"], "channel.shared");
        assert_eq!(f["parent_flight"], Value::Null);
        assert_eq!(f["output"], "forty-two");
        let inv = invocation_of(&env, id).await;
        assert_eq!(
            (
                &inv["action"],
                &inv["requester"],
                &inv["request_message"],
                &inv["depth"]
            ),
            (
                &Value::from("consult"),
                &Value::from("operator"),
                &Value::from(msg.as_str()),
                &Value::from(0)
            )
        );
        replies.insert(agent, f["reply_message"].as_str().unwrap().to_string());
    }
    // The agents got the message with who said it and where.
    let task = env
        .mock
        .requests()
        .iter()
        .filter_map(RecordedRequest::last_user_text)
        .find(|t| t.contains("what is the answer"))
        .unwrap();
    assert!(
        task.starts_with(&format!(
            "operator mentioned you in conversation channel.shared (message {msg})"
        )),
        "{task}"
    );

    // The conversation: the message (no copy of it as a task), then an answer from
    // each agent under it.
    let all = messages(&env);
    assert_eq!(all.len(), 3, "{all:?}");
    assert_eq!(all[0]["id"], msg.as_str());
    for (agent, reply) in &replies {
        let m = message(&all, reply);
        assert_eq!(
            (&m["author"], &m["reply_to"], &m["body"]),
            (
                &Value::from(*agent),
                &Value::from(msg.as_str()),
                &Value::from("forty-two")
            )
        );
    }
    // The deliveries the mentions planned were made when the turns ran.
    let delivered = deliveries_of(&env, &msg).await;
    assert_eq!(
        delivered.keys().map(String::as_str).collect::<Vec<_>>(),
        vec!["claude-1", "codex-1"]
    );
    for d in delivered.values() {
        assert_eq!(
            (&d["reason"], &d["state"]),
            (&Value::from("mention"), &Value::from("delivered")),
            "{d}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_answer_that_mentions_another_agent_consults_it_as_a_child() {
    let env = codex_and_claude(&[
        ("ask your colleague", "@claude-1 what do you think?"),
        ("what do you think", "agreed"),
    ])
    .await;

    let (msg, parent, child) = codex_then_claude(&env, "@codex-1 ask your colleague").await;
    let msg = msg.as_str();
    let asked = parent["reply_message"].as_str().unwrap();
    let child_id = child["id"].as_str().unwrap();
    assert_eq!(child["parent_flight"], parent["id"]);
    let inv = invocation_of(&env, child_id).await;
    assert_eq!(
        (&inv["requester"], &inv["request_message"], &inv["depth"]),
        (
            &Value::from("codex-1"),
            &Value::from(asked),
            &Value::from(1)
        )
    );

    let all = messages(&env);
    let question = message(&all, asked);
    assert_eq!(
        (
            &question["author"],
            &question["reply_to"],
            &question["body"]
        ),
        (
            &Value::from("codex-1"),
            &Value::from(msg),
            &Value::from("@claude-1 what do you think?")
        )
    );
    let answer = message(&all, child["reply_message"].as_str().unwrap());
    assert_eq!(
        (&answer["author"], &answer["reply_to"], &answer["body"]),
        (
            &Value::from("claude-1"),
            &Value::from(asked),
            &Value::from("agreed")
        )
    );
    assert_eq!(all.len(), 3, "{all:?}");
    assert_eq!(
        deliveries_of(&env, asked).await["claude-1"]["state"],
        "delivered"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_mention_loop_is_stopped_by_the_cycle_rule_and_no_post_fails() {
    let env = codex_and_claude(&[
        ("start the loop", "@claude-1 your move"),
        ("your move", "@codex-1 back to you"),
    ])
    .await;

    let (_, _, child) = codex_then_claude(&env, "@codex-1 start the loop").await;
    let back = child["reply_message"].as_str().unwrap();

    // claude-1's answer stands, and Relay answers it with why codex-1 was not asked.
    let refusal = wait_until(
        "Relay's answer to the refused mention",
        Duration::from_secs(30),
        || async {
            messages(&env)
                .into_iter()
                .find(|m| m["author"] == "relay" && m["reply_to"] == back)
        },
    )
    .await;
    assert_eq!(refusal["class"], "system");
    assert_eq!(
        refusal["body"],
        "codex-1 was not consulted: cycle: agent \"codex-1\" is already working on an ancestor flight"
    );
    let d = &deliveries_of(&env, back).await["codex-1"];
    assert_eq!(d["state"], "failed", "{d}");
    assert_eq!(d["attempts"][0]["error"], refusal["body"]);
    // Nothing else started: one flight each, both completed.
    let (_, flights) = env.relay.http().get("/v1/flights").await;
    let flights = flights.as_array().unwrap();
    assert_eq!(flights.len(), 2, "{flights:?}");
    assert!(
        flights.iter().all(|f| state(f) == "completed"),
        "{flights:?}"
    );

    // What an agent posts from a flight (`meta.flight`) continues that flight's chain, so
    // only the flight it is running may be named: claude-1's has ended, and a post
    // naming it (to mention codex-1 outside the cycle rule) is refused, saying why.
    let body = serde_json::json!({
        "conversation": "channel.shared",
        "author": "claude-1",
        "body": "@codex-1 one more thing",
        "meta": {"flight": child["id"]},
    });
    let (code, posted) = env.relay.http().post("/v1/messages", &body).await;
    assert_eq!(code, 400, "{posted}");
    assert!(
        posted["error"]["message"].as_str().unwrap().ends_with(
            "only to the flight it is running, and flight \"{}\" is completed"
                .replace("{}", child["id"].as_str().unwrap())
                .as_str()
        ),
        "{posted}"
    );
    let (_, flights) = env.relay.http().get("/v1/flights").await;
    assert_eq!(flights.as_array().unwrap().len(), 2, "{flights}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_mention_of_oneself_or_of_an_unknown_name_starts_nothing() {
    let env = Env::start().await;
    env.add_agent("codex-1", &[]);
    for (author, text, said, skipped, unknown) in [
        (
            "operator",
            "@nobody @operator are you there?",
            vec![
                "@operator not asked: it wrote the message",
                "@nobody is not an agent (relay agent list)",
            ],
            serde_json::json!([{"name": "operator", "reason": "author"}]),
            serde_json::json!(["nobody"]),
        ),
        (
            "codex-1",
            "@codex-1 a note to self",
            vec!["@codex-1 not asked: it wrote the message"],
            serde_json::json!([{"name": "codex-1", "reason": "author"}]),
            Value::Null,
        ),
    ] {
        let (_, lines) = send_text(&env, &["--as", author, text]);
        assert_eq!(lines, said);
        let posted = send(&env, author, text);
        assert_eq!(posted["flights"], serde_json::json!([]), "{posted}");
        assert!(posted.get("refused").is_none(), "{posted}");
        assert_eq!(posted["skipped"], skipped, "{posted}");
        assert_eq!(
            posted.get("unknown").cloned().unwrap_or(Value::Null),
            unknown
        );
    }
    let (_, flights) = env.relay.http().get("/v1/flights").await;
    assert_eq!(flights, serde_json::json!([]));
    let planned: Vec<Value> = events(&env)
        .await
        .into_iter()
        .filter(|e| e["type"] == "delivery_planned" || e["type"] == "invocation_created")
        .collect();
    assert_eq!(planned, Vec::<Value>::new());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_consult_still_queued_at_a_kill_9_runs_after_the_restart() {
    let mut env = Env::start().await;
    env.mock
        .set_handler(answers(&[("after the hang", "answered after the restart")]));
    env.add_agent("codex-1", &[]);
    // The agent is busy: the consult waits in its queue.
    let busy = env.ask_no_wait("codex-1", "hang here");
    env.wait_flight(&busy, 60, |f| state(f) == "running").await;
    let (msg, queued) = consult_one(&env, "codex-1", "@codex-1 after the hang");
    assert_eq!(state(&env.flight(&queued).await), "queued");

    env.relay.kill9();
    env.relay.restart().unwrap();
    let f = completed(&env, &queued).await;
    assert_eq!(f["output"], "answered after the restart");
    let reply = message(&messages(&env), f["reply_message"].as_str().unwrap()).clone();
    assert_eq!(reply["reply_to"], msg.as_str());
    assert_eq!(
        deliveries_of(&env, &msg).await["codex-1"]["state"],
        "delivered"
    );
    assert_eq!(state(&env.flight(&busy).await), "failed");
}

#[tokio::test(flavor = "multi_thread")]
async fn what_an_agent_sends_from_its_shell_consults_within_its_flight() {
    // The default script: `exec:` runs the command with the agent's bash tool and
    // answers with its output; anything else is echoed as `ok: ...`.
    let env = Env::start().await;
    env.add_pi("p1", &[]);
    env.add_pi("p2", &[]);
    env.add_claude("cl-1", &[]);

    // p1's shell runs `relay send`: the message is p1's, and cl-1's consult is a child
    // of the flight p1 is running. p1 reads the consult in the command's output.
    let parent = env.ask_no_wait("p1", "exec:relay send '@cl-1 hello from a shell'");
    let f = completed(&env, &parent).await;
    let child = only_flight_of(&env, "cl-1").await;
    let child_id = child["id"].as_str().unwrap();
    assert_eq!(
        f["output"].as_str().map(|o| o.contains(&format!(
            "asked cl-1 ({child_id}): relay watch --flight {child_id}"
        ))),
        Some(true),
        "{f}"
    );
    let child = completed(&env, child_id).await;
    assert_eq!(child["parent_flight"], parent.as_str());
    let inv = invocation_of(&env, child_id).await;
    assert_eq!(
        (&inv["requester"], &inv["depth"]),
        (&Value::from("p1"), &Value::from(1))
    );
    let all = messages(&env);
    let said = message(&all, inv["request_message"].as_str().unwrap());
    assert_eq!(
        (&said["author"], &said["body"], &said["meta"]["flight"]),
        (
            &Value::from("p1"),
            &Value::from("@cl-1 hello from a shell"),
            &Value::from(parent.as_str())
        )
    );
    let answer = message(&all, child["reply_message"].as_str().unwrap());
    assert_eq!(answer["reply_to"], said["id"]);

    // p1 asks p2, whose shell mentions p1 back: a cycle. p2's post stands, `relay send`
    // says why p1 was not consulted, and p1 reads it through p2's reply.
    let asks = env.ask_no_wait(
        "p1",
        "exec:relay ask p2 'exec:relay send \"@p1 back to you\"'",
    );
    let f = completed(&env, &asks).await;
    let out = f["output"].as_str().unwrap();
    assert!(
        out.contains("@p1 not asked: cycle: agent \"p1\" is already working on an ancestor flight"),
        "{f}"
    );
    assert_eq!(flights_of(&env, "p1").await.len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn send_says_whom_it_asked_and_which_names_are_not_agents() {
    let env = codex_and_claude(&[]).await;

    // `relay send`: the id on stdout, what the mentions did on stderr.
    let (msg, said) = send_text(&env, &["hello @codex-1 @nobody, mail a@b.c"]);
    assert_eq!(said.len(), 2, "{said:?}");
    let flight = asked_in(&said[0], "codex-1");
    assert_eq!(said[1], "@nobody is not an agent (relay agent list)");
    let f = completed(&env, &flight).await;
    assert_eq!(invocation_of(&env, &flight).await["request_message"], msg);
    assert_eq!(f["agent"], "codex-1");

    // Over HTTP: the answer carries the consult, the unknown names and the mentions
    // the rules skipped (code, a quoted line, the author), each once.
    let body = serde_json::json!({
        "conversation": "channel.shared",
        "author": "operator",
        "body": "@claude-1: see `@codex-1`, @ghost and @ghost.\n> @codex-1 said so\n@operator\n```\n@Override @ghost2\n```",
    });
    let (code, posted) = env.relay.http().post("/v1/messages", &body).await;
    assert_eq!(code, 200, "{posted}");
    let flights = started(&posted);
    assert_eq!(
        flights.iter().map(|(a, _)| a.as_str()).collect::<Vec<_>>(),
        vec!["claude-1"],
        "{posted}"
    );
    assert_eq!(posted["unknown"], serde_json::json!(["ghost"]), "{posted}");
    // codex-1 is in code first and on a quoted line then: the quote is the reason.
    assert_eq!(
        posted["skipped"],
        serde_json::json!([
            {"name": "codex-1", "reason": "quote"},
            {"name": "operator", "reason": "author"},
        ]),
        "{posted}"
    );
    assert_eq!(
        posted["message"]["mentions"],
        serde_json::json!(["claude-1", "ghost", "operator"])
    );
    completed(&env, &flights[0].1).await;
    // Nothing but the two consults ran.
    let (_, all) = env.relay.http().get("/v1/flights").await;
    assert_eq!(all.as_array().unwrap().len(), 2, "{all}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reply_repeating_the_question_asks_only_whom_it_addresses() {
    // Both agents answer the question by repeating it first (as models do), and address
    // codex-1 on a line of their own; asked to measure, they just answer.
    let env = codex_and_claude(&[
        ("please measure it", "measured: 3 ms"),
        (
            "which is faster",
            "@codex-1 @claude-1 which is faster?\n\nRust, by a little.\n> @claude-1 asked too\n@codex-1 please measure it.",
        ),
    ])
    .await;
    let posted = send(&env, "operator", "@codex-1 @claude-1 which is faster?");
    let msg = posted["message"]["id"].as_str().unwrap().to_string();
    let asked = started(&posted);
    assert_eq!(asked.len(), 2, "{posted}");
    // A flight's reply and the consults it starts are one commit: once both flights
    // completed, every consult their replies start exists.
    let mut replies = BTreeMap::new();
    for (agent, id) in &asked {
        let f = completed(&env, id).await;
        replies.insert(
            agent.clone(),
            f["reply_message"].as_str().unwrap().to_string(),
        );
    }
    // codex-1's reply repeats both names and addresses itself: nobody is asked.
    assert_eq!(
        deliveries_of(&env, &replies["codex-1"]).await,
        BTreeMap::new()
    );
    // claude-1's reply repeats the question and quotes it, which asks nobody again, but
    // addresses codex-1 on a line of its own: that one consult, a child of its flight.
    let from_claude = deliveries_of(&env, &replies["claude-1"]).await;
    assert_eq!(
        from_claude.keys().map(String::as_str).collect::<Vec<_>>(),
        vec!["codex-1"]
    );
    let codex = flights_of(&env, "codex-1").await;
    let claude = flights_of(&env, "claude-1").await;
    assert_eq!((codex.len(), claude.len()), (2, 1), "{codex:?} {claude:?}");
    let child = codex
        .iter()
        .find(|f| f["id"] != asked[0].1.as_str())
        .unwrap();
    let child_id = child["id"].as_str().unwrap();
    assert_eq!(child["parent_flight"], asked[1].1.as_str());
    assert_eq!(
        invocation_of(&env, child_id).await["request_message"],
        replies["claude-1"].as_str()
    );
    let child = completed(&env, child_id).await;
    assert_eq!(child["output"], "measured: 3 ms");
    // Nothing more: three flights, all completed; the question's deliveries only.
    let (_, all) = env.relay.http().get("/v1/flights").await;
    let all = all.as_array().unwrap();
    assert_eq!(all.len(), 3, "{all:?}");
    assert!(all.iter().all(|f| state(f) == "completed"), "{all:?}");
    assert_eq!(deliveries_of(&env, &msg).await.len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_posts_each_get_their_own_answer() {
    // The agents' model never answers: the consults stay queued or running, and each
    // answer is checked against the flights the broker holds.
    let env = Env::start().await;
    env.mock.set_handler(|_: &RecordedRequest| Reply::hang());
    env.add_agent("codex-1", &[]);
    env.add_claude("claude-1", &[]);
    const POSTS: usize = 24;
    let http = env.relay.http();
    let posts = (0..POSTS).map(|i| {
        let http = http.clone();
        async move {
            let agent = if i % 2 == 0 { "codex-1" } else { "claude-1" };
            let other = if i % 2 == 0 { "claude-1" } else { "codex-1" };
            let body = format!("post {i}: @{agent} and @ghost-{i}, not `@{other}`");
            let (code, posted) = http
                .post(
                    "/v1/messages",
                    &serde_json::json!({
                        "conversation": "channel.shared",
                        "author": format!("client-{i}"),
                        "body": body,
                    }),
                )
                .await;
            assert_eq!(code, 200, "{posted}");
            (i, agent, other, body, posted)
        }
    });
    let answers = futures::future::join_all(posts).await;
    let mut flight_ids = Vec::new();
    for (i, agent, other, body, posted) in &answers {
        assert_eq!(posted["message"]["body"], body.as_str());
        let flights = started(posted);
        assert_eq!(
            flights.iter().map(|(a, _)| a.as_str()).collect::<Vec<_>>(),
            vec![*agent],
            "{posted}"
        );
        assert_eq!(posted["unknown"], serde_json::json!([format!("ghost-{i}")]));
        assert_eq!(
            posted["skipped"],
            serde_json::json!([{"name": other, "reason": "code"}])
        );
        let inv = invocation_of(&env, &flights[0].1).await;
        assert_eq!(
            (&inv["requester"], &inv["target"], &inv["request_message"]),
            (
                &Value::from(format!("client-{i}")),
                &Value::from(*agent),
                &posted["message"]["id"]
            ),
            "{inv}"
        );
        flight_ids.push(flights[0].1.clone());
    }
    // The broker holds exactly those flights, one per post.
    let (_, all) = env.relay.http().get("/v1/flights").await;
    let mut held: Vec<String> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap().to_string())
        .collect();
    held.sort();
    flight_ids.sort();
    flight_ids.dedup();
    assert_eq!(flight_ids.len(), POSTS);
    assert_eq!(held, flight_ids);
}
