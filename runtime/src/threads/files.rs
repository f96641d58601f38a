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
//!
//! A report whose answer the broker's text files hold already (the embedded runtime's
//! worker wrote it there first, [`crate::TextStore`]) is neither: its record keeps the
//! report without the answer and a reference to that file ([`WithText`]), so the answer
//! is on disk once, not twice, and never encoded as JSON (32 MB of it in the
//! neighbour's burst, ops/BENCHMARKS.md part 20). The broker never removes a text file
//! its log refers to, and the answer's flight refers to it before the report can be
//! sent; a turn's end waits in this record until then.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use relay_protocol::domain::FlightChange;
use relay_protocol::runtime::Report;
use serde::{Deserialize, Serialize};

use super::{ENDED, ENDED_IN_FILE, ENDED_WITH_TEXT};
use crate::{RuntimeError, TextSink};

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

/// What the dispatch record of an end whose answer is in the broker's text files holds
/// (as JSON): the report without its answer, and the reference to the answer's file.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct WithText {
    pub report: Report,
    pub text: String,
}

impl WithText {
    /// `report` referring to its answer's text file, if it ends a flight with an answer
    /// of [`FILE_MIN`] bytes or more written there as this very buffer (blocking).
    pub fn of(texts: &TextSink, report: &Report) -> Option<WithText> {
        let Report::Flight {
            flight,
            change:
                FlightChange::State {
                    to,
                    reason,
                    output: Some(output),
                },
        } = report
        else {
            return None;
        };
        if output.len() < FILE_MIN {
            return None;
        }
        let text = texts.written(output)?;
        let report = Report::Flight {
            flight: flight.clone(),
            change: FlightChange::State {
                to: *to,
                reason: reason.clone(),
                output: None,
            },
        };
        Some(WithText { report, text })
    }

    /// The whole report, its answer read from `texts` (blocking).
    pub fn read(self, texts: Option<&TextSink>) -> Result<Report, RuntimeError> {
        let failed = |reason: String| RuntimeError::ReportText {
            reference: self.text.clone(),
            reason,
        };
        let texts = texts.ok_or_else(|| failed("this runtime has no text files".into()))?;
        let answer = texts.read(&self.text).map_err(failed)?;
        match self.report {
            Report::Flight {
                flight,
                change: FlightChange::State { to, reason, .. },
            } => Ok(Report::Flight {
                flight,
                change: FlightChange::State {
                    to,
                    reason,
                    output: Some(answer),
                },
            }),
            _ => Err(failed("its record holds no flight's end".into())),
        }
    }
}

/// The report files' directory of the database at `db_dir`.
pub(super) fn dir_of(db_dir: &Path) -> PathBuf {
    db_dir.join(DIR)
}

/// The file name of `invocation`'s report: its id in hex (any id, no path in it).
pub(super) fn name_of(invocation: &str) -> Option<String> {
    let name = relay_protocol::hex::encode(invocation.as_bytes());
    (name.len() <= NAME_MAX).then_some(name)
}

fn failed(path: &Path) -> impl FnOnce(std::io::Error) -> RuntimeError + '_ {
    move |source| RuntimeError::ReportFile {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `json` as the report file `name` in `dir`, durably (blocking). A turn's end is
/// Relay's own report: it may go into the disk's reserve, down to its floor, not below
/// ([`relay_infra::disk::Room`]).
pub(super) fn write(dir: &Path, name: &str, json: &[u8]) -> Result<(), RuntimeError> {
    if let Some(why) = under_floor(relay_infra::disk::space(), json.len() as u64) {
        return Err(RuntimeError::ReportFile {
            path: dir.join(name),
            source: std::io::Error::new(std::io::ErrorKind::StorageFull, why),
        });
    }
    relay_infra::disk::write_private_in(dir, name, json).map_err(|e| RuntimeError::ReportFile {
        path: dir.join(name),
        source: std::io::Error::new(e.source.kind(), format!("{}: {}", e.doing, e.source)),
    })
}

/// Why `len` more bytes would take the disk (its `space` now; `None`: not guarded) under
/// the floor of its reserve, if they would.
pub(super) fn under_floor(space: Option<relay_infra::disk::Space>, len: u64) -> Option<String> {
    let full = space?.refusal_of(relay_infra::disk::Room::DownToFloor, len)?;
    Some(format!(
        "a report of {len} bytes would take the disk under the floor of its reserve ({} bytes free, {} kept)",
        full.free, full.reserve
    ))
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

/// What a record of an end whose report is in a file says ([`super::ENDED_IN_FILE`]).
pub(super) fn in_file(v: &[u8]) -> Option<InFile> {
    match v.split_first() {
        Some((&ENDED_IN_FILE, json)) => serde_json::from_slice(json).ok(),
        _ => None,
    }
}

/// The flight of an ended dispatch's record (without reading a report kept in a file).
pub(super) fn ended_flight(v: &[u8]) -> Option<String> {
    match v.split_first()? {
        (&ENDED, report) => match serde_json::from_slice::<Report>(report).ok()? {
            Report::Flight { flight, .. } => Some(flight),
            _ => None,
        },
        (&ENDED_IN_FILE, _) => in_file(v).map(|f| f.flight),
        (&ENDED_WITH_TEXT, json) => match serde_json::from_slice::<WithText>(json) {
            Ok(WithText {
                report: Report::Flight { flight, .. },
                ..
            }) => Some(flight),
            _ => None,
        },
        _ => None,
    }
}

/// The report of an ended dispatch's record (`None`: not such a record), read from its
/// file when it is in one, in `dir`, or its answer from `texts` (blocking).
pub(super) fn ended_report(
    v: &[u8],
    dir: Option<&Path>,
    texts: Option<&TextSink>,
) -> Option<Result<Report, RuntimeError>> {
    match v.split_first()? {
        (&ENDED_WITH_TEXT, json) => Some(
            serde_json::from_slice::<WithText>(json)
                .map_err(RuntimeError::from)
                .and_then(|with| with.read(texts)),
        ),
        (&ENDED, report) => Some(serde_json::from_slice(report).map_err(RuntimeError::from)),
        (&ENDED_IN_FILE, _) => Some(match (in_file(v), dir) {
            (Some(f), Some(dir)) => read(dir, &f.file),
            _ => Err(RuntimeError::ReportFile {
                path: dir.map(Path::to_path_buf).unwrap_or_default(),
                source: std::io::Error::other("its dispatch record is damaged"),
            }),
        }),
        _ => None,
    }
}
