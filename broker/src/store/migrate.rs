//! From the v1 store (one sled database, `<data dir>/db`, with the events in its `events`
//! tree) to v2 (`<data dir>/store`: the event log and sled's projections), copy then
//! switch:
//!
//! 1. `<data dir>/store.migrating` is made anew (one left by a crash is removed first).
//! 2. Every v1 event is appended to the new log with its stored bytes unchanged (the v1
//!    value is the v2 payload: version byte and wire JSON), in seq order, and applied to
//!    the new projections. The trees that are not projections (agent secrets, node
//!    cursors, the embedded runtime's records) are copied as they are.
//! 3. Everything is synced (the log's segments, sled and its file, the directories).
//! 4. The switch: `store.migrating` is renamed `store` (one atomic rename), the data dir
//!    synced; then `db` is renamed `db.v1` (kept until the user removes it).
//!
//! v1 is only read until step 4: a crash (even `kill -9`) before the rename leaves it
//! as it was, and the next start migrates again from scratch. A crash between the two
//! renames leaves `store` and `db`: `store` is the data dir's store, and the next start
//! finishes the rename.

use std::path::{Path, PathBuf};

use relay_protocol::event::Event;
use serde::Serialize;

use super::keys::{decode, TREE_NAMES};
use super::projections::{apply, PlainSink};
use super::{Store, STORE_DIR, T};
use crate::error::BrokerError;

/// The v1 store's directory in a data dir.
pub const V1_DIR: &str = "db";
/// Where v1 is kept once migrated.
pub const V1_KEPT: &str = "db.v1";
/// Where the migration builds v2 before the switch.
pub const MIGRATING_DIR: &str = "store.migrating";

/// Events copied between two progress reports (and between syncs of the new log).
const CHUNK: usize = 4096;

/// What a data dir holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Nothing yet: a new store is made.
    Empty,
    /// A v1 store to migrate.
    V1,
    V2,
}

/// What the data dir `dir` holds.
pub fn layout(dir: &Path) -> Layout {
    if dir.join(STORE_DIR).exists() {
        Layout::V2
    } else if dir.join(V1_DIR).join("conf").exists() {
        Layout::V1
    } else {
        Layout::Empty
    }
}

/// What a migration did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct MigrateReport {
    pub events: u64,
    pub last_seq: u64,
    /// Entries copied from the trees that are not projections, by tree.
    pub copied: Vec<(String, u64)>,
    /// Where v1 now is.
    pub kept_v1: PathBuf,
    /// Bytes of the v1 database and of the v2 store.
    pub v1_bytes: u64,
    pub v2_bytes: u64,
}

/// Opens the store of data dir `dir`, migrating a v1 store first (see the module
/// header). `progress` hears (events done, events in all) as it goes. Blocking.
pub fn open_data_dir(
    dir: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(Store, Option<MigrateReport>), BrokerError> {
    let report = match layout(dir) {
        Layout::V1 => Some(migrate(dir, progress)?),
        Layout::V2 | Layout::Empty => None,
    };
    finish_switch(dir)?;
    Ok((Store::open(&dir.join(STORE_DIR))?, report))
}

/// After the switch: a v1 `db` still beside `store` (a crash between the renames) is
/// moved to `db.v1`.
fn finish_switch(dir: &Path) -> Result<(), BrokerError> {
    let v1 = dir.join(V1_DIR);
    if dir.join(STORE_DIR).exists() && v1.exists() {
        let kept = dir.join(V1_KEPT);
        if kept.exists() {
            return Err(BrokerError::Log(format!(
                "{} and {} are both here beside {}: move one of them away",
                v1.display(),
                kept.display(),
                dir.join(STORE_DIR).display()
            )));
        }
        std::fs::rename(&v1, &kept).map_err(io(&v1))?;
        sync_dir(dir)?;
    }
    Ok(())
}

/// Converts the v1 store of data dir `dir` to v2 (see the module header). Blocking.
pub fn migrate(
    dir: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<MigrateReport, BrokerError> {
    let v1_path = dir.join(V1_DIR);
    // Its lock keeps a running v1 broker (or a second migration) out.
    let v1 = super::open_sled(&v1_path)?;
    let events = v1.open_tree("events")?;
    let total = events.len() as u64;
    let tmp = dir.join(MIGRATING_DIR);
    if tmp.exists() {
        tracing::warn!(dir = %tmp.display(), "an earlier migration did not finish: starting again");
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    let store = Store::open(&tmp)?;
    let sink = PlainSink(&store);
    let mut chunk: Vec<(u64, sled::IVec)> = Vec::with_capacity(CHUNK);
    let (mut done, mut last_seq) = (0u64, 0u64);
    progress(0, total);
    for entry in events.iter() {
        let (key, value) = entry?;
        let seq = <[u8; 8]>::try_from(key.as_ref())
            .map(u64::from_be_bytes)
            .map_err(|_| BrokerError::Corrupt("a v1 event key is not 8 bytes".into()))?;
        if seq != last_seq + 1 {
            return Err(BrokerError::Corrupt(format!(
                "the v1 event log skips from seq {last_seq} to {seq}: run a v1 `relay doctor` on it first"
            )));
        }
        last_seq = seq;
        chunk.push((seq, value));
        if chunk.len() == CHUNK {
            done += copy_chunk(&store, &sink, &mut chunk)?;
            progress(done, total);
            test_pause(done);
        }
    }
    done += copy_chunk(&store, &sink, &mut chunk)?;
    let copied = copy_other_trees(&v1, &store)?;
    store.log().sync()?;
    store.durable().db().flush()?;
    sync_file(&tmp.join("db").join("db"))?;
    for d in [tmp.join("log"), tmp.join("db"), tmp.clone()] {
        sync_dir(&d)?;
    }
    progress(done, total);
    let v2_bytes = dir_bytes(&tmp);
    drop((store, events, v1));
    // The switch.
    let store_dir = dir.join(STORE_DIR);
    std::fs::rename(&tmp, &store_dir).map_err(io(&tmp))?;
    // sled lets go of its lock after the drop above returns: the store opened next is
    // this one, moved, and its lock may still be ours for a moment.
    relay_infra::disk::moved_here(&store_dir.join("db"));
    sync_dir(dir)?;
    let v1_bytes = dir_bytes(&v1_path);
    finish_switch(dir)?;
    Ok(MigrateReport {
        events: done,
        last_seq,
        copied,
        kept_v1: dir.join(V1_KEPT),
        v1_bytes,
        v2_bytes,
    })
}

/// Appends a chunk of v1 events to the new log and applies them to its projections.
fn copy_chunk(
    store: &Store,
    sink: &PlainSink<'_>,
    chunk: &mut Vec<(u64, sled::IVec)>,
) -> Result<u64, BrokerError> {
    let Some((last, _)) = chunk.last() else {
        return Ok(0);
    };
    let last = *last;
    let first = store
        .log()
        .append(chunk.iter().map(|(seq, v)| (*seq, v.as_ref())))?;
    let mut pos = first;
    for (seq, value) in chunk.iter() {
        let event: Event = decode(value)?;
        if event.seq != *seq {
            return Err(BrokerError::Corrupt(format!(
                "v1 event at seq {seq} says it is seq {}",
                event.seq
            )));
        }
        apply(sink, &event, pos, false)?;
        pos += super::log::record_len(value.len());
    }
    // Readable (the projections' catch-up reads it), and where the projections stand.
    store.log().sync()?;
    store.tree(T::Meta).insert(
        super::APPLIED_KEY,
        super::pair_value(last, store.log().end()).to_vec(),
    )?;
    let n = chunk.len() as u64;
    chunk.clear();
    Ok(n)
}

/// Copies the v1 trees that are not projections (nor its log, nor markers).
fn copy_other_trees(v1: &sled::Db, store: &Store) -> Result<Vec<(String, u64)>, BrokerError> {
    let skip = |name: &str| {
        name == "events"
            || name == "meta"
            || name == "__sled__default"
            || super::doctor::TREES_PROJECTED
                .iter()
                .any(|t| TREE_NAMES[*t as usize] == name)
    };
    let mut copied = Vec::new();
    for name in v1.tree_names() {
        let name = String::from_utf8_lossy(&name).into_owned();
        if skip(&name) {
            continue;
        }
        let (from, to) = (v1.open_tree(&name)?, store.durable().db().open_tree(&name)?);
        let mut n = 0u64;
        for entry in from.iter() {
            let (k, v) = entry?;
            to.insert(k, v)?;
            n += 1;
        }
        copied.push((name, n));
    }
    Ok(copied)
}

/// For the test of a `kill -9` during a migration: with `RELAY_TEST_MIGRATE_PAUSE`
/// set, the migration stops after its first chunk, says so on stderr, and waits to be
/// killed. Never set outside that test.
fn test_pause(done: u64) {
    if std::env::var_os("RELAY_TEST_MIGRATE_PAUSE").is_some() {
        eprintln!("relay-test: migration paused after {done} events");
        loop {
            std::thread::park();
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BrokerError + '_ {
    move |e| BrokerError::Log(format!("{}: {e}", path.display()))
}

fn sync_dir(dir: &Path) -> Result<(), BrokerError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))
}

fn sync_file(path: &Path) -> Result<(), BrokerError> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_data())
        .map_err(io(path))
}

/// Bytes of the files under `dir` (0 for what cannot be read).
pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}
