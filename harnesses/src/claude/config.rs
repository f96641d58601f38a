//! How `claude -p` is started for an agent: [`ClaudeConfig`], from its [`AgentSpec`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use relay_protocol::domain::AgentSpec;

use super::CLAUDE_CLI;
use crate::error::HarnessError;
use crate::process::ProcessSpec;

/// How to start `claude -p` for an agent. Its `Debug` names the variables of `env` but
/// never shows their values (an agent's secrets are among them).
#[derive(Clone)]
pub struct ClaudeConfig {
    /// The `claude` program; see [`crate::pinned::PinnedCli::program`].
    pub program: PathBuf,
    /// The agent's own arguments, after Relay's.
    pub args: Vec<String>,
    /// The agent's variables, on top of the few inherited from Relay
    /// ([`crate::process::INHERITED_ENV`]).
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    /// `--model`; `None` leaves it to Claude Code.
    pub model: Option<String>,
    /// How long the handshake, and any other request, may take.
    pub request_timeout: Duration,
    /// On shutdown, how long Claude Code gets to exit after stdin closes, and again after
    /// SIGTERM, before its process group is killed.
    pub shutdown_grace: Duration,
}

impl std::fmt::Debug for ClaudeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaudeConfig")
            .field("program", &self.program)
            .field("args", &self.args)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("cwd", &self.cwd)
            .field("model", &self.model)
            .field("request_timeout", &self.request_timeout)
            .field("shutdown_grace", &self.shutdown_grace)
            .finish()
    }
}

/// Which conversation a process starts with.
pub(super) enum Start<'a> {
    New(&'a str),
    Resume(&'a str),
}

impl ClaudeConfig {
    /// `program`, no extra arguments or variables, default timeouts.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            env: BTreeMap::new(),
            cwd: None,
            model: None,
            request_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(2),
        }
    }

    /// How to start Claude Code for `agent`: its program (else the pinned one),
    /// arguments, variables with its secrets' values, directory and model.
    pub fn for_agent(agent: &AgentSpec) -> ClaudeConfig {
        let mut config = ClaudeConfig::new(CLAUDE_CLI.program(agent.command.as_deref()));
        config.args = agent.args.clone();
        config.env = agent.env.clone();
        // Secret variables (shown as *** in `env`) with their values.
        config
            .env
            .extend(agent.secrets.0.iter().map(|(k, v)| (k.clone(), v.clone())));
        config.cwd = Some(PathBuf::from(&agent.cwd));
        config.model = agent.model.clone();
        config
    }

    pub(super) fn process(&self, start: &Start<'_>) -> ProcessSpec {
        let mut args: Vec<String> = [
            "-p",
            "--input-format",
            "stream-json",
            "--output-format",
            "stream-json",
            "--verbose",
            "--include-partial-messages",
            "--permission-prompt-tool",
            "stdio",
        ]
        .map(String::from)
        .to_vec();
        if let Some(model) = &self.model {
            args.extend(["--model".to_string(), model.clone()]);
        }
        args.push(match start {
            Start::New(id) => format!("--session-id={id}"),
            Start::Resume(id) => format!("--resume={id}"),
        });
        args.extend(self.args.iter().cloned());
        ProcessSpec {
            program: self.program.clone(),
            args,
            env: self.env.clone(),
            cwd: self.cwd.clone(),
        }
    }

    /// Whether the program can be started: an executable file, named by a path or found
    /// on the `PATH` the child gets.
    pub(super) fn check_program(&self) -> Result<(), HarnessError> {
        let spawn_error = |kind: std::io::ErrorKind, why: &str| HarnessError::Spawn {
            program: self.program.display().to_string(),
            source: std::io::Error::new(kind, why.to_string()),
        };
        if self.program.components().count() > 1 {
            return match executable(&self.program) {
                true => Ok(()),
                false => Err(spawn_error(
                    std::io::ErrorKind::NotFound,
                    "no executable file there",
                )),
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
            false => Err(spawn_error(
                std::io::ErrorKind::NotFound,
                "not found on PATH",
            )),
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

    #[test]
    fn an_agent_spec_becomes_the_claude_config_with_its_secrets() {
        let mut agent = AgentSpec::new("a1", Harness::ClaudeStreamJson, "/work");
        agent.command = Some("/opt/claude".into());
        agent.args = vec!["--add-dir".into(), "/data".into()];
        agent.env.insert("CLAUDE_CONFIG_DIR".into(), "/c".into());
        agent.env.insert("ANTHROPIC_API_KEY".into(), "***".into());
        agent
            .secrets
            .0
            .insert("ANTHROPIC_API_KEY".into(), "s3cret".into());
        agent.model = Some("sonnet".into());
        let config = ClaudeConfig::for_agent(&agent);
        assert_eq!(config.program, PathBuf::from("/opt/claude"));
        assert_eq!(
            config.env.clone().into_iter().collect::<Vec<_>>(),
            vec![
                ("ANTHROPIC_API_KEY".to_string(), "s3cret".to_string()),
                ("CLAUDE_CONFIG_DIR".to_string(), "/c".to_string())
            ]
        );
        assert!(!format!("{config:?}").contains("s3cret"));
        let spec = config.process(&Start::Resume("5b0c"));
        assert_eq!(
            spec.args,
            [
                "-p",
                "--input-format",
                "stream-json",
                "--output-format",
                "stream-json",
                "--verbose",
                "--include-partial-messages",
                "--permission-prompt-tool",
                "stdio",
                "--model",
                "sonnet",
                "--resume=5b0c",
                "--add-dir",
                "/data",
            ]
        );
        assert_eq!(spec.cwd, Some(PathBuf::from("/work")));
        assert_eq!(
            config.process(&Start::New("9a1f")).args[11],
            "--session-id=9a1f"
        );
    }

    #[test]
    fn a_missing_program_is_a_spawn_error() {
        for program in ["/nonexistent/claude", "relay-no-such-claude"] {
            let config = ClaudeConfig::new(program);
            assert!(
                matches!(config.check_program(), Err(HarnessError::Spawn { .. })),
                "{program}"
            );
        }
        assert!(ClaudeConfig::new("sh").check_program().is_ok());
    }
}
