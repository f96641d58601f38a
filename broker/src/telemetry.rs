//! The broker's Prometheus series, for `GET /metrics` ([`Metrics`]).
//!
//! The series live in a recorder this broker owns (`metrics-exporter-prometheus`'s
//! [`PrometheusRecorder`], built and never installed as the process's global recorder):
//! two brokers in one process (tests) each keep and render their own. So nothing here
//! uses the `metrics` crate's macros (they record into the global recorder): each series
//! is registered on the recorder by its key.
//!
//! Where each series comes from:
//! - flights, approvals, tokens and cost: a task folds the broker's committed events
//!   ([`crate::feed::Feed`]: gap-free, in seq order), starting from a scan of the live
//!   flights and pending approvals at start. A scrape waits (briefly) until the fold has
//!   reached the last event on disk, so what it shows is the log as of one seq;
//! - the writer's queue depth, durable flushes and overload refusals: read at scrape
//!   time from atomics the writer and the HTTP server keep ([`Broker::queue_depth`],
//!   [`Broker::flushes`], [`Broker::refusals`]): the writer's path takes no lock for
//!   them.
//!
//! Counters count from this process's start (Prometheus handles a restart's reset);
//! gauges are exact at any time. The only per-name label is `agent` (bounded by agents).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use metrics::{Counter, Gauge, Key, Label, Metadata, Recorder};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use relay_protocol::domain::{decider, Approval, ApprovalState, FlightChange, FlightState};
use relay_protocol::domain::{Flight, TokenUsage};
use relay_protocol::event::{Event, EventBody};
use tokio::sync::watch;

use crate::broker::{Broker, Full};
use crate::error::BrokerError;
use crate::store::T;

/// Longest a scrape waits for the fold to reach the last published event; past it, it
/// answers what the fold has (a scrape must never hang on a busy broker).
const CATCH_UP: Duration = Duration::from_secs(2);

/// How many ended flights' last usage the fold keeps: the writer still takes a usage
/// report after a flight ended (a turn cancelled by a person or by its budget reports
/// what it used on its way out), and only what it grew by may count. Past these, a late
/// report of a long-ended flight would count whole: far more than a report comes late.
const ENDED_KEPT: usize = 1024;

/// The live flights' states, in the order they are rendered.
const LIVE_STATES: [FlightState; 4] = [
    FlightState::Queued,
    FlightState::Waking,
    FlightState::Running,
    FlightState::Waiting,
];

/// Who decided an approval, as `relay_approvals_decided_total`'s `kind` label says it.
pub fn decided_kind(decided_by: &str) -> &'static str {
    let by = decided_by.trim_start().to_ascii_lowercase();
    if by.starts_with(decider::RULE) {
        "rule"
    } else if by.starts_with(crate::alerts::TIMEOUT_DECIDER) {
        "timeout"
    } else if by.starts_with(decider::POLICY) {
        "policy"
    } else if by.starts_with(decider::RELAY) {
        "relay"
    } else if by.ends_with(":withdrawn") && decider::reserved(&by, false).is_some() {
        "harness"
    } else {
        "person"
    }
}

/// The broker's series and the task that keeps them. Cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Shared>,
}

struct Shared {
    series: Series,
    handle: PrometheusHandle,
    broker: Broker,
    /// The seq of the last event the fold applied.
    folded: watch::Receiver<u64>,
}

impl Metrics {
    /// Scans the live flights and pending approvals (off the async workers), then starts
    /// the fold of every event after the scan on the broker's tasks.
    pub async fn start(broker: &Broker) -> Result<Metrics, BrokerError> {
        let recorder = PrometheusBuilder::new().build_recorder();
        describe(&recorder);
        let handle = recorder.handle();
        let series = Series(Arc::new(recorder));
        let (seq, flights, pending) = broker
            .store()
            .read(|s| {
                let approvals: Vec<Approval> = s.values(T::Approvals)?;
                let pending = approvals
                    .into_iter()
                    .filter(|a| a.state == ApprovalState::Pending)
                    .map(|a| a.id)
                    .collect::<HashSet<_>>();
                Ok((s.last_seq()?, s.live_flights()?, pending))
            })
            .await?;
        let (tx, folded) = watch::channel(seq);
        let mut fold = Fold::new(series.clone(), flights, pending);
        let mut events = crate::feed::Feed::new(broker.clone(), seq);
        broker.tasks().spawn(async move {
            while let Some(event) = events.recv().await {
                match event {
                    Ok(event) => {
                        fold.apply(&event);
                        tx.send_replace(event.seq);
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "metrics stopped following the event log");
                        return;
                    }
                }
            }
        });
        Ok(Metrics {
            inner: Arc::new(Shared {
                series,
                handle,
                broker: broker.clone(),
                folded,
            }),
        })
    }

    /// The series in Prometheus' text format, as of (at least) the last event on disk
    /// when the scrape began (unless the fold is more than [`CATCH_UP`] behind).
    pub async fn render(&self) -> String {
        let s = &self.inner;
        // What is on disk is published within moments, and a client may have read it
        // already (a flight as completed, see `Store::read`): count up to it.
        let target = s.broker.last_seq().max(s.broker.store().log().last_seq());
        let mut folded = s.folded.clone();
        let caught_up = tokio::time::timeout(CATCH_UP, folded.wait_for(|seq| *seq >= target));
        if !matches!(caught_up.await, Ok(Ok(_))) {
            tracing::warn!(target, "a scrape did not wait for the metrics to catch up");
        }
        s.series
            .counter("relay_durable_flushes_total", &[])
            .absolute(s.broker.flushes());
        s.series
            .gauge("relay_queue_depth", &[("queue", "writer".into())])
            .set(s.broker.queue_depth() as f64);
        for what in Full::ALL {
            s.series
                .counter("relay_overloaded_total", &[("what", what.label().into())])
                .absolute(s.broker.refusals().get(what));
        }
        s.handle.render()
    }
}

/// The broker's own recorder, on which each series is registered by its key (a
/// registered series is kept: registering again returns the same one).
#[derive(Clone)]
struct Series(Arc<PrometheusRecorder>);

const META: Metadata<'static> = Metadata::new(module_path!(), metrics::Level::INFO, None);

type Labels<'a> = &'a [(&'static str, String)];

impl Series {
    fn key(name: &'static str, labels: Labels) -> Key {
        let labels: Vec<Label> = labels
            .iter()
            .map(|(k, v)| Label::new(*k, v.clone()))
            .collect();
        Key::from_parts(name, labels)
    }

    fn counter(&self, name: &'static str, labels: Labels) -> Counter {
        self.0.register_counter(&Self::key(name, labels), &META)
    }

    fn gauge(&self, name: &'static str, labels: Labels) -> Gauge {
        self.0.register_gauge(&Self::key(name, labels), &META)
    }
}

/// The HELP lines of every series.
fn describe(r: &PrometheusRecorder) {
    let counters = [
        ("relay_flights_total", "Flights that entered each state (a new flight enters its first)."),
        ("relay_approvals_decided_total", "Approvals decided, by who decided: a person, a remembered rule, an approval policy, a timeout, Relay itself (restart, turn ended) or the harness (withdrawn)."),
        ("relay_tokens_total", "Tokens the agents' flights reported, by agent and kind (input includes cached_input; output includes reasoning)."),
        ("relay_cost_micro_usd_total", "Cost the agents' flights reported or the price table gave, in millionths of a US dollar."),
        ("relay_durable_flushes_total", "Durable flushes of the broker's database (group commit: far fewer than writes)."),
        ("relay_overloaded_total", "Requests refused for overload, by what was full."),
    ];
    for (name, help) in counters {
        r.describe_counter(name.into(), None, help.into());
    }
    let gauges = [
        ("relay_flights", "Live flights by state."),
        ("relay_approvals_pending", "Approvals waiting for a decision."),
        ("relay_queue_depth", "Commands waiting for the broker's writer (queue=writer), and flights queued behind each agent's turn (queue=agent)."),
    ];
    for (name, help) in gauges {
        r.describe_gauge(name.into(), None, help.into());
    }
}

/// The fold of the event log into the series: what it must remember of each live flight
/// and pending approval (bounded by those, dropped when they end).
struct Fold {
    series: Series,
    /// Live flights: agent and state.
    flights: HashMap<String, (String, FlightState)>,
    /// Live flights' last reported usage (a running total: only its growth is counted).
    usage: HashMap<String, TokenUsage>,
    /// The last usage of the [`ENDED_KEPT`] flights that ended last, oldest first.
    ended: VecDeque<(String, TokenUsage)>,
    pending: HashSet<String>,
}

impl Fold {
    fn new(series: Series, live: Vec<Flight>, pending: HashSet<String>) -> Fold {
        let mut fold = Fold {
            series,
            flights: HashMap::new(),
            usage: HashMap::new(),
            ended: VecDeque::new(),
            pending,
        };
        // Every series exists from the start (at 0), so a scraper sees each one.
        for state in LIVE_STATES {
            fold.live_gauge(state).set(0.0);
        }
        for state in [
            FlightState::Completed,
            FlightState::Failed,
            FlightState::Cancelled,
        ]
        .into_iter()
        .chain(LIVE_STATES)
        {
            fold.transitions(state).absolute(0);
        }
        for kind in ["person", "rule", "policy", "timeout", "relay", "harness"] {
            fold.series
                .counter("relay_approvals_decided_total", &[("kind", kind.into())])
                .absolute(0);
        }
        for flight in live {
            fold.enter(&flight.agent, &flight.id, flight.state);
            if let Some(usage) = flight.usage {
                fold.usage.insert(flight.id, usage);
            }
        }
        fold.pending_gauge();
        fold
    }

    fn live_gauge(&self, state: FlightState) -> Gauge {
        self.series
            .gauge("relay_flights", &[("state", state.as_str().into())])
    }

    fn transitions(&self, state: FlightState) -> Counter {
        self.series
            .counter("relay_flights_total", &[("state", state.as_str().into())])
    }

    fn agent_queue(&self, agent: &str) -> Gauge {
        self.series.gauge(
            "relay_queue_depth",
            &[("queue", "agent".into()), ("agent", agent.into())],
        )
    }

    fn pending_gauge(&self) {
        self.series
            .gauge("relay_approvals_pending", &[])
            .set(self.pending.len() as f64);
    }

    /// A live flight now in `state` (from none, at its creation or the start's scan).
    fn enter(&mut self, agent: &str, id: &str, state: FlightState) {
        if state.is_terminal() {
            return;
        }
        self.live_gauge(state).increment(1.0);
        if state == FlightState::Queued {
            self.agent_queue(agent).increment(1.0);
        } else {
            // Registered at 0, so an agent's queue is there once it has had a flight.
            self.agent_queue(agent).increment(0.0);
        }
        self.flights.insert(id.into(), (agent.into(), state));
    }

    fn apply(&mut self, event: &Event) {
        match &event.body {
            EventBody::InvocationCreated { flight, .. } => {
                self.transitions(flight.state).increment(1);
                self.enter(&flight.agent, &flight.id, flight.state);
            }
            EventBody::FlightUpdated { update, flight } => match &update.change {
                FlightChange::State { to, .. } => self.moved(flight, *to),
                FlightChange::Usage(usage) => self.used(flight, usage),
                _ => {}
            },
            EventBody::ApprovalRequested { approval }
                if approval.state == ApprovalState::Pending =>
            {
                self.pending.insert(approval.id.clone());
                self.pending_gauge();
            }
            EventBody::ApprovalDecided { approval } => {
                self.pending.remove(&approval.id);
                self.pending_gauge();
                let kind = decided_kind(approval.decided_by.as_deref().unwrap_or(""));
                self.series
                    .counter("relay_approvals_decided_total", &[("kind", kind.into())])
                    .increment(1);
            }
            _ => {}
        }
    }

    /// A flight's state changed to `to`.
    fn moved(&mut self, flight: &Flight, to: FlightState) {
        self.transitions(to).increment(1);
        if let Some((agent, from)) = self.flights.remove(&flight.id) {
            self.live_gauge(from).decrement(1.0);
            if from == FlightState::Queued {
                self.agent_queue(&agent).decrement(1.0);
            }
        }
        if to.is_terminal() {
            if let Some(usage) = self.usage.remove(&flight.id) {
                self.keep_ended(&flight.id, usage);
            }
        } else {
            self.enter(&flight.agent, &flight.id, to);
        }
    }

    /// A flight reported its usage: a running total, so only what it grew by since the
    /// flight's last report is counted (a total reported twice counts once).
    fn used(&mut self, flight: &Flight, usage: &TokenUsage) {
        let before = match self.usage.get(&flight.id) {
            Some(u) => u.clone(),
            None if !flight.state.is_terminal() => TokenUsage::default(),
            None => self
                .ended
                .iter()
                .find(|(id, _)| *id == flight.id)
                .map(|(_, u)| u.clone())
                .unwrap_or_default(),
        };
        let agent = flight.agent.clone();
        let grew = |now: u64, then: u64| now.saturating_sub(then);
        let kinds = [
            ("input", grew(usage.input_tokens, before.input_tokens)),
            (
                "cached_input",
                grew(usage.cached_input_tokens, before.cached_input_tokens),
            ),
            ("output", grew(usage.output_tokens, before.output_tokens)),
            (
                "reasoning",
                grew(
                    usage.reasoning_tokens.unwrap_or(0),
                    before.reasoning_tokens.unwrap_or(0),
                ),
            ),
        ];
        for (kind, n) in kinds {
            self.series
                .counter(
                    "relay_tokens_total",
                    &[("agent", agent.clone()), ("kind", kind.into())],
                )
                .increment(n);
        }
        self.series
            .counter("relay_cost_micro_usd_total", &[("agent", agent)])
            .increment(grew(
                usage.cost_micro_usd.unwrap_or(0),
                before.cost_micro_usd.unwrap_or(0),
            ));
        if flight.state.is_terminal() {
            // A late report (the flight's end was folded before it).
            self.keep_ended(&flight.id, usage.clone());
        } else {
            self.usage.insert(flight.id.clone(), usage.clone());
        }
    }

    /// Keeps an ended flight's last usage (the oldest one kept goes past [`ENDED_KEPT`]).
    fn keep_ended(&mut self, id: &str, usage: TokenUsage) {
        if let Some(kept) = self.ended.iter_mut().find(|(i, _)| i == id) {
            kept.1 = usage;
            return;
        }
        if self.ended.len() >= ENDED_KEPT {
            self.ended.pop_front();
        }
        self.ended.push_back((id.to_string(), usage));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deciders_fall_into_their_kinds() {
        assert_eq!(decided_kind("rule:rul_1"), "rule");
        assert_eq!(decided_kind(&crate::alerts::timeout_decider(30)), "timeout");
        assert_eq!(decided_kind("policy:auto-accept:cargo test"), "policy");
        assert_eq!(decided_kind("relay:turn-ended"), "relay");
        assert_eq!(decided_kind("codex:withdrawn"), "harness");
        assert_eq!(decided_kind("operator"), "person");
        assert_eq!(decided_kind("alice@dashboard"), "person");
        assert_eq!(decided_kind("bob@nats"), "person");
        // A person named like a harness's withdrawal is still no harness.
        assert_eq!(decided_kind("someone:withdrawn"), "person");
    }

    fn flight(state: FlightState) -> Flight {
        let mut f: Flight = serde_json::from_value(serde_json::json!({
            "id": "flt_1", "invocation": "inv_1", "agent": "a1", "state": "running",
            "update_seq": 0, "conversation": "cnv_1", "created_at": 1, "updated_at": 1,
        }))
        .unwrap();
        f.state = state;
        f
    }

    fn update(seq: u64, flight: Flight, change: FlightChange) -> Event {
        let update = relay_protocol::domain::FlightUpdate {
            flight: flight.id.clone(),
            agent: flight.agent.clone(),
            seq,
            at: 1,
            change,
        };
        Event {
            v: relay_protocol::event::EVENT_VERSION,
            seq,
            at: 1,
            by: None,
            body: EventBody::FlightUpdated { update, flight },
        }
    }

    fn input(n: u64) -> TokenUsage {
        TokenUsage {
            input_tokens: n,
            cost_micro_usd: Some(n),
            ..TokenUsage::default()
        }
    }

    /// The value of the series whose line starts with `series` (name and labels).
    fn value(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    }

    #[test]
    fn usage_reported_after_a_flight_ended_counts_only_its_growth() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let mut fold = Fold::new(
            Series(Arc::new(recorder)),
            vec![flight(FlightState::Running)],
            HashSet::new(),
        );
        let ended = FlightChange::State {
            to: FlightState::Cancelled,
            reason: None,
            output: None,
        };
        fold.apply(&update(
            1,
            flight(FlightState::Running),
            FlightChange::Usage(input(100)),
        ));
        fold.apply(&update(2, flight(FlightState::Cancelled), ended));
        // The cancelled turn reports its last total on its way out, twice.
        let late = flight(FlightState::Cancelled);
        fold.apply(&update(3, late.clone(), FlightChange::Usage(input(120))));
        fold.apply(&update(4, late, FlightChange::Usage(input(120))));
        let text = handle.render();
        assert_eq!(
            value(&text, r#"relay_tokens_total{agent="a1",kind="input"}"#),
            120.0
        );
        assert_eq!(
            value(&text, r#"relay_cost_micro_usd_total{agent="a1"}"#),
            120.0
        );
    }
}
