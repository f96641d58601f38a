//! The node wire: what the broker and a node both speak. The streams, and each message
//! sealed with the node's key, published, and opened on the other side: dispatches and
//! controls (broker -> node), reports (node -> broker), control answers (node -> broker).

use std::time::Duration;

use async_nats::jetstream::{self, stream};
use relay_infra::retry::{self, Retryable};
use relay_protocol::api::{ControlAnswer, ErrorBody, ErrorCode};
use relay_protocol::bus::{
    subjects, CONTENT_TYPE_HEADER, DISPATCH_TYPE, REPORT_TYPE, SEALED_CONTENT_TYPE, TYPE_HEADER,
};
use relay_protocol::runtime::{Control, Dispatch, Report};
use tokio_util::sync::CancellationToken;

use crate::error::{BrokerError, NodeUnreachable};
use crate::seal::{BusKey, NodeKey, Unsealed};

/// Creates the dispatch and report streams if missing (both sides call this).
pub async fn ensure_streams(
    js: &jetstream::Context,
) -> Result<(), jetstream::context::CreateStreamError> {
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

/// The pull stream of a durable consumer of one of the streams, both sides: a pull
/// waits up to 30 s on the server, which sends a heartbeat every 5 s meanwhile, so a
/// server that lost the pull or the consumer is noticed ([`pull_is_gone`]).
pub async fn pull(
    consumer: &jetstream::consumer::PullConsumer,
) -> Result<jetstream::consumer::pull::Stream, jetstream::consumer::StreamError> {
    consumer
        .stream()
        .expires(Duration::from_secs(30))
        .heartbeat(Duration::from_secs(5))
        .messages()
        .await
}

/// Whether an error of a [`pull`] stream means it is gone: its consumer deleted, or a
/// server silent or without it. The reader then makes its consumer again.
pub fn pull_is_gone(e: &jetstream::consumer::pull::MessagesError) -> bool {
    use jetstream::consumer::pull::MessagesErrorKind as Kind;
    matches!(
        e.kind(),
        Kind::MissingHeartbeat | Kind::NoResponders | Kind::ConsumerDeleted
    )
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
        // Keyed: no client can take the id first (a re-send still has the same one).
        &key.stream_ids().dispatch(&dispatch.invocation.id),
        payload,
        stop,
    )
    .await
}

/// Why a node could not open a message sent to it.
#[derive(Debug, thiserror::Error)]
pub enum Unopened {
    /// Not sealed with this node's key: not from its broker, or the keys differ.
    #[error("{0}")]
    Unsealed(Unsealed),
    #[error("{0}")]
    Malformed(serde_json::Error),
}

/// Node side: a dispatch delivered on `subject`, opened with the node's key.
pub fn open_dispatch(key: &NodeKey, subject: &str, payload: &[u8]) -> Result<Dispatch, Unopened> {
    let plain = key.open(subject, payload).map_err(Unopened::Unsealed)?;
    serde_json::from_slice(&plain).map_err(Unopened::Malformed)
}

/// Node side: publishes a report to the broker, sealed with the node's key, and waits
/// for JetStream's acknowledgement (see [`publish_acked`]).
pub async fn publish_report(
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

/// Broker side: the node a report came from (by its subject) and the report, opened with
/// that node's key. Only the node itself holds the key its reports are sealed with.
pub fn open_report(
    key: &BusKey,
    subject: &str,
    payload: &[u8],
) -> (String, Result<Report, String>) {
    let node = subjects::report_node(subject).unwrap_or("").to_string();
    let report = key
        .node(&node)
        .open(subject, payload)
        .map_err(|e| e.to_string())
        .and_then(|plain| serde_json::from_slice(&plain).map_err(|e| e.to_string()));
    (node, report)
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
        .map_err(|error| NodeUnreachable::NoAnswer {
            node: node.to_string(),
            error,
        })?;
    // Only the node can seal its answer: a plain one is a refusal (or not the node's).
    let Ok(answer) = key.node(node).open(reply.subject.as_str(), &reply.payload) else {
        let why = serde_json::from_slice::<ErrorBody>(&reply.payload)
            .map(|e| e.error.message)
            .unwrap_or_else(|_| "an answer not sealed by the node".into());
        return Err(NodeUnreachable::Refused {
            node: node.to_string(),
            why,
        }
        .into());
    };
    match serde_json::from_slice::<ControlAnswer>(&answer) {
        Ok(ControlAnswer::Done { .. }) => Ok(()),
        Ok(ControlAnswer::Refused(body)) => Err(BrokerError::Node(body.error)),
        Err(error) => Err(NodeUnreachable::Unreadable {
            node: node.to_string(),
            error,
        }
        .into()),
    }
}

/// Node side: a control request opened with the node's key, or the refusal to answer it
/// with (plain: a refusal is not sealed).
pub fn open_control(
    key: &NodeKey,
    subject: &str,
    payload: &[u8],
) -> Result<Control, ControlAnswer> {
    key.open(subject, payload)
        .map_err(|e| {
            tracing::warn!(%subject, "node control refused: {e}");
            ControlAnswer::refused(ErrorCode::Unauthorized, e.to_string())
        })
        .and_then(|plain| {
            serde_json::from_slice::<Control>(&plain)
                .map_err(|e| ControlAnswer::refused(ErrorCode::InvalidRequest, e.to_string()))
        })
}

/// Node side: answers the broker's control request on `reply`. The answer to a control
/// that was opened is sealed (for the reply subject), so nobody else can answer for this
/// node; a refusal is plain.
pub async fn answer_control(
    client: &async_nats::Client,
    key: &NodeKey,
    reply: async_nats::Subject,
    answer: &ControlAnswer,
    sealed: bool,
) {
    let body = serde_json::to_vec(answer).unwrap_or_default();
    let body = if sealed {
        key.seal(reply.as_str(), &body)
    } else {
        body
    };
    let _ = client.publish(reply, body.into()).await;
}
