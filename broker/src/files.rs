//! Files that hold secrets, made safe whatever was there before.
//!
//! A data dir is made 0700 at every start (a pre-made 0755 one would leave the event log
//! readable); one owned by another user is refused (its owner could read or swap what
//! we write there), and so is a symlink in it (a planted `db` -> elsewhere would put our
//! secrets where its planter says). Every file the broker writes whole (`api.json`, keys, the NATS cursor)
//! goes through [`write_private`]: a fresh temporary file beside it, of a random name
//! (`tempfile`), created with `O_EXCL | O_NOFOLLOW` and mode 0600 (a planted file or
//! symlink is never followed nor reused), written and fsynced, renamed over the target,
//! and the directory fsynced: after a crash the file is the old one or the new one,
//! whole.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why a private file or directory could not be made, written or read: what was being
/// done, and the system's error under it.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{doing}")]
    Io {
        doing: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{} names no file", .0.display())]
    NoFileName(PathBuf),
    #[error("{} does not hold a key (64 hex digits)", .0.display())]
    NotAKey(PathBuf),
    #[error("data dir {} is owned by {owner} (uid {uid}), not by this user (uid {me}): refusing it, as its owner could read or replace the broker's secrets; use a data dir of your own", .dir.display())]
    NotOwner {
        dir: PathBuf,
        uid: u32,
        owner: String,
        me: u32,
    },
    #[error("{} is a symlink: refusing to follow it (nothing in a data dir may point elsewhere; remove it)", .0.display())]
    Symlink(PathBuf),
}

/// `Err(FileError::Io)` saying what was being done, for `map_err`.
fn doing(what: impl FnOnce() -> String) -> impl FnOnce(std::io::Error) -> FileError {
    move |source| FileError::Io {
        doing: what(),
        source,
    }
}

/// Creates `dir` (and its parents) if missing and makes it 0700, even if it existed.
/// Refuses a `dir` another user owns, and one holding a symlink.
pub fn private_dir(dir: &Path) -> Result<(), FileError> {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::geteuid().as_raw();
    if let Ok(meta) = std::fs::metadata(dir) {
        if meta.uid() != me {
            return Err(FileError::NotOwner {
                dir: dir.to_path_buf(),
                uid: meta.uid(),
                owner: user_name(meta.uid()).unwrap_or_else(|| "an unknown user".into()),
                me,
            });
        }
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(doing(|| {
            format!("cannot create data dir {}", dir.display())
        }))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(doing(|| {
        format!(
            "cannot make data dir {} private (mode 0700): is it yours?",
            dir.display()
        )
    }))?;
    let entries = std::fs::read_dir(dir)
        .map_err(doing(|| format!("cannot read data dir {}", dir.display())))?;
    for entry in entries {
        let entry = entry.map_err(doing(|| format!("cannot read data dir {}", dir.display())))?;
        if entry.file_type().is_ok_and(|t| t.is_symlink()) {
            return Err(FileError::Symlink(entry.path()));
        }
    }
    Ok(())
}

/// The name `/etc/passwd` gives `uid`, for an error message.
fn user_name(uid: u32) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let id = fields.nth(1)?;
        (id.parse::<u32>().ok()? == uid).then(|| name.to_string())
    })
}

/// Writes `bytes` to `path` with mode 0600, atomically and durably (see the module docs;
/// [`relay_infra::disk::write_private`]).
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if path.file_name().is_none() {
        return Err(FileError::NoFileName(path.to_path_buf()));
    }
    relay_infra::disk::write_private(dir, path, bytes).map_err(|e| FileError::Io {
        doing: e.doing,
        source: e.source,
    })
}

/// Reads a 32-byte key written as hex; `None` if the file does not exist.
pub fn read_key(path: &Path) -> Result<Option<[u8; 32]>, FileError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(doing(|| format!("cannot read {}", path.display()))(e)),
    };
    relay_protocol::hex::decode(text.trim())
        .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
        .map(Some)
        .ok_or_else(|| FileError::NotAKey(path.to_path_buf()))
}

/// `key` as the hex text [`read_key`] reads.
pub fn key_text(key: &[u8; 32]) -> String {
    let mut s = relay_protocol::hex::encode(key);
    s.push('\n');
    s
}

/// The key at `path`, made (random, 0600) if missing.
pub fn read_or_create_key(path: &Path) -> Result<[u8; 32], FileError> {
    if let Some(key) = read_key(path)? {
        return Ok(key);
    }
    let key: [u8; 32] = rand::random();
    write_private(path, key_text(&key).as_bytes())?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[test]
    fn an_existing_open_dir_is_made_private() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        private_dir(&dir).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
    }

    #[test]
    fn a_data_dir_owned_by_another_user_is_refused_naming_its_owner() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        std::fs::create_dir(&dir).unwrap();
        if rustix::process::geteuid().as_raw() != 0 {
            // Only root can give a directory away; the refusal needs one given away.
            eprintln!("SKIPPED: needs root to chown a directory to nobody");
            return;
        }
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
        let e = private_dir(&dir).unwrap_err();
        assert!(matches!(e, FileError::NotOwner { uid: 65534, .. }), "{e:?}");
        let text = e.to_string();
        assert!(text.contains("uid 65534"), "{text}");
        assert!(text.contains("nobody"), "{text}");
        // Not made ours, not opened up or down.
        let meta = std::fs::metadata(&dir).unwrap();
        assert_eq!(meta.uid(), 65534);
    }

    #[test]
    fn a_symlink_in_the_data_dir_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.join("db")).unwrap();
        let e = private_dir(&dir).unwrap_err();
        assert!(
            matches!(e, FileError::Symlink(ref p) if p == &dir.join("db")),
            "{e:?}"
        );
        assert!(e.to_string().contains("symlink"), "{e}");
        // A regular data dir passes.
        std::fs::remove_file(dir.join("db")).unwrap();
        private_dir(&dir).unwrap();
    }

    #[test]
    fn a_planted_temporary_file_or_symlink_is_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("api.json");
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::write(&elsewhere, "theirs").unwrap();
        std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o666)).unwrap();
        std::os::unix::fs::symlink(&elsewhere, tmp.path().join("api.json.tmp")).unwrap();
        write_private(&target, b"secret").unwrap();
        assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "theirs");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "secret");
        let meta = std::fs::symlink_metadata(&target).unwrap();
        assert!(meta.is_file());
        assert_eq!(meta.mode() & 0o777, 0o600);

        // A planted world-readable regular file is replaced, not reused.
        std::fs::write(tmp.path().join("api.json.tmp"), "planted").unwrap();
        std::fs::set_permissions(
            tmp.path().join("api.json.tmp"),
            std::fs::Permissions::from_mode(0o666),
        )
        .unwrap();
        write_private(&target, b"again").unwrap();
        assert_eq!(std::fs::metadata(&target).unwrap().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "again");
    }

    #[test]
    fn a_write_leaves_no_temporary_file() {
        let tmp = tempfile::tempdir().unwrap();
        write_private(&tmp.path().join("cursor"), b"1").unwrap();
        write_private(&tmp.path().join("cursor"), b"2").unwrap();
        let names: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["cursor"]);
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("cursor")).unwrap(),
            "2"
        );
    }

    #[test]
    fn keys_round_trip_and_bad_ones_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("k");
        assert_eq!(read_key(&path).unwrap(), None);
        let key = read_or_create_key(&path).unwrap();
        assert_eq!(read_or_create_key(&path).unwrap(), key);
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        std::fs::write(&path, "zz").unwrap();
        assert!(read_key(&path).is_err());
    }
}
