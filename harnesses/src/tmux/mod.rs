//! tmux panes: interactive agents (a TUI, a REPL, a shell) that a person can watch and
//! type into, driven by Relay through the tmux server rather than a wire protocol.
//!
//! - [`client`]: [`Tmux`], one typed call per tmux command, on a socket of its own
//!   (`tmux -L relay` by default), run from a clean environment.
//! - [`sanitize`]: task text made inert (no escape sequences or control characters
//!   reach a pane; newlines stay).
//! - `session`: [`TmuxLauncher`] and the session behind the seam.
//!
//! How a session works (facts in `HARNESSES.md`, "tmux panes"):
//! - **Start.** `new-session -d` runs the agent's command directly (no shell) in a new
//!   session, with the agent's variables and its access to Relay (`RELAY_AGENT`,
//!   `RELAY_URL`, `RELAY_TOKEN`) set in the pane with `-e`; the command reaches tmux on
//!   stdin, so no secret is ever on a command line. The conversation is the pane.
//! - **Output, pushed.** `pipe-pane -O` runs a `cat` into a FIFO in a private temporary
//!   directory, which the session reads as the pane prints: no polling of
//!   `capture-pane`. The bytes are rendered to plain text by one escape parser across
//!   reads and sent to the running turn as text deltas, coalesced (one per 250 ms at
//!   most). tmux closes the pipe when the pane goes; the reader then reports
//!   `ProcessExited` with the pane's last lines (a pane's exit status is not known).
//! - **Delivery.** The sanitised task is loaded from stdin into a named buffer and
//!   pasted with `paste-buffer -p -d` (bracketed paste when the program asked for it, so
//!   newlines are text, not submits), then the submit key is sent as a separate step.
//!   The task counts as taken when the pane prints after the submit key (the paste's own
//!   echo is let pass first); the key is sent once more otherwise, and then delivery
//!   fails with [`HarnessError::Stalled`](crate::HarnessError::Stalled).
//! - **Interrupt** is `C-c`. No steer, approvals, resume or turn ids
//!   ([`Harness::Tmux`](relay_protocol::domain::Harness::Tmux)'s capabilities).

pub mod client;
pub mod sanitize;
mod session;

pub use client::Tmux;

/// The last `lines` lines `pane` of server `socket` shows (its screen and the history
/// above it), as plain text: no escape codes or control characters, trailing blank
/// lines dropped (`relay peek`).
pub async fn peek(
    socket: &str,
    pane: &str,
    lines: usize,
) -> Result<Vec<String>, crate::HarnessError> {
    let history = u32::try_from(lines).unwrap_or(u32::MAX);
    let text = Tmux::new(socket).capture_history(pane, history).await?;
    let mut all: Vec<String> = sanitize::sanitize(&text)
        .split('\n')
        .map(|line| line.trim_end().to_string())
        .collect();
    while all.last().is_some_and(|l| l.is_empty()) {
        all.pop();
    }
    let skip = all.len().saturating_sub(lines);
    Ok(all.split_off(skip))
}
pub use session::{session_name, task_text, TmuxConfig, TmuxLauncher, DEFAULT_SOCKET, TMUX_INFO};
