//! Durations as operators write them: `"1h"`, `"30m"`, `"90s"`, `3600`, `"3600"`.
use std::time::Duration;

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("`{text}` is not a duration: write <n>h, <n>m, <n>s or whole seconds (e.g. 1h, 30m, 90s, 3600)")]
pub struct DurationError {
    pub text: String,
}

/// Parses `<n>h`, `<n>m`, `<n>s` or a bare number of seconds. `n` is a whole number; zero is
/// allowed here and rejected by callers for which it makes no sense.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let err = || DurationError { text: text.to_string() };
    let (digits, unit) = match text.char_indices().last() {
        Some((i, c @ ('h' | 'm' | 's'))) => (&text[..i], c),
        Some(_) => (text, 's'),
        None => return Err(err()),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err());
    }
    let n: u64 = digits.parse().map_err(|_| err())?;
    let secs = match unit {
        'h' => n.checked_mul(3600),
        'm' => n.checked_mul(60),
        _ => Some(n),
    }
    .ok_or_else(err)?;
    Ok(Duration::from_secs(secs))
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
        for bad in ["", "h", "1d", "-1h", "1.5h", " 1h", "1h ", "1hm", "abc", "99999999999999999999h", "1H"] {
            let e = parse_duration(bad).unwrap_err();
            assert_eq!(e.text, bad);
        }
    }

    #[test]
    fn human_durations_are_short() {
        assert_eq!(human(Duration::from_secs(42)), "42s");
        assert_eq!(human(Duration::from_secs(330)), "5m30s");
        assert_eq!(human(Duration::from_secs(3720)), "1h02m");
    }
}
