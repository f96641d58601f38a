//! Process-wide infrastructure both the runtime and the broker use, below both of them.
//!
//! - [`storage`]: the process's one storage thread. Every sled transaction and flush of
//!   the process (the broker's and the runtime's) runs there, group-committed; async
//!   code never blocks on sled (see its header for the wedge this prevents). Reads go to
//!   the blocking pool ([`storage::read`]); every database opens with [`storage::config`].
//! - [`retry`]: retrying with backoff ([`backon`]), one way for every crate above this one.
//!
//! Layering: the two modules depend on nothing of each other; the crate depends on no
//! other Relay crate (`relay-runtime` and `relay-broker` depend on it).

pub mod retry;
pub mod storage;
