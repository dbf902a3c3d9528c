//! The daemon's log (docs/log.md): `YYYY-MM-DD HH:MM:SS EVENT key=value …` in local time, one line
//! per event, appended with one write each and rotated at `logMaxSizeMB`. Every line also goes
//! to stdout (the journal, or the terminal of `cargo xtask run`); under systemd the stdout copy
//! carries the syslog `<N>` priority prefix ([`syslog_priority`]), the file never does.
use std::{
    fmt::Write as _,
    io::Write as _,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::SystemTime,
};

use crate::{
    comm::Comm,
    escape,
    safefs::{append_rotating, FsIdentity},
};

/// Formats the local time of `t` as `YYYY-MM-DD HH:MM:SS`.
pub fn local_timestamp(t: SystemTime) -> String {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs() as libc::time_t).unwrap_or(0);
    // SAFETY: localtime_r writes only into `tm`.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    unsafe { libc::localtime_r(&secs, &mut tm) };
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// A value in a log line, written in its escaped form ([`crate::escape`]): control characters,
/// line breaks and invalid UTF-8 escaped, and quoted when it holds a space, `=` or `"`, so one
/// event is one line whose keys are exactly the ones the daemon wrote (docs/log.md).
///
/// Implemented for the types log lines carry. Anything else that is `Display` goes through
/// [`Shown`], which escapes its text. There is deliberately no blanket `impl<T: Display>`: a
/// [`Comm`] must be escaped from its bytes, not from its (already escaped) `Display`.
pub trait LogValue {
    fn write_log(&self, out: &mut String);
}

impl LogValue for str {
    fn write_log(&self, out: &mut String) {
        escape::push_log_value(out, self.as_bytes());
    }
}

impl LogValue for String {
    fn write_log(&self, out: &mut String) {
        escape::push_log_value(out, self.as_bytes());
    }
}

impl LogValue for std::borrow::Cow<'_, str> {
    fn write_log(&self, out: &mut String) {
        escape::push_log_value(out, self.as_bytes());
    }
}

impl LogValue for Comm {
    fn write_log(&self, out: &mut String) {
        escape::push_log_value(out, self.as_bytes());
    }
}

impl LogValue for Path {
    fn write_log(&self, out: &mut String) {
        escape::push_log_value(out, self.as_os_str().as_bytes());
    }
}

impl LogValue for PathBuf {
    fn write_log(&self, out: &mut String) {
        self.as_path().write_log(out);
    }
}

impl<T: LogValue + ?Sized> LogValue for &T {
    fn write_log(&self, out: &mut String) {
        (**self).write_log(out);
    }
}

/// Numbers and booleans print without anything to escape.
macro_rules! plain_log_value {
    ($($t:ty),*) => {$(
        impl LogValue for $t {
            fn write_log(&self, out: &mut String) {
                let _ = write!(out, "{self}");
            }
        }
    )*};
}
plain_log_value!(u8, u16, u32, u64, usize, i8, i16, i32, i64, isize, bool);

impl LogValue for f64 {
    fn write_log(&self, out: &mut String) {
        // `NaN` and `inf` hold nothing to escape either.
        let _ = write!(out, "{self}");
    }
}

/// Any `Display` value, escaped from its text (errors, endpoints, …).
pub struct Shown<T>(pub T);

impl<T: std::fmt::Display> LogValue for Shown<T> {
    fn write_log(&self, out: &mut String) {
        escape::push_log_value(out, self.0.to_string().as_bytes());
    }
}

/// One log line without its timestamp: `EVENT k=v k=v`, every value escaped and quoted as
/// [`LogValue`] says. `event` and the keys are the daemon's own words, written as they are.
pub fn format_body(event: &str, fields: &[(&str, &dyn LogValue)]) -> String {
    let mut s = String::from(event);
    for (k, v) in fields {
        s.push(' ');
        s.push_str(k);
        s.push('=');
        v.write_log(&mut s);
    }
    s
}

/// The syslog priority of a log line, for the `<N>` prefix journald reads on stdout
/// (sd-daemon(3)), so `journalctl -p warning` shows the WARN and ERROR lines:
///
/// | priority | lines |
/// |---|---|
/// | `<3>` err | `ERROR`, `STOPPED reason=hang`, `STOPPED reason=error` |
/// | `<4>` warning | `WARN`, `WARNING` |
/// | `<5>` notice | `KILLED`, `DRY_RUN`, `REPEAT`, `PEGGED`, `RECOVERED`, `LEFTOVER`, `REAPED`, `STARTED`, `STOPPED` (other reasons), `RELOAD`, `RESYNC` (but `reason=startup`) |
/// | `<6>` info | everything else: `FLAGGED`, `UNFLAGGED`, `SKIPPED`, `TICK_COMPLETE`, `RESYNC reason=startup` |
pub fn syslog_priority(body: &str) -> u8 {
    let event = body.split(' ').next().unwrap_or("");
    let reason = top_level_value(body, "reason");
    match event {
        "ERROR" => 3,
        "STOPPED" if matches!(reason, Some("hang" | "error")) => 3,
        "WARN" | "WARNING" => 4,
        "RESYNC" if reason == Some("startup") => 6,
        "KILLED" | "DRY_RUN" | "REPEAT" | "PEGGED" | "RECOVERED" | "LEFTOVER" | "REAPED" | "STARTED" | "STOPPED"
        | "RELOAD" | "RESYNC" => 5,
        _ => 6,
    }
}

/// The first unquoted `key=value` of a body, skipping quoted values (so text inside a value can
/// never pass for a key).
fn top_level_value<'a>(body: &'a str, key: &str) -> Option<&'a str> {
    let b = body.as_bytes();
    let (mut i, mut start) = (0, 0);
    let mut quoted = false;
    while i <= b.len() {
        match b.get(i) {
            Some(b'\\') if quoted => i += 1,
            Some(b'"') => quoted = !quoted,
            Some(b' ') | None if !quoted => {
                let word = &body[start..i];
                if let Some(v) = word.strip_prefix(key).and_then(|r| r.strip_prefix('=')) {
                    return Some(v);
                }
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Whether stdout is the journal: `JOURNAL_STREAM` is set by systemd to the `<dev>:<inode>` of
/// the stream it connected, and must match stdout's (a child of the daemon could inherit the
/// variable with another stdout).
fn stdout_is_journal() -> bool {
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else { return false };
    journal_stream_matches(&v.to_string_lossy(), 1)
}

/// Whether `JOURNAL_STREAM`'s `<dev>:<inode>` names the file open on `fd`.
pub fn journal_stream_matches(value: &str, fd: libc::c_int) -> bool {
    let Some((dev, ino)) = value.split_once(':') else { return false };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else { return false };
    // SAFETY: fstat fills one stat we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return false;
    }
    st.st_dev == dev && st.st_ino == ino
}

/// The line as echoed on stdout: with the `<N>` priority prefix for the journal, as is otherwise.
pub fn echo_line(line_with_timestamp: &str, body: &str, journal: bool) -> String {
    if journal {
        format!("<{}>{line_with_timestamp}", syslog_priority(body))
    } else {
        line_with_timestamp.to_string()
    }
}

/// Makes a body one line whatever a caller put in it: control characters and line breaks
/// (which [`format_body`] never writes, but a hand-formatted body might) become `\xNN`.
fn one_line(body: &str) -> std::borrow::Cow<'_, str> {
    escape::printable(body)
}

#[derive(Clone)]
pub struct Logger {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    who: FsIdentity,
    max_bytes: AtomicU64,
    /// Serialises writers so rotation and appends do not interleave.
    lock: Mutex<()>,
    echo: bool,
    /// stdout is the journal (`JOURNAL_STREAM` names it): echoed lines get the `<N>` prefix.
    journal: bool,
}

impl Logger {
    pub fn new(path: PathBuf, who: FsIdentity, max_bytes: u64, echo: bool) -> Logger {
        Logger {
            inner: Arc::new(Inner {
                path,
                who,
                max_bytes: AtomicU64::new(max_bytes),
                lock: Mutex::new(()),
                echo,
                journal: echo && stdout_is_journal(),
            }),
        }
    }

    pub fn path(&self) -> &std::path::Path {
        &self.inner.path
    }

    /// Follows the config's `logMaxSizeMB`.
    pub fn set_max_bytes(&self, n: u64) {
        self.inner.max_bytes.store(n, Ordering::Relaxed);
    }

    pub fn line(&self, event: &str, fields: &[(&str, &dyn LogValue)]) {
        self.raw(&format_body(event, fields));
    }

    /// Writes `body` (an `EVENT k=v…` string) with the current timestamp. Prefer [`Logger::line`],
    /// which escapes values; a control character in `body` is escaped here so the record stays
    /// one line.
    pub fn raw(&self, body: &str) {
        let body = one_line(body);
        let line = format!("{} {}\n", local_timestamp(SystemTime::now()), body);
        let _g = self.inner.lock.lock().unwrap_or_else(|p| p.into_inner());
        if self.inner.echo {
            let echoed = echo_line(&line, &body, self.inner.journal);
            let _ = std::io::stdout().lock().write_all(echoed.as_bytes());
        }
        let max = self.inner.max_bytes.load(Ordering::Relaxed);
        if let Err(e) = append_rotating(&self.inner.path, line.as_bytes(), max, self.inner.who) {
            eprintln!("guard-user: cannot write the log: {e}");
        }
    }
}

#[cfg(test)]
mod tests;
