//! How an agent CLI is started: [`CliConfig`], the same for every harness over pipes
//! (Codex, Claude Code, Pi); each adapter adds its own arguments to the command line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use relay_protocol::domain::AgentSpec;

use crate::access::RelayAccess;
use crate::error::HarnessError;
use crate::pinned::PinnedCli;
use crate::process::ProcessSpec;

/// How to start an agent's CLI. Its `Debug` names the variables of `env` but never shows
/// their values (an agent's secrets are among them).
#[derive(Clone)]
pub struct CliConfig {
    /// The program; see [`PinnedCli::program`].
    pub program: PathBuf,
    /// The agent's own arguments, placed by the adapter among its own.
    pub args: Vec<String>,
    /// The agent's variables, on top of the few inherited from Relay
    /// ([`crate::process::INHERITED_ENV`]).
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    /// The model; `None` leaves it to the CLI's own settings.
    pub model: Option<String>,
    /// How long any request (a handshake, a turn start, a control) may take.
    pub request_timeout: Duration,
    /// On shutdown, how long the CLI gets to exit after stdin closes, and again after
    /// SIGTERM, before its process group is killed.
    pub shutdown_grace: Duration,
    /// How the session reaches Relay as its agent: its variables are in `env` already;
    /// an adapter whose CLI hosts MCP servers wires `relay mcp` in with it.
    pub relay: Option<RelayAccess>,
}

impl std::fmt::Debug for CliConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CliConfig")
            .field("program", &self.program)
            .field("args", &self.args)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("cwd", &self.cwd)
            .field("model", &self.model)
            .field("request_timeout", &self.request_timeout)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("relay", &self.relay)
            .finish()
    }
}

impl CliConfig {
    /// `program`, no extra arguments or variables, default timeouts (30 s a request, 2 s
    /// of grace).
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            env: BTreeMap::new(),
            cwd: None,
            model: None,
            request_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(2),
            relay: None,
        }
    }

    /// How to start `cli` for `agent`: its program (else the pinned one), arguments,
    /// variables with its secrets' values, directory and model, and with `relay`, the
    /// variables that reach Relay as the agent ([`RelayAccess::env`], the `relay`
    /// program's directory at the end of `PATH`).
    pub fn for_agent(agent: &AgentSpec, cli: &PinnedCli, relay: Option<&RelayAccess>) -> Self {
        let mut config = Self::new(cli.program(agent.command.as_deref()));
        config.args = agent.args.clone();
        config.env = agent.env.clone();
        // Secret variables (shown as *** in `env`) with their values.
        config
            .env
            .extend(agent.secrets.0.iter().map(|(k, v)| (k.clone(), v.clone())));
        config.cwd = Some(PathBuf::from(&agent.cwd));
        config.model = agent.model.clone();
        if let Some(relay) = relay {
            let path = config
                .env
                .get("PATH")
                .cloned()
                .or_else(|| std::env::var("PATH").ok());
            config
                .env
                .insert("PATH".into(), relay.path_with_relay(path.as_deref()));
            config
                .env
                .extend(relay.env().map(|(k, v)| (k.to_string(), v)));
            config.relay = Some(relay.clone());
        }
        config
    }

    /// The process to spawn: the program with `args` (the adapter's, with
    /// [`args`](Self::args) placed among them), the variables and the directory.
    pub fn process(&self, args: Vec<String>) -> ProcessSpec {
        ProcessSpec {
            program: self.program.clone(),
            args,
            env: self.env.clone(),
            cwd: self.cwd.clone(),
        }
    }

    /// Whether the program can be started: its directory is there, and it is an
    /// executable file, named by a path or found on the `PATH` the child gets. For adapters whose CLI starts only when the
    /// session is opened, so that `spawn` still fails on a missing program.
    pub fn check_program(&self) -> Result<(), HarnessError> {
        // The directory first: a program cannot start in a missing one, whatever it is.
        if let Some(cwd) = &self.cwd {
            crate::process::check_cwd(cwd)?;
        }
        let spawn_error = |why: &str| HarnessError::Spawn {
            program: self.program.display().to_string(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, why.to_string()),
        };
        if self.program.components().count() > 1 {
            // A relative path is taken from the child's directory.
            let cwd = self.cwd.as_deref().unwrap_or(Path::new("."));
            return match executable(&self.program) || executable(&cwd.join(&self.program)) {
                true => Ok(()),
                false => Err(spawn_error("no executable file there")),
            };
        }
        let path = self
            .env
            .get("PATH")
            .cloned()
            .or_else(|| std::env::var("PATH").ok())
            .unwrap_or_default();
        match std::env::split_paths(&path).any(|dir| executable(&dir.join(&self.program))) {
            true => Ok(()),
            false => Err(spawn_error("not found on PATH")),
        }
    }
}

fn executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use relay_protocol::domain::Harness;

    use super::*;

    const CLI: PinnedCli = PinnedCli {
        name: "relay-test-cli",
        version: "0",
        override_env: "RELAY_TEST_CLI_BIN_UNSET",
    };

    #[test]
    fn an_agent_spec_becomes_the_config_with_its_secrets_never_shown() {
        let mut agent = AgentSpec::new("a1", Harness::ClaudeStreamJson, "/work");
        agent.command = Some("/opt/cli".into());
        agent.args = vec!["--add-dir".into(), "/data".into()];
        agent.env.insert("CONFIG_DIR".into(), "/c".into());
        agent.env.insert("API_KEY".into(), "***".into());
        agent.secrets.0.insert("API_KEY".into(), "s3cret".into());
        agent.model = Some("m".into());
        let config = CliConfig::for_agent(&agent, &CLI, None);
        assert_eq!(config.program, PathBuf::from("/opt/cli"));
        assert_eq!(config.args, agent.args);
        assert_eq!(
            config.env.clone().into_iter().collect::<Vec<_>>(),
            vec![
                ("API_KEY".to_string(), "s3cret".to_string()),
                ("CONFIG_DIR".to_string(), "/c".to_string())
            ]
        );
        assert_eq!(config.cwd, Some(PathBuf::from("/work")));
        assert_eq!(config.model.as_deref(), Some("m"));
        assert!(!format!("{config:?}").contains("s3cret"));
        let spec = config.process(vec!["x".into()]);
        assert_eq!(
            (spec.program, spec.args),
            (PathBuf::from("/opt/cli"), vec!["x".to_string()])
        );
        // Without a command: the pinned install if present, else the name on PATH.
        agent.command = None;
        assert_eq!(
            CliConfig::for_agent(&agent, &CLI, None).program,
            PathBuf::from("relay-test-cli")
        );
    }

    #[test]
    fn a_missing_program_is_a_spawn_error() {
        for program in ["/nonexistent/cli", "relay-no-such-cli"] {
            assert!(
                matches!(
                    CliConfig::new(program).check_program(),
                    Err(HarnessError::Spawn { .. })
                ),
                "{program}"
            );
        }
        assert!(CliConfig::new("sh").check_program().is_ok());
        assert!(CliConfig::new("/bin/sh").check_program().is_ok());
    }
}
