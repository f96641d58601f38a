//! What a chaos run saw ([`ChaosReport`]): its kills, and the lists of what went wrong
//! (the checks of [`super`]'s module docs), each of which must stay empty.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::load::LoadReport;

/// The process a kill took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Victim {
    Broker,
    Node,
    Nats,
}

/// One kill: whom, and how far the load was.
#[derive(Debug, Clone)]
pub struct Kill {
    pub victim: Victim,
    /// Invocations acknowledged when it fell.
    pub acked: usize,
    /// Tasks the harnesses had received when it fell.
    pub ran: usize,
    /// Whether every invocation had been sent by then (the kill fell on the queues).
    pub after_load: bool,
}

/// What a chaos run saw; see the module docs.
#[derive(Debug, Default)]
pub struct ChaosReport {
    pub seed: u64,
    pub kills: Vec<Kill>,
    pub load: LoadReport,
    /// From the first request until every flight ended.
    pub elapsed: Duration,
    /// Flights in the store (acknowledged ones and those whose answer a kill lost).
    pub flights: usize,
    pub completed: usize,
    /// Failed after their task reached the harness: a kill cut a running turn.
    pub cut: usize,
    /// Of `cut`, those the broker never saw start (no update but `queued`, then the
    /// failure): the turn ran, but the reports of its start and end were lost.
    pub cut_unseen: usize,
    /// Failed before their task reached the harness, the runtime having recorded the
    /// turn's start (a kill between the two).
    pub cut_at_start: usize,
    /// How many turns the kills could have cut at most: one running turn per agent of
    /// the killed process (the broker's own agents, or the node's), none for nats-server.
    pub cuttable: usize,
    /// Tasks the harnesses received in all.
    pub runs: usize,
    /// The failed flights by error (the first 100 characters).
    pub errors: BTreeMap<String, usize>,
    pub lost: Vec<String>,
    pub stuck: Vec<String>,
    pub run_twice: Vec<String>,
    pub never_started_failed: Vec<String>,
    pub wrong: Vec<String>,
    /// `relay doctor`'s complaint, if any.
    pub doctor: Option<String>,
}

impl ChaosReport {
    /// Everything that went wrong, one line each (empty: the run held).
    pub fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        for (what, list) in [
            ("lost", &self.lost),
            ("stuck", &self.stuck),
            ("run twice", &self.run_twice),
            ("failed without having started", &self.never_started_failed),
            ("wrong", &self.wrong),
        ] {
            if !list.is_empty() {
                v.push(format!(
                    "{} {what}, e.g. {:?}",
                    list.len(),
                    &list[..list.len().min(5)]
                ));
            }
        }
        if !self.load.refused.is_empty() {
            v.push(format!(
                "{} invocations refused, e.g. {:?}",
                self.load.refused.len(),
                &self.load.refused[..self.load.refused.len().min(3)]
            ));
        }
        let failed = self.cut + self.cut_at_start;
        if failed > self.cuttable {
            v.push(format!(
                "{failed} flights failed, but the kills could cut at most {} running turns: \
                 flights failed that were not running (done or queued)",
                self.cuttable
            ));
        }
        if self.load.status_hangs > 0 {
            v.push(format!(
                "/v1/status or /v1/agents hung {} times while the broker was up",
                self.load.status_hangs
            ));
        }
        if let Some(d) = &self.doctor {
            v.push(format!("relay doctor: {d}"));
        }
        v
    }
}

impl fmt::Display for ChaosReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = |v: Victim| self.kills.iter().filter(|k| k.victim == v).count();
        writeln!(
            f,
            "chaos (seed {}): {} kill -9s (broker {}, node {}, nats-server {}; {} after the last invocation was sent), {:.1}s",
            self.seed,
            self.kills.len(),
            count(Victim::Broker),
            count(Victim::Node),
            count(Victim::Nats),
            self.kills.iter().filter(|k| k.after_load).count(),
            self.elapsed.as_secs_f64(),
        )?;
        let order: Vec<String> = self
            .kills
            .iter()
            .map(|k| format!("{:?} at {} run/{} acked", k.victim, k.ran, k.acked))
            .collect();
        writeln!(f, "  kills: {}", order.join(", "))?;
        writeln!(
            f,
            "  {} invocations acknowledged ({} overloaded and {} unreachable requests sent again); {} flights in the store",
            self.load.flights.len(),
            self.load.overloaded,
            self.load.unreachable,
            self.flights,
        )?;
        writeln!(
            f,
            "  {} completed, {} failed with their turn cut ({} of them never seen started by the broker), {} failed as their turn started (at most {} turns could be cut); {} tasks received by harnesses",
            self.completed, self.cut, self.cut_unseen, self.cut_at_start, self.cuttable, self.runs,
        )?;
        for (error, n) in &self.errors {
            writeln!(f, "  {n} failed: {error}")?;
        }
        write!(
            f,
            "  lost {}, stuck {}, run twice {}, failed without having started {}, wrong {}, doctor {}",
            self.lost.len(),
            self.stuck.len(),
            self.run_twice.len(),
            self.never_started_failed.len(),
            self.wrong.len(),
            self.doctor.as_deref().unwrap_or("clean"),
        )
    }
}
