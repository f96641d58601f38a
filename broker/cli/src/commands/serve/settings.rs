//! What `relay up` and `relay node` share: their settings (the harness-session plane,
//! the connection to NATS and, for `up`, the bus it serves) and their logs.

use std::path::PathBuf;

use clap::Args;

/// The harness-session plane's settings, shared by `relay up` and `relay node`.
#[derive(Args)]
pub struct RuntimeArgs {
    /// A running turn whose harness sends nothing for this many seconds is interrupted
    /// and failed (a model that stopped answering); 0: never. Waiting for an approval
    /// does not count.
    #[arg(
        long,
        env = "RELAY_TURN_IDLE_TIMEOUT",
        default_value_t = relay_runtime::DEFAULT_TURN_IDLE_TIMEOUT.as_secs(),
        value_name = "SECONDS"
    )]
    turn_idle_timeout: u64,
    /// A running turn whose harness retries its model (codex's "Reconnecting... waiting
    /// for network", a rate limit, an overload) and then made no progress (no text, item
    /// or approval request, only more such notes) for this many seconds, counted from
    /// that first retry, is interrupted and failed with the latest note as its cause; 0:
    /// never (the idle timeout still applies).
    #[arg(
        long,
        env = "RELAY_TURN_STALL_TIMEOUT",
        default_value_t = relay_runtime::DEFAULT_TURN_STALL_TIMEOUT.as_secs(),
        value_name = "SECONDS"
    )]
    turn_stall_timeout: u64,
    /// Memory each sled database may use as cache, in MiB: bounds the process's
    /// memory whatever the history's size (reads past it go to disk).
    #[arg(
        long,
        env = "RELAY_CACHE_MB",
        default_value_t = relay_infra::storage::DEFAULT_CACHE_CAPACITY >> 20,
        value_name = "MIB",
        value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(1..=1 << 20)
    )]
    cache_mb: u64,
}

impl RuntimeArgs {
    /// Applies the settings that are process-wide (the sled cache), before any
    /// database opens.
    pub fn apply(&self) {
        relay_infra::storage::set_cache_capacity(self.cache_mb << 20);
    }

    pub fn turn_idle_timeout(&self) -> Option<std::time::Duration> {
        (self.turn_idle_timeout > 0).then(|| std::time::Duration::from_secs(self.turn_idle_timeout))
    }

    pub fn turn_stall_timeout(&self) -> Option<std::time::Duration> {
        (self.turn_stall_timeout > 0)
            .then(|| std::time::Duration::from_secs(self.turn_stall_timeout))
    }
}

/// Connection to NATS (JetStream enabled), shared by `relay up` and `relay node`.
#[derive(Args)]
pub struct NatsArgs {
    /// NATS server URL; enables the bus (invocations and flight updates on subjects).
    #[arg(long, env = "RELAY_NATS_URL", value_name = "URL")]
    nats: Option<String>,
    /// NATS credentials file (.creds).
    #[arg(long, env = "RELAY_NATS_CREDS", value_name = "FILE", conflicts_with_all = ["nats_user", "nats_token_file"])]
    nats_creds: Option<PathBuf>,
    /// NATS user; its password comes from RELAY_NATS_PASSWORD or --nats-password-file.
    #[arg(long, env = "RELAY_NATS_USER", conflicts_with = "nats_token_file")]
    nats_user: Option<String>,
    /// File holding the NATS password (or set RELAY_NATS_PASSWORD). Secrets are never
    /// taken on the command line: `ps` shows it to every user.
    #[arg(long, env = "RELAY_NATS_PASSWORD_FILE", value_name = "FILE")]
    nats_password_file: Option<PathBuf>,
    /// File holding the NATS authentication token (or set RELAY_NATS_TOKEN).
    #[arg(long, env = "RELAY_NATS_TOKEN_FILE", value_name = "FILE")]
    nats_token_file: Option<PathBuf>,
    /// The NATS password: refused on the command line (every user can read it with
    /// ps), set RELAY_NATS_PASSWORD or pass --nats-password-file.
    #[arg(long, env = "RELAY_NATS_PASSWORD", hide_env_values = true)]
    nats_password: Option<String>,
    /// The NATS authentication token: refused on the command line, set RELAY_NATS_TOKEN
    /// or pass --nats-token-file.
    #[arg(long, env = "RELAY_NATS_TOKEN", hide_env_values = true)]
    nats_token: Option<String>,
}

impl NatsArgs {
    pub fn config(
        &self,
        bus: Option<&BusArgs>,
    ) -> anyhow::Result<Option<relay_broker::nats::NatsConfig>> {
        use relay_broker::nats::NatsAuth;
        let password = secret(
            self.nats_password_file.as_ref(),
            self.nats_password.as_ref(),
            "nats-password",
        )?;
        let token = secret(
            self.nats_token_file.as_ref(),
            self.nats_token.as_ref(),
            "nats-token",
        )?;
        let request_token = match bus {
            Some(bus) => secret(
                bus.nats_request_token_file.as_ref(),
                bus.nats_request_token.as_ref(),
                "nats-request-token",
            )?,
            None => None,
        };
        let Some(url) = self.nats.clone() else {
            return Ok(None);
        };
        let auth = if let Some(c) = &self.nats_creds {
            NatsAuth::Creds(c.clone())
        } else if let Some(u) = &self.nats_user {
            let Some(p) = password else {
                anyhow::bail!(
                    "--nats-user needs a password: set RELAY_NATS_PASSWORD or pass --nats-password-file"
                );
            };
            NatsAuth::UserPassword(u.clone(), p)
        } else if let Some(t) = token {
            NatsAuth::Token(t)
        } else {
            NatsAuth::None
        };
        let mut config = relay_broker::nats::NatsConfig::new(url, auth);
        if let Some(bus) = bus {
            config.stream_max_age = std::time::Duration::from_secs(bus.nats_stream_max_age);
            config.stream_max_bytes = bus.nats_stream_max_bytes;
            config.request_token = request_token;
        }
        Ok(Some(config))
    }
}

/// The broker's side of the bus: what `relay up` serves on NATS.
#[derive(Args)]
pub struct BusArgs {
    /// How long the flight-update stream (RELAY_FLIGHTS) keeps updates, in seconds; 0
    /// keeps them until --nats-stream-max-bytes pushes them out.
    #[arg(
        long,
        env = "RELAY_NATS_STREAM_MAX_AGE",
        default_value_t = 7 * 24 * 3600,
        value_name = "SECONDS"
    )]
    nats_stream_max_age: u64,
    /// Most bytes the flight-update stream keeps (oldest updates go first); -1: no limit.
    #[arg(
        long,
        env = "RELAY_NATS_STREAM_MAX_BYTES",
        default_value_t = 1 << 30,
        value_name = "BYTES",
        allow_negative_numbers = true,
        value_parser = clap::value_parser!(i64).range(-1..)
    )]
    nats_stream_max_bytes: i64,
    /// A file holding a shared secret that every request on relay.v1.invoke.* and
    /// relay.v1.cmd.* must carry in its `Relay-Token` header (else it is answered
    /// `unauthorized`); or set RELAY_NATS_REQUEST_TOKEN. Without it, NATS's own
    /// permissions decide who may publish there; without it and without NATS
    /// credentials the bus is open, and approving, steering, interrupting and speaking
    /// as the operator or an agent over it are refused.
    #[arg(long, env = "RELAY_NATS_REQUEST_TOKEN_FILE", value_name = "FILE")]
    nats_request_token_file: Option<PathBuf>,
    /// The request token: refused on the command line, set RELAY_NATS_REQUEST_TOKEN or
    /// pass --nats-request-token-file.
    #[arg(long, env = "RELAY_NATS_REQUEST_TOKEN", hide_env_values = true)]
    nats_request_token: Option<String>,
}

/// A secret from `--FLAG-file` (trailing newline dropped), else from its environment
/// variable (empty: unset). Never from the command line:
/// `refuse_secrets_on_command_line` turned that down before any command ran.
fn secret(
    file: Option<&PathBuf>,
    from_env: Option<&String>,
    flag: &str,
) -> anyhow::Result<Option<String>> {
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read --{flag}-file {}: {e}", path.display()))?;
        return Ok(Some(text.trim_end_matches(['\n', '\r']).to_string()));
    }
    Ok(from_env.filter(|v| !v.is_empty()).cloned())
}

/// How the process's log lines are written.
#[derive(Args, Clone, Copy)]
pub struct LogArgs {
    /// The log lines on stderr: `text` for a person, `json` (one JSON object a line,
    /// with the spans it was logged in: `request` with the API method, `flight` with its
    /// id) for a log shipper. Filtered by RUST_LOG (default `info`).
    #[arg(long, value_enum, default_value = "text", env = "RELAY_LOG_FORMAT")]
    pub log_format: LogFormat,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Logs on stderr, filtered by `RUST_LOG` (default `info`), as `format` says.
pub fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        // Every line one object, its spans' fields included (a line a flight caused
        // carries `"flight":"flt_..."` in its `spans`).
        LogFormat::Json => logs.json().with_ansi(false).init(),
    }
}
