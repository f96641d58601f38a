//! A tmux server of a test's own: a socket name no other test or person uses, started
//! on demand by the first command, and killed (with every pane on it) on drop, its
//! socket file removed.

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
        let out = self.run(&["list-panes", "-a", "-F", "#{pane_id}"]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for TmuxServer {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
        // tmux leaves its socket file behind: `$TMUX_TMPDIR/tmux-UID/NAME`.
        let dir = std::env::var_os("TMUX_TMPDIR").unwrap_or_else(|| "/tmp".into());
        let uid = rustix::process::getuid().as_raw();
        let _ = std::fs::remove_file(
            Path::new(&dir)
                .join(format!("tmux-{uid}"))
                .join(&self.socket),
        );
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
