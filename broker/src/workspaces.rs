//! Agents' worktrees, the same for every interface: removing an agent (refused while its
//! worktree holds uncommitted work, unless forced), a flight's diff (its recorded
//! commit, with the patch), an agent's diff (its branch against its base, read by its
//! runtime), reverting a flight's commit, and forking an agent at a flight (its session
//! and its worktree from that point).
//!
//! The git work is the runtime's (`relay_runtime::workspace`), reached through the port
//! ([`FlightControl`]); here are the rules: what may be asked, of which flight or agent,
//! and what the answer says.

use std::sync::Arc;
use std::time::Duration;

use relay_protocol::api::{AgentAdded, AgentDiff, FlightDiff, ForkRequest};
use relay_protocol::domain::{
    branch_of, Agent, Flight, FlightChange, ForkSpec, Secrets, WorktreeSpec,
};
use relay_protocol::event::EventBody;

use crate::broker::{Broker, Live};
use crate::error::BrokerError;
use crate::ports::{FlightControl, Reverting};
use crate::store::T;

/// How long a revert's answer waits for this host's runtime's report of it to be
/// recorded (it was sent before the runtime answered; this covers the report queue).
pub const REVERT_REPORT_WAIT: Duration = Duration::from_secs(10);

fn control(
    control: Option<&Arc<dyn FlightControl>>,
) -> Result<Arc<dyn FlightControl>, BrokerError> {
    control.cloned().ok_or(BrokerError::NoRuntime)
}

async fn agent(broker: &Broker, name: &str) -> Result<Agent, BrokerError> {
    broker
        .agent(name)
        .await?
        .ok_or_else(|| BrokerError::UnknownAgent(name.into()))
}

async fn flight(broker: &Broker, id: &str) -> Result<Flight, BrokerError> {
    broker
        .flight(id)
        .await?
        .ok_or_else(|| BrokerError::UnknownFlight(id.into()))
}

/// What to say of an agent's branch once the agent is gone: it stays, and how to delete
/// it.
pub fn branch_kept(agent: &Agent) -> Option<String> {
    agent.spec.worktree.as_ref()?;
    let branch = agent
        .worktree
        .as_ref()
        .map(|w| w.branch.clone())
        .unwrap_or_else(|| branch_of(&agent.spec.name));
    Some(format!(
        "branch {branch} is kept (with every flight's commit); delete it with `git -C {} branch -D {branch}`",
        agent.spec.cwd
    ))
}

/// `relay agent remove [--force]`: an agent whose worktree (on this host) holds
/// uncommitted work is refused without `force`, naming the files and what to do; with
/// it, the runtime commits them on the agent's branch before removing the worktree.
pub async fn remove_agent(
    broker: &Broker,
    control: Option<&Arc<dyn FlightControl>>,
    name: &str,
    force: bool,
    by: Option<String>,
) -> Result<Agent, BrokerError> {
    let found = agent(broker, name).await?;
    if found.spec.worktree.is_some() && !force {
        if let Some(control) = control {
            let dirty = control.worktree_dirty(found.clone()).await?;
            if !dirty.is_empty() {
                let path = found
                    .worktree
                    .as_ref()
                    .map(|w| w.path.clone())
                    .unwrap_or_default();
                return Err(BrokerError::Workspace(
                    relay_runtime::workspace::WorkspaceError::Dirty {
                        path: path.into(),
                        files: list(&dirty),
                    },
                ));
            }
        }
    }
    broker.remove_agent_forced(name, force, by).await
}

/// Up to 10 file names, and how many more.
fn list(files: &[String]) -> String {
    let mut out = files
        .iter()
        .take(10)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if files.len() > 10 {
        out.push_str(&format!(" and {} more", files.len() - 10));
    }
    out
}

/// `relay diff FLIGHT`: the flight's commit as recorded with it, with its patch (the
/// last [`FlightChange::Commit`] update: works for a node's agent and after its worktree
/// is gone).
pub async fn flight_diff(broker: &Broker, id: &str) -> Result<FlightDiff, BrokerError> {
    let id = id.to_string();
    broker
        .store()
        .read(move |store| {
            let flight = store
                .flight(&id)?
                .ok_or_else(|| BrokerError::UnknownFlight(id.clone()))?;
            let mut commit = None;
            if flight.commit.is_some() {
                for update in store.flight_updates(&id, 0)? {
                    if let FlightChange::Commit { commit: c } = update.change {
                        commit = Some(*c);
                    }
                }
            }
            // The record keeps who reverted it; the update, what it changed.
            let commit = match (commit, &flight.commit) {
                (Some(mut c), Some(kept)) => {
                    c.reverted_by = kept.reverted_by.clone();
                    Some(c)
                }
                (None, kept) => kept.clone(),
                (Some(c), None) => Some(c),
            };
            Ok(FlightDiff {
                flight: flight.id,
                agent: flight.agent,
                commit,
            })
        })
        .await
}

/// `relay diff AGENT`: its branch against its base, read by the runtime that serves it.
pub async fn agent_diff(
    broker: &Broker,
    control_: Option<&Arc<dyn FlightControl>>,
    name: &str,
) -> Result<AgentDiff, BrokerError> {
    let found = agent(broker, name).await?;
    control(control_)?.agent_diff(found).await
}

/// `relay revert FLIGHT`: a commit on the agent's branch undoing the flight's. Refused
/// for a flight with no commit, one reverted already, and one still running (its changes
/// are not committed yet). On this host the answer is the flight with its revert
/// recorded; a node's agent's revert is sent, and recorded when the node reports it.
pub async fn revert(
    broker: &Broker,
    control_: Option<&Arc<dyn FlightControl>>,
    id: &str,
    by: &str,
) -> Result<Flight, BrokerError> {
    let found = flight(broker, id).await?;
    if !found.state.is_terminal() {
        return Err(BrokerError::Invalid(format!(
            "agent {} is running flight {id}: revert after it ends, or interrupt it (`relay interrupt {id}`)",
            found.agent
        )));
    }
    let Some(commit) = found.commit.clone() else {
        return Err(BrokerError::Invalid(format!(
            "flight {id} has no commit to revert: it changed no file (or its agent has no worktree)"
        )));
    };
    if let Some(r) = &commit.reverted_by {
        return Err(BrokerError::Invalid(format!(
            "flight {id} was reverted already, by commit {} ({})",
            relay_protocol::domain::short(&r.commit),
            r.by
        )));
    }
    let control = control(control_)?;
    // Subscribed before asking: the runtime's report may be recorded before it answers.
    let mut events = broker.subscribe();
    match control
        .revert(found.clone(), commit, by.to_string())
        .await?
    {
        Reverting::Sent { node } => {
            tracing::info!(flight = %id, %node, "revert sent to the agent's node");
            Ok(found)
        }
        Reverting::Done => wait_reverted(broker, &mut events, id).await,
    }
}

/// The flight once its revert is recorded, or as it is after [`REVERT_REPORT_WAIT`].
async fn wait_reverted(
    broker: &Broker,
    events: &mut tokio::sync::broadcast::Receiver<Live>,
    id: &str,
) -> Result<Flight, BrokerError> {
    let reverted = |f: &Flight| f.commit.as_ref().is_some_and(|c| c.reverted_by.is_some());
    let deadline = tokio::time::sleep(REVERT_REPORT_WAIT);
    tokio::pin!(deadline);
    let mut read = true;
    loop {
        if read {
            let now = flight(broker, id).await?;
            if reverted(&now) {
                return Ok(now);
            }
        }
        read = tokio::select! {
            _ = &mut deadline => break,
            live = events.recv() => match live {
                Ok(live) => match live.take().as_deref().map(|e| &e.body) {
                    Some(EventBody::FlightUpdated { flight, .. }) if flight.id == id => {
                        if reverted(flight) {
                            return Ok(flight.clone());
                        }
                        false
                    }
                    Some(_) => false,
                    // No longer in memory: read the record again.
                    None => true,
                },
                // Missed: read the record again.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => true,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            },
        };
    }
    flight(broker, id).await
}

/// `relay agent fork SRC NEW [--at FLIGHT]`: NEW is SRC's spec under a new name, its
/// first session a fork of SRC's at flight `at` (default: SRC's last ended one on that
/// session),
/// and its worktree (SRC has one) a branch from that flight's commit (else the last
/// commit before it, else SRC's base); registered like `agent add`.
pub async fn fork(
    broker: &Broker,
    control: Option<&Arc<dyn FlightControl>>,
    src: &str,
    req: ForkRequest,
) -> Result<AgentAdded, BrokerError> {
    fork_as(broker, control, src, req, None).await
}

/// [`fork`] as `by` asked (the new agent's registration names them).
pub async fn fork_as(
    broker: &Broker,
    control_: Option<&Arc<dyn FlightControl>>,
    src: &str,
    req: ForkRequest,
    by: Option<String>,
) -> Result<AgentAdded, BrokerError> {
    let source = agent(broker, src).await?;
    let harness = source.spec.harness;
    if !harness.capabilities().fork {
        return Err(BrokerError::Invalid(format!(
            "harness {harness} cannot fork a session: agent {src} cannot be forked (add a new agent instead)"
        )));
    }
    let Some(thread) = source.session_id.clone() else {
        return Err(BrokerError::Invalid(format!(
            "agent {src} has no session yet: ask it something first (a fork starts from its conversation)"
        )));
    };
    let spec = fork_spec(broker, &source, thread, req).await?;
    let control = control(control_)?;
    broker.add_agent_as(spec, Some(control.as_ref()), by).await
}

/// NEW's spec (see [`fork`]): SRC's flights on its current session, by creation, give
/// the turns kept and the commit the worktree starts from.
async fn fork_spec(
    broker: &Broker,
    source: &Agent,
    thread: String,
    req: ForkRequest,
) -> Result<relay_protocol::domain::AgentSpec, BrokerError> {
    let src = source.spec.name.clone();
    let since = source.created_at;
    let (name, secrets_of) = (src.clone(), src.clone());
    // Flight ids are time-ordered: the scan gives them by creation. An earlier agent of
    // the same name is not this one.
    let flights = broker
        .store()
        .read_listing(move |st| {
            st.recent_flights(usize::MAX, |f| f.agent == name && f.created_at >= since)
        })
        .await?;
    let secrets: Option<std::collections::BTreeMap<String, String>> = broker
        .store()
        .read(move |st| st.get(T::Secrets, secrets_of.as_bytes()))
        .await?;
    let on_thread: Vec<&Flight> = flights
        .iter()
        .filter(|f| f.thread_id.as_deref() == Some(thread.as_str()))
        .collect();
    let at = match &req.at {
        Some(at) => {
            let Some(pos) = on_thread.iter().position(|f| &f.id == at) else {
                let why = match flights.iter().find(|f| &f.id == at) {
                    Some(_) => format!("it ran in an earlier session of {src}, not in its current one ({thread}), which is what a fork copies"),
                    None => format!("it is not a flight of agent {src}"),
                };
                return Err(BrokerError::Invalid(format!(
                    "cannot fork {src} at flight {at}: {why} (`relay flight list --agent {src}` lists its flights)"
                )));
            };
            Some(pos)
        }
        // SRC's last flight that ended: a turn still running is not a point to fork at.
        None => on_thread.iter().rposition(|f| f.state.is_terminal()),
    };
    if let Some(pos) = at {
        let f = on_thread[pos];
        if !f.state.is_terminal() {
            return Err(BrokerError::Invalid(format!(
                "flight {} of agent {src} is still running: fork after it ends",
                f.id
            )));
        }
    }
    // A forked agent's first session began with the turns it kept of its source's: in
    // that thread they come before its own flights' (a fork of a fork keeps them too).
    let first_thread = flights.iter().find_map(|f| f.thread_id.as_deref());
    let inherited = match &source.spec.fork {
        Some(from) if first_thread == Some(thread.as_str()) => {
            from.keep_turns.map_or(from.turns, |k| k.min(from.turns))
        }
        _ => 0,
    };
    let upto = at.map_or(0, |p| p + 1);
    let base_commit = on_thread[..upto]
        .iter()
        .rev()
        .find_map(|f| f.commit.as_ref().map(|c| c.head.clone()))
        .or_else(|| source.worktree.as_ref().map(|w| w.base_commit.clone()));
    let mut spec = source.spec.clone();
    spec.name = req.name;
    spec.secrets = Secrets(secrets.unwrap_or_default());
    spec.worktree = source.spec.worktree.as_ref().map(|w| WorktreeSpec {
        base: base_commit.or_else(|| w.base.clone()),
        ..w.clone()
    });
    spec.fork = Some(ForkSpec {
        agent: src.clone(),
        thread_id: thread,
        flight: at.map(|p| on_thread[p].id.clone()),
        keep_turns: at.map(|p| inherited.saturating_add((p + 1) as u32)),
        turns: inherited.saturating_add(on_thread.len() as u32),
        cwd: source
            .worktree
            .as_ref()
            .map(|w| w.path.clone())
            .unwrap_or_else(|| source.spec.cwd.clone()),
    });
    Ok(spec)
}
