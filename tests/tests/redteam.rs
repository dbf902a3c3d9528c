//! Issue 25's red-team pass: the guarded account tries to stay unguarded, or unguarded without
//! anyone being told, with what it controls — its processes' names, command lines, signal
//! handlers, threads and states, and the status file in its home. Each test runs
//! the real daemon as root against real probes; docs/architecture.md (the trust boundary) lists
//! every idea tried, these and the ones that turned out safe.
use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use integration_tests::*;

const WAIT: Duration = Duration::from_secs(20);

fn has(log: &str, needle: &str) {
    assert!(log.contains(needle), "expected {needle:?} in:\n{log}");
}

/// Ten arguments of 110 KiB (an argument holds at most 128 KiB): a command line of 1.1 MiB,
/// over the matcher's 1 MiB cap, well within exec's 2 MiB under the default 8 MiB stack limit.
fn padding() -> Vec<String> {
    (0..10).map(|i| format!("{i}{}", "p".repeat(110 * 1024))).collect()
}

fn spawn_padded(exe: &Path, n: usize) -> Vec<Probe> {
    let pad = padding();
    let args: Vec<&str> = pad.iter().map(String::as_str).collect();
    (0..n).map(|_| Probe::spawn(exe, &args, TEST_UID)).collect()
}

fn cmdline_len(pid: u32) -> usize {
    fs::read(format!("/proc/{pid}/cmdline")).map(|c| c.len()).unwrap_or(0)
}

/// Before: a process that renamed itself on SIGTERM and took its name back a moment later was
/// SIGTERMed and left alone (`identity_changed`) at every enforcement, for ever. Now the
/// enforcer remembers it dodged, and its next enforcement is SIGKILL right after the identity
/// check.
#[guard_test(needs = [root])]
fn a_process_that_dodges_sigterm_and_takes_its_name_back_is_killed_at_its_next_enforcement() {
    let _g = setup();
    for backend in backends() {
        let home = Home::new();
        // `hiding` is excluded, so the dodgers are not ended under the name they hide behind.
        home.write_config(r#"{"threshold": 2, "timeout": "0s", "excludes": ["hiding"]}"#);
        let exe = home.probe_named("dodger");
        let mut pile: Vec<Probe> =
            (0..2).map(|_| Probe::spawn(&exe, &["x", "x", "dodge-back", "hiding"], TEST_UID)).collect();
        let d = Daemon::start(&home, &["--backend", backend]);
        let end = Instant::now() + Duration::from_secs(30);
        while pile.iter_mut().any(|p| p.is_alive()) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(50));
        }
        d.stop();
        let log = home.log();
        for p in &mut pile {
            has(&log, &format!("SKIPPED pid={} name=dodger reason=identity_changed", p.pid()));
            assert!(!p.is_alive(), "{backend}: a dodger that came back was never ended:\n{log}");
            has(&log, &format!("KILLED pid={} name=dodger ", p.pid()));
        }
    }
}

/// Before: a command line over the matcher's 1 MiB cap was protected (`match_budget`) even with
/// an empty `excludeCommands`, where nothing could protect it. Now: ended.
#[guard_test(needs = [root])]
fn a_command_line_padded_past_the_cap_is_ended_when_no_pattern_could_protect_it() {
    let _g = setup();
    let home = Home::new();
    home.write_config(r#"{"threshold": 2, "timeout": "0s", "excludes": [], "excludeCommands": []}"#);
    let exe = home.probe_named("padded");
    let mut pile = spawn_padded(&exe, 2);
    assert!(cmdline_len(pile[0].pid()) > 1 << 20, "the padding did not reach the cap");
    let d = Daemon::start(&home, &[]);
    let end = Instant::now() + WAIT;
    while pile.iter_mut().any(|p| p.is_alive()) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    d.stop();
    let log = home.log();
    for p in &mut pile {
        assert!(!p.is_alive(), "a padded process was protected with no pattern to protect it:\n{log}");
        has(&log, &format!("KILLED pid={} name=padded ", p.pid()));
    }
    assert!(!log.contains("reason=match_budget"), "{log}");
}

/// With patterns, a command line over the cap is still protected (it is never matched on a cut
/// prefix), but under a reason of its own, in the log, the status file and `explain`, so the
/// operator can tell padding from a slow pattern. Before: `match_budget`, like a slow pattern.
#[guard_test(needs = [root])]
fn a_command_line_padded_past_the_cap_is_protected_as_cmdline_too_long_and_said_so() {
    let _g = setup();
    let home = Home::new();
    home.write_config(r#"{"threshold": 2, "timeout": "0s", "excludes": []}"#);
    let exe = home.probe_named("padded");
    let mut pile = spawn_padded(&exe, 2);
    let d = Daemon::start(&home, &[]);
    let log = home.wait_log(WAIT, |l| lines(l, "SKIPPED").len() >= 4);
    let status = home.wait_status(WAIT, |s| s.names.iter().any(|n| n.would_skip == Some(2)));
    let explain = Command::new(guard_bin())
        .args(["explain", "padded", "--user", TEST_USER, "--home"])
        .arg(home.path())
        .output()
        .unwrap();
    d.stop();
    for p in &mut pile {
        has(&log, &format!("SKIPPED pid={} name=padded reason=cmdline_too_long", p.pid()));
        assert!(p.is_alive(), "a process whose command line could not be matched was ended");
    }
    assert!(lines(&log, "KILLED").is_empty(), "{log}");
    let status = status.expect("a status file");
    let row = status.names.iter().find(|n| n.name == "padded").expect("a status row for the pile");
    assert_eq!((row.would_skip, row.would_end), (Some(2), Some(0)), "{row:?}");
    let text = String::from_utf8_lossy(&explain.stdout);
    assert!(text.contains("skip: cmdline_too_long"), "explain:\n{text}");
}

/// Before: `guard-user status`, run by root, showed the status file in the account's home, which
/// the account can rewrite at will: a guard whose config had been invalid for its last ticks
/// (nothing ended) read as healthy. Now root reads the copy the daemon keeps beside its lock.
#[guard_test(needs = [root])]
fn a_status_file_the_account_rewrites_cannot_make_status_show_a_healthy_guard() {
    let _g = setup();
    let home = Home::new();
    home.write_config(r#"{"threshold": "30"}"#);
    let d = Daemon::start(&home, &[]);
    let path = home.path().join("guard-status.json");
    let real = home.wait_status(WAIT, |s| s.config_error.is_some()).expect("a status with the config error");
    // The account's forgery: the daemon's own status, healthy, and ticking right now. Written
    // between two ticks (and the daemon is then stopped, so it cannot repair it).
    d.stop();
    let mut forged = real.clone();
    forged.config_error = None;
    forged.interval_secs = 3600.0;
    forged.last_tick = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    fs::write(&path, serde_json::to_vec(&forged).unwrap()).unwrap();
    std::os::unix::fs::chown(&path, Some(TEST_UID), Some(TEST_UID)).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    let out =
        Command::new(guard_bin()).args(["status", "--user", TEST_USER, "--home"]).arg(home.path()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "status read the account's forgery:\n{text}");
    assert!(text.contains("INVALID, so nothing is ended"), "{text}");
}

/// Safe, and kept so: a process that blanks its command line (argv's first byte NUL, its last
/// not, so /proc/PID/cmdline reads empty) matches no shipped pattern and is ended like any other.
#[guard_test(needs = [root])]
fn a_process_that_blanks_its_command_line_is_still_ended() {
    let _g = setup();
    let home = Home::new();
    home.write_config(r#"{"threshold": 2, "timeout": "0s", "excludes": []}"#);
    let exe = home.probe_named("blank");
    let mut pile: Vec<Probe> = (0..2).map(|_| Probe::spawn(&exe, &["blank-cmdline", "1"], TEST_UID)).collect();
    assert_eq!(fs::read(format!("/proc/{}/cmdline", pile[0].pid())).unwrap(), b"\0", "the probe's argv is not blank");
    let d = Daemon::start(&home, &[]);
    let end = Instant::now() + WAIT;
    while pile.iter_mut().any(|p| p.is_alive()) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    d.stop();
    let log = home.log();
    for p in &mut pile {
        assert!(!p.is_alive(), "a process with a blank command line escaped:\n{log}");
        has(&log, &format!("KILLED pid={} name=blank ", p.pid()));
    }
}

/// Safe, and kept so: a process whose main thread has exited (its leader a zombie, its work in
/// another thread) is counted and ended by both backends; its command line reads empty.
#[guard_test(needs = [root])]
fn a_process_whose_leader_thread_exited_is_counted_and_ended() {
    let _g = setup();
    for backend in backends() {
        let home = Home::new();
        home.write_config(r#"{"threshold": 2, "timeout": "0s", "excludes": []}"#);
        let exe = home.probe_named("headless");
        let mut pile: Vec<Probe> = (0..2).map(|_| Probe::spawn(&exe, &["leader-exits", "1"], TEST_UID)).collect();
        let state = |pid: u32| {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            stat.rfind(')').and_then(|i| stat.get(i + 2..i + 3)).unwrap_or("?").to_string()
        };
        let zombie = poll(Duration::from_secs(5), || {
            let z = pile.iter().all(|p| state(p.pid()) == "Z");
            (z, z)
        });
        assert!(zombie, "the probes' leaders did not exit");
        let d = Daemon::start(&home, &["--backend", backend]);
        let end = Instant::now() + WAIT;
        while pile.iter_mut().any(|p| p.is_alive()) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(50));
        }
        d.stop();
        let log = home.log();
        for p in &mut pile {
            assert!(!p.is_alive(), "{backend}: a process with a zombie leader escaped:\n{log}");
            has(&log, &format!("KILLED pid={} name=headless ", p.pid()));
        }
    }
}

/// A pile that dips under the threshold at a tick (here: one process ended and started again)
/// has its clock dropped and its `timeout` started over; nothing but the absence of `FLAGGED`
/// lines said so. Now the drop is an `UNFLAGGED` line with how long the clock had run.
#[guard_test(needs = [root])]
fn a_pile_that_dips_under_the_threshold_at_a_tick_is_logged_unflagged() {
    let _g = setup();
    let home = Home::new();
    home.write_config(r#"{"threshold": 3, "timeout": "1h", "excludes": []}"#);
    let exe = home.probe_named("dipper");
    let mut pile: Vec<Probe> = (0..3).map(|_| Probe::spawn(&exe, &[], TEST_UID)).collect();
    let d = Daemon::start(&home, &[]);
    home.wait_log(WAIT, |l| l.contains("FLAGGED name=dipper count=3 first_flagged=now"));
    drop(pile.pop());
    let log = home.wait_log(WAIT, |l| l.contains("UNFLAGGED"));
    pile.push(Probe::spawn(&exe, &[], TEST_UID));
    let log2 = home.wait_log(WAIT, |l| l.matches("first_flagged=now").count() >= 2);
    d.stop();
    has(&log, "UNFLAGGED name=dipper count=2 flagged_for=0m reason=below_threshold");
    assert_eq!(log2.matches("first_flagged=now").count(), 2, "the clock started over:\n{log2}");
}

/// A pile renamed to a case variant of an excluded name (`BASH` for `bash`) is left alone, as
/// docs/configuration.md says excludes ignore case; `status` shows it as excluded rather than
/// not at all.
#[guard_test(needs = [root])]
fn a_pile_renamed_to_an_excluded_name_is_left_alone_but_shown_in_status() {
    let _g = setup();
    let home = Home::new();
    home.write_config(r#"{"threshold": 2, "timeout": "0s"}"#);
    let exe = home.probe_named("hider");
    let mut pile: Vec<Probe> = (0..3).map(|_| Probe::spawn(&exe, &["rename", "BASH"], TEST_UID)).collect();
    let d = Daemon::start(&home, &[]);
    let status = home.wait_status(WAIT, |s| s.names.iter().any(|n| n.name == "BASH"));
    let log = home.wait_log(WAIT, |l| lines(l, "TICK_COMPLETE").len() >= 3);
    let out = Command::new(guard_bin()).args(["status", "--user", TEST_USER, "--home"]).arg(home.path()).output();
    d.stop();
    assert!(pile.iter_mut().all(|p| p.is_alive()), "an excluded name was ended:\n{log}");
    assert!(!log.contains("name=BASH"), "{log}");
    let status = status.expect("a status row for the excluded pile");
    let row = status.names.iter().find(|n| n.name == "BASH").unwrap();
    assert!(row.excluded && row.count == 3 && row.flagged_since.is_none(), "{row:?}");
    let text = String::from_utf8_lossy(&out.unwrap().stdout).into_owned();
    assert!(text.lines().any(|l| l.starts_with("BASH ") && l.contains(" excluded ")), "{text}");
}

/// Safe, and kept so: a pile stopped with SIGSTOP (SIGTERM stays pending on a stopped process)
/// is still ended: SIGKILL, sent 0.5 s later to what is still itself, ends a stopped process.
#[guard_test(needs = [root])]
fn a_stopped_pile_is_still_ended() {
    let _g = setup();
    let home = Home::new();
    home.write_config(r#"{"threshold": 2, "timeout": "0s", "excludes": []}"#);
    let exe = home.probe_named("frozen");
    let mut pile: Vec<Probe> = (0..2).map(|_| Probe::spawn(&exe, &[], TEST_UID)).collect();
    for p in &pile {
        unsafe { libc::kill(p.pid() as i32, libc::SIGSTOP) };
    }
    let d = Daemon::start(&home, &[]);
    let end = Instant::now() + WAIT;
    while pile.iter_mut().any(|p| p.is_alive()) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    d.stop();
    let log = home.log();
    for p in &mut pile {
        assert!(!p.is_alive(), "a stopped process escaped:\n{log}");
        has(&log, &format!("KILLED pid={} name=frozen ", p.pid()));
    }
}

guard_test::main!();
