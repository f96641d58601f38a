//! Relay's command line, the `relay` binary.
//!
//! - [`client`]: the HTTP client of a running broker (found through its `api.json`).
//! - [`terminal`]: agent and model text made inert before a terminal shows it.

pub mod client;
pub mod terminal;
