//! `relay up`: the broker with its embedded runtime ([`relay_broker::server::run`]).

use crate::exit::Exit;
use std::net::SocketAddr;

use clap::Args;
use relay_client::data_dir::DataDir;

use super::settings::{init_logs, BusArgs, LogArgs, LogFormat, NatsArgs, RuntimeArgs};

#[derive(Args)]
pub struct UpArgs {
    /// Address of the local HTTP API; loopback only. Port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:7450", env = "RELAY_LISTEN")]
    listen: SocketAddr,
    /// Largest message body or task accepted, in bytes (413 above it).
    #[arg(long, default_value_t = 256 * 1024, env = "RELAY_MAX_MESSAGE_BYTES")]
    max_message_bytes: usize,
    /// Deepest agent-to-agent invocation chain.
    #[arg(long, default_value_t = 4)]
    max_depth: u32,
    /// Commands that may wait to be committed; past that, clients are answered
    /// `overloaded` at once (HTTP 429, a NATS error reply) instead of waiting.
    #[arg(long, default_value_t = relay_broker::broker::COMMAND_QUEUE_CAPACITY, env = "RELAY_COMMAND_QUEUE", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    command_queue: usize,
    /// Bytes one flight may stream (its text, command output, plans, diffs); past that
    /// the flight fails naming this cap, its turn is interrupted, and what it streamed
    /// before is kept.
    #[arg(long, value_name = "BYTES", default_value_t = relay_broker::broker::DEFAULT_MAX_FLIGHT_OUTPUT, env = "RELAY_MAX_FLIGHT_OUTPUT", value_parser = clap::value_parser!(u64).range(1..))]
    max_flight_output: u64,
    /// Milliseconds a connection has to send its request head (request line and
    /// headers) before it is closed. Hidden: tests shorten it.
    #[arg(long, hide = true, env = "RELAY_HEADER_TIMEOUT_MS", default_value_t = relay_broker::http::DEFAULT_HEADER_READ_TIMEOUT.as_millis() as u64, value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(1..=86_400_000))]
    header_timeout_ms: u64,
    /// Connections the API serves at once; more are answered `overloaded` and closed.
    /// Hidden: tests lower it.
    #[arg(long, hide = true, env = "RELAY_MAX_CONNECTIONS", default_value_t = relay_broker::http::DEFAULT_MAX_CONNECTIONS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    max_connections: usize,
    /// Connections kept beyond --max-connections for the operator's token and the
    /// dashboard's login, so a crowd of other clients cannot lock the operator out.
    #[arg(long, hide = true, env = "RELAY_RESERVED_CONNECTIONS", default_value_t = relay_broker::http::DEFAULT_RESERVED_CONNECTIONS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=1_000_000))]
    reserved_connections: usize,
    /// Live streams (SSE) one agent's token may hold open at once; one more is answered
    /// `overloaded`.
    #[arg(long, env = "RELAY_STREAMS_PER_AGENT", default_value_t = relay_broker::http::DEFAULT_STREAMS_PER_AGENT, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    streams_per_agent: usize,
    /// Milliseconds an answer (a live stream) may wait for its client to read before
    /// the connection is closed. Hidden: tests shorten it.
    #[arg(long, hide = true, env = "RELAY_WRITE_STALL_TIMEOUT_MS", default_value_t = relay_broker::http::DEFAULT_WRITE_STALL_TIMEOUT.as_millis() as u64, value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(1..=86_400_000))]
    write_stall_timeout_ms: u64,
    /// A command of yours (run with `sh -c`) for when an approval waits for a person:
    /// it runs once per approval, with RELAY_APPROVAL_ID, RELAY_APPROVAL_AGENT,
    /// RELAY_APPROVAL_FLIGHT, RELAY_APPROVAL_KIND, RELAY_APPROVAL_COMMAND and
    /// RELAY_APPROVAL_REASON (control characters escaped) and RELAY_DASHBOARD in its
    /// environment, e.g. `notify-send "Relay: $RELAY_APPROVAL_AGENT asks" "$RELAY_APPROVAL_COMMAND"`.
    /// Killed if still running after 60 s. At most 4 run at once; approvals that come
    /// meanwhile go to one command, with RELAY_APPROVAL_COUNT and RELAY_APPROVAL_IDS.
    #[arg(long, value_name = "CMD", env = "RELAY_NOTIFY_COMMAND")]
    notify_command: Option<String>,
    /// Free space (MiB) kept on the data dir's filesystem: below it, writes are refused
    /// with `storage_full` (HTTP 507, a NATS error) while reads and `relay status` go
    /// on; writes resume by themselves once space is freed.
    #[arg(long, env = "RELAY_DISK_RESERVE_MB", value_name = "MIB", default_value_t = relay_infra::disk::DEFAULT_RESERVE >> 20)]
    disk_reserve_mb: u64,
    /// Seconds the storage thread may spend on one commit before `relay up` decides the
    /// disk is stuck and exits with an error (for a supervisor to restart it).
    #[arg(long, env = "RELAY_STORAGE_STALL_TIMEOUT", value_name = "SECONDS", default_value_t = relay_broker::broker::DEFAULT_STORAGE_STALL_TIMEOUT.as_secs(), value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(1..=86_400))]
    storage_stall_timeout: u64,
    /// Your price table, for the cost of flights whose harness reports none (Relay
    /// ships no prices). JSON: {"models": {"MODEL": {"input": USD_PER_MILLION_TOKENS,
    /// "cached_input": ..., "output": ...}}} (numbers or decimal strings; cached_input
    /// optional). A bad file refuses to start, naming the line.
    #[arg(long, value_name = "FILE", env = "RELAY_PRICES")]
    prices: Option<std::path::PathBuf>,
    #[command(flatten)]
    nats: NatsArgs,
    #[command(flatten)]
    bus: BusArgs,
    #[command(flatten)]
    runtime: RuntimeArgs,
    #[command(flatten)]
    logs: LogArgs,
}

/// `relay up`: runs the broker until SIGINT/SIGTERM.
pub async fn run(data_dir: DataDir, args: UpArgs) -> anyhow::Result<Exit> {
    init_logs(args.logs.log_format);
    // Read before anything starts: a bad file stops `relay up` here, naming the line.
    let prices = match &args.prices {
        Some(path) => Some(std::sync::Arc::new(
            relay_broker::prices::PriceTable::load(path).map_err(anyhow::Error::msg)?,
        )),
        None => None,
    };
    args.runtime.apply();
    let shutdown = tokio_util::sync::CancellationToken::new();
    relay_broker::shutdown::on_signals(shutdown.clone());
    let config = relay_broker::server::ServerConfig {
        data_dir: data_dir.path(),
        listen: args.listen,
        broker: relay_broker::BrokerConfig {
            max_message_bytes: args.max_message_bytes,
            max_depth: args.max_depth,
            command_queue: args.command_queue,
            disk_reserve: args.disk_reserve_mb << 20,
            storage_stall_timeout: std::time::Duration::from_secs(args.storage_stall_timeout),
            max_flight_output: args.max_flight_output,
            prices,
            ..relay_broker::BrokerConfig::default()
        },
        nats: args.nats.config(Some(&args.bus))?,
        turn_idle_timeout: args.runtime.turn_idle_timeout(),
        turn_stall_timeout: args.runtime.turn_stall_timeout(),
        http: relay_broker::http::HttpLimits {
            header_read_timeout: std::time::Duration::from_millis(args.header_timeout_ms),
            max_connections: args.max_connections,
            reserved_connections: args.reserved_connections,
            streams_per_agent: args.streams_per_agent,
            write_stall_timeout: std::time::Duration::from_millis(args.write_stall_timeout_ms),
        },
        // This program: the agents' sessions run `relay ask` and `relay mcp` with it.
        relay_program: std::env::current_exe().ok(),
        notify_command: args.notify_command,
        // JSON logs: every line of stderr is JSON (the banner's facts are in the
        // `relay broker up` line).
        banner: args.logs.log_format == LogFormat::Text,
    };
    relay_broker::server::run(config, shutdown).await?;
    Ok(Exit::Ok)
}
