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

/// The UTC date and minute of `ms`: `2026-11-28 00:00 UTC` (when a budget resets).
pub fn utc_minute(ms: u64) -> String {
    let minute = (ms % DAY_MS) / 60_000;
    format!("{} {:02}:{:02} UTC", utc_date(ms), minute / 60, minute % 60)
}

/// The UTC midnight of a date written `YYYY-MM-DD` (as [`utc_date`] writes it), in ms
/// since the epoch; `None` for anything else, a day the month does not have or a date
/// before 1970.
pub fn utc_midnight_of(date: &str) -> Option<u64> {
    let mut parts = date.splitn(3, '-');
    let (y, m, d) = (parts.next()?, parts.next()?, parts.next()?);
    let digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
    if !(digits(y, 4) && digits(m, 2) && digits(d, 2)) {
        return None;
    }
    let (y, m, d): (u64, u64, u64) = (y.parse().ok()?, m.parse().ok()?, d.parse().ok()?);
    if y < 1970 || !(1..=12).contains(&m) || d == 0 || d > days_in_month(y, m) {
        return None;
    }
    days_from_civil(y, m, d).checked_mul(DAY_MS)
}

/// A "since" as a person writes it (`relay usage --since`, `relay flight list --since`):
/// `30m`, `24h`, `7d`, `2w` back from `now_ms`, or a UTC date `YYYY-MM-DD` (its
/// midnight), as ms since the epoch; else why not.
pub fn parse_since(text: &str, now_ms: u64) -> Result<u64, String> {
    let text = text.trim();
    let bad =
        || format!("{text:?} is neither a duration (30m, 24h, 7d, 2w) nor a date (2026-11-27)");
    if let Some(ms) = utc_midnight_of(text) {
        return Ok(ms);
    }
    let unit = text.chars().last().ok_or_else(bad)?;
    let per: u64 = match unit {
        'm' => 60_000,
        'h' => 3_600_000,
        'd' => DAY_MS,
        'w' => 7 * DAY_MS,
        _ => return Err(bad()),
    };
    let n: u64 = text[..text.len() - 1].parse().map_err(|_| bad())?;
    let back = n.checked_mul(per).ok_or_else(bad)?;
    Ok(now_ms.saturating_sub(back))
}

/// [`parse_since`], or ms since the epoch written as digits (what a client computed
/// itself): what the API's `since` (`flight.list`) takes.
pub fn parse_since_or_ms(text: &str, now_ms: u64) -> Result<u64, String> {
    let digits = text.trim();
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        return digits
            .parse()
            .map_err(|_| format!("{digits:?} is too large for ms since the epoch"));
    }
    parse_since(text, now_ms).map_err(|e| format!("{e}, nor ms since the epoch"))
}

fn days_in_month(y: u64, m: u64) -> u64 {
    match m {
        2 if (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// (year, month, day) -> days since 1970-01-01, for dates from the epoch on (Howard
/// Hinnant's `days_from_civil`, the inverse of [`civil_from_days`]).
fn days_from_civil(y: u64, m: u64, d: u64) -> u64 {
    let y = if m <= 2 { y - 1 } else { y };
    let (era, yoe) = (y / 400, y % 400);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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

    #[test]
    fn since_takes_a_duration_or_a_utc_date_and_the_api_ms_too() {
        const NOV_27: u64 = 1_795_737_600_000; // 2026-11-27 00:00 UTC
        let now = NOV_27 + 3_600_000;
        assert_eq!(parse_since("2026-11-27", now), Ok(NOV_27));
        assert_eq!(parse_since("1h", now), Ok(NOV_27));
        assert_eq!(parse_since("24h", now), Ok(now - 86_400_000));
        assert_eq!(parse_since("7d", now), Ok(now - 7 * 86_400_000));
        assert_eq!(parse_since("30m", now), Ok(now - 1_800_000));
        assert_eq!(parse_since("2w", now), Ok(now - 14 * 86_400_000));
        assert_eq!(parse_since("2024-02-29", now), Ok(1_709_164_800_000));
        let bad = [
            "",
            "h",
            "7",
            "7y",
            "-1d",
            "2026-13-01",
            "2026-02-29",
            "26-11-27",
            "1d2h",
        ];
        for bad in bad {
            let e = parse_since(bad, now).unwrap_err();
            assert!(e.contains("neither a duration"), "{bad}: {e}");
        }
        // The API's form also takes ms since the epoch; nothing else new.
        assert_eq!(parse_since_or_ms("7", now), Ok(7));
        assert_eq!(parse_since_or_ms(&NOV_27.to_string(), now), Ok(NOV_27));
        assert_eq!(parse_since_or_ms("24h", now), Ok(now - 86_400_000));
        assert!(parse_since_or_ms("99999999999999999999999", now).is_err());
        for bad in bad.iter().filter(|b| **b != "7") {
            let e = parse_since_or_ms(bad, now).unwrap_err();
            assert!(e.contains("nor ms since the epoch"), "{bad}: {e}");
        }
    }

    #[test]
    fn utc_minutes_and_dates_read_back() {
        assert_eq!(utc_minute(1_795_824_000_000), "2026-11-28 00:00 UTC");
        assert_eq!(
            utc_minute(1_795_824_000_000 + 3_661_000),
            "2026-11-28 01:01 UTC"
        );
        assert_eq!(utc_minute(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc_midnight_of("1970-01-01"), Some(0));
        assert_eq!(utc_midnight_of("2026-11-28"), Some(1_795_824_000_000));
        assert_eq!(utc_midnight_of("2024-02-29"), Some(1_709_164_800_000));
        assert_eq!(utc_midnight_of("2000-02-29"), Some(951_782_400_000));
        // Every day of 1970..2101 reads back as the date it writes.
        for day in 0..48_000 {
            let ms = day * DAY_MS;
            assert_eq!(utc_midnight_of(&utc_date(ms)), Some(ms), "{}", utc_date(ms));
        }
        for bad in [
            "",
            "2026-13-01",
            "2026-02-29",
            "2100-02-29",
            "26-11-27",
            "2026-1-27",
            "1969-12-31",
            "2026-11-+7",
            "2026-11-27x",
            "2026-00-10",
            "2026-04-31",
        ] {
            assert_eq!(utc_midnight_of(bad), None, "{bad}");
        }
    }
}
