//! One test at a time on the host for whatever runs processes as the test accounts or counts
//! them: every test binary (and every engineer's run) counts the same accounts, so one test's
//! daemon would end another's probes.

use std::{fs, os::fd::AsRawFd, sync::Mutex};

/// The host-wide lock file.
pub const LOCK_FILE: &str = "/tmp/guard-integration-tests.lock";

static IN_PROCESS: Mutex<()> = Mutex::new(());

/// Held for the whole of one test: this binary's other tests (a mutex) and every other test
/// process on the host (an `flock` on [`LOCK_FILE`]) wait.
pub struct Serial {
    _in_process: std::sync::MutexGuard<'static, ()>,
    _host: fs::File,
}

/// Waits for both locks.
pub fn serial() -> Serial {
    let in_process = IN_PROCESS.lock().unwrap_or_else(|p| p.into_inner());
    let host = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(LOCK_FILE)
        .unwrap_or_else(|e| panic!("opening {LOCK_FILE}: {e}"));
    // SAFETY: flock on an fd we own; released when the file closes.
    let rc = unsafe { libc::flock(host.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(rc, 0, "flock {LOCK_FILE}: {}", std::io::Error::last_os_error());
    Serial { _in_process: in_process, _host: host }
}
