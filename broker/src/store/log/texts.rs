//! Long texts written before the events that carry them: a flight's answer of
//! [`TEXT_FILE_MIN`] bytes or more, kept in a file of its own in the log's `texts/`
//! directory, that the log's records refer to ([`crate::store::shared`]).
//!
//! Written in the log itself, a 32 MB answer held the storage thread (the one thread
//! every commit goes through) for tens of milliseconds: its JSON escaped, written and
//! synced in the batch. Every other flight's updates waited behind it (the noisy
//! neighbour, ops/BENCHMARKS.md parts 17 and 19). Here the runtime that drives the agent
//! writes it, on the blocking pool, while it holds that agent's turn anyway, and only
//! then reports it; the storage thread then writes a reference of a few dozen bytes.
//!
//! # What is synced when
//! A text file is written whole and synced (a fresh temporary file, `fsync`, renamed to
//! its name, the directory `fsync`ed: [`relay_infra::disk::write_private_in`]) before
//! [`TextFiles::write`] returns, so before any record can refer to it: a record never
//! names a file that a power loss could take back. A crash between the file and the
//! record leaves a file no record names, until the turn's end, reported again from the
//! runtime's record after the restart, is written first again (`plane::dispatch`): the
//! same text goes to the same name. The runtime's own record of that end refers to the
//! file too, rather than holding the answer again ([`LogTexts`], `relay_runtime::
//! TextStore`): nothing may remove a text file that a record of either names. A file
//! whose record never comes (an item refused, a crash before its end was recorded by the
//! runtime) stays: nothing sweeps `texts/` yet.
//!
//! # Which texts
//! The writer's encoding ([`crate::store::shared::encode`]) finds a text here by its very
//! buffer ([`SharedStr::same_buffer`]), never by its content: what it writes a reference
//! to is the text it was given. [`TextFiles`] keeps each text written until its flight
//! ends ([`TextFiles::forget`]; the writer calls it as it records the end), or no one
//! else holds it (it can then never be asked for again), whichever comes first: it holds
//! the text's buffer meanwhile. (Never by address alone: a freed buffer's address comes
//! back for another text.)
//!
//! # Format
//! File `<flight>.<crc32 of the text, 8 hex digits>.<length>.txt`, the text's UTF-8
//! bytes as they are. A reader checks the name (nothing but what a writer makes: no
//! path), the length and the checksum.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use relay_protocol::domain::SharedStr;
use serde::{Deserialize, Serialize};

use super::LogError;

/// Texts this long or longer are written to a file of their own first (where the
/// runtime can: an agent of the broker's own runtime).
pub const TEXT_FILE_MIN: usize = relay_protocol::domain::shared::LONG_TEXT;
/// The directory of the text files, in the log's.
pub const DIR: &str = "texts";
/// Most texts kept known at once (each is dropped sooner: see the module's doc).
const KNOWN_MAX: usize = 64;

/// A text in a file of its own: what a record's reference to it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TextFile {
    pub name: String,
    pub len: u64,
    pub crc: u32,
}

/// The text files of one log, and the texts written there that are still held.
pub struct TextFiles {
    dir: PathBuf,
    /// Flight, text, its file.
    known: Mutex<Vec<(String, SharedStr, TextFile)>>,
    /// Bytes of texts being written now: counted as used by the reserve's check, so that
    /// several agents' answers written at once cannot each pass it alone.
    writing: AtomicU64,
}

/// `len` bytes counted in [`TextFiles::writing`] while it lives.
struct Writing<'a>(&'a AtomicU64, u64);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::AcqRel);
    }
}

impl TextFiles {
    /// The text files of the log in `log_dir` (blocking: a temporary file a crash left
    /// behind, which no record can name, is removed).
    pub(super) fn new(log_dir: &Path) -> TextFiles {
        let dir = log_dir.join(DIR);
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for name in entries.flatten().map(|e| e.file_name()) {
                let name = name.to_string_lossy();
                if name.starts_with('.') && name.ends_with(".tmp") {
                    if let Err(e) = std::fs::remove_file(dir.join(&*name)) {
                        tracing::warn!(file = %name, error = %e, "a temporary text file stays");
                    }
                }
            }
        }
        TextFiles {
            dir,
            known: Mutex::new(Vec::new()),
            writing: AtomicU64::new(0),
        }
    }

    /// Writes `text`, of `flight`, to its file and syncs it (blocking): from then on, a
    /// record may refer to it instead of holding it ([`TextFiles::written`]).
    pub fn write(&self, flight: &str, text: &SharedStr) -> Result<TextFile, LogError> {
        let crc = crc32fast::hash(text.as_bytes());
        let len = text.len() as u64;
        if !flight
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            || flight.is_empty()
            || flight.len() > 100
        {
            return Err(LogError::Corrupt(format!(
                "flight id {flight:?} cannot name a text file"
            )));
        }
        let file = TextFile {
            name: format!("{flight}.{crc:08x}.{len}.txt"),
            len,
            crc,
        };
        // The same name again (a report sent again after a restart): kept if it holds
        // this very text, else this one is not written (and is stored in the log).
        let path = self.dir.join(&file.name);
        match std::fs::read(&path) {
            // Synced again: a crash may have come between its rename and the directory's
            // sync.
            Ok(there) if there == text.as_bytes() => std::fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .and_then(|()| std::fs::File::open(&self.dir))
                .and_then(|d| d.sync_all())
                .map_err(super::io(format!("sync {}", file.name)))?,
            Ok(_) => {
                return Err(LogError::Corrupt(format!(
                    "text file {} holds another text",
                    file.name
                )))
            }
            // A new file: it must fit above the disk's reserve (one already there takes
            // no more room).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let others = self.writing.fetch_add(len, Ordering::AcqRel);
                let _writing = Writing(&self.writing, len);
                fits(relay_infra::disk::space(), len, others)?;
                relay_infra::disk::write_private_in(&self.dir, &file.name, text.as_bytes())
                    .map_err(|e| LogError::Io {
                        what: e.doing,
                        source: e.source,
                    })?;
            }
            Err(e) => return Err(super::io(format!("read {}", file.name))(e)),
        }
        if let Ok(mut known) = self.known.lock() {
            // Only this list holds them: no one can hand them over again.
            known.retain(|(_, t, _)| t.holders() > 1);
            if known.len() >= KNOWN_MAX {
                known.remove(0);
            }
            known.push((flight.to_string(), text.clone(), file.clone()));
        }
        Ok(file)
    }

    /// The file `text` was written to, if this very buffer was ([`TextFiles::write`]).
    pub fn written(&self, text: &SharedStr) -> Option<TextFile> {
        let known = self.known.lock().ok()?;
        known
            .iter()
            .find(|(_, t, _)| SharedStr::same_buffer(t, text))
            .map(|(_, _, f)| f.clone())
    }

    /// Lets go of the texts of `flight` (it ended: no event of it will carry them again).
    pub fn forget(&self, flight: &str) {
        if let Ok(mut known) = self.known.lock() {
            known.retain(|(f, _, _)| f != flight);
        }
    }

    /// The text of `file` (blocking), checked: a name a writer makes, its length, its
    /// checksum, UTF-8.
    pub fn read(&self, file: &TextFile) -> Result<String, LogError> {
        let plain = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.');
        if file.name.is_empty()
            || file.name.starts_with('.')
            || !file.name.bytes().all(plain)
            || !file.name.ends_with(".txt")
        {
            return Err(LogError::Corrupt(format!(
                "a reference names text file {:?}",
                file.name
            )));
        }
        // A reference to a file that is not there (or cannot be read) is damage, as a
        // record that is not there would be.
        let bytes = std::fs::read(self.dir.join(&file.name)).map_err(|e| {
            LogError::Corrupt(format!("text file {} cannot be read: {e}", file.name))
        })?;
        if bytes.len() as u64 != file.len || crc32fast::hash(&bytes) != file.crc {
            return Err(LogError::Corrupt(format!(
                "text file {} is not the text its reference names (length {} against {}, or its checksum)",
                file.name,
                bytes.len(),
                file.len
            )));
        }
        String::from_utf8(bytes)
            .map_err(|_| LogError::Corrupt(format!("text file {} is not UTF-8", file.name)))
    }
}

/// The text files of a store's log, as its embedded runtime writes to and refers to
/// them ([`relay_runtime::TextStore`]; a reference is a [`TextFile`]'s JSON).
pub struct LogTexts(pub crate::store::Store);

impl relay_runtime::TextStore for LogTexts {
    fn write(&self, flight: &str, text: &SharedStr) -> Result<(), String> {
        let written = self.0.log().texts().write(flight, text);
        written.map(drop).map_err(|e| e.to_string())
    }

    fn written(&self, text: &SharedStr) -> Option<String> {
        let file = self.0.log().texts().written(text)?;
        serde_json::to_string(&file).ok()
    }

    fn read(&self, reference: &str) -> Result<SharedStr, String> {
        let file: TextFile = serde_json::from_str(reference)
            .map_err(|e| format!("a reference that is not one ({e})"))?;
        let text = self
            .0
            .log()
            .texts()
            .read(&file)
            .map_err(|e| e.to_string())?;
        Ok(SharedStr::from(text))
    }
}

/// Never into the disk's reserve (kept for sled): a text that would take the disk under
/// it goes with its event, whose write is refused or let into the reserve as any
/// report's is. `space`: the disk's now (`None`: not guarded); `others`: bytes of other
/// texts being written meanwhile (not in `space` yet).
fn fits(space: Option<relay_infra::disk::Space>, len: u64, others: u64) -> Result<(), LogError> {
    let room = relay_infra::disk::Room::AboveReserve;
    match space.and_then(|s| s.refusal_of(room, len.saturating_add(others))) {
        Some(full) => Err(LogError::Io {
            what: format!(
                "a text of {len} bytes would take the disk under its reserve ({} bytes free, {others} being written, {} kept)",
                full.free, full.reserve
            ),
            source: std::io::ErrorKind::StorageFull.into(),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_text_is_found_by_its_buffer_and_read_back_checked() {
        let dir = tempfile::tempdir().unwrap();
        let texts = TextFiles::new(dir.path());
        let text = SharedStr::from("an answer é\n".repeat(1000));
        let file = texts.write("flt_1", &text).unwrap();
        assert_eq!(texts.written(&text), Some(file.clone()));
        // The same content in another buffer is not taken for it.
        let copy = SharedStr::from(text.to_string());
        assert_eq!(texts.written(&copy), None);
        assert_eq!(texts.read(&file).unwrap(), *text);
        // Written again (a report sent twice): the same file, still whole.
        assert_eq!(texts.write("flt_1", &copy).unwrap(), file);
        assert_eq!(texts.read(&file).unwrap(), *text);
        // Written, a text no longer counts as being written.
        assert_eq!(texts.writing.load(Ordering::Acquire), 0);

        // Damage is a typed error: another length, another checksum, a path.
        let longer = TextFile {
            len: file.len + 1,
            ..file.clone()
        };
        assert!(matches!(texts.read(&longer), Err(LogError::Corrupt(_))));
        let other = TextFile {
            crc: file.crc ^ 1,
            ..file.clone()
        };
        assert!(matches!(texts.read(&other), Err(LogError::Corrupt(_))));
        for name in ["../../etc/passwd", ".hidden.txt", "a/b.txt", ""] {
            let bad = TextFile {
                name: name.into(),
                ..file.clone()
            };
            assert!(
                matches!(texts.read(&bad), Err(LogError::Corrupt(_))),
                "{name}"
            );
        }
        let gone = TextFile {
            name: "flt_2.00000000.1.txt".into(),
            ..file.clone()
        };
        assert!(matches!(texts.read(&gone), Err(LogError::Corrupt(_))));
        assert!(texts.write("../x", &text).is_err());
    }

    #[test]
    fn a_text_is_not_written_into_the_disks_reserve() {
        let space = |free| relay_infra::disk::Space {
            dir: "/data".into(),
            free,
            reserve: 16 << 20,
        };
        assert!(fits(None, 1 << 30, 1 << 30).is_ok(), "no guard");
        assert!(fits(Some(space(48 << 20)), 32 << 20, 0).is_ok());
        let e = fits(Some(space(48 << 20)), (32 << 20) + 1, 0).unwrap_err();
        assert!(e.to_string().contains("under its reserve"), "{e}");
        // Another text being written meanwhile counts as used: the two do not both fit.
        assert!(fits(Some(space(48 << 20)), 16 << 20, 16 << 20).is_ok());
        let e = fits(Some(space(48 << 20)), 16 << 20, (16 << 20) + 1).unwrap_err();
        assert!(e.to_string().contains("being written"), "{e}");
    }

    #[test]
    fn a_temporary_file_a_crash_left_is_removed_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let texts = TextFiles::new(dir.path());
        let file = texts.write("flt_1", &SharedStr::from("an answer")).unwrap();
        let left = dir
            .path()
            .join(DIR)
            .join(format!(".{}.x1y2.tmp", file.name));
        std::fs::write(&left, "half an answ").unwrap();
        let texts = TextFiles::new(dir.path());
        assert!(!left.exists());
        assert_eq!(texts.read(&file).unwrap(), "an answer");
    }

    #[test]
    fn a_text_no_one_else_holds_is_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let texts = TextFiles::new(dir.path());
        let first = SharedStr::from("first");
        texts.write("flt_1", &first).unwrap();
        drop(first);
        let second = SharedStr::from("second");
        texts.write("flt_1", &second).unwrap();
        {
            let known = texts.known.lock().unwrap();
            assert_eq!(known.len(), 1, "the first went once only the list held it");
            assert!(SharedStr::same_buffer(&known[0].1, &second));
        }
        // Its flight ended: let go of, though still held elsewhere.
        texts.forget("flt_2");
        assert!(texts.written(&second).is_some(), "another flight's");
        texts.forget("flt_1");
        assert!(texts.written(&second).is_none());
        assert!(texts.known.lock().unwrap().is_empty());
    }
}
