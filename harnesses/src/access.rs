//! How an agent's session reaches Relay: [`RelayAccess`], handed to every launcher.
//!
//! An agent asks other agents, posts and reads through the same broker API as a person,
//! with a token scoped to itself (the broker refuses it anything else). The session's
//! process gets it in its environment ([`RelayAccess::env`]), so `relay ask OTHER TEXT`
//! works from the agent's shell; a CLI that hosts MCP servers (Codex, Claude Code) also
//! gets `relay mcp` wired into its configuration by its adapter, because a sandboxed
//! shell (Codex's) cannot open a socket while the MCP servers the CLI hosts can.
//!
//! There is no `RELAY_FLIGHT` in a persistent session's environment: one process serves
//! many turns, so a flight id fixed at spawn would be wrong from the second turn on. An
//! agent runs one turn at a time, so the broker links what an agent's token asks to the
//! flight that agent is running (see the broker's `http::auth`).

use std::path::PathBuf;

/// The agent's name.
pub const AGENT_ENV: &str = "RELAY_AGENT";
/// The broker's API URL (loopback).
pub const URL_ENV: &str = "RELAY_URL";
/// The agent's scoped token.
pub const TOKEN_ENV: &str = "RELAY_TOKEN";
/// The `relay` program, for scripts that cannot count on `relay` being on `PATH`.
pub const BIN_ENV: &str = "RELAY_BIN";

/// The name Relay's own MCP server (`relay mcp`) has in an agent CLI's configuration: its
/// tools reach the model as `mcp__relay__<tool>` (Claude Code) or in the `mcp__relay`
/// namespace (Codex), and the adapters let them run without asking a person (the
/// scoped token bounds what they can do).
pub const MCP_SERVER: &str = "relay";

/// The variables `relay mcp` reads, which an agent CLI that does not pass its whole
/// environment to its MCP servers (Codex) must be told to pass on.
pub const MCP_ENV: [&str; 3] = [AGENT_ENV, URL_ENV, TOKEN_ENV];

/// How long Codex lets one call of a Relay tool run: an `ask` waits for another agent's
/// whole turn, far beyond Codex's default of 60 s. The ask's own `timeout_secs` (or an
/// interrupt of the asking flight) is what bounds it.
const CODEX_TOOL_TIMEOUT_SECS: u64 = 24 * 3600;

/// Everything an agent's session needs to reach Relay as that agent. Its `Debug` hides
/// the token.
#[derive(Clone, PartialEq, Eq)]
pub struct RelayAccess {
    pub agent: String,
    /// The broker's API, `http://127.0.0.1:PORT`.
    pub url: String,
    /// The agent's scoped token (a secret).
    pub token: String,
    /// The `relay` program (for `relay mcp`, and put on the session's `PATH`).
    pub program: PathBuf,
}

impl std::fmt::Debug for RelayAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayAccess")
            .field("agent", &self.agent)
            .field("url", &self.url)
            .field("token", &"***")
            .field("program", &self.program)
            .finish()
    }
}

impl RelayAccess {
    /// The variables the session's process gets: who it is, where the broker is, its
    /// token and the `relay` program.
    pub fn env(&self) -> [(&'static str, String); 4] {
        [
            (AGENT_ENV, self.agent.clone()),
            (URL_ENV, self.url.clone()),
            (TOKEN_ENV, self.token.clone()),
            (BIN_ENV, self.program.display().to_string()),
        ]
    }

    /// The command line of Relay's MCP server for this agent: the `relay` program and
    /// its arguments. No secret is on it: the token reaches `relay mcp` through the
    /// environment ([`MCP_ENV`]).
    pub fn mcp_command(&self) -> (String, Vec<String>) {
        (self.program.display().to_string(), vec!["mcp".to_string()])
    }

    /// Relay's MCP server for any `codex` command line (the app-server's, a TUI's in a
    /// tmux pane), as `-c mcp_servers.relay.*` overrides: the `relay` program, `mcp`, and
    /// the variables Codex must pass it, since it gives an MCP server only a few of its
    /// own (the token stays in the environment, never on the command line). Here, not in
    /// the `codex` adapter, because the `tmux` adapter gives it to the Codex TUI too.
    pub fn codex_mcp_args(&self) -> Vec<String> {
        let (program, program_args) = self.mcp_command();
        let server = format!("mcp_servers.{MCP_SERVER}");
        // A JSON string or list of strings is a TOML one too, and Codex parses the value
        // of `-c` as TOML.
        let toml = |v: serde_json::Value| v.to_string();
        let mut args = Vec::new();
        for (key, value) in [
            ("command", toml(program.into())),
            ("args", toml(program_args.into())),
            ("env_vars", toml(MCP_ENV.to_vec().into())),
            ("tool_timeout_sec", CODEX_TOOL_TIMEOUT_SECS.to_string()),
        ] {
            args.extend(["-c".to_string(), format!("{server}.{key}={value}")]);
        }
        args
    }

    /// Relay's MCP server for any `claude` command line (stream-json's, a TUI's in a tmux
    /// pane): `--mcp-config` with the `relay` program and `mcp`, no secret. Here for the
    /// same reason as [`RelayAccess::codex_mcp_args`].
    pub fn claude_mcp_args(&self) -> [String; 2] {
        let (program, program_args) = self.mcp_command();
        let servers = serde_json::json!({ "mcpServers": { (MCP_SERVER): {
            "type": "stdio",
            "command": program,
            "args": program_args,
        }}});
        ["--mcp-config".to_string(), servers.to_string()]
    }

    /// `path` (a `PATH` value) with the directory of the `relay` program appended when it
    /// is not there yet, so `relay` runs from the agent's shell without shadowing
    /// anything the user put first.
    pub fn path_with_relay(&self, path: Option<&str>) -> String {
        let dir = self
            .program
            .parent()
            .map(|d| d.display().to_string())
            .unwrap_or_default();
        let path = path.unwrap_or_default();
        if dir.is_empty() || std::env::split_paths(path).any(|p| p.display().to_string() == dir) {
            return path.to_string();
        }
        if path.is_empty() {
            dir
        } else {
            format!("{path}:{dir}")
        }
    }
}

/// Makes each agent's [`RelayAccess`]; the broker holds the key its tokens come from.
/// `None` for an agent: its session runs without access to Relay.
#[derive(Clone)]
pub struct AccessIssuer(std::sync::Arc<IssueFn>);

type IssueFn = dyn Fn(&str) -> Option<RelayAccess> + Send + Sync;

impl AccessIssuer {
    pub fn new(f: impl Fn(&str) -> Option<RelayAccess> + Send + Sync + 'static) -> Self {
        AccessIssuer(std::sync::Arc::new(f))
    }

    pub fn for_agent(&self, agent: &str) -> Option<RelayAccess> {
        (self.0)(agent)
    }
}

impl std::fmt::Debug for AccessIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AccessIssuer")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access() -> RelayAccess {
        RelayAccess {
            agent: "a".into(),
            url: "http://127.0.0.1:1".into(),
            token: "secret".into(),
            program: "/opt/relay/bin/relay".into(),
        }
    }

    #[test]
    fn debug_hides_the_token() {
        let shown = format!("{:?}", access());
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("http://127.0.0.1:1"), "{shown}");
    }

    #[test]
    fn the_relay_directory_is_appended_to_path_once() {
        let a = access();
        assert_eq!(
            a.path_with_relay(Some("/usr/bin")),
            "/usr/bin:/opt/relay/bin"
        );
        assert_eq!(
            a.path_with_relay(Some("/opt/relay/bin:/usr/bin")),
            "/opt/relay/bin:/usr/bin"
        );
        assert_eq!(a.path_with_relay(None), "/opt/relay/bin");
    }
}
