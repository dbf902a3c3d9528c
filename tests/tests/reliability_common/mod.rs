//! Helpers shared by the reliability suites (reliability.rs, reliability_boundary.rs); each binary
//! uses a part of them.
#![allow(dead_code)]
use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    time::Duration,
};

use integration_tests::*;

pub const WAIT: Duration = Duration::from_secs(20);

#[allow(unused_imports)]
pub use guard_test::rng::Rng;

/// Another daemon guarding the test account (a second test run on this host) ends these tests'
/// probes under its own config; say so up front, since the failures it causes look like bugs.
pub fn warn_about_other_guards(test: &str) {
    let me = std::process::id();
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let cmd = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat.rsplit(')').next().and_then(|r| r.split(' ').nth(2)).and_then(|p| p.parse::<u32>().ok());
        if cmd.contains(" run --user ") && cmd.contains(&format!("--user {TEST_USER} ")) && ppid != Some(me) {
            eprintln!("{test}: WARNING another guard for {TEST_USER} is running (pid {pid}: {cmd}); it may end this test's probes");
        }
    }
}

pub fn long() -> bool {
    std::env::var("GUARD_LONG_TESTS").is_ok_and(|v| v == "1")
}

/// docs/log.md: `^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [A-Z_]+( .*)?$`.
pub fn follows_the_log_grammar(l: &str) -> bool {
    let b = l.as_bytes();
    if b.len() < 21 || l.contains('\r') {
        return false;
    }
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    let shape = digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b' '
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19)
        && b[19] == b' ';
    let event = l[20..].split(' ').next().unwrap_or("");
    shape && !event.is_empty() && event.bytes().all(|c| c.is_ascii_uppercase() || c == b'_')
}

pub fn assert_log_is_whole(log: &str, when: &str) {
    assert!(
        log.is_empty() || log.ends_with('\n'),
        "{when}: the log ends in a torn line: {:?}",
        &log[log.len().saturating_sub(200)..]
    );
    for l in log.lines() {
        assert!(follows_the_log_grammar(l), "{when}: torn or malformed log line {l:?}");
    }
}

pub fn status_json(home: &Home) -> Option<serde_json::Value> {
    fs::read(home.path().join("guard-status.json")).ok().and_then(|b| serde_json::from_slice(&b).ok())
}

/// A directory for probes' record files, writable by both test accounts.
pub fn record_dir(home: &Home) -> PathBuf {
    let d = home.path().join("rec");
    fs::create_dir_all(&d).unwrap();
    fs::set_permissions(&d, fs::Permissions::from_mode(0o777)).unwrap();
    d
}

pub fn record_of(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_default()
}

/// `home/bin/<name>` as a symlink to one copy of the probe (its comm is the link's name), so
/// a thousand scenarios do not copy a thousand binaries.
pub fn probe_link(home: &Home, name: &str) -> PathBuf {
    let base = home.probe_named("probe-base");
    let p = home.path().join("bin").join(name);
    if fs::symlink_metadata(&p).is_err() {
        std::os::unix::fs::symlink(&base, &p).unwrap();
    }
    p
}

/// Kills a daemon with SIGKILL (no chance to clean up) and reaps it.
pub fn kill9(mut d: Daemon) {
    unsafe { libc::kill(d.child.id() as i32, libc::SIGKILL) };
    let _ = d.child.wait();
    // Already reaped: Drop would signal a pid that may have been reused.
    std::mem::forget(d);
}

/// The comm the storm's children carry: the forking thread's (a fork copies the calling
/// thread's comm).
pub fn thread_comm() -> String {
    fs::read_to_string("/proc/thread-self/comm").unwrap().trim_end().to_string()
}
