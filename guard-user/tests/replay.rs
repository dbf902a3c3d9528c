//! Recorded traces replayed through the whole daemon — pump, table, rebuilds, supervised tick
//! loop, decide, effects — on a paused tokio clock: no root, no kernel, exact lines and signals.
//! The fixtures are in tests/fixtures/ (see DEVELOPERS.md for how they were recorded).
use std::{path::PathBuf, time::Duration};

use guard::{
    account::Account,
    daemon::{
        recording::{Recorder, RecordingNotifier},
        run_with, Backend, Control, DaemonOptions, Stopped,
    },
    trace::{Trace, TraceSource},
};

/// What a replay did.
struct Replayed {
    /// Log bodies with the `STARTED` pid blanked.
    log: Vec<String>,
    rec: Recorder,
    notes: Vec<String>,
    stopped: Stopped,
}

impl Replayed {
    fn signals(&self) -> Vec<(bool, Vec<u32>)> {
        self.rec.signals.calls.lock().unwrap().clone()
    }

    fn lines(&self, event: &str) -> Vec<&str> {
        self.log.iter().map(String::as_str).filter(|l| l.split(' ').next() == Some(event)).collect()
    }
}

struct Setup<'a> {
    fixture: &'a str,
    config: &'a str,
    run_for: Duration,
    interval: Duration,
    dry_run: bool,
    prepare: &'a dyn Fn(&Recorder),
    /// Control messages sent at these offsets.
    controls: Vec<(Duration, Control)>,
    /// The config file is rewritten at these offsets.
    config_changes: Vec<(Duration, &'static str)>,
    /// (offset, pid, name, group CPU ns): what the stall watch's sampler reports from then on.
    cpu: Vec<(Duration, u32, &'static str, u64)>,
    /// (offset, seconds): the wall clock is stepped by this much then (NTP, `date`).
    wall_steps: Vec<(Duration, f64)>,
}

impl Default for Setup<'_> {
    fn default() -> Self {
        Setup {
            fixture: "",
            config: "{}",
            run_for: Duration::from_secs(290),
            interval: Duration::from_secs(60),
            dry_run: false,
            prepare: &|_| {},
            controls: Vec::new(),
            config_changes: Vec::new(),
            cpu: Vec::new(),
            wall_steps: Vec::new(),
        }
    }
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn replay(s: Setup) -> Replayed {
    let trace = Trace::open(&fixture(s.fixture)).unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("guard-config.json"), s.config).unwrap();
    // A world-readable home: under root the config is read with the (fake) account's identity.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let account = Account { name: "replay".into(), uid: trace.uid, gid: trace.uid, home: home.path().into() };
    let opts = DaemonOptions {
        config_path: home.path().join("guard-config.json"),
        home: home.path().into(),
        account,
        dry_run: s.dry_run,
        interval: s.interval,
        backend: Backend::Auto,
        audit_interval: Duration::from_secs(600),
        ring_bytes: None,
        deadline_timer: true,
        metrics_file: None,
    };
    let rec = Recorder::default();
    (s.prepare)(&rec);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
    let mut notifier = RecordingNotifier::default();
    let stopped = rt.block_on(async {
        let source = TraceSource::new(trace, rec.procs.0.clone());
        let fx = rec.effects(1_800_000_000.0);
        let (tx, mut rx) = tokio::sync::mpsc::channel(8);
        let config_path = home.path().join("guard-config.json");
        let changes = s.config_changes.clone();
        tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            for (at, text) in changes {
                tokio::time::sleep_until(start + at).await;
                std::fs::write(&config_path, text).unwrap();
            }
        });
        let (cpu_map, cpu) = (rec.cpu.0.clone(), s.cpu.clone());
        tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            for (at, pid, name, ns) in cpu {
                tokio::time::sleep_until(start + at).await;
                cpu_map.lock().unwrap().insert(pid, (guard::comm::Comm::new(name.as_bytes()), ns));
            }
        });
        let (step, steps) = (rec.wall_step.clone(), s.wall_steps.clone());
        tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            for (at, by) in steps {
                tokio::time::sleep_until(start + at).await;
                *step.lock().unwrap() += by;
            }
        });
        let mut controls = s.controls.clone();
        controls.push((s.run_for, Control::Stop));
        tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            for (at, c) in controls {
                tokio::time::sleep_until(start + at).await;
                let _ = tx.send(c).await;
            }
        });
        run_with(opts, source, fx, &mut notifier, &mut rx).await
    });
    let pid = format!(" pid={}", std::process::id());
    let log = rec
        .log
        .bodies()
        .into_iter()
        .map(|l| if l.starts_with("STARTED") { l.replace(&pid, " pid=P") } else { l })
        .collect();
    let notes = notifier.sent.lock().unwrap().clone();
    Replayed { log, rec, notes, stopped }
}

const PILE_CONFIG: &str = r#"{"threshold": 5, "timeout": "2m"}"#;

#[test]
fn a_pile_is_flagged_then_ended_at_its_timeout_sparing_the_excluded_wrappers() {
    let r = replay(Setup { fixture: "handmade-pile.trace", config: PILE_CONFIG, ..Default::default() });
    assert_eq!(
        r.log,
        [
            "STARTED version=0.1.0 backend=trace user=replay dry_run=0 pid=P",
            "RESYNC reason=startup lost=0",
            "TICK_COMPLETE flagged=0 kills=0 errors=0",
            "FLAGGED name=agentihooks count=5 first_flagged=now",
            "WARNING name=agentihooks count=5 due_in=2m ends=3 skips=2",
            "TICK_COMPLETE flagged=1 kills=0 errors=0",
            "FLAGGED name=agentihooks count=5 first_flagged=1m_ago",
            "TICK_COMPLETE flagged=1 kills=0 errors=0",
            "FLAGGED name=agentihooks count=5 first_flagged=2m_ago",
            "SKIPPED pid=102 name=agentihooks reason=excluded_command",
            "SKIPPED pid=105 name=agentihooks reason=excluded_command",
            "KILLED pid=101 name=agentihooks reason=ghost_detected count=5 elapsed=0.0h",
            "KILLED pid=103 name=agentihooks reason=ghost_detected count=5 elapsed=0.0h",
            "KILLED pid=104 name=agentihooks reason=ghost_detected count=5 elapsed=0.0h",
            "TICK_COMPLETE flagged=1 kills=3 errors=0",
            "TICK_COMPLETE flagged=0 kills=0 errors=0",
            "STOPPED reason=signal",
        ]
    );
    assert_eq!(r.signals(), vec![(false, vec![101, 103, 104])], "one batch: every target of the tick together");
    assert_eq!(r.stopped, Stopped::Signal);
    assert_eq!(r.notes.first().map(String::as_str), Some("READY=1"));
    let events = r.rec.mirror.events.lock().unwrap().clone();
    let kinds: Vec<_> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(kinds, ["FLAGGED", "warning", "SKIPPED", "SKIPPED", "KILLED", "KILLED", "KILLED"]);
    let warning = &events[1];
    assert_eq!(warning.name.as_deref(), Some("agentihooks"));
    assert_eq!(warning.count, Some(5));
    let extra: Vec<(&str, &str)> = warning.extra.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(extra, [("due_in", "2m"), ("ends", "3"), ("skips", "2")]);
}

#[test]
fn a_dry_run_verifies_and_logs_dry_run_but_sends_nothing() {
    let r = replay(Setup { fixture: "handmade-pile.trace", config: PILE_CONFIG, dry_run: true, ..Default::default() });
    assert_eq!(r.lines("DRY_RUN").len(), 3, "{:#?}", r.log);
    assert!(r.lines("KILLED").is_empty());
    assert!(r.log.contains(&"TICK_COMPLETE flagged=1 kills=0 errors=0".to_string()));
    assert!(r.signals().iter().all(|(dry, _)| *dry), "a dry run only verifies: {:?}", r.signals());
    assert!(r.log[0].contains("dry_run=1"));
}

#[test]
fn a_pattern_that_matches_everything_is_warned_once_per_list_and_honoured() {
    // `a||b` protects every process of the pile: flagged, warned, never ended. The warning is
    // said once for the list, and again when the config brings another such list.
    let config = r#"{"threshold": 5, "timeout": "2m", "excludeCommands": ["never-matches", "a||b"]}"#;
    let changed = r#"{"threshold": 5, "timeout": "2m", "excludeCommands": [".*"]}"#;
    let r = replay(Setup {
        fixture: "handmade-pile.trace",
        config,
        config_changes: vec![(Duration::from_secs(230), changed)],
        ..Default::default()
    });
    let warns: Vec<&str> = r.lines("WARN").into_iter().filter(|l| l.contains("pattern_matches_all")).collect();
    assert_eq!(warns, ["WARN pattern_matches_all index=1", "WARN pattern_matches_all index=0"], "{:#?}", r.log);
    assert!(r.lines("KILLED").is_empty() && r.signals().is_empty(), "{:#?}", r.log);
    assert_eq!(r.lines("SKIPPED").len(), 5, "every process of the enforced pile is protected: {:#?}", r.log);
    // The shipped list warns nothing.
    let r = replay(Setup { fixture: "handmade-pile.trace", config: PILE_CONFIG, ..Default::default() });
    assert!(!r.log.iter().any(|l| l.contains("pattern_matches_all")), "{:#?}", r.log);
}

#[test]
fn a_process_that_changes_identity_after_sigterm_is_not_logged_killed() {
    let r = replay(Setup {
        fixture: "handmade-pile.trace",
        config: PILE_CONFIG,
        prepare: &|rec| {
            rec.signals.survivors.lock().unwrap().insert(103);
        },
        ..Default::default()
    });
    assert!(r.log.contains(&"SKIPPED pid=103 name=agentihooks reason=identity_changed".to_string()), "{:#?}", r.log);
    assert_eq!(r.lines("KILLED").len(), 2);
    assert!(r.log.contains(&"TICK_COMPLETE flagged=1 kills=2 errors=0".to_string()));
}

#[test]
fn an_unwritable_state_file_never_delays_enforcement() {
    let r = replay(Setup {
        fixture: "handmade-pile.trace",
        config: r#"{"threshold": 5, "timeout": "2m", "stateFile": "/ro/state.json"}"#,
        prepare: &|rec| {
            rec.state.unwritable.lock().unwrap().insert("/ro/state.json".into());
        },
        ..Default::default()
    });
    assert!(r.log.contains(&"ERROR state_unwritable path=/ro/state.json".to_string()), "{:#?}", r.log);
    assert!(r.log.contains(&"FLAGGED name=agentihooks count=5 first_flagged=2m_ago".to_string()), "{:#?}", r.log);
    assert_eq!(r.lines("KILLED").len(), 3, "the in-memory clock is the authority: {:#?}", r.log);
    assert!(r.log.contains(&"TICK_COMPLETE flagged=1 kills=3 errors=1".to_string()));
}

#[test]
fn a_restart_resumes_the_flag_clock_from_the_state_file() {
    let r = replay(Setup {
        fixture: "two-names.trace",
        config: r#"{"threshold": 3, "timeout": "5m", "stateFile": "/state/s.json"}"#,
        run_for: Duration::from_secs(30),
        prepare: &|rec| {
            // alpha was flagged 10 minutes before this daemon started: due at its first tick.
            let clocks = guard::policy::FlagClocks::from([(guard::comm::Comm::new(b"alpha"), 1_800_000_000.0 - 600.0)]);
            let state = guard::state::State { clocks, ..Default::default() };
            rec.state.files.lock().unwrap().insert(PathBuf::from("/state/s.json"), state);
        },
        ..Default::default()
    });
    assert!(r.log.contains(&"FLAGGED name=alpha count=3 first_flagged=10m_ago".to_string()), "{:#?}", r.log);
    assert!(r.log.contains(&"FLAGGED name=beta count=3 first_flagged=now".to_string()), "{:#?}", r.log);
    assert_eq!(r.signals(), vec![(false, vec![400, 401, 402])], "only alpha is due: {:#?}", r.log);
}

#[test]
fn lost_events_are_made_good_by_a_resync_and_a_reused_pid_is_a_new_process() {
    let r = replay(Setup {
        fixture: "lost-and-reuse.trace",
        config: r#"{"threshold": 4, "timeout": "1h"}"#,
        run_for: Duration::from_secs(150),
        ..Default::default()
    });
    let resyncs = r.lines("RESYNC");
    assert!(resyncs.len() >= 2 && resyncs[1].starts_with("RESYNC reason=lost_events lost="), "{:#?}", r.log);
    let lost: u64 = resyncs[1..].iter().map(|l| l.rsplit('=').next().unwrap().parse::<u64>().unwrap()).sum();
    assert_eq!(lost, 2, "every lost event is counted once: {:#?}", r.log);
    // 300, 302 and the two forks the ring dropped; 301 is now a `sleep`.
    assert!(r.log.contains(&"FLAGGED name=worker count=4 first_flagged=now".to_string()), "{:#?}", r.log);
    // The rename at t=70 drops worker below the threshold: the clock goes.
    assert_eq!(r.log.iter().rev().nth(1).unwrap(), "TICK_COMPLETE flagged=0 kills=0 errors=0", "{:#?}", r.log);
    let last = r.rec.state.files.lock().unwrap().values().last().cloned().unwrap_or_default();
    assert!(last.clocks.is_empty(), "{last:?}");
}

#[test]
fn several_due_names_are_signalled_in_one_batch() {
    let r = replay(Setup {
        fixture: "two-names.trace",
        config: r#"{"threshold": 3, "timeout": "0s"}"#,
        run_for: Duration::from_secs(30),
        ..Default::default()
    });
    assert_eq!(r.signals(), vec![(false, vec![400, 401, 402, 410, 411, 412])], "{:#?}", r.log);
    assert!(r.log.contains(&"TICK_COMPLETE flagged=2 kills=6 errors=0".to_string()), "{:#?}", r.log);
    assert!(!r.log.iter().any(|l| l.contains("pid=420")), "another uid's process");
}

#[test]
fn sighup_logs_reload_and_ticks_at_once() {
    let r = replay(Setup {
        fixture: "two-names.trace",
        config: r#"{"threshold": 3, "timeout": "1h"}"#,
        run_for: Duration::from_secs(50),
        controls: vec![(Duration::from_secs(30), Control::Reload)],
        ..Default::default()
    });
    let i = r.log.iter().position(|l| l == "RELOAD reason=sighup").expect("a RELOAD line");
    assert!(r.log[i + 1].starts_with("FLAGGED"), "a tick follows at once: {:#?}", r.log);
    assert_eq!(r.lines("TICK_COMPLETE").len(), 2, "{:#?}", r.log);
    assert!(r.notes.contains(&"RELOADING=1".to_string()), "{:?}", r.notes);
    assert_eq!(r.notes.iter().filter(|n| *n == "READY=1").count(), 2, "READY again after the reload: {:?}", r.notes);
}

#[test]
fn a_config_broken_mid_run_ends_nothing_until_it_is_fixed() {
    let good = r#"{"threshold": 3, "timeout": "1m"}"#;
    let r = replay(Setup {
        fixture: "two-names.trace",
        config: good,
        run_for: Duration::from_secs(190),
        config_changes: vec![(Duration::from_secs(30), r#"{"threshold": "3"}"#), (Duration::from_secs(130), good)],
        ..Default::default()
    });
    // The string "3" is shown as the JSON it is (never `value=3`, which reads as the number),
    // with validate's reason and fix.
    let reason = r#"config_malformed threshold value="\"3\"" reason="\"3\" is a string" fix="write a whole number >= 1, e.g. 30""#;
    assert_eq!(r.lines("ERROR"), vec![format!("ERROR {reason}"); 2], "{:#?}", r.log);
    // Due since t=60, but nothing is ended while the config is invalid. Fixed at t=130: the flag
    // clocks were kept in memory, so the tick at t=180 enforces, once.
    assert_eq!(r.signals(), vec![(false, vec![400, 401, 402, 410, 411, 412])], "{:#?}", r.log);
    assert!(r.log.contains(&"FLAGGED name=alpha count=3 first_flagged=3m_ago".to_string()), "{:#?}", r.log);
    assert!(r.log.contains(&"TICK_COMPLETE flagged=2 kills=6 errors=0".to_string()), "{:#?}", r.log);
}

#[test]
fn a_broken_config_is_heard_in_the_heartbeat_the_status_the_metrics_and_once_on_the_stream() {
    let good = r#"{"threshold": 3, "timeout": "1h"}"#;
    let r = replay(Setup {
        fixture: "two-names.trace",
        config: good,
        run_for: Duration::from_secs(310),
        config_changes: vec![(Duration::from_secs(30), r#"{"threshold": "3"}"#), (Duration::from_secs(190), good)],
        ..Default::default()
    });
    let reason = r#"config_malformed threshold value="\"3\"" reason="\"3\" is a string" fix="write a whole number >= 1, e.g. 30""#;
    assert_eq!(r.lines("ERROR").len(), 3, "{:#?}", r.log);
    // Every tick says it: the heartbeat and the status file carry the ERROR line's reason, the
    // metrics file its gauge.
    let beats: Vec<Option<String>> =
        r.rec.mirror.heartbeats.lock().unwrap().iter().map(|h| h.config_error.clone()).collect();
    let statuses: Vec<Option<String>> = r.rec.status.0.lock().unwrap().iter().map(|s| s.config_error.clone()).collect();
    let broken = Some(reason.to_string());
    let expected = [None, broken.clone(), broken.clone(), broken, None, None];
    assert_eq!(beats, expected, "{:#?}", r.log);
    assert_eq!(statuses, expected, "{:#?}", r.log);
    let gauges: Vec<bool> = r
        .rec
        .metrics
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|m| m.contains("\nguard_config_error{user=\"replay\"} 1\n"))
        .collect();
    assert_eq!(gauges, [false, true, true, true, false, false]);
    // The stream hears of it once when it breaks and once when it is mended, not every tick.
    let events = r.rec.mirror.events.lock().unwrap().clone();
    let config_events: Vec<_> = events.iter().filter(|e| e.event.starts_with("config_")).collect();
    assert_eq!(config_events.len(), 2, "{config_events:#?}");
    assert_eq!(config_events[0].event, "config_error");
    assert_eq!(config_events[0].extra, [("error".to_string(), reason.to_string())]);
    assert_eq!(config_events[0].name, None, "about no process");
    assert_eq!(config_events[1].event, "config_ok");
    assert_eq!(config_events[1].extra, [("after".to_string(), "180s".to_string())], "broken from t=60 to t=240");
}

/// Recorded from the real kernel (tests/tests/record.rs with GUARD_RECORD_FIXTURES): exec after
/// setuid, a rename, an exit, threads, a fork without exec.
#[test]
fn a_pile_recorded_from_the_kernel_replays_to_exact_lines() {
    let r = replay(Setup {
        fixture: "recorded-pile.trace",
        config: r#"{"threshold": 4, "timeout": "0s", "excludes": []}"#,
        run_for: Duration::from_secs(90),
        ..Default::default()
    });
    assert_eq!(
        r.log[2..],
        [
            "TICK_COMPLETE flagged=0 kills=0 errors=0",
            "FLAGGED name=agentihooks count=4 first_flagged=now",
            "SKIPPED pid=11547 name=agentihooks reason=excluded_command",
            "SKIPPED pid=11548 name=agentihooks reason=excluded_command",
            "KILLED pid=11543 name=agentihooks reason=ghost_detected count=4 elapsed=0.0h",
            "KILLED pid=11544 name=agentihooks reason=ghost_detected count=4 elapsed=0.0h",
            "TICK_COMPLETE flagged=1 kills=2 errors=0",
            "STOPPED reason=signal",
        ],
        "{:#?}",
        r.log
    );
    assert_eq!(r.signals(), vec![(false, vec![11543, 11544])]);
}

#[test]
fn a_fork_storm_recorded_from_the_kernel_leaves_no_ghosts() {
    let r = replay(Setup {
        fixture: "recorded-storm.trace",
        config: r#"{"threshold": 3, "timeout": "1h", "excludes": []}"#,
        run_for: Duration::from_secs(90),
        ..Default::default()
    });
    assert_eq!(r.lines("FLAGGED"), ["FLAGGED name=steady count=3 first_flagged=now"], "{:#?}", r.log);
    let status = r.rec.status.0.lock().unwrap().last().cloned().unwrap();
    assert_eq!(status.tracked_processes, 3, "only the steady three are left: {status:?}");
    assert!(status.events >= 1000, "{}", status.events);
}

#[test]
fn a_lost_count_in_a_recording_resyncs_to_the_scan_after_it() {
    let r = replay(Setup {
        fixture: "lost-count.trace",
        config: r#"{"threshold": 2, "timeout": "1h", "excludes": []}"#,
        run_for: Duration::from_secs(90),
        ..Default::default()
    });
    assert!(r.log.contains(&"RESYNC reason=lost_events lost=3".to_string()), "{:#?}", r.log);
    let flagged = r.lines("FLAGGED");
    assert!(!flagged.iter().any(|l| l.contains("name=storm")), "{:#?}", r.log);
    assert!(flagged.contains(&"FLAGGED name=steady count=2 first_flagged=1m_ago"), "{:#?}", r.log);
    let status = r.rec.status.0.lock().unwrap().last().cloned().unwrap();
    // The two steady and the fork after the scan.
    assert_eq!(status.tracked_processes, 3, "{status:?}");
}

#[test]
fn the_warning_comes_warn_before_ahead_once_per_incident() {
    let r = replay(Setup {
        fixture: "two-names.trace",
        config: r#"{"threshold": 3, "timeout": "30m", "warnBefore": "10m", "excludes": ["beta"]}"#,
        run_for: Duration::from_secs(1900),
        ..Default::default()
    });
    // Flagged at t=0, due at t=1800: the deadline timer ticks at t=1200 for the warning.
    assert_eq!(r.lines("WARNING"), ["WARNING name=alpha count=3 due_in=10m ends=3 skips=0"], "{:#?}", r.log);
    let w = r.log.iter().position(|l| l.starts_with("WARNING")).unwrap();
    assert_eq!(r.log[w - 1], "FLAGGED name=alpha count=3 first_flagged=20m_ago", "{:#?}", r.log);
    let k = r.log.iter().position(|l| l.starts_with("KILLED")).unwrap();
    assert_eq!(
        r.log[k - 1],
        "FLAGGED name=alpha count=3 first_flagged=30m_ago",
        "enforced at the timeout: {:#?}",
        r.log
    );
    let status = r.rec.status.0.lock().unwrap()[w.min(1)..].iter().find(|s| !s.warnings.is_empty()).cloned();
    assert_eq!(status.expect("status lists the warning").warnings, ["alpha: enforcement due in 10m: ends 3, skips 0"]);
}

#[test]
fn warn_before_zero_turns_warnings_off() {
    let r = replay(Setup {
        fixture: "two-names.trace",
        config: r#"{"threshold": 3, "timeout": "5m", "warnBefore": 0}"#,
        run_for: Duration::from_secs(400),
        ..Default::default()
    });
    assert!(r.lines("WARNING").is_empty(), "{:#?}", r.log);
    assert!(r.lines("KILLED").len() >= 6, "enforced at the timeout, warned never: {:#?}", r.log);
}

/// The pile is never gone in this replay (nothing removes the recorded processes), so every
/// tick enforces it again: a respawn loop seen from the guard.
#[test]
fn a_respawn_loop_logs_repeat_once_a_day_over_a_day_of_injected_time() {
    let r = replay(Setup {
        fixture: "two-names.trace",
        config: r#"{"threshold": 3, "timeout": "0s", "repeatAfter": 3, "excludes": ["beta"]}"#,
        run_for: Duration::from_secs(25 * 3600 + 30),
        ..Default::default()
    });
    let repeats = r.lines("REPEAT");
    assert_eq!(repeats.len(), 2, "one a day: {repeats:?}");
    assert_eq!(repeats[0], "REPEAT name=alpha enforcements_24h=3 kills_24h=9");
    // A day later: every minute's enforcement of the last 24 h counts (the history keeps 1000).
    assert_eq!(repeats[1], "REPEAT name=alpha enforcements_24h=1000 kills_24h=3000");
    let i = r.log.iter().position(|l| l.starts_with("REPEAT")).unwrap();
    assert!(r.log[i - 1].starts_with("KILLED pid=402"), "REPEAT follows the third enforcement: {:#?}", &r.log[..i + 1]);
    let status = r.rec.status.0.lock().unwrap().last().cloned().unwrap();
    assert_eq!(status.repeat_offenders.len(), 1);
    assert_eq!(status.repeat_offenders[0].name, "alpha");
    let kinds = r.rec.mirror.events.lock().unwrap().iter().filter(|e| e.event == "repeat").count();
    assert_eq!(kinds, 2);
}

#[test]
fn repeat_counts_survive_a_restart_through_the_state_file() {
    let config =
        r#"{"threshold": 3, "timeout": "0s", "repeatAfter": 3, "excludes": ["beta"], "stateFile": "/s/state.json"}"#;
    // First daemon: two enforcements (t=0, t=60), then it stops.
    let first =
        replay(Setup { fixture: "two-names.trace", config, run_for: Duration::from_secs(90), ..Default::default() });
    assert!(first.lines("REPEAT").is_empty());
    let saved = first.rec.state.files.lock().unwrap().get(std::path::Path::new("/s/state.json")).cloned().unwrap();
    assert_eq!(saved.repeats.values().next().unwrap().enforcements.len(), 2, "{saved:?}");
    // Second daemon, later: its first enforcement is the third within 24 h.
    let second = replay(Setup {
        fixture: "two-names.trace",
        config,
        run_for: Duration::from_secs(30),
        prepare: &move |rec| {
            let mut st = saved.clone();
            // The first run's clock started at the same base time; shift its history 10 minutes back.
            for h in st.repeats.values_mut() {
                for e in &mut h.enforcements {
                    e.0 -= 600.0;
                }
            }
            st.clocks.clear();
            rec.state.files.lock().unwrap().insert("/s/state.json".into(), st);
        },
        ..Default::default()
    });
    assert_eq!(second.lines("REPEAT"), ["REPEAT name=alpha enforcements_24h=3 kills_24h=9"], "{:#?}", second.log);
}

#[test]
fn the_stall_watch_tells_a_spinning_process_once_reminds_hourly_and_never_signals() {
    // pid 900 uses a full core from t=0 to t=90 min, then stops; pid 901 bursts (busy every
    // other minute): never told.
    let mut cpu = Vec::new();
    let (mut spin, mut burst) = (0u64, 0u64);
    for m in 0..=100u64 {
        if m > 0 && m <= 90 {
            spin += 60_000_000_000;
        }
        if m % 2 == 1 {
            burst += 60_000_000_000;
        }
        cpu.push((Duration::from_secs(m * 60 + 1), 900, "spin", spin));
        cpu.push((Duration::from_secs(m * 60 + 1), 901, "burst", burst));
    }
    let r = replay(Setup {
        fixture: "two-names.trace",
        config: r#"{"threshold": 50, "stallWatch": {"peggedCpu": 0.75, "peggedFor": "5m"}}"#,
        run_for: Duration::from_secs(100 * 60 + 30),
        cpu,
        ..Default::default()
    });
    let told: Vec<&str> =
        r.log.iter().map(String::as_str).filter(|l| l.starts_with("PEGGED") || l.starts_with("RECOVERED")).collect();
    assert_eq!(
        told,
        [
            "PEGGED pid=900 name=spin cpu=1.00 for=300s",
            "PEGGED pid=900 name=spin cpu=1.00 for=3900s",
            "RECOVERED pid=900 name=spin after=5400s",
        ],
        "{:#?}",
        r.log
    );
    assert!(r.signals().is_empty(), "the stall watch never signals");
    let pegged = r.rec.mirror.events.lock().unwrap().iter().filter(|e| e.event == "pegged").count();
    assert_eq!(pegged, 2);
    let during = r.rec.status.0.lock().unwrap()[30].pegged.clone();
    assert_eq!(during.len(), 1, "status lists the incident: {during:?}");
    assert_eq!(during[0].pid, 900);
}

#[test]
fn a_step_of_the_wall_clock_neither_enforces_early_nor_loses_a_flag_clock() {
    let config = r#"{"threshold": 3, "timeout": "5m", "warnBefore": 0, "stateFile": "/s/state.json"}"#;
    let run_for = |secs: u64, step: f64| {
        replay(Setup {
            fixture: "two-names.trace",
            config,
            run_for: Duration::from_secs(secs),
            wall_steps: if step == 0.0 { vec![] } else { vec![(Duration::from_secs(90), step)] },
            ..Default::default()
        })
    };
    let run = |step: f64| run_for(330, step);
    let steady = run(0.0);
    assert!(steady.log.contains(&"FLAGGED name=alpha count=3 first_flagged=5m_ago".to_string()), "{:#?}", steady.log);
    assert_eq!(steady.lines("KILLED").len(), 6, "{:#?}", steady.log);
    for step in [3.0 * 3600.0, -3.0 * 3600.0] {
        let r = run(step);
        // Forward: the names are not enforced at the next tick; backward: their clocks go on.
        assert_eq!(r.log, steady.log, "wall clock stepped by {step} s at t=90 s");
        assert_eq!(r.signals(), steady.signals());
        // The state file is re-dated to the stepped wall clock at the next tick, though nothing
        // else changed, so a restart sees the same age.
        let short = run_for(150, step);
        let saved = short.rec.state.files.lock().unwrap()[std::path::Path::new("/s/state.json")].clone();
        let alpha = saved.clocks[&guard::comm::Comm::new(b"alpha")];
        assert!((alpha - (1_800_000_000.0 + step)).abs() < 1.0, "flagged at t=0, on the stepped clock: {alpha}");
    }
}

#[test]
fn unknown_keys_are_warned_about_256_times_a_run_then_once_that_the_rest_are_not() {
    // A config rewritten before each tick with 100 new unknown keys: the set of keys warned
    // about stops growing at 256, and one line says so.
    let configs: Vec<(Duration, &'static str)> = (0..5u64)
        .map(|gen| {
            let keys: Vec<String> = (0..100).map(|i| format!(r#""g{gen}k{i}": 1"#)).collect();
            let text = format!(r#"{{"threshold": 5, {}}}"#, keys.join(", "));
            (Duration::from_secs(30 + 60 * gen), &*Box::leak(text.into_boxed_str()))
        })
        .collect();
    let r = replay(Setup {
        fixture: "handmade-pile.trace",
        config: configs[0].1,
        config_changes: configs[1..].to_vec(),
        run_for: Duration::from_secs(330),
        ..Default::default()
    });
    let warned: Vec<&str> = r.lines("WARN").into_iter().filter(|l| l.starts_with("WARN config_unknown_key ")).collect();
    assert_eq!(warned.len(), 256, "{:#?}", r.lines("WARN"));
    let capped: Vec<&str> =
        r.lines("WARN").into_iter().filter(|l| l.starts_with("WARN config_unknown_keys_unreported")).collect();
    assert_eq!(capped.len(), 1, "{:#?}", r.lines("WARN"));
    assert!(capped[0].starts_with("WARN config_unknown_keys_unreported limit=256 path="), "{}", capped[0]);
    assert_eq!(r.lines("TICK_COMPLETE").len(), 6, "every tick completes: {:#?}", r.log);
}

#[test]
fn a_flagged_name_not_yet_due_has_its_unchanged_processes_matched_once_not_every_tick() {
    let keep = r#"{"threshold": 5, "timeout": "1h", "excludeCommands": ["--keep"]}"#;
    let r = replay(Setup {
        fixture: "handmade-steady.trace",
        config: keep,
        run_for: Duration::from_secs(630),
        // A new pattern list at 7 min: every verdict is reached again.
        config_changes: vec![(
            Duration::from_secs(420),
            r#"{"threshold": 5, "timeout": "1h", "excludeCommands": ["--keep", "queue c$"]}"#,
        )],
        ..Default::default()
    });
    let ticks = r.lines("TICK_COMPLETE");
    assert!(ticks.len() >= 10, "{:#?}", r.log);
    assert!(r.signals().is_empty(), "nothing is due within the hour");
    // Five at the first tick, the rewritten one once more, five for the new list: not five a tick.
    // Plus, once per list, the probe lines that tell whether a pattern matches every command line.
    let probes = 2 * guard::pattern::match_all::PROBES.len() as u64;
    assert_eq!(*r.rec.classified.lock().unwrap(), 5 + 1 + 5 + probes, "{:#?}", r.log);
    // The counts stay exact from the cache: before the rewrite, after it, with the new list.
    let statuses = r.rec.status.0.lock().unwrap().clone();
    let counts: Vec<(u64, Option<u32>, Option<u32>)> = statuses
        .iter()
        .filter_map(|s| s.names.iter().find(|n| n.name == "worker").map(|n| (s.ticks, n.would_skip, n.would_end)))
        .collect();
    let at = |tick: u64| counts.iter().find(|c| c.0 == tick).map(|c| (c.1, c.2));
    assert_eq!(at(3), Some((Some(2), Some(3))), "{counts:?}");
    assert_eq!(at(7), Some((Some(1), Some(4))), "{counts:?}");
    assert_eq!(counts.last().map(|c| (c.1, c.2)), Some((Some(2), Some(3))), "{counts:?}");
}
