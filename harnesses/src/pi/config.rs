//! How `pi --mode rpc` is started for an agent: its command line over a
//! [`CliConfig`].

use crate::config::CliConfig;
use crate::process::ProcessSpec;

/// How to start `pi --mode rpc` ([`CliConfig::for_agent`] with [`super::PI_CLI`]). The
/// agent's arguments (e.g. `--provider`) come after `--mode rpc` and `--model`. Pi
/// answers `abort` only once the turn has ended, within the request timeout.
pub type PiConfig = CliConfig;

/// Which session pi starts with.
#[derive(Debug, Clone, Copy)]
pub(super) enum Open<'a> {
    New,
    /// `--session <id>`.
    Resume(&'a str),
    /// `--fork <id>`: a new session in the working directory with a copy of all of it.
    Fork(&'a str),
}

/// The command line, opening `open`.
pub(super) fn command(config: &PiConfig, open: Open<'_>) -> ProcessSpec {
    let mut args = vec!["--mode".to_string(), "rpc".to_string()];
    if let Some(model) = &config.model {
        args.extend(["--model".to_string(), model.clone()]);
    }
    args.extend(config.args.iter().cloned());
    match open {
        Open::New => {}
        Open::Resume(id) => args.extend(["--session".to_string(), id.to_string()]),
        Open::Fork(id) => args.extend(["--fork".to_string(), id.to_string()]),
    }
    config.process(args)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::path::PathBuf;

    use relay_protocol::domain::{AgentSpec, Harness};

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
        let config = PiConfig::for_agent(&agent, &super::super::PI_CLI, None);
        let spec = command(&config, Open::Resume("0190-abc"));
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
        assert_eq!(command(&config, Open::New).args.len(), 6);
        assert_eq!(
            command(&config, Open::Fork("0190-abc")).args[6..],
            ["--fork", "0190-abc"]
        );
        assert!(!format!("{config:?}").contains("s3cret"));
    }
}
