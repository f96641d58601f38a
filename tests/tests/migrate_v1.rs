//! The v1 fixture (`tests/fixtures/v1`, made by `relay-fixture-v1` on v1 code: every
//! event kind, through the real broker): a broker started on the unpacked data dir
//! answers every listing, flight, update, replay (HTTP and CLI), watch and the event
//! stream byte for byte as recorded. On v1 this shows the fixture and its checker are
//! deterministic; on v2 it is the migration's test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_tests::fixture;
use relay_tests::RelayProcess;

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_on_the_v1_fixture_answers_every_reader_as_recorded() {
    let expected = fixture::load_expected().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let data = fixture::unpack_v1(tmp.path()).unwrap();
    let mut relay = RelayProcess::start(&data).unwrap();
    fixture::assert_outputs_equal(&relay, &expected).await;
    // And again after a clean restart: opening it a second time changes nothing.
    relay.terminate().unwrap();
    let mut relay = RelayProcess::start(&data).unwrap();
    fixture::assert_outputs_equal(&relay, &expected).await;
    replies_to_a_v1_message(&relay).await;
    relay.terminate().unwrap();
}

/// A v1 message's id (random: it does not carry its event's seq, so `message_ids`
/// finds it) is still a message a post can reply to; a made-up one is not.
async fn replies_to_a_v1_message(relay: &RelayProcess) {
    let http = relay.http();
    let (code, listed) = http.get("/v1/conversations/team/messages?limit=1").await;
    assert_eq!(code, 200, "{listed}");
    let old = listed[0]["id"].as_str().unwrap().to_string();
    let reply = |to: &str| {
        serde_json::json!({
            "conversation": "team",
            "author": "ann",
            "body": "a reply",
            "reply_to": to,
        })
    };
    let (code, posted) = http.post("/v1/messages", &reply(&old)).await;
    assert_eq!(code, 200, "{posted}");
    assert_eq!(posted["message"]["reply_to"], old.as_str(), "{posted}");
    let new = posted["message"]["id"].as_str().unwrap();
    let (code, posted) = http.post("/v1/messages", &reply(new)).await;
    assert_eq!(
        code, 200,
        "a reply to the reply, found by its seq: {posted}"
    );
    // The conversation reads as one: its v1 messages by their keys, the two new ones
    // by their records' links, the indexes running on.
    let (_, read) = http.get("/v1/conversations/team/messages?limit=1000").await;
    let read = read.as_array().unwrap();
    let indexes: Vec<u64> = read.iter().map(|m| m["index"].as_u64().unwrap()).collect();
    let n = indexes.len() as u64;
    assert_eq!(indexes, (0..n).collect::<Vec<_>>());
    assert_eq!(read[n as usize - 2]["reply_to"], old.as_str());
    assert_eq!(read[n as usize - 1]["reply_to"], new);
    let (_, replayed) = http.get("/v1/replay/conversations/team").await;
    let replayed: Vec<&serde_json::Value> = replayed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e.get("message"))
        .collect();
    assert_eq!(replayed.len() as u64, n, "{replayed:?}");
    let (_, two) = http.get("/v1/conversations/team/messages?limit=2").await;
    assert_eq!(two.as_array().unwrap()[..], read[n as usize - 2..]);
    let made_up = format!("msg_{}", "0".repeat(32));
    let (code, refused) = http.post("/v1/messages", &reply(&made_up)).await;
    assert_eq!(
        refused["error"]["code"], "unknown_message",
        "{code} {refused}"
    );
}
