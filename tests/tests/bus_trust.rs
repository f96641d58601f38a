//! The bus trusts no stranger: on an open NATS (no credentials, no request token) a client
//! cannot decide, steer, interrupt, or speak as the operator or an agent; on a trusted
//! one its decisions are recorded as the bus's, never as the operator's; an agent's
//! token does not learn the bus address; and a client that forges flight updates in the
//! stream cannot make the broker's own updates be dropped as duplicates. A real
//! nats-server, a real `relay up`, the real pinned codex and the mock model.
//!
//! Over 600 lines: each way a stranger on the bus could pass for someone, one test each.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use async_nats::HeaderMap;
use prost::Message as _;
use relay_broker::seal::AgentTokens;
use relay_protocol::pb;
use relay_tests::agents::{state, Env};
use relay_tests::nats::{json_request as request, NatsServer};
use relay_tests::wait_until;
use serde_json::{json, Value};

async fn env_with_nats(nats: &NatsServer, extra: &[&str]) -> Env {
    let url = nats.url();
    let mut args = vec!["--nats", url.as_str()];
    args.extend_from_slice(extra);
    let env = Env::start_with(&args).await;
    env.add_agent("codex-1", &[]);
    env
}

/// A flight of codex-1 waiting for its command's approval, and the approval's id.
async fn waiting_flight(env: &Env, text: &str) -> (String, String) {
    let id = env.ask_no_wait("codex-1", &format!("exec: echo {text}"));
    env.wait_flight(&id, 60, |f| state(f) == "waiting").await;
    let approval = env.approval_of(&id)["id"].as_str().unwrap().to_string();
    (id, approval)
}

/// Asserts `answer` is the open bus's refusal: `unauthorized`, naming what to set.
fn assert_open_bus_refusal(what: &str, answer: &Value) {
    assert_eq!(answer["error"]["code"], "unauthorized", "{what}: {answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("--nats-request-token-file") && message.contains("--nats-creds"),
        "{what}: the refusal names the flags to set: {message}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn on_an_open_bus_a_stranger_cannot_decide_steer_or_speak_for_anyone() {
    let nats = NatsServer::start().unwrap();
    let env = env_with_nats(&nats, &[]).await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    let (id, approval) = waiting_flight(&env, "approved-by-a-stranger").await;

    // The finding: any local process approved as the operator. Now every form of it,
    // JSON and protobuf, is refused, and so is each command that acts on someone's turn
    // or speaks as the operator or an agent.
    let answer = request(
        &client,
        "relay.v1.cmd.approve",
        None,
        json!({"approval": approval, "decision": "accept", "decided_by": "operator"}),
    )
    .await;
    assert_open_bus_refusal("approve as operator", &answer);
    let reply = client
        .request_with_headers(
            "relay.v1.cmd.approve",
            {
                let mut h = HeaderMap::new();
                h.insert("Relay-Type", "relay.v1.ApproveRequest");
                h
            },
            pb::ApproveRequest {
                approval: approval.clone(),
                decision: pb::ApprovalDecision::Accept as i32,
                decided_by: String::new(),
            }
            .encode_to_vec()
            .into(),
        )
        .await
        .unwrap();
    match pb::CommandReply::decode(reply.payload.as_ref())
        .unwrap()
        .result
    {
        Some(pb::command_reply::Result::Error(e)) => assert_eq!(e.code, "unauthorized", "{e:?}"),
        other => panic!("a protobuf approve on an open bus was not refused: {other:?}"),
    }
    for (what, subject, body) in [
        (
            "steer",
            "relay.v1.cmd.steer",
            json!({"flight": id, "text": "also rm -rf"}),
        ),
        ("interrupt", "relay.v1.cmd.interrupt", json!({"flight": id})),
        ("revert", "relay.v1.cmd.revert", json!({"flight": id})),
        (
            "post as the operator",
            "relay.v1.cmd.post",
            json!({"conversation": "channel.shared", "author": "operator", "body": "forged"}),
        ),
        (
            "post as an agent",
            "relay.v1.cmd.post",
            json!({"conversation": "channel.shared", "author": "codex-1", "body": "forged"}),
        ),
        (
            "invoke as the operator",
            "relay.v1.invoke.codex-1",
            json!({"task": "forged", "requester": "operator"}),
        ),
        (
            "invoke within the waiting flight",
            "relay.v1.invoke.codex-1",
            json!({"task": "forged", "requester": "ci-bot", "parent_flight": id}),
        ),
        (
            "post as from the waiting flight",
            "relay.v1.cmd.post",
            json!({"conversation": "channel.shared", "author": "ci-bot", "body": "forged", "meta": {"flight": id}}),
        ),
    ] {
        let answer = request(&client, subject, None, body).await;
        assert_open_bus_refusal(what, &answer);
    }

    // Many strangers at once: each refused, none let through by a race.
    let mut tasks = Vec::new();
    for i in 0..32 {
        let client = client.clone();
        let approval = approval.clone();
        tasks.push(tokio::spawn(async move {
            let (subject, body) = if i % 2 == 0 {
                (
                    "relay.v1.cmd.approve",
                    json!({"approval": approval, "decision": "accept", "decided_by": "operator"}),
                )
            } else {
                (
                    "relay.v1.cmd.post",
                    json!({"conversation": "channel.shared", "author": "operator", "body": format!("forged {i}")}),
                )
            };
            (i, request(&client, subject, None, body).await)
        }));
    }
    for task in tasks {
        let (i, answer) = task.await.unwrap();
        assert_open_bus_refusal(&format!("client {i}"), &answer);
    }

    // Nothing happened: the approval waits, nothing was posted as anyone.
    assert_eq!(env.approval_of(&id)["state"], "pending");
    assert_eq!(state(&env.flight(&id).await), "waiting");
    let shared = env.relay.cli_json(&["read", "-n", "200", "--json"]);
    assert!(
        !shared
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["body"].as_str().unwrap_or("").starts_with("forged")),
        "{shared}"
    );

    // The README's open-bus setup still works for what a stranger may do as itself:
    // post and ask under its own name, and follow.
    let posted = request(
        &client,
        "relay.v1.cmd.post",
        None,
        json!({"conversation": "channel.shared", "author": "ci-bot", "body": "hello from the bus"}),
    )
    .await;
    assert_eq!(posted["message"]["author"], "ci-bot", "{posted}");
    // A protobuf ask that names no requester is the bus's, not the operator's (proto3's
    // empty string used to read as `operator`).
    let reply = client
        .request_with_headers(
            "relay.v1.invoke.codex-1",
            {
                let mut h = HeaderMap::new();
                h.insert("Relay-Type", "relay.v1.InvokeRequest");
                h
            },
            pb::InvokeRequest {
                task: "hello from the bus".into(),
                ..Default::default()
            }
            .encode_to_vec()
            .into(),
        )
        .await
        .unwrap();
    let asked = match pb::InvokeReply::decode(reply.payload.as_ref())
        .unwrap()
        .result
    {
        Some(pb::invoke_reply::Result::Accepted(a)) => a.flight_id,
        other => panic!("a protobuf ask as the bus was refused: {other:?}"),
    };
    // A direct ask's conversation is `direct.<agent>.<requester>`.
    assert_eq!(
        env.flight(&asked).await["conversation"],
        "direct.codex-1.nats"
    );

    // The operator decides, over HTTP, as before.
    env.relay.cli_ok(&["approve", &approval, "decline"]);
    env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    env.wait_flight(&asked, 60, |f| state(f) == "completed")
        .await;
}

/// A protobuf request on `subject` of type `ty` and its reply's bytes.
async fn request_pb(
    client: &async_nats::Client,
    subject: &str,
    ty: &str,
    body: Vec<u8>,
) -> Vec<u8> {
    let mut h = HeaderMap::new();
    h.insert("Relay-Type", ty);
    client
        .request_with_headers(subject.to_string(), h, body.into())
        .await
        .unwrap_or_else(|e| panic!("{subject}: no reply: {e}"))
        .payload
        .to_vec()
}

#[tokio::test(flavor = "multi_thread")]
async fn on_an_open_bus_no_one_posts_as_relay_the_operator_or_a_look_alike() {
    let nats = NatsServer::start().unwrap();
    let env = env_with_nats(&nats, &[]).await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    let post = |author: &str, class: &str| json!({"conversation": "channel.shared", "author": author, "class": class, "body": "forged"});
    for (what, body) in [
        ("relay's system message", post("relay", "system")),
        ("relay", post("relay", "agent")),
        (
            "a system message under one's own name",
            post("ci-bot", "system"),
        ),
        ("a status message", post("ci-bot", "status")),
        ("Operator", post("Operator", "agent")),
        (
            "operator with a zero-width space",
            post("operator\u{200B}", "agent"),
        ),
        (
            "operator with a Cyrillic o",
            post("\u{43e}perator", "agent"),
        ),
        ("an agent in capitals", post("CODEX-1", "agent")),
        ("an agent behind a space", post(" codex-1", "agent")),
        ("the bus in capitals", post("NATS", "agent")),
    ] {
        let answer = request(&client, "relay.v1.cmd.post", None, body).await;
        assert_open_bus_refusal(what, &answer);
    }
    for requester in ["Operator", "relay", "CODEX-1", "operator\u{200B}"] {
        let answer = request(
            &client,
            "relay.v1.invoke.codex-1",
            None,
            json!({"task": "forged", "requester": requester}),
        )
        .await;
        assert_open_bus_refusal(&format!("ask as {requester:?}"), &answer);
    }
    // The same in protobuf.
    for author in ["operator", "codex-1", "relay"] {
        let reply = request_pb(
            &client,
            "relay.v1.cmd.post",
            "relay.v1.PostMessage",
            pb::PostMessage {
                conversation: "channel.shared".into(),
                author: author.into(),
                body: "forged".into(),
                ..Default::default()
            }
            .encode_to_vec(),
        )
        .await;
        match pb::CommandReply::decode(reply.as_ref()).unwrap().result {
            Some(pb::command_reply::Result::Error(e)) => {
                assert_eq!(e.code, "unauthorized", "{author}: {e:?}")
            }
            other => panic!("a protobuf post as {author} was not refused: {other:?}"),
        }
    }
    for requester in ["operator", "codex-1"] {
        let reply = request_pb(
            &client,
            "relay.v1.invoke.codex-1",
            "relay.v1.InvokeRequest",
            pb::InvokeRequest {
                task: "forged".into(),
                requester: requester.into(),
                ..Default::default()
            }
            .encode_to_vec(),
        )
        .await;
        match pb::InvokeReply::decode(reply.as_ref()).unwrap().result {
            Some(pb::invoke_reply::Result::Error(e)) => {
                assert_eq!(e.code, "unauthorized", "{requester}: {e:?}")
            }
            other => panic!("a protobuf ask as {requester} was not refused: {other:?}"),
        }
    }
    let shared = env.relay.cli_json(&["read", "-n", "200", "--json"]);
    assert!(
        !shared
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["body"] == "forged"),
        "{shared}"
    );

    // A post that names no author is the bus's (`nats`), in JSON and in protobuf.
    let posted = request(
        &client,
        "relay.v1.cmd.post",
        None,
        json!({"conversation": "channel.shared", "body": "unnamed"}),
    )
    .await;
    assert_eq!(posted["message"]["author"], "nats", "{posted}");
    let reply = request_pb(
        &client,
        "relay.v1.cmd.post",
        "relay.v1.PostMessage",
        pb::PostMessage {
            conversation: "channel.shared".into(),
            body: "unnamed".into(),
            ..Default::default()
        }
        .encode_to_vec(),
    )
    .await;
    match pb::CommandReply::decode(reply.as_ref()).unwrap().result {
        Some(pb::command_reply::Result::Message(m)) => assert_eq!(m.author, "nats", "{m:?}"),
        other => panic!("an unnamed protobuf post was refused: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_decision_over_a_trusted_bus_is_the_buss_never_the_operators() {
    let nats = NatsServer::start().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let token_file = tmp.path().join("request-token");
    std::fs::write(&token_file, "req-s3cret").unwrap();
    let env = env_with_nats(
        &nats,
        &["--nats-request-token-file", token_file.to_str().unwrap()],
    )
    .await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    let token = Some("req-s3cret");
    let (id, approval) = waiting_flight(&env, "approved-over-the-bus").await;

    // Relay's own identities are refused on every surface, from the one list: over the
    // bus, over HTTP and from the CLI.
    let path = format!("/v1/approvals/{approval}");
    let http = env.relay.http();
    for claimed in [
        "claude:withdrawn",
        "pi:withdrawn",
        "tmux:withdrawn",
        "codex:withdrawn",
        "alice@dashboard",
        "alice@nats",
    ] {
        let answer = request(
            &client,
            "relay.v1.cmd.approve",
            token,
            json!({"approval": approval, "decision": "accept", "decided_by": claimed}),
        )
        .await;
        assert_eq!(
            answer["error"]["code"], "invalid_request",
            "bus {claimed}: {answer}"
        );
        let (code, body) = http
            .post(&path, &json!({"decision": "accept", "decided_by": claimed}))
            .await;
        assert_eq!(code, 400, "http {claimed}: {body}");
        let out = env
            .relay
            .cli(&["approve", &approval, "accept", "--as", claimed]);
        assert!(!out.status.success(), "cli {claimed}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("not allowed"), "cli {claimed}: {stderr}");
    }
    assert_eq!(env.approval_of(&id)["state"], "pending");

    // The bus may decide, but it is the bus that decided: the record never says
    // `operator`, whatever the request claims.
    let answer = request(
        &client,
        "relay.v1.cmd.approve",
        token,
        json!({"approval": approval, "decision": "accept", "decided_by": "operator"}),
    )
    .await;
    assert_eq!(
        answer["approval"]["decided_by"], "operator@nats",
        "{answer}"
    );
    env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    assert_eq!(env.approval_of(&id)["decided_by"], "operator@nats");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agents_token_does_not_learn_the_bus_address() {
    let nats = NatsServer::start().unwrap();
    let env = env_with_nats(&nats, &[]).await;
    let port = nats.port().to_string();
    let (code, operator) = env.relay.http().get("/v1/status").await;
    assert_eq!(code, 200, "{operator}");
    assert_eq!(operator["nats"]["state"], "connected", "{operator}");
    assert!(operator.to_string().contains(&port), "{operator}");

    let tokens = AgentTokens::new(env.relay.api.token.as_bytes());
    let agent = env.relay.http().with_token(Some(&tokens.token("codex-1")));
    let (code, seen) = agent.get("/v1/status").await;
    assert_eq!(code, 200, "{seen}");
    // It may know the bus is up, not where it is.
    assert_eq!(seen["nats"]["state"], "connected", "{seen}");
    // Not the port alone: a port's digits may be in any number (a timestamp).
    let text = seen.to_string();
    assert!(
        !text.contains(&nats.url()) && !text.contains("127.0.0.1:") && !text.contains("nats://"),
        "an agent's token reads the bus address: {seen}"
    );
}

/// The stream's copy of each update of `flight`, by per-flight seq: whether it is the
/// broker's (not one of `forged`'s texts) for every seq the log has.
async fn stream_updates(
    js: &async_nats::jetstream::Context,
    subject: &str,
) -> Vec<(u64, pb::FlightUpdate)> {
    let mut stream = js.get_stream("RELAY_FLIGHTS").await.unwrap();
    let info = stream.info().await.unwrap().state.clone();
    let mut out = Vec::new();
    for seq in info.first_sequence..=info.last_sequence {
        let Ok(m) = stream.get_raw_message(seq).await else {
            continue;
        };
        if m.subject.as_str() == subject {
            out.push((seq, pb::FlightUpdate::decode(m.payload.as_ref()).unwrap()));
        }
    }
    out
}

fn is_forged(u: &pb::FlightUpdate) -> bool {
    matches!(&u.change, Some(pb::flight_update::Change::Delta(d)) if d.text.starts_with("FORGED"))
}

/// A forged update of `flight` at per-flight `seq`, published into the stream under `id`.
async fn forge(
    js: &async_nats::jetstream::Context,
    subject: &str,
    flight: &str,
    seq: u64,
    id: &str,
) {
    let mut h = HeaderMap::new();
    h.insert("Relay-Type", "relay.v1.FlightUpdate");
    h.insert("Nats-Msg-Id", id);
    let forged = pb::FlightUpdate {
        flight: flight.into(),
        agent: "codex-1".into(),
        seq,
        change: Some(pb::flight_update::Change::Delta(pb::Delta {
            text: format!("FORGED {seq}"),
        })),
        ..Default::default()
    };
    let ack = js
        .publish_with_headers(subject.to_string(), h, forged.encode_to_vec().into())
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(
        !ack.duplicate,
        "the forgery at {seq} was taken as a duplicate"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forged_update_in_the_stream_does_not_displace_the_brokers() {
    let nats = NatsServer::start().unwrap();
    let env = env_with_nats(&nats, &[]).await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(client.clone());
    let (id, approval) = waiting_flight(&env, "forged-in-the-stream").await;
    let subject = format!("relay.v1.flight.codex-1.{id}");
    let waiting = env.updates(&id).await.len() as u64;
    // The broker has published the flight up to its wait.
    wait_until(
        "the broker's updates in the stream",
        Duration::from_secs(10),
        || async {
            let got = stream_updates(&js, &subject).await;
            (got.len() as u64 >= waiting).then_some(()).ok_or(got.len())
        },
    )
    .await;

    // A stranger guesses the ids of the next updates and publishes them first, several
    // at once.
    let mut forgers = Vec::new();
    for seq in waiting + 1..=waiting + 3 {
        let (js, subject, id) = (js.clone(), subject.clone(), id.clone());
        forgers.push(tokio::spawn(async move {
            forge(&js, &subject, &id, seq, &format!("{id}:{seq}")).await
        }));
    }
    for f in forgers {
        f.await.unwrap();
    }
    env.relay.cli_ok(&["approve", &approval, "accept"]);
    env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    let logged = env.updates(&id).await.len() as u64;
    assert!(
        logged >= waiting + 3,
        "the turn went on for {logged} updates"
    );

    // Every update the log has is in the stream as the broker published it.
    let got = wait_until(
        "every update of the log in the stream, the broker's own",
        Duration::from_secs(15),
        || async {
            let got = stream_updates(&js, &subject).await;
            let genuine: std::collections::BTreeSet<u64> = got
                .iter()
                .filter(|(_, u)| !is_forged(u))
                .map(|(_, u)| u.seq)
                .collect();
            if (1..=logged).all(|s| genuine.contains(&s)) {
                Ok(got)
            } else {
                Err(format!(
                    "the stream has the broker's {genuine:?} of 1..={logged}"
                ))
            }
        },
    )
    .await;
    // The forgeries are there too: the stream is as open as the bus (the manual says
    // what it can be trusted for), but none took the place of a real update.
    assert_eq!(got.iter().filter(|(_, u)| is_forged(u)).count(), 3);
}

/// The alarm lines in the broker's log.
fn alarms(env: &Env) -> usize {
    env.relay
        .log_text()
        .lines()
        .filter(|l| {
            l.contains("ALARM: the flight stream holds a message the broker never published")
        })
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_duplicate_the_broker_never_published_raises_the_alarm_and_a_re_publish_does_not() {
    let nats = NatsServer::start().unwrap();
    let mut env = env_with_nats(&nats, &[]).await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(client.clone());
    let (id, approval) = waiting_flight(&env, "forged-with-the-key").await;
    let subject = format!("relay.v1.flight.codex-1.{id}");
    let waiting = env.updates(&id).await.len() as u64;

    // Someone who has the bus key makes the id of the next update and publishes first:
    // the stream drops the broker's update, and the broker says so.
    let key = relay_broker::files::read_key(&env.relay.data_dir.join("bus.key"))
        .unwrap()
        .unwrap();
    let forged_id = relay_broker::seal::BusKey::new(key)
        .stream_ids()
        .flight_update(&id, waiting + 1);
    forge(&js, &subject, &id, waiting + 1, &forged_id).await;
    let forged_at = std::time::Instant::now();
    assert_eq!(alarms(&env), 0);
    env.relay.cli_ok(&["approve", &approval, "accept"]);
    env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    wait_until(
        "the alarm in the broker's log",
        Duration::from_secs(15),
        || async { (alarms(&env) == 1).then_some(()).ok_or(alarms(&env)) },
    )
    .await;
    let log = env.relay.log_text();
    assert!(log.contains(&forged_id), "the alarm names the id");

    // A re-publish of what the broker did publish is no alarm: started again from the
    // beginning of the log, it re-publishes every update (all duplicates), and only the
    // forged id alarms again.
    env.relay.terminate().unwrap();
    std::fs::write(env.relay.data_dir.join("nats.cursor"), "0").unwrap();
    env.relay.restart().unwrap();
    let last = env.relay.http().get("/v1/status").await.1["last_seq"]
        .as_u64()
        .unwrap();
    wait_until(
        "the publisher to re-publish and settle the whole log",
        Duration::from_secs(30),
        || async {
            let cursor = std::fs::read_to_string(env.relay.data_dir.join("nats.cursor"))
                .ok()
                .and_then(|c| c.trim().parse::<u64>().ok())
                .unwrap_or(0);
            (cursor >= last).then_some(()).ok_or(cursor)
        },
    )
    .await;
    // The second alarm needs the forged id still in the stream's duplicate window (2
    // minutes): on a machine so slow that the re-publish came later, the broker's update
    // is simply stored and only the first alarm was due.
    if forged_at.elapsed() < Duration::from_secs(100) {
        assert_eq!(alarms(&env), 2, "{}", env.relay.log_text());
    } else {
        assert!((1..=2).contains(&alarms(&env)), "{}", env.relay.log_text());
    }
}
