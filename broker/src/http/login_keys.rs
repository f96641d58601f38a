//! The dashboard's login cookies: signed with a key kept in the data dir, so a login
//! outlives the broker's process, and ended for good by a logout (a revocation kept
//! beside the key) or by rotating the key (`relay open --revoke-all`).
//!
//! ## What is stored where
//!
//! - `<data dir>/dashboard.key` ([`KEY_FILE`]): 32 random bytes (as 64 hex digits), mode
//!   0600, made at the first start. Written whole through [`crate::files::write_private`]
//!   (a fresh 0600 temporary file, fsynced, renamed over, the directory fsynced): never
//!   readable by others, not even while it is written, and after a crash the old key or
//!   the new one, whole. A key file found readable or writable by anyone but its owner
//!   (mode wider than 0600), or that does not hold a key, is NOT trusted: it is replaced
//!   by a new key, with a warning that says so, which ends every login (someone may have
//!   read it; a chmod would keep a key that leaked).
//! - `<data dir>/dashboard.revoked` ([`REVOKED_FILE`]): the login ids ended by a logout,
//!   each with the time its login would have expired anyway, as JSON, written the same
//!   way. Entries past that time are dropped at every write and load, so the file holds
//!   at most the logouts of one [`LOGIN_LIFETIME`]; past [`MAX_REVOKED`] of them the key
//!   is rotated instead (every login ends; never an ended login coming back). A file
//!   that cannot be read as a list of revocations rotates the key too, for the same reason.
//!
//! ## The cookie
//!
//! `1.<login id>.<issued at>.<name>.<mac>`: the version (`1`), a random login id (16
//! bytes, hex), when it was issued (ms since the epoch), the login's name (hex: the
//! cookie's own separators cannot appear in it), and HMAC-SHA256 (hex) under the key of
//! the cookie's name (`relay_login_PORT`) and the four fields before it: a cookie made
//! for one port does not pass on another, nor a changed name, id or date. The MAC is
//! checked in constant time (`Mac::verify_slice`). A login expires [`LOGIN_LIFETIME`]
//! after it was issued (the page then says to run `relay open`).
//!
//! ## What ends a login
//!
//! - A restart: nothing. The key and the revocations are read back at start.
//! - A logout (`POST /v1/logout`): its id is revoked in memory at once (the next request
//!   is refused), then the list is written on the blocking pool, never on an async worker.
//! - Revoke-all (`POST /v1/login/revoke`, `relay open --revoke-all`): a new key is
//!   written, then used: every cookie signed before is refused. The revocations are
//!   cleared (they name logins of the old key).
//! - Its expiry.
//!
//! Checking a cookie reads memory only (the key and the revocations are held there):
//! the request guards call it on every request, on the async workers.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use hmac::{Hmac, Mac};
use relay_protocol::hex::{decode as unhex, encode as hex};
use sha2::Sha256;

use crate::files::FileError;

/// The key's file in the data dir.
pub const KEY_FILE: &str = "dashboard.key";
/// The revoked logins' file in the data dir.
pub const REVOKED_FILE: &str = "dashboard.revoked";
/// How long a login lasts from its link being spent.
pub const LOGIN_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);
/// Revoked logins kept at most; past it the key is rotated instead.
pub const MAX_REVOKED: usize = 4096;
/// The cookie format's version, its first field.
const VERSION: &str = "1";

type HmacSha256 = Hmac<Sha256>;

/// A login a cookie stands for, once its signature, expiry and revocation are checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    /// Random, hex: what a logout revokes.
    pub id: String,
    pub name: String,
    pub issued_ms: u64,
}

impl Signed {
    /// When the login ends by itself (ms since the epoch).
    pub fn expires_ms(&self) -> u64 {
        self.issued_ms
            .saturating_add(LOGIN_LIFETIME.as_millis() as u64)
    }
}

/// The signing key and the revoked logins of one data dir, held in memory and kept in
/// its files.
pub struct LoginKeys {
    dir: PathBuf,
    state: Mutex<Keys>,
    /// Held (on the blocking pool only) while a file is written, so two writes never
    /// interleave and the last one written holds the newest state.
    writing: Mutex<()>,
}

struct Keys {
    key: [u8; 32],
    /// login id -> when its login expires (ms)
    revoked: HashMap<String, u64>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn mac(key: &[u8; 32], cookie_name: &str, payload: &str) -> HmacSha256 {
    // A key of any length is valid for HMAC: this cannot fail.
    let mut mac = <HmacSha256 as Mac>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
    mac.update(cookie_name.as_bytes());
    mac.update(b"\n");
    mac.update(payload.as_bytes());
    mac
}

impl LoginKeys {
    /// Reads (or makes) the key and the revocations of `dir`. Blocking: call it on the
    /// blocking pool.
    pub fn open(dir: &Path, now_ms: u64) -> Result<LoginKeys, FileError> {
        let key_path = dir.join(KEY_FILE);
        let key = match trusted_key(&key_path)? {
            Some(key) => key,
            None => new_key(&key_path)?,
        };
        let keys = LoginKeys {
            dir: dir.to_path_buf(),
            state: Mutex::new(Keys {
                key,
                revoked: HashMap::new(),
            }),
            writing: Mutex::new(()),
        };
        match read_revoked(&dir.join(REVOKED_FILE)) {
            Ok(mut revoked) => {
                revoked.retain(|_, expires| *expires > now_ms);
                if revoked.len() > MAX_REVOKED {
                    tracing::warn!(count = revoked.len(), "too many revoked dashboard logins; rotating the dashboard key (every login ends)");
                    keys.rotate()?;
                } else {
                    lock(&keys.state).revoked = revoked;
                }
            }
            Err(why) => {
                tracing::warn!(file = %dir.join(REVOKED_FILE).display(), %why, "the dashboard's revoked logins cannot be read; rotating the dashboard key so no ended login comes back (every login ends)");
                keys.rotate()?;
            }
        }
        Ok(keys)
    }

    /// A new login's cookie value, signed for the cookie `cookie_name`.
    pub fn sign(&self, cookie_name: &str, name: &str, now_ms: u64) -> String {
        let id = hex(&rand::random::<[u8; 16]>());
        let payload = format!("{VERSION}.{id}.{now_ms}.{}", hex(name.as_bytes()));
        let key = lock(&self.state).key;
        let tag = mac(&key, cookie_name, &payload).finalize().into_bytes();
        format!("{payload}.{}", hex(&tag))
    }

    /// The login `value` stands for under `cookie_name`, if it is signed by the current
    /// key, not expired at `now_ms` and not revoked. Memory only.
    pub fn verify(&self, cookie_name: &str, value: &str, now_ms: u64) -> Option<Signed> {
        let (payload, tag) = value.rsplit_once('.')?;
        let tag = unhex(tag)?;
        let state = lock(&self.state);
        mac(&state.key, cookie_name, payload)
            .verify_slice(&tag)
            .ok()?;
        let mut fields = payload.split('.');
        let (Some(VERSION), Some(id), Some(issued), Some(name), None) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            return None;
        };
        let login = Signed {
            id: id.to_string(),
            name: String::from_utf8(unhex(name)?).ok()?,
            issued_ms: issued.parse().ok()?,
        };
        if now_ms >= login.expires_ms() || state.revoked.contains_key(&login.id) {
            return None;
        }
        Some(login)
    }

    /// Revokes `login` in memory: from now on its cookie is refused. [`Self::save`]
    /// keeps it across a restart. False when the list is full (call [`Self::rotate`]).
    pub fn revoke(&self, login: &Signed, now_ms: u64) -> bool {
        let mut state = lock(&self.state);
        state.revoked.retain(|_, expires| *expires > now_ms);
        if state.revoked.len() >= MAX_REVOKED {
            return false;
        }
        state.revoked.insert(login.id.clone(), login.expires_ms());
        true
    }

    /// Writes the revocations as they are now. Blocking: call it on the blocking pool.
    pub fn save(&self) -> Result<(), FileError> {
        let _writing = lock(&self.writing);
        let revoked = lock(&self.state).revoked.clone();
        write_revoked(&self.dir.join(REVOKED_FILE), &revoked)
    }

    /// A new key, written and then used: every login signed before ends. Blocking: call
    /// it on the blocking pool.
    pub fn rotate(&self) -> Result<(), FileError> {
        let _writing = lock(&self.writing);
        let key = new_key(&self.dir.join(KEY_FILE))?;
        {
            let mut state = lock(&self.state);
            state.key = key;
            state.revoked.clear();
        }
        write_revoked(&self.dir.join(REVOKED_FILE), &HashMap::new())
    }
}

/// The key at `path`: `None` if there is none, or none to trust (a wider mode than 0600,
/// or not a key: see the module docs).
fn trusted_key(path: &Path) -> Result<Option<[u8; 32]>, FileError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(FileError::Io {
                doing: format!("cannot read {}", path.display()),
                source,
            })
        }
    };
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        tracing::warn!(file = %path.display(), mode = format!("{mode:04o}"), "the dashboard's key was open to other users (not 0600): replacing it with a new key, as it may have been read; every dashboard login ends (run `relay open`)");
        return Ok(None);
    }
    match crate::files::read_key(path) {
        Ok(key) => Ok(key),
        Err(FileError::NotAKey(_)) => {
            tracing::warn!(file = %path.display(), "the dashboard's key file does not hold a key: replacing it with a new key; every dashboard login ends (run `relay open`)");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn new_key(path: &Path) -> Result<[u8; 32], FileError> {
    let key: [u8; 32] = rand::random();
    crate::files::write_private(path, crate::files::key_text(&key).as_bytes())?;
    Ok(key)
}

#[derive(serde::Serialize, serde::Deserialize)]
struct RevokedFile {
    /// login id -> when its login expires (ms since the epoch)
    revoked: HashMap<String, u64>,
}

fn read_revoked(path: &Path) -> Result<HashMap<String, u64>, String> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice::<RevokedFile>(&bytes)
            .map(|f| f.revoked)
            .map_err(|e| e.to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(HashMap::new()),
        Err(e) => Err(e.to_string()),
    }
}

fn write_revoked(path: &Path, revoked: &HashMap<String, u64>) -> Result<(), FileError> {
    let file = RevokedFile {
        revoked: revoked.clone(),
    };
    // A map of strings to numbers always serializes.
    let text = serde_json::to_vec(&file).unwrap_or_default();
    crate::files::write_private(path, &text)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::MetadataExt;

    use super::*;

    const NOW: u64 = 1_800_000_000_000;
    const COOKIE: &str = "relay_login_7777";

    fn keys() -> (tempfile::TempDir, LoginKeys) {
        let dir = tempfile::tempdir().unwrap();
        let keys = LoginKeys::open(dir.path(), NOW).unwrap();
        (dir, keys)
    }

    #[test]
    fn a_signed_login_verifies_and_survives_a_reopen() {
        let (dir, keys) = keys();
        let value = keys.sign(COOKIE, "alice@x", NOW);
        let login = keys.verify(COOKIE, &value, NOW + 1).unwrap();
        assert_eq!(login.name, "alice@x");
        assert_eq!(login.issued_ms, NOW);
        assert_eq!(login.id.len(), 32);
        let meta = std::fs::metadata(dir.path().join(KEY_FILE)).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600, "the key is the owner's only");
        drop(keys);
        let again = LoginKeys::open(dir.path(), NOW + 2).unwrap();
        assert_eq!(again.verify(COOKIE, &value, NOW + 2), Some(login));
    }

    #[test]
    fn a_forged_tampered_expired_or_other_ports_cookie_is_refused() {
        let (_dir, keys) = keys();
        let value = keys.sign(COOKIE, "alice", NOW);
        assert!(keys.verify(COOKIE, &value, NOW).is_some());
        assert_eq!(
            keys.verify("relay_login_8888", &value, NOW),
            None,
            "other port"
        );
        // Every single character changed (to another hex digit or field) is refused.
        for i in 0..value.len() {
            let mut bytes = value.clone().into_bytes();
            bytes[i] = if bytes[i] == b'0' { b'1' } else { b'0' };
            let tampered = String::from_utf8(bytes).unwrap();
            if tampered != value {
                assert_eq!(keys.verify(COOKIE, &tampered, NOW), None, "{tampered}");
            }
        }
        // A renamed login, signed by someone without the key.
        let (payload, tag) = value.rsplit_once('.').unwrap();
        let bob = hex(b"bob");
        let renamed = payload.replace(&hex(b"alice"), &bob);
        assert_eq!(keys.verify(COOKIE, &format!("{renamed}.{tag}"), NOW), None);
        let other_key = LoginKeys::open(tempfile::tempdir().unwrap().path(), NOW).unwrap();
        let forged = other_key.sign(COOKIE, "alice", NOW);
        assert_eq!(keys.verify(COOKIE, &forged, NOW), None, "another key's");
        for junk in [
            "",
            ".",
            "1.....",
            "x",
            &format!("{payload}."),
            &format!("{payload}.zz"),
        ] {
            assert_eq!(keys.verify(COOKIE, junk, NOW), None, "{junk}");
        }
        let life = LOGIN_LIFETIME.as_millis() as u64;
        assert!(keys.verify(COOKIE, &value, NOW + life - 1).is_some());
        assert_eq!(keys.verify(COOKIE, &value, NOW + life), None, "expired");
    }

    #[test]
    fn a_revoked_login_stays_revoked_after_a_reopen_until_it_would_have_expired() {
        let (dir, keys) = keys();
        let ended = keys.sign(COOKIE, "a", NOW);
        let kept = keys.sign(COOKIE, "a", NOW);
        let login = keys.verify(COOKIE, &ended, NOW).unwrap();
        assert!(keys.revoke(&login, NOW));
        assert_eq!(keys.verify(COOKIE, &ended, NOW), None, "at once");
        keys.save().unwrap();
        let mode = std::fs::metadata(dir.path().join(REVOKED_FILE))
            .unwrap()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        drop(keys);
        let again = LoginKeys::open(dir.path(), NOW + 5).unwrap();
        assert_eq!(
            again.verify(COOKIE, &ended, NOW + 5),
            None,
            "after a restart"
        );
        assert!(again.verify(COOKIE, &kept, NOW + 5).is_some());
        // Pruned once past its login's expiry: the list stays bounded.
        let past = login.expires_ms() + 1;
        let later = LoginKeys::open(dir.path(), past).unwrap();
        assert!(lock(&later.state).revoked.is_empty());
    }

    #[test]
    fn rotating_the_key_ends_every_login_and_keeps_new_ones() {
        let (dir, keys) = keys();
        let old: Vec<String> = (0..3).map(|_| keys.sign(COOKIE, "a", NOW)).collect();
        keys.rotate().unwrap();
        for v in &old {
            assert_eq!(keys.verify(COOKIE, v, NOW), None);
        }
        let new = keys.sign(COOKIE, "a", NOW);
        assert!(keys.verify(COOKIE, &new, NOW).is_some());
        drop(keys);
        let again = LoginKeys::open(dir.path(), NOW).unwrap();
        assert_eq!(again.verify(COOKIE, &old[0], NOW), None, "rotated for good");
        assert!(again.verify(COOKIE, &new, NOW).is_some());
        let meta = std::fs::metadata(dir.path().join(KEY_FILE)).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
    }

    #[test]
    fn a_key_open_to_others_or_not_a_key_is_replaced_and_a_bad_revoked_file_rotates() {
        let (dir, keys) = keys();
        let value = keys.sign(COOKIE, "a", NOW);
        drop(keys);
        let path = dir.path().join(KEY_FILE);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let keys = LoginKeys::open(dir.path(), NOW).unwrap();
        assert_eq!(
            keys.verify(COOKIE, &value, NOW),
            None,
            "an exposed key is not trusted"
        );
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        let value = keys.sign(COOKIE, "a", NOW);
        drop(keys);
        std::fs::write(&path, "not a key").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let keys = LoginKeys::open(dir.path(), NOW).unwrap();
        assert_eq!(keys.verify(COOKIE, &value, NOW), None);
        let value = keys.sign(COOKIE, "a", NOW);
        drop(keys);
        std::fs::write(dir.path().join(REVOKED_FILE), "{broken").unwrap();
        let keys = LoginKeys::open(dir.path(), NOW).unwrap();
        assert_eq!(keys.verify(COOKIE, &value, NOW), None, "no revocation lost");
    }

    #[test]
    fn a_full_revocation_list_asks_for_a_rotation() {
        let (_dir, keys) = keys();
        for _ in 0..MAX_REVOKED {
            let v = keys.sign(COOKIE, "a", NOW);
            assert!(keys.revoke(&keys.verify(COOKIE, &v, NOW).unwrap(), NOW));
        }
        let v = keys.sign(COOKIE, "a", NOW);
        let login = keys.verify(COOKIE, &v, NOW).unwrap();
        assert!(!keys.revoke(&login, NOW), "full");
        // Expired entries make room.
        let later = NOW + LOGIN_LIFETIME.as_millis() as u64;
        let v = keys.sign(COOKIE, "a", later);
        assert!(keys.revoke(&keys.verify(COOKIE, &v, later).unwrap(), later));
    }
}
