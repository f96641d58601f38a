//! What the broker refused for overload, counted for `/metrics`
//! (`relay_overloaded_total{what}`): atomics only, so counting costs the refusing path
//! (the writer's queue, the HTTP server's accept loop) nothing it would wait on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Refusals by what was full. Cheap to clone (one `Arc`); every clone counts into the
/// same atomics.
#[derive(Debug, Clone, Default)]
pub struct Refusals {
    inner: Arc<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    command_queue: AtomicU64,
    agent_queue: AtomicU64,
    connections: AtomicU64,
    streams: AtomicU64,
}

/// What was full, as `relay_overloaded_total`'s `what` label names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The writer's command queue (a client's command answered `overloaded`).
    CommandQueue,
    /// An agent's queue of flights (an invocation refused `agent_queue_full`).
    AgentQueue,
    /// The HTTP server's connection slots.
    Connections,
    /// An agent token's cap on open SSE streams.
    Streams,
}

impl Full {
    pub const ALL: [Full; 4] = [
        Full::CommandQueue,
        Full::AgentQueue,
        Full::Connections,
        Full::Streams,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Full::CommandQueue => "command_queue",
            Full::AgentQueue => "agent_queue",
            Full::Connections => "connections",
            Full::Streams => "streams",
        }
    }
}

impl Refusals {
    pub fn count(&self, what: Full) {
        self.counter(what).fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self, what: Full) -> u64 {
        self.counter(what).load(Ordering::Relaxed)
    }

    fn counter(&self, what: Full) -> &AtomicU64 {
        let c = &self.inner;
        match what {
            Full::CommandQueue => &c.command_queue,
            Full::AgentQueue => &c.agent_queue,
            Full::Connections => &c.connections,
            Full::Streams => &c.streams,
        }
    }
}
