//! `relay doctor`: the rebuild-and-compare check of a stopped broker's data dir
//! ([`relay_broker::Store::doctor`]), and the worktrees its runtime made that no agent
//! owns (`--fix` removes them: [`relay_runtime::Runtime::orphan_worktrees`]).

use crate::exit::Exit;

use relay_client::data_dir::DataDir;

use crate::terminal::{errln, outln};
use crate::views::print_json;

/// `relay doctor [--fix]`.
#[derive(clap::Args)]
pub struct DoctorArgs {
    /// Remove the worktrees Relay made that no agent owns (their uncommitted work is
    /// committed on their branch first; the branches stay).
    #[arg(long)]
    pub fix: bool,
    /// Print JSON (machine-readable) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `relay doctor`: the rebuild-and-compare check of a stopped data dir, and its orphan
/// worktrees.
pub async fn run(data_dir: DataDir, args: DoctorArgs) -> anyhow::Result<Exit> {
    let DoctorArgs { fix, json } = args;
    let dir = data_dir.path();
    let db = dir.join("db");
    if !db.exists() {
        anyhow::bail!(
            "{} holds no relay database (no {})",
            dir.display(),
            db.display()
        );
    }
    let opened = relay_infra::storage::read(move || {
        let store = relay_broker::Store::open(&db)?;
        let report = store.doctor()?;
        Ok::<_, relay_broker::BrokerError>((report, store))
    })
    .await?;
    let (report, store) = match opened {
        Ok(opened) => opened,
        // A running broker (or node) holds the database: a conflict, not damage (exit 4,
        // not 1), with what to do.
        Err(e @ relay_broker::BrokerError::Locked(_)) => {
            errln!(
                "relay: {e}: `relay doctor` checks a stopped data dir; stop the `relay up` (or `relay node`) using {} first, then run it again",
                dir.display()
            );
            return Ok(Exit::Refused);
        }
        Err(e) => return Err(e.into()),
    };
    let orphans = orphan_worktrees(&dir, store, fix).await?;
    if json {
        let mut value = serde_json::to_value(&report)?;
        if let Some(o) = value.as_object_mut() {
            o.insert("orphan_worktrees".into(), serde_json::to_value(&orphans)?);
        }
        print_json(&value)?;
    } else {
        outln!("data dir: {}", dir.display());
        outln!(
            "events: {} (last seq {}); flights: {} ({} not ended: `relay up` resumes or fails them)",
            report.events, report.last_seq, report.flights, report.live_flights
        );
        if report.gaps.is_empty() {
            outln!("event log: no gaps");
        } else {
            for (expected, found) in &report.gaps {
                outln!("event log: GAP, expected seq {expected}, found {found}");
            }
        }
        if report.mismatched_trees.is_empty() {
            outln!("projections: all equal a rebuild from the log");
        } else {
            outln!(
                "projections: DIFFER from a rebuild from the log: {}",
                report.mismatched_trees.join(", ")
            );
        }
        worktree_lines(&orphans, fix);
        outln!(
            "{}",
            if report.consistent {
                "consistent"
            } else {
                "NOT consistent"
            }
        );
    }
    Ok(if report.consistent {
        Exit::Ok
    } else {
        Exit::Failed
    })
}

/// The worktrees the embedded runtime made (its registry, in the broker's database) that
/// no registered agent owns; with `fix`, removed.
async fn orphan_worktrees(
    dir: &std::path::Path,
    store: relay_broker::Store,
    fix: bool,
) -> anyhow::Result<Vec<relay_protocol::api::OrphanWorktree>> {
    let agents: Vec<relay_protocol::domain::Agent> = {
        let store = store.clone();
        relay_infra::storage::read(move || store.values(relay_broker::store::T::Agents)).await??
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let config = relay_runtime::RuntimeConfig {
        shared_db: Some(store.durable().clone()),
        ..relay_runtime::RuntimeConfig::new(dir)
    };
    let (runtime, _reports) = relay_runtime::Runtime::start(config, stop.clone())?;
    let found = runtime.orphan_worktrees(&agents, fix).await;
    stop.cancel();
    runtime.stopped().await;
    // Written by the fix (registry entries dropped): on disk before the answer.
    if fix {
        store.flush().await?;
    }
    Ok(found?)
}

fn worktree_lines(orphans: &[relay_protocol::api::OrphanWorktree], fix: bool) {
    if orphans.is_empty() {
        outln!("worktrees: every worktree Relay made has its agent");
        return;
    }
    outln!(
        "worktrees: {} made by Relay that no agent owns:",
        orphans.len()
    );
    for o in orphans {
        outln!(
            "  {} (branch {} of {}, made for {}): {}",
            o.path,
            o.branch,
            o.repo,
            o.agent,
            o.why
        );
        if let Some(done) = &o.fixed {
            outln!("    fixed: {done}");
        }
    }
    if !fix {
        outln!("  `relay doctor --fix` removes them (their uncommitted work committed on their branches first; the branches stay)");
    }
}
