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
    /// Neither: `~/.local/share/relay`.
    Default,
}

impl DataDir {
    /// The directory: the one named, else `~/.local/share/relay`.
    pub fn path(self) -> PathBuf {
        match self {
            DataDir::Given(dir) | DataDir::FromEnv(dir) => dir,
            DataDir::Default => default_path(),
        }
    }
}

/// `~/.local/share/relay`.
pub fn default_path() -> PathBuf {
    let home = std::env::var_os("HOME").unwrap_or_else(|| ".".into());
    Path::new(&home).join(".local/share/relay")
}
