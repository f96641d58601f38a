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

/// Milliseconds in a day.
pub const DAY_MS: u64 = 86_400_000;

/// The UTC calendar day of `ms` as `YYYY-MM-DD` (how usage is counted by day).
pub fn utc_date(ms: u64) -> String {
    let (y, m, d) = civil_from_days(ms / DAY_MS);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The next UTC midnight after `ms` (when a day's budget resets).
pub fn next_utc_midnight(ms: u64) -> u64 {
    (ms / DAY_MS + 1) * DAY_MS
}

/// Days since 1970-01-01 -> (year, month, day) of the proleptic Gregorian calendar
/// (Howard Hinnant's `civil_from_days`, for days on or after the epoch).
pub fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates_and_midnights() {
        assert_eq!(utc_date(0), "1970-01-01");
        // 2024-02-29T23:59:59.999Z, a leap day, and the next millisecond.
        assert_eq!(utc_date(1_709_251_199_999), "2024-02-29");
        assert_eq!(utc_date(1_709_251_200_000), "2024-03-01");
        // 2026-11-27T08:17:43Z.
        assert_eq!(utc_date(1_795_767_463_000), "2026-11-27");
        assert_eq!(next_utc_midnight(1_795_767_463_000), 1_795_824_000_000);
        assert_eq!(utc_date(1_795_824_000_000), "2026-11-28");
        assert_eq!(utc_date(951_782_400_000), "2000-02-29");
        assert_eq!(utc_date(4_107_542_400_000), "2100-03-01");
    }
}
