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
    /// Convert a data dir made before the event log v2 (Relay 0.x's single sled
    /// database, `db/`) to v2 (`store/`), then check it. Copy then switch: the old
    /// database is only read, and kept as `db.v1` until you remove it; a crash midway
    /// leaves it as it was. `relay up` does the same on its first start.
    #[arg(long)]
    pub migrate: bool,
    /// Print JSON (machine-readable) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `relay doctor`: the rebuild-and-compare check of a stopped data dir, and its orphan
/// worktrees.
pub async fn run(data_dir: DataDir, args: DoctorArgs) -> anyhow::Result<Exit> {
    let DoctorArgs { fix, migrate, json } = args;
    let dir = data_dir.path();
    use relay_broker::store::migrate::{layout, Layout};
    match layout(&dir) {
        Layout::Empty => anyhow::bail!(
            "{} holds no relay store (no {} nor {})",
            dir.display(),
            dir.join(relay_broker::store::STORE_DIR).display(),
            dir.join(relay_broker::store::migrate::V1_DIR).display()
        ),
        Layout::V1 if !migrate => {
            errln!(
                "relay: {} holds a store from before the event log v2 ({}): `relay doctor --migrate` converts it (or `relay up` does, on its first start); nothing is changed until then",
                dir.display(),
                dir.join(relay_broker::store::migrate::V1_DIR).display()
            );
            return Ok(Exit::Refused);
        }
        Layout::V1 | Layout::V2 => {}
    }
    let root = dir.clone();
    let opened = relay_infra::storage::read(move || {
        let mut last_shown = 0u64;
        let (store, migrated) =
            relay_broker::store::migrate::open_data_dir(&root, &mut |done, total| {
                // About every tenth, on stderr: stdout stays the report.
                if total > 0 && (done == total || done >= last_shown + total.div_ceil(10)) {
                    last_shown = done;
                    errln!("relay: migrating the store: {done} of {total} events");
                }
            })?;
        let report = store.doctor()?;
        Ok::<_, relay_broker::BrokerError>(((report, migrated), store))
    })
    .await?;
    let ((report, migrated), store) = match opened {
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
            if let Some(m) = &migrated {
                o.insert("migrated".into(), serde_json::to_value(m)?);
            }
        }
        print_json(&value)?;
    } else {
        outln!("data dir: {}", dir.display());
        if let Some(m) = &migrated {
            outln!(
                "migrated to the event log v2: {} events (last seq {}), {} -> {} bytes; the v1 database is kept at {} (remove it once you are satisfied)",
                m.events,
                m.last_seq,
                m.v1_bytes,
                m.v2_bytes,
                m.kept_v1.display()
            );
        }
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
