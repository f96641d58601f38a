//! A turn's end report too long for a record is kept in a file of its own. The record of
//! an ended dispatch keeps the report of the end until it is sent
//! ([`super::ThreadStore::set_dispatch_ended`]); for a long answer (32 MB in the noisy
//! neighbour's burst, ops/BENCHMARKS.md part 17) that put a 32 MB value into sled on the
//! storage thread, the one thread every commit of the broker and the runtime goes
//! through: about 70 ms of every other flight's updates waiting behind it.
//!
//! A report of [`FILE_MIN`] bytes or more is written to `<database>/runtime-reports/`
//! instead, on the blocking pool, as every file Relay writes whole
//! ([`relay_infra::disk::write_private`]: a fresh temporary file, synced, renamed to its
//! name, the directory synced), before the record that names it is written (so a
//! record never names a file that a crash could take back). A file whose record never
//! made it to disk is swept at the next open; one whose record is dropped goes with it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use relay_protocol::runtime::Report;
use serde::{Deserialize, Serialize};

use crate::RuntimeError;

/// A report this long or longer (its JSON) is kept in a file.
pub(super) const FILE_MIN: usize = 256 * 1024;
/// The directory in the database's own where such files are.
const DIR: &str = "runtime-reports";
/// Longest file name (the invocation's id, hex): a longer id keeps its report inline.
const NAME_MAX: usize = 200;

/// What the dispatch record of an end whose report is in a file holds (as JSON).
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct InFile {
    pub flight: String,
    pub file: String,
}

/// The report files' directory of the database at `db_dir`.
pub(super) fn dir_of(db_dir: &Path) -> PathBuf {
    db_dir.join(DIR)
}

/// The file name of `invocation`'s report: its id in hex (any id, no path in it).
pub(super) fn name_of(invocation: &str) -> Option<String> {
    let name: String = invocation.bytes().map(|b| format!("{b:02x}")).collect();
    (name.len() <= NAME_MAX).then_some(name)
}

fn failed(path: &Path) -> impl FnOnce(std::io::Error) -> RuntimeError + '_ {
    move |source| RuntimeError::ReportFile {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `json` as the report file `name` in `dir`, durably (blocking).
pub(super) fn write(dir: &Path, name: &str, json: &[u8]) -> Result<(), RuntimeError> {
    relay_infra::disk::write_private_in(dir, name, json).map_err(|e| RuntimeError::ReportFile {
        path: dir.join(name),
        source: std::io::Error::new(e.source.kind(), format!("{}: {}", e.doing, e.source)),
    })
}

/// The report in file `name` of `dir` (blocking).
pub(super) fn read(dir: &Path, name: &str) -> Result<Report, RuntimeError> {
    let path = dir.join(name);
    let json = std::fs::read(&path).map_err(failed(&path))?;
    Ok(serde_json::from_slice(&json)?)
}

/// Removes report files (blocking); one already gone is fine.
pub(super) fn remove(dir: &Path, names: &[String]) {
    for name in names {
        match std::fs::remove_file(dir.join(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(file = %name, error = %e, "a sent report's file stays"),
        }
    }
}

/// Removes the files of `dir` no record names (`keep`): a crash between a file and its
/// record, or between a record's removal and its file's (blocking).
pub(super) fn sweep(dir: &Path, keep: &HashSet<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let orphans: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| !keep.contains(name))
        .collect();
    if !orphans.is_empty() {
        tracing::info!(
            files = orphans.len(),
            "removing report files no dispatch record names"
        );
        remove(dir, &orphans);
    }
}
