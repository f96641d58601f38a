//! Relay's one wall clock. Every timestamp Relay records or sends (`created_at`,
//! `updated_at`, an event's `at`...) is milliseconds since the Unix epoch, read here.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in milliseconds since the Unix epoch; 0 when the system clock is set before it.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
