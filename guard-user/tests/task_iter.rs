//! The BPF task iterator against /proc on the running machine: both views agree on every
//! process (pid, start time, euid, name), on the hard cases one by one, and on CPU time.
//!
//! Needs root and the ebpf backend (`needs = [root, ebpf]`). Children that must make threads,
//! become a zombie leader or change uid are this test binary re-executed as a helper mode
//! (`guard_test::child`). Every wait is bounded; a `Child` kills and reaps its process on drop.
mod ebpf_harness;

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use guard_test::{
    child::{say, wait_for_eof, Child},
    guard_test,
};

use guard::{
    ebpf::{task_iter::TaskIter, EbpfOptions, EbpfSource},
    event::{clock_ticks_per_sec, ProcState},
    procfs,
};

const WAIT: Duration = Duration::from_secs(10);
/// The uid the non-dumpable helper takes (any uid other than root's and the test's).
const OTHER_UID: u32 = 4243;

// ---------------------------------------------------------------------------------------------
// The helper side (runs in the child instead of the tests).

fn helper_main(mode: &str) {
    match mode {
        "busy_threads" => helper_busy_threads(),
        "zombie_leader" => helper_zombie_leader(),
        "non_dumpable" => helper_non_dumpable(),
        "renamed" => helper_renamed(),
        other => panic!("unknown helper mode {other}"),
    }
    std::process::exit(0);
}

/// Burns about `ms` of CPU in the calling thread.
fn burn(ms: u64) {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    let cpu = |t: &mut libc::timespec| {
        // SAFETY: writes one timespec we own.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, t) };
        t.tv_sec as u64 * 1000 + t.tv_nsec as u64 / 1_000_000
    };
    let until = cpu(&mut t) + ms;
    let mut x = 0u64;
    while cpu(&mut t) < until {
        for i in 0..10_000u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
}

/// Three threads: one burns and exits (its time is in `signal->sum_sched_runtime`), two burn
/// and stay, the leader burns too; then everyone sleeps so the CPU times hold still.
fn helper_busy_threads() {
    std::thread::spawn(|| burn(150)).join().unwrap();
    // Everyone burns, then meets at the barrier: "ready" means all the CPU time is spent.
    let done = std::sync::Arc::new(std::sync::Barrier::new(3));
    let _stay: Vec<_> = (0..2)
        .map(|_| {
            let done = done.clone();
            std::thread::spawn(move || {
                burn(100);
                done.wait();
                std::thread::sleep(Duration::from_secs(3600));
            })
        })
        .collect();
    burn(50);
    done.wait();
    say("ready");
    wait_for_eof();
}

fn helper_zombie_leader() {
    std::thread::spawn(wait_for_eof);
    say("ready");
    // The leader exits alone (raw exit(2), not pthread_exit: that would unwind through the
    // `extern "C"` constructor): it is a zombie while the thread keeps the process alive.
    // SAFETY: ends only this thread; nothing on its stack is borrowed by the other.
    unsafe { libc::syscall(libc::SYS_exit, 0) };
}

fn helper_non_dumpable() {
    // Changing the euid makes the process non-dumpable (suid_dumpable is 0): /proc/PID then
    // belongs to root, which the /proc scan must see through; say it explicitly anyway.
    // SAFETY: plain syscalls.
    unsafe {
        assert_eq!(libc::setgroups(0, std::ptr::null()), 0);
        assert_eq!(libc::setresuid(OTHER_UID, OTHER_UID, OTHER_UID), 0);
        libc::prctl(libc::PR_SET_DUMPABLE, 0);
    }
    say("ready");
    wait_for_eof();
}

fn helper_renamed() {
    std::fs::write("/proc/self/comm", "guard-renamed").unwrap();
    say("ready");
    wait_for_eof();
}

// ---------------------------------------------------------------------------------------------
// The test side.

/// The loaded source with its iterator (the tests declare `needs = [root, ebpf]`).
fn load() -> EbpfSource {
    let src = ebpf_harness::load(&EbpfOptions { ring_bytes: Some(64 << 10), ..Default::default() });
    if let Some(e) = src.task_iter_problem() {
        panic!("the task iterator did not load on a kernel with BTF: {e} (reason={})", e.reason());
    }
    src
}

/// The helper's first line, which starts with `ready`.
fn ready(child: &mut Child) -> String {
    let line = child.read_line();
    assert!(line.starts_with("ready"), "helper {} said {line:?}", child.pid());
    line
}

fn iter(src: &EbpfSource) -> &TaskIter {
    src.task_iter().expect("load() checked the iterator")
}

fn by_pid(v: Vec<ProcState>) -> HashMap<u32, ProcState> {
    v.into_iter().map(|p| (p.id.pid, p)).collect()
}

/// Clock ticks since boot now, on the clock of /proc/PID/stat's start time.
fn boottime_ticks() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut t) };
    (t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64) / (1_000_000_000 / clock_ticks_per_sec())
}

/// Whether the process is gone, a zombie, or exiting now (`PF_EXITING` in /proc/PID/stat's flags).
fn exiting_or_gone(pid: u32) -> bool {
    const PF_EXITING: u32 = 0x4;
    let Ok(stat) = std::fs::read(format!("/proc/{pid}/stat")) else { return true };
    procfs::parse_stat(&stat).is_none_or(|s| s.state == b'Z' || s.state == b'X' || s.flags & PF_EXITING != 0)
}

/// utime + stime of the whole group from /proc/PID/stat (fields 14 and 15), in ns.
fn proc_cpu_ns(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<u64> =
        stat[stat.rfind(')').unwrap() + 2..].split(' ').skip(11).take(2).map(|x| x.parse().unwrap()).collect();
    (f[0] + f[1]) * (1_000_000_000 / clock_ticks_per_sec())
}

#[guard_test(needs = [root, ebpf])]
fn the_iterator_and_proc_agree_on_every_process_that_outlived_both_reads() {
    let src = load();
    let mut helpers: Vec<Child> =
        ["busy_threads", "zombie_leader", "non_dumpable", "renamed"].iter().map(|m| Child::helper(m)).collect();
    for h in &mut helpers {
        ready(h);
    }
    // /proc before and after the iterator: a process the same in both existed, unchanged,
    // across the iterator's read, so the iterator must report exactly that.
    let t0 = boottime_ticks();
    let before = by_pid(procfs::snapshot().unwrap());
    let seen = by_pid(iter(&src).proc_states().unwrap());
    let after = by_pid(procfs::snapshot().unwrap());
    let mut compared = Vec::new();
    for (pid, b) in &before {
        let Some(a) = after.get(pid).filter(|a| a.id == b.id) else { continue }; // exited meanwhile
        if *pid == 1 && !seen.contains_key(pid) {
            // Seen on the Firecracker development VM's kernel (6.18.44-fc): its task iterator
            // never visits pid 1 (the VM's agent) or its threads, which /proc lists. Debian's
            // kernels visit it. The daemon never counts or signals pid 1 either way.
            eprintln!("note: this kernel's task iterator does not visit pid 1 ({b:?}); not compared");
            continue;
        }
        if seen.get(pid).map(|s| s.id) != Some(b.id) && exiting_or_gone(*pid) {
            // Its last thread had passed the point of no return: the iterator (like the EXIT
            // event) no longer counts it while /proc still lists it during the teardown.
            continue;
        }
        assert_eq!(seen.get(pid).map(|s| s.id), Some(b.id), "pid {pid} lived through both reads: {b:?}");
        if a == b {
            assert_eq!(seen[pid], *b, "pid {pid}: /proc says {b:?} before and after, the iterator disagrees");
            compared.push(*pid);
        }
    }
    // Nothing the iterator reports is unknown to /proc, unless it was born during the reads
    // (an exited process lingering in the iterator's view would fail here).
    for (pid, s) in &seen {
        let known = before.get(pid).is_some_and(|b| b.id == s.id) || after.get(pid).is_some_and(|a| a.id == s.id);
        assert!(known || s.id.start_ticks + 1 >= t0, "pid {pid}: the iterator reports {s:?}, /proc never did");
    }
    // A VM guest runs little besides this test; the helpers at least must have held still.
    for h in &helpers {
        assert!(compared.contains(&h.pid()), "helper {} was not compared (compared: {compared:?})", h.pid());
    }
    // The hard cases are among them, with what makes them hard.
    let [busy, zombie, other_uid, renamed] = &helpers[..] else { unreachable!() };
    for h in &helpers {
        assert!(seen.contains_key(&h.pid()), "helper {} missing from the iterator's view", h.pid());
    }
    assert_eq!(seen[&other_uid.pid()].euid, OTHER_UID, "the non-dumpable process's euid");
    assert_eq!(seen[&renamed.pid()].comm.as_bytes(), b"guard-renamed");
    let zstate = std::fs::read_to_string(format!("/proc/{}/stat", zombie.pid())).unwrap();
    assert!(zstate.contains(") Z "), "the zombie helper's leader is a zombie: {zstate}");
    assert!(before.contains_key(&zombie.pid()), "/proc counts the zombie leader with a live thread");
    let _ = busy;
}

#[guard_test(needs = [root, ebpf])]
fn a_multi_threaded_process_counts_once_with_its_whole_groups_cpu_time() {
    let src = load();
    let mut busy = Child::helper("busy_threads");
    ready(&mut busy);
    let pid = busy.pid();
    let recs = iter(&src).snapshot().unwrap();
    assert_eq!(recs.iter().filter(|r| r.tgid == pid).count(), 1, "one record for the process");
    let rec = recs.iter().find(|r| r.tgid == pid).unwrap();
    let proc_ns = proc_cpu_ns(pid);
    // It burned ~150 (a thread that exited) + 2 × 100 + 50 ms. /proc splits the same total
    // into utime and stime and truncates each to a 10 ms tick, so they differ by < 2 ticks;
    // allow a third for the helper's own start-up and the scheduler tick's accounting lag.
    let tick = 1_000_000_000 / clock_ticks_per_sec();
    assert!(rec.cpu_ns >= 390_000_000, "the group's CPU time {} ns misses threads (≥ 400 ms burned)", rec.cpu_ns);
    assert!(rec.cpu_ns.abs_diff(proc_ns) <= 3 * tick, "iterator {} ns, /proc utime+stime {proc_ns} ns", rec.cpu_ns);
    let sample = iter(&src).cpu_sample(0).unwrap();
    let s = sample.iter().find(|s| s.state.id.pid == pid).expect("a root process is in root's CPU sample");
    assert!(s.cpu_ns >= rec.cpu_ns, "CPU time does not go back");
    assert!(sample.iter().all(|s| s.state.euid == 0), "the sample holds only the uid asked for");
}

#[guard_test(needs = [root, ebpf])]
fn a_zombie_leader_counts_while_its_thread_lives_and_not_after() {
    let src = load();
    let mut z = Child::helper("zombie_leader");
    ready(&mut z);
    let pid = z.pid();
    // The leader's exit is asynchronous to our read of its line.
    let until = Instant::now() + WAIT;
    while !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap().contains(") Z ") {
        assert!(Instant::now() < until, "the leader of {pid} never became a zombie");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(iter(&src).snapshot().unwrap().iter().any(|r| r.tgid == pid), "zombie leader with a live thread");
    // Closing stdin ends the thread: the group is gone, though unreaped (a zombie) until we wait.
    z.close_stdin();
    let until = Instant::now() + WAIT;
    while iter(&src).snapshot().unwrap().iter().any(|r| r.tgid == pid) {
        assert!(Instant::now() < until, "the exited group {pid} still counts");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists(), "still unreaped: a zombie, not counted");
}

#[guard_test(needs = [root, ebpf])]
fn snapshots_run_concurrently_from_clones_while_tasks_come_and_go() {
    let src = load();
    let it = iter(&src).clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // New tasks during the reads: the kernel's walk would go on past its end marker to them.
    let churn = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::spawn(|| ()).join().unwrap();
            }
        })
    };
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let it = it.clone();
            std::thread::spawn(move || (0..25).map(|_| it.snapshot().unwrap().len()).min().unwrap())
        })
        .collect();
    for r in readers {
        assert!(r.join().unwrap() > 1, "every session sees the machine");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    churn.join().unwrap();
}

guard_test::main!(helpers = helper_main);
