//! The dashboard's view of the contract: `broker/web/api.gen.js`, an ES module of the
//! method table's routes and the wire names of the enums the page branches on, written
//! from [`super::METHODS`] and the enums' `ALL` lists. The file is checked in (the page
//! is served from `include_str!`, with no build step); a test in the broker compares it
//! with what [`dashboard_constants`] writes now and fails, saying how to regenerate it,
//! when the table changed and the file did not ([`check`]).

use std::fmt::Write as _;

use super::Method;
use crate::api::ErrorCode;
use crate::domain::{
    AgentState, ApprovalDecision, ApprovalState, FlightState, Harness, OnBudget, WakePolicy,
};

/// Where the generated file lives, from the workspace root.
pub const PATH: &str = "broker/web/api.gen.js";
/// The command that rewrites it.
pub const REGENERATE: &str = "RELAY_REGENERATE=1 cargo test -p relay-broker --test method_table";

/// The text of `broker/web/api.gen.js` for `methods`.
pub fn dashboard_constants(methods: &[Method]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "// Generated from relay_protocol::methods (protocol/src/methods.rs); do not edit.\n// Regenerate: {REGENERATE}\n"
    );
    out.push_str("/** Every API method: its HTTP verb and route (`{name}` is a parameter). */\n");
    out.push_str("export const METHODS = Object.freeze({\n");
    for m in methods {
        let _ = writeln!(
            out,
            "  {:?}: Object.freeze({{ verb: {:?}, route: {:?}, stream: {} }}),",
            m.name,
            m.verb.as_str(),
            m.route,
            m.answer == super::Answer::Stream
        );
    }
    out.push_str("});\n\n");
    let enums: [(&str, &str, Vec<&str>); 9] = [
        (
            "FLIGHT_STATES",
            "A flight's states.",
            FlightState::ALL.iter().map(|s| s.as_str()).collect(),
        ),
        (
            "LIVE_FLIGHT_STATES",
            "The flight states that are not terminal.",
            FlightState::ALL
                .iter()
                .filter(|s| !s.is_terminal())
                .map(|s| s.as_str())
                .collect(),
        ),
        (
            "AGENT_STATES",
            "An agent's states.",
            AgentState::ALL.iter().map(|s| s.as_str()).collect(),
        ),
        (
            "APPROVAL_STATES",
            "An approval's states.",
            ApprovalState::ALL.iter().map(|s| s.as_str()).collect(),
        ),
        (
            "APPROVAL_DECISIONS",
            "What an approval can be decided as.",
            ApprovalDecision::ALL.iter().map(|s| s.as_str()).collect(),
        ),
        (
            "HARNESSES",
            "The harnesses an agent can be registered with (`relay agent add --harness`).",
            Harness::ALL.iter().map(|s| s.as_str()).collect(),
        ),
        (
            "WAKE_POLICIES",
            "When an agent's session is started (`relay agent add --wake`).",
            WakePolicy::ALL.iter().map(|s| s.as_str()).collect(),
        ),
        (
            "ON_BUDGET",
            "What a running turn does when it crosses its agent's budget (`--on-budget`).",
            OnBudget::ALL.iter().map(|s| s.as_str()).collect(),
        ),
        (
            "ERROR_CODES",
            "The error codes every interface answers with.",
            ErrorCode::ALL.iter().map(|s| s.as_str()).collect(),
        ),
    ];
    for (name, doc, values) in enums {
        let list = values
            .iter()
            .map(|v| format!("{v:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            out,
            "/** {doc} */\nexport const {name} = Object.freeze([{list}]);\n"
        );
    }
    out.push_str(
        "/** The path of method `name` with its `{param}`s filled in from `params`, in order,\n * each percent-encoded. Throws on an unknown method or a wrong number of params. */\nexport function methodPath(name, ...params) {\n  const m = METHODS[name];\n  if (!m) throw new Error(`unknown method ${name}`);\n  let i = 0;\n  const path = m.route.replace(/\\{[a-z_]+\\}/g, () => {\n    if (i >= params.length) throw new Error(`${name} takes more parameters`);\n    return encodeURIComponent(params[i++]);\n  });\n  if (i !== params.length) throw new Error(`${name} takes ${i} parameters`);\n  return path;\n}\n",
    );
    out
}

/// `Ok` when the checked-in file `have` is what the table writes now (`want`); else
/// what differs first, and how to regenerate it.
pub fn check(have: &str, want: &str) -> Result<(), String> {
    if have == want {
        return Ok(());
    }
    let (mut h, mut w) = (have.lines(), want.lines());
    let mut line = 1;
    loop {
        match (h.next(), w.next()) {
            (Some(a), Some(b)) if a == b => line += 1,
            (a, b) => {
                return Err(format!(
                    "{PATH} is stale: line {line} is {:?}, the method table writes {:?}; regenerate it: {REGENERATE}",
                    a.unwrap_or("(end of file)"),
                    b.unwrap_or("(end of file)")
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::super::{MethodId, METHODS};
    use super::*;

    #[test]
    fn every_method_and_enum_value_is_written() {
        let js = dashboard_constants(METHODS);
        for m in METHODS {
            assert!(
                js.contains(&format!("{:?}: Object.freeze", m.name)),
                "{}",
                m.name
            );
        }
        assert!(js.contains("\"running\""));
        assert!(js.contains("export function methodPath("));
    }

    #[test]
    fn the_check_names_the_first_difference() {
        let js = dashboard_constants(METHODS);
        assert_eq!(check(&js, &js), Ok(()));
        let mut moved = METHODS.to_vec();
        moved[MethodId::FlightSteer as usize].route = "/v1/flights/{id}/nudge";
        let err = check(&js, &dashboard_constants(&moved)).unwrap_err();
        assert!(err.contains("/v1/flights/{id}/nudge"), "{err}");
        assert!(err.contains(REGENERATE), "{err}");
        let shorter = &js[..js.len() / 2];
        assert!(check(shorter, &js).is_err());
    }
}
