//! The stall watch against real processes (docs/configuration.md): a spinning probe of the account is told
//! exactly once per incident and recovered when it stops; a calm one and a bursty one are never
//! told; none is ever signalled.
use std::time::Duration;

use integration_tests::*;

#[guard_test(needs = [root])]
fn a_spinning_process_is_told_once_and_recovers_while_calm_and_bursty_ones_are_never_told() {
    let _g = setup();
    let home = Home::new();
    // 1 s ticks, a 10 s window; 0.1 of a core so a loaded machine (a spinner sharing 2 cores with
    // ten builders gets ~0.2) still counts it; the calm and bursty ones have idle seconds in every
    // window, which no threshold above 0 counts as busy.
    home.write_config(r#"{"threshold": 50, "stallWatch": {"peggedCpu": 0.1, "peggedFor": "10s"}}"#);
    let spin_exe = home.probe_named("spinner");
    let calm_exe = home.probe_named("calm");
    let burst_exe = home.probe_named("burster");
    let record = home.path().join("signals");
    let rec = record.to_str().unwrap();
    let mut spinner = Probe::spawn(&spin_exe, &["busy", "1000/0", "record", rec], TEST_UID);
    let mut calm = Probe::spawn(&calm_exe, &["record", rec], TEST_UID);
    // Busy 1.5 s, then 3 s of rest: every window of 10 s holds calm seconds.
    let mut burster = Probe::spawn(&burst_exe, &["busy", "1500/3000", "record", rec], TEST_UID);
    let d = Daemon::start(&home, &[]);
    let log = home.wait_log(Duration::from_secs(60), |l| l.contains("PEGGED pid="));
    assert!(log.contains(&format!("PEGGED pid={} name=spinner cpu=", spinner.pid())), "{log}");
    // Let the spinner rest: SIGSTOP it, and the next interval is calm.
    unsafe { libc::kill(spinner.pid() as i32, libc::SIGSTOP) };
    home.wait_log(Duration::from_secs(20), |l| l.contains("RECOVERED pid="));
    // The tick that logged RECOVERED writes the status after its log lines.
    let status = home.wait_status(Duration::from_secs(10), |s| s.pegged.is_empty()).expect("a status file");
    d.stop();
    unsafe { libc::kill(spinner.pid() as i32, libc::SIGCONT) };
    let log = home.log();
    assert_eq!(lines(&log, "PEGGED").len(), 1, "told exactly once:\n{log}");
    assert!(log.contains(&format!("RECOVERED pid={} name=spinner after=", spinner.pid())), "{log}");
    assert!(!log.contains(&format!("pid={} ", calm.pid())), "the calm one was told:\n{log}");
    assert!(!log.contains(&format!("pid={} ", burster.pid())), "the bursty one was told:\n{log}");
    assert!(spinner.is_alive() && calm.is_alive() && burster.is_alive());
    assert_eq!(std::fs::read_to_string(&record).unwrap_or_default(), "", "the stall watch sent a signal");
    assert!(status.pegged.is_empty(), "recovered, so no longer listed: {:?}", status.pegged);
}

guard_test::main!();
