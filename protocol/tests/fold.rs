//! The fold, [`Flight::apply`]: the flight after each update, as the broker records it and
//! every reader of the updates computes it.
//!
//! `fold/v1.jsonl` holds every (flight before, update, reply, flight after) of the v1
//! fixture (`fold/vector.rs` makes it from `tests/fixtures/v1/expected.json`; set
//! `RELAY_WRITE_FOLD_VECTOR=1` to write it again after the fixture changes): the fold must
//! give every flight after exactly, byte for byte. The hand cases below cover what the
//! fixture has no example of.

#![allow(clippy::unwrap_used)]

#[path = "fold/vector.rs"]
mod vector;

use relay_protocol::domain::*;
use serde_json::{json, Value};
use vector::Case;

const VECTOR: &str = include_str!("fold/v1.jsonl");

#[test]
fn the_vector_is_the_fixtures() {
    let cases = vector::from_events(&vector::fixture_events());
    // 16 flights, 206 updates (DESIGN30-model.md 1.1).
    assert_eq!(cases.len(), 206);
    let flights: std::collections::HashSet<_> = cases.iter().map(|c| &c.flight.id).collect();
    assert_eq!(flights.len(), 16);
    let lines: Vec<String> = cases
        .iter()
        .map(|c| serde_json::to_string(c).unwrap())
        .collect();
    let made = lines.join("\n") + "\n";
    if std::env::var_os("RELAY_WRITE_FOLD_VECTOR").is_some() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fold/v1.jsonl");
        std::fs::write(path, &made).unwrap();
    }
    assert!(
        made == VECTOR,
        "fold/v1.jsonl is not what the fixture says: RELAY_WRITE_FOLD_VECTOR=1"
    );
}

#[test]
fn the_fold_gives_every_flight_the_v1_writer_recorded() {
    let mut n = 0;
    let mut kinds = std::collections::BTreeSet::new();
    for line in VECTOR.lines() {
        let case: Case = serde_json::from_str(line).unwrap();
        let mut flight = case.flight.clone();
        assert!(flight.apply(&case.update, case.reply.as_deref()));
        assert_eq!(
            serde_json::to_string(&flight).unwrap(),
            serde_json::to_string(&case.after).unwrap(),
            "update {} of {}",
            case.update.seq,
            case.update.flight
        );
        assert_eq!(flight, case.after);
        // The same update again is in the flight already.
        assert!(!flight.apply(&case.update, case.reply.as_deref()));
        assert_eq!(flight, case.after);
        kinds.insert(serde_json::to_value(&case.update).unwrap()["kind"].to_string());
        n += 1;
    }
    assert_eq!(n, 206);
    // Every kind of update v1 made is in it.
    let want = [
        "commit",
        "command_output",
        "delta",
        "diff",
        "item",
        "note",
        "reverted",
        "session",
        "state",
        "usage",
    ];
    assert_eq!(kinds, want.iter().map(|k| format!("{k:?}")).collect());
}

fn flight(fields: Value) -> Flight {
    let mut base = json!({
        "id": "flt_1", "invocation": "inv_1", "agent": "a", "state": "running",
        "output": null, "error": null, "update_seq": 4, "conversation": "c",
        "created_at": 100, "updated_at": 100
    });
    for (k, v) in fields.as_object().unwrap() {
        base[k] = v.clone();
    }
    serde_json::from_value(base).unwrap()
}

/// `flight` after `changes`, each at seq `update_seq + 1` and time `1000 + its seq`.
fn fold(mut flight: Flight, changes: &[Value]) -> Value {
    for change in changes {
        let mut update = json!({"flight": flight.id, "agent": flight.agent});
        update["seq"] = json!(flight.update_seq + 1);
        update["at"] = json!(1000 + flight.update_seq + 1);
        for (k, v) in change.as_object().unwrap() {
            update[k] = v.clone();
        }
        let update: FlightUpdate = serde_json::from_value(update).unwrap();
        assert!(flight.apply(&update, None));
    }
    serde_json::to_value(&flight).unwrap()
}

#[test]
fn an_output_cap_split_keeps_the_head_then_fails() {
    // The rule cut the last delta to the 3 bytes left under the cap, then failed it.
    let before = flight(json!({"summary": "so far", "streaming": true, "output_bytes": 97}));
    let reason = "the flight's output passed the cap of 100 bytes per flight\nsecond line";
    let after = fold(
        before,
        &[
            json!({"kind": "delta", "text": " ab"}),
            json!({"kind": "state", "to": "failed", "reason": reason}),
        ],
    );
    let want = flight(json!({
        "state": "failed", "error": reason, "output_bytes": 100, "update_seq": 6,
        "updated_at": 1006,
        "summary": "the flight's output passed the cap of 100 bytes per flight"
    }));
    assert_eq!(after, serde_json::to_value(want).unwrap());
    // Before the failure, the head extended the streamed summary.
    let head = fold(
        flight(json!({"summary": "so far", "streaming": true, "output_bytes": 97})),
        &[json!({"kind": "delta", "text": " ab"})],
    );
    assert_eq!(head["summary"], "so far ab");
    assert_eq!(head["streaming"], true);
}

#[test]
fn a_commit_then_its_revert_then_the_commit_again() {
    let commit = json!({
        "branch": "relay/a", "start": "s1", "head": "h1", "commit": "c1",
        "files": [{"path": "x.rs", "added": 1, "removed": 0}],
        "added": 1, "removed": 0, "patch": "diff --git a/x.rs b/x.rs"
    });
    let revert = json!({"commit": "r1", "by": "operator", "at": 2000});
    let ended = flight(json!({"state": "completed", "output": "done"}));
    let after = fold(
        ended,
        &[
            json!({"kind": "commit", "commit": commit}),
            json!({"kind": "reverted", "revert": revert}),
            json!({"kind": "commit", "commit": commit}),
        ],
    );
    let mut kept = commit.clone();
    kept.as_object_mut().unwrap().remove("patch");
    kept["reverted_by"] = revert;
    assert_eq!(after["commit"], kept, "no patch; the revert holds");
    assert_eq!(after["state"], "completed");
    assert_eq!(after["output"], "done");
    assert_eq!(after["update_seq"], 7);
    assert_eq!(after.get("output_bytes"), None, "a commit streams nothing");
}

#[test]
fn late_usage_after_the_end_changes_only_the_usage() {
    let usage = json!({"input_tokens": 10, "output_tokens": 5, "cost_micro_usd": 42,
                       "cost_source": "harness"});
    let ended = flight(
        json!({"state": "cancelled", "error": "budget_exceeded: day",
                              "summary": "budget_exceeded: day", "output_bytes": 12}),
    );
    let mut update = usage.clone();
    update["kind"] = json!("usage");
    let after = fold(ended.clone(), &[update]);
    let mut want = serde_json::to_value(&ended).unwrap();
    want["usage"] = usage;
    want["update_seq"] = json!(5);
    want["updated_at"] = json!(1005);
    assert_eq!(after, want);
}

#[test]
fn a_budget_note_is_the_summary_and_the_note_clipped() {
    let first = "budget exceeded: 2.00 USD today; this turn finishes (resets at 00:00 UTC).";
    let text = format!("{first}\n{}", "é".repeat(1500));
    let before = flight(json!({"summary": "streamed", "streaming": true, "output_bytes": 3}));
    let after = fold(before, &[json!({"kind": "note", "text": text})]);
    assert_eq!(after["summary"], first);
    assert_eq!(
        after.get("streaming"),
        None,
        "a note ends the streamed text"
    );
    assert_eq!(after["output_bytes"], 3 + text.len());
    let kept = after["note"]["text"].as_str().unwrap();
    // Cut at 2,048 bytes, back to a character boundary (byte 2,048 is inside an é),
    // then the whole length.
    let cut = &text[..2047];
    assert_eq!(kept, format!("{cut}…({} bytes)", text.len()));
    assert_eq!(after["note"]["at"], 1005);
    assert_eq!(after["note"].get("flight"), None);
    // A delta after the note starts the summary afresh.
    let after = fold(
        serde_json::from_value(after).unwrap(),
        &[json!({"kind": "delta", "text": "new"})],
    );
    assert_eq!(after["summary"], "new");
}

#[test]
fn a_session_keeps_the_ids_it_does_not_name() {
    let before = flight(json!({"thread_id": "th_1", "turn_id": "tu_1"}));
    let after = fold(
        before.clone(),
        &[json!({"kind": "session", "turn_id": "tu_2"})],
    );
    assert_eq!(after["thread_id"], "th_1");
    assert_eq!(after["turn_id"], "tu_2");
    // One that names nothing (the rule records none such; a log might hold one).
    let after = fold(before.clone(), &[json!({"kind": "session"})]);
    let mut want = serde_json::to_value(&before).unwrap();
    want["update_seq"] = json!(5);
    want["updated_at"] = json!(1005);
    assert_eq!(after, want);
}

#[test]
fn an_update_already_in_the_flight_changes_nothing() {
    let mut f = flight(json!({"summary": "s"}));
    let was = f.clone();
    let old: FlightUpdate = serde_json::from_value(json!({
        "flight": "flt_1", "agent": "a", "seq": 4, "at": 5000, "kind": "delta", "text": "x"
    }))
    .unwrap();
    assert!(!f.apply(&old, Some("msg_x")));
    assert_eq!(f, was);
}

#[test]
fn streamed_text_extends_the_summary_until_something_else_comes() {
    // (The fixture's flights stream one delta each: this is the case it lacks.)
    let ten = "one two three ".repeat(10);
    let steps = [
        (json!({"kind": "delta", "text": ten}), ten.clone()),
        (
            json!({"kind": "delta", "text": "four five six seven"}),
            format!("{ten}four five six seven"),
        ),
        // 165 characters: the last 160, from the start of a word.
        (
            json!({"kind": "delta", "text": " eight"}),
            format!(
                "…three {}four five six seven eight",
                "one two three ".repeat(9)
            ),
        ),
        (
            json!({"kind": "item", "item_id": "i", "item_kind": "command_execution",
                   "phase": "started", "text": "cargo test"}),
            "command_execution: cargo test".into(),
        ),
        (json!({"kind": "delta", "text": "x\ny"}), "x y".into()),
    ];
    let mut f = flight(json!({}));
    for (change, summary) in steps {
        let delta = change["kind"] == "delta";
        let after = fold(f, &[change]);
        assert_eq!(after["summary"], summary.as_str());
        assert_eq!(after.get("streaming").is_some(), delta);
        f = serde_json::from_value(after).unwrap();
    }
    // A flight that ended streams no more.
    let after = fold(
        f,
        &[json!({"kind": "state", "to": "completed", "output": "x y"})],
    );
    assert_eq!(after.get("streaming"), None);
    assert_eq!(after["summary"], "x y");
    assert_eq!(after["output_bytes"], 140 + 19 + 6 + 10 + 3);
}
