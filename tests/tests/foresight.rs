//! Foresight with real probes: a `WARNING` ahead of a real enforcement, and `REPEAT` for a pile
//! that keeps coming back (a respawn loop), both streamed and in the status; neither ends anything
//! by itself.
use std::time::Duration;

use integration_tests::*;

#[guard_test(needs = [root])]
fn a_warning_comes_before_a_real_enforcement() {
    let _g = setup();
    let home = Home::new();
    // Due 8 s after flagging; warned when due within 5 s (the deadline timer ticks for it).
    home.write_config(r#"{"threshold": 3, "timeout": "8s", "warnBefore": "5s", "excludes": []}"#);
    let exe = home.probe_named("wrapper");
    let mut pile: Vec<Probe> = (0..3).map(|_| Probe::spawn(&exe, &[], TEST_UID)).collect();
    let d = Daemon::start(&home, &[]);
    let log = home.wait_log(Duration::from_secs(30), |l| lines(l, "KILLED").len() >= 3);
    d.stop();
    let warning = lines(&log, "WARNING");
    assert_eq!(warning.len(), 1, "one warning per incident:\n{log}");
    assert!(warning[0].ends_with("WARNING name=wrapper count=3 due_in=1m ends=3 skips=0"), "{log}");
    let w = log.find("WARNING name=wrapper").unwrap();
    let k = log.find("KILLED pid=").unwrap();
    assert!(w < k, "the warning comes before the enforcement:\n{log}");
    for p in &mut pile {
        assert!(p.wait_dead(Duration::from_secs(5)));
    }
}

#[guard_test(needs = [root])]
fn a_pile_that_keeps_respawning_is_reported_as_a_repeat_offender() {
    let _g = setup();
    let home = Home::new();
    home.write_config(r#"{"threshold": 2, "timeout": "0s", "repeatAfter": 3, "warnBefore": 0, "excludes": []}"#);
    let exe = home.probe_named("respawner");
    let d = Daemon::start(&home, &[]);
    // The "respawn loop": whenever the pile is gone, it comes back.
    for round in 0..4 {
        let mut pile: Vec<Probe> = (0..2).map(|_| Probe::spawn(&exe, &[], TEST_UID)).collect();
        for p in &mut pile {
            assert!(p.wait_dead(Duration::from_secs(15)), "round {round}: the pile was not ended\n{}", home.log());
        }
    }
    let log = home.wait_log(Duration::from_secs(10), |l| l.contains("REPEAT"));
    // The tick that logged REPEAT writes the status after its log lines.
    let status =
        home.wait_status(Duration::from_secs(10), |s| s.repeat_offenders.iter().any(|o| o.name == "respawner"));
    d.stop();
    let repeats = lines(&log, "REPEAT");
    assert_eq!(repeats.len(), 1, "once a day:\n{log}");
    assert!(repeats[0].ends_with("REPEAT name=respawner enforcements_24h=3 kills_24h=6"), "{log}");
    let offenders = status.map(|s| s.repeat_offenders).unwrap_or_default();
    assert!(offenders.iter().any(|o| o.name == "respawner"), "{offenders:?}");
    // The counts survive a restart: the state file holds them.
    let state = std::fs::read_to_string(home.path().join("guard-daemon-state.json")).unwrap();
    assert!(state.contains("\"repeats\"") && state.contains("respawner"), "{state}");
}

guard_test::main!();
