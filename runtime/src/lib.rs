//! The harness-session plane (see the codex plane issue): one persistent session per
//! agent, thread ids in sled, a turn queue per agent.
