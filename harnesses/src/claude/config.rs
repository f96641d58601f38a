//! How `claude -p` is started for an agent: its command line over a [`CliConfig`].

use crate::config::CliConfig;
use crate::process::ProcessSpec;

/// How to start `claude -p` ([`CliConfig::for_agent`] with [`super::CLAUDE_CLI`]). The
/// agent's arguments come after Relay's.
pub type ClaudeConfig = CliConfig;

/// Which session a process starts with.
pub(super) enum Start<'a> {
    New(&'a str),
    Resume(&'a str),
    /// A new session `id`, a copy of the transcript at `from` (a path: Claude Code loads
    /// it from any project) up to and including message `at` (all when `None`).
    Fork {
        id: &'a str,
        from: &'a str,
        at: Option<&'a str>,
    },
}

/// The command line: stream-json both ways, permission prompts on stdio, the model,
/// the session to start or resume, Relay's MCP server when the agent reaches Relay,
/// then the agent's arguments.
///
/// Relay's server is given as `--mcp-config` JSON on the command line: the `relay`
/// program and `mcp`, no secret. Claude Code starts a stdio MCP server with its own whole
/// environment (checked with 2.1.197), so `relay mcp` finds the agent's `RELAY_*`
/// variables there; the token is never on a command line.
pub(super) fn command(config: &ClaudeConfig, start: &Start<'_>) -> ProcessSpec {
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
    if let Some(model) = &config.model {
        args.extend(["--model".to_string(), model.clone()]);
    }
    match start {
        Start::New(id) => args.push(format!("--session-id={id}")),
        Start::Resume(id) => args.push(format!("--resume={id}")),
        Start::Fork { id, from, at } => {
            args.extend([
                format!("--resume={from}"),
                "--fork-session".to_string(),
                format!("--session-id={id}"),
            ]);
            if let Some(at) = at {
                args.push(format!("--resume-session-at={at}"));
            }
        }
    }
    if let Some(relay) = &config.relay {
        args.extend(relay.claude_mcp_args());
    }
    args.extend(config.args.iter().cloned());
    config.process(args)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use relay_protocol::domain::{AgentSpec, Harness};

    use super::*;

    #[test]
    fn relay_mcp_is_given_without_its_token() {
        let mut config = ClaudeConfig::new("claude");
        config.relay = Some(crate::RelayAccess {
            agent: "cl".into(),
            url: "http://127.0.0.1:7450".into(),
            token: "relay-agent.cl.s3cret".into(),
            program: "/opt/relay/relay".into(),
        });
        config.args = vec!["--add-dir".into(), "/data".into()];
        let args = command(&config, &Start::New("9a1f")).args;
        assert_eq!(
            args[9..],
            [
                "--session-id=9a1f",
                "--mcp-config",
                r#"{"mcpServers":{"relay":{"args":["mcp"],"command":"/opt/relay/relay","type":"stdio"}}}"#,
                "--add-dir",
                "/data",
            ]
        );
        assert!(!args.iter().any(|a| a.contains("s3cret")));
    }

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
        let config = ClaudeConfig::for_agent(&agent, &super::super::CLAUDE_CLI, None);
        assert_eq!(config.program, PathBuf::from("/opt/claude"));
        assert_eq!(
            config.env.clone().into_iter().collect::<Vec<_>>(),
            vec![
                ("ANTHROPIC_API_KEY".to_string(), "s3cret".to_string()),
                ("CLAUDE_CONFIG_DIR".to_string(), "/c".to_string())
            ]
        );
        assert!(!format!("{config:?}").contains("s3cret"));
        let spec = command(&config, &Start::Resume("5b0c"));
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
            command(&config, &Start::New("9a1f")).args[11],
            "--session-id=9a1f"
        );
        let fork = Start::Fork {
            id: "9a1f",
            from: "/c/projects/-w/5b0c.jsonl",
            at: Some("77aa"),
        };
        assert_eq!(
            command(&config, &fork).args[11..15],
            [
                "--resume=/c/projects/-w/5b0c.jsonl",
                "--fork-session",
                "--session-id=9a1f",
                "--resume-session-at=77aa"
            ]
        );
    }
}
