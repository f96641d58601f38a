//! A tmux server of a test's own: a socket name no other test or person uses, started
//! on demand by the first command, and killed (with every pane on it) on drop, its
//! socket file removed; with it the servers of the agents Relay starts on it (each
//! agent's own, `SOCKET@NAME`).

#![allow(clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

/// One tmux server, `tmux -L relay-test-<uuid>`.
pub struct TmuxServer {
    socket: String,
}

impl Default for TmuxServer {
    fn default() -> Self {
        Self::new()
    }
}

impl TmuxServer {
    pub fn new() -> TmuxServer {
        TmuxServer {
            socket: format!("relay-test-{}", uuid::Uuid::new_v4().simple()),
        }
    }

    /// The socket name (`-L`).
    pub fn socket(&self) -> &str {
        &self.socket
    }

    /// Runs `tmux -L SOCKET -f /dev/null ARGS` (no configuration file).
    pub fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .args(["-L", &self.socket, "-f", "/dev/null"])
            .args(args)
            .output()
            .expect("tmux runs")
    }

    /// [`run`](Self::run), asserting success; its stdout, trimmed.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// What `pane` shows now, lines joined, no escape codes.
    pub fn capture(&self, pane: &str) -> String {
        self.ok(&["capture-pane", "-p", "-J", "-t", pane])
    }

    /// The ids of the panes on this server.
    pub fn panes(&self) -> Vec<String> {
        panes(&self.socket)
    }

    /// The server of agent `agent`'s pane when Relay starts it on this one
    /// (`SOCKET@NAME`).
    pub fn agent_socket(&self, agent: &str) -> String {
        format!("{}@{agent}", self.socket)
    }

    /// What `pane` of agent `agent`'s server shows now, lines joined, no escape codes.
    pub fn agent_capture(&self, agent: &str, pane: &str) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.agent_socket(agent)])
            .args(["capture-pane", "-p", "-J", "-t", pane])
            .output()
            .expect("tmux runs");
        assert!(out.status.success(), "capture-pane: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// The ids of the panes on agent `agent`'s server.
    pub fn agent_panes(&self, agent: &str) -> Vec<String> {
        panes(&self.agent_socket(agent))
    }
}

/// The ids of the panes on server `socket`.
fn panes(socket: &str) -> Vec<String> {
    let out = Command::new("tmux")
        .args(["-L", socket, "list-panes", "-a", "-F", "#{pane_id}"])
        .output()
        .expect("tmux runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Where tmux keeps the sockets named with `-L`: `$TMUX_TMPDIR/tmux-UID`.
fn socket_dir() -> std::path::PathBuf {
    let dir = std::env::var_os("TMUX_TMPDIR").unwrap_or_else(|| "/tmp".into());
    let uid = rustix::process::getuid().as_raw();
    Path::new(&dir).join(format!("tmux-{uid}"))
}

impl Drop for TmuxServer {
    fn drop(&mut self) {
        let dir = socket_dir();
        let agents = format!("{}@", self.socket);
        let mut sockets = vec![self.socket.clone()];
        if let Ok(entries) = std::fs::read_dir(&dir) {
            sockets.extend(
                entries
                    .filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|name| name.starts_with(&agents)),
            );
        }
        for socket in sockets {
            let _ = Command::new("tmux")
                .args(["-L", &socket, "kill-server"])
                .output();
            // tmux leaves its socket file behind.
            let _ = std::fs::remove_file(dir.join(&socket));
        }
    }
}

/// A task that tries every way out of a paste that would make a pane run
/// `touch <canary>`: a bracketed-paste end marker (7-bit and C1), a title escape,
/// control characters (Ctrl-C, Ctrl-D, a carriage return that would submit the line),
/// command substitution. Returns it and the plain text it must arrive as.
pub fn hostile_task(canary: &Path) -> (String, String) {
    let c = canary.display();
    let task = format!(
        "first\x1b[201~; touch {c}\n\
         \u{9b}201~touch {c}\n\
         \x1b]0;owned\x07title\x1b[2J\n\
         \x03\x04x\rtouch {c}\n\
         $(touch {c}); rm -rf {c}"
    );
    let inert =
        format!("first; touch {c}\ntouch {c}\ntitle\nx\ntouch {c}\n$(touch {c}); rm -rf {c}");
    (task, inert)
}
