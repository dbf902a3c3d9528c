//! The worker's sandbox, read back from the kernel (/proc) rather than from what the worker
//! claims: identity, groups, capabilities, no-new-privs, seccomp mode, rlimits, descriptors,
//! `oom_score_adj`; and a real `open` attempt inside the worker. The identity checks need root
//! (the worker only switches identity when started as root): `needs = [root]`.
use guard_test::guard_test;
use std::{
    path::Path,
    time::{Duration, Instant},
};

use guard::pattern::{Limits, MatchOutcome, Matcher, ProbeOutcome};

fn exe() -> std::path::PathBuf {
    env!("CARGO_BIN_EXE_guard-user").into()
}

fn running(limits: Limits) -> (Matcher, u32) {
    let mut m = Matcher::new(exe(), limits);
    m.set_patterns(&["(^|[ /])agentihooks swarm tick( |$)".to_string()]).unwrap();
    let pid = m.worker_pid().expect("a worker holds the list");
    (m, pid)
}

/// The value of `key:` in /proc/PID/status, whitespace collapsed.
fn status(pid: u32, key: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = text.lines().find_map(|l| l.strip_prefix(&format!("{key}:"))).unwrap_or_else(|| panic!("no {key}"));
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Soft and hard limits for a row of /proc/PID/limits, e.g. "Max open files".
fn limit(pid: u32, row: &str) -> (String, String) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = text.lines().find(|l| l.starts_with(row)).unwrap_or_else(|| panic!("no {row}"));
    let fields: Vec<&str> = line[row.len()..].split_whitespace().collect();
    (fields[0].to_string(), fields[1].to_string())
}

#[guard_test(needs = [root])]
fn started_as_root_the_worker_is_nobody_without_groups_or_capabilities() {
    let (m, pid) = running(Limits::default());
    assert_eq!(status(pid, "Uid"), "65534 65534 65534 65534");
    assert_eq!(status(pid, "Gid"), "65534 65534 65534 65534");
    assert_eq!(status(pid, "Groups"), "");
    assert_eq!(status(pid, "CapEff"), "0000000000000000");
    assert_eq!(status(pid, "CapPrm"), "0000000000000000");
    assert_eq!(status(pid, "CapAmb"), "0000000000000000");
    let state = m.sandbox().unwrap();
    assert!(state.identity_dropped && state.uid == 65534 && state.gid == 65534, "{state:?}");
}

#[guard_test]
fn the_worker_has_no_new_privs_seccomp_and_is_the_first_for_the_oom_killer() {
    let (m, pid) = running(Limits::default());
    assert_eq!(status(pid, "NoNewPrivs"), "1");
    assert_eq!(status(pid, "Seccomp"), "2", "filter mode");
    assert_eq!(std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).unwrap().trim(), "1000");
    let state = m.sandbox().unwrap();
    assert!(state.seccomp && state.oom_score_adj, "{state:?}");
}

#[guard_test]
fn the_worker_runs_under_the_configured_rlimits() {
    let (_m, pid) = running(Limits::default());
    let both = |v: &str| (v.to_string(), v.to_string());
    assert_eq!(limit(pid, "Max core file size"), both("0"));
    assert_eq!(limit(pid, "Max file size"), both("0"));
    assert_eq!(limit(pid, "Max open files"), both("3"));
    assert_eq!(limit(pid, "Max processes"), both("0"));
    assert_eq!(limit(pid, "Max locked memory"), both("0"));
    assert_eq!(limit(pid, "Max stack size"), both(&(4u64 << 20).to_string()));
    assert_eq!(limit(pid, "Max cpu time"), ("60".to_string(), "65".to_string()));
    let (data, _) = limit(pid, "Max data size");
    let data: u64 = data.parse().unwrap();
    assert!(data > 14 << 20 && data < 64 << 20, "RLIMIT_DATA {data}: 14 MiB above the start");
    let (space, _) = limit(pid, "Max address space");
    assert!(space.parse::<u64>().is_ok(), "RLIMIT_AS is set: {space}");
}

#[guard_test(needs = [root])]
fn the_worker_holds_only_its_two_pipes_and_dev_null() {
    let (_m, pid) = running(Limits::default());
    let mut fds: Vec<(u32, String)> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let target = std::fs::read_link(e.path()).unwrap().display().to_string();
            (e.file_name().to_str().unwrap().parse().unwrap(), target)
        })
        .collect();
    fds.sort();
    let numbers: Vec<u32> = fds.iter().map(|(n, _)| *n).collect();
    assert_eq!(numbers, vec![0, 1, 2], "{fds:?}");
    assert!(fds[0].1.starts_with("pipe:") && fds[1].1.starts_with("pipe:"), "{fds:?}");
    assert_eq!(fds[2].1, "/dev/null");
}

#[guard_test]
fn the_sandboxed_worker_cannot_open_a_file() {
    let (mut m, pid) = running(Limits::default());
    let outcome = m.probe_open(Path::new("/etc/hostname")).unwrap();
    assert_eq!(outcome, ProbeOutcome::Blocked { syscall: libc::SYS_openat as u32 });
    assert_eq!(m.worker_pid(), None, "the filter ended that worker");
    // The next call starts a fresh one and matches.
    let out = m.classify(&[b"agentihooks swarm tick"], Instant::now() + Duration::from_secs(10));
    assert_eq!(out, vec![MatchOutcome::Matched(0)]);
    assert_ne!(m.worker_pid(), Some(pid));
}

#[guard_test]
fn without_seccomp_the_descriptor_limit_still_refuses_an_open() {
    // The probe is real: with the filter off the call runs, and RLIMIT_NOFILE (3, with 0-2
    // open) refuses it. (A root-only file would say EACCES under the `nobody` identity, but the
    // kernel allocates the descriptor before it looks at the path.)
    let (mut m, _) = running(Limits { seccomp: false, ..Limits::default() });
    assert_eq!(status(m.worker_pid().unwrap(), "Seccomp"), "0");
    let outcome = m.probe_open(Path::new("/etc/hostname")).unwrap();
    assert_eq!(outcome, ProbeOutcome::Refused { errno: libc::EMFILE });
}

#[guard_test]
fn a_memory_hungry_pattern_stays_inside_the_worker_heap_limit() {
    let mut m = Matcher::new(exe(), Limits::default());
    m.set_patterns(&["(a*)*\\1".to_string()]).unwrap();
    let idle = m.worker_memory().unwrap();
    let long = vec![b'a'; 100 << 10];
    let out = m.classify(&[&long], Instant::now() + Duration::from_secs(30));
    assert_eq!(out, vec![MatchOutcome::Budget]);
    // The worker that ran out of heap answered and lives on: its peak is bounded.
    let after = m.worker_memory().expect("still the same worker");
    println!("worker memory idle {idle:?}, after (a*)*\\1 on 100 KiB {after:?}");
    assert!(after.peak < idle.rss + (14 << 20) + (8 << 20), "{after:?}");
}

#[guard_test(needs = [root])]
fn a_root_worker_can_be_kept_for_comparison_only_when_asked() {
    let (m, pid) = running(Limits { run_as: None, ..Limits::default() });
    assert_eq!(status(pid, "Uid"), "0 0 0 0");
    assert!(!m.sandbox().unwrap().identity_dropped);
    // Everything else still holds.
    assert_eq!(status(pid, "Seccomp"), "2");
    assert_eq!(status(pid, "NoNewPrivs"), "1");
}

#[guard_test]
fn the_worker_is_called_guard_matcher() {
    let (_m, pid) = running(Limits::default());
    assert_eq!(std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap(), "guard-matcher\n");
}

guard_test::main!();
