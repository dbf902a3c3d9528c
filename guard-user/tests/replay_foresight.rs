//! Replays of the foresight and the bounds: WARNING, REPEAT, the stall watch, a stepped wall
//! clock, the unknown-key cap, the verdict cache (see replay.rs and replay_harness/).
mod replay_harness;

use guard_test::guard_test;
use std::time::Duration;

use replay_harness::{replay, Setup};

#[guard_test]
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
    // The status marks the warned name; `status` shows the warning from its figures.
    let status = r.rec.status.0.lock().unwrap()[w.min(1)..].iter().find(|s| s.names.iter().any(|n| n.warned)).cloned();
    let table =
        guard::cmd::status::render_table(&status.expect("status lists the warning"), std::time::SystemTime::now());
    let warnings: Vec<&str> = table.lines().filter(|l| l.starts_with("warning ")).collect();
    assert_eq!(warnings, ["warning      alpha: enforcement due in 10m: ends 3, skips 0"], "{table}");
}

#[guard_test]
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
#[guard_test]
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

#[guard_test]
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

#[guard_test]
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

#[guard_test]
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

#[guard_test]
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

#[guard_test]
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

guard_test::main!();
