//! The domain: agents, conversations, messages, invocations, flights, deliveries,
//! bindings and approvals, in their serde JSON forms (the CLI, HTTP and sled use these).
//! One module per concern, every type re-exported here:
//!
//! - [`agent`]: agents, their harness, wake policy and approval policy; [`pane`]: a
//!   tmux agent's pane.
//! - [`secrets`]: an agent's secret variables: kept, shown as `***`, recognised.
//! - [`allow`]: who may invoke an agent (its allow list).
//! - [`conversation`]: conversations, messages and conversation ids.
//! - [`mention`]: which `@name`s in a message count, and the rule for an agent's reply.
//! - [`flight`]: invocations, flights, their state machine, changes and updates.
//! - [`delivery`]: deliveries of messages to agents, bindings to outside channels.
//! - [`approval`]: approval requests and decisions.
//! - [`workspace`]: an agent's own git worktree, a flight's commit, a fork.
//! - [`rule`]: remembered decisions (rules made by deciding an approval).
//! - [`usage`]: tokens and cost of flights, their totals, agents' budgets.
//! - [`shared`]: a long text (an answer) shared by the events that carry it, not copied.
//!
//! Timestamps are milliseconds since the Unix epoch ([`crate::clock`]). Ids are opaque
//! strings.

pub mod agent;
pub mod allow;
pub mod approval;
pub mod conversation;
pub mod delivery;
pub mod flight;
pub mod mention;
pub mod pane;
pub mod rule;
pub mod secrets;
pub mod shared;
pub mod usage;
pub mod workspace;

pub use agent::*;
pub use allow::*;
pub use approval::*;
pub use conversation::*;
pub use delivery::*;
pub use flight::*;
pub use mention::{parse_mentions, MentionSkip};
pub use pane::*;
pub use rule::*;
pub use secrets::*;
pub use shared::SharedStr;
pub use usage::*;
pub use workspace::*;

/// Cuts `text` to at most `max` bytes, at a char boundary; `true` if it was cut.
pub fn truncate_bytes(text: &mut String, max: usize) -> bool {
    let end = prefix_bytes(text, max).len();
    if end == text.len() {
        return false;
    }
    text.truncate(end);
    true
}

/// The longest start of `text` of at most `max` bytes that ends on a character boundary
/// (what [`truncate_bytes`] keeps), without copying it.
pub fn prefix_bytes(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_whole_chars() {
        let mut s = "héllo".to_string();
        assert!(truncate_bytes(&mut s, 2));
        assert_eq!(s, "h");
        let mut s = "abc".to_string();
        assert!(!truncate_bytes(&mut s, 3));
        assert_eq!(s, "abc");
    }
}
