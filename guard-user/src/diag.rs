//! The daemon's diagnostics (docs/operations.md last bullet): `tracing` events to stderr — start-up phases,
//! backend details, the errors behind a `WARN` line — at the level `GUARD_LOG` sets (default
//! `info`; see [`filter`]). Under systemd (`JOURNAL_STREAM` set) each line starts
//! with the syslog priority `<N>` that journald turns into the entry's priority, so
//! `journalctl -p warning` shows warnings and errors.
use std::fmt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::{
    filter::Targets,
    fmt::{format::Writer, FmtContext, FormatEvent, FormatFields},
    layer::SubscriberExt as _,
    registry::LookupSpan,
    util::SubscriberInitExt as _,
    Layer as _,
};

/// `guard-user: <level>: <message>`, prefixed `<N>` for journald.
struct Format {
    journald: bool,
}

/// syslog(3) priorities of tracing's levels: err 3, warning 4, info 6, debug 7.
pub fn level_priority(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

impl<S, N> FormatEvent<S, N> for Format
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut w: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let level = *event.metadata().level();
        let mut message = String::new();
        ctx.field_format().format_fields(Writer::new(&mut message), event)?;
        w.write_str(&self.lines(level, &message))
    }
}

impl Format {
    /// `message` as stderr lines: each starts with the prefix (and its `<N>` for journald, which
    /// makes every line an entry of its own), so a message that spans lines (a verifier log)
    /// never leaves an entry without its priority.
    fn lines(&self, level: Level, message: &str) -> String {
        let mut out = String::with_capacity(message.len() + 32);
        for line in message.split('\n') {
            if self.journald {
                out.push_str(&format!("<{}>", level_priority(level)));
            }
            out.push_str(&format!("guard-user: {}: {line}\n", level.as_str().to_ascii_lowercase()));
        }
        out
    }
}

/// The filter `GUARD_LOG` names: a level (`error`, `warn`, `info`, `debug`, `trace`, `off`), or
/// comma-separated `target=level` directives with an optional bare default level
/// (`guard=debug,warn`), as [`Targets`] reads them. Unset, empty or unreadable, it is `info`, and
/// so is every target the directives do not name when they give no default level: a typo
/// (`GUARD_LOG=debgu` reads as a target of that name) never silences the daemon's warnings.
pub fn filter(value: Option<&str>) -> Targets {
    let info = || Targets::new().with_default(Level::INFO);
    match value.map(str::trim) {
        None | Some("") => info(),
        Some(v) => match v.parse::<Targets>() {
            Ok(t) if t.default_level().is_none() => t.with_default(Level::INFO),
            Ok(t) => t,
            Err(_) => info(),
        },
    }
}

/// Installs the subscriber (once; later calls do nothing).
pub fn init() {
    let filter = filter(std::env::var("GUARD_LOG").ok().as_deref());
    // stderr is the journal when JOURNAL_STREAM names it (a child could inherit the variable with
    // another stderr).
    let journald =
        std::env::var_os("JOURNAL_STREAM").is_some_and(|v| crate::log::journal_stream_matches(&v.to_string_lossy(), 2));
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // Its own complaint about a failed write is an eprintln!, which panics when stderr is
        // a closed pipe: a diagnostic nobody can read is dropped, never fatal.
        .log_internal_errors(false)
        .event_format(Format { journald })
        .with_filter(filter);
    let _ = tracing_subscriber::registry().with(layer).try_init();
}

#[cfg(test)]
mod tests {
    use tracing::level_filters::LevelFilter;

    use super::*;

    fn level(value: Option<&str>, target: &str) -> LevelFilter {
        let f = filter(value);
        [Level::TRACE, Level::DEBUG, Level::INFO, Level::WARN, Level::ERROR]
            .into_iter()
            .find(|l| f.would_enable(target, l))
            .map_or(LevelFilter::OFF, LevelFilter::from_level)
    }

    #[test]
    fn guard_log_takes_a_level_or_directives_and_falls_back_to_info() {
        for (value, want) in [
            (None, LevelFilter::INFO),
            (Some(""), LevelFilter::INFO),
            (Some("error"), LevelFilter::ERROR),
            (Some("warn"), LevelFilter::WARN),
            (Some("info"), LevelFilter::INFO),
            (Some("debug"), LevelFilter::DEBUG),
            (Some("DEBUG"), LevelFilter::DEBUG),
            (Some("trace"), LevelFilter::TRACE),
            (Some("off"), LevelFilter::OFF),
            (Some("guard=debug,warn"), LevelFilter::DEBUG),
            (Some("aya=trace,warn"), LevelFilter::WARN),
            (Some("debgu"), LevelFilter::INFO),
            (Some("no such level"), LevelFilter::INFO),
            (Some("aya=trace"), LevelFilter::INFO),
            (Some("guard=loud"), LevelFilter::INFO),
        ] {
            assert_eq!(level(value, "guard::daemon"), want, "GUARD_LOG={value:?}");
        }
        assert_eq!(level(Some("aya=trace,warn"), "aya::maps"), LevelFilter::TRACE);
    }

    #[test]
    fn every_line_of_a_message_carries_the_prefix_and_its_priority() {
        let journal = Format { journald: true };
        assert_eq!(journal.lines(Level::WARN, "one"), "<4>guard-user: warn: one\n");
        assert_eq!(
            journal.lines(Level::INFO, "head\nverifier log (end):\n0: r1 = 0"),
            "<6>guard-user: info: head\n<6>guard-user: info: verifier log (end):\n<6>guard-user: info: 0: r1 = 0\n"
        );
        assert_eq!(
            Format { journald: false }.lines(Level::ERROR, "a\nb"),
            "guard-user: error: a\nguard-user: error: b\n"
        );
    }
}
