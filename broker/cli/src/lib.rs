//! Relay's command line, the `relay` binary.
//!
//! [`main`] parses the command line (`Cli` below; each command family defines its own
//! arguments in its module) and runs one command of three kinds:
//!
//! - the processes: `relay up` (the broker, [`relay_broker::server::run`]) and `relay
//!   node` (a runtime on another host, [`relay_broker::node::run`]), and `relay node-key`
//!   (`commands::serve`);
//! - `relay doctor`, the check of a stopped broker's data dir (`commands::doctor`);
//! - the client commands (`commands`: status, messages and conversations, events,
//!   agents, flights and `ask`, approvals), which find a running broker and talk to it
//!   through [`client`], its HTTP API, and print through `views` (JSON, one-line
//!   summaries, the live view of `relay ask`).
//!
//! Whatever they print of agent or model text goes through [`terminal`] first.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub mod client;
mod commands;
pub mod terminal;
mod views;

use terminal::errln;

#[derive(Parser)]
#[command(
    name = "relay",
    version,
    about = "Relay: a message broker for coding agents",
    long_about = "Relay is the source of truth for conversations, messages, invocations and \
flights between people and coding agents (Codex, Claude Code, Pi, tmux panes).\n\n\
Start a broker with `relay up`. Client commands find it through RELAY_DATA_DIR (reading \
<data-dir>/api.json), or RELAY_URL + RELAY_TOKEN.",
    after_help = "Examples:\n  relay up --data-dir ./.relay\n  relay send \"hello @codex-1\"\n  relay read -n 20\n  relay agent add codex-1 --harness codex_app_server --cwd .\n  relay flights --json"
)]
struct Cli {
    /// Data directory of the broker (else RELAY_DATA_DIR, else ~/.local/share/relay).
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

/// One command line: the families are flattened, so `relay up` and `relay send` stand
/// side by side.
#[derive(Subcommand)]
enum Cmd {
    #[command(flatten)]
    Serve(commands::serve::ServeCmd),
    #[command(flatten)]
    Client(commands::ClientCmd),
    /// Check a STOPPED broker's data directory: rebuild every projection from the event
    /// log and compare it with the stored one, and check the log has no gap in its
    /// sequence. Exits 0 when consistent, 1 when not. It writes no record (opening the
    /// database lets sled recover it, as `relay up` would).
    #[command(
        after_help = "Run it with the broker stopped (`relay up` holds the database lock).\n\nExamples:\n  relay doctor --data-dir ./.relay\n  relay doctor --json"
    )]
    Doctor(commands::JsonFlag),
}

/// `relay`: parses the command line, runs the command, and turns its error into a
/// message on stderr and exit code 1.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            errln!("relay: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async move {
        match cli.command {
            Cmd::Serve(cmd) => commands::serve::run(cli.data_dir, cmd).await,
            Cmd::Client(cmd) => commands::run(cli.data_dir, cmd).await,
            Cmd::Doctor(f) => commands::doctor::run(cli.data_dir, f.json).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            errln!("relay: {e:#}");
            ExitCode::FAILURE
        }
    }
}
