//! `relay up`: the broker with its embedded runtime, the HTTP API on loopback, and
//! clean shutdown.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::broker::{Broker, BrokerConfig};
use crate::error::BrokerError;
use crate::files::FileError;
use crate::http::{router, ApiState, HttpLimits};
use crate::plane::Plane;
use crate::seal::{AgentTokens, BusKey, NodeKey};
use relay_infra::retry::{self, Retryable};
use relay_infra::storage::StorageError;
use relay_runtime::{AccessIssuer, RelayAccess, Runtime, RuntimeConfig, RuntimeError};

/// Why `relay up` could not start or stopped in error (and why `relay node-key` could
/// not derive a key). The CLI says it and exits; none is retried.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "refusing to listen on {0}: the local API only listens on loopback (127.0.0.1 or ::1)"
    )]
    NotLoopback(SocketAddr),
    #[error("cannot listen on {addr} (pass --listen 127.0.0.1:0 for any free port)")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("node name {0:?} is not valid: use letters, digits, '-' or '_'")]
    InvalidNodeName(String),
    #[error("{} is not a broker's data dir (no db/ or bus.key): run this with the --data-dir of `relay up`", .0.display())]
    NotADataDir(PathBuf),
    /// The writer stopped on a failed write; the process stopped with it.
    #[error("stopped: writing to {} failed (see the log above); nothing acknowledged was lost", .0.display())]
    WriteFailed(PathBuf),
    /// The storage thread spent longer than the bound on one group commit (sled waiting
    /// on a disk that does not answer, or that filled past the reserve): the process
    /// stops rather than wedge, so a supervisor can start it again.
    #[error("stopped: the storage thread has been stuck for {} s writing to {} (over the {} s bound); the disk may be full or failing: free space or check the disk, then start relay up again", .stuck.as_secs(), .dir.display(), .bound.as_secs())]
    StorageStalled {
        dir: PathBuf,
        stuck: Duration,
        bound: Duration,
    },
    #[error(transparent)]
    Files(#[from] FileError),
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error(transparent)]
    Connect(#[from] crate::nats::ConnectError),
    #[error(transparent)]
    FlightStream(#[from] crate::nats::StreamError),
    #[error(transparent)]
    Attach(#[from] crate::plane::AttachError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
}

// What `relay up` writes to `<data-dir>/api.json`: part of the contract, so clients
// read it without this crate.
pub use relay_protocol::api::{ApiInfo, API_FILE};

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub broker: BrokerConfig,
    /// Connect to NATS and serve the bus (`None`: the embedded default, no NATS).
    pub nats: Option<crate::nats::NatsConfig>,
    /// See [`RuntimeConfig::turn_idle_timeout`].
    pub turn_idle_timeout: Option<Duration>,
    /// See [`RuntimeConfig::turn_stall_timeout`].
    pub turn_stall_timeout: Option<Duration>,
    /// Limits on the API's connections.
    pub http: HttpLimits,
    /// The `relay` program: each agent's session gets the broker's URL, its scoped
    /// token and `relay mcp` from it (`None`: sessions run without access to Relay).
    pub relay_program: Option<PathBuf>,
    /// Runs (`sh -c`) when an approval waits for a person ([`crate::alerts`]).
    pub notify_command: Option<String>,
    /// Says where the broker serves on stderr, for a person (off with JSON logs, whose
    /// every line must be JSON: the `relay broker up` log line has the same facts).
    pub banner: bool,
}

/// Runs until `shutdown` fires, then drains: stops accepting requests, commits what is
/// queued and flushes.
pub async fn run(config: ServerConfig, shutdown: CancellationToken) -> Result<(), ServeError> {
    if !config.listen.ip().is_loopback() {
        return Err(ServeError::NotLoopback(config.listen));
    }
    crate::files::private_dir(&config.data_dir)?;
    // Durable writes are refused while the disk is under the reserve: sled must never
    // meet ENOSPC (it does not recover from it; see relay_infra::disk).
    relay_infra::disk::guard_space(&config.data_dir, config.broker.disk_reserve);
    let stall_bound = config.broker.storage_stall_timeout;
    let stalled = |stuck| ServeError::StorageStalled {
        dir: config.data_dir.clone(),
        stuck,
        bound: stall_bound,
    };
    let dir = config.data_dir.clone();
    let (store, migrated) = relay_infra::storage::read(move || {
        crate::store::migrate::open_data_dir(&dir, &mut |done, total| {
            tracing::info!(done, total, "migrating the v1 store to the event log v2");
        })
    })
    .await??;
    if let Some(m) = migrated {
        tracing::info!(events = m.events, v1_kept = %m.kept_v1.display(), v1_bytes = m.v1_bytes, v2_bytes = m.v2_bytes, "migrated the v1 store: the v1 database is kept until you remove it");
    }
    // The writer stops last: the runtime's final reports (turns failed by the shutdown)
    // must still be committed.
    let writer_stop = CancellationToken::new();
    let (broker, writer) = Broker::start(store, config.broker.clone(), writer_stop.clone()).await?;
    // The address and the token first: the runtime hands them to the agents' sessions.
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServeError::Listen {
            addr: config.listen,
            source,
        })?;
    let addr = listener.local_addr()?;
    let token = load_or_create_token(&config.data_dir);
    let url = format!("http://{addr}");
    let agent_tokens = AgentTokens::new(token.as_bytes());
    let runtime_stop = CancellationToken::new();
    // The embedded runtime keeps its records in the broker's database: one flush per
    // group commit makes both durable.
    let runtime_config = RuntimeConfig {
        data_dir: config.data_dir.clone(),
        shared_db: Some(broker.store().durable().clone()),
        node: None,
        turn_idle_timeout: config.turn_idle_timeout,
        turn_stall_timeout: config.turn_stall_timeout,
        turn_quiet_note: Some(relay_runtime::DEFAULT_TURN_QUIET_NOTE),
        access: config.relay_program.clone().map(|program| {
            let (url, tokens) = (url.clone(), agent_tokens.clone());
            AccessIssuer::new(move |agent| {
                Some(RelayAccess {
                    agent: agent.to_string(),
                    url: url.clone(),
                    token: tokens.token(agent),
                    program: program.clone(),
                })
            })
        }),
        // A long answer is written to the log's text files first, by the agent's own
        // worker, so the storage thread writes a reference to it (`store::log::texts`).
        texts: Some(relay_runtime::TextSink::new(crate::store::LogTexts(
            broker.store().clone(),
        ))),
    };
    let stop = runtime_stop.clone();
    let (runtime, reports) =
        relay_infra::storage::read(move || Runtime::start(runtime_config, stop)).await??;
    let notifier = config
        .notify_command
        .as_deref()
        .map(|command| crate::alerts::Notifier::new(command, &url));
    let (plane, plane_task) =
        Plane::start(broker.clone(), runtime.clone(), reports, notifier).await?;
    // Turns whose end came before their worktree's commit (a crash in between): the
    // commit is made now, once, and reported on its flight.
    drop(runtime.reconcile_worktrees());
    let mut nats_status: Option<crate::http::NatsStatusFn> = None;
    let mut bus = None;
    if let Some(nats) = &config.nats {
        // Remote agents' flights wait for NATS instead of failing while it is down.
        plane.expect_nats();
        if nats.is_open() {
            tracing::warn!(
                url = %crate::nats::redact_url(&nats.url),
                "the bus is open (no NATS credentials, no request token): its clients may read, ask and post under their own names; approving, steering, interrupting and speaking as the operator or an agent over it are refused. To allow them, start with {}. The flight stream is not to be trusted either: anyone on it may call the JetStream API ($JS.API.>: purge or delete the streams, their messages, a pending dispatch) and flood relay.v1.flight.> to evict the broker's updates, unless NATS permissions keep clients off both (ops/nats/relay-users.conf); read a flight over HTTP",
                relay_protocol::bus::TRUST_FLAGS
            );
        }
        let key_path = config.data_dir.join(BUS_KEY_FILE);
        let bus_key = BusKey::new(
            relay_infra::storage::read(move || crate::files::read_or_create_key(&key_path))
                .await??,
        );
        let tracker = crate::nats::Tracker::new(&nats.url);
        nats_status = Some({
            let tracker = tracker.clone();
            Arc::new(move || tracker.status())
        });
        // A short first try: refused credentials or a server without JetStream stop the
        // start with a clear error. An unreachable server is retried in the background
        // for as long as it takes, while the API and the local agents serve.
        let first = crate::nats::connect(
            nats,
            "relay-broker",
            &tracker,
            Some(FIRST_NATS_TRY),
            &shutdown,
        )
        .await;
        let client = match first {
            Ok(client) => {
                attach_bus(&client, nats, &plane, &bus_key).await?;
                Some(client)
            }
            Err(e @ crate::nats::ConnectError::Unreachable { .. }) => {
                tracing::warn!(error = %e, "NATS is not reachable; serving without it and retrying in the background");
                None
            }
            // Asked to stop while trying: the bus task ends at once, the drain goes on.
            Err(crate::nats::ConnectError::Stopped) => None,
            Err(e) => return Err(e.into()),
        };
        bus = Some(broker.tasks().track(run_bus(Bus {
            client,
            key: bus_key,
            config: nats.clone(),
            tracker,
            broker: broker.clone(),
            plane: plane.clone(),
            cursor: config.data_dir.join("nats.cursor"),
            shutdown: shutdown.clone(),
            writer_stop: writer_stop.clone(),
        })));
    }
    // The dashboard's login key and revocations (files in the data dir: blocking).
    let web = {
        let (url, dir) = (url.clone(), config.data_dir.clone());
        Arc::new(relay_infra::storage::read(move || crate::http::WebAuth::open(&url, &dir)).await??)
    };
    // api.json last: when it names this process, everything is up.
    write_api_info(
        &config.data_dir,
        &ApiInfo {
            url: url.clone(),
            token: token.clone(),
            pid: std::process::id(),
        },
    )?;
    let state = ApiState {
        broker: broker.clone(),
        token: Arc::from(token.as_str()),
        agent_tokens: Some(agent_tokens),
        data_dir: config.data_dir.display().to_string(),
        control: Some(crate::plane::control(&plane)),
        nats: nats_status,
        shutdown: shutdown.clone(),
        web,
        limits: config.http.clone(),
        metrics: Some(crate::telemetry::Metrics::start(&broker).await?),
    };
    let max_body = config.broker.max_message_bytes + 64 * 1024;
    tracing::info!(%url, data_dir = %config.data_dir.display(), last_seq = broker.last_seq(), "relay broker up");
    if config.banner {
        eprintln!("{}", banner(&url, &config.data_dir));
    }
    let app = router(state, max_body);
    let http_shutdown = shutdown.clone();
    let server = broker.tasks().track(crate::http::serve(
        listener,
        app,
        config.http.clone(),
        http_shutdown,
        broker.refusals().clone(),
    ));
    let failed = tokio::select! {
        _ = shutdown.cancelled() => false,
        _ = broker.failed() => {
            tracing::error!("the broker can no longer write to its data dir; stopping");
            shutdown.cancel();
            true
        }
        stuck = relay_infra::disk::stalled(stall_bound) => {
            // No drain: it would wait on the stuck thread. The caller exits the process
            // (the thread is not joined); the lock on the database dies with it.
            tracing::error!(stuck_s = stuck.as_secs(), "the storage thread is stuck; stopping");
            shutdown.cancel();
            return Err(stalled(stuck));
        }
    };
    // The drain commits through the storage thread: if that is stuck, stop waiting.
    let drain = drain(Drain {
        runtime_stop,
        runtime,
        plane,
        plane_task,
        writer_stop,
        bus,
        server,
        broker,
        writer,
    });
    tokio::select! {
        r = drain => r?,
        stuck = relay_infra::disk::stalled(stall_bound) => {
            tracing::error!(stuck_s = stuck.as_secs(), "the storage thread is stuck; stopping without the rest of the drain");
            return Err(stalled(stuck));
        }
    }
    if failed {
        return Err(ServeError::WriteFailed(config.data_dir.clone()));
    }
    tracing::info!("relay broker stopped");
    Ok(())
}

struct Drain {
    runtime_stop: CancellationToken,
    runtime: Runtime,
    plane: Plane,
    plane_task: tokio::task::JoinHandle<()>,
    writer_stop: CancellationToken,
    bus: Option<tokio::task::JoinHandle<()>>,
    server: tokio::task::JoinHandle<()>,
    broker: Broker,
    writer: tokio::task::JoinHandle<()>,
}

/// After `shutdown`: stops the runtime, the plane, the bus and the API, then the writer.
async fn drain(d: Drain) -> Result<(), ServeError> {
    let Drain {
        runtime_stop,
        runtime,
        plane,
        plane_task,
        writer_stop,
        bus,
        server,
        broker,
        writer,
    } = d;
    // Stop the harness sessions (children killed, live turns failed with a reason), let
    // their last reports commit, then stop the writer.
    runtime_stop.cancel();
    runtime.stopped().await;
    drop(runtime);
    drop(plane);
    let _ = plane_task.await;
    writer_stop.cancel();
    if let Some(bus) = bus {
        let _ = bus.await;
    }
    if let Err(e) = server.await {
        tracing::warn!(error = %e, "http server");
    }
    let tasks = broker.tasks().clone();
    drop(broker);
    writer.await?;
    // What is left (feeds, watches, answers to requests) ends with the writer.
    tasks.stopped().await;
    Ok(())
}

/// The broker's bus key in its data dir ([`crate::seal`]).
pub const BUS_KEY_FILE: &str = "bus.key";

/// `relay node-key NAME`: the key of node `name`, derived from the bus key of the broker
/// whose data dir is `data_dir` (the bus key is made if missing). Blocking: call it on
/// the storage thread.
pub fn node_key(data_dir: &Path, name: &str) -> Result<NodeKey, ServeError> {
    if !relay_protocol::domain::valid_agent_name(name) {
        return Err(ServeError::InvalidNodeName(name.to_string()));
    }
    // A key made anywhere else would open nothing the broker seals.
    if crate::store::migrate::layout(data_dir) == crate::store::migrate::Layout::Empty
        && !data_dir.join(BUS_KEY_FILE).exists()
    {
        return Err(ServeError::NotADataDir(data_dir.to_path_buf()));
    }
    crate::files::private_dir(data_dir)?;
    let bus = crate::files::read_or_create_key(&data_dir.join(BUS_KEY_FILE))?;
    Ok(BusKey::new(bus).node(name))
}

/// How long `relay up` tries NATS before it goes on without it (and keeps trying).
const FIRST_NATS_TRY: Duration = Duration::from_secs(2);

/// Makes sure the flight stream exists and connects the plane (remote agents) to NATS.
async fn attach_bus(
    client: &async_nats::Client,
    config: &crate::nats::NatsConfig,
    plane: &Plane,
    key: &BusKey,
) -> Result<(), ServeError> {
    crate::nats::ensure_flight_stream(client, config).await?;
    // Remote agents must be reachable before the first request can name one.
    plane.attach_nats(client.clone(), key.clone()).await?;
    Ok(())
}

struct Bus {
    /// Already connected and attached, or `None` to connect first.
    client: Option<async_nats::Client>,
    /// What the broker seals its nodes' messages with.
    key: BusKey,
    config: crate::nats::NatsConfig,
    tracker: crate::nats::Tracker,
    broker: Broker,
    plane: Plane,
    cursor: PathBuf,
    shutdown: CancellationToken,
    writer_stop: CancellationToken,
}

/// Waits between tries to bring the bus up while NATS cannot be reached or set up.
const BUS_BACKOFF: retry::ExponentialBuilder =
    retry::forever(Duration::from_secs(1), Duration::from_secs(30));

/// The broker on NATS: connects (for as long as it takes), then serves the request
/// subjects until `shutdown` and publishes committed events until `writer_stop`.
async fn run_bus(bus: Bus) {
    let client = match bus.client {
        Some(client) => client,
        None => {
            // Each try owns its copies: a future borrowing them is not `Send` to the
            // compiler through backon's generic types.
            let attempt = || {
                let (config, tracker, plane, key, shutdown) = (
                    bus.config.clone(),
                    bus.tracker.clone(),
                    bus.plane.clone(),
                    bus.key.clone(),
                    bus.shutdown.clone(),
                );
                async move {
                    let client =
                        crate::nats::connect(&config, "relay-broker", &tracker, None, &shutdown)
                            .await?;
                    attach_bus(&client, &config, &plane, &key).await?;
                    Ok::<_, ServeError>(client)
                }
            };
            let shutdown = &bus.shutdown;
            let up = retry::until_stopped(shutdown, |sleeper| {
                attempt
                    .retry(BUS_BACKOFF)
                    .sleep(sleeper)
                    // A try that failed because of the stop is worth no word and no other.
                    .when(|_| !shutdown.is_cancelled())
                    .notify(|e, wait| {
                        tracing::error!(error = %e, retry_in = ?wait, "NATS bus not up");
                    })
            })
            .await;
            match up {
                Some(Ok(client)) => {
                    tracing::info!(url = %crate::nats::redact_url(&bus.config.url), "NATS reached; serving the bus");
                    client
                }
                // Stopped, while waiting or by a try that failed because of it.
                _ => return,
            }
        }
    };
    let service = crate::nats::Service::new(
        client.clone(),
        bus.broker.clone(),
        Some(crate::plane::control(&bus.plane)),
        &bus.config,
    );
    let counters = service.counters.clone();
    let serve = async {
        if let Err(e) = service.serve(bus.shutdown.clone()).await {
            tracing::error!(error = %e, "NATS service stopped");
        }
    };
    let publish = crate::nats::publish(
        client.clone(),
        bus.broker.clone(),
        bus.cursor.clone(),
        counters,
        bus.key.stream_ids(),
        bus.writer_stop.clone(),
    );
    tokio::join!(serve, publish);
}

/// The token made at first start is kept in api.json and reused after a restart, so
/// clients configured with it keep working.
fn load_or_create_token(dir: &Path) -> String {
    if let Ok(text) = std::fs::read_to_string(dir.join(API_FILE)) {
        if let Ok(info) = serde_json::from_str::<ApiInfo>(&text) {
            if info.token.len() >= 32 {
                return info.token;
            }
        }
    }
    let bytes: [u8; 32] = rand::random();
    relay_protocol::hex::encode(&bytes)
}

fn write_api_info(dir: &Path, info: &ApiInfo) -> Result<(), ServeError> {
    Ok(crate::files::write_private(
        &dir.join(API_FILE),
        serde_json::to_string_pretty(info)?.as_bytes(),
    )?)
}

/// What `relay up` says on stderr once it serves: where, the dashboard and how to log a
/// browser in, and where clients find it (a data dir other than the default must be
/// named to them).
fn banner(url: &str, data_dir: &Path) -> String {
    format!(
        "relay: serving on {url} (data dir {dir}; token in {api})\n\
         relay: dashboard at {url}/ : run `relay open` for a one-time login link\n\
         relay: clients find this broker through {api} (`relay --data-dir {dir} ...` or RELAY_DATA_DIR={dir}; the default data dir needs neither)",
        dir = data_dir.display(),
        api = data_dir.join(API_FILE).display(),
    )
}
