//! Runtimes on other hosts, over NATS JetStream.
//!
//! Broker -> node: a [`Dispatch`] is published to the `RELAY_DISPATCH` stream on
//! `relay.v1.dispatch.<node>` with `Nats-Msg-Id` = the invocation id (JetStream drops a
//! second publish of the same invocation). The node reads it with a durable consumer and
//! acknowledges it once the turn has started (or the flight ended); the start is first
//! recorded in the node's sled, so a redelivery (after a node crash, a NATS restart)
//! never runs a turn twice, and a dispatch whose turn never started is delivered again.
//!
//! Node -> broker: every [`Report`] is published to the `RELAY_REPORTS` stream on
//! `relay.v1.report.<node>` and waits for JetStream's acknowledgement (retried until it
//! comes), so reports survive a NATS restart. The broker acknowledges a report once the
//! command it stands for is committed.
//!
//! Broker -> node control (steer, interrupt, approvals): request/reply on
//! `relay.v1.node.<node>.control`, a [`Control`] in, `{"ok":true}` or an error out.
//!
//! Dispatches, reports and controls are JSON sealed with the node's key
//! ([`crate::seal`]): a node drops (and answers `unauthorized` to) anything it cannot
//! open, so no NATS client but its broker can make it run anything.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream, AckKind};
use futures::StreamExt;
use relay_infra::retry::{self, Retryable};
use relay_protocol::api::{ControlAnswer, ErrorBody, ErrorCode};
use relay_protocol::bus::{
    subjects, CONTENT_TYPE_HEADER, DISPATCH_TYPE, REPORT_TYPE, SEALED_CONTENT_TYPE, TYPE_HEADER,
};
use relay_protocol::domain::{FlightChange, FlightState};
use relay_protocol::runtime::{Control, Dispatch, Report};
use relay_runtime::{DispatchState, Runtime, RuntimeConfig};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::error::BrokerError;
use crate::nats::NatsConfig;
use crate::seal::{BusKey, NodeKey};

/// A delivered dispatch not acknowledged within this is delivered again (the node sends
/// "in progress" while a turn is waking).
const DISPATCH_ACK_WAIT: Duration = Duration::from_secs(10);

/// Creates the dispatch and report streams if missing (both sides call this).
pub async fn ensure_streams(js: &jetstream::Context) -> anyhow::Result<()> {
    for (name, subject) in [
        (subjects::DISPATCH_STREAM, subjects::DISPATCH_ALL),
        (subjects::REPORT_STREAM, subjects::REPORT_ALL),
    ] {
        js.get_or_create_stream(stream::Config {
            name: name.to_string(),
            subjects: vec![subject.to_string()],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            duplicate_window: Duration::from_secs(300),
            ..Default::default()
        })
        .await?;
    }
    Ok(())
}

/// Waits between tries to have a dispatch or report acknowledged by JetStream.
const ACK_BACKOFF: retry::ExponentialBuilder =
    retry::forever(Duration::from_millis(50), Duration::from_secs(2));

/// Publishes to JetStream and waits for its acknowledgement, retrying until it comes or
/// `stop` fires.
pub async fn publish_acked(
    js: &jetstream::Context,
    subject: String,
    type_name: &str,
    msg_id: &str,
    payload: Vec<u8>,
    stop: &CancellationToken,
) -> Result<(), BrokerError> {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(TYPE_HEADER, type_name);
    headers.insert(async_nats::header::NATS_MESSAGE_ID, msg_id);
    headers.insert(CONTENT_TYPE_HEADER, SEALED_CONTENT_TYPE);
    let payload = bytes::Bytes::from(payload);
    // Each try owns its copies: a future borrowing them is not `Send` to the compiler
    // through backon's generic types.
    let attempt = || {
        let (js, subject, headers, payload) = (
            js.clone(),
            subject.clone(),
            headers.clone(),
            payload.clone(),
        );
        async move {
            js.publish_with_headers(subject, headers, payload)
                .await?
                .await
        }
    };
    let acked = retry::until_stopped(stop, |sleeper| {
        attempt.retry(ACK_BACKOFF).sleep(sleeper).notify(|e, _| {
            tracing::warn!(%subject, error = %e, "JetStream publish not acknowledged; retrying");
        })
    })
    .await;
    // Tried until acknowledged: only a stop while waiting between tries ends it sooner.
    match acked {
        Some(_) => Ok(()),
        None => Err(BrokerError::ShuttingDown),
    }
}

/// Broker side: sends a dispatch to its node, sealed with the node's key.
pub async fn send_dispatch(
    js: &jetstream::Context,
    key: &BusKey,
    node: &str,
    dispatch: &Dispatch,
    stop: &CancellationToken,
) -> Result<(), BrokerError> {
    let subject = subjects::dispatch(node);
    let payload = key
        .node(node)
        .seal(&subject, &serde_json::to_vec(dispatch)?);
    publish_acked(
        js,
        subject,
        DISPATCH_TYPE,
        &dispatch.invocation.id,
        payload,
        stop,
    )
    .await
}

/// Broker side: a control request to a node, sealed with the node's key.
pub async fn send_control(
    client: &async_nats::Client,
    key: &BusKey,
    node: &str,
    control: &Control,
) -> Result<(), BrokerError> {
    let subject = subjects::node_control(node);
    let payload = key.node(node).seal(&subject, &serde_json::to_vec(control)?);
    // async-nats gives up on a request after its 10 s default; that is the limit here.
    let reply = client
        .request(subject, payload.into())
        .await
        .map_err(|e| BrokerError::Unavailable(format!("node {node:?} did not answer: {e}")))?;
    // Only the node can seal its answer: a plain one is a refusal (or not the node's).
    let Ok(answer) = key.node(node).open(reply.subject.as_str(), &reply.payload) else {
        let why = serde_json::from_slice::<ErrorBody>(&reply.payload)
            .map(|e| e.error.message)
            .unwrap_or_else(|_| "an answer not sealed by the node".into());
        return Err(BrokerError::Unavailable(format!(
            "node {node:?} refused the control: {why} (is its key the one `relay node-key` derives from this broker's bus key?)"
        )));
    };
    match serde_json::from_slice::<ControlAnswer>(&answer) {
        Ok(ControlAnswer::Done { .. }) => Ok(()),
        Ok(ControlAnswer::Refused(body)) => Err(BrokerError::Node(body.error)),
        Err(e) => Err(BrokerError::Unavailable(format!(
            "node {node:?} answered the control with something unreadable: {e}"
        ))),
    }
}

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
}

/// The key of node `name` in `key_file`, where `relay node-key NAME --out FILE` wrote it
/// on the broker's host.
pub async fn read_key(key_file: &Path, name: &str) -> anyhow::Result<NodeKey> {
    let path = key_file.to_path_buf();
    let key = relay_infra::storage::read(move || crate::files::read_key(&path)).await??;
    let Some(key) = key else {
        anyhow::bail!(
            "no node key at {0}: on the broker's host run `relay node-key {1} --out {0}` (with the broker's --data-dir), copy the file here, and start again",
            key_file.display(),
            name
        );
    };
    Ok(NodeKey::new(key))
}

/// `relay node`: runs the harness-session plane for the agents of `config.name`.
pub async fn run(config: NodeConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    if !relay_protocol::domain::valid_agent_name(&config.name) {
        anyhow::bail!(
            "node name {:?} is not valid: use letters, digits, '-' or '_'",
            config.name
        );
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
    ensure_streams(&js).await?;

    let runtime_stop = CancellationToken::new();
    let runtime_config = RuntimeConfig {
        data_dir: config.data_dir.clone(),
        shared_db: None,
        node: Some(config.name.clone()),
        turn_idle_timeout: config.turn_idle_timeout,
        turn_stall_timeout: config.turn_stall_timeout,
        // A node's agents do not reach the broker's API: it listens on its own host's loopback.
        access: None,
    };
    let stop = runtime_stop.clone();
    let (runtime, reports) =
        relay_infra::storage::read(move || Runtime::start(runtime_config, stop)).await??;
    let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
    let forward_stop = CancellationToken::new();
    let forwarder = tokio::spawn(forward_reports(
        js.clone(),
        config.key.clone(),
        config.name.clone(),
        runtime.clone(),
        reports,
        pending.clone(),
        forward_stop.clone(),
    ));

    // Turns that were running when this node last stopped cannot be resumed: their
    // harness process died with it. Fail them with a reason.
    for (invocation, flight) in runtime.threads().unfinished_dispatches().await? {
        let report = Report::Flight {
            flight: flight.clone(),
            change: FlightChange::State {
                to: FlightState::Failed,
                reason: Some(format!(
                    "node {} restarted while this flight was running (its harness process ended with it); ask again to continue",
                    config.name
                )),
                output: None,
            },
        };
        publish_report(&js, &config.key, &config.name, &report, &forward_stop).await?;
        runtime
            .threads()
            .set_dispatch_state(&invocation, DispatchState::Done, &flight)
            .await?;
    }

    let consumer: consumer::PullConsumer = js
        .get_stream(subjects::DISPATCH_STREAM)
        .await?
        .get_or_create_consumer(
            &format!("node-{}", config.name),
            consumer::pull::Config {
                durable_name: Some(format!("node-{}", config.name)),
                filter_subject: subjects::dispatch(&config.name),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: DISPATCH_ACK_WAIT,
                ..Default::default()
            },
        )
        .await?;
    let mut dispatches = consumer.messages().await?;
    let mut control = client
        .subscribe(subjects::node_control(&config.name))
        .await?;
    write_ready(&config)?;
    tracing::info!(node = %config.name, "relay node up");
    eprintln!("relay node {}: serving its agents over NATS", config.name);

    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            m = dispatches.next() => {
                let Some(m) = m else { break };
                match m {
                    Ok(msg) => on_dispatch(&runtime, &config.key, &pending, msg).await,
                    Err(e) => tracing::warn!(error = %e, "dispatch consumer"),
                }
            }
            m = control.next() => {
                let Some(msg) = m else { break };
                let runtime = runtime.clone();
                let client = client.clone();
                let key = config.key.clone();
                tokio::spawn(async move {
                    let control = key
                        .open(msg.subject.as_str(), &msg.payload)
                        .map_err(|e| {
                            tracing::warn!(subject = %msg.subject, "node control refused: {e}");
                            ControlAnswer::refused(ErrorCode::Unauthorized, e.to_string())
                        })
                        .and_then(|plain| {
                            serde_json::from_slice::<Control>(&plain).map_err(|e| {
                                ControlAnswer::refused(ErrorCode::InvalidRequest, e.to_string())
                            })
                        });
                    // The broker's requests are answered sealed (for the reply subject),
                    // so nobody else can answer for this node; a refusal is plain.
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
                        let body = serde_json::to_vec(&answer).unwrap_or_default();
                        let body = if sealed { key.seal(reply.as_str(), &body) } else { body };
                        let _ = client.publish(reply, body.into()).await;
                    }
                });
            }
        }
    }
    runtime_stop.cancel();
    runtime.stopped().await;
    drop(runtime);
    // Let the last reports (turns failed by the shutdown) reach JetStream.
    let _ = tokio::time::timeout(Duration::from_secs(10), forwarder).await;
    forward_stop.cancel();
    let _ = client.flush().await;
    Ok(())
}

/// Dispatches delivered but whose turn has not started: flight id -> (invocation, message).
type Pending = Arc<Mutex<HashMap<String, (String, jetstream::Message)>>>;

async fn on_dispatch(runtime: &Runtime, key: &NodeKey, pending: &Pending, msg: jetstream::Message) {
    let plain = match key.open(msg.subject.as_str(), &msg.payload) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(subject = %msg.subject, "dispatch dropped: {e}; if it came from this node's broker, this node's key is not the one `relay node-key` derives from the broker's bus key");
            let _ = msg.ack_with(AckKind::Term).await;
            return;
        }
    };
    let dispatch: Dispatch = match serde_json::from_slice(&plain) {
        Ok(d) => d,
        Err(e) => {
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

async fn publish_report(
    js: &jetstream::Context,
    key: &NodeKey,
    node: &str,
    report: &Report,
    stop: &CancellationToken,
) -> Result<(), BrokerError> {
    let subject = subjects::report(node);
    let payload = key.seal(&subject, &serde_json::to_vec(report)?);
    publish_acked(
        js,
        subject,
        REPORT_TYPE,
        &format!("{node}:{}", uuid::Uuid::now_v7()),
        payload,
        stop,
    )
    .await
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
                    // start...) is recorded as taken before it is acknowledged, so a
                    // redelivery never runs a turn for a flight already reported ended.
                    if to.is_terminal()
                        && matches!(runtime.threads().dispatch_state(&inv).await, Ok(None))
                    {
                        if let Err(e) = runtime
                            .threads()
                            .set_dispatch_state(&inv, DispatchState::Started, flight)
                            .await
                        {
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
        if publish_report(&js, &key, &node, &report, &stop)
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
        }
    }
}

/// The invocation of a flight already marked started (for its terminal report).
async fn find_invocation(runtime: &Runtime, flight: &str) -> Option<String> {
    runtime
        .threads()
        .unfinished_dispatches()
        .await
        .ok()?
        .into_iter()
        .find(|(_, f)| f == flight)
        .map(|(i, _)| i)
}

fn write_ready(config: &NodeConfig) -> anyhow::Result<()> {
    crate::files::write_private(
        &config.data_dir.join("node.json"),
        serde_json::json!({ "name": config.name, "pid": std::process::id() })
            .to_string()
            .as_bytes(),
    )
}
