//! Names at the kernel's full length: a process that names itself with 15 bytes (prctl, or a
//! write to /proc/self/comm, as node's `process.title` and many daemons do) is counted under
//! those 15 bytes with the processes exec gave the same name, and ended as itself; two names
//! that share their first 14 bytes are two names. Run as root (`cargo xtask test`).
use std::time::Duration;

use integration_tests::*;

const WAIT: Duration = Duration::from_secs(20);

const PILE: &str = "fifteen-bytes-a";
const NEIGHBOUR: &str = "fifteen-bytes-b";
/// 15 bytes that fake /proc/PID/stat's field separator and a line end, one not UTF-8.
const HOSTILE: &[u8] = b"x) R 9 9\n\xff ( \n)";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn config(threshold: u32) -> String {
    format!(r#"{{"threshold": {threshold}, "timeout": "1s", "excludes": []}}"#)
}

/// Whether the test account may create a user namespace (kernels and distributions can turn
/// that off for unprivileged users); says so when it may not.
fn account_can_make_a_user_namespace() -> bool {
    // SAFETY: the child makes raw syscalls only (async-signal-safe), then _exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        unsafe {
            libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>());
            libc::syscall(libc::SYS_setresgid, TEST_UID, TEST_UID, TEST_UID);
            libc::syscall(libc::SYS_setresuid, TEST_UID, TEST_UID, TEST_UID);
            libc::_exit(if libc::unshare(libc::CLONE_NEWUSER) == 0 { 0 } else { 1 });
        }
    }
    let mut status = 0;
    // SAFETY: reaps our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let can = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    if !can {
        eprintln!(
            "note: {TEST_USER} cannot make a user namespace here; the hostile pile's status read is not exercised"
        );
    }
    can
}

fn ends_fifteen_byte_names_set_by_rename(backend: &str) {
    assert_eq!((PILE.len(), NEIGHBOUR.len(), HOSTILE.len()), (15, 15, 15));
    let home = Home::new();
    // Nothing is flagged until every probe has its name: the renames must happen while the
    // daemon runs (its start-up scan would read the names from the kernel's task list).
    home.write_config(&config(100));
    let daemon = Daemon::start(&home, &["--backend", backend]);
    let log = home.wait_log(WAIT, |l| !lines(l, "TICK_COMPLETE").is_empty());
    assert!(!lines(&log, "TICK_COMPLETE").is_empty(), "{backend}: no first tick\n{log}");

    let renamer = home.probe_named("name-probe");
    let mut pile = vec![
        Probe::spawn(&home.probe_named(PILE), &[], TEST_UID),
        Probe::spawn(&renamer, &["rename", PILE], TEST_UID),
        Probe::spawn(&renamer, &["rename", PILE], TEST_UID),
        Probe::spawn(&renamer, &["comm-hex", &hex(PILE.as_bytes())], TEST_UID),
    ];
    let mut neighbours: Vec<Probe> = (0..2).map(|_| Probe::spawn(&renamer, &["rename", NEIGHBOUR], TEST_UID)).collect();
    let hostile_hex = hex(HOSTILE);
    // One in a user namespace of its own where the account may make one: the /proc read then
    // takes its euid from `status`, whose `Name:` line holds the name's raw bytes.
    let userns: &[&str] = if account_can_make_a_user_namespace() { &["userns", "new"] } else { &[] };
    let mut hostile = vec![
        Probe::spawn(&renamer, &["comm-hex", &hostile_hex], TEST_UID),
        Probe::spawn(&renamer, &["comm-hex", &hostile_hex], TEST_UID),
        Probe::spawn(&renamer, &[&["comm-hex", hostile_hex.as_str()][..], userns].concat(), TEST_UID),
    ];
    home.write_config(&config(3));

    home.wait_log(WAIT, |l| lines(l, "KILLED").len() >= 7);
    // One more tick, in which a name wrongly counted would show up.
    let ticks = lines(&home.log(), "TICK_COMPLETE").len();
    let log = home.wait_log(WAIT, |l| lines(l, "TICK_COMPLETE").len() > ticks + 1);
    daemon.stop();

    assert!(!log.contains("identity_changed"), "{backend}: the tracked names are /proc's\n{log}");
    for p in &mut pile {
        assert!(p.wait_dead(Duration::from_secs(5)), "{backend}: {} survived\n{log}", p.pid());
        let killed = format!("KILLED pid={} name={PILE} reason=ghost_detected count=4 elapsed=", p.pid());
        assert!(log.contains(&killed), "{backend}: no {killed:?}\n{log}");
    }
    let hostile_name = guard::escape::log_value(HOSTILE);
    for p in &mut hostile {
        assert!(p.wait_dead(Duration::from_secs(5)), "{backend}: {} survived\n{log}", p.pid());
        let killed = format!("KILLED pid={} name={hostile_name} reason=ghost_detected count=3 elapsed=", p.pid());
        assert!(log.contains(&killed), "{backend}: no {killed:?}\n{log}");
    }
    for p in &mut neighbours {
        assert!(p.is_alive(), "{backend}: {NEIGHBOUR} has 2 processes, below the threshold\n{log}");
    }
    assert!(!log.contains(NEIGHBOUR), "{backend}: {NEIGHBOUR} is a name of its own\n{log}");
    assert_eq!(lines(&log, "KILLED").len(), 7, "{backend}\n{log}");
}

#[guard_test(needs = [root])]
fn fifteen_byte_names_set_by_rename_are_counted_whole_and_ended() {
    let _g = setup();
    for backend in backends() {
        ends_fifteen_byte_names_set_by_rename(backend);
    }
}

guard_test::main!();
