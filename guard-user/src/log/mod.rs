//! The daemon's log (docs/log.md): `YYYY-MM-DD HH:MM:SS EVENT key=value …` in local time, one line
//! per event, appended with one write each and rotated at `logMaxSizeMB`. Every line also goes
//! to stdout (the journal, or the terminal of `cargo xtask run`); under systemd the stdout copy
//! carries the syslog `<N>` priority prefix ([`Line::priority`]), the file never does.
//!
//! What a line says is typed ([`Line`], in [`line`]); this module only timestamps and writes it.
pub mod line;
pub mod notice;

pub use line::{Kind, Line};
pub use notice::{Notice, What};

use std::{
    io::Write as _,
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::SystemTime,
};

use crate::{
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
pub fn echo_line(line_with_timestamp: &str, priority: u8, journal: bool) -> String {
    if journal {
        format!("<{priority}>{line_with_timestamp}")
    } else {
        line_with_timestamp.to_string()
    }
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

    /// Follows the config's `logMaxSizeMB`.
    pub fn set_max_bytes(&self, n: u64) {
        self.inner.max_bytes.store(n, Ordering::Relaxed);
    }

    /// Writes `line` with the current timestamp: to the file, and echoed on stdout (with its
    /// journal priority when stdout is the journal). This is the only way a line is written.
    pub fn write(&self, line: &Line) {
        // `Line::body` escapes every value; the pass through `printable` keeps even a
        // hand-built `Notice::what` to one line.
        let body = line.body();
        let body = escape::printable(&body);
        let stamped = format!("{} {}\n", local_timestamp(SystemTime::now()), body);
        let _g = self.inner.lock.lock().unwrap_or_else(|p| p.into_inner());
        if self.inner.echo {
            let echoed = echo_line(&stamped, line.priority(), self.inner.journal);
            let _ = std::io::stdout().lock().write_all(echoed.as_bytes());
        }
        let max = self.inner.max_bytes.load(Ordering::Relaxed);
        if let Err(e) = append_rotating(&self.inner.path, stamped.as_bytes(), max, self.inner.who) {
            // Through tracing, which never panics on a closed stderr (eprintln! would).
            tracing::error!("cannot write the log: {e}");
        }
    }
}

#[cfg(test)]
mod tests;
