//! The guard end to end: the real binary, the real kernel, real probe processes of a test
//! account (docs/architecture.md). Run as root (`cargo xtask test`).
use std::time::Duration;

use integration_tests::*;

const WAIT: Duration = Duration::from_secs(20);

fn config(threshold: u32, timeout: &str) -> String {
    format!(r#"{{"threshold": {threshold}, "timeout": "{timeout}", "excludes": ["bash"]}}"#)
}

fn kills_the_pile_but_not_excluded_commands_or_other_uids(backend: &str) {
    let home = Home::new();
    home.write_config(&config(3, "1s"));
    let exe = home.probe_named("agentihooks");
    let mut pile: Vec<Probe> = (0..4).map(|_| Probe::spawn(&exe, &["watch"], TEST_UID)).collect();
    let mut wrapper = Probe::spawn(&exe, &["select-profile", "coder"], TEST_UID);
    let mut others: Vec<Probe> = (0..4).map(|_| Probe::spawn(&exe, &["watch"], OTHER_UID)).collect();
    let daemon = Daemon::start(&home, &["--backend", backend]);
    home.wait_log(WAIT, |l| lines(l, "KILLED").len() >= 4);
    daemon.stop();
    let log = home.log();
    assert_eq!(lines(&log, "KILLED").len(), 4, "{log}");
    for p in &mut pile {
        assert!(p.wait_dead(Duration::from_secs(5)), "probe {} survived\n{log}", p.pid());
        assert!(
            log.contains(&format!("KILLED pid={} name=agentihooks reason=ghost_detected count=5 elapsed=", p.pid())),
            "{log}"
        );
    }
    assert!(wrapper.is_alive(), "the select-profile wrapper was ended\n{log}");
    assert!(log.contains(&format!("SKIPPED pid={} name=agentihooks reason=excluded_command", wrapper.pid())), "{log}");
    for p in &mut others {
        assert!(p.is_alive(), "another uid's process was ended");
    }
    assert!(log.contains(&format!("STARTED version=0.1.0 backend={backend} user={TEST_USER} dry_run=0 pid=")), "{log}");
    assert!(log.contains("FLAGGED name=agentihooks count=5 first_flagged=now"), "{log}");
    assert!(log.contains("TICK_COMPLETE flagged=1 kills=4 errors=0"), "{log}");
    assert!(log.trim_end().ends_with("STOPPED reason=signal"), "{log}");
}

#[guard_test(needs = [root, ebpf])]
fn ebpf_backend_kills_the_pile_but_not_excluded_commands_or_other_uids() {
    let _g = setup();
    kills_the_pile_but_not_excluded_commands_or_other_uids("ebpf");
}

#[guard_test(needs = [root])]
fn procfs_backend_kills_the_pile_but_not_excluded_commands_or_other_uids() {
    let _g = setup();
    kills_the_pile_but_not_excluded_commands_or_other_uids("procfs");
}

#[guard_test(needs = [root])]
fn dry_run_logs_what_it_would_end_and_ends_nothing() {
    let _g = setup();
    let home = Home::new();
    home.write_config(&config(2, "1s"));
    let exe = home.probe_named("agentihooks");
    let mut pile: Vec<Probe> = (0..3).map(|_| Probe::spawn(&exe, &[], TEST_UID)).collect();
    let daemon = Daemon::start(&home, &["--dry-run"]);
    let log = home.wait_log(WAIT, |l| lines(l, "DRY_RUN").len() >= 3);
    daemon.stop();
    assert_eq!(lines(&log, "KILLED").len(), 0, "{log}");
    for p in &mut pile {
        assert!(p.is_alive(), "dry run ended {}", p.pid());
        assert!(
            log.contains(&format!("DRY_RUN pid={} name=agentihooks reason=ghost_detected count=3", p.pid())),
            "{log}"
        );
    }
    assert!(log.contains("dry_run=1"), "{log}");
    let state = home.state().expect("dry run still writes the state file");
    assert!(state["flagged"]["agentihooks"].as_f64().is_some(), "{state}");
}

#[guard_test(needs = [root])]
fn malformed_config_ends_nothing_and_leaves_the_state_untouched() {
    let _g = setup();
    let home = Home::new();
    home.write_config(r#"{"threshold": 0, "timeout": "1s"}"#);
    let state_path = home.path().join("guard-daemon-state.json");
    let before = r#"{"version":1,"user":"guardtest1","flagged":{"agentihooks":1000.0}}"#;
    std::fs::write(&state_path, before).unwrap();
    let exe = home.probe_named("agentihooks");
    let mut pile: Vec<Probe> = (0..3).map(|_| Probe::spawn(&exe, &[], TEST_UID)).collect();
    let daemon = Daemon::start(&home, &[]);
    let log = home.wait_log(WAIT, |l| lines(l, "TICK_COMPLETE").len() >= 2);
    daemon.stop();
    assert!(log.contains("ERROR config_malformed threshold value=0"), "{log}");
    assert!(log.contains("TICK_COMPLETE flagged=0 kills=0 errors=1"), "{log}");
    assert!(pile.iter_mut().all(|p| p.is_alive()));
    assert_eq!(std::fs::read_to_string(&state_path).unwrap(), before);

    let missing = Home::new();
    let daemon = Daemon::start(&missing, &[]);
    let log = missing.wait_log(WAIT, |l| !lines(l, "TICK_COMPLETE").is_empty());
    daemon.stop();
    let path = missing.path().join("guard-config.json");
    assert!(log.contains(&format!("ERROR config_missing path={}", path.display())), "{log}");
}

#[guard_test(needs = [root])]
fn threads_count_once_and_forks_without_exec_keep_the_name() {
    let _g = setup();
    for backend in backends() {
        let home = Home::new();
        home.write_config(&config(4, "1h"));
        let exe = home.probe_named("agentihooks");
        let _threads = Probe::spawn(&exe, &["threads", "8"], TEST_UID);
        let _forks = Probe::spawn(&exe, &["forks", "2"], TEST_UID);
        let daemon = Daemon::start(&home, &["--backend", backend]);
        let log = home.wait_log(WAIT, |l| l.contains("FLAGGED"));
        daemon.stop();
        // 1 (8 threads) + 1 parent + 2 children without exec.
        assert!(log.contains("FLAGGED name=agentihooks count=4 first_flagged=now"), "{backend}: {log}");
    }
}

#[guard_test(needs = [root])]
fn names_below_the_threshold_or_excluded_are_not_flagged_and_lose_their_clock() {
    let _g = setup();
    let home = Home::new();
    home.write_config(&config(3, "1h"));
    let exe = home.probe_named("agentihooks");
    let mut pile: Vec<Probe> = (0..3).map(|_| Probe::spawn(&exe, &[], TEST_UID)).collect();
    let daemon = Daemon::start(&home, &[]);
    home.wait_log(WAIT, |l| l.contains("FLAGGED name=agentihooks"));
    drop(pile.pop()); // now 2 < 3
    let log = home.wait_log(WAIT, |l| l.contains("TICK_COMPLETE flagged=0"));
    assert!(log.contains("TICK_COMPLETE flagged=0 kills=0 errors=0"), "{log}");
    let state = home.state().unwrap();
    assert!(state["flagged"].as_object().unwrap().is_empty(), "{state}");
    // Excluded: never flagged even at the threshold. Two whole ticks after the change: at least
    // one read the new config.
    let ticks = lines(&home.log(), "TICK_COMPLETE").len();
    home.write_config(r#"{"threshold": 2, "timeout": "1s", "excludes": ["AgentiHooks"]}"#);
    home.wait_log(WAIT, |l| lines(l, "TICK_COMPLETE").len() >= ticks + 2);
    daemon.stop();
    assert!(pile.iter_mut().all(|p| p.is_alive()));
    let tail: String = home.log().lines().rev().take(3).collect();
    assert!(!tail.contains("FLAGGED"), "{tail}");
}

#[guard_test(needs = [root])]
fn a_restart_keeps_the_flag_clock() {
    let _g = setup();
    let home = Home::new();
    home.write_config(&config(2, "1h"));
    let exe = home.probe_named("agentihooks");
    let _pile: Vec<Probe> = (0..2).map(|_| Probe::spawn(&exe, &[], TEST_UID)).collect();
    let daemon = Daemon::start(&home, &[]);
    home.wait_log(WAIT, |l| l.contains("first_flagged=now"));
    daemon.stop();
    let first = home.state().unwrap()["flagged"]["agentihooks"].as_f64().unwrap();
    let daemon = Daemon::start(&home, &[]);
    let log = home.wait_log(WAIT, |l| lines(l, "STARTED").len() == 2 && l.contains("first_flagged=0m_ago"));
    daemon.stop();
    assert_eq!(log.matches("first_flagged=now").count(), 1, "{log}");
    assert_eq!(home.state().unwrap()["flagged"]["agentihooks"].as_f64().unwrap(), first);
}

#[guard_test(needs = [root, ebpf])]
fn both_backends_count_the_same_workload_the_same() {
    let _g = setup();
    let home = Home::new();
    let exe = home.probe_named("agentihooks");
    let other = home.probe_named("sleeper-x");
    let _a: Vec<Probe> = (0..3).map(|_| Probe::spawn(&exe, &["forks", "1", "threads", "2"], TEST_UID)).collect();
    let _b: Vec<Probe> = (0..5).map(|_| Probe::spawn(&other, &[], TEST_UID)).collect();
    home.write_config(r#"{"threshold": 2, "timeout": "1h"}"#);
    let mut seen = Vec::new();
    for backend in ["ebpf", "procfs"] {
        let log_before = home.log().len();
        let daemon = Daemon::start(&home, &["--backend", backend]);
        let log = home.wait_log(WAIT, |l| l[log_before..].contains("TICK_COMPLETE"));
        daemon.stop();
        let mut flagged: Vec<String> = log[log_before..]
            .lines()
            .filter(|l| l.contains("FLAGGED"))
            .map(|l| l.split(' ').skip(3).take(2).collect::<Vec<_>>().join(" "))
            .collect();
        flagged.sort();
        flagged.dedup();
        seen.push(flagged);
    }
    assert_eq!(seen[0], vec!["name=agentihooks count=6".to_string(), "name=sleeper-x count=5".to_string()]);
    assert_eq!(seen[0], seen[1]);
}

#[guard_test(needs = [root])]
fn without_bpf_privileges_the_guard_falls_back_to_procfs_and_says_why() {
    let _g = setup();
    use std::os::unix::process::CommandExt;
    let home = Home::new();
    home.write_config(&config(2, "1h"));
    let exe = home.probe_named("agentihooks");
    let _pile: Vec<Probe> = (0..2).map(|_| Probe::spawn(&exe, &[], TEST_UID)).collect();
    let mut child = std::process::Command::new(guard_bin())
        .args(["run", "--user", TEST_USER, "--interval", "1s", "--home"])
        .arg(home.path())
        .uid(TEST_UID)
        .gid(TEST_UID)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let log = home.wait_log(WAIT, |l| l.contains("TICK_COMPLETE"));
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().unwrap();
    let warn = lines(&log, "WARN");
    assert!(warn.iter().any(|l| l.ends_with("WARN backend_fallback reason=permission_denied")), "{log}");
    assert!(log.contains("backend=procfs"), "{log}");
    assert!(log.contains("FLAGGED name=agentihooks count=2 first_flagged=now"), "{log}");
}

#[guard_test(needs = [root])]
fn an_explicit_ebpf_backend_without_privileges_fails_instead_of_falling_back() {
    let _g = setup();
    use std::os::unix::process::CommandExt;
    let home = Home::new();
    home.write_config(&config(2, "1h"));
    let out = std::process::Command::new(guard_bin())
        .args(["run", "--backend", "ebpf", "--user", TEST_USER, "--home"])
        .arg(home.path())
        .uid(TEST_UID)
        .gid(TEST_UID)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("permission_denied") || err.contains("needs root"), "{err}");
    assert!(home.log().contains("STOPPED reason=error"), "{}", home.log());
}

guard_test::main!();
