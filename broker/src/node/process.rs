//! `relay node`: a runtime on another host. It serves its agents' dispatches from the
//! dispatch stream (a turn's start recorded in its sled before the dispatch is
//! acknowledged, so none runs twice), answers the broker's controls, and forwards its
//! runtime's reports in order (see the [module header](super) for the wire).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, consumer, AckKind};
use futures::StreamExt;
use relay_infra::retry::Retryable;
use relay_protocol::api::{ControlAnswer, ErrorBody};
use relay_protocol::bus::subjects;
use relay_protocol::domain::{FlightChange, FlightState};
use relay_protocol::runtime::Report;
use relay_runtime::{DispatchState, Runtime, RuntimeConfig};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::wire;
use crate::error::BrokerError;
use crate::files::FileError;
use crate::nats::NatsConfig;
use crate::seal::NodeKey;
use crate::tasks::Tasks;

/// Why `relay node` could not start or stopped in error. The CLI says it and exits.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("node name {0:?} is not valid: use letters, digits, '-' or '_'")]
    InvalidName(String),
    /// `relay node-key` has not been run for this node, or its file is elsewhere.
    #[error("no node key at {0}: on the broker's host run `relay node-key {1} --out {0}` (with the broker's --data-dir), copy the file here, and start again", .key_file.display(), .name)]
    NoKey { key_file: PathBuf, name: String },
    #[error(transparent)]
    Files(#[from] FileError),
    #[error(transparent)]
    Storage(#[from] relay_infra::storage::StorageError),
    #[error(transparent)]
    Runtime(#[from] relay_runtime::RuntimeError),
    #[error(transparent)]
    Connect(#[from] crate::nats::ConnectError),
    #[error(transparent)]
    Streams(#[from] jetstream::context::CreateStreamError),
    #[error(transparent)]
    Stream(#[from] jetstream::context::GetStreamError),
    #[error(transparent)]
    Consumer(#[from] jetstream::stream::ConsumerError),
    #[error(transparent)]
    Messages(#[from] jetstream::consumer::StreamError),
    #[error(transparent)]
    Subscribe(#[from] async_nats::SubscribeError),
    /// A report could not be published (the node was stopped while it waited).
    #[error(transparent)]
    Report(#[from] BrokerError),
}

/// A delivered dispatch not acknowledged within this is delivered again (the node sends
/// "in progress" while a turn is waking).
const DISPATCH_ACK_WAIT: Duration = Duration::from_secs(10);

/// How long a stopping node waits for its last reports to reach JetStream.
const LAST_REPORTS: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub name: String,
    pub data_dir: PathBuf,
    pub nats: NatsConfig,
    /// This node's key (`relay node-key`): what it opens and seals its messages with.
    pub key: NodeKey,
    /// See [`RuntimeConfig::turn_idle_timeout`].
    pub turn_idle_timeout: Option<Duration>,
    /// See [`RuntimeConfig::turn_stall_timeout`].
    pub turn_stall_timeout: Option<Duration>,
    /// Print a line for a person on stderr once it serves (not with JSON logs, where
    /// every line of stderr is JSON: the `relay node up` log line says it).
    pub banner: bool,
}

/// The key of node `name` in `key_file`, where `relay node-key NAME --out FILE` wrote it
/// on the broker's host.
pub async fn read_key(key_file: &Path, name: &str) -> Result<NodeKey, NodeError> {
    let path = key_file.to_path_buf();
    let key = relay_infra::storage::read(move || crate::files::read_key(&path)).await??;
    let Some(key) = key else {
        return Err(NodeError::NoKey {
            key_file: key_file.to_path_buf(),
            name: name.to_string(),
        });
    };
    Ok(NodeKey::new(key))
}

/// `relay node`: runs the harness-session plane for the agents of `config.name`.
pub async fn run(config: NodeConfig, shutdown: CancellationToken) -> Result<(), NodeError> {
    if !relay_protocol::domain::valid_agent_name(&config.name) {
        return Err(NodeError::InvalidName(config.name));
    }
    crate::files::private_dir(&config.data_dir)?;
    let mut nats = config.nats.clone();
    nats.inbox_prefix = Some(subjects::node_inbox(&config.name));
    // A node has nothing to do without NATS: it waits for it as long as it takes (but
    // refused credentials end it at once).
    let tracker = crate::nats::Tracker::new(&config.nats.url);
    let client = match crate::nats::connect(
        &nats,
        &format!("relay-node-{}", config.name),
        &tracker,
        None,
        &shutdown,
    )
    .await
    {
        Ok(client) => client,
        Err(crate::nats::ConnectError::Stopped) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let js = jetstream::new(client.clone());
    wire::ensure_streams(&js).await?;

    let runtime_stop = CancellationToken::new();
    let runtime_config = RuntimeConfig {
        data_dir: config.data_dir.clone(),
        shared_db: None,
        node: Some(config.name.clone()),
        turn_idle_timeout: config.turn_idle_timeout,
        turn_stall_timeout: config.turn_stall_timeout,
        turn_quiet_note: Some(relay_runtime::DEFAULT_TURN_QUIET_NOTE),
        // A node's agents do not reach the broker's API: it listens on its own host's loopback.
        access: None,
        // Nor its log: a long answer goes over the bus in its report.
        texts: None,
    };
    let stop = runtime_stop.clone();
    let (runtime, reports) =
        relay_infra::storage::read(move || Runtime::start(runtime_config, stop)).await??;
    let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
    let forward_stop = CancellationToken::new();
    // The node's tasks: the forwarder, and the answers to controls.
    let tasks = Tasks::new(&forward_stop);
    let forwarder = tasks.track(forward_reports(
        js.clone(),
        config.key.clone(),
        config.name.clone(),
        runtime.clone(),
        reports,
        pending.clone(),
        forward_stop.clone(),
    ));

    // Flights that ended here (their turn over, or ended before it started) whose end
    // may not have reached the broker: reports wait in memory and died with the last
    // process. The recorded end is sent (again; the broker refuses a second end), after
    // `running`, which a completed turn needs and the broker may not have seen.
    // The commits of worktrees whose reports the last process kept but may not have
    // seen in JetStream (see `ThreadStore::put_commit_reports`): sent again (the broker
    // takes the same commit once), the flights' commits only (the branch's state in them
    // may be older than what was sent since).
    for (flight, reports) in runtime.threads().commit_reports_unsent().await? {
        for report in reports {
            if let Report::Flight { .. } = report {
                wire::publish_report(&js, &config.key, &config.name, &report, &forward_stop)
                    .await?;
            }
        }
        runtime
            .threads()
            .forget_commit_reports_durably(&flight)
            .await?;
    }
    for (invocation, report) in runtime.threads().ended_unsent().await? {
        if let Report::Flight {
            flight,
            change:
                FlightChange::State {
                    to: FlightState::Completed,
                    ..
                },
        } = &report
        {
            let running = Report::Flight {
                flight: flight.clone(),
                change: FlightChange::State {
                    to: FlightState::Running,
                    reason: None,
                    output: None,
                },
            };
            wire::publish_report(&js, &config.key, &config.name, &running, &forward_stop).await?;
        }
        wire::publish_report(&js, &config.key, &config.name, &report, &forward_stop).await?;
        if let Report::Flight { flight, .. } = &report {
            runtime
                .threads()
                .set_dispatch_state(&invocation, DispatchState::Done, flight)
                .await?;
        }
    }
    // Turns that were running when this node last stopped cannot be resumed: their
    // harness process died with it. Fail them with a reason. (A dispatch whose turn had
    // not started has no record: it was never acknowledged, so JetStream delivers it
    // again below.)
    for (invocation, flight) in runtime.threads().unfinished_dispatches().await? {
        let report = Report::Flight {
            flight: flight.clone(),
            change: FlightChange::State {
                to: FlightState::Failed,
                reason: Some(format!(
                    "node {} restarted while this flight was running (its harness process ended with it), so it may have partly run; it is not run twice: ask again to continue",
                    config.name
                )),
                output: None,
            },
        };
        wire::publish_report(&js, &config.key, &config.name, &report, &forward_stop).await?;
        runtime
            .threads()
            .set_dispatch_state(&invocation, DispatchState::Done, &flight)
            .await?;
    }
    // Turns whose end came before their worktree's commit (a crash in between): the
    // commit is made now, once, and reported on its flight.
    drop(runtime.reconcile_worktrees());

    let mut dispatches = dispatch_messages(&js, &config.name).await?;
    let mut control = client
        .subscribe(subjects::node_control(&config.name))
        .await?;
    write_ready(&config)?;
    tracing::info!(node = %config.name, "relay node up");
    if config.banner {
        eprintln!("relay node {}: serving its agents over NATS", config.name);
    }

    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            m = dispatches.next() => {
                let again = match m {
                    Some(Ok(msg)) => {
                        on_dispatch(&runtime, &config.key, &pending, msg).await;
                        None
                    }
                    Some(Err(e)) if wire::pull_is_gone(&e) => Some(e.to_string()),
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "dispatch consumer");
                        None
                    }
                    None => Some("the pull stream ended".into()),
                };
                // Its consumer deleted under it, or a nats-server back without the pull
                // or the consumer (an empty store): the streams and the consumer are
                // made again (the same durable consumer where it is still there).
                if let Some(why) = again {
                    tracing::warn!(node = %config.name, "dispatches: {why}; reading them anew");
                    match reopen_dispatches(&js, &config.name, &shutdown).await {
                        Some(d) => dispatches = d,
                        None => break,
                    }
                }
            }
            m = control.next() => {
                let Some(msg) = m else { break };
                let runtime = runtime.clone();
                let client = client.clone();
                let key = config.key.clone();
                tasks.track(async move {
                    let control = wire::open_control(&key, msg.subject.as_str(), &msg.payload);
                    let (answer, sealed) = match control {
                        Ok(c) => (
                            match runtime.control(c).await {
                                Ok(()) => ControlAnswer::done(),
                                // With its own code: a steer over the limit is
                                // payload_too_large on the node as it is locally.
                                Err(e) => ControlAnswer::Refused(ErrorBody {
                                    error: crate::error::runtime_error(e).to_api(),
                                }),
                            },
                            true,
                        ),
                        Err(refused) => (refused, false),
                    };
                    if let Some(reply) = msg.reply {
                        wire::answer_control(&client, &key, reply, &answer, sealed).await;
                    }
                });
            }
        }
    }
    runtime_stop.cancel();
    runtime.stopped().await;
    drop(runtime);
    // Let the last reports (turns failed by the shutdown) reach JetStream. What does not
    // (NATS is away) is settled at the next start from the dispatch records.
    let _ = tokio::time::timeout(LAST_REPORTS, forwarder).await;
    forward_stop.cancel();
    tasks.stopped().await;
    // Bounded: a client without a server would wait for one for ever, and a stop must
    // end the process.
    let _ = tokio::time::timeout(LAST_REPORTS, client.flush()).await;
    Ok(())
}

/// This node's durable consumer of its dispatches, and its [`wire::pull`] stream.
async fn dispatch_messages(
    js: &jetstream::Context,
    name: &str,
) -> Result<consumer::pull::Stream, NodeError> {
    let consumer: consumer::PullConsumer = js
        .get_stream(subjects::DISPATCH_STREAM)
        .await?
        .get_or_create_consumer(
            &format!("node-{name}"),
            consumer::pull::Config {
                durable_name: Some(format!("node-{name}")),
                filter_subject: subjects::dispatch(name),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: DISPATCH_ACK_WAIT,
                ..Default::default()
            },
        )
        .await?;
    Ok(wire::pull(&consumer).await?)
}

/// [`dispatch_messages`], with the streams made again if they are gone, tried until it
/// works or the node stops (`None`).
async fn reopen_dispatches(
    js: &jetstream::Context,
    name: &str,
    shutdown: &CancellationToken,
) -> Option<consumer::pull::Stream> {
    let attempt = || async {
        wire::ensure_streams(js).await?;
        dispatch_messages(js, name).await
    };
    tokio::select! {
        _ = shutdown.cancelled() => None,
        opened = attempt
            .retry(REOPEN_BACKOFF)
            .notify(|e, wait| {
                tracing::error!(error = %e, retry_in = ?wait, "cannot read dispatches yet");
            }) => opened.ok(),
    }
}

/// Waits between tries to read this node's dispatches again.
const REOPEN_BACKOFF: relay_infra::retry::ExponentialBuilder =
    relay_infra::retry::forever(Duration::from_millis(200), Duration::from_secs(10));

/// Dispatches delivered but whose turn has not started: flight id -> (invocation, message).
type Pending = Arc<Mutex<HashMap<String, (String, jetstream::Message)>>>;

async fn on_dispatch(runtime: &Runtime, key: &NodeKey, pending: &Pending, msg: jetstream::Message) {
    let dispatch = match wire::open_dispatch(key, msg.subject.as_str(), &msg.payload) {
        Ok(d) => d,
        Err(wire::Unopened::Unsealed(e)) => {
            tracing::error!(subject = %msg.subject, "dispatch dropped: {e}; if it came from this node's broker, this node's key is not the one `relay node-key` derives from the broker's bus key");
            let _ = msg.ack_with(AckKind::Term).await;
            return;
        }
        Err(wire::Unopened::Malformed(e)) => {
            tracing::warn!(error = %e, "malformed dispatch dropped");
            let _ = msg.ack_with(AckKind::Term).await;
            return;
        }
    };
    let inv = dispatch.invocation.id.clone();
    let flight = dispatch.flight.id.clone();
    let already_waiting = pending
        .lock()
        .map(|p| p.contains_key(&flight))
        .unwrap_or(false);
    if already_waiting {
        // Redelivered while its session is still waking: tell JetStream to wait.
        let _ = msg.ack_with(AckKind::Progress).await;
        return;
    }
    match runtime.threads().dispatch_state(&inv).await {
        Ok(Some(_)) => {
            tracing::info!(invocation = %inv, "dispatch already started here; not running it again");
            let _ = msg.ack().await;
            return;
        }
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(error = %e, "cannot read dispatch state; leaving it for redelivery");
            return;
        }
    }
    if let Ok(mut p) = pending.lock() {
        p.insert(flight.clone(), (inv, msg));
    }
    if let Err(e) = runtime.dispatch(dispatch).await {
        tracing::warn!(%flight, error = %e, "dispatch refused");
    }
}

/// Sends the runtime's reports to the broker in order; marks and acknowledges a dispatch
/// once its turn starts or its flight ends.
async fn forward_reports(
    js: jetstream::Context,
    key: NodeKey,
    node: String,
    runtime: Runtime,
    mut reports: mpsc::Receiver<Report>,
    pending: Pending,
    stop: CancellationToken,
) {
    while let Some(report) = reports.recv().await {
        // The runtime records a turn's start itself (before the harness sees the task);
        // here the dispatch is acknowledged once started, and marked done only after the
        // final report is safely in JetStream, so a crash in between re-reports it.
        let mut done: Option<(String, String)> = None;
        if let Report::Flight {
            flight,
            change: FlightChange::State { to, .. },
        } = &report
        {
            if *to == FlightState::Running || to.is_terminal() {
                let taken = pending.lock().ok().and_then(|mut p| p.remove(flight));
                let invocation = taken.as_ref().map(|(i, _)| i.clone());
                if let Some((inv, msg)) = taken {
                    // A dispatch that ends before its turn started (its session could not
                    // start, it was interrupted while queued...) is recorded as ended,
                    // with this report, before it is acknowledged: a redelivery never runs
                    // a turn for a flight already reported ended, and a restart before the
                    // report is sent sends it, instead of calling the flight running.
                    if to.is_terminal()
                        && matches!(runtime.threads().dispatch_state(&inv).await, Ok(None))
                    {
                        if let Err(e) = runtime.threads().set_dispatch_ended(&inv, &report).await {
                            tracing::error!(error = %e, "cannot record dispatch state");
                        }
                    }
                    if let Err(e) = msg.ack().await {
                        tracing::warn!(error = %e, "dispatch ack failed");
                    }
                }
                if to.is_terminal() {
                    let invocation = match invocation {
                        Some(i) => Some(i),
                        None => find_invocation(&runtime, flight).await,
                    };
                    done = invocation.map(|i| (i, flight.clone()));
                }
            }
        }
        if wire::publish_report(&js, &key, &node, &report, &stop)
            .await
            .is_err()
        {
            return;
        }
        if let Some((inv, flight)) = done {
            if let Err(e) = runtime
                .threads()
                .set_dispatch_state(&inv, DispatchState::Done, &flight)
                .await
            {
                tracing::error!(error = %e, "cannot record dispatch state");
            }
            // The turn's commit went out before its end: it is in JetStream too.
            if let Err(e) = runtime.threads().forget_commit_reports(&flight).await {
                tracing::warn!(%flight, error = %e, "cannot drop a kept commit report");
            }
        }
    }
}

/// The invocation of a flight whose turn started here (for its terminal report).
async fn find_invocation(runtime: &Runtime, flight: &str) -> Option<String> {
    runtime
        .threads()
        .dispatches()
        .await
        .ok()?
        .into_iter()
        .find(|(_, f, state)| f == flight && *state != DispatchState::Done)
        .map(|(i, _, _)| i)
}

fn write_ready(config: &NodeConfig) -> Result<(), FileError> {
    crate::files::write_private(
        &config.data_dir.join("node.json"),
        serde_json::json!({ "name": config.name, "pid": std::process::id() })
            .to_string()
            .as_bytes(),
    )
}
