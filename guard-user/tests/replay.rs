//! Recorded traces replayed through the whole daemon — pump, table, rebuilds, supervised tick
//! loop, decide, effects — on a paused tokio clock: no root, no kernel, exact lines and signals.
//! The fixtures are in tests/fixtures/ (see DEVELOPERS.md for how they were recorded).
mod replay_harness;

use guard_test::guard_test;
use std::{path::PathBuf, time::Duration};

use guard::daemon::{Control, Stopped};
use replay_harness::{replay, Setup, PILE_CONFIG};

#[guard_test]
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
            "UNFLAGGED name=agentihooks count=2 flagged_for=3m reason=below_threshold",
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
    assert_eq!(extra, [("due_in_secs", "120"), ("ends", "3"), ("skips", "2")]);
}

#[guard_test]
fn a_dry_run_verifies_and_logs_dry_run_but_sends_nothing() {
    let r = replay(Setup { fixture: "handmade-pile.trace", config: PILE_CONFIG, dry_run: true, ..Default::default() });
    assert_eq!(r.lines("DRY_RUN").len(), 3, "{:#?}", r.log);
    assert!(r.lines("KILLED").is_empty());
    assert!(r.log.contains(&"TICK_COMPLETE flagged=1 kills=0 errors=0".to_string()));
    assert!(r.signals().iter().all(|(dry, _)| *dry), "a dry run only verifies: {:?}", r.signals());
    assert!(r.log[0].contains("dry_run=1"));
}

#[guard_test]
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

#[guard_test]
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

#[guard_test]
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

#[guard_test]
fn a_restart_resumes_the_flag_clock_from_the_state_file() {
    let r = replay(Setup {
        fixture: "two-names.trace",
        config: r#"{"threshold": 3, "timeout": "5m", "stateFile": "/state/s.json"}"#,
        run_for: Duration::from_secs(30),
        prepare: &|rec| {
            // alpha was flagged 10 minutes before this daemon started: due at its first tick.
            let clocks = guard::policy::FlagClocks::from([(guard::comm::Comm::new(b"alpha"), 1_800_000_000.0 - 600.0)]);
            let state = guard::domain::State { clocks, ..Default::default() };
            rec.state.files.lock().unwrap().insert(PathBuf::from("/state/s.json"), state);
        },
        ..Default::default()
    });
    assert!(r.log.contains(&"FLAGGED name=alpha count=3 first_flagged=10m_ago".to_string()), "{:#?}", r.log);
    assert!(r.log.contains(&"FLAGGED name=beta count=3 first_flagged=now".to_string()), "{:#?}", r.log);
    assert_eq!(r.signals(), vec![(false, vec![400, 401, 402])], "only alpha is due: {:#?}", r.log);
}

#[guard_test]
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

#[guard_test]
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

#[guard_test]
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

#[guard_test]
fn a_config_broken_mid_run_ends_nothing_until_it_is_fixed() {
    let good = r#"{"threshold": 3, "timeout": "1m"}"#;
    let r = replay(Setup {
        fixture: "two-names.trace",
        config: good,
        run_for: Duration::from_secs(190),
        config_changes: vec![(Duration::from_secs(30), r#"{"threshold": "3"}"#), (Duration::from_secs(130), good)],
        ..Default::default()
    });
    // The string "3" is shown quoted (`value="3"`; the number would be bare, `value=3`),
    // with validate's reason and fix.
    let reason =
        r#"config_malformed threshold value="3" reason="\"3\" is a string" fix="write a whole number >= 1, e.g. 30""#;
    assert_eq!(r.lines("ERROR"), vec![format!("ERROR {reason}"); 2], "{:#?}", r.log);
    // Due since t=60, but nothing is ended while the config is invalid. Fixed at t=130: the flag
    // clocks were kept in memory, so the tick at t=180 enforces, once.
    assert_eq!(r.signals(), vec![(false, vec![400, 401, 402, 410, 411, 412])], "{:#?}", r.log);
    assert!(r.log.contains(&"FLAGGED name=alpha count=3 first_flagged=3m_ago".to_string()), "{:#?}", r.log);
    assert!(r.log.contains(&"TICK_COMPLETE flagged=2 kills=6 errors=0".to_string()), "{:#?}", r.log);
}

#[guard_test]
fn a_broken_config_is_heard_in_the_heartbeat_the_status_the_metrics_and_once_on_the_stream() {
    let good = r#"{"threshold": 3, "timeout": "1h"}"#;
    let r = replay(Setup {
        fixture: "two-names.trace",
        config: good,
        run_for: Duration::from_secs(310),
        config_changes: vec![(Duration::from_secs(30), r#"{"threshold": "3"}"#), (Duration::from_secs(190), good)],
        ..Default::default()
    });
    let reason =
        r#"config_malformed threshold value="3" reason="\"3\" is a string" fix="write a whole number >= 1, e.g. 30""#;
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
    assert_eq!(config_events[1].extra, [("after_secs".to_string(), "180".to_string())], "broken from t=60 to t=240");
}

/// Recorded from the real kernel (tests/tests/record.rs with GUARD_RECORD_FIXTURES): exec after
/// setuid, a rename, an exit, threads, a fork without exec.
#[guard_test]
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

#[guard_test]
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

#[guard_test]
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

guard_test::main!();
