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
        if self.journald {
            write!(w, "<{}>", level_priority(level))?;
        }
        write!(w, "guard-user: {}: ", level.as_str().to_ascii_lowercase())?;
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
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
        .event_format(Format { journald })
        .try_init();
}
