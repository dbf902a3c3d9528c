//! A hostile account against the real daemon under the unit's limits (`MemoryMax=64M`,
//! `TasksMax=32`; docs/architecture.md, "Bounds"): every known attack shape at once, and a
//! control pile of one plain name that must still be ended on time.
//!
//! The shapes, all started before the control pile so they are flagged first (their names are
//! read and matched first):
//! - a 1 MiB command line shared by 100 processes (one exec, 99 forks; 300 in the long form);
//! - nine distinct 1 MiB command lines (six, two longer than the matcher takes, and one of a
//!   process that maps 1 GiB and flips its protection in a loop, so its command line is slow to
//!   read; 16 + 2 + 1 of 8 GiB in the long form);
//! - 60 execs of a session root with a 1 MiB command line each (`sessions` on; 200 in the long
//!   form);
//! - six processes with an empty argv, six renamed to a 15-byte name of control bytes;
//! - costly `excludeCommands` (`(a*)*\1b{0,i}=`) and six processes with 3,000 `a`s in theirs;
//! - a 4 MiB state file of flag clocks 300 years ahead, and a config rewritten before every tick
//!   with 40,000 new unknown keys;
//! - a Redis endpoint on a loopback port the account listens on, answering every command with
//!   five bulk strings of 16 MiB.
//!
//! The hostile processes carry a marker a pattern protects (so they live on through the test);
//! the control pile does not. The test reports the daemon's peak memory (its cgroup's) and tick
//! times, and fails if the daemon dies, is OOM-killed, hangs, or the control pile is not ended
//! within its timeout and a few ticks. `GUARD_HOSTILE=long` makes every shape bigger (the
//! `cargo xtask bench --only hostile` figure runs it so, against the release build).
use std::{
    io::{Read, Write},
    net::TcpListener,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use integration_tests::{
    bounds::{config_with_unknown_keys, hostile_state, UnitCgroup, MEMORY_MAX, TASKS_MAX},
    *,
};

/// The interval the daemon runs at here.
const INTERVAL_SECS: u64 = 2;
/// The timeout of every pile.
const TIMEOUT_SECS: u64 = 16;
/// What protects the hostile processes (so the attack lasts): a pattern for this word.
const MARK: &str = "hostile-keep";

/// How big the shapes are: CI's form, or the bench's long one.
struct Scale {
    forks: usize,
    distinct: usize,
    roots: usize,
    slow_mib: usize,
}

impl Scale {
    fn get() -> Scale {
        if std::env::var("GUARD_HOSTILE").is_ok_and(|v| v == "long") {
            Scale { forks: 299, distinct: 16, roots: 200, slow_mib: 8192 }
        } else {
            Scale { forks: 99, distinct: 6, roots: 60, slow_mib: 1024 }
        }
    }
}

/// `pad <letter × 130,000>` pairs (the probe ignores them) making a command line of about
/// `args` × 130 kB, each argument under the kernel's 128 KiB per argument; `seed` varies the
/// letters so two seeds make two texts. Never `a`: the costly patterns backtrack on those.
fn pad(args: usize, seed: usize) -> Vec<String> {
    let mut out = vec!["mark".to_string(), MARK.to_string()];
    for i in 0..args {
        out.push("pad".into());
        out.push(char::from(b'b' + ((seed * 7 + i) % 24) as u8).to_string().repeat(130_000));
    }
    out
}

/// The config: five processes of a name flag it, every pile is due `TIMEOUT_SECS` later; the
/// shipped patterns, eight costly ones, the marker; session roots.
fn config() -> String {
    let mut patterns: Vec<String> = [
        "(^|[ /])agentihooks swarm tick( |$)",
        " -m scripts[.]swarm[.]scheduled_tick( |$)",
        "(^|[ /])agentihooks select-profile( |$)",
        "(^|[ /])agentihooks swarm (tick-watch|prober|waker)( |$)",
    ]
    .map(String::from)
    .to_vec();
    // Costly on a run of `a`s, and matching nothing the control pile's command line can hold:
    // it is the probe's path in a temporary directory with a random name, so a pattern ending
    // in a letter (`x`, as these once did) excluded the control pile whenever that name held it.
    patterns.extend((0..8).map(|i| format!("(a*)*\\1b{{0,{i}}}=")));
    patterns.push(format!(" {MARK}( |$)"));
    serde_json::json!({
        "threshold": 5,
        "timeout": format!("{TIMEOUT_SECS}s"),
        "warnBefore": 0,
        "excludes": [],
        "excludeCommands": patterns,
        "sessions": {"roots": ["(^|/)ghroot( |$)"], "leftovers": "report"},
    })
    .to_string()
}

/// A Redis endpoint the account listens on (the socket is made with its uid): every command is
/// answered with five bulk strings of 16 MiB, each under the per-piece cap the mirror had.
struct FakeRedis {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl FakeRedis {
    fn start() -> FakeRedis {
        // SAFETY: this thread's file-system uid only, set back right after.
        let old = unsafe { libc::setfsuid(TEST_UID) };
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        unsafe { libc::setfsuid(old as u32) };
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let Ok((mut stream, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                std::thread::spawn(move || {
                    let _ = stream.set_nonblocking(false);
                    let mut buf = [0u8; 4096];
                    if stream.read(&mut buf).unwrap_or(0) == 0 {
                        return;
                    }
                    let _ = stream.write_all(b"*5\r\n$16777215\r\n");
                    let chunk = vec![b'x'; 1 << 20];
                    // Until the reader gives up and closes.
                    for _ in 0..80 {
                        if stream.write_all(&chunk).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        FakeRedis { port, stop }
    }
}

impl Drop for FakeRedis {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Tick durations the status file reported, one per tick seen.
#[derive(Default)]
struct Ticks {
    seen: u64,
    secs: Vec<f64>,
}

impl Ticks {
    fn sample(&mut self, home: &Home) {
        let path = home.path().join("guard-status.json");
        let Ok(st) = guard::status::read(&path, guard::safefs::FsIdentity::current()) else { return };
        if st.ticks > self.seen {
            self.seen = st.ticks;
            if let Some(t) = st.vitals.and_then(|v| v.tick_duration_last_secs) {
                self.secs.push(t);
            }
        }
    }

    fn quantile(&self, q: f64) -> f64 {
        let mut v = self.secs.clone();
        v.sort_by(f64::total_cmp);
        v.get(((v.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0)
    }
}

#[guard_test(needs = [root, memory_cgroup])]
fn a_hostile_account_throws_every_shape_at_once_and_a_plain_pile_is_still_ended_on_time() {
    let _g = setup();
    let cg = UnitCgroup::new(MEMORY_MAX, Some(TASKS_MAX)).unwrap_or_else(|why| panic!("the unit's cgroup: {why}"));
    let scale = Scale::get();
    let home = Home::new();
    let state_path = home.path().join("guard-daemon-state.json");
    std::fs::write(&state_path, hostile_state()).unwrap();
    std::os::unix::fs::chown(&state_path, Some(TEST_UID), Some(TEST_UID)).unwrap();
    let valid = config();
    home.write_config(&config_with_unknown_keys(&valid, 0, 40_000));
    // Before every tick, a config with 40,000 keys the daemon has not seen, swapped in whole.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, dir, valid) = (stop.clone(), home.path().to_path_buf(), valid.clone());
        std::thread::spawn(move || {
            let mut generation = 1;
            while !stop.load(Ordering::Relaxed) {
                let tmp = dir.join("guard-config.json.new");
                std::fs::write(&tmp, config_with_unknown_keys(&valid, generation, 40_000)).unwrap();
                std::fs::rename(&tmp, dir.join("guard-config.json")).unwrap();
                generation += 1;
                std::thread::sleep(Duration::from_millis(1500));
            }
        })
    };
    let redis = FakeRedis::start();

    let mut probes: Vec<Probe> = Vec::new();
    let spawn = |exe: &std::path::Path, argv: Vec<String>| {
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        Probe::spawn(exe, &argv, TEST_UID)
    };
    // One 1 MiB command line, shared by 100 processes.
    let shared = home.probe_named("ghshared");
    probes.push(spawn(&shared, [vec!["forks".into(), scale.forks.to_string()], pad(8, 0)].concat()));
    // Distinct 1 MiB command lines, two past the matcher's cap, one slow to read.
    let mixed = home.probe_named("ghmixed");
    for i in 0..scale.distinct {
        probes.push(spawn(&mixed, pad(8, i + 1)));
    }
    for i in 0..2 {
        probes.push(spawn(&mixed, pad(9, 100 + i)));
    }
    probes.push(spawn(&mixed, [vec!["slow-memory".into(), scale.slow_mib.to_string()], pad(8, 200)].concat()));
    // Execs of a session root with 1 MiB each.
    let root = home.probe_named("ghroot");
    for i in 0..scale.roots {
        probes.push(spawn(&root, pad(8, 300 + i)));
    }
    // Empty argvs; a 15-byte name of control bytes; command lines the costly patterns choke on.
    let blank = home.probe_named("ghblank");
    for _ in 0..6 {
        probes.push(spawn(&blank, vec!["blank-cmdline".into(), "1".into()]));
    }
    let renamed = home.probe_named("ghrenamed");
    for _ in 0..6 {
        probes.push(spawn(
            &renamed,
            [vec!["rename-hex".into(), "78290a52091b5cff5c3d20281b0a29".into()], pad(0, 0)].concat(),
        ));
    }
    let costly = home.probe_named("ghcostly");
    for i in 0..6 {
        probes.push(spawn(&costly, [vec![format!("{i}"), "a".repeat(3000)], pad(0, 0)].concat()));
    }

    let env = [
        ("AGENTIHOOKS_LEDGER_MODE", "local"),
        ("AGENTIHOOKS_SWARM_REDIS_URL", &format!("redis://127.0.0.1:{}/0", redis.port)),
    ];
    let started = Instant::now();
    let mut d = cg.start_daemon(&home, &format!("{INTERVAL_SECS}s"), &env);
    let mut ticks = Ticks::default();
    // The control pile once the hostile names are flagged (so they are read and matched first).
    let log = poll(Duration::from_secs(120), || {
        let log = home.log();
        let flagged = log.contains(" FLAGGED name=ghshared count=") && log.contains(" FLAGGED name=ghroot count=");
        (flagged || !matches!(d.child.try_wait(), Ok(None)), log)
    });
    if !log.contains(" FLAGGED name=ghshared ") {
        let alive = matches!(d.child.try_wait(), Ok(None));
        eprintln!(
            "hostile: {}",
            serde_json::json!({"peak_mib": cg.peak().map(|b| b as f64 / 1048576.0), "oom_kills": cg.oom_kills(), "alive": alive, "ticks": 0})
        );
        panic!(
            "the hostile piles were never flagged (daemon alive: {alive}, OOM kills: {}):\n{}",
            cg.oom_kills(),
            tail(&log)
        );
    }
    let control = home.probe_named("ghcontrol");
    let mut pile: Vec<Probe> = (0..6).map(|_| Probe::spawn(&control, &[], TEST_UID)).collect();
    let first = poll(Duration::from_secs(240), || {
        ticks.sample(&home);
        let log = home.log();
        let done = lines(&log, "KILLED").iter().filter(|l| l.contains(" name=ghcontrol ")).count() >= 6
            || log.contains("STOPPED ");
        (done || !matches!(d.child.try_wait(), Ok(None)), log)
    });
    // Then every shape's own answer: a loaded host ends the control pile before it has read the
    // longest command lines (they are read after every short one, a few per tick).
    let protected = |log: &str, reason: &str| {
        lines(log, "SKIPPED").iter().any(|l| l.contains(" name=gh") && l.ends_with(&format!("reason={reason}")))
    };
    let control_done = lines(&first, "KILLED").iter().any(|l| l.contains(" name=ghcontrol "));
    let log = poll(Duration::from_secs(if control_done { 120 } else { 0 }), || {
        ticks.sample(&home);
        let log = home.log();
        let met = protected(&log, "cmdline_too_long")
            && protected(&log, "excluded_command")
            && lines(&log, "KILLED").iter().any(|l| l.contains(" name=ghblank "));
        (met || !matches!(d.child.try_wait(), Ok(None)), log)
    });
    ticks.sample(&home);
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let alive = matches!(d.child.try_wait(), Ok(None));
    let oom = cg.oom_kills();
    let peak = cg.peak();

    let mib = |b: u64| b as f64 / 1048576.0;
    let report = serde_json::json!({
        "peak_mib": peak.map(mib),
        "limit_mib": MEMORY_MAX >> 20,
        "tasks_peak": cg.tasks_peak(),
        "tasks_refused": cg.tasks_refused(),
        "ticks": ticks.secs.len(),
        "tick_secs_median": ticks.quantile(0.5),
        "tick_secs_max": ticks.secs.iter().copied().fold(0.0, f64::max),
        "oom_kills": oom,
        "seconds": started.elapsed().as_secs_f64(),
        "unread": lines(&log, "SKIPPED").iter().filter(|l| l.ends_with("reason=read_budget")).count(),
        // Why the control pile's processes were spared at the ticks before it was ended.
        "control_skipped": control_skips(&log),
    });
    eprintln!("hostile: {report}");

    assert!(alive && oom == 0, "the daemon died (OOM kills in its cgroup: {oom}):\n{}", tail(&log));
    assert!(!log.contains("STOPPED reason=hang"), "{}", tail(&log));
    // On time: ended within a few ticks of being due (an unread command line, an unsettled
    // match), counted in ticks, which a slow machine makes later, not fewer. The ticks before
    // it was due are not counted: every other name's deadline wakes a tick of its own, and the
    // long form flags a name more than a dozen times in the control pile's timeout. Due is
    // read from the log's clock: a tick whose line is stamped `TIMEOUT_SECS` after the flag's
    // began after the pile was due (the flag is set when its tick began, before its line).
    let flagged = log.find(" FLAGGED name=ghcontrol count=6 first_flagged=now").expect("the control pile was flagged");
    let killed: Vec<_> = lines(&log, "KILLED").into_iter().filter(|l| l.contains(" name=ghcontrol ")).collect();
    assert_eq!(killed.len(), 6, "the control pile was not ended:\n{}", control_story(&log, flagged));
    let last_kill = log.rfind(killed[5]).unwrap();
    let line_start = log[..flagged].rfind('\n').map_or(0, |i| i + 1);
    let due = stamp(&log[line_start..]).expect("a stamped FLAGGED line") + TIMEOUT_SECS;
    let window = lines(&log[flagged..last_kill], "TICK_COMPLETE");
    let late = window.iter().filter(|l| stamp(l).is_some_and(|t| t >= due)).count();
    let allowed = 4;
    assert!(
        late <= allowed,
        "ended {late} ticks after it was due ({} after its flag), at most {allowed}:\n{}",
        window.len(),
        control_story(&log, flagged)
    );
    assert!(pile.iter_mut().all(|p| p.wait_dead(Duration::from_secs(10))), "the control pile is gone");
    // Every shape was met, said, and bounded.
    for said in [
        "ERROR state_rejected path=",
        "WARN config_unknown_keys_unreported limit=256",
        "WARN redis_listener_owned_by_account endpoint=",
        "WARN redis_reply_rejected endpoint=",
    ] {
        assert!(log.contains(said), "no {said}:\n{}", tail(&log));
    }
    assert!(protected(&log, "cmdline_too_long") && protected(&log, "excluded_command"), "{}", tail(&log));
    assert!(lines(&log, "KILLED").iter().any(|l| l.contains(" name=ghblank ")), "an empty argv protects nothing");
    assert!(probes.iter_mut().any(|p| p.is_alive()), "the attack lasted");
    if let Some(peak) = peak {
        assert!(peak <= 48 << 20, "peak {:.1} MiB, over three quarters of the unit's limit", mib(peak));
    }
    let st = d.stop();
    assert_eq!(st.code(), Some(0), "{st:?}");
}

/// The last lines of a log, for a failure message.
/// The seconds a log line's `YYYY-MM-DD HH:MM:SS` stamp stands for (since 1970, as local time
/// is written: only differences are used).
fn stamp(line: &str) -> Option<u64> {
    let b = line.as_bytes();
    let num = |r: std::ops::Range<usize>| line.get(r)?.parse::<i64>().ok();
    if b.len() < 19 || b[4] != b'-' || b[10] != b' ' || b[13] != b':' {
        return None;
    }
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    let secs = days * 86_400 + num(11..13)? * 3600 + num(14..16)? * 60 + num(17..19)?;
    u64::try_from(secs).ok()
}

#[guard_test]
fn log_stamps_count_seconds_across_days_and_years() {
    let at = |s: &str| stamp(s).unwrap();
    assert_eq!(at("1970-01-01 00:00:00 X"), 0);
    assert_eq!(at("2026-12-05 19:38:42 TICK_COMPLETE") - at("2026-12-05 19:38:26 FLAGGED"), 16);
    assert_eq!(at("2025-01-01 00:00:05 X") - at("2024-12-31 23:59:55 X"), 10);
    assert_eq!(at("2024-03-01 00:00:00 X") - at("2024-02-28 00:00:00 X"), 2 * 86_400, "a leap year");
    assert_eq!(stamp("TICK_COMPLETE flagged=0"), None);
}

/// How often the control pile's processes were spared, by reason (`SKIPPED … reason=`).
fn control_skips(log: &str) -> std::collections::BTreeMap<String, usize> {
    let mut by = std::collections::BTreeMap::new();
    for l in lines(log, "SKIPPED").iter().filter(|l| l.contains(" name=ghcontrol ")) {
        let reason = l.rsplit_once("reason=").map_or("?", |(_, r)| r);
        *by.entry(reason.to_string()).or_insert(0) += 1;
    }
    by
}

/// What the log says of the control pile from its flag on (its own lines and every tick's
/// summary and warnings), then the tail: what a failure needs to tell a starved pile from a slow
/// one.
fn control_story(log: &str, from: usize) -> String {
    let start = log[..from].rfind('\n').map_or(0, |i| i + 1);
    let said: Vec<&str> = log[start..]
        .lines()
        .filter(|l| l.contains("ghcontrol") || l.contains(" TICK_COMPLETE ") || l.contains(" WARN "))
        .collect();
    format!("{}\n--- the log's tail:\n{}", said[said.len().saturating_sub(400)..].join("\n"), tail(log))
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

guard_test::main!();
