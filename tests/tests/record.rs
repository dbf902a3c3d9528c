//! `guard-user record` against the real kernel, and its trace replayed through the daemon
//! without a kernel: the replay must reach the verdicts the real processes call for. With
//! `GUARD_RECORD_FIXTURES=<dir>` the recording is also kept there (how guard-user/tests/fixtures'
//! recorded traces were made; see DEVELOPERS.md).
use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::Duration,
};

use guard::{
    account::Account,
    daemon::{
        recording::{Recorder, RecordingNotifier},
        run_with, Backend, Control, DaemonOptions,
    },
    trace::{Trace, TraceSource},
};
use integration_tests::*;

/// Records `TEST_USER` for `seconds` while `workload` runs; returns the trace (kept as
/// `<GUARD_RECORD_FIXTURES>/<keep_as>` when that is set).
fn record(seconds: u32, keep_as: &str, workload: impl FnOnce()) -> Trace {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("rec.trace");
    let mut rec = Command::new(guard_bin())
        .args(["record", "--user", TEST_USER, "--seconds", &format!("{seconds}s"), "--out"])
        .arg(&out)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(rec.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "recording");
    workload();
    assert!(rec.wait().unwrap().success());
    let trace = Trace::open(&out).unwrap();
    if let Some(keep) = std::env::var_os("GUARD_RECORD_FIXTURES") {
        let name = std::path::Path::new(&keep).join(keep_as);
        std::fs::copy(&out, &name).unwrap();
        eprintln!("kept {}", name.display());
    }
    trace
}

/// Replays `trace` under `config` for `secs` (virtual), returning the log bodies and signals.
fn replay(trace: Trace, config: &str, secs: u64) -> (Vec<String>, Vec<(bool, Vec<u32>)>) {
    replay_every(trace, config, secs, Duration::from_secs(60))
}

/// [`replay`] with ticks every `interval`.
fn replay_every(trace: Trace, config: &str, secs: u64, interval: Duration) -> (Vec<String>, Vec<(bool, Vec<u32>)>) {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("guard-config.json"), config).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let opts = DaemonOptions {
        account: Account { name: TEST_USER.into(), uid: TEST_UID, gid: TEST_UID, home: home.path().into() },
        config_path: home.path().join("guard-config.json"),
        home: home.path().into(),
        dry_run: false,
        interval,
        backend: Backend::Auto,
        audit_interval: Duration::from_secs(600),
        ring_bytes: None,
        deadline_timer: true,
        metrics_file: None,
    };
    let rec = Recorder::default();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
    rt.block_on(async {
        let source = TraceSource::new(trace, rec.procs.0.clone());
        let (tx, mut rx) = tokio::sync::mpsc::channel(2);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(secs)).await;
            let _ = tx.send(Control::Stop).await;
        });
        run_with(opts, source, rec.effects(1_800_000_000.0), &mut RecordingNotifier::default(), &mut rx).await
    });
    let calls = rec.signals.calls.lock().unwrap().clone();
    (rec.log.bodies(), calls)
}

#[guard_test(needs = [root, ebpf])]
fn a_recorded_pile_replays_to_the_verdicts_its_processes_call_for() {
    let _g = setup();
    let home = Home::new();
    let exe = home.probe_named("agentihooks");
    let other = home.probe_named("helper");
    let mut probes: Vec<Probe> = Vec::new();
    let trace = record(4, "recorded-pile.trace", || {
        for i in 0..4 {
            // The fourth renames itself once started (prctl): the kernel reports it (task_rename).
            let args: &[&str] = if i == 3 { &["watch", "x", "rename", "renamed"] } else { &["watch"] };
            probes.push(Probe::spawn(&exe, args, TEST_UID));
        }
        probes.push(Probe::spawn(&exe, &["select-profile", "coder"], TEST_UID));
        probes.push(Probe::spawn(&exe, &["swarm", "tick"], TEST_UID));
        probes.push(Probe::spawn(&other, &["threads", "6"], TEST_UID));
        probes.push(Probe::spawn(&other, &["forks", "1"], TEST_UID));
        probes.push(Probe::spawn(&exe, &["watch"], OTHER_UID));
        // One of the pile exits.
        drop(probes.remove(2));
        std::thread::sleep(Duration::from_millis(500));
    });
    assert!(trace.records.len() > 10, "{} records", trace.records.len());
    // Replay: agentihooks = 2 of the watch pile + the wrapper + swarm tick = 4 ≥ 4, ended at once.
    let (log, signals) = replay(trace, r#"{"threshold": 4, "timeout": "0s", "excludes": []}"#, 90);
    // After the exit: [0] [1] the watch pile, [2] renamed, [3] wrapper, [4] swarm tick,
    // [5] threads, [6] forks, [7] another uid.
    let wrapper = probes[3].pid();
    let tick = probes[4].pid();
    assert!(log.contains(&"FLAGGED name=agentihooks count=4 first_flagged=now".to_string()), "{log:#?}");
    assert!(log.contains(&format!("SKIPPED pid={wrapper} name=agentihooks reason=excluded_command")), "{log:#?}");
    assert!(log.contains(&format!("SKIPPED pid={tick} name=agentihooks reason=excluded_command")), "{log:#?}");
    let ended: Vec<u32> = signals.iter().flat_map(|(_, p)| p.clone()).collect();
    let mut want = vec![probes[0].pid(), probes[1].pid()];
    want.sort_unstable();
    assert_eq!(ended, want, "{log:#?}");
    // helper: 1 threaded process (once) + the forker and its child = 3, below 4.
    assert!(!log.iter().any(|l| l.contains("name=helper")), "{log:#?}");
    assert!(!log.iter().any(|l| l.contains(&format!("pid={} ", probes[7].pid()))), "another uid: {log:#?}");
    assert!(!log.iter().any(|l| l.contains(&format!("pid={} ", probes[2].pid()))), "the renamed one: {log:#?}");
}

#[guard_test(needs = [root, ebpf])]
fn a_recorded_fork_storm_replays_without_ghosts() {
    let _g = setup();
    let home = Home::new();
    let exe = home.probe_named("steady");
    let mut steady: Vec<Probe> = Vec::new();
    // 10 s: the storm must end inside the recording, or its last live processes are in the trace
    // (a TCG guest once needed over 3 s for it).
    let mut storm_took = Duration::ZERO;
    let trace = record(10, "recorded-storm.trace", || {
        steady.extend((0..3).map(|_| Probe::spawn(&exe, &[], TEST_UID)));
        let t = std::time::Instant::now();
        fork_storm(2, 250, TEST_UID);
        storm_took = t.elapsed();
    });
    assert!(storm_took < Duration::from_secs(9), "the storm took {storm_took:?}, longer than the recording");
    let events = trace.records.iter().filter(|(_, r)| matches!(r, guard::trace::Record::Event { .. })).count();
    // About 1,000 (a fork and an exit per child); a loaded guest's ring may drop a few, which the
    // trace records as lost and the replay resyncs: what matters is a storm, then no ghosts.
    assert!(events >= 500, "{events} events");
    let left_live = live_at_the_end(&trace);
    let (log, signals) = replay(trace, r#"{"threshold": 3, "timeout": "1h", "excludes": []}"#, 90);
    let flagged: Vec<&String> = log.iter().filter(|l| l.starts_with("FLAGGED")).collect();
    assert_eq!(flagged, ["FLAGGED name=steady count=3 first_flagged=now"], "{log:#?}\n{left_live}");
    assert!(signals.is_empty());
}

/// A session root recorded from the real kernel (a setsid child that execs, a double-forked
/// grandchild, an excluded name, a child that renames itself, then the root's exit), replayed with
/// `sessions`: every one of them is a leftover of the root, whatever it did after its fork.
#[guard_test(needs = [root, ebpf])]
fn a_recorded_session_replays_to_its_leftovers() {
    let _g = setup();
    let home = Home::new();
    for name in ["agent-wrapper", "watcher", "daemonish", "claude"] {
        home.probe_named(name);
    }
    let dir = home.path().join("bin");
    use std::os::unix::{fs::PermissionsExt, process::CommandExt};
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut root_pid = 0;
    let trace = record(6, "recorded-session.trace", || {
        let mut root = Command::new(dir.join("agent-wrapper"))
            .args(["session", dir.to_str().unwrap(), "0"])
            .uid(TEST_UID)
            .gid(TEST_UID)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        root_pid = root.id();
        let mut line = String::new();
        BufReader::new(root.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        // Alive for more than a replayed tick (1 s), then it ends.
        std::thread::sleep(Duration::from_millis(2500));
        use std::io::Write;
        root.stdin.take().unwrap().write_all(b"go\n").unwrap();
        root.wait().unwrap();
        std::thread::sleep(Duration::from_millis(500));
    });
    let pids: Vec<u32> = std::fs::read_to_string(dir.join("pids"))
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(1)?.parse().ok())
        .collect();
    for pid in &pids {
        unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
    }
    let config = r#"{"threshold": 1000, "excludes": ["claude"],
        "sessions": {"roots": ["(^|/)agent-wrapper session "], "leftovers": "stop", "grace": "1s"}}"#;
    let (log, _) = replay_every(trace, config, 40, Duration::from_secs(1));
    let leftovers: Vec<&String> = log.iter().filter(|l| l.starts_with("LEFTOVER")).collect();
    assert_eq!(leftovers.len(), 4, "{log:#?}");
    for name in ["watcher", "daemonish", "claude", "renamed"] {
        assert!(leftovers.iter().any(|l| l.contains(&format!(" name={name} root={root_pid} "))), "{name}: {log:#?}");
    }
    let reaped: Vec<&String> = log.iter().filter(|l| l.starts_with("REAPED")).collect();
    assert_eq!(reaped.len(), 1, "{log:#?}");
    assert!(reaped[0].starts_with(&format!("REAPED root={root_pid} name=agent-wrapper ")), "{log:#?}");
}

/// For a failure message: the processes the trace leaves alive (scan, then every event by
/// identity, as the table applies them), each with its records.
fn live_at_the_end(trace: &Trace) -> String {
    use guard::{event::Event, trace::Record};
    let mut live: std::collections::BTreeMap<(u32, u64), String> = Default::default();
    let mut history: std::collections::BTreeMap<u32, Vec<String>> = Default::default();
    let mut lost = 0;
    for (t, r) in &trace.records {
        match r {
            Record::Scan(procs) => {
                live.clear();
                for p in procs {
                    live.insert((p.id.pid, p.id.start_ticks), format!("{:?}", p.comm));
                }
            }
            Record::Event { event, lost } => {
                let pid = match event {
                    Event::Fork { child: s, .. } | Event::State { state: s, .. } => {
                        live.insert((s.id.pid, s.id.start_ticks), format!("{:?}", s.comm));
                        s.id.pid
                    }
                    Event::Exit(id) => {
                        live.remove(&(id.pid, id.start_ticks));
                        id.pid
                    }
                };
                history.entry(pid).or_default().push(format!("{t:.3}s {event:?} lost={lost}"));
            }
            Record::Cmdline { .. } | Record::Parents(_) => {}
            Record::Lost(n) => lost += n,
        }
    }
    let mut out = format!("{} processes alive at the end of the trace ({lost} events lost):\n", live.len());
    for ((pid, start), comm) in &live {
        out += &format!("  pid {pid} start {start} {comm}\n");
        for h in history.get(pid).into_iter().flatten() {
            out += &format!("    {h}\n");
        }
    }
    out
}

guard_test::main!();
