//! Durations as operators write them: `"1h"`, `"30m"`, `"90s"`, `3600`, `"3600"`.
//!
//! Every duration that comes from the account's config is bounded at validation (the callers
//! pass a maximum), and the helpers below never overflow, so no value can make the daemon's
//! deadline arithmetic panic (`"timeout": 10000000000000000000` once overflowed an `Instant`).
use std::time::Duration;

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum DurationError {
    #[error("`{text}` is not a duration: write <n>h, <n>m, <n>s or whole seconds (e.g. 1h, 30m, 90s, 3600)")]
    Malformed { text: String },
    #[error("`{text}` is longer than {}", human_max(*max))]
    TooLong { text: String, max: Duration },
}

impl DurationError {
    /// The text that was given.
    #[cfg(test)]
    pub fn text(&self) -> &str {
        match self {
            DurationError::Malformed { text } | DurationError::TooLong { text, .. } => text,
        }
    }
}

/// One (non-leap) year: the longest `timeout`/`warnBefore` a config may ask for. Far beyond any
/// useful value, and far from where `Instant` arithmetic could overflow.
pub const ONE_YEAR: Duration = Duration::from_secs(365 * 24 * 3600);

/// `1 year (8760h)` for one year, else `<n>s`.
fn human_max(max: Duration) -> String {
    if max == ONE_YEAR {
        "1 year (8760h)".into()
    } else {
        human(max)
    }
}

/// Parses `<n>h`, `<n>m`, `<n>s` or a bare number of seconds. `n` is a whole number; zero is
/// allowed here and rejected by callers for which it makes no sense. A number too large for
/// any duration is `TooLong`.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    parse_duration_max(text, Duration::MAX)
}

/// [`parse_duration`], refusing anything longer than `max`.
pub fn parse_duration_max(text: &str, max: Duration) -> Result<Duration, DurationError> {
    let malformed = || DurationError::Malformed { text: text.to_string() };
    let too_long = || DurationError::TooLong { text: text.to_string(), max };
    let (digits, unit) = match text.char_indices().last() {
        Some((i, c @ ('h' | 'm' | 's'))) => (&text[..i], c),
        Some(_) => (text, 's'),
        None => return Err(malformed()),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed());
    }
    // All digits: the only way left to fail is size.
    let n: u64 = digits.parse().map_err(|_| too_long())?;
    let secs = match unit {
        'h' => n.checked_mul(3600),
        'm' => n.checked_mul(60),
        _ => Some(n),
    }
    .ok_or_else(too_long)?;
    let d = Duration::from_secs(secs);
    if d > max {
        return Err(too_long());
    }
    Ok(d)
}

/// Seconds as a `Duration`, saturating: NaN and negatives are zero, too large is `Duration::MAX`
/// (`Duration::from_secs_f64` panics on all three).
pub fn saturating_from_secs_f64(secs: f64) -> Duration {
    if secs.is_nan() || secs <= 0.0 {
        Duration::ZERO
    } else {
        Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
    }
}

/// Short human form for status output: `1h02m`, `5m30s`, `42s`.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hours_minutes_seconds_and_bare_seconds_parse() {
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("30m").unwrap(), Duration::from_secs(1800));
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("3600").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
    }

    #[test]
    fn malformed_durations_are_rejected_with_the_text() {
        for bad in ["", "h", "1d", "-1h", "1.5h", " 1h", "1h ", "1hm", "abc", "1H", "+5s", "٣s"] {
            let e = parse_duration(bad).unwrap_err();
            assert!(matches!(e, DurationError::Malformed { .. }), "{bad}: {e}");
            assert_eq!(e.text(), bad);
        }
    }

    #[test]
    fn durations_past_the_maximum_are_too_long_not_malformed() {
        for big in ["99999999999999999999h", "5124095576030432h", "18446744073709551616"] {
            assert!(matches!(parse_duration(big), Err(DurationError::TooLong { .. })), "{big}");
        }
        // Fits a u64 of seconds (so a Duration), yet overflowed an Instant: only the bound stops it.
        assert!(parse_duration("5124095576030431h").is_ok());
        assert!(matches!(parse_duration_max("5124095576030431h", ONE_YEAR), Err(DurationError::TooLong { .. })));
        assert_eq!(parse_duration_max("8760h", ONE_YEAR).unwrap(), ONE_YEAR);
        let e = parse_duration_max("8761h", ONE_YEAR).unwrap_err();
        assert_eq!(e.to_string(), "`8761h` is longer than 1 year (8760h)");
        assert!(parse_duration_max("31536001", ONE_YEAR).is_err());
    }

    #[test]
    fn saturating_helpers_never_panic() {
        assert_eq!(saturating_from_secs_f64(f64::NAN), Duration::ZERO);
        assert_eq!(saturating_from_secs_f64(-1e300), Duration::ZERO);
        assert_eq!(saturating_from_secs_f64(1e300), Duration::MAX);
        assert_eq!(saturating_from_secs_f64(1.5), Duration::from_millis(1500));
    }

    #[test]
    fn human_durations_are_short() {
        assert_eq!(human(Duration::from_secs(42)), "42s");
        assert_eq!(human(Duration::from_secs(330)), "5m30s");
        assert_eq!(human(Duration::from_secs(3720)), "1h02m");
        assert_eq!(human(Duration::MAX), format!("{}h{:02}m", u64::MAX / 3600, (u64::MAX % 3600) / 60));
    }
}
