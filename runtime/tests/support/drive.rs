//! Driving agents with worktrees through the scripted harness: the test plays the
//! harness, which works (writes files) in the directory its session was spawned in.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use relay_harnesses::seam::OpenedSession;
use relay_protocol::domain::{AgentSpec, FlightChange, FlightCommit};
use relay_protocol::harness::{HarnessEvent, TurnOutcome};
use relay_protocol::runtime::{Dispatch, Report};
use tokio::sync::mpsc;

use super::{Call, Reports, Script};

/// The flight id of agent `agent`'s `n`th flight (its agent can be read back).
pub fn flight_of(agent: &str, n: u32) -> String {
    format!("flt_{agent}_{n}")
}

fn agent_of(flight: &str) -> &str {
    let rest = flight.trim_start_matches("flt_");
    rest.rsplit_once('_').map_or(rest, |(a, _)| a)
}

/// A dispatch of `flight` (task `task`) to the agent of `spec`.
pub fn dispatch_to(spec: &AgentSpec, flight: &str, task: &str) -> Dispatch {
    let mut d = super::dispatch(spec.harness, flight, task);
    d.agent.spec = spec.clone();
    d.invocation.target = spec.name.clone();
    d
}

/// The harness's side of agents' sessions: where each was spawned, its events.
#[derive(Default)]
pub struct Sessions {
    pub at: HashMap<String, (PathBuf, mpsc::Sender<HarnessEvent>)>,
    opened: u32,
    /// Sessions spawned.
    pub spawned: u32,
}

impl Sessions {
    /// Answers the harness's calls until `turns` turns have started; each turn's
    /// `work` runs in its agent's directory before the turn is completed.
    pub async fn serve(&mut self, script: &mut Script, turns: usize, work: impl Fn(&Path, &str)) {
        self.run(script, turns, work, false).await;
    }

    /// [`Sessions::serve`], completing the turns only once all have started (so their
    /// commits happen at once); the turns.
    pub async fn serve_together(
        &mut self,
        script: &mut Script,
        turns: usize,
        work: impl Fn(&Path, &str),
    ) -> Vec<String> {
        let started = self.run(script, turns, work, true).await;
        for turn in &started {
            let (_, events) = &self.at[agent_of(turn)];
            events.send(completed(turn)).await.unwrap();
        }
        started
    }

    async fn run(
        &mut self,
        script: &mut Script,
        turns: usize,
        work: impl Fn(&Path, &str),
        hold: bool,
    ) -> Vec<String> {
        let mut started = Vec::new();
        while started.len() < turns {
            match script.next().await {
                Call::Spawn {
                    agent,
                    events,
                    reply,
                } => {
                    self.spawned += 1;
                    self.at
                        .insert(agent.name.clone(), (PathBuf::from(&agent.cwd), events));
                    reply.send(Ok(())).unwrap();
                }
                Call::Open { reply, .. } => {
                    self.opened += 1;
                    let id = format!("c{}", self.opened);
                    reply.send(Ok(OpenedSession { id, lost: None })).unwrap();
                }
                Call::StartTurn {
                    relay_turn_id,
                    reply,
                    ..
                } => {
                    let (cwd, events) = &self.at[agent_of(&relay_turn_id)];
                    work(cwd, &relay_turn_id);
                    reply.send(Ok(relay_turn_id.clone())).unwrap();
                    if !hold {
                        events.send(completed(&relay_turn_id)).await.unwrap();
                    }
                    started.push(relay_turn_id);
                }
                Call::Shutdown => {}
                other => panic!("unexpected call {other:?}"),
            }
        }
        started
    }

    /// Where agent `agent`'s session was spawned.
    pub fn cwd(&self, agent: &str) -> PathBuf {
        self.at[agent].0.clone()
    }
}

pub fn completed(turn_id: &str) -> HarnessEvent {
    HarnessEvent::TurnCompleted {
        turn_id: turn_id.into(),
        outcome: TurnOutcome::Completed {
            text: "done".into(),
        },
    }
}

/// The reports up to and including the `n`th terminal flight state.
pub async fn until_ended(reports: &mut Reports, n: usize) -> Vec<Report> {
    let mut out = Vec::new();
    let mut ended = 0;
    while ended < n {
        let r = reports.next().await;
        if matches!(&r, Report::Flight { change: FlightChange::State { to, .. }, .. } if to.is_terminal())
        {
            ended += 1;
        }
        out.push(r);
    }
    out
}

/// The commits reported, by flight, in order.
pub fn commits(reports: &[Report]) -> Vec<(String, FlightCommit)> {
    reports
        .iter()
        .filter_map(|r| match r {
            Report::Flight {
                flight,
                change: FlightChange::Commit { commit },
            } => Some((flight.clone(), (**commit).clone())),
            _ => None,
        })
        .collect()
}

/// The notes reported on `flight`.
pub fn notes(reports: &[Report], flight: &str) -> Vec<String> {
    reports
        .iter()
        .filter_map(|r| match r {
            Report::Flight {
                flight: f,
                change: FlightChange::Note { text, .. },
            } if f == flight => Some(text.clone()),
            _ => None,
        })
        .collect()
}

/// Where in `reports` flight `flight`'s terminal state is.
pub fn end_of(reports: &[Report], flight: &str) -> usize {
    reports
        .iter()
        .position(|r| matches!(r, Report::Flight { flight: f, change: FlightChange::State { to, .. } } if f == flight && to.is_terminal()))
        .expect("the flight ended")
}
