//! The hostile home: the guarded account feeds the root daemon what it likes through its home —
//! links to root's files and pipes, FIFOs, devices, huge numbers, names and command lines made
//! to forge lines — and the real daemon, run as root against real probes, must keep completing
//! ticks, stop on SIGTERM within 3 s, write nothing outside the account's reach, show nothing the
//! account could not read, and say what is wrong in one clear ERROR line. (The library-level
//! cases are in guard-user/tests/hostile_files.rs; install's in tests/install.rs.)
use std::{
    fs,
    os::unix::fs::{symlink, PermissionsExt},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use integration_tests::*;

const WAIT: Duration = Duration::from_secs(20);

/// A root-only directory with a secret the account must never see.
struct Secret {
    dir: tempfile::TempDir,
    pub text: String,
}

impl Secret {
    fn new() -> Secret {
        let dir = tempfile::Builder::new().prefix("guard-secret-").tempdir_in("/tmp").unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        let text = format!("SECRET{}", std::process::id() * 7919);
        Secret { dir, text }
    }

    /// A 0600 root file holding `content` (the secret is in it).
    fn file(&self, name: &str, content: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        fs::write(&p, content).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        p
    }
}

/// Runs the daemon on `home` until `ticks` ticks completed, then SIGTERM: checks it kept ticking,
/// stopped within 3 s with exit 0 and `STOPPED reason=signal`, and that `secret` (if any) shows in
/// neither its log nor its status file. Returns the log.
fn survive(home: &Home, ticks: usize, secret: Option<&str>) -> String {
    let d = Daemon::start(home, &[]);
    let log = home.wait_log(WAIT, |l| lines(l, "TICK_COMPLETE").len() >= ticks);
    assert!(lines(&log, "TICK_COMPLETE").len() >= ticks, "the daemon stopped ticking:\n{log}");
    let began = Instant::now();
    let st = d.stop();
    assert!(began.elapsed() <= Duration::from_secs(3), "SIGTERM took {:?}", began.elapsed());
    assert_eq!(st.code(), Some(0), "{st:?}");
    let log = home.log();
    assert!(log.trim_end().ends_with("STOPPED reason=signal"), "{log}");
    if let Some(s) = secret {
        assert!(!log.contains(s), "the log shows what the account cannot read:\n{log}");
        let status = fs::read_to_string(home.path().join("guard-status.json")).unwrap_or_default();
        assert!(!status.contains(s), "the status shows what the account cannot read:\n{status}");
    }
    log
}

fn config_path(home: &Home) -> PathBuf {
    home.path().join("guard-config.json")
}

fn has(log: &str, needle: &str) {
    assert!(log.contains(needle), "expected {needle:?} in:\n{log}");
}

#[guard_test(needs = [root])]
fn a_config_linked_to_a_root_only_file_is_refused_and_its_values_never_shown() {
    let _g = setup();
    let home = Home::new();
    let secret = Secret::new();
    let target = secret.file("cfg.json", &format!(r#"{{"timeout": "{0}", "{0}": 1}}"#, secret.text));
    symlink(&target, config_path(&home)).unwrap();
    let log = survive(&home, 3, Some(&secret.text));
    has(&log, "ERROR config_unreadable path=");
    has(&log, "reason=permission_denied");
}

#[guard_test(needs = [root])]
fn a_config_linked_to_a_root_processs_pipe_consumes_nothing() {
    let _g = setup();
    let home = Home::new();
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let payload = b"root's data\n";
    assert_eq!(unsafe { libc::write(fds[1], payload.as_ptr().cast(), payload.len()) }, payload.len() as isize);
    // A root process holding the read end as its stdin, never reading it.
    use std::os::fd::FromRawFd;
    let mut holder = std::process::Command::new("sleep")
        .arg("60")
        .stdin(unsafe { std::process::Stdio::from_raw_fd(fds[0]) })
        .spawn()
        .unwrap();
    symlink(format!("/proc/{}/fd/0", holder.id()), config_path(&home)).unwrap();
    let log = survive(&home, 3, None);
    has(&log, "ERROR config_unreadable path=");
    // The pipe still holds every byte.
    let mut buf = [0u8; 64];
    let read_end = fs::File::open(format!("/proc/{}/fd/0", holder.id())).unwrap();
    use std::os::fd::AsRawFd;
    unsafe { libc::fcntl(read_end.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
    let n = unsafe { libc::read(read_end.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(&buf[..n.max(0) as usize], payload, "the daemon consumed the root process's data");
    holder.kill().unwrap();
    holder.wait().unwrap();
    unsafe { libc::close(fds[1]) };
}

#[guard_test(needs = [root])]
fn a_fifo_as_the_config_is_an_error_not_a_wait() {
    let _g = setup();
    let home = Home::new();
    let c = std::ffi::CString::new(config_path(&home).to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
    let log = survive(&home, 3, None);
    has(&log, "reason=not_regular kind=fifo");
    // `validate` and `explain` on it return at once too, with the reason (no status file:
    // the daemon stopped, so `status` is not run here).
    for args in [vec!["validate"], vec!["explain", "x"]] {
        let began = Instant::now();
        let out = std::process::Command::new(guard_bin())
            .args(&args)
            .args(["--user", TEST_USER, "--home"])
            .arg(home.path())
            .output()
            .unwrap();
        assert!(began.elapsed() < Duration::from_secs(5), "{args:?} hung on the FIFO");
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(text.contains("fifo") || text.contains("FIFO"), "{args:?}: {text}");
    }
}

#[guard_test(needs = [root])]
fn a_fifo_as_the_state_file_never_delays_enforcement() {
    let _g = setup();
    let home = Home::new();
    home.write_config(r#"{"threshold": 2, "timeout": "1s", "excludes": []}"#);
    let c = std::ffi::CString::new(home.path().join("guard-daemon-state.json").to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
    let exe = home.probe_named("pile");
    let mut pile: Vec<Probe> = (0..2).map(|_| Probe::spawn(&exe, &[], TEST_UID)).collect();
    let log = survive(&home, 4, None);
    has(&log, "ERROR state_malformed path=");
    has(&log, "kind=fifo");
    assert_eq!(lines(&log, "KILLED").len(), 2, "{log}");
    assert!(pile.iter_mut().all(|p| p.wait_dead(Duration::from_secs(5))));
}

#[guard_test(needs = [root])]
fn devices_directories_sparse_giants_and_link_loops_as_the_config_are_clear_errors() {
    let _g = setup();
    type Make = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, Make)> = vec![
        ("kind=char_device", Box::new(|p: &Path| symlink("/dev/zero", p).unwrap())),
        ("kind=directory", Box::new(|p: &Path| fs::create_dir(p).unwrap())),
        (
            "reason=too_large",
            Box::new(|p: &Path| {
                let f = fs::File::create(p).unwrap();
                f.set_len(2 << 30).unwrap();
                fs::set_permissions(p, fs::Permissions::from_mode(0o644)).unwrap();
            }),
        ),
        (
            "ERROR config_unreadable",
            Box::new(|p: &Path| {
                let other = p.with_file_name("loop-b");
                symlink(&other, p).unwrap();
                symlink(p, &other).unwrap();
            }),
        ),
    ];
    for (want, make) in cases {
        let home = Home::new();
        make(&config_path(&home));
        let log = survive(&home, 2, None);
        has(&log, want);
    }
}

#[guard_test(needs = [root])]
fn huge_numbers_and_deep_documents_are_config_errors_not_crashes() {
    let _g = setup();
    let deep = format!(r#"{{"x": {}{}}}"#, "[".repeat(100_000), "]".repeat(100_000));
    for (config, want) in [
        (
            r#"{"timeout": 10000000000000000000}"#.to_string(),
            "ERROR config_malformed timeout value=10000000000000000000",
        ),
        (r#"{"timeout": "5124095576030431h"}"#.to_string(), "ERROR config_malformed timeout value=5124095576030431h"),
        (r#"{"threshold": 1e300}"#.to_string(), "ERROR config_malformed threshold"),
        (r#"{"logMaxSizeMB": 1e308}"#.to_string(), "ERROR config_malformed logMaxSizeMB"),
        (deep, "ERROR config_malformed json line=1"),
    ] {
        let home = Home::new();
        home.write_config(&config);
        let log = survive(&home, 3, None);
        has(&log, want);
        assert_eq!(lines(&log, "ERROR").len(), lines(&log, "TICK_COMPLETE").len(), "one ERROR per tick:\n{log}");
    }
}

#[guard_test(needs = [root])]
fn names_differing_only_in_invalid_bytes_keep_separate_clocks() {
    let _g = setup();
    let home = Home::new();
    home.write_config(r#"{"threshold": 2, "timeout": "1h", "excludes": []}"#);
    let exe = home.probe_named("base");
    let _a: Vec<Probe> = (0..2).map(|_| Probe::spawn(&exe, &["x", "x", "rename-hex", "71ff"], TEST_UID)).collect();
    let _b: Vec<Probe> = (0..2).map(|_| Probe::spawn(&exe, &["x", "x", "rename-hex", "71fe"], TEST_UID)).collect();
    let log = survive(&home, 3, None);
    has(&log, r"FLAGGED name=q\xff count=2 first_flagged=now");
    has(&log, r"FLAGGED name=q\xfe count=2 first_flagged=now");
    let state = fs::read_to_string(home.path().join("guard-daemon-state.json")).unwrap();
    assert!(state.contains(r#""q\\xff""#) && state.contains(r#""q\\xfe""#), "{state}");
}

/// Every line of `log` is `YYYY-MM-DD HH:MM:SS EVENT …` with an event from docs/log.md.
fn every_line_is_one_event(log: &str) {
    const EVENTS: &[&str] = &[
        "FLAGGED",
        "KILLED",
        "DRY_RUN",
        "SKIPPED",
        "ERROR",
        "TICK_COMPLETE",
        "STARTED",
        "RESYNC",
        "WARN",
        "STOPPED",
        "RELOAD",
        "PEGGED",
        "RECOVERED",
        "WARNING",
        "REPEAT",
        "UNFLAGGED",
    ];
    for l in log.lines() {
        let parts: Vec<&str> = l.splitn(4, ' ').collect();
        assert!(parts.len() >= 3 && parts[0].len() == 10 && parts[1].len() == 8, "not a log line: {l:?}");
        assert!(EVENTS.contains(&parts[2]), "unknown event in {l:?}");
    }
}

#[guard_test(needs = [root])]
fn a_name_made_to_forge_a_line_or_a_key_stays_one_quoted_value() {
    let _g = setup();
    let home = Home::new();
    home.write_config(r#"{"threshold": 1, "timeout": "1h", "excludes": []}"#);
    let exe = home.probe_named("base");
    // 15 bytes each: a newline and a fake event; a space and a fake key.
    let _a = Probe::spawn(&exe, &["x", "x", "rename-hex", "780a4b494c4c454420706964"], TEST_UID);
    let _b = Probe::spawn(&exe, &["x", "x", "rename", "x KILLED pid=1"], TEST_UID);
    let log = survive(&home, 3, None);
    every_line_is_one_event(&log);
    has(&log, r#"FLAGGED name="x\nKILLED pid" count=1"#);
    has(&log, r#"FLAGGED name="x KILLED pid=1" count=1"#);
    assert!(lines(&log, "KILLED").is_empty(), "{log}");
    let status = fs::read_to_string(home.path().join("guard-status.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert!(v["names"].as_array().unwrap().iter().all(|n| !n["name"].as_str().unwrap().contains('\n')), "{status}");
}

#[guard_test(needs = [root])]
fn a_process_that_renames_itself_on_sigterm_is_not_logged_killed() {
    let _g = setup();
    let home = Home::new();
    // `renamed` is excluded so the survivors are not ended again under their new name.
    home.write_config(r#"{"threshold": 2, "timeout": "0s", "excludes": ["renamed"]}"#);
    let exe = home.probe_named("dodger");
    let mut pile: Vec<Probe> = (0..2).map(|_| Probe::spawn(&exe, &["x", "x", "dodge", "renamed"], TEST_UID)).collect();
    let log = survive(&home, 2, None);
    for p in &pile {
        has(&log, &format!("SKIPPED pid={} name=dodger reason=identity_changed", p.pid()));
    }
    assert!(lines(&log, "KILLED").is_empty(), "a survivor was logged KILLED:\n{log}");
    has(&log, "TICK_COMPLETE flagged=1 kills=0 errors=0");
    assert!(pile.iter_mut().all(|p| p.is_alive()), "a renamed process must not be sent SIGKILL");
}

#[guard_test(needs = [root])]
fn a_state_file_root_cannot_write_as_the_account_never_delays_enforcement() {
    let _g = setup();
    for state_file in ["/proc/guard-state.json", "/etc/passwd"] {
        let home = Home::new();
        let passwd = fs::read("/etc/passwd").unwrap();
        home.write_config(&format!(
            r#"{{"threshold": 2, "timeout": "2s", "excludes": [], "stateFile": "{state_file}"}}"#
        ));
        let exe = home.probe_named("pile");
        let mut pile: Vec<Probe> = (0..2).map(|_| Probe::spawn(&exe, &[], TEST_UID)).collect();
        let log = survive(&home, 5, Some("root:x:0:0"));
        has(&log, &format!("ERROR state_unwritable path={state_file}"));
        assert_eq!(lines(&log, "KILLED").len(), 2, "{state_file}: enforcement was delayed:\n{log}");
        assert!(pile.iter_mut().all(|p| p.wait_dead(Duration::from_secs(5))));
        assert_eq!(fs::read("/etc/passwd").unwrap(), passwd, "/etc/passwd changed");
    }
}

#[guard_test(needs = [root])]
fn a_fifo_or_a_root_file_as_the_log_does_not_stop_the_ticks() {
    let _g = setup();
    let home = Home::new();
    home.write_config(r#"{"threshold": 3, "timeout": "1h"}"#);
    let log_path = home.path().join("guard-daemon.log");
    let c = std::ffi::CString::new(log_path.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
    let d = Daemon::start(&home, &[]);
    let status = home.path().join("guard-status.json");
    let began = Instant::now();
    let mut ticks = 0;
    while began.elapsed() < WAIT && ticks < 3 {
        let v: Option<serde_json::Value> = fs::read(&status).ok().and_then(|b| serde_json::from_slice(&b).ok());
        ticks = v.and_then(|v| v["ticks"].as_u64()).unwrap_or(0);
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(ticks >= 3, "the daemon stopped ticking with a FIFO as its log");
    let st = d.stop();
    assert_eq!(st.code(), Some(0));
    assert!(fs::symlink_metadata(&log_path).unwrap().file_type().is_fifo_like());
}

trait FifoLike {
    fn is_fifo_like(&self) -> bool;
}

impl FifoLike for fs::FileType {
    fn is_fifo_like(&self) -> bool {
        use std::os::unix::fs::FileTypeExt;
        self.is_fifo()
    }
}

#[guard_test(needs = [root])]
fn bad_pattern_lists_are_config_errors() {
    let _g = setup();
    let many: Vec<String> = (0..300).map(|i| format!("\"p{i}\"")).collect();
    for (config, want) in [
        (format!(r#"{{"excludeCommands": [{}]}}"#, many.join(",")), "ERROR config_malformed excludeCommands"),
        (r#"{"excludeCommands": ["a\u0000b"]}"#.to_string(), "ERROR config_malformed excludeCommands"),
        (format!(r#"{{"excludeCommands": ["{}"]}}"#, "a".repeat(5000)), "ERROR config_malformed excludeCommands"),
        (
            r#"{"excludeCommands": ["(unclosed"]}"#.to_string(),
            "ERROR config_malformed excludeCommands pattern=(unclosed",
        ),
    ] {
        let home = Home::new();
        home.write_config(&config);
        let log = survive(&home, 2, None);
        has(&log, want);
    }
}

/// The daemon's resident memory, from /proc.
fn rss_kib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[guard_test(needs = [root])]
fn a_pattern_that_cannot_finish_protects_the_process_and_the_daemon_keeps_ticking() {
    let _g = setup();
    let home = Home::new();
    // Back-references over a run of a's: exponential in glibc, and it never matches (no `c`).
    home.write_config(r#"{"threshold": 2, "timeout": "0s", "excludes": [], "excludeCommands": ["(a|aa)*\\1c"]}"#);
    let exe = home.probe_named("bomb");
    let long = "a".repeat(300);
    let mut pile: Vec<Probe> = (0..2).map(|_| Probe::spawn(&exe, &["x", &long], TEST_UID)).collect();
    let d = Daemon::start(&home, &[]);
    let log = home.wait_log(Duration::from_secs(40), |l| lines(l, "TICK_COMPLETE").len() >= 3);
    let rss = rss_kib(d.child.id());
    let began = Instant::now();
    d.stop();
    assert!(began.elapsed() <= Duration::from_secs(3), "SIGTERM took {:?}", began.elapsed());
    assert!(lines(&log, "TICK_COMPLETE").len() >= 3, "the daemon stopped ticking:\n{log}");
    for p in &mut pile {
        has(&log, &format!("SKIPPED pid={} name=bomb reason=match_budget", p.pid()));
        assert!(p.is_alive(), "a process whose match could not finish was ended");
    }
    assert!(lines(&log, "KILLED").is_empty(), "{log}");
    assert!(rss < 64 * 1024, "the daemon grew to {rss} KiB");
}

#[guard_test(needs = [root])]
fn patterns_too_costly_to_compile_are_refused_at_once() {
    let _g = setup();
    let home = Home::new();
    home.write_config(r#"{"excludeCommands": ["((a{1,255}){1,255}){1,255}"]}"#);
    let log = survive(&home, 3, None);
    has(&log, "ERROR config_malformed excludeCommands pattern=((a{1,255}){1,255}){1,255}");
}

guard_test::main!();
