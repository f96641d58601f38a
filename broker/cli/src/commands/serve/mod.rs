//! The processes: `relay up` ([`up`]), `relay node` and `relay node-key` ([`node`]),
//! with the settings `up` and `node` share ([`settings`]).

use crate::exit::Exit;
use std::path::PathBuf;

use clap::Subcommand;
use relay_client::data_dir::DataDir;

pub mod node;
pub mod settings;
pub mod up;

#[derive(Subcommand)]
pub enum ServeCmd {
    /// Run the broker (with its embedded runtime).
    ///
    /// Runs until SIGINT/SIGTERM. An option given twice takes its last value.
    #[command(
        args_override_self = true,
        after_help = "Examples:\n  relay up                                   # the default data dir, 127.0.0.1:7450\n  relay up --data-dir /srv/relay --listen 127.0.0.1:7451\n  relay up --nats nats://127.0.0.1:4222     # also serve NATS clients and remote nodes"
    )]
    Up(up::UpArgs),
    /// Run a node: another host's agents, through NATS.
    ///
    /// Runs only the harness-session plane for the agents registered on one node
    /// (`relay agent add ... --node NAME`), connected to the broker through NATS.
    Node(node::NodeArgs),
    /// Write a node's key.
    ///
    /// The key is derived from this broker's bus key (made if missing): copy it to the
    /// node's host and pass it to `relay node --key-file`. Run it where the broker's data
    /// dir is.
    NodeKey {
        /// The node's name.
        name: String,
        /// Write the key to this file (mode 0600) instead of standard output.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
}

/// Runs `cmd` until it ends (the processes: until SIGINT/SIGTERM).
pub async fn run(data_dir: DataDir, cmd: ServeCmd) -> anyhow::Result<Exit> {
    match cmd {
        ServeCmd::Up(args) => up::run(data_dir, args).await,
        ServeCmd::Node(args) => node::run(data_dir, args).await,
        ServeCmd::NodeKey { name, out } => node::write_key(data_dir, name, out).await,
    }
}
