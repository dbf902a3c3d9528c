//! The daemon's diagnostics (docs/operations.md last bullet): `tracing` events to stderr — start-up phases,
//! backend details, the errors behind a `WARN` line — at the level `GUARD_LOG` sets (an
//! `EnvFilter` directive, default `info`). Under systemd (`JOURNAL_STREAM` set) each line starts
//! with the syslog priority `<N>` that journald turns into the entry's priority, so
//! `journalctl -p warning` shows warnings and errors.
use std::fmt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::{
    fmt::{format::Writer, FmtContext, FormatEvent, FormatFields},
    registry::LookupSpan,
    EnvFilter,
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

/// Installs the subscriber (once; later calls do nothing).
pub fn init() {
    let filter = EnvFilter::try_from_env("GUARD_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // stderr is the journal when JOURNAL_STREAM names it (a child could inherit the variable with
    // another stderr).
    let journald =
        std::env::var_os("JOURNAL_STREAM").is_some_and(|v| crate::log::journal_stream_matches(&v.to_string_lossy(), 2));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Its own complaint about a failed write is an eprintln!, which panics when stderr is
        // a closed pipe: a diagnostic nobody can read is dropped, never fatal.
        .log_internal_errors(false)
        .event_format(Format { journald })
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

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
