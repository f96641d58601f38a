//! The agent CLIs Relay pins ([`CODEX_CLI`], [`CLAUDE_CLI`], [`PI_CLI`], and the ACP
//! agents [`GEMINI_CLI`], [`OPENCODE_CLI`], [`QWEN_CLI`], with the version each is tested
//! against), and where each one's program is: the one an agent names, an
//! override variable, the pinned version the README's set-up installs, or the one on
//! `PATH`. They live here, not in their adapters, because two adapters drive the same
//! CLI (its machine mode, and its TUI in a tmux pane) and adapters do not import each
//! other. `ops/setup.sh` reads the versions from this file.

use std::path::{Path, PathBuf};

/// Where the set-up installs the pinned CLIs: `RELAY_AGENTS_DIR`, else
/// `$XDG_CACHE_HOME/relay/agents`, else `~/.cache/relay/agents` (as `ops/setup.sh`).
pub fn agents_dir() -> Option<PathBuf> {
    let set = |name| std::env::var_os(name).filter(|d: &std::ffi::OsString| !d.is_empty());
    set("RELAY_AGENTS_DIR").map(PathBuf::from).or_else(|| {
        set("XDG_CACHE_HOME")
            .map(|c| Path::new(&c).join("relay/agents"))
            .or_else(|| set("HOME").map(|h| Path::new(&h).join(".cache/relay/agents")))
    })
}

/// One pinned agent CLI. The set-up script (`ops/setup.sh`) reads the `version` of each
/// from the adapter's source, installs the npm package into
/// `$RELAY_AGENTS_DIR/<name>-<version>`, and the binary is found there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedCli {
    /// The binary's name ("codex"), also the folder's prefix.
    pub name: &'static str,
    pub version: &'static str,
    /// The variable that names another binary (`RELAY_CODEX_BIN`).
    pub override_env: &'static str,
}

impl PinnedCli {
    /// Where the program is: `explicit` if given (an agent's `--command`), else the
    /// override variable, else the pinned install
    /// `$RELAY_AGENTS_DIR/<name>-<version>/node_modules/.bin/<name>` (`RELAY_AGENTS_DIR`
    /// defaults to [`agents_dir`]) if it exists, else `<name>` from `PATH`.
    pub fn program(&self, explicit: Option<&str>) -> PathBuf {
        if let Some(program) = explicit.filter(|p| !p.is_empty()) {
            return PathBuf::from(program);
        }
        if let Some(program) = std::env::var_os(self.override_env).filter(|p| !p.is_empty()) {
            return PathBuf::from(program);
        }
        if let Some(dir) = agents_dir() {
            let pinned = dir
                .join(format!("{}-{}", self.name, self.version))
                .join("node_modules/.bin")
                .join(self.name);
            if pinned.exists() {
                return pinned;
            }
        }
        PathBuf::from(self.name)
    }
}

/// The Codex version Relay is tested against.
pub const CODEX_VERSION: &str = "0.169.0";

/// The pinned Codex CLI (`RELAY_CODEX_BIN` overrides it).
pub const CODEX_CLI: PinnedCli = PinnedCli {
    name: "codex",
    version: CODEX_VERSION,
    override_env: "RELAY_CODEX_BIN",
};

/// The Claude Code version Relay is tested against.
pub const CLAUDE_VERSION: &str = "2.1.197";

/// The pinned Claude Code CLI (`RELAY_CLAUDE_BIN` overrides it).
pub const CLAUDE_CLI: PinnedCli = PinnedCli {
    name: "claude",
    version: CLAUDE_VERSION,
    override_env: "RELAY_CLAUDE_BIN",
};

/// The Pi version Relay is tested against.
pub const PI_VERSION: &str = "0.73.1";

/// The pinned Pi CLI (`RELAY_PI_BIN` overrides it).
pub const PI_CLI: PinnedCli = PinnedCli {
    name: "pi",
    version: PI_VERSION,
    override_env: "RELAY_PI_BIN",
};

/// The Gemini CLI version Relay is tested against (`--acp`).
pub const GEMINI_VERSION: &str = "0.61.0";

/// The pinned Gemini CLI (`RELAY_GEMINI_BIN` overrides it).
pub const GEMINI_CLI: PinnedCli = PinnedCli {
    name: "gemini",
    version: GEMINI_VERSION,
    override_env: "RELAY_GEMINI_BIN",
};

/// The OpenCode version Relay is tested against (`opencode acp`).
pub const OPENCODE_VERSION: &str = "1.18.33";

/// The pinned OpenCode (`RELAY_OPENCODE_BIN` overrides it).
pub const OPENCODE_CLI: PinnedCli = PinnedCli {
    name: "opencode",
    version: OPENCODE_VERSION,
    override_env: "RELAY_OPENCODE_BIN",
};

/// The Qwen Code version Relay is tested against (`--acp`).
pub const QWEN_VERSION: &str = "0.24.4";

/// The pinned Qwen Code (`RELAY_QWEN_BIN` overrides it).
pub const QWEN_CLI: PinnedCli = PinnedCli {
    name: "qwen",
    version: QWEN_VERSION,
    override_env: "RELAY_QWEN_BIN",
};
