//! What goes on NATS, value by value: each `*_to_pb` against the whole message it must
//! give (through the encoded bytes), each `*_from_pb` against the domain value it must
//! read, and the errors for what has no domain form.

use super::*;
use crate::api::ErrorCode;
use crate::domain::{
    ApprovalKind, ApprovalRequest, ApprovalState, ItemKind, ItemPhase, Note, TokenUsage,
};

/// Through the encoded bytes too, so absent vs default survives the wire.
fn reencode<M: prost::Message + Default>(m: &M) -> M {
    M::decode(m.encode_to_vec().as_slice()).unwrap()
}

#[test]
fn every_enum_value_maps_to_its_namesake_and_back() {
    fn check<E>(all: &[E], prefix: &str, to_name: impl Fn(&E::Pb) -> &'static str)
    where
        E: ProtoEnum + Copy + PartialEq + std::fmt::Debug + std::fmt::Display,
        E::Pb: Copy + Into<i32>,
    {
        for &v in all {
            let wire = v.to_pb();
            let name = format!("{prefix}_{}", v.to_string().to_uppercase());
            assert_eq!(to_name(&wire), name);
            assert_eq!(E::from_pb(wire.into()), Ok(v));
        }
    }
    check(&Harness::ALL, "HARNESS", |p| p.as_str_name());
    check(&FlightState::ALL, "FLIGHT_STATE", |p| p.as_str_name());
    check(&Action::ALL, "ACTION", |p| p.as_str_name());
    check(&MessageClass::ALL, "MESSAGE_CLASS", |p| p.as_str_name());
    check(&ApprovalDecision::ALL, "APPROVAL_DECISION", |p| {
        p.as_str_name()
    });
}

#[test]
fn unspecified_and_unknown_enum_values_are_errors_not_panics() {
    for (got, msg) in [
        (Harness::from_pb(0).err(), "harness 0 is not valid"),
        (Harness::from_pb(9).err(), "harness 9 is not valid"),
        (FlightState::from_pb(0).err(), "flight state 0 is not valid"),
        (
            FlightState::from_pb(-1).err(),
            "flight state -1 is not valid",
        ),
        (Action::from_pb(2).err(), "action 2 is not valid"),
        (
            MessageClass::from_pb(9).err(),
            "message class 9 is not valid",
        ),
        (
            ApprovalDecision::from_pb(0).err(),
            "approval decision 0 is not valid",
        ),
        (
            ApprovalDecision::from_pb(5).err(),
            "approval decision 5 is not valid",
        ),
    ] {
        assert_eq!(got, Some(ConvertError(msg.into())));
    }
    // Their zero is a value: the default of a field left out.
    assert_eq!(Action::from_pb(0), Ok(Action::Consult));
    assert_eq!(MessageClass::from_pb(0), Ok(MessageClass::Agent));
}

fn flight_full() -> Flight {
    Flight {
        commit: None,
        usage: None,
        root_flight: None,
        id: "flt_1".into(),
        invocation: "inv_1".into(),
        agent: "codex-1".into(),
        state: FlightState::Running,
        summary: Some("thinking".into()),
        streaming: false,
        output: Some("done".into()),
        error: Some("boom".into()),
        update_seq: 7,
        thread_id: Some("th_1".into()),
        turn_id: Some("tu_1".into()),
        parent_flight: Some("flt_0".into()),
        conversation: "direct.operator.codex-1".into(),
        reply_message: Some("msg_9".into()),
        note: Some(Note {
            text: "Reconnecting... waiting for network".into(),
            at: 150,
            flight: None,
        }),
        output_bytes: 0,
        created_at: 100,
        updated_at: 200,
    }
}

fn flight_bare() -> Flight {
    Flight {
        commit: None,
        usage: None,
        root_flight: None,
        id: "flt_2".into(),
        invocation: "inv_2".into(),
        agent: "pi".into(),
        state: FlightState::Queued,
        summary: None,
        streaming: false,
        output: None,
        error: None,
        update_seq: 0,
        thread_id: None,
        turn_id: None,
        parent_flight: None,
        conversation: "channel.shared".into(),
        reply_message: None,
        note: None,
        output_bytes: 0,
        created_at: 1,
        updated_at: 1,
    }
}

#[test]
fn flights_are_sent_whole_with_every_option_set_or_absent() {
    assert_eq!(
        reencode(&flight_to_pb(&flight_full())),
        pb::Flight {
            id: "flt_1".into(),
            invocation: "inv_1".into(),
            agent: "codex-1".into(),
            state: pb::FlightState::Running as i32,
            summary: Some("thinking".into()),
            output: Some("done".into()),
            error: Some("boom".into()),
            update_seq: 7,
            thread_id: Some("th_1".into()),
            turn_id: Some("tu_1".into()),
            parent_flight: Some("flt_0".into()),
            conversation: "direct.operator.codex-1".into(),
            reply_message: Some("msg_9".into()),
            created_at: 100,
            updated_at: 200,
            note: Some("Reconnecting... waiting for network".into()),
            note_at: Some(150),
        }
    );
    assert_eq!(
        reencode(&flight_to_pb(&flight_bare())),
        pb::Flight {
            id: "flt_2".into(),
            invocation: "inv_2".into(),
            agent: "pi".into(),
            state: pb::FlightState::Queued as i32,
            conversation: "channel.shared".into(),
            created_at: 1,
            updated_at: 1,
            // Every option absent, every other number 0.
            ..Default::default()
        }
    );
}

#[test]
fn every_flight_change_is_sent_as_its_oneof_case() {
    let text = |t: &str| pb::Text { text: t.into() };
    let cases = vec![
        (
            FlightChange::State {
                to: FlightState::Completed,
                reason: Some("why".into()),
                output: Some("answer".into()),
            },
            Change::State(pb::StateChange {
                to: pb::FlightState::Completed as i32,
                reason: Some("why".into()),
                output: Some("answer".into()),
            }),
        ),
        (
            FlightChange::State {
                to: FlightState::Waiting,
                reason: None,
                output: None,
            },
            Change::State(pb::StateChange {
                to: pb::FlightState::Waiting as i32,
                reason: None,
                output: None,
            }),
        ),
        (
            FlightChange::Delta { text: "hel".into() },
            Change::Delta(pb::Delta { text: "hel".into() }),
        ),
        (
            FlightChange::Item {
                item_id: "it_1".into(),
                item_kind: ItemKind::CommandExecution,
                phase: ItemPhase::Started,
                text: Some("ls".into()),
                exit_code: None,
            },
            Change::Item(pb::Item {
                item_id: "it_1".into(),
                item_kind: "command_execution".into(),
                phase: "started".into(),
                text: Some("ls".into()),
                exit_code: None,
            }),
        ),
        (
            FlightChange::Item {
                item_id: "it_2".into(),
                item_kind: ItemKind::Other("imageView".into()),
                phase: ItemPhase::Completed,
                text: None,
                exit_code: None,
            },
            Change::Item(pb::Item {
                item_id: "it_2".into(),
                item_kind: "imageView".into(),
                phase: "completed".into(),
                text: None,
                exit_code: None,
            }),
        ),
        (
            FlightChange::CommandOutput {
                item_id: "it_1".into(),
                text: "a\nb\n".into(),
            },
            Change::CommandOutput(pb::CommandOutput {
                item_id: "it_1".into(),
                text: "a\nb\n".into(),
            }),
        ),
        (
            FlightChange::Plan {
                text: "1. do".into(),
            },
            Change::Plan(text("1. do")),
        ),
        (
            FlightChange::Diff { text: "+x".into() },
            Change::Diff(text("+x")),
        ),
        (
            FlightChange::Usage(TokenUsage {
                input_tokens: 12,
                output_tokens: 34,
                cached_input_tokens: 5,
                reasoning_tokens: Some(6),
                model: Some("m".into()),
                cost_micro_usd: Some(7),
                cost_source: None,
            }),
            Change::Usage(pb::Usage {
                input_tokens: 12,
                output_tokens: 34,
                cached_input_tokens: 5,
                reasoning_tokens: Some(6),
                model: Some("m".into()),
                cost_micro_usd: Some(7),
            }),
        ),
        (
            FlightChange::Session {
                thread_id: Some("th".into()),
                turn_id: Some("tu".into()),
            },
            Change::Session(pb::Session {
                thread_id: Some("th".into()),
                turn_id: Some("tu".into()),
            }),
        ),
        (
            FlightChange::Session {
                thread_id: None,
                turn_id: None,
            },
            Change::Session(pb::Session {
                thread_id: None,
                turn_id: None,
            }),
        ),
        (
            FlightChange::Note {
                text: "respawned".into(),
                by: None,
            },
            Change::Note(pb::Note {
                text: "respawned".into(),
                by: None,
            }),
        ),
        (
            FlightChange::Note {
                text: "steered: go on".into(),
                by: Some("alice@dashboard".into()),
            },
            Change::Note(pb::Note {
                text: "steered: go on".into(),
                by: Some("alice@dashboard".into()),
            }),
        ),
    ];
    for (i, (change, wire)) in cases.into_iter().enumerate() {
        let u = FlightUpdate {
            flight: "flt_1".into(),
            agent: "codex-1".into(),
            seq: i as u64 + 1,
            at: 1000 + i as u64,
            change,
        };
        assert_eq!(
            reencode(&update_to_pb(&u, &flight_bare())),
            pb::FlightUpdate {
                flight: "flt_1".into(),
                agent: "codex-1".into(),
                seq: i as u64 + 1,
                at: 1000 + i as u64,
                change: Some(wire),
                flight_after: Some(flight_to_pb(&flight_bare())),
            }
        );
    }
}

#[test]
fn messages_are_sent_with_their_meta_only_when_it_says_something() {
    let full = Message {
        id: "msg_1".into(),
        conversation: "channel.shared".into(),
        index: 3,
        author: "codex-1".into(),
        class: MessageClass::Artifact,
        body: "hi @pi".into(),
        mentions: vec!["pi".into()],
        reply_to: Some("msg_0".into()),
        meta: MessageMeta {
            invocation: Some("inv_1".into()),
            flight: Some("flt_1".into()),
            harness: Some(Harness::PiRpc),
            thread_id: Some("th".into()),
            turn_id: Some("tu".into()),
        },
        created_at: 42,
    };
    assert_eq!(
        reencode(&message_to_pb(&full)),
        pb::Message {
            id: "msg_1".into(),
            conversation: "channel.shared".into(),
            index: 3,
            author: "codex-1".into(),
            class: pb::MessageClass::Artifact as i32,
            body: "hi @pi".into(),
            mentions: vec!["pi".into()],
            reply_to: Some("msg_0".into()),
            meta: Some(pb::MessageMeta {
                invocation: Some("inv_1".into()),
                flight: Some("flt_1".into()),
                harness: Some(pb::Harness::PiRpc as i32),
                thread_id: Some("th".into()),
                turn_id: Some("tu".into()),
            }),
            created_at: 42,
        }
    );
    let bare = Message {
        id: "msg_2".into(),
        conversation: "direct.a.b".into(),
        index: 0,
        author: "operator".into(),
        class: MessageClass::Agent,
        body: Default::default(),
        mentions: vec![],
        reply_to: None,
        meta: MessageMeta::default(),
        created_at: 0,
    };
    assert_eq!(
        reencode(&message_to_pb(&bare)),
        pb::Message {
            id: "msg_2".into(),
            conversation: "direct.a.b".into(),
            author: "operator".into(),
            // `agent` is 0, no meta is an absent one, and nothing else is set.
            ..Default::default()
        }
    );
    // And back, every field as it was; a class this build does not know is an error.
    for m in [full, bare] {
        assert_eq!(message_from_pb(reencode(&message_to_pb(&m))).unwrap(), m);
    }
    let unknown = pb::Message {
        class: 99,
        ..Default::default()
    };
    assert!(message_from_pb(unknown).is_err());
}

#[test]
fn approvals_are_sent_with_wire_names_and_no_decision_until_decided() {
    let mut a = Approval {
        id: "apr_1".into(),
        agent: "codex-1".into(),
        request: ApprovalRequest {
            flight: "flt_1".into(),
            kind: ApprovalKind::FileChange,
            detail: "edit a.rs".into(),
            reason: Some("needs write".into()),
            harness_request_id: "7".into(),
        },
        state: ApprovalState::Pending,
        decision: None,
        decided_by: None,
        created_at: 5,
        remembered: None,
        decided_at: None,
    };
    let pending = pb::Approval {
        id: "apr_1".into(),
        agent: "codex-1".into(),
        flight: "flt_1".into(),
        kind: "file_change".into(),
        detail: "edit a.rs".into(),
        reason: Some("needs write".into()),
        state: "pending".into(),
        decision: pb::ApprovalDecision::Unspecified as i32,
        decided_by: None,
        created_at: 5,
        decided_at: None,
        harness_request_id: "7".into(),
    };
    assert_eq!(reencode(&approval_to_pb(&a)), pending);

    a.request.kind = ApprovalKind::Other;
    a.state = ApprovalState::Decided;
    a.decision = Some(ApprovalDecision::AcceptForSession);
    a.decided_by = Some("operator".into());
    a.decided_at = Some(9);
    assert_eq!(
        reencode(&approval_to_pb(&a)),
        pb::Approval {
            kind: "other".into(),
            state: "decided".into(),
            decision: pb::ApprovalDecision::AcceptForSession as i32,
            decided_by: Some("operator".into()),
            decided_at: Some(9),
            ..pending
        }
    );
}

#[test]
fn errors_are_sent_with_their_code() {
    let e = ApiError {
        code: ErrorCode::UnknownFlight,
        message: "no flight flt_x".into(),
    };
    assert_eq!(
        error_to_pb(&e),
        pb::Error {
            code: "unknown_flight".into(),
            message: "no flight flt_x".into(),
        }
    );
}

#[test]
fn invoke_requests_are_read_with_the_subjects_agent() {
    let wire = reencode(&pb::InvokeRequest {
        task: "fix it".into(),
        requester: "pi".into(),
        action: pb::Action::Execute as i32,
        conversation: Some("thread.x".into()),
        parent_flight: Some("flt_0".into()),
        timeout_ms: Some(5000),
    });
    assert_eq!(
        invoke_request_from_pb("codex-1", &wire, "operator").unwrap(),
        InvokeRequest {
            target: "codex-1".into(),
            task: "fix it".into(),
            requester: "pi".into(),
            action: Action::Execute,
            conversation: Some("thread.x".into()),
            parent_flight: Some("flt_0".into()),
            timeout_ms: Some(5000),
        }
    );

    // Empty fields pass through (the broker validates); empty requester is the default.
    let empty = invoke_request_from_pb("pi", &pb::InvokeRequest::default(), "nats").unwrap();
    assert_eq!(
        empty,
        InvokeRequest {
            target: "pi".into(),
            task: String::new(),
            requester: "nats".into(),
            action: Action::Consult,
            conversation: None,
            parent_flight: None,
            timeout_ms: None,
        }
    );

    let r = pb::InvokeRequest {
        action: 2,
        ..Default::default()
    };
    assert_eq!(
        invoke_request_from_pb("x", &r, "operator").unwrap_err(),
        ConvertError("action 2 is not valid".into())
    );
}

#[test]
fn posts_are_read_without_meta() {
    let p = pb::PostMessage {
        conversation: "channel.shared".into(),
        author: "pi".into(),
        body: "hello".into(),
        class: pb::MessageClass::Status as i32,
        reply_to: Some("msg_1".into()),
    };
    assert_eq!(
        post_from_pb(&p).unwrap(),
        PostMessage {
            conversation: "channel.shared".into(),
            author: "pi".into(),
            body: "hello".into(),
            class: MessageClass::Status,
            reply_to: Some("msg_1".into()),
            meta: MessageMeta::default(),
        }
    );
    let empty = post_from_pb(&pb::PostMessage::default()).unwrap();
    assert_eq!(empty.author, "");
    assert_eq!(empty.class, MessageClass::Agent);

    let p = pb::PostMessage {
        class: -3,
        ..Default::default()
    };
    assert_eq!(
        post_from_pb(&p).unwrap_err(),
        ConvertError("message class -3 is not valid".into())
    );
}
