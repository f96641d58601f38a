//! tmux panes: interactive agents (a TUI, a REPL, a shell) that a person can watch and
//! type into, driven by Relay through the tmux server rather than a wire protocol.
//!
//! - [`client`]: [`Tmux`], one typed call per tmux command, on one server (an agent's
//!   own, `tmux -L relay@NAME` by default), run from a clean environment.
//! - [`sanitize`]: task text made inert (no escape sequences or control characters
//!   reach a pane; newlines stay).
//! - [`screens`]: what a pane's screen says: ready, held by a screen that needs a
//!   person, or neither yet (the known CLIs' screens, an agent's ready pattern).
//! - `launch`: [`TmuxConfig`] and [`TmuxLauncher`]: how an agent starts in a pane (or
//!   which pane it follows), and the start itself.
//! - `session`: the session behind the seam: readiness, delivery, the turn's end.
//! - `output`: the pane's output, pushed through a FIFO, rendered and sent as deltas;
//!   its program's bracketed paste mode followed.
//!
//! How a session works (facts in `HARNESSES.md`, "tmux panes", and below):
//! - **Start.** `new-session -d` runs the agent's command directly (no shell) in a new
//!   session `relay-NAME` on a server of the agent's own (`tmux -L relay@NAME`; `S@NAME`
//!   for an agent that names socket `S`): a pane's `$TMUX` reaches no other agent's
//!   session, to read its environment or type into it. The pane's process gets the
//!   agent's variables and its access to Relay (`RELAY_AGENT`, `RELAY_URL`,
//!   `RELAY_TOKEN`; `PATH` with the `relay` program); the command reaches tmux on stdin,
//!   so no secret is ever on a command line (tmux gives a new session's process the
//!   client's `PATH`, so the client runs with that `PATH`). The same script removes the
//!   variables from the session's environment, so the server keeps no token or secret
//!   that a process reaching it could read back (`show-environment`). A session of that
//!   name still running (Relay restarted while the agent kept working) is adopted, not
//!   started twice; one left on the server all agents shared before each had its own
//!   (`tmux -L relay`) is ended, and the agent started again on its own. A pane the
//!   agent was attached to (`relay agent attach`) is followed, never started or ended by
//!   Relay. The session is the pane. Own servers keep panes apart, not processes: any
//!   process of the same user can still name another server or read
//!   `/proc/PID/environ`.
//! - **Known CLIs.** `codex` and `claude` started by Relay get Relay's MCP server, as
//!   their app-server twins do (a bare name is the pinned CLI). The codex TUI also gets
//!   `--no-daemon` (else a background app-server outlives the pane), its MCP tools of
//!   Relay's server run without the TUI's approval dialog
//!   (`default_tools_approval_mode="approve"`), and the agent's directory is trusted
//!   (else a "Trust this folder?" dialog holds the pane inside a git repository). Codex
//!   is interrupted with `Escape`: a `C-c` at its empty prompt quits it.
//! - **Output, pushed.** `pipe-pane -O` runs a `cat` into a FIFO in a private (0700)
//!   temporary directory, which the session reads as the pane prints: no polling of
//!   `capture-pane`. For a pane Relay starts, the pipe is set in the same tmux script as
//!   the session, before tmux reads the pane's first byte. Once both ends are open the
//!   FIFO and its directory are removed, so nothing is left behind, even by a Relay
//!   killed later. The bytes are rendered to plain text by one escape parser across
//!   reads and sent to the running turn as text deltas, coalesced (one per 250 ms at
//!   most). tmux closes the pipe when the pane goes; the reader then reports
//!   `ProcessExited` with the pane's last lines (a pane's exit status is not known).
//! - **Ready.** Relay pastes only into a pane ready for a task, judged from its screen
//!   (`capture-pane`) by [`screens`]: the codex and claude TUIs' ready screens (their
//!   prompt) when Relay started one, else the agent's ready pattern (a regular
//!   expression); a pane neither judges is ready once it showed something and was then
//!   quiet for 300 ms (busy past the confirm timeout, it gets the task anyway). A known
//!   CLI at a screen that needs a person (sign-in, folder trust, first-run setup, an API
//!   key question) fails the delivery at once with
//!   [`HarnessError::NotReady`](crate::HarnessError::NotReady), saying which screen and
//!   how to get past it; a judged pane not ready within the ready timeout (30 s) fails
//!   the same way with its screen's last lines. Nothing is pasted then.
//! - **Start refused.** A pane Relay starts runs the agent's command; a shell only when
//!   the agent asked for one ([`PaneSpec::shell`](relay_protocol::domain::PaneSpec::shell)).
//! - **Delivery.** The sanitised task,
//!   followed by its flight and how to answer ([`task_text`]), is loaded from stdin into
//!   a named buffer and pasted with `paste-buffer -p -d` (bracketed paste when the
//!   program asked for it, so newlines are text, not submits); the submit key is a
//!   separate step. A task of several lines goes only to a program that has bracketed
//!   paste on: tmux 3.3 shows the mode in no format, so Relay follows it in the pane's
//!   output (`CSI ? 2004 h`/`l`), and remembers it on the pane (`@relay_bracketed_paste`)
//!   for a Relay that restarts and adopts it. To any other program (or one whose mode
//!   Relay has not seen), it is refused with why, nothing pasted: its line breaks
//!   would arrive as Enters, each a submit or a command of its own. The task counts as taken when, after the key, the pane printed and
//!   its screen changed (text or cursor) with no collapsed paste (`[Pasted Content N
//!   chars]`, `[Pasted text #N]`) left in an input box; the key is sent once more
//!   otherwise, and then delivery fails with [`HarnessError::Stalled`](crate::HarnessError::Stalled).
//! - **The answer.** A pane says nothing of its turns: a turn ends when the agent
//!   answers through Relay (`relay reply FLIGHT TEXT`, or the MCP `reply` tool with the
//!   flight), which reaches [`HarnessSession::reply`](crate::HarnessSession::reply) and
//!   completes the turn with that text; or at its timeout (the runtime's), or by
//!   interrupt (`C-c`). No steer, approvals, resume or turn ids
//!   ([`Harness::Tmux`](relay_protocol::domain::Harness::Tmux)'s capabilities).

pub mod client;
mod launch;
mod output;
pub mod sanitize;
pub mod screens;
mod session;

pub use client::Tmux;
pub use output::PaneText;

/// The last `lines` lines `pane` of server `socket` shows (its screen and the history
/// above it), as plain text: no escape codes or control characters, trailing blank
/// lines dropped (`relay agent peek`).
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
pub use launch::{session_name, task_text, TmuxConfig, TmuxLauncher, DEFAULT_SOCKET, TMUX_INFO};
