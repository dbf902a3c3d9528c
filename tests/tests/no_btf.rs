//! A kernel without BTF (the `no-btf` VM guest hides /sys/kernel/btf/vmlinux): the daemon's
//! default backend falls back to procfs with exactly one `WARN backend_fallback reason=no_btf`,
//! and guards as usual. It needs a kernel without BTF (`no_btf`): elsewhere it is ignored, and
//! the VM suite's no-btf guest requires it.
use std::time::Duration;

use integration_tests::*;

#[guard_test(needs = [root, no_btf])]
fn without_btf_the_default_backend_falls_back_to_procfs_once_and_still_ends_a_pile() {
    let _g = setup();
    let home = Home::new();
    home.write_config(r#"{"threshold": 3, "timeout": "1s", "excludes": []}"#);
    let exe = home.probe_named("nobtfpile");
    let mut pile: Vec<Probe> = (0..4).map(|_| Probe::spawn(&exe, &["watch"], TEST_UID)).collect();
    let daemon = Daemon::start(&home, &[]);
    home.wait_log(Duration::from_secs(30), |l| lines(l, "KILLED").len() >= 4);
    daemon.stop();
    let log = home.log();
    let warns: Vec<&str> = lines(&log, "WARN");
    assert_eq!(warns.iter().filter(|l| l.ends_with("WARN backend_fallback reason=no_btf")).count(), 1, "{log}");
    assert!(!warns.iter().any(|l| l.contains("task_iter_fallback")), "{log}");
    assert!(log.contains("backend=procfs"), "{log}");
    assert_eq!(lines(&log, "KILLED").len(), 4, "{log}");
    for p in &mut pile {
        assert!(p.wait_dead(Duration::from_secs(5)), "probe {} survived\n{log}", p.pid());
    }
}

guard_test::main!();
