//! How to start `pi --mode rpc` for an agent: [`PiConfig`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use relay_protocol::domain::AgentSpec;

use super::pi_program;
use crate::error::HarnessError;
use crate::process::ProcessSpec;

/// How to start `pi --mode rpc`. Its `Debug` names the variables of `env` but never shows
/// their values (an agent's secrets are among them).
#[derive(Clone)]
pub struct PiConfig {
    /// The `pi` program; see [`pi_program`].
    pub program: PathBuf,
    /// Extra arguments after `--mode rpc` and `--model` (e.g. `--provider`).
    pub args: Vec<String>,
    /// The agent's own variables, on top of the few inherited from Relay
    /// ([`crate::process::INHERITED_ENV`]).
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    /// `--model`; `None` leaves it to pi's settings.
    pub model: Option<String>,
    /// How long any command (the `get_state` handshake, a prompt, steer or abort) may
    /// take to be answered. Pi answers `abort` only once the turn has ended.
    pub request_timeout: Duration,
    /// On shutdown, how long pi gets to exit after stdin closes, and again after SIGTERM,
    /// before its process group is killed.
    pub shutdown_grace: Duration,
}

impl std::fmt::Debug for PiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PiConfig")
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

impl PiConfig {
    /// `program`, no extra args or env, defaults elsewhere.
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

    /// How to start pi for `agent`: its program (see [`pi_program`]), arguments,
    /// variables with its secrets' values, directory and model.
    pub fn for_agent(agent: &AgentSpec) -> PiConfig {
        let mut config = PiConfig::new(pi_program(agent.command.as_deref()));
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

    /// The command line, resuming `session` if given.
    pub(super) fn spec(&self, session: Option<&str>) -> ProcessSpec {
        let mut args = vec!["--mode".to_string(), "rpc".to_string()];
        if let Some(model) = &self.model {
            args.extend(["--model".to_string(), model.clone()]);
        }
        args.extend(self.args.iter().cloned());
        if let Some(session) = session {
            args.extend(["--session".to_string(), session.to_string()]);
        }
        ProcessSpec {
            program: self.program.clone(),
            args,
            env: self.env.clone(),
            cwd: self.cwd.clone(),
        }
    }

    /// [`HarnessError::Spawn`] unless the program is a file here or on the child's
    /// `PATH`: pi itself starts only in `open`, so this is what `spawn` can check.
    pub(super) fn check_program(&self) -> Result<(), HarnessError> {
        let program = &self.program;
        let found = if program.components().count() > 1 {
            // A relative path is taken from the child's directory.
            let cwd = self.cwd.as_deref().unwrap_or(Path::new("."));
            program.is_file() || cwd.join(program).is_file()
        } else {
            let path = self
                .env
                .get("PATH")
                .cloned()
                .or_else(|| std::env::var("PATH").ok())
                .unwrap_or_default();
            std::env::split_paths(&path).any(|dir| dir.join(program).is_file())
        };
        if found {
            return Ok(());
        }
        Err(HarnessError::Spawn {
            program: program.display().to_string(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such program"),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use relay_protocol::domain::Harness;

    use super::*;

    #[test]
    fn an_agent_spec_becomes_the_pi_command_line_with_its_secrets() {
        let mut agent = AgentSpec::new("a1", Harness::PiRpc, "/work");
        agent.command = Some("/opt/pi".into());
        agent.args = vec!["--provider".into(), "mock".into()];
        agent.env.insert("PI_OFFLINE".into(), "1".into());
        agent.env.insert("API_KEY".into(), "***".into());
        agent.secrets.0.insert("API_KEY".into(), "s3cret".into());
        agent.model = Some("m".into());
        let config = PiConfig::for_agent(&agent);
        let spec = config.spec(Some("0190-abc"));
        assert_eq!(spec.program, PathBuf::from("/opt/pi"));
        assert_eq!(
            spec.args,
            [
                "--mode",
                "rpc",
                "--model",
                "m",
                "--provider",
                "mock",
                "--session",
                "0190-abc"
            ]
        );
        assert_eq!(
            spec.env.into_iter().collect::<Vec<_>>(),
            vec![
                ("API_KEY".to_string(), "s3cret".to_string()),
                ("PI_OFFLINE".to_string(), "1".to_string())
            ]
        );
        assert_eq!(spec.cwd, Some(PathBuf::from("/work")));
        assert_eq!(config.spec(None).args[..2], ["--mode", "rpc"]);
        assert!(!format!("{config:?}").contains("s3cret"));
    }
}
