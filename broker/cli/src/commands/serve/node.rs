//! `relay node`: a runtime on another host ([`relay_broker::node::run`]), and `relay
//! node-key`, which writes its key on the broker's host.

use crate::exit::Exit;
use std::path::PathBuf;

use clap::Args;
use relay_client::data_dir::DataDir;

use super::settings::{init_logs, LogArgs, NatsArgs, RuntimeArgs};
use crate::terminal::{errln, out};

#[derive(Args)]
pub struct NodeArgs {
    /// This node's name, as agents name it with `--node`.
    #[arg(long)]
    name: String,
    /// This node's key, written by `relay node-key NAME --out FILE` on the broker's host
    /// (default: <data-dir>/node.key). The node opens only messages sealed with it.
    #[arg(long, env = "RELAY_NODE_KEY_FILE", value_name = "FILE")]
    key_file: Option<PathBuf>,
    #[command(flatten)]
    nats: NatsArgs,
    #[command(flatten)]
    runtime: RuntimeArgs,
    #[command(flatten)]
    logs: LogArgs,
}

/// `relay node`: runs the node until SIGINT/SIGTERM.
pub async fn run(data_dir: DataDir, args: NodeArgs) -> anyhow::Result<Exit> {
    init_logs(args.logs.log_format);
    args.runtime.apply();
    let Some(nats) = args.nats.config(None)? else {
        anyhow::bail!("relay node needs --nats URL: it reaches the broker only through NATS");
    };
    // Its own directory by default, so it never shares the broker's sled files.
    let data_dir = match data_dir {
        DataDir::Given(dir) | DataDir::FromEnv(dir) => dir,
        DataDir::Default => relay_client::data_dir::default_path()
            .join("nodes")
            .join(&args.name),
    };
    let key_file = args.key_file.unwrap_or_else(|| data_dir.join("node.key"));
    let key = relay_broker::node::read_key(&key_file, &args.name).await?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    relay_broker::shutdown::on_signals(shutdown.clone());
    relay_broker::node::run(
        relay_broker::node::NodeConfig {
            name: args.name,
            data_dir,
            nats,
            key,
            turn_idle_timeout: args.runtime.turn_idle_timeout(),
            turn_stall_timeout: args.runtime.turn_stall_timeout(),
            banner: args.logs.log_format == super::settings::LogFormat::Text,
        },
        shutdown,
    )
    .await?;
    Ok(Exit::Ok)
}

/// `relay node-key NAME`: the node's key, from the broker's bus key.
pub async fn write_key(
    data_dir: DataDir,
    name: String,
    out: Option<PathBuf>,
) -> anyhow::Result<Exit> {
    let dir = data_dir.path();
    let wrote = relay_infra::storage::read(move || -> anyhow::Result<Option<PathBuf>> {
        let key = relay_broker::server::node_key(&dir, &name)?;
        let text = relay_broker::files::key_text(key.bytes());
        match out {
            Some(path) => {
                relay_broker::files::write_private(&path, text.as_bytes())?;
                Ok(Some(path))
            }
            None => {
                out!("{text}");
                Ok(None)
            }
        }
    })
    .await??;
    if let Some(path) = wrote {
        errln!("relay: wrote the node key to {}", path.display());
    }
    Ok(Exit::Ok)
}
