//! Issue 7 item 8: the daemon keeps its tick cadence under load — during an event storm on both
//! cores, and while the swarm Redis hangs (accepts connections, never answers). The tick times
//! come from the status file (written at the end of every tick, `last_tick` in unix seconds),
//! sampled every 20 ms; the bound is the interval plus one second.
use std::{
    net::TcpListener,
    time::{Duration, Instant},
};

use integration_tests::*;

const INTERVAL: f64 = 1.0;
const BOUND: f64 = INTERVAL + 1.0;

/// The distinct `last_tick` values seen in `home`'s status file while `load` runs for `secs`.
fn tick_times(home: &Home, secs: u64, load: impl Fn() + Send + Sync) -> Vec<f64> {
    let stop = std::sync::atomic::AtomicBool::new(false);
    let path = home.path().join("guard-status.json");
    let mut seen = Vec::new();
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                load();
            }
        });
        let end = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < end {
            if let Ok(st) = guard::status::read(&path, guard::safefs::FsIdentity::current()) {
                if seen.last() != Some(&st.last_tick) {
                    seen.push(st.last_tick);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    seen
}

/// Asserts no gap between consecutive ticks exceeds the bound; returns the largest gap.
fn assert_cadence(what: &str, times: &[f64], secs: u64, log: &str, daemon: &Daemon) -> f64 {
    let log = &format!("{log}\n{}", thread_dump(daemon.child.id()));
    assert!(
        times.len() as f64 >= secs as f64 / INTERVAL * 0.7,
        "{what}: only {} ticks in {secs} s\n{log}",
        times.len()
    );
    let worst = times.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
    assert!(worst <= BOUND, "{what}: a tick came {worst:.2} s after the previous one (bound {BOUND} s)\n{log}");
    eprintln!(
        "{what}: {} ticks in {secs} s, largest gap {worst:.3} s (interval {INTERVAL} s, bound {BOUND} s)",
        times.len()
    );
    worst
}

#[guard_test(needs = [root, ebpf])]
fn ticks_keep_their_cadence_during_an_event_storm() {
    let _g = setup();
    let home = Home::new();
    home.write_config(r#"{"threshold": 3, "timeout": "1h", "excludes": []}"#);
    let exe = home.probe_named("steady");
    let _steady: Vec<Probe> = (0..4).map(|_| Probe::spawn(&exe, &[], TEST_UID)).collect();
    let daemon = Daemon::start(&home, &[]);
    home.wait_log(Duration::from_secs(20), |l| lines(l, "TICK_COMPLETE").len() >= 2);
    let secs = 12;
    let times = tick_times(&home, secs, || fork_storm(2, 256, TEST_UID));
    let status =
        guard::status::read(&home.path().join("guard-status.json"), guard::safefs::FsIdentity::current()).unwrap();
    assert_cadence("event storm", &times, secs, &home.log(), &daemon);
    daemon.stop();
    assert!(status.events > 1_000, "the storm was too small to prove anything: {} events", status.events);
    eprintln!("event storm: {} events handled, {} lost, {} resyncs", status.events, status.lost_events, status.resyncs);
}

#[guard_test(needs = [root])]
fn ticks_keep_their_cadence_while_redis_hangs() {
    let _g = setup();
    // A hung Redis: the kernel completes the handshakes (backlog), nobody ever reads or answers.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = std::sync::Mutex::new(Vec::new());
    let home = Home::new();
    home.write_config(r#"{"threshold": 3, "timeout": "2s", "excludes": []}"#);
    let exe = home.probe_named("hangs");
    let mut pile: Vec<Probe> = (0..3).map(|_| Probe::spawn(&exe, &[], TEST_UID)).collect();
    std::env::set_var("AGENTIHOOKS_SWARM_REDIS_URL", format!("redis://127.0.0.1:{port}/0"));
    std::env::remove_var("AGENTIHOOKS_HIVE_REDIS_URL");
    let daemon = Daemon::start(&home, &[]);
    std::env::remove_var("AGENTIHOOKS_SWARM_REDIS_URL");
    listener.set_nonblocking(true).unwrap();
    let secs = 12;
    let times = tick_times(&home, secs, || {
        if let Ok((c, _)) = listener.accept() {
            accepted.lock().unwrap().push(c);
        }
        std::thread::sleep(Duration::from_millis(10));
    });
    let log = home.log();
    assert_cadence("hung Redis", &times, secs, &log, &daemon);
    for p in &mut pile {
        assert!(p.wait_dead(Duration::from_secs(5)), "a kill waited on the hung Redis\n{log}");
    }
    daemon.stop();
    assert!(!accepted.lock().unwrap().is_empty(), "the daemon never connected to the hung Redis");
    assert!(lines(&log, "KILLED").len() >= 3, "{log}");
    assert_eq!(log.matches("WARN redis_unreachable").count(), 1, "{log}");
}

guard_test::main!();
