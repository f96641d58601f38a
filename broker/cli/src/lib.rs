//! Relay's command line, the `relay` binary.
//!
//! [`main`] parses the command line (`Cli` below; each command family defines its own
//! arguments in its module, one noun-verb grammar: `relay flight list`, `relay approval
//! decide`..., the older spellings kept as hidden aliases; [`help`] groups the list by
//! use and holds the examples) and runs one command of three kinds:
//!
//! - the processes: `relay up` (the broker, [`relay_broker::server::run`]) and `relay
//!   node` (a runtime on another host, [`relay_broker::node::run`]), and `relay node-key`
//!   (`commands::serve`);
//! - `relay doctor`, the check of a stopped broker's data dir (`commands::doctor`);
//! - the client commands (`commands`: status, messages and conversations, events,
//!   agents, flights and `ask`, approvals, `replay`; `relay mcp`, the same as MCP
//!   tools on stdio; `relay acp`, an agent as an ACP agent on stdio for editors), which
//!   find a running broker and talk to it through
//!   [`relay_client`], its HTTP API, and print through `views` (JSON, one-line summaries, the live view of
//!   `relay ask`, replay transcripts).
//!
//! Whatever they print of agent or model text goes through [`terminal`] first, which
//! also ends the command quietly with 0 when stdout's reader is gone (`| head`). How a
//! command ended becomes its exit code through [`exit`] (documented there and in
//! `relay --help`).
//!
//! Every setting is a flag and, where it has one, its environment variable, both read by
//! clap, so `--help` names them all ([`relay_client::data_dir`]: where `--data-dir` came
//! from matters to client commands). A secret's variable is named but its value never shown, and a
//! secret on the command line is refused (`ps` shows it to every user).
//!
//! Depends on: relay-broker, relay-client, relay-harnesses, relay-infra, relay-protocol,
//! relay-runtime.
//!
//! The client commands talk to the broker through `relay-client`; the crate depends on
//! the broker library only for the processes (`commands::serve`: `relay up`, `relay
//! node`) and `relay doctor` (which opens a stopped broker's store). Nothing but the
//! tests depends on it.
//!
//! Layering (`main` here on `commands`; a module uses only the modules after its arrow;
//! `tests/tests/module_graph/` checks it):
//! - `terminal` -> none
//! - `exit` -> none
//! - `views` -> `terminal`
//! - `help` -> `exit`, `terminal`
//! - `commands` -> `exit`, `help`, `terminal`, `views`

use std::path::PathBuf;
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{ArgMatches, Command, CommandFactory, FromArgMatches, Parser};
use relay_client::DataDir;

mod commands;
pub mod exit;
mod help;
pub mod terminal;
mod views;

use exit::Exit;
use terminal::errln;

#[derive(Parser)]
#[command(
    name = "relay",
    version,
    about = "Relay: a message broker for coding agents",
    long_about = "Relay is the source of truth for conversations, messages, invocations and \
flights between people and coding agents (Codex, Claude Code, Pi, tmux panes).\n\n\
Start a broker with `relay up`. Client commands find it through its data dir's api.json \
(--data-dir or RELAY_DATA_DIR, default $XDG_DATA_HOME/relay or ~/.local/share/relay), or \
RELAY_URL + RELAY_TOKEN.",
    after_help = help::TOP_AFTER_HELP,
    after_long_help = help::TOP_AFTER_LONG_HELP,
)]
struct Cli {
    /// Data directory of the broker [default: $XDG_DATA_HOME/relay, else
    /// ~/.local/share/relay].
    #[arg(long, global = true, value_name = "DIR", env = "RELAY_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// URL of the broker's API, for client commands: with RELAY_TOKEN, used instead of
    /// the api.json of RELAY_DATA_DIR (but not of --data-dir).
    #[arg(long, value_name = "URL", env = "RELAY_URL")]
    url: Option<String>,
    /// The token that goes with --url: refused on the command line (every user can read
    /// it with ps), set RELAY_TOKEN.
    #[arg(long, env = "RELAY_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Colour states and headers: auto (on a terminal, unless NO_COLOR is set), always
    /// or never.
    #[arg(
        long,
        global = true,
        value_name = "WHEN",
        default_value = "auto",
        hide_default_value = true
    )]
    color: terminal::ColorChoice,
    #[command(subcommand)]
    command: commands::Cmd,
}

/// The whole command line, its help grouped ([`help::grouped`]): what `relay` parses,
/// and what its completions and man page are made from.
pub fn command() -> Command {
    help::grouped(Cli::command())
}

/// `relay`: parses the command line, runs the command, and turns its outcome into an
/// exit code ([`exit`]); an error is said on stderr.
pub fn main() -> ExitCode {
    let command = command();
    let matches = command.clone().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.format(&mut self::command()).exit(),
    };
    terminal::set_color(cli.color);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            errln!("relay: cannot start the async runtime: {e}");
            return Exit::Internal.into();
        }
    };
    let result = refuse_secrets_on_command_line(&command, &matches)
        .and_then(|()| rt.block_on(run(cli, &matches)));
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            errln!("relay: {e:#}");
            Exit::of_error(&e).into()
        }
    };
    // Streams still open to a broker that went away must not hold the exit.
    rt.shutdown_background();
    code
}

async fn run(cli: Cli, matches: &ArgMatches) -> anyhow::Result<ExitCode> {
    let data_dir = data_dir(cli.data_dir, matches);
    let exit = commands::run(data_dir, cli.url, cli.token, cli.command).await?;
    Ok(exit.into())
}

/// `--data-dir` (clap gives the global argument's value and source to the top level,
/// wherever it stood). A relative one is made absolute here, once.
fn data_dir(dir: Option<PathBuf>, matches: &ArgMatches) -> DataDir {
    let absolute = |d: PathBuf| std::path::absolute(&d).unwrap_or(d);
    match (dir, matches.value_source("data_dir")) {
        (Some(dir), Some(ValueSource::CommandLine)) => DataDir::Given(absolute(dir)),
        (Some(dir), _) => DataDir::FromEnv(absolute(dir)),
        (None, _) => DataDir::Default,
    }
}

/// Secrets (arguments whose environment values `--help` hides) come from the environment
/// or a file, never the command line, where `ps` shows them to every user.
fn refuse_secrets_on_command_line(command: &Command, matches: &ArgMatches) -> anyhow::Result<()> {
    for arg in command
        .get_arguments()
        .filter(|a| a.is_hide_env_values_set())
    {
        if matches.value_source(arg.get_id().as_str()) != Some(ValueSource::CommandLine) {
            continue;
        }
        let flag = arg.get_long().unwrap_or_default();
        let var = arg.get_env().unwrap_or_default().to_string_lossy();
        let file = format!("{flag}-file");
        if command
            .get_arguments()
            .any(|a| a.get_long() == Some(file.as_str()))
        {
            anyhow::bail!("--{flag} is not taken on the command line (every user can read it with ps): set {var}, or put it in a file and pass --{file}");
        }
        anyhow::bail!(
            "--{flag} is not taken on the command line (every user can read it with ps): set {var}"
        );
    }
    if let Some((name, sub)) = matches.subcommand() {
        if let Some(subcommand) = command.find_subcommand(name) {
            return refuse_secrets_on_command_line(subcommand, sub);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn matches(args: &[&str]) -> ArgMatches {
        command().try_get_matches_from(args).unwrap()
    }

    fn refused(args: &[&str]) -> Option<String> {
        refuse_secrets_on_command_line(&command(), &matches(args))
            .err()
            .map(|e| e.to_string())
    }

    #[test]
    fn the_command_line_is_well_formed() {
        command().debug_assert();
    }

    #[test]
    fn secrets_on_the_command_line_are_refused() {
        let ps = "is not taken on the command line (every user can read it with ps)";
        assert_eq!(
            refused(&["relay", "up", "--nats-user", "u", "--nats-password", "x"]),
            Some(format!("--nats-password {ps}: set RELAY_NATS_PASSWORD, or put it in a file and pass --nats-password-file"))
        );
        assert_eq!(
            refused(&["relay", "node", "--name", "n", "--nats-token", "x"]),
            Some(format!("--nats-token {ps}: set RELAY_NATS_TOKEN, or put it in a file and pass --nats-token-file"))
        );
        assert_eq!(
            refused(&["relay", "up", "--nats-request-token", "x"]),
            Some(format!("--nats-request-token {ps}: set RELAY_NATS_REQUEST_TOKEN, or put it in a file and pass --nats-request-token-file"))
        );
        assert_eq!(
            refused(&["relay", "--token", "x", "status"]),
            Some(format!("--token {ps}: set RELAY_TOKEN"))
        );
        assert_eq!(refused(&["relay", "up", "--nats-password-file", "f"]), None);
        assert_eq!(refused(&["relay", "status"]), None);
    }

    #[test]
    fn a_data_dir_on_the_command_line_is_told_apart_wherever_it_stands() {
        for args in [
            &["relay", "--data-dir", "d", "status"][..],
            &["relay", "status", "--data-dir", "d"],
            &["relay", "agent", "list", "--data-dir", "d"],
        ] {
            let m = matches(args);
            let cli = Cli::from_arg_matches(&m).unwrap();
            assert_eq!(
                data_dir(cli.data_dir, &m),
                DataDir::Given(std::path::absolute("d").unwrap()),
                "{args:?}"
            );
        }
    }
}
