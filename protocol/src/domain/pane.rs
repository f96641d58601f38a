//! A tmux agent's pane: which server it is on, whether Relay starts it or was attached
//! to it, and how Relay tells it is ready for a task.

use serde::{Deserialize, Serialize};

/// The tmux socket Relay's agents' servers are named after (`tmux -L relay@NAME`, one
/// server per agent, [`PaneSpec::server`]), apart from the user's own server.
pub const DEFAULT_TMUX_SOCKET: &str = "relay";

/// The `tmux` arguments that reach server `socket`: `-S PATH` for a path (it holds a
/// `/`), else `-L NAME`.
pub fn tmux_socket_args(socket: &str) -> [&str; 2] {
    match socket.contains('/') {
        true => ["-S", socket],
        false => ["-L", socket],
    }
}

/// Where a tmux agent lives, and how Relay tells that its pane is ready for a task.
/// Every field has a default (a registration may give `"pane": {"shell": true}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PaneSpec {
    /// The tmux server: a socket name (`tmux -L NAME`; Relay's own is
    /// [`DEFAULT_TMUX_SOCKET`], the user's usual one is `default`) or a socket path
    /// (`tmux -S PATH`, when it holds a `/`).
    pub socket: String,
    /// A pane started outside Relay that this agent was attached to (`%3`, or
    /// `session:window.pane`): Relay follows it and never ends it. `None`: Relay starts
    /// the agent's command in a session of its own (`relay-NAME`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// A regular expression (Rust `regex` syntax, at most 1024 bytes) that the pane's
    /// screen matches when its program is ready for a task (`^agent>\z`): searched in
    /// the visible screen with each line's trailing spaces removed, `^`/`$` matching at
    /// line ends and `\z` after the last non-blank line. Relay pastes only once it
    /// matches, and fails the flight with the screen's last lines when it does not
    /// within the ready timeout. `None`: the codex and claude TUIs' own ready screens
    /// when the pane runs one, else the pane is ready once its output is quiet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_pattern: Option<String>,
    /// The pane runs a shell, asked for explicitly (`relay agent add --shell`): each
    /// task is typed into it and runs as shell commands. A tmux agent that Relay starts
    /// names its program (`command`) or asks for this; with neither it is refused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shell: bool,
}

impl Default for PaneSpec {
    fn default() -> Self {
        PaneSpec {
            socket: DEFAULT_TMUX_SOCKET.to_string(),
            target: None,
            ready_pattern: None,
            shell: false,
        }
    }
}

impl PaneSpec {
    /// The `tmux` arguments that reach this server (`-L NAME` or `-S PATH`).
    pub fn socket_args(&self) -> [&str; 2] {
        tmux_socket_args(&self.socket)
    }

    /// Why this spec cannot be used, if it cannot: a socket is a name of `[A-Za-z0-9_.-]`
    /// or an absolute path, a target a pane id (`%3`) or `session:window.pane`, each
    /// without spaces or control characters and at most 256 bytes.
    pub fn problem(&self) -> Option<String> {
        let plain = |s: &str| {
            !s.is_empty()
                && s.len() <= 256
                && !s.starts_with('-')
                && !s.chars().any(|c| c.is_control() || c.is_whitespace())
        };
        let socket_ok = plain(&self.socket)
            && (self.socket.starts_with('/')
                || self
                    .socket
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b)));
        if !socket_ok {
            return Some(format!(
                "tmux socket {:?} is neither a name ([A-Za-z0-9_.-]) nor an absolute path",
                self.socket
            ));
        }
        match &self.target {
            Some(t) if !plain(t) => Some(format!(
                "pane {t:?} is not a tmux pane (a pane id like %3, or session:window.pane)"
            )),
            _ => None,
        }
    }

    /// The tmux server agent `agent`'s pane is on: the one given, for a pane it was
    /// attached to; for a pane Relay starts, a server of the agent's own, `SOCKET@NAME`
    /// (`relay@tm-1`; `/dir/sock@tm-1` for a path). Its own server is what keeps agents
    /// apart: a pane's `$TMUX` reaches no other agent's session (its environment, its
    /// keys). `@` is in neither a socket name nor an agent name, so two agents never
    /// share one.
    pub fn server(&self, agent: &str) -> String {
        match self.target {
            Some(_) => self.socket.clone(),
            None => format!("{}@{agent}", self.socket),
        }
    }

    /// How a person looks at `pane` of agent `agent`'s server ([`server`](Self::server)):
    /// `tmux -L relay@tm-1 attach -t %3`.
    pub fn attach_hint(&self, agent: &str, pane: &str) -> String {
        let server = self.server(agent);
        let [flag, socket] = tmux_socket_args(&server);
        format!("tmux {flag} {socket} attach -t {pane}")
    }
}
