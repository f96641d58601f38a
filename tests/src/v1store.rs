//! A v1 data dir written by hand, for the migration tests: the one sled database
//! (`<data dir>/db`) that Relay kept before the event log v2, with its events in the
//! `events` tree (seq big-endian -> the stored event: version byte and JSON) and any
//! other trees given.

use std::path::Path;

/// A tree's name and its entries (key, value).
pub type Tree<'a> = (&'a str, Vec<(Vec<u8>, Vec<u8>)>);

/// Writes `<data_dir>/db` as v1 did: `events` holds each (seq, stored bytes), and each
/// of `trees` its entries. Flushed and closed on return.
pub fn write(data_dir: &Path, events: &[(u64, Vec<u8>)], trees: &[Tree<'_>]) -> anyhow::Result<()> {
    let db = open(&data_dir.join("db"))?;
    let log = db.open_tree("events")?;
    for (seq, stored) in events {
        log.insert(seq.to_be_bytes(), stored.as_slice())?;
    }
    for (name, entries) in trees {
        let tree = db.open_tree(name)?;
        for (k, v) in entries {
            tree.insert(k.as_slice(), v.as_slice())?;
        }
    }
    db.flush()?;
    Ok(())
}

/// The events of the v1 database at `db` (a data dir's `db`, or the `db.v1` a migration
/// kept), as stored.
pub fn events(db: &Path) -> anyhow::Result<Vec<(u64, Vec<u8>)>> {
    let db = open(db)?;
    let mut out = Vec::new();
    for entry in db.open_tree("events")?.iter() {
        let (k, v) = entry?;
        let seq = u64::from_be_bytes(<[u8; 8]>::try_from(k.as_ref())?);
        out.push((seq, v.to_vec()));
    }
    Ok(out)
}

/// Opens a database as Relay does, so that reopening it in this process right after
/// waits for sled to let go of it (see `relay_infra::disk::open_private`).
fn open(db: &Path) -> anyhow::Result<sled::Db> {
    Ok(relay_infra::disk::open_private(
        relay_infra::storage::config(),
        db,
    )?)
}
