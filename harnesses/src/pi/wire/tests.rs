//! The wire over lines recorded from the real pi 0.73.1 against the mock model
//! (`fixtures/`, one turn each; request ids renamed to the ones this wire writes).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::turn::{describe_call, output_delta, tool_kind, ARGS_SHOWN};
use super::*;
use crate::fixtures::{
    completed, delta, events_of, feed, item_completed, item_started, priced, sent, tokens,
    turn_started, usage, TURN,
};
use relay_protocol::harness::ItemKind;

fn answers(actions: &[Action]) -> Vec<(String, Result<Value, String>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Answer { id, result } => Some((
                id.clone(),
                match result {
                    Ok(value) => Ok(value.clone()),
                    Err(e) => Err(e.to_string()),
                },
            )),
            _ => None,
        })
        .collect()
}

/// A wire with turn [`TURN`] prompted (request `relay-1`).
fn prompted() -> PiWire {
    let mut wire = PiWire::default();
    let prompt = wire.prompt(TURN, "say hello").unwrap();
    assert_eq!(prompt.awaits.as_deref(), Some("relay-1"));
    assert_eq!(
        prompt.message,
        json!({"id": "relay-1", "type": "prompt", "message": "say hello"})
    );
    wire
}

/// The user message `n` of the turn, started and completed.
fn user(n: u32, text: &str) -> [HarnessEvent; 2] {
    let id = format!("{TURN}-u{n}");
    [
        item_started(&id, ItemKind::UserMessage),
        item_completed(&id, ItemKind::UserMessage, text),
    ]
}

#[test]
fn a_text_turn_streams_its_message_as_one_item() {
    let mut wire = prompted();
    let out = feed(&mut wire, include_str!("fixtures/text.jsonl"));
    assert_eq!(answers(&out), vec![("relay-1".into(), Ok(Value::Null))]);
    let m = "t1-m1-0";
    assert_eq!(
        events_of(&out),
        [
            vec![turn_started()],
            user(1, "say hello").to_vec(),
            vec![
                item_started(m, ItemKind::AgentMessage),
                delta(m, "Hel"),
                delta(m, "lo "),
                delta(m, "world"),
                item_completed(m, ItemKind::AgentMessage, "Hello world"),
                usage(tokens(3, 3, "mock-model")),
                completed(TurnOutcome::Completed {
                    text: "Hello world".into()
                }),
            ],
        ]
        .concat()
    );
    assert!(wire.turn.is_none());
}

#[test]
fn a_bash_call_is_a_command_with_its_output_then_the_answer_follows() {
    let mut wire = prompted();
    let out = feed(&mut wire, include_str!("fixtures/tool.jsonl"));
    let m = "t1-m2-0";
    assert_eq!(
        events_of(&out),
        [
            vec![turn_started()],
            user(1, "run it").to_vec(),
            vec![
                usage(tokens(2, 6, "mock-model")),
                item_started("toolu_1", ItemKind::CommandExecution),
                HarnessEvent::CommandOutputDelta {
                    turn_id: TURN.into(),
                    item_id: "toolu_1".into(),
                    delta: "hi\n".into(),
                },
                item_completed("toolu_1", ItemKind::CommandExecution, "echo hi\nhi"),
                item_started(m, ItemKind::AgentMessage),
                delta(m, "done"),
                item_completed(m, ItemKind::AgentMessage, "done"),
                usage(tokens(12, 7, "mock-model")),
                completed(TurnOutcome::Completed {
                    text: "done".into()
                }),
            ],
        ]
        .concat()
    );
}

#[test]
fn a_steer_is_written_while_the_turn_runs_and_pi_answers_in_the_same_turn() {
    let mut wire = prompted();
    let steer = wire.steer(TURN, "steered text").unwrap();
    assert_eq!(
        steer.message,
        json!({"id": "relay-2", "type": "steer", "message": "steered text"})
    );
    let out = feed(&mut wire, include_str!("fixtures/steer.jsonl"));
    assert_eq!(
        answers(&out),
        vec![
            ("relay-1".into(), Ok(Value::Null)),
            ("relay-2".into(), Ok(Value::Null))
        ]
    );
    let seen = events_of(&out);
    let texts: Vec<_> = seen
        .iter()
        .filter_map(|e| match e {
            HarnessEvent::ItemCompleted { item_id, text, .. } => {
                Some((item_id.as_str(), text.as_deref()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        texts,
        vec![
            ("t1-u1", Some("count")),
            ("t1-m1-0", Some("a b c d")),
            ("t1-u2", Some("steered text")),
            ("t1-m2-0", Some("after steer"))
        ]
    );
    assert_eq!(
        seen.last(),
        Some(&completed(TurnOutcome::Completed {
            text: "after steer".into()
        }))
    );
}

#[test]
fn an_abort_mid_stream_closes_the_open_message_and_interrupts_the_turn() {
    let mut wire = prompted();
    let abort = wire.abort(TURN).unwrap();
    assert_eq!(abort.message, json!({"id": "relay-2", "type": "abort"}));
    let out = feed(&mut wire, include_str!("fixtures/abort.jsonl"));
    let m = "t1-m1-0";
    assert_eq!(
        events_of(&out),
        [
            vec![turn_started()],
            user(1, "slow").to_vec(),
            vec![
                item_started(m, ItemKind::AgentMessage),
                delta(m, "a "),
                item_completed(m, ItemKind::AgentMessage, "a "),
                usage(tokens(1, 1, "mock-model")),
                completed(TurnOutcome::Interrupted),
            ],
        ]
        .concat()
    );
    // Pi answers the abort once the turn has ended.
    assert_eq!(answers(&out).last().unwrap().0, "relay-2");
}

#[test]
fn an_error_pi_does_not_retry_fails_the_turn_once_the_probe_is_answered() {
    let mut wire = prompted();
    let fixture = include_str!("fixtures/fail.jsonl");
    let (run, probe_answer) = fixture.trim_end().rsplit_once('\n').unwrap();
    let out = feed(&mut wire, run);
    assert_eq!(
        sent(&out),
        vec![json!({"id": "relay-2", "type": "get_state"})]
    );
    assert!(!events_of(&out)
        .iter()
        .any(|e| matches!(e, HarnessEvent::TurnCompleted { .. })));
    // The turn is ending: a steer could land in the next prompt, so it waits.
    assert!(matches!(
        wire.steer(TURN, "x"),
        Err(HarnessError::NoActiveTurn { .. })
    ));

    let out = feed(&mut wire, probe_answer);
    assert!(answers(&out).is_empty(), "the probe is the wire's own");
    assert_eq!(
        events_of(&out),
        vec![completed(TurnOutcome::Failed {
            error:
                r#"{"error":{"message":"bad input","type":"invalid_request_error"},"type":"error"}"#
                    .into()
        })]
    );
    assert!(wire.turn.is_none());
}

#[test]
fn a_retried_error_goes_on_in_the_same_turn() {
    let mut wire = prompted();
    let out = feed(&mut wire, include_str!("fixtures/retry.jsonl"));
    let seen = events_of(&out);
    let turn_level: Vec<_> = seen
        .iter()
        .filter(|e| {
            matches!(
                e,
                HarnessEvent::TurnStarted { .. }
                    | HarnessEvent::Retrying { .. }
                    | HarnessEvent::TurnCompleted { .. }
            )
        })
        .cloned()
        .collect();
    assert_eq!(
        turn_level,
        vec![
            turn_started(),
            HarnessEvent::Retrying {
                message: r#"pi retries (1/3) after: {"error":{"message":"overloaded","type":"server_error"},"type":"error"}"#.into()
            },
            completed(TurnOutcome::Completed {
                text: "recovered".into()
            }),
        ]
    );
    assert_eq!(sent(&out).len(), 1);
    assert!(answers(&out).len() == 1, "only the prompt's: {out:?}");
}

#[test]
fn an_error_still_there_after_the_last_retry_fails_the_turn() {
    let mut wire = prompted();
    let out = feed(&mut wire, include_str!("fixtures/retry_exhausted.jsonl"));
    let error = r#"{"error":{"message":"overloaded","type":"server_error"},"type":"error"}"#;
    assert_eq!(
        events_of(&out).last(),
        Some(&completed(TurnOutcome::Failed {
            error: error.into()
        }))
    );
    let completions = events_of(&out)
        .iter()
        .filter(|e| matches!(e, HarnessEvent::TurnCompleted { .. }))
        .count();
    assert_eq!(completions, 1);
    assert!(wire.turn.is_none());
}

#[test]
fn an_abort_while_pi_waits_to_retry_interrupts_the_turn() {
    let mut wire = prompted();
    feed(
        &mut wire,
        r#"{"type":"agent_start"}
{"type":"agent_end","messages":[{"role":"assistant","content":[],"stopReason":"error","errorMessage":"529 overloaded"}]}
{"type":"auto_retry_start","attempt":1,"maxAttempts":3,"delayMs":2000,"errorMessage":"529 overloaded"}"#,
    );
    // Waiting to retry, pi takes a steer for the retried run.
    assert!(wire.steer(TURN, "also this").is_ok());
    assert!(wire.abort(TURN).is_ok());
    let out = feed(
        &mut wire,
        r#"{"type":"auto_retry_end","success":false,"attempt":1,"finalError":"Retry cancelled"}"#,
    );
    assert_eq!(events_of(&out), vec![completed(TurnOutcome::Interrupted)]);
}

#[test]
fn steer_and_abort_need_the_turn_running() {
    let mut wire = PiWire::default();
    for result in [wire.steer(TURN, "x"), wire.abort(TURN)] {
        assert!(matches!(result, Err(HarnessError::NoActiveTurn { .. })));
    }
    let mut wire = prompted();
    assert!(matches!(
        wire.steer("other", "x"),
        Err(HarnessError::NoActiveTurn { .. })
    ));
    assert!(matches!(
        wire.prompt("t2", "again"),
        Err(HarnessError::Rpc { .. })
    ));
    feed(&mut wire, include_str!("fixtures/text.jsonl"));
    assert!(matches!(
        wire.abort(TURN),
        Err(HarnessError::NoActiveTurn { .. })
    ));
    assert!(wire.prompt("t2", "again").is_ok());
}

#[test]
fn a_refused_prompt_ends_the_turn_it_was_to_start() {
    let mut wire = prompted();
    let out = feed(
        &mut wire,
        r#"{"id":"relay-1","type":"response","command":"prompt","success":false,"error":"No API key found for mock."}"#,
    );
    assert_eq!(
        answers(&out),
        vec![(
            "relay-1".into(),
            Err("agent refused the request: No API key found for mock. (code 0)".into())
        )]
    );
    assert!(events_of(&out).is_empty());
    assert!(wire.turn.is_none());
}

#[test]
fn responses_are_answers_and_idless_refusals_are_only_logged() {
    let mut wire = PiWire::default();
    assert_eq!(
        wire.get_state().message,
        json!({"id": "relay-1", "type": "get_state"})
    );
    let out = feed(&mut wire, include_str!("fixtures/responses.jsonl"));
    assert_eq!(out.len(), 1, "{out:?}");
    let (id, state) = answers(&out).remove(0);
    assert_eq!(id, "relay-0");
    assert!(state.unwrap()["sessionId"].as_str().is_some());
}

#[test]
fn junk_is_malformed_and_unknown_events_are_skipped() {
    let mut wire = prompted();
    let out = feed(
        &mut wire,
        "not json\n{\"type\":\"message_end\"}\n{\"type\":\"queue_update\",\"steering\":[]}\n{\"type\":\"agent_start\"}",
    );
    let malformed = out
        .iter()
        .filter(|a| matches!(a, Action::Malformed(_)))
        .count();
    assert_eq!(malformed, 2, "{out:?}");
    assert_eq!(events_of(&out), vec![turn_started()]);
}

#[test]
fn a_dialog_of_an_extension_is_cancelled_with_a_warning() {
    let mut wire = PiWire::default();
    let out = feed(
        &mut wire,
        r#"{"type":"extension_ui_request","id":"u1","method":"confirm","title":"Allow?","message":"rm -rf"}
{"type":"extension_ui_request","id":"u2","method":"notify","message":"hi"}"#,
    );
    assert!(matches!(
        &out[..],
        [Action::Send(reply), Action::Event(HarnessEvent::Warning { .. })]
            if *reply == json!({"type": "extension_ui_response", "id": "u1", "cancelled": true})
    ));
}

#[test]
fn tools_are_named_by_what_they_did() {
    assert_eq!(tool_kind("bash"), ItemKind::CommandExecution);
    assert_eq!(tool_kind("edit"), ItemKind::FileChange);
    assert_eq!(tool_kind("write"), ItemKind::FileChange);
    assert_eq!(tool_kind("read"), ItemKind::ToolCall);
    assert_eq!(describe_call("edit", &json!({"path": "a.rs"})), "edit a.rs");
    assert_eq!(describe_call("ls", &json!({"path": 1})), r#"ls {"path":1}"#);
    let long = describe_call("grep", &json!({"pattern": "é".repeat(400)}));
    assert!(long.len() <= "grep ".len() + ARGS_SHOWN + '…'.len_utf8());
    assert!(long.ends_with('…'));
}

#[test]
fn output_snapshots_become_deltas_even_when_pi_keeps_only_the_tail() {
    assert_eq!(output_delta("", "a\n"), "a\n");
    assert_eq!(output_delta("a\n", "a\nb\n"), "b\n");
    // The window moved on: "a" dropped, "b" kept, "c" new.
    assert_eq!(output_delta("a\nb\n", "b\nc\n"), "c\n");
    // Nothing in common: all of it is new.
    assert_eq!(output_delta("a\n", "x\n"), "x\n");
    assert_eq!(output_delta("a\n", "a\n"), "");
}

/// Token counts come from the wire: counts whose sum overflows saturate (found by the
/// fuzz target `pi_rpc_lines`, which hit "attempt to add with overflow").
#[test]
fn token_counts_too_large_to_add_saturate() {
    let mut wire = prompted();
    let huge = u64::MAX.to_string();
    let text = include_str!("fixtures/text.jsonl").replace(
        "\"cacheRead\":0,\"cacheWrite\":0,\"totalTokens\":6",
        &format!("\"cacheRead\":{huge},\"cacheWrite\":{huge},\"totalTokens\":6"),
    );
    let out = feed(&mut wire, &text);
    let expect = relay_protocol::domain::TokenUsage {
        cached_input_tokens: u64::MAX,
        ..tokens(u64::MAX, 3, "mock-model")
    };
    assert!(
        events_of(&out).contains(&usage(expect)),
        "{:?}",
        events_of(&out)
    );
}

/// Pi's `input` is the uncached rest (as the Messages API counts it): Relay's input adds
/// the cache reads and writes back, the reads are its cached part; pi's cost is the
/// harness's (rounded to the micro-dollar), but a zero one (no price in `models.json`,
/// as in every other fixture) is no cost at all.
#[test]
fn cached_input_is_part_of_the_input_and_a_price_is_a_cost() {
    let mut wire = prompted();
    let text = include_str!("fixtures/text.jsonl").replace(
        "\"cacheRead\":0,\"cacheWrite\":0,\"totalTokens\":6,\"cost\":{\"input\":0,\"output\":0,\"cacheRead\":0,\"cacheWrite\":0,\"total\":0}",
        "\"cacheRead\":40,\"cacheWrite\":7,\"totalTokens\":53,\"cost\":{\"input\":0,\"output\":0,\"cacheRead\":0,\"cacheWrite\":0,\"total\":0.0012344}",
    );
    let out = feed(&mut wire, &text);
    let expect = relay_protocol::domain::TokenUsage {
        cached_input_tokens: 40,
        ..priced(3 + 40 + 7, 3, "mock-model", 1234)
    };
    assert!(
        events_of(&out).contains(&usage(expect)),
        "{:?}",
        events_of(&out)
    );
}
