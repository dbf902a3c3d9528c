//! The daemon's log (SPEC §5): `YYYY-MM-DD HH:MM:SS EVENT key=value …` in local time, one line
//! per event, appended with one write each and rotated at `logMaxSizeMB`. Every line also goes
//! to stdout (the journal, or the terminal of `cargo xtask run`).
use std::{
    fmt::Write as _,
    io::Write as _,
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::SystemTime,
};

use crate::safefs::{append_rotating, FsIdentity};

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

/// One log line without its timestamp: `EVENT k=v k=v`. Values are written raw (SPEC §5);
/// a newline inside one would split the record, so it becomes a space.
pub fn format_body(event: &str, fields: &[(&str, &dyn std::fmt::Display)]) -> String {
    let mut s = String::from(event);
    for (k, v) in fields {
        let _ = write!(s, " {k}={v}");
    }
    s.replace(['\n', '\r'], " ")
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
}

impl Logger {
    pub fn new(path: PathBuf, who: FsIdentity, max_bytes: u64, echo: bool) -> Logger {
        Logger { inner: Arc::new(Inner { path, who, max_bytes: AtomicU64::new(max_bytes), lock: Mutex::new(()), echo }) }
    }

    pub fn path(&self) -> &std::path::Path {
        &self.inner.path
    }

    /// Follows the config's `logMaxSizeMB`.
    pub fn set_max_bytes(&self, n: u64) {
        self.inner.max_bytes.store(n, Ordering::Relaxed);
    }

    pub fn line(&self, event: &str, fields: &[(&str, &dyn std::fmt::Display)]) {
        self.raw(&format_body(event, fields));
    }

    /// Writes `body` (an `EVENT k=v…` string) with the current timestamp.
    pub fn raw(&self, body: &str) {
        let line = format!("{} {}\n", local_timestamp(SystemTime::now()), body.replace(['\n', '\r'], " "));
        let _g = self.inner.lock.lock().unwrap_or_else(|p| p.into_inner());
        if self.inner.echo {
            let _ = std::io::stdout().lock().write_all(line.as_bytes());
        }
        let max = self.inner.max_bytes.load(Ordering::Relaxed);
        if let Err(e) = append_rotating(&self.inner.path, line.as_bytes(), max, self.inner.who) {
            eprintln!("guard-user: cannot write the log: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_follow_the_spec_grammar() {
        let body = format_body("KILLED", &[("pid", &42), ("name", &"agentihooks"), ("reason", &"ghost_detected")]);
        assert_eq!(body, "KILLED pid=42 name=agentihooks reason=ghost_detected");
        let ts = local_timestamp(SystemTime::now());
        let b = ts.as_bytes();
        assert_eq!(ts.len(), 19);
        assert!(b[4] == b'-' && b[7] == b'-' && b[10] == b' ' && b[13] == b':' && b[16] == b':', "{ts}");
    }

    #[test]
    fn a_newline_in_a_value_cannot_forge_a_second_line() {
        let body = format_body("ERROR", &[("pattern", &"a\n2026-01-01 00:00:00 KILLED pid=1")]);
        assert!(!body.contains('\n'));
    }
}
