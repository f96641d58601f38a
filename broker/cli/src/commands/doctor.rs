//! `relay doctor`: the rebuild-and-compare check of a stopped broker's data dir
//! ([`relay_broker::Store::doctor`]).

use crate::exit::Exit;

use relay_client::data_dir::DataDir;

use crate::terminal::outln;
use crate::views::print_json;

/// `relay doctor`: the rebuild-and-compare check of a stopped data dir.
pub async fn run(data_dir: DataDir, json: bool) -> anyhow::Result<Exit> {
    let dir = data_dir.path();
    let db = dir.join("db");
    if !db.exists() {
        anyhow::bail!(
            "{} holds no relay database (no {})",
            dir.display(),
            db.display()
        );
    }
    let report = relay_infra::storage::read(move || {
        let store = relay_broker::Store::open(&db)?;
        store.doctor()
    })
    .await??;
    if json {
        print_json(&report)?;
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
