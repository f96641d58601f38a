//! Process-wide infrastructure both the runtime and the broker use, below both of them.
//!
//! - [`storage`]: the process's one storage thread. Every sled transaction and flush of
//!   the process (the broker's and the runtime's) runs there, group-committed; async
//!   code never blocks on sled (see its header for the wedge this prevents). Reads go to
//!   the blocking pool ([`storage::read`]); every database opens with [`storage::config`].
//! - [`disk`]: the disk under the databases: durable writes refused while the free
//!   space is under a reserve (sled does not survive ENOSPC), the watchdog that tells a
//!   storage thread stuck in sled, databases opened private (0600/0700, no symlink), and
//!   files written whole, private and durable ([`disk::write_private`]).
//! - [`retry`]: retrying with backoff ([`backon`]), one way for every crate above this one.
//!
//! Depends on: none.
//!
//! No other Relay crate: `relay-runtime` and `relay-broker` depend on it.
//!
//! Layering (a module uses only the modules after its arrow; `tests/tests/module_graph/`
//! checks it):
//! - `disk`, `retry` -> none
//! - `storage` -> `disk`

pub mod disk;
pub mod retry;
pub mod storage;
