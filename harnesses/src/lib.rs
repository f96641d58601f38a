//! Harness adapters: one per agent CLI, each producing [`relay_protocol::harness::HarnessEvent`]s.
