//! Nodes over NATS: attaching the bus (a dispatcher sending flights of remote agents in
//! order) and consuming node reports from JetStream, each applied at most once.

use relay_infra::retry::{self, Retryable};
use relay_protocol::bus::subjects;
use relay_protocol::domain::FlightState;
use relay_protocol::runtime::Dispatch;
use tokio::sync::mpsc;

use super::reports::{Pending, ReportSource, PENDING_REPLIES};
use super::Plane;
use crate::error::BrokerError;
use crate::seal::BusKey;

/// Why the plane could not be connected to NATS ([`Plane::attach_nats`]).
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The dispatch and report streams could not be made.
    #[error(transparent)]
    Streams(#[from] async_nats::jetstream::context::CreateStreamError),
    /// The flights waiting for NATS could not be read.
    #[error(transparent)]
    Broker(#[from] BrokerError),
}

/// Dispatches for other nodes waiting to be sent.
const REMOTE_DISPATCHES: usize = 4096;
/// Waits between tries to open the node report stream.
const REPORTS_BACKOFF: retry::ExponentialBuilder = retry::forever(
    std::time::Duration::from_millis(200),
    std::time::Duration::from_secs(10),
);

/// Waits between tries to record a node report the broker refused (a full queue...).
const SUBMIT_BACKOFF: retry::ExponentialBuilder = retry::forever(
    std::time::Duration::from_millis(100),
    std::time::Duration::from_millis(100),
);

impl Plane {
    /// Connects the plane to NATS: agents of other nodes become reachable. Dispatches
    /// queued for them before this (at start) are sent now.
    pub async fn attach_nats(
        &self,
        client: async_nats::Client,
        key: BusKey,
    ) -> Result<(), AttachError> {
        let js = async_nats::jetstream::new(client.clone());
        crate::node::wire::ensure_streams(&js).await?;
        if self.nats.get().is_some() {
            // Attached already (a retried bring-up): one dispatcher, one report reader.
            return Ok(());
        }
        let (remote, mut outbox) = mpsc::channel::<(String, Dispatch)>(REMOTE_DISPATCHES);
        let sender = js.clone();
        let sealing = key.clone();
        self.tasks.spawn(async move {
            // One at a time, so two invocations of an agent reach its node in order.
            let never = tokio_util::sync::CancellationToken::new();
            while let Some((node, d)) = outbox.recv().await {
                if let Err(e) =
                    crate::node::wire::send_dispatch(&sender, &sealing, &node, &d, &never).await
                {
                    tracing::warn!(flight = %d.flight.id, error = %e, "dispatch to node failed");
                }
            }
        });
        let _ = self.remote.set(remote);
        let _ = self.nats.set((client, key.clone()));
        self.tasks.spawn(self.clone().consume_node_reports(js, key));
        // Flights of remote agents still queued (made while NATS was not attached, or
        // before a restart): send them; JetStream and the node drop duplicates.
        let queued = self
            .broker
            .store()
            .read(|store| {
                let mut out = Vec::new();
                for f in store
                    .live_flights()?
                    .into_iter()
                    .filter(|f| f.state == FlightState::Queued)
                {
                    if let (Some(agent), Some(inv)) =
                        (store.agent(&f.agent)?, store.invocation(&f.invocation)?)
                    {
                        out.push((f, agent, inv));
                    }
                }
                Ok(out)
            })
            .await?;
        for (f, agent, inv) in queued {
            if !self.local(&agent) {
                self.dispatch(agent, inv, f).await;
            }
        }
        Ok(())
    }

    /// Reports of remote nodes, from JetStream: each is acknowledged once committed.
    ///
    /// A report is applied at most once: the broker keeps, per node, the stream seq of
    /// the last report it applied, in the same batch, and skips any report at or
    /// below it. That is only right if reports are applied in stream order, so: the
    /// consumer is created anew at every start (delivery then begins at the oldest report
    /// not acknowledged, in order, instead of redelivering old ones after newer ones), and
    /// a report that cannot be submitted is retried in place, never left for redelivery.
    ///
    /// The reader never gives up: when its pull stream ends (its consumer deleted under
    /// it) or goes silent (no heartbeat, no responder: a nats-server that came back
    /// without the pull or the consumer), the consumer is created anew the same way and
    /// reading goes on from the oldest report not acknowledged.
    async fn consume_node_reports(self, js: async_nats::jetstream::Context, key: BusKey) {
        let (acks, mut acks_rx) =
            mpsc::channel::<(Pending, async_nats::jetstream::Message, tracing::Span)>(
                PENDING_REPLIES,
            );
        let this = self.clone();
        self.tasks.spawn(async move {
            while let Some((pending, msg, span)) = acks_rx.recv().await {
                tracing::Instrument::instrument(this.settle_pending(pending), span).await;
                if let Err(e) = msg.ack().await {
                    tracing::warn!(error = %e, "report ack failed");
                }
            }
        });
        let attempt = || report_messages(&js);
        loop {
            // Tried for ever: no error comes out.
            let Ok((messages, stream)) = attempt
                .retry(REPORTS_BACKOFF)
                .notify(|e, wait| {
                    tracing::error!(error = %e, retry_in = ?wait, "cannot read node reports yet");
                })
                .await
            else {
                return;
            };
            match self.read_node_reports(messages, stream, &key, &acks).await {
                Read::Again(why) => {
                    tracing::warn!("node reports: {why}; reading them anew");
                }
                Read::Stopped => return,
            }
        }
    }

    /// Applies the reports of one pull stream, in order, until it ends or goes silent.
    async fn read_node_reports(
        &self,
        mut messages: async_nats::jetstream::consumer::pull::Stream,
        stream: i64,
        key: &BusKey,
        acks: &mpsc::Sender<(Pending, async_nats::jetstream::Message, tracing::Span)>,
    ) -> Read {
        while let Some(item) = futures::StreamExt::next(&mut messages).await {
            let msg = match item {
                Ok(m) => m,
                Err(e) if crate::node::wire::pull_is_gone(&e) => {
                    return Read::Again(e.to_string());
                }
                Err(e) => {
                    tracing::warn!(error = %e, "node report stream");
                    continue;
                }
            };
            let (node, report) =
                crate::node::wire::open_report(key, msg.subject.as_str(), &msg.payload);
            let report = match report {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(subject = %msg.subject, "node report dropped: {e}");
                    let _ = msg.ack().await;
                    continue;
                }
            };
            let source = match msg.info() {
                Ok(info) => Some(ReportSource {
                    node,
                    stream,
                    seq: info.stream_sequence,
                }),
                Err(e) => {
                    tracing::warn!(error = %e, "node report without stream info");
                    None
                }
            };
            let span = super::reports::flight_span(&report);
            // Retried in place until it is recorded (never left for redelivery, see
            // above), or the broker stops. Each try owns its copies: a future borrowing
            // them is not `Send` to the compiler through backon's generic types.
            let attempt = || {
                let (this, report, source) = (self.clone(), report.clone(), source.clone());
                async move { this.submit_report_from(report, source).await }
            };
            let submitted = tracing::Instrument::instrument(
                attempt
                    .retry(SUBMIT_BACKOFF)
                    .when(|e| !matches!(e, BrokerError::ShuttingDown))
                    .notify(
                        |e, _| tracing::warn!(error = %e, "node report not recorded; retrying"),
                    ),
                span.clone(),
            )
            .await;
            let Ok(pending) = submitted else {
                return Read::Stopped;
            };
            if acks.send((pending, msg, span)).await.is_err() {
                return Read::Stopped;
            }
        }
        Read::Again("the pull stream ended".into())
    }
}

/// How [`Plane::read_node_reports`] stopped.
enum Read {
    /// The stream ended or went silent (why): read with a new consumer.
    Again(String),
    /// The broker is stopping.
    Stopped,
}

/// The broker's consumer of node reports, created anew (see `consume_node_reports`),
/// and the report stream's identity: when it was created, in nanoseconds since the epoch.
/// A nats-server back with an empty store (its JetStream directory lost or replaced)
/// has the streams made anew here, and their seqs start again from 1: the identity
/// tells the per-node cursors that those are new reports, not ones applied already.
async fn report_messages(
    js: &async_nats::jetstream::Context,
) -> Result<(async_nats::jetstream::consumer::pull::Stream, i64), async_nats::Error> {
    use async_nats::jetstream::consumer;
    crate::node::wire::ensure_streams(js).await?;
    let mut stream = js.get_stream(subjects::REPORT_STREAM).await?;
    let created = stream.info().await?.created.unix_timestamp_nanos();
    let identity = i64::try_from(created).unwrap_or(i64::MAX);
    // Gone already is fine; any other failure would leave the old delivery order.
    if let Err(e) = stream.delete_consumer(REPORT_CONSUMER).await {
        let gone = matches!(
            e.kind(),
            async_nats::jetstream::stream::ConsumerErrorKind::JetStream(j)
                if j.error_code() == async_nats::jetstream::ErrorCode::CONSUMER_NOT_FOUND
        );
        if !gone {
            return Err(e.into());
        }
    }
    let consumer: consumer::PullConsumer = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some(REPORT_CONSUMER.into()),
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await?;
    let messages = crate::node::wire::pull(&consumer).await?;
    Ok((messages, identity))
}

/// The durable consumer the broker reads node reports with.
const REPORT_CONSUMER: &str = "relay-broker";
