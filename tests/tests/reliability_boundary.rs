//! The reliability suite, part two: the privilege boundary and pid reuse (see reliability.rs).
use std::{
    fs,
    os::unix::{
        fs::{MetadataExt, PermissionsExt},
        process::CommandExt,
    },
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use integration_tests::*;

mod reliability_common;
use reliability_common::*;

// ---------------------------------------------------------------------------------------------
// 4. Privilege boundary (item 7)
// ---------------------------------------------------------------------------------------------

/// A daemon whose stdout (the log's echo) goes to `out`: the log itself may be a planted link
/// the daemon rightly refuses to write.
fn daemon_echoing_to(home: &Home, out: &Path, extra: &[&str]) -> Daemon {
    let mut cmd = Command::new(guard_bin());
    cmd.arg("run").args(["--user", TEST_USER, "--home"]).arg(home.path()).args(["--interval", "1s"]).args(extra);
    cmd.stdout(fs::File::create(out).unwrap()).stderr(Stdio::inherit());
    Daemon { child: cmd.spawn().unwrap() }
}

fn wait_file(path: &Path, timeout: Duration, pred: impl Fn(&str) -> bool) -> String {
    let end = Instant::now() + timeout;
    loop {
        let s = fs::read_to_string(path).unwrap_or_default();
        if pred(&s) || Instant::now() > end {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[guard_test(needs = [root])]
fn planted_links_other_uids_and_the_daemon_itself_are_never_touched() {
    let _g = setup();
    warn_about_other_guards("privilege boundary");
    let home = Home::new();
    let secret = tempfile::Builder::new().prefix("guard-secret-").tempdir_in("/tmp").unwrap();
    fs::set_permissions(secret.path(), fs::Permissions::from_mode(0o700)).unwrap();
    let echo_dir = tempfile::tempdir().unwrap();
    let echo = echo_dir.path().join("stdout");
    let mut outside: Vec<(PathBuf, Vec<u8>)> = Vec::new();
    let mut plant = |name: &str, mode: u32| {
        let p = secret.path().join(name);
        let bytes = format!("precious {name}\n").into_bytes();
        fs::write(&p, &bytes).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
        outside.push((p.clone(), bytes));
        p
    };
    let s_log = plant("log", 0o644);
    let s_state = plant("state", 0o644);
    let s_status = plant("status", 0o644);
    let s_rot = plant("rotated", 0o644);
    let h_log = plant("hard-log", 0o666);
    let h_state = plant("hard-state", 0o666);
    let h_status = plant("hard-status", 0o644);
    let h = |n: &str| home.path().join(n);
    use std::os::unix::fs::symlink;
    symlink(&s_log, h("guard-daemon.log")).unwrap();
    symlink(&s_state, h("guard-daemon-state.json")).unwrap();
    symlink(&s_status, h("guard-status.json")).unwrap();
    home.write_config(r#"{"threshold": 3, "timeout": "1s", "excludes": []}"#);

    let rec = record_dir(&home);
    let exe = home.probe_named("pile");
    let mine_rec = rec.join("mine");
    let theirs_rec = rec.join("theirs");
    let mut mine: Vec<Probe> =
        (0..3).map(|_| Probe::spawn(&exe, &["record", mine_rec.to_str().unwrap()], TEST_UID)).collect();
    let mut theirs: Vec<Probe> =
        (0..4).map(|_| Probe::spawn(&exe, &["record", theirs_rec.to_str().unwrap()], OTHER_UID)).collect();

    // Stage 1: symlinks at the log, the state and the status file.
    let mut daemon = daemon_echoing_to(&home, &echo, &[]);
    let daemon_pid = daemon.child.id();
    let out = wait_file(&echo, WAIT, |s| lines(s, "KILLED").len() >= 3 && lines(s, "TICK_COMPLETE").len() >= 4);
    for p in &mut mine {
        assert!(p.wait_dead(Duration::from_secs(5)), "own pile survived\n{out}");
    }
    assert!(
        fs::symlink_metadata(h("guard-daemon.log")).unwrap().file_type().is_symlink(),
        "the log link was replaced?"
    );
    for f in ["guard-daemon-state.json", "guard-status.json"] {
        let m = fs::symlink_metadata(h(f)).unwrap();
        assert!(m.file_type().is_file() && m.uid() == TEST_UID && m.nlink() == 1, "{f}: {m:?}");
    }

    // Stage 2: hard links to root-owned files (one of them world-writable) at the same paths,
    // and a name that gets flagged (so the state file is written again).
    for (f, target) in
        [("guard-daemon.log", &h_log), ("guard-daemon-state.json", &h_state), ("guard-status.json", &h_status)]
    {
        fs::remove_file(h(f)).unwrap();
        fs::hard_link(target, h(f)).unwrap();
    }
    home.write_config(r#"{"threshold": 2, "timeout": "1h", "excludes": []}"#);
    let flagme = home.probe_named("flagme");
    let _flagged: Vec<Probe> = (0..2).map(|_| Probe::spawn(&flagme, &[], TEST_UID)).collect();
    let ticks = lines(&fs::read_to_string(&echo).unwrap(), "TICK_COMPLETE").len();
    let out =
        wait_file(&echo, WAIT, |s| s.contains("FLAGGED name=flagme") && lines(s, "TICK_COMPLETE").len() >= ticks + 3);
    assert!(out.contains("FLAGGED name=flagme count=2 first_flagged=now"), "{out}");
    let state = fs::read_to_string(h("guard-daemon-state.json")).unwrap();
    assert!(state.contains("flagme"), "state not rewritten beside the hard link: {state}");

    // Stage 3: a real log that rotates, with a symlink planted at the rotation target.
    fs::remove_file(h("guard-daemon.log")).unwrap();
    symlink(&s_rot, h("guard-daemon.log.1")).unwrap();
    home.write_config(r#"{"threshold": 2, "timeout": "1h", "excludes": [], "logMaxSizeMB": 0.0002}"#);
    let ticks = lines(&fs::read_to_string(&echo).unwrap(), "TICK_COMPLETE").len();
    let out = wait_file(&echo, WAIT, |s| lines(s, "TICK_COMPLETE").len() >= ticks + 4);
    let rotated = fs::symlink_metadata(h("guard-daemon.log.1")).unwrap();
    assert!(
        rotated.file_type().is_file() && rotated.uid() == TEST_UID,
        "rotation did not replace the link: {rotated:?}"
    );

    // The daemon is alive, never named itself, and nothing outside changed.
    assert!(matches!(daemon.child.try_wait(), Ok(None)), "the daemon died\n{out}");
    assert!(!out.contains(&format!("pid={daemon_pid} ")), "the daemon acted on itself\n{out}");
    daemon.stop();
    for (p, bytes) in &outside {
        assert_eq!(&fs::read(p).unwrap(), bytes, "{} changed", p.display());
        let m = fs::metadata(p).unwrap();
        assert_eq!(m.uid(), 0, "{} changed owner", p.display());
    }
    for p in &mut theirs {
        assert!(p.is_alive(), "another uid's process was ended\n{out}");
        assert!(!out.contains(&format!("pid={} ", p.pid())), "another uid's process was acted on\n{out}");
    }
    assert_eq!(record_of(&theirs_rec), "", "another uid's process received a signal");
    let got = record_of(&mine_rec);
    for p in &mine {
        assert!(got.contains(&format!("{} 15\n", p.pid())), "own probe {} recorded no SIGTERM: {got:?}", p.pid());
    }
    for entry in fs::read_dir(home.path()).unwrap() {
        let m = fs::symlink_metadata(entry.as_ref().unwrap().path()).unwrap();
        let name = entry.unwrap().file_name();
        if name.to_string_lossy().starts_with("guard-") && name != "guard-config.json" && !m.file_type().is_symlink() {
            assert_eq!(m.uid(), TEST_UID, "{name:?} is not the account's");
        }
    }
    eprintln!("privilege boundary: {} planted targets unchanged, 4 other-uid probes unsignalled, daemon pid {daemon_pid} untouched", outside.len());
}

// ---------------------------------------------------------------------------------------------
// 5. PID reuse (item 2), best effort
// ---------------------------------------------------------------------------------------------

/// `exe args…` as the test account, as pid 1 of a new pid namespace (`guard-probe pidns`: the
/// probe's parent unshares and forks; the child drops to the account and execs).
fn spawn_in_pid_ns(exe: &Path, args: &[&str], wait_ready: bool) -> Probe {
    let mut cmd = Command::new(probe_bin());
    cmd.arg("pidns").arg(TEST_UID.to_string()).arg(exe).args(args).stdin(Stdio::null()).process_group(0);
    cmd.stdout(if wait_ready { Stdio::piped() } else { Stdio::null() });
    let mut child = cmd.spawn().expect("guard-probe pidns");
    if wait_ready {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
    }
    Probe { child }
}

/// The host pid of the test account's process named `name` whose parent is `parent`.
fn host_child_named(parent: u32, name: &str) -> Option<u32> {
    for e in fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some(close) = stat.rfind(')') else { continue };
        let comm = &stat[stat.find('(').unwrap() + 1..close];
        let ppid: u32 = stat[close + 2..].split(' ').nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        if comm == name && ppid == parent {
            return Some(pid);
        }
    }
    None
}

#[guard_test(needs = [root])]
fn under_pid_churn_in_child_namespaces_only_the_enforced_name_is_signalled() {
    let _g = setup();
    warn_about_other_guards("pid reuse");
    let home = Home::new();
    // Threshold 5: the two churn loops are at most 4 `sh` (each shell and its fork before exec).
    home.write_config(r#"{"threshold": 5, "timeout": "2s", "excludes": []}"#);
    let rec = record_dir(&home);
    let victim = home.probe_named("victim");
    let bystander = home.probe_named("bystander");
    let by_rec = rec.join("bystander");
    let v_rec = rec.join("victim");
    // Three bystanders (below the threshold), each pid 1 of its own namespace, recording signals.
    let mut bystanders: Vec<Probe> =
        (0..3).map(|_| spawn_in_pid_ns(&bystander, &["record", by_rec.to_str().unwrap()], true)).collect();
    let by_hosts: Vec<u32> =
        bystanders.iter().map(|b| host_child_named(b.pid(), "bystander").expect("host pid of a bystander")).collect();
    // The daemon is up (its first tick done) before the churn starts: under TCG two busy
    // fork/exec loops on two vCPUs can otherwise hold its start-up past the test's waits.
    let daemon = Daemon::start(&home, &[]);
    home.wait_log(WAIT * 3, |l| !lines(l, "TICK_COMPLETE").is_empty());
    // Churn: shells that exec /bin/true in a loop, in their own namespaces.
    let _churn: Vec<Probe> =
        (0..2).map(|_| spawn_in_pid_ns(Path::new("/bin/sh"), &["-c", "while :; do /bin/true; done"], false)).collect();
    let rounds = 3;
    let mut victims_killed = 0;
    for round in 0..rounds {
        // The last round's flag clock must be gone first (a tick saw the name below the
        // threshold), or this round's first victims would be ended before the rest exist.
        let end = Instant::now() + WAIT * 3;
        while home.state().is_some_and(|s| !s["flagged"]["victim"].is_null()) {
            assert!(Instant::now() < end, "round {round}: the victim clock never cleared\n{}", home.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        let offset = home.log().len();
        let mut vs: Vec<(Probe, u32)> = (0..6)
            .map(|_| {
                let p = spawn_in_pid_ns(&victim, &["record", v_rec.to_str().unwrap()], true);
                // The probe is the child of `guard-probe pidns`.
                let host = host_child_named(p.pid(), "victim").expect("host pid of the victim");
                (p, host)
            })
            .collect();
        let log = home.wait_log(WAIT * 3, |l| lines(&l[offset..], "KILLED").len() >= 6);
        for (p, host) in &mut vs {
            assert!(
                log[offset..].contains(&format!("KILLED pid={host} name=victim ")),
                "round {round}: victim {host} not killed\n{log}"
            );
            assert!(p.wait_dead(Duration::from_secs(5)), "round {round}: victim {host} alive");
            victims_killed += 1;
        }
        assert_eq!(record_of(&by_rec), "", "round {round}: a process of another name received a signal\n{log}");
    }
    let log = home.log();
    daemon.stop();
    for b in &mut bystanders {
        let st = b.child.try_wait();
        assert!(
            matches!(st, Ok(None)),
            "a bystander's namespace ended ({st:?}), record {:?}\n{log}",
            record_of(&by_rec)
        );
    }
    assert_eq!(record_of(&by_rec), "", "a process of another name received a signal\n{log}");
    for l in lines(&log, "KILLED").into_iter().chain(lines(&log, "DRY_RUN")) {
        assert!(!by_hosts.iter().any(|h| l.contains(&format!(" pid={h} "))), "a bystander was ended: {l}\n{log}");
        if !l.contains(" name=victim ") {
            // Not one of ours: a process of the test account from a concurrent run on this host.
            eprintln!("pid reuse: WARNING a foreign process of {TEST_USER} was ended: {l}");
        }
    }
    let recorded = record_of(&v_rec).lines().count();
    eprintln!(
        "pid churn: {rounds} rounds, {victims_killed} victims killed ({recorded} recorded SIGTERMs), 3 bystanders unsignalled; \
         host pids are not recycled by this test (child pid namespaces recycle their own pids only)"
    );
}

/// The comm and state of `pid`, if it exists.
fn comm_and_state(pid: u32) -> Option<(String, char)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.rfind(')')?;
    Some((stat[stat.find('(')? + 1..close].to_string(), stat[close + 2..].chars().next()?))
}

/// Item 2 with real host pid reuse, in a throwaway guest kernel only: `kernel.pid_max` is lowered
/// and a same-account churner fills the whole pid space with recording bystanders, retrying fork
/// without pause, so the pid of every victim the guard ends is taken by a bystander the moment
/// the victim is reaped — inside the guard's SIGTERM → 0.5 s → SIGKILL window. The guard must
/// signal no bystander (not even SIGKILL: they are all checked alive at the end) and keep ticking
/// with the pid space exhausted (a fork bomb is exactly when it must act).
#[guard_test(needs = [root, guest])]
fn with_host_pids_reused_within_the_kill_window_no_bystander_is_signalled() {
    let _g = setup();
    let home = Home::new();
    home.write_config(r#"{"threshold": 4, "timeout": "1s", "excludes": ["bystander"]}"#);
    let rec = record_dir(&home);
    let (v_rec, by_rec, list) = (rec.join("victim"), rec.join("bystander"), rec.join("bystander-pids"));
    let victim = home.probe_named("victim");
    let bystander = home.probe_named("bystander");
    let mut daemon = Daemon::start(&home, &[]);
    home.wait_log(WAIT, |l| lines(l, "TICK_COMPLETE").len() >= 2);

    // Far below every pid in use after the earlier tests, so allocation wraps to 300: the victims
    // get pids under the new limit (a freed pid at or over it would never be handed out again),
    // and the churner fills the rest of [300, 1024) in a second or two.
    let pid_max = PidMax::lower_to(1024);
    let offset = home.log().len();
    let mut victims: Vec<Probe> =
        (0..6).map(|_| Probe::spawn(&victim, &["record", v_rec.to_str().unwrap()], TEST_UID)).collect();
    let victim_pids: Vec<u32> = victims.iter().map(|p| p.pid()).collect();
    assert!(victim_pids.iter().all(|&p| p < 1024), "victim pids {victim_pids:?} not under the lowered pid_max");
    let mut churner = Command::new(&bystander)
        .args(["churn", list.to_str().unwrap(), by_rec.to_str().unwrap()])
        .uid(TEST_UID)
        .gid(TEST_UID)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("churner");
    {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(churner.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "full", "the churner never exhausted the pid space");
    }
    let churner = Probe { child: churner };

    // The guard ends the victims; each is reaped here as soon as it exits, freeing its pid.
    let end = Instant::now() + WAIT;
    while victims.iter_mut().any(|v| v.is_alive()) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    // Past every SIGKILL deadline (the tick that signalled them waited its 0.5 s before its
    // SIGKILLs and completed), and two more ticks with the pid space still exhausted.
    let ticks_at_death = lines(&home.log()[offset..], "TICK_COMPLETE").len();
    home.wait_log(WAIT, |l| lines(&l[offset..], "TICK_COMPLETE").len() > ticks_at_death);
    let ticks_before = lines(&home.log()[offset..], "TICK_COMPLETE").len();
    let log = home.wait_log(WAIT, |l| lines(&l[offset..], "TICK_COMPLETE").len() >= ticks_before + 2);
    let daemon_alive = matches!(daemon.child.try_wait(), Ok(None));

    let pids: Vec<u32> = fs::read_to_string(&list).unwrap().lines().map(|l| l.parse().unwrap()).collect();
    let not_alive: Vec<(u32, Option<(String, char)>)> = pids
        .iter()
        .map(|&p| (p, comm_and_state(p)))
        .filter(|(_, cs)| !matches!(cs, Some((c, s)) if c == "bystander" && *s != 'Z'))
        .collect();
    drop(churner);
    drop(pid_max);
    daemon.stop();

    let after = &log[offset..];
    assert!(daemon_alive, "the daemon died with the pid space exhausted\n{log}");
    for (i, v) in victims.iter_mut().enumerate() {
        assert!(!v.is_alive(), "victim {} survived\n{after}", victim_pids[i]);
        assert!(
            after.contains(&format!("KILLED pid={} name=victim ", victim_pids[i])),
            "victim {} not logged\n{after}",
            victim_pids[i]
        );
    }
    let reused: Vec<u32> = victim_pids.iter().copied().filter(|p| pids.contains(p)).collect();
    assert_eq!(record_of(&by_rec), "", "a bystander received a signal\n{after}");
    assert!(not_alive.is_empty(), "bystanders died or changed: {not_alive:?}\n{after}");
    for l in lines(after, "KILLED").into_iter().chain(lines(after, "DRY_RUN")) {
        assert!(l.contains(" name=victim "), "something other than a victim was ended: {l}");
    }
    assert!(
        !reused.is_empty(),
        "no victim pid was reused by a bystander (pids {victim_pids:?}); the test proved nothing"
    );
    eprintln!(
        "host pid reuse: pid_max 1024 exhausted by {} bystanders; {}/{} victim pids taken by a bystander right after the \
         victim was reaped; 0 bystanders signalled, daemon ticked on",
        pids.len(),
        reused.len(),
        victim_pids.len()
    );
}

guard_test::main!();
