//! What the wires' tests share (`claude/wire/tests.rs`, `pi/wire/tests.rs`): feeding a
//! [`Wire`] the stdout lines recorded from its real CLI (the `.jsonl` fixtures), sorting
//! the actions it gives back, and the events one turn, [`TURN`], is expected to give.

use relay_protocol::harness::{HarnessEvent, ItemKind, TurnOutcome};
use serde_json::Value;

use crate::stdio::{Action, Wire};

/// The turn every wire test runs.
pub(crate) const TURN: &str = "t1";

/// Feeds `lines` to `wire` up to and including the first one that holds `stop` (all of
/// them if none does) and returns the actions; the lines after it stay in `lines`. Empty
/// lines are skipped, as the stdio owner skips them.
pub(crate) fn feed_until(
    wire: &mut impl Wire,
    lines: &mut std::str::Lines<'_>,
    stop: &str,
) -> Vec<Action> {
    let mut out = Vec::new();
    for line in lines.by_ref().filter(|l| !l.is_empty()) {
        wire.line(line, &mut out);
        if line.contains(stop) {
            break;
        }
    }
    out
}

/// Feeds every line left in `lines` to `wire` and returns the actions.
pub(crate) fn feed_rest(wire: &mut impl Wire, lines: &mut std::str::Lines<'_>) -> Vec<Action> {
    let mut out = Vec::new();
    for line in lines.filter(|l| !l.is_empty()) {
        wire.line(line, &mut out);
    }
    out
}

/// Feeds every line of `text` (a fixture) to `wire` and returns the actions.
pub(crate) fn feed(wire: &mut impl Wire, text: &str) -> Vec<Action> {
    feed_rest(wire, &mut text.lines())
}

/// The events among `actions`, in order; the other actions are skipped.
pub(crate) fn events_of(actions: &[Action]) -> Vec<HarnessEvent> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Event(e) => Some(e.clone()),
            _ => None,
        })
        .collect()
}

/// The lines the wire wrote back at once ([`Action::Send`]), in order.
pub(crate) fn sent(actions: &[Action]) -> Vec<Value> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Send(message) => Some(message.clone()),
            _ => None,
        })
        .collect()
}

pub(crate) fn turn_started() -> HarnessEvent {
    HarnessEvent::TurnStarted {
        turn_id: TURN.into(),
    }
}

pub(crate) fn item_started(item_id: &str, kind: ItemKind) -> HarnessEvent {
    HarnessEvent::ItemStarted {
        turn_id: TURN.into(),
        item_id: item_id.into(),
        kind,
    }
}

pub(crate) fn item_completed(item_id: &str, kind: ItemKind, text: &str) -> HarnessEvent {
    HarnessEvent::ItemCompleted {
        turn_id: TURN.into(),
        item_id: item_id.into(),
        kind,
        text: Some(text.into()),
        exit_code: None,
    }
}

pub(crate) fn delta(item_id: &str, delta: &str) -> HarnessEvent {
    HarnessEvent::TextDelta {
        turn_id: TURN.into(),
        item_id: item_id.into(),
        delta: delta.into(),
    }
}

pub(crate) fn usage(usage: relay_protocol::domain::TokenUsage) -> HarnessEvent {
    HarnessEvent::TokenUsage {
        turn_id: TURN.into(),
        usage,
    }
}

/// Input and output tokens of `model`, none cached, no cost.
pub(crate) fn tokens(input: u64, output: u64, model: &str) -> relay_protocol::domain::TokenUsage {
    relay_protocol::domain::TokenUsage {
        model: Some(model.into()),
        ..relay_protocol::domain::TokenUsage::new(input, output)
    }
}

/// The same with a harness's cost.
pub(crate) fn priced(
    input: u64,
    output: u64,
    model: &str,
    micro_usd: u64,
) -> relay_protocol::domain::TokenUsage {
    relay_protocol::domain::TokenUsage {
        cost_micro_usd: Some(micro_usd),
        cost_source: Some(relay_protocol::domain::CostSource::Harness),
        ..tokens(input, output, model)
    }
}

pub(crate) fn completed(outcome: TurnOutcome) -> HarnessEvent {
    HarnessEvent::TurnCompleted {
        turn_id: TURN.into(),
        outcome,
    }
}
