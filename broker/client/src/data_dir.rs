//! The broker's data directory as the command line names it, and where that came from.

use std::path::{Path, PathBuf};

/// `--data-dir`, `RELAY_DATA_DIR` or neither: they mean the same directory, but a client
/// command prefers `RELAY_URL` + `RELAY_TOKEN` to the environment's data dir, never to
/// one on its command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataDir {
    /// `--data-dir DIR`.
    Given(PathBuf),
    /// `RELAY_DATA_DIR`.
    FromEnv(PathBuf),
    /// Neither: [`default_path`].
    Default,
}

impl DataDir {
    /// The directory: the one named, else [`default_path`].
    pub fn path(self) -> PathBuf {
        match self {
            DataDir::Given(dir) | DataDir::FromEnv(dir) => dir,
            DataDir::Default => default_path(),
        }
    }
}

/// `$XDG_DATA_HOME/relay`, else `~/.local/share/relay`: absolute, so every directory a
/// command runs in finds the same broker.
pub fn default_path() -> PathBuf {
    let set = |name| std::env::var_os(name).filter(|d: &std::ffi::OsString| !d.is_empty());
    if let Some(data) = set("XDG_DATA_HOME").filter(|d| Path::new(d).is_absolute()) {
        return Path::new(&data).join("relay");
    }
    let home = set("HOME").unwrap_or_else(|| ".".into());
    Path::new(&home).join(".local/share/relay")
}
