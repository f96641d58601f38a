//! The NATS bus end to end: a real nats-server (JetStream, random port), a real `relay up
//! --nats`, the real pinned codex and the mock model. The client side here knows only the
//! documented subjects and the `.proto` types (or JSON).
//!
//! Over 600 lines: the bus's end-to-end specification, one test per documented behaviour.
//! The server fixture lives in `relay_tests`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use async_nats::HeaderMap;
use futures::StreamExt;
use prost::Message as _;
use relay_protocol::pb;
use relay_tests::agents::{state, Env};
use relay_tests::nats::{Auth, NatsServer};
use relay_tests::{relay_bin, relay_cmd_with, wait_until, RelayProcess};
use serde_json::{json, Value};

const STATE_COMPLETED: i32 = pb::FlightState::Completed as i32;

async fn env_with_nats(nats: &NatsServer, extra: &[&str]) -> Env {
    let url = nats.url();
    let mut args = vec!["--nats", url.as_str()];
    args.extend_from_slice(extra);
    let env = Env::start_with(&args).await;
    env.add_agent("codex-1", &[]);
    env
}

/// The request token of [`trusted_env_with_nats`]'s broker ([`trusted`] requests).
const REQUEST_TOKEN: &str = "req-t0ken";

/// [`env_with_nats`] on a trusted bus (a request token), where a client may decide,
/// steer and interrupt: an open bus refuses them (`tests/tests/bus_trust.rs`).
async fn trusted_env_with_nats(nats: &NatsServer, extra: &[&str]) -> Env {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("request-token");
    std::fs::write(&file, REQUEST_TOKEN).unwrap();
    let mut args = vec!["--nats-request-token-file", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    // Read once at the start: the file may go with `tmp`.
    env_with_nats(nats, &args).await
}

fn pb_headers(type_name: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("Relay-Type", type_name);
    h
}

fn json_headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("Content-Type", "application/json");
    h
}

/// `h` with the request token of [`trusted_env_with_nats`].
fn trusted(mut h: HeaderMap) -> HeaderMap {
    h.insert("Relay-Token", REQUEST_TOKEN);
    h
}

/// Invokes `agent` with `task` over NATS (protobuf), as "pb-client": its acceptance.
async fn invoke_pb(client: &async_nats::Client, agent: &str, task: &str) -> pb::InvokeAccepted {
    let req = pb::InvokeRequest {
        task: task.into(),
        requester: "pb-client".into(),
        ..Default::default()
    };
    let reply = client
        .request_with_headers(
            format!("relay.v1.invoke.{agent}"),
            pb_headers("relay.v1.InvokeRequest"),
            req.encode_to_vec().into(),
        )
        .await
        .unwrap();
    let reply = pb::InvokeReply::decode(reply.payload.as_ref()).unwrap();
    let Some(pb::invoke_reply::Result::Accepted(acc)) = reply.result else {
        panic!("not accepted: {reply:?}")
    };
    acc
}

/// Collects updates of `flight` from a subscription until the terminal one.
async fn collect_pb(sub: &mut async_nats::Subscriber, flight: &str) -> Vec<pb::FlightUpdate> {
    let mut out = Vec::new();
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(60), sub.next())
            .await
            .expect("updates stopped")
            .expect("subscription ended");
        let h = msg.headers.as_ref().unwrap();
        assert_eq!(
            h.get("Relay-Type").unwrap().as_str(),
            "relay.v1.FlightUpdate"
        );
        let u = pb::FlightUpdate::decode(msg.payload.as_ref()).unwrap();
        if u.flight != flight {
            continue;
        }
        let terminal = matches!(&u.change, Some(pb::flight_update::Change::State(s)) if s.to >= STATE_COMPLETED);
        out.push(u);
        if terminal {
            return out;
        }
    }
}

/// The error of a reply, checking that it is the reply type its subject promises: an
/// `InvokeReply` from `relay.v1.invoke.*`, a `CommandReply` from `relay.v1.cmd.*`.
/// Posts `body` to channel.shared over NATS (JSON) and returns the answer.
async fn post_over_nats(client: &async_nats::Client, body: &str) -> Value {
    let reply = client
        .request_with_headers(
            "relay.v1.cmd.post",
            json_headers(),
            json!({"conversation": "channel.shared", "author": "a", "body": body})
                .to_string()
                .into(),
        )
        .await
        .unwrap();
    serde_json::from_slice(&reply.payload).unwrap()
}

fn reply_error(reply: &async_nats::Message, json: bool) -> pb::Error {
    let type_name = reply
        .headers
        .as_ref()
        .and_then(|h| h.get("Relay-Type"))
        .map(|v| v.as_str().to_string())
        .unwrap_or_default();
    if json {
        assert!(type_name.ends_with("+json"), "{type_name}");
        let v: Value = serde_json::from_slice(&reply.payload).unwrap();
        return pb::Error {
            code: v["error"]["code"].as_str().unwrap().into(),
            message: v["error"]["message"].as_str().unwrap().into(),
        };
    }
    match type_name.as_str() {
        "relay.v1.InvokeReply" => match pb::InvokeReply::decode(reply.payload.as_ref())
            .unwrap()
            .result
        {
            Some(pb::invoke_reply::Result::Error(e)) => e,
            other => panic!("not an error: {other:?}"),
        },
        "relay.v1.CommandReply" => match pb::CommandReply::decode(reply.payload.as_ref())
            .unwrap()
            .result
        {
            Some(pb::command_reply::Result::Error(e)) => e,
            other => panic!("not an error: {other:?}"),
        },
        other => panic!("unexpected reply type {other:?}"),
    }
}

fn deltas(updates: &[pb::FlightUpdate]) -> Vec<String> {
    updates
        .iter()
        .filter_map(|u| match &u.change {
            Some(pb::flight_update::Change::Delta(d)) => Some(d.text.clone()),
            _ => None,
        })
        .collect()
}

fn assert_gap_free(updates: &[pb::FlightUpdate]) {
    let seqs: Vec<u64> = updates.iter().map(|u| u.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_protobuf_client_invokes_and_follows_every_delta() {
    let nats = NatsServer::start().unwrap();
    let env = env_with_nats(&nats, &[]).await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    let mut updates = client.subscribe("relay.v1.flight.codex-1.*").await.unwrap();
    let mut convo = client.subscribe("relay.v1.conversation.>").await.unwrap();

    let acc = invoke_pb(&client, "codex-1", "slow: red green blue").await;
    let got = collect_pb(&mut updates, &acc.flight_id).await;
    assert_gap_free(&got);
    assert_eq!(deltas(&got), vec!["red ", "green ", "blue"]);
    let last = got.last().unwrap();
    let after = last.flight_after.as_ref().unwrap();
    assert_eq!(after.state, STATE_COMPLETED);
    assert_eq!(after.output.as_deref(), Some("red green blue"));

    // The request and the reply were published on the conversation's subject.
    let mut bodies = Vec::new();
    while bodies.len() < 2 {
        let m = tokio::time::timeout(Duration::from_secs(10), convo.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            m.subject.as_str(),
            "relay.v1.conversation.direct.codex-1.pb-client"
        );
        bodies.push(pb::Message::decode(m.payload.as_ref()).unwrap().body);
    }
    assert_eq!(bodies, vec!["slow: red green blue", "red green blue"]);

    // A client that joins late reads the whole flight from the JetStream stream.
    let js = async_nats::jetstream::new(client.clone());
    let stream = js.get_stream("RELAY_FLIGHTS").await.unwrap();
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
            filter_subject: format!("relay.v1.flight.codex-1.{}", acc.flight_id),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut msgs = consumer.messages().await.unwrap();
    let mut replayed = Vec::new();
    while replayed.len() < got.len() {
        let m = tokio::time::timeout(Duration::from_secs(10), msgs.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        replayed.push(pb::FlightUpdate::decode(m.payload.as_ref()).unwrap());
    }
    assert_eq!(replayed, got);
    let status = env.relay.cli_json(&["status", "--json"]);
    assert_eq!(status["nats"]["state"], "connected", "{status}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_json_client_invokes_and_follows_every_delta() {
    let nats = NatsServer::start().unwrap();
    let _env = env_with_nats(&nats, &[]).await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    let mut updates = client
        .subscribe("relay.v1.json.flight.codex-1.*")
        .await
        .unwrap();
    let reply = client
        .request_with_headers(
            "relay.v1.invoke.codex-1",
            json_headers(),
            json!({"task": "slow: one two three", "requester": "json-client"})
                .to_string()
                .into(),
        )
        .await
        .unwrap();
    let accepted: Value = serde_json::from_slice(&reply.payload).unwrap();
    let id = accepted["flight"]["id"].as_str().unwrap().to_string();
    let mut got: Vec<Value> = Vec::new();
    loop {
        let m = tokio::time::timeout(Duration::from_secs(60), updates.next())
            .await
            .unwrap()
            .unwrap();
        let v: Value = serde_json::from_slice(&m.payload).unwrap();
        if v["update"]["flight"] != id.as_str() {
            continue;
        }
        let done = v["update"]["kind"] == "state" && v["flight"]["state"] == "completed";
        got.push(v);
        if done {
            break;
        }
    }
    let seqs: Vec<u64> = got
        .iter()
        .map(|v| v["update"]["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    let text: Vec<&str> = got
        .iter()
        .filter(|v| v["update"]["kind"] == "delta")
        .map(|v| v["update"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, vec!["one ", "two ", "three"]);
    assert_eq!(got.last().unwrap()["flight"]["output"], "one two three");

    // A post's JSON answer says what its mentions did, as over HTTP.
    let posted = post_over_nats(&client, "see `@codex-1`, @ghost").await;
    assert_eq!(posted["flights"], json!([]), "{posted}");
    assert_eq!(posted["unknown"], json!(["ghost"]), "{posted}");
    assert_eq!(
        posted["skipped"],
        json!([{"name": "codex-1", "reason": "code"}]),
        "{posted}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_on_every_request_subject_gets_an_error_reply() {
    let nats = NatsServer::start().unwrap();
    let env = trusted_env_with_nats(&nats, &["--max-message-bytes", "1000"]).await;
    let pb_headers = |type_name: &str| trusted(pb_headers(type_name));
    let json_headers = || trusted(json_headers());
    let client = async_nats::connect(nats.url()).await.unwrap();
    let last_seq = || async {
        env.relay.http().get("/v1/status").await.1["last_seq"]
            .as_u64()
            .unwrap()
    };
    let seq0 = last_seq().await;
    let subjects = [
        ("relay.v1.invoke.codex-1", "relay.v1.InvokeRequest"),
        ("relay.v1.cmd.post", "relay.v1.PostMessage"),
        ("relay.v1.cmd.steer", "relay.v1.SteerRequest"),
        ("relay.v1.cmd.interrupt", "relay.v1.InterruptRequest"),
        ("relay.v1.cmd.approve", "relay.v1.ApproveRequest"),
    ];
    let error_of =
        |reply: &async_nats::Message, json: bool| -> pb::Error { reply_error(reply, json) };
    // (what, subject, headers, payload, error code, a JSON reply)
    type Case<'a> = (String, &'a str, HeaderMap, Vec<u8>, &'a str, bool);
    let mut cases: Vec<Case> = Vec::new();
    for (subject, type_name) in subjects {
        let per_subject: Vec<(&str, HeaderMap, Vec<u8>, &str, bool)> = vec![
            (
                "garbage bytes",
                pb_headers(type_name),
                vec![0xff, 0xfe, 0x07, 0x01],
                "invalid_request",
                false,
            ),
            (
                "wrong type",
                pb_headers("relay.v1.Flight"),
                pb::Flight {
                    id: "flt_x".into(),
                    agent: "codex-1".into(),
                    ..Default::default()
                }
                .encode_to_vec(),
                "invalid_request",
                false,
            ),
            (
                "bad JSON",
                json_headers(),
                b"{nope".to_vec(),
                "invalid_request",
                true,
            ),
            (
                "oversized",
                pb_headers(type_name),
                vec![b'x'; 200_000],
                "payload_too_large",
                false,
            ),
        ];
        cases.extend(
            per_subject
                .into_iter()
                .map(|(what, headers, payload, code, json)| {
                    (
                        format!("{subject} {what}"),
                        subject,
                        headers,
                        payload,
                        code,
                        json,
                    )
                }),
        );
    }
    // Well-formed requests that a subject or a field makes wrong.
    let post_json = |author: &str, body: &str| {
        json!({"conversation": "channel.shared", "author": author, "body": body})
            .to_string()
            .into_bytes()
    };
    let post_pb = |author: &str, body: &str| {
        pb::PostMessage {
            conversation: "channel.shared".into(),
            author: author.into(),
            body: body.into(),
            ..Default::default()
        }
        .encode_to_vec()
    };
    let over = "x".repeat(1001);
    cases.extend(
        [
            (
                "unknown command subject (JSON)",
                "relay.v1.cmd.nope",
                json_headers(),
                post_json("a", "hi"),
                "invalid_request",
                true,
            ),
            (
                "unknown command subject (protobuf)",
                "relay.v1.cmd.delete",
                pb_headers("relay.v1.PostMessage"),
                post_pb("a", "hi"),
                "invalid_request",
                false,
            ),
            (
                "empty body",
                "relay.v1.cmd.post",
                json_headers(),
                post_json("a", ""),
                "invalid_request",
                true,
            ),
            (
                // An empty one is the bus's (`nats`): a blank one is no name.
                "blank author",
                "relay.v1.cmd.post",
                pb_headers("relay.v1.PostMessage"),
                post_pb("  ", "hi"),
                "invalid_request",
                false,
            ),
            (
                "body over the message limit",
                "relay.v1.cmd.post",
                pb_headers("relay.v1.PostMessage"),
                post_pb("a", &over),
                "payload_too_large",
                false,
            ),
            (
                "empty task",
                "relay.v1.invoke.codex-1",
                json_headers(),
                json!({"task": ""}).to_string().into_bytes(),
                "invalid_request",
                true,
            ),
            (
                "task over the message limit",
                "relay.v1.invoke.codex-1",
                pb_headers("relay.v1.InvokeRequest"),
                pb::InvokeRequest {
                    task: over.clone(),
                    ..Default::default()
                }
                .encode_to_vec(),
                "payload_too_large",
                false,
            ),
        ]
        .map(|(what, subject, headers, payload, code, json)| {
            (what.to_string(), subject, headers, payload, code, json)
        }),
    );
    for (what, subject, headers, payload, code, json) in cases {
        let reply = client
            .request_with_headers(subject, headers, payload.into())
            .await
            .unwrap_or_else(|e| panic!("{what}: no reply: {e}"));
        let e = error_of(&reply, json);
        assert_eq!(e.code, code, "{what}: {e:?}");
        assert!(!e.message.is_empty(), "{what}");
    }
    // Unknown agent, and an unknown flight for commands.
    let reply = client
        .request_with_headers(
            "relay.v1.invoke.ghost",
            pb_headers("relay.v1.InvokeRequest"),
            pb::InvokeRequest {
                task: "x".into(),
                ..Default::default()
            }
            .encode_to_vec()
            .into(),
        )
        .await
        .unwrap();
    assert_eq!(error_of(&reply, false).code, "unknown_agent");
    let reply = client
        .request_with_headers(
            "relay.v1.cmd.interrupt",
            json_headers(),
            json!({"flight": "flt_nope"}).to_string().into(),
        )
        .await
        .unwrap();
    assert_eq!(error_of(&reply, true).code, "unknown_flight");
    // The same in protobuf, on steer: a CommandReply whose error is set.
    let reply = client
        .request_with_headers(
            "relay.v1.cmd.steer",
            pb_headers("relay.v1.SteerRequest"),
            pb::SteerRequest {
                flight: "flt_nope".into(),
                text: "x".into(),
            }
            .encode_to_vec()
            .into(),
        )
        .await
        .unwrap();
    assert_eq!(error_of(&reply, false).code, "unknown_flight");
    let reply = client
        .request_with_headers(
            "relay.v1.cmd.approve",
            pb_headers("relay.v1.ApproveRequest"),
            pb::ApproveRequest {
                approval: "apr_nope".into(),
                decision: pb::ApprovalDecision::Accept as i32,
                ..Default::default()
            }
            .encode_to_vec()
            .into(),
        )
        .await
        .unwrap();
    assert_eq!(error_of(&reply, false).code, "unknown_approval");
    let reply = client
        .request_with_headers(
            "relay.v1.cmd.post",
            json_headers(),
            json!({"conversation": "nope", "author": "a", "body": "b"})
                .to_string()
                .into(),
        )
        .await
        .unwrap();
    assert_eq!(error_of(&reply, true).code, "unknown_conversation");
    assert_eq!(last_seq().await, seq0, "nothing was written");

    // Still serving: a good post works.
    let reply = client
        .request_with_headers(
            "relay.v1.cmd.post",
            pb_headers("relay.v1.PostMessage"),
            pb::PostMessage {
                conversation: "channel.shared".into(),
                author: "nats-user".into(),
                body: "hello over nats".into(),
                ..Default::default()
            }
            .encode_to_vec()
            .into(),
        )
        .await
        .unwrap();
    let r = pb::CommandReply::decode(reply.payload.as_ref()).unwrap();
    assert!(
        matches!(r.result, Some(pb::command_reply::Result::Message(m)) if m.body == "hello over nats")
    );
    assert_eq!(last_seq().await, seq0 + 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_nats_client_cannot_decide_as_a_policy_or_as_relay() {
    let nats = NatsServer::start().unwrap();
    let env = trusted_env_with_nats(&nats, &[]).await;
    let pb_headers = |type_name: &str| trusted(pb_headers(type_name));
    let json_headers = || trusted(json_headers());
    let client = async_nats::connect(nats.url()).await.unwrap();
    let id = env.ask_no_wait("codex-1", "exec: echo decided-over-nats");
    env.wait_flight(&id, 60, |f| state(f) == "waiting").await;
    let approval = env.approval_of(&id)["id"].as_str().unwrap().to_string();

    let reply = client
        .request_with_headers(
            "relay.v1.cmd.approve",
            json_headers(),
            json!({"approval": approval, "decision": "accept", "decided_by": "policy:auto-accept:echo"})
                .to_string()
                .into(),
        )
        .await
        .unwrap();
    let e = reply_error(&reply, true);
    assert_eq!(e.code, "invalid_request", "{e:?}");
    assert!(e.message.contains("not allowed"), "{e:?}");
    let approve_pb = |decided_by: &str| {
        pb::ApproveRequest {
            approval: approval.clone(),
            decision: pb::ApprovalDecision::Accept as i32,
            decided_by: decided_by.into(),
        }
        .encode_to_vec()
    };
    let reply = client
        .request_with_headers(
            "relay.v1.cmd.approve",
            pb_headers("relay.v1.ApproveRequest"),
            approve_pb("relay:restart").into(),
        )
        .await
        .unwrap();
    let e = reply_error(&reply, false);
    assert_eq!(e.code, "invalid_request", "{e:?}");
    assert_eq!(env.approval_of(&id)["state"], "pending");

    // Without a name, the decision is recorded as the bus's, as before.
    let reply = client
        .request_with_headers(
            "relay.v1.cmd.approve",
            pb_headers("relay.v1.ApproveRequest"),
            approve_pb("").into(),
        )
        .await
        .unwrap();
    let r = pb::CommandReply::decode(reply.payload.as_ref()).unwrap();
    assert!(
        matches!(&r.result, Some(pb::command_reply::Result::Approval(a)) if a.decided_by.as_deref() == Some("nats")),
        "{r:?}"
    );
    env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    assert_eq!(env.approval_of(&id)["decided_by"], "nats");
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_nats_credentials_are_refused_and_right_ones_work() {
    let nats = NatsServer::start_with_auth(Auth::UserPassword {
        user: "relay".into(),
        password: "s3cret".into(),
    })
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let url = nats.url();
    // Secrets are never taken on the command line, where `ps` shows them.
    let out = relay_cmd_with(
        &relay_bin(),
        &tmp.path().join("cli"),
        &[
            "up",
            "--nats",
            &url,
            "--nats-user",
            "relay",
            "--nats-password",
            "s3cret",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("RELAY_NATS_PASSWORD") && stderr.contains("ps"),
        "{stderr}"
    );

    let err = RelayProcess::start_with(
        &tmp.path().join("bad"),
        &["--nats", &url, "--nats-user", "relay"],
        &[("RELAY_NATS_PASSWORD", "wrong")],
    )
    .err()
    .expect("wrong credentials must fail");
    let text = format!("{err:#}");
    assert!(text.contains("refused the credentials"), "{text}");
    // It failed fast: the broker stopped by itself on the refusal (rather than retrying
    // until the fixture gave up waiting for it).
    assert!(text.contains("relay up exited with"), "{text}");

    let password_file = tmp.path().join("password");
    std::fs::write(&password_file, "s3cret\n").unwrap();
    let relay = RelayProcess::start_with(
        &tmp.path().join("good"),
        &[
            "--nats",
            &url,
            "--nats-user",
            "relay",
            "--nats-password-file",
            password_file.to_str().unwrap(),
        ],
        &[],
    )
    .unwrap();
    let status = relay.cli_json(&["status", "--json"]);
    assert_eq!(status["nats"]["state"], "connected", "{status}");
    // The password never reaches the log.
    assert!(!relay.log_text().contains("s3cret"));
    let client =
        async_nats::ConnectOptions::with_user_and_password("relay".into(), "s3cret".into())
            .connect(url.as_str())
            .await
            .unwrap();
    let v = post_over_nats(&client, "authed").await;
    assert_eq!(v["message"]["body"], "authed");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_nats_restart_mid_flight_still_delivers_the_end() {
    let mut nats = NatsServer::start().unwrap();
    let env = env_with_nats(&nats, &[]).await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    let reply = client
        .request_with_headers(
            "relay.v1.invoke.codex-1",
            json_headers(),
            json!({"task": "slow: a b c d e f g h i j"})
                .to_string()
                .into(),
        )
        .await
        .unwrap();
    let v: Value = serde_json::from_slice(&reply.payload).unwrap();
    let id = v["flight"]["id"].as_str().unwrap().to_string();
    env.wait_delta(&id).await;
    // Killed outright, and down long enough for the broker to notice.
    nats.kill9();
    wait_until(
        "the broker to see NATS disconnected",
        Duration::from_secs(15),
        || async {
            let status = env.relay.cli_json(&["status", "--json"]);
            if status["nats"]["state"] == "disconnected" {
                Ok(())
            } else {
                Err(status)
            }
        },
    )
    .await;
    nats.restart().unwrap();
    let f = env
        .wait_flight(&id, 60, |f| f["state"] == "completed")
        .await;
    assert_eq!(f["output"], "a b c d e f g h i j");

    // Every update, the terminal one included, is in the stream, in order.
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let got = wait_until(
        "the flight's terminal update in the stream",
        Duration::from_secs(30),
        || async {
            let stream = js.get_stream("RELAY_FLIGHTS").await.unwrap();
            let consumer = stream
                .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
                    filter_subject: format!("relay.v1.flight.codex-1.{id}"),
                    ..Default::default()
                })
                .await
                .unwrap();
            let mut msgs = consumer.messages().await.unwrap();
            let mut got = Vec::new();
            // Everything the stream holds now: it is read until it has nothing more.
            while let Ok(Some(Ok(m))) =
                tokio::time::timeout(Duration::from_secs(2), msgs.next()).await
            {
                got.push(pb::FlightUpdate::decode(m.payload.as_ref()).unwrap());
            }
            let complete = got
                .last()
                .and_then(|u| u.flight_after.as_ref())
                .is_some_and(|f| f.state == STATE_COMPLETED);
            if complete {
                Ok(got)
            } else {
                Err(format!("{} updates, no terminal one", got.len()))
            }
        },
    )
    .await;
    assert_gap_free(&got);
    assert_eq!(deltas(&got).concat(), "a b c d e f g h i j");
    // The broker is connected again.
    wait_until(
        "the broker to reconnect to NATS",
        Duration::from_secs(15),
        || async {
            let status = env.relay.cli_json(&["status", "--json"]);
            (status["nats"]["state"] == "connected").then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_without_the_brokers_request_token_are_unauthorized() {
    // NATS itself wants a token here too; the request token is Relay's own, on top.
    let nats = NatsServer::start_with_auth(Auth::Token("nats-t0ken".into())).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let url = nats.url();
    let request_token = tmp.path().join("request-token");
    std::fs::write(&request_token, "req-s3cret").unwrap();
    let relay = RelayProcess::start_with(
        &tmp.path().join("data"),
        &[
            "--nats",
            &url,
            "--nats-request-token-file",
            request_token.to_str().unwrap(),
        ],
        &[("RELAY_NATS_TOKEN", "nats-t0ken")],
    )
    .unwrap();
    let client = async_nats::ConnectOptions::with_token("nats-t0ken".into())
        .connect(url.as_str())
        .await
        .unwrap();
    let last_seq = || async {
        relay.http().get("/v1/status").await.1["last_seq"]
            .as_u64()
            .unwrap()
    };
    let seq0 = last_seq().await;
    let post = |token: Option<&str>, json: bool| {
        let mut h = if json {
            json_headers()
        } else {
            pb_headers("relay.v1.PostMessage")
        };
        if let Some(t) = token {
            h.insert("Relay-Token", t);
        }
        let payload: Vec<u8> = if json {
            json!({"conversation": "channel.shared", "author": "a", "body": "hi"})
                .to_string()
                .into_bytes()
        } else {
            pb::PostMessage {
                conversation: "channel.shared".into(),
                author: "a".into(),
                body: "hi".into(),
                ..Default::default()
            }
            .encode_to_vec()
        };
        client.request_with_headers("relay.v1.cmd.post", h, payload.into())
    };
    for (token, json) in [
        (None, false),
        (Some("wrong"), false),
        (None, true),
        (Some("nope"), true),
    ] {
        let reply = post(token, json).await.unwrap();
        let e = reply_error(&reply, json);
        assert_eq!(e.code, "unauthorized", "{token:?} {json}: {e:?}");
    }
    let reply = client
        .request_with_headers(
            "relay.v1.invoke.anyone",
            json_headers(),
            json!({"task": "x"}).to_string().into(),
        )
        .await
        .unwrap();
    assert_eq!(reply_error(&reply, true).code, "unauthorized");
    assert_eq!(last_seq().await, seq0, "nothing was written");

    let reply = post(Some("req-s3cret"), true).await.unwrap();
    let v: Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(v["message"]["body"], "hi", "{v}");
    assert_eq!(last_seq().await, seq0 + 1);
    // Neither secret reaches the log or the status.
    let status = relay.cli_ok(&["status", "--json"]);
    for secret in ["nats-t0ken", "req-s3cret"] {
        assert!(!relay.log_text().contains(secret), "{secret} logged");
        assert!(!status.contains(secret), "{secret} in status");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_started_while_nats_is_down_serves_and_joins_the_bus_later() {
    let mut nats = NatsServer::start().unwrap();
    nats.stop();
    let tmp = tempfile::tempdir().unwrap();
    // Credentials in the URL must not show in the status or the log.
    let url = format!("nats://someone:urlpass@127.0.0.1:{}", nats.port());
    let relay = RelayProcess::start_with(&tmp.path().join("data"), &["--nats", &url], &[]).unwrap();
    // The API is up while NATS is down: the broker gave up its first try and serves
    // without the bus (it did not wait for NATS).
    assert!(
        relay
            .log_text()
            .contains("NATS is not reachable; serving without it"),
        "{}",
        relay.log_text()
    );
    let status = relay.cli_json(&["status", "--json"]);
    assert_eq!(status["nats"]["state"], "disconnected", "{status}");
    assert!(status["nats"]["error"].as_str().is_some(), "{status}");
    assert_eq!(
        status["nats"]["url"],
        format!("nats://127.0.0.1:{}", nats.port())
    );
    // The embedded broker works meanwhile.
    relay.cli_ok(&["send", "before nats"]);

    nats.restart().unwrap();
    wait_until(
        "the broker to connect to NATS",
        Duration::from_secs(30),
        || async {
            let status = relay.cli_json(&["status", "--json"]);
            if status["nats"]["state"] == "connected" {
                Ok(())
            } else {
                Err(status)
            }
        },
    )
    .await;
    // The bus serves now: a post over NATS lands, and is published on its subject.
    let client = async_nats::connect(nats.url()).await.unwrap();
    let mut convo = client.subscribe("relay.v1.conversation.>").await.unwrap();
    // The broker's subscriptions may trail its connection by a moment.
    let reply = wait_until(
        "the broker to answer a post over NATS",
        Duration::from_secs(30),
        || {
            client.request_with_headers(
                "relay.v1.cmd.post",
                json_headers(),
                json!({"conversation": "channel.shared", "author": "a", "body": "over nats"})
                    .to_string()
                    .into(),
            )
        },
    )
    .await;
    let v: Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(v["message"]["body"], "over nats", "{v}");
    let m = tokio::time::timeout(Duration::from_secs(10), convo.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        pb::Message::decode(m.payload.as_ref()).unwrap().body,
        "over nats"
    );
    assert!(!relay.log_text().contains("urlpass"), "password logged");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_with_too_little_jetstream_storage_is_refused_with_what_to_do() {
    // What a nearly full disk does to a nats-server without `max_file_store`: it offers
    // JetStream less than the flight stream's default limit of 1 GiB.
    let nats = NatsServer::start_with_store_limit(64 << 20).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let url = nats.url();
    let err = RelayProcess::start_with(&tmp.path().join("default"), &["--nats", &url], &[])
        .err()
        .expect("a 1 GiB stream on a 64 MiB store must be refused");
    let text = format!("{err:#}");
    assert!(text.contains("relay up exited with"), "{text}");
    for hint in [
        "less JetStream storage than the flight stream's limit of 1073741824 bytes",
        "insufficient storage resources",
        "--nats-stream-max-bytes",
        "max_file_store",
    ] {
        assert!(text.contains(hint), "{hint:?} missing from: {text}");
    }

    // Following the first hint, the same server serves.
    let relay = RelayProcess::start_with(
        &tmp.path().join("smaller"),
        &["--nats", &url, "--nats-stream-max-bytes", "33554432"],
        &[],
    )
    .unwrap();
    let status = relay.cli_json(&["status", "--json"]);
    assert_eq!(status["nats"]["state"], "connected", "{status}");
    let client = async_nats::connect(url.as_str()).await.unwrap();
    let stream = async_nats::jetstream::new(client.clone())
        .get_stream(relay_protocol::bus::subjects::FLIGHT_STREAM)
        .await
        .unwrap()
        .cached_info()
        .clone();
    assert_eq!(stream.config.max_bytes, 33554432);
    let v = post_over_nats(&client, "small store").await;
    assert_eq!(v["message"]["body"], "small store", "{v}");
}

/// An answer longer than NATS's max_payload (1 MiB here): its completion goes out cut to
/// fit, marked as cut, and the flight after it is published whole; the reply
/// message, too long for any NATS message, is skipped; the log keeps the whole answer,
/// and an SSE follower of the log gets it whole. Several clients at once each get their
/// long flight's end.
#[tokio::test(flavor = "multi_thread")]
async fn a_long_answer_goes_out_cut_to_fit_and_the_next_flight_whole() {
    let nats = NatsServer::start().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let relay =
        RelayProcess::start_with(&tmp.path().join("data"), &["--nats", &nats.url()], &[]).unwrap();
    relay_tests::load::add_instant_agent(&relay, "long", None, &[]);
    // An SSE follower of the whole log (`relay events --follow`): it gets each long
    // completion whole, its JSON encoded off the broker's async workers.
    /// Killed and reaped however the test ends.
    struct Reaped(std::process::Child);
    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut events = Reaped(
        relay
            .spawn_cli(&["events", "--follow", "--since", "0", "--json"])
            .unwrap(),
    );
    let (done_tx, done_rx) = std::sync::mpsc::channel::<(String, usize)>();
    let stdout = events.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["type"] == "flight_updated" && v["flight"]["state"] == "completed" {
                let output = v["flight"]["output"].as_str().map_or(0, str::len);
                let id = v["flight"]["id"].as_str().unwrap_or_default().to_string();
                if done_tx.send((id, output)).is_err() {
                    break;
                }
            }
        }
    });
    let client = async_nats::connect(nats.url()).await.unwrap();
    let mut updates = client.subscribe("relay.v1.flight.long.*").await.unwrap();
    let mut convo = client.subscribe("relay.v1.conversation.>").await.unwrap();
    let invoke = |task: &'static str| {
        let client = client.clone();
        async move { invoke_pb(&client, "long", task).await.flight_id }
    };
    // 2,000 deltas of 1 KiB: a 2 MB answer, from three clients at once.
    let long = futures::future::join_all((0..3).map(|_| invoke("stream:2000:1024"))).await;
    let mut ends = std::collections::HashMap::new();
    while ends.len() < long.len() {
        let msg = tokio::time::timeout(Duration::from_secs(120), updates.next())
            .await
            .expect("updates stopped")
            .unwrap();
        let u = pb::FlightUpdate::decode(msg.payload.as_ref()).unwrap();
        if let Some(pb::flight_update::Change::State(s)) = &u.change {
            if s.to >= STATE_COMPLETED {
                ends.insert(u.flight.clone(), u);
            }
        }
    }
    for id in &long {
        let end = &ends[id];
        let after = end.flight_after.as_ref().unwrap();
        assert_eq!(after.state, STATE_COMPLETED, "{id}");
        let output = after.output.as_deref().unwrap();
        assert!(
            output.len() < 64 * 1024,
            "{id}: {} B went out",
            output.len()
        );
        assert!(
            output.ends_with("[... cut for NATS; the whole text is in the log]"),
            "{id}"
        );
        // The log has the whole answer.
        let shown = relay.cli_json(&["flight", "show", id, "--json"]);
        assert_eq!(shown["output"].as_str().unwrap().len(), 2000 * 1024, "{id}");
    }
    // Over SSE, each long completion whole.
    let mut whole = std::collections::HashMap::new();
    while !long.iter().all(|id| whole.contains_key(id)) {
        let (id, len) = done_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the SSE follower's completions");
        whole.insert(id, len);
    }
    for id in &long {
        assert_eq!(whole[id], 2000 * 1024, "{id} over SSE");
    }
    drop(events);
    // The next flight's updates go out whole, in order, after the long ones.
    let short = invoke("short one").await;
    let got = collect_pb(&mut updates, &short).await;
    assert_gap_free(&got);
    let after = got.last().unwrap().flight_after.as_ref().unwrap();
    assert_eq!(after.state, STATE_COMPLETED);
    assert_eq!(after.output.as_deref(), Some("ok: short one"));
    // On the conversation's subject: the four requests and the short reply, in order of
    // commit; no long reply (it could never fit).
    let mut bodies = Vec::new();
    while bodies.last().map(String::as_str) != Some("ok: short one") {
        let m = tokio::time::timeout(Duration::from_secs(30), convo.next())
            .await
            .expect("messages stopped")
            .unwrap();
        bodies.push(pb::Message::decode(m.payload.as_ref()).unwrap().body);
    }
    let mut want = vec!["stream:2000:1024"; 3];
    want.extend(["short one", "ok: short one"]);
    assert_eq!(bodies, want);
    let status = relay.cli_json(&["status", "--json"]);
    assert_eq!(status["nats"]["state"], "connected", "{status}");
}
