//! Supervision with real processes and real signals (docs/operations.md): readiness and watchdog pings on
//! a real `NOTIFY_SOCKET`, a hung tick or pump ending in exit 70, SIGHUP reopening a rotated log,
//! one daemon per (account, home), SIGTERM during a stuck tick. The hangs come from the debug
//! build's test-only fault hook (`GUARD_FAULT`, compiled out of release builds).
use std::{
    os::unix::net::UnixDatagram,
    time::{Duration, Instant},
};

use integration_tests::*;

const WAIT: Duration = Duration::from_secs(20);

fn config() -> &'static str {
    r#"{"threshold": 3, "timeout": "1h", "excludes": []}"#
}

/// Waits for the daemon to exit; its status and how long that took.
fn wait_exit(d: &mut Daemon, timeout: Duration) -> Option<(std::process::ExitStatus, Duration)> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if let Ok(Some(st)) = d.child.try_wait() {
            return Some((st, start.elapsed()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[guard_test(needs = [root])]
fn readiness_watchdog_and_status_reach_the_notify_socket() {
    let _g = setup();
    let home = Home::new();
    home.write_config(config());
    let sock_path = home.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let started = Instant::now();
    let d =
        Daemon::start_with(&home, &[], &[("NOTIFY_SOCKET", sock_path.to_str().unwrap()), ("WATCHDOG_USEC", "2000000")]);
    let mut got: Vec<(Duration, String)> = Vec::new();
    let mut buf = [0u8; 4096];
    while started.elapsed() < Duration::from_secs(8) {
        if let Ok(n) = sock.recv(&mut buf) {
            got.push((started.elapsed(), String::from_utf8_lossy(&buf[..n]).into_owned()));
        }
    }
    let log = home.log();
    drop(d);
    let msgs: Vec<&str> = got.iter().map(|(_, m)| m.as_str()).collect();
    let ready = msgs.iter().position(|m| m.contains("READY=1")).unwrap_or_else(|| panic!("no READY=1: {msgs:?}"));
    assert!(!msgs[..ready].iter().any(|m| m.contains("WATCHDOG=1")), "a watchdog ping before READY: {msgs:?}");
    assert!(log.contains("TICK_COMPLETE"), "READY=1 is sent after the first tick: {log}");
    let pings: Vec<Duration> = got.iter().filter(|(_, m)| m.contains("WATCHDOG=1")).map(|(t, _)| *t).collect();
    // WATCHDOG_USEC=2 s: a ping every second (half of it), so ~6 in the 7 s after start-up.
    assert!(pings.len() >= 4, "too few pings: {pings:?}");
    for w in pings.windows(2) {
        assert!(w[1] - w[0] <= Duration::from_millis(1600), "a gap of {:?} between pings: {pings:?}", w[1] - w[0]);
    }
    let status = msgs.iter().find(|m| m.contains("STATUS=")).expect("a STATUS= line");
    assert!(status.contains("processes") && status.contains("flagged") && status.contains("last tick"), "{status}");
}

fn hangs_end_in_exit_70(fault: &str) {
    let home = Home::new();
    home.write_config(config());
    let mut d = Daemon::start_with(&home, &[], &[("GUARD_FAULT", fault)]);
    // --interval 1s: deadline 1 s, so a hang is declared 10 s into the stuck tick at the latest.
    let (st, took) = wait_exit(&mut d, Duration::from_secs(25)).unwrap_or_else(|| panic!("{fault}: still running"));
    let log = home.log();
    assert_eq!(st.code(), Some(70), "{fault}: {st:?}\n{log}");
    assert!(log.trim_end().ends_with("STOPPED reason=hang"), "{fault}: {log}");
    assert!(took < Duration::from_secs(16), "{fault}: {took:?}");
    std::mem::forget(d);
}

#[guard_test(needs = [root])]
fn a_hung_tick_warns_once_then_exits_70() {
    let _g = setup();
    hangs_end_in_exit_70("hang_tick:2");
}

#[guard_test(needs = [root])]
fn a_hung_pump_exits_70() {
    let _g = setup();
    hangs_end_in_exit_70("hang_pump:2");
}

#[guard_test(needs = [root])]
fn the_overrun_warning_is_logged_once_with_its_deadline() {
    let _g = setup();
    let home = Home::new();
    home.write_config(config());
    let mut d = Daemon::start_with(&home, &[], &[("GUARD_FAULT", "hang_tick:2")]);
    wait_exit(&mut d, Duration::from_secs(25)).expect("exits");
    let log = home.log();
    let warns = lines(&log, "WARN").into_iter().filter(|l| l.contains("tick_overrun")).collect::<Vec<_>>();
    assert_eq!(warns.len(), 1, "{log}");
    assert!(warns[0].ends_with("WARN tick_overrun elapsed=1s deadline=1s"), "{log}");
    std::mem::forget(d);
}

/// Whether a thread of `pid` is in `nanosleep`/`clock_nanosleep`: the fault hook's hang (a
/// `thread::sleep`), which no other thread of the daemon calls (they wait in epoll or futexes).
fn asleep_in_a_thread(pid: u32) -> bool {
    let sleeping = [libc::SYS_nanosleep, libc::SYS_clock_nanosleep];
    std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten().any(|t| {
        let syscall = std::fs::read_to_string(t.path().join("syscall")).unwrap_or_default();
        syscall.split(' ').next().and_then(|n| n.parse::<libc::c_long>().ok()).is_some_and(|n| sleeping.contains(&n))
    })
}

#[guard_test(needs = [root])]
fn sigterm_during_a_stuck_tick_ends_the_daemon_within_3_seconds() {
    let _g = setup();
    let home = Home::new();
    home.write_config(config());
    let mut d = Daemon::start_with(&home, &[], &[("GUARD_FAULT", "hang_tick:2")]);
    home.wait_log(WAIT, |l| !lines(l, "TICK_COMPLETE").is_empty());
    let pid = d.child.id();
    guard_test::wait::until(WAIT, "the second tick to hang", || asleep_in_a_thread(pid).then_some(()));
    unsafe { libc::kill(d.child.id() as i32, libc::SIGTERM) };
    let (st, took) = wait_exit(&mut d, Duration::from_secs(5)).expect("SIGTERM did not end it");
    assert!(took <= Duration::from_secs(3), "{took:?}");
    assert_eq!(st.code(), Some(0));
    assert!(home.log().trim_end().ends_with("STOPPED reason=signal"), "{}", home.log());
    std::mem::forget(d);
}

#[guard_test(needs = [root])]
fn sighup_reopens_a_rotated_log_and_keeps_guarding() {
    let _g = setup();
    let home = Home::new();
    home.write_config(config());
    let d = Daemon::start(&home, &[]);
    home.wait_log(WAIT, |l| !lines(l, "TICK_COMPLETE").is_empty());
    let log = home.path().join("guard-daemon.log");
    let rotated = home.path().join("guard-daemon.log.old");
    std::fs::rename(&log, &rotated).unwrap();
    let before = std::fs::read_to_string(&rotated).unwrap();
    unsafe { libc::kill(d.child.id() as i32, libc::SIGHUP) };
    let fresh = home.wait_log(WAIT, |l| l.contains("RELOAD reason=sighup") && lines(l, "TICK_COMPLETE").len() >= 2);
    assert!(fresh.contains("RELOAD reason=sighup"), "{fresh}");
    assert!(lines(&fresh, "TICK_COMPLETE").len() >= 2, "{fresh}");
    let old = std::fs::read_to_string(&rotated).unwrap();
    assert!(old.len() >= before.len() && !old.contains("RELOAD"), "the rotated file got new lines: {old}");
    assert!(!fresh.contains("STOPPED"), "SIGHUP stopped the daemon: {fresh}");
    d.stop();
}

#[guard_test(needs = [root])]
fn a_second_daemon_for_the_same_account_and_home_exits_75_naming_the_first() {
    let _g = setup();
    let home = Home::new();
    home.write_config(config());
    let first = Daemon::start(&home, &[]);
    home.wait_log(WAIT, |l| l.contains("TICK_COMPLETE"));
    let out = std::process::Command::new(guard_bin())
        .args(["run", "--user", TEST_USER, "--interval", "1s", "--home"])
        .arg(home.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("(pid {})", first.child.id())), "{err}");
    // Another home of the same account is another pair: it runs.
    let other = Home::new();
    other.write_config(config());
    let second = Daemon::start(&other, &[]);
    let log = other.wait_log(WAIT, |l| l.contains("TICK_COMPLETE"));
    assert!(log.contains("TICK_COMPLETE"), "{log}");
    second.stop();
    first.stop();
}

guard_test::main!();
