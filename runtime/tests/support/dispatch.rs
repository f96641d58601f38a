//! The dispatch every runtime test builds; also compiled into the worker's unit tests
//! (`src/worker/queue.rs`, by path), so it is written once.

use relay_protocol::domain::{Agent, AgentSpec, AgentState, Flight, Harness, Invocation};
use relay_protocol::runtime::Dispatch;

/// A dispatch of `flight` to agent `a1` on `harness`.
pub fn dispatch(harness: Harness, flight: &str, task: &str) -> Dispatch {
    let invocation = Invocation {
        id: format!("inv_{flight}"),
        requester: "operator".into(),
        target: "a1".into(),
        action: Default::default(),
        task: task.into(),
        conversation: "direct.a1.operator".into(),
        request_message: format!("msg_{flight}"),
        parent_flight: None,
        depth: 0,
        timeout_ms: None,
        created_at: 0,
    };
    Dispatch {
        agent: Agent {
            worktree: None,
            spec: AgentSpec::new("a1", harness, "/work"),
            state: AgentState::Offline,
            session_id: None,
            thread_id: None,
            endpoint: None,
            state_reason: None,
            note: None,
            program: None,
            created_at: 0,
            updated_at: 0,
        },
        flight: Flight::queued(flight, &invocation),
        invocation,
    }
}
