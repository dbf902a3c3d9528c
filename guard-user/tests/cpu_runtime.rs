//! The stall watch's CPU accounting (`sched_stat_runtime` in BPF) on the running kernel: a
//! sample holds the account's processes that ran and none of its idle ones, another account's
//! spinner never, and the CPU it reports agrees with the task iterator's group CPU time.
//!
//! Needs root and /sys/kernel/btf/vmlinux; without them the test prints why and passes.
mod ebpf_harness;

use guard_test::guard_test;
use std::{
    os::unix::process::CommandExt as _,
    process::{Child, Command, Stdio},
    time::Duration,
};

use guard::ebpf::{cpu_runtime::RuntimeCpu, EbpfOptions, EbpfSource};

/// The account whose processes are sampled, and another one (uids no other test uses).
const UID: u32 = 4244;
const OTHER_UID: u32 = 4245;
/// The overflow test's account (the tests run in parallel).
const STORM_UID: u32 = 4246;
const IDLE: usize = 300;

/// One test at a time: the storm would starve the other's spinner.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

struct Kids(Vec<Child>);

impl Drop for Kids {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn(uid: u32, script: &str) -> Child {
    Command::new("sh")
        .args(["-c", script])
        .uid(uid)
        .gid(uid)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// The BPF programs (accounting maps of `entries`, default when `None`) and the accounting taken
/// out of them (the tests declare `needs = [root, ebpf]`).
fn load(entries: Option<u32>) -> (EbpfSource, RuntimeCpu) {
    let opts = EbpfOptions { ring_bytes: Some(64 << 10), cpu_run_entries: entries, ..Default::default() };
    let mut src = ebpf_harness::load(&opts);
    let rt = src.take_cpu_runtime().expect("offered once").expect("the accounting program loads");
    (src, rt)
}

#[guard_test(needs = [root, ebpf])]
fn a_sample_holds_the_busy_processes_of_the_account_and_none_of_its_idle_ones() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (mut src, mut rt) = load(None);
    assert!(src.take_cpu_runtime().is_none(), "taken twice");
    let it = src.task_iter().expect("the task iterator loads").clone();

    let mut kids = Kids((0..IDLE).map(|_| spawn(UID, "exec sleep 120")).collect());
    std::thread::sleep(Duration::from_millis(1500)); // all asleep
    let idle: Vec<u32> = kids.0.iter().map(Child::id).collect();
    assert!(rt.sample(UID).unwrap().is_empty(), "the first sample starts the accounting");

    let spinner = spawn(UID, "while :; do :; done");
    let other = spawn(OTHER_UID, "while :; do :; done");
    let (spin, other_pid) = (spinner.id(), other.id());
    kids.0.extend([spinner, other]);
    std::thread::sleep(Duration::from_millis(1000));

    let group_cpu =
        |pid: u32| it.cpu_sample(UID).unwrap().into_iter().find(|s| s.state.id.pid == pid).map(|s| s.cpu_ns).unwrap();
    let s1 = rt.sample(UID).unwrap();
    let c1 = group_cpu(spin);
    std::thread::sleep(Duration::from_millis(1500));
    let s2 = rt.sample(UID).unwrap();
    let c2 = group_cpu(spin);

    for s in [&s1, &s2] {
        let pids: Vec<u32> = s.iter().map(|(p, _)| p.id.pid).collect();
        assert!(pids.contains(&spin), "the spinner is missing: {pids:?}");
        assert!(!pids.contains(&other_pid), "another account's spinner is in: {pids:?}");
        assert!(!pids.iter().any(|p| idle.contains(p)), "an idle process is in: {pids:?}");
        assert!(s.iter().all(|(p, _)| p.euid == UID));
        assert!(s.len() < 10, "{} processes ran", s.len());
    }
    let total = |s: &[(guard::event::ProcState, u64)]| s.iter().find(|(p, _)| p.id.pid == spin).unwrap().1;
    let (t1, t2) = (total(&s1), total(&s2));
    let (ours, iters) = ((t2 - t1) as f64 / 1e9, (c2 - c1) as f64 / 1e9);
    eprintln!("spinner over the last interval: {ours:.3} s by the accounting, {iters:.3} s by the task iterator");
    assert!(ours >= 0.05, "a spinner used {ours:.3} s of 1.5 s");
    assert!((ours - iters).abs() <= 0.1 * iters + 0.02, "accounting {ours:.3} s vs task iterator {iters:.3} s");
    let name = s2.iter().find(|(p, _)| p.id.pid == spin).unwrap().0.comm;
    assert_eq!(name.to_string(), "sh");

    // Paused, the program stops adding; the next sample starts afresh.
    rt.pause();
    std::thread::sleep(Duration::from_millis(300));
    assert!(rt.sample(UID).unwrap().is_empty());
    std::thread::sleep(Duration::from_millis(500));
    let s3 = rt.sample(UID).unwrap();
    assert!(s3.iter().any(|(p, _)| p.id.pid == spin), "{s3:?}");
    assert!(total(&s3) < t2, "the totals restarted after the pause");
}

/// Hostile: the account runs more processes in one interval than the accounting map holds. That
/// sample is an error (the stall watch skips the tick; it never takes the overflow for calm), and
/// the next interval is sampled as usual.
#[guard_test(needs = [root, ebpf, pid_space])]
fn more_processes_than_the_map_holds_make_one_sample_an_error_then_it_recovers() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // The maps shrunk to 256 entries (the daemon's hold 16,384), so a few hundred processes
    // overflow them. Pids are handed out in a cycle: n in a row are distinct while the cycle has
    // room for them (`pid_space`: kernel.pid_max of 8192 or more).
    let entries = 256u32;
    let n = entries as u64 + 400;
    assert!(n + 4096 <= guard_test::need::PID_SPACE);
    let (_src, mut rt) = load(Some(entries));
    assert!(rt.sample(STORM_UID).unwrap().is_empty());
    let mut storm = Command::new("bash")
        .args(["-c", &format!("for ((i = 0; i < {n}; i++)); do ( : ) & done; wait")])
        .uid(STORM_UID)
        .gid(STORM_UID)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(storm.wait().unwrap().success());
    let err = rt.sample(STORM_UID).expect_err("an overflowed interval is not a sample");
    assert!(err.to_string().contains("more than 256 processes ran"), "{err}");
    assert!(err.to_string().contains("this sample is skipped"), "{err}");
    let spinner = Kids(vec![spawn(STORM_UID, "while :; do :; done")]);
    std::thread::sleep(Duration::from_millis(500));
    let next = rt.sample(STORM_UID).expect("the next interval is sampled");
    assert!(next.iter().any(|(p, _)| p.id.pid == spinner.0[0].id()), "{next:?}");
    assert!(next.len() < 10, "{} processes in a quiet interval", next.len());
}

/// Watching root: kernel threads (uid 0, children of kthreadd) never appear, as in the task
/// iterator's view.
#[guard_test(needs = [root, ebpf])]
fn kernel_threads_are_never_sampled_even_for_root() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (_src, mut rt) = load(None);
    assert!(rt.sample(0).unwrap().is_empty());
    std::thread::sleep(Duration::from_millis(1000));
    let s = rt.sample(0).unwrap();
    assert!(s.iter().any(|(p, _)| p.id.pid == std::process::id()), "this test itself ran: {s:?}");
    for (p, _) in &s {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", p.id.pid)) else { continue };
        let ppid: u32 = stat.rsplit(')').next().unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
        assert!(p.id.pid != 2 && ppid != 2, "a kernel thread was sampled: {p:?}");
    }
}

/// The daemon sets a minimum age (the shortest `peggedFor`): a process younger than that makes no
/// entry, however hard it spins (a fork storm's processes never cost the sample anything), while
/// one older than that is in every sample it ran in; the young one joins once it is old enough.
#[guard_test(needs = [root, ebpf])]
fn a_young_spinner_is_not_accounted_until_it_is_old_enough_and_an_old_one_is() {
    const MIN_AGE: Duration = Duration::from_secs(3);
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (_src, mut rt) = load(None);
    rt.set_min_age(MIN_AGE);
    let mut kids = Kids(vec![spawn(UID, "while :; do :; done")]);
    let old = kids.0[0].id();
    std::thread::sleep(MIN_AGE + Duration::from_millis(500));
    assert!(rt.sample(UID).unwrap().is_empty(), "the first sample starts the accounting");
    kids.0.push(spawn(UID, "while :; do :; done"));
    let young = kids.0[1].id();
    std::thread::sleep(Duration::from_millis(1000));
    let s = rt.sample(UID).unwrap();
    let pids: Vec<u32> = s.iter().map(|(p, _)| p.id.pid).collect();
    assert!(pids.contains(&old), "the old spinner is missing: {pids:?}");
    assert!(!pids.contains(&young), "a spinner of 1 s was accounted with a minimum age of 3 s: {pids:?}");
    std::thread::sleep(MIN_AGE);
    let s = rt.sample(UID).unwrap();
    let pids: Vec<u32> = s.iter().map(|(p, _)| p.id.pid).collect();
    assert!(pids.contains(&old) && pids.contains(&young), "both are old enough now: {pids:?}");
    let busy = s.iter().find(|(p, _)| p.id.pid == young).unwrap().1;
    assert!(
        busy > 100_000_000,
        "the young spinner's first accounted interval holds its CPU since it turned 3 s old: {busy} ns"
    );
}

guard_test::main!();
