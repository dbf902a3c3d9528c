//! The `ebpf` event source against the running kernel: real processes, real tracepoints.
//!
//! Needs root and the ebpf backend (`needs = [root, ebpf]`). Children that must create threads,
//! rename themselves or change uid are this test binary re-executed as a helper mode
//! (`guard_test::child`): the mode runs instead of the tests (so the helper is single-threaded
//! until it makes its own threads) and exits. Every wait is bounded; a `Child` kills and reaps
//! its process on drop.
mod ebpf_harness;

use std::{os::unix::fs::PermissionsExt, process::Command, time::Duration};

use guard_test::{
    child::{say, wait_for_eof, Child},
    guard_test,
};

use guard::{
    comm::Comm,
    ebpf::{CredTracking, EbpfOptions, EbpfSource},
    event::{Event, StateKind},
};

const WAIT: Duration = Duration::from_secs(5);
/// How long the forking helper may take to end (a hang's bound, not a speed requirement).
const CHILD_END: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// The helper side (runs in the child instead of the tests).

fn helper_main(mode: &str) {
    match mode {
        "threads" => helper_threads(),
        "rename" => helper_rename(),
        "setuid" => helper_setuid(),
        "leader_exits_first" => helper_leader_exits_first(),
        "exec_from_thread" => helper_exec_from_thread(),
        "forks" => helper_forks(),
        "unprivileged_load" => helper_unprivileged_load(),
        other => panic!("unknown helper mode {other}"),
    }
    std::process::exit(0);
}

fn set_name(name: &str) {
    let c = std::ffi::CString::new(name).unwrap();
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    assert_eq!(unsafe { libc::prctl(libc::PR_SET_NAME, c.as_ptr() as libc::c_ulong, 0, 0, 0) }, 0);
}

fn gettid() -> i64 {
    // SAFETY: no arguments.
    unsafe { libc::syscall(libc::SYS_gettid) }
}

fn helper_threads() {
    let threads: Vec<_> =
        (0..3).map(|_| std::thread::spawn(|| std::thread::sleep(Duration::from_millis(100)))).collect();
    for t in threads {
        t.join().unwrap();
    }
    say("joined");
    wait_for_eof();
}

fn helper_rename() {
    std::thread::spawn(|| {
        set_name("guard-thread1");
        std::fs::write(format!("/proc/self/task/{}/comm", gettid()), "guard-thread2").unwrap();
    })
    .join()
    .unwrap();
    set_name("guard-leader1");
    std::fs::write("/proc/self/comm", "guard-leader2").unwrap();
    say("renamed");
    wait_for_eof();
}

fn helper_setuid() {
    // The raw syscall changes only the calling thread (glibc's wrapper would change them all).
    std::thread::spawn(|| {
        // SAFETY: plain syscall; -1 keeps the real and saved uids.
        assert_eq!(unsafe { libc::syscall(libc::SYS_setresuid, -1, 65533, -1) }, 0);
    })
    .join()
    .unwrap();
    // SAFETY: as above, for the leader.
    assert_eq!(unsafe { libc::syscall(libc::SYS_setresuid, -1, 65534, -1) }, 0);
    say("setuid");
    wait_for_eof();
}

fn helper_leader_exits_first() {
    std::thread::spawn(wait_for_eof);
    say("ready");
    // The leader becomes a zombie; the process lives on in the thread, whose return is the
    // last exit. The raw exit(2), not pthread_exit: that unwinds, which must not cross the
    // `extern "C"` constructor.
    // SAFETY: ends only this thread; nothing on its stack is borrowed by the other.
    unsafe { libc::syscall(libc::SYS_exit, 0) };
}

fn helper_exec_from_thread() {
    std::thread::spawn(|| {
        // Wait for the test to read our start time before the exec.
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).unwrap();
        let prog = std::ffi::CString::new("/bin/sleep").unwrap();
        let args = [std::ffi::CString::new("sleep").unwrap(), std::ffi::CString::new("0.3").unwrap()];
        let argv = [args[0].as_ptr(), args[1].as_ptr(), std::ptr::null()];
        // SAFETY: NUL-terminated argv of valid C strings.
        unsafe { libc::execv(prog.as_ptr(), argv.as_ptr()) };
        panic!("execv failed: {}", std::io::Error::last_os_error());
    });
    say("ready");
    std::thread::sleep(Duration::from_secs(10));
}

fn helper_forks() {
    for _ in 0..400 {
        // SAFETY: single-threaded; the child only calls _exit.
        match unsafe { libc::fork() } {
            0 => unsafe { libc::_exit(0) },
            -1 => panic!("fork: {}", std::io::Error::last_os_error()),
            pid => {
                // SAFETY: reaps our own child.
                unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
            }
        }
    }
}

fn helper_unprivileged_load() {
    // SAFETY: plain syscalls; leaving uid 0 for good drops every capability.
    unsafe {
        assert_eq!(libc::setgroups(0, std::ptr::null()), 0);
        assert_eq!(libc::setresgid(65534, 65534, 65534), 0);
        assert_eq!(libc::setresuid(65534, 65534, 65534), 0);
    }
    match EbpfSource::load(&EbpfOptions { ring_bytes: None, ..Default::default() }) {
        Ok(_) => say("loaded"),
        Err(e) => say(e.reason()),
    }
}

// ---------------------------------------------------------------------------------------------
// The test side.

/// The source watching root's processes (the children here run as root; one that changes its
/// uid leaves the account), or None (with the reason printed) where this machine cannot run the
/// test.
fn load(ring_bytes: Option<u32>) -> EbpfSource {
    ebpf_harness::load(&EbpfOptions { account: Some(0), ring_bytes, ..Default::default() })
}

/// Drains events of `pid` into `seen` until `done(seen)` or the deadline; returns `done`.
async fn collect(src: &mut EbpfSource, pid: u32, seen: &mut Vec<Event>, done: impl Fn(&[Event]) -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        src.drain(usize::MAX, |e| {
            let e = e.expect("every record decodes");
            if e.id().pid == pid {
                seen.push(e);
            }
        });
        if done(seen) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return done(seen);
        }
        // The programs submit without a wake-up until the ring is 1/16 full (the daemon drains
        // on a timer and before each tick), so poll as well as wait.
        let _ = tokio::time::timeout(Duration::from_millis(20), src.readable()).await;
    }
}

/// Lets in-flight records arrive, then collects everything of `pid` (for "nothing else" checks).
async fn settle(src: &mut EbpfSource, pid: u32, seen: &mut Vec<Event>) {
    tokio::time::sleep(Duration::from_millis(200)).await;
    collect(src, pid, seen, |_| false).await;
}

fn count(seen: &[Event], pred: impl Fn(&Event) -> bool) -> usize {
    seen.iter().filter(|e| pred(e)).count()
}

fn is_exit(e: &Event) -> bool {
    matches!(e, Event::Exit(_))
}

fn is_fork(e: &Event) -> bool {
    matches!(e, Event::Fork { .. })
}

/// `/proc/PID/stat` field 22, start time in clock ticks after boot.
fn stat_start_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
    // Field 3 (state) is the first after the comm; field 22 is 19 further.
    after_comm.split(' ').nth(19).unwrap().parse().unwrap()
}

fn comm_of_this_thread() -> Comm {
    let name = std::fs::read_to_string("/proc/thread-self/comm").unwrap();
    Comm::new(name.trim_end_matches('\n').as_bytes())
}

fn name(e: &Event) -> Option<String> {
    match e {
        Event::Fork { child: s, .. } | Event::State { state: s, .. } => Some(s.comm.to_string()),
        Event::Exit(_) => None,
    }
}

#[guard_test(needs = [root, ebpf])]
async fn sleep_child_gives_fork_exec_and_exit_with_proc_identity() {
    let mut src = load(None);
    let parent_name = comm_of_this_thread();
    let mut child = Child::spawn(Command::new("sleep").arg("0.5"));
    let pid = child.pid();
    let mut seen = Vec::new();
    assert!(
        collect(&mut src, pid, &mut seen, |s| s
            .iter()
            .any(|e| matches!(e, Event::State { kind: StateKind::Exec, .. })))
        .await,
        "{seen:?}"
    );
    let start = stat_start_ticks(pid);
    child.wait();
    assert!(collect(&mut src, pid, &mut seen, |s| s.iter().any(is_exit)).await, "{seen:?}");
    settle(&mut src, pid, &mut seen).await;

    assert_eq!(seen.len(), 3, "FORK, EXEC, EXIT and nothing else (no RENAME for exec's own rename): {seen:?}");
    let Event::Fork { child: forked, parent_pid } = seen[0] else { panic!("first is FORK: {seen:?}") };
    assert_eq!(parent_pid, std::process::id());
    assert_eq!(forked.comm, parent_name, "a fork keeps the forking thread's name");
    assert_eq!(forked.euid, 0);
    let Event::State { kind: StateKind::Exec, state: exec } = seen[1] else { panic!("second is EXEC: {seen:?}") };
    assert_eq!(exec.comm.as_bytes(), b"sleep");
    assert_eq!(exec.euid, 0);
    assert!(is_exit(&seen[2]), "{seen:?}");
    for e in &seen {
        assert_eq!(e.id().start_ticks, start, "start time as /proc/{pid}/stat reports it: {e:?}");
    }
}

#[guard_test(needs = [root, ebpf])]
async fn exec_of_a_setuid_binary_reports_the_new_effective_uid() {
    let mut src = load(None);
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("nobody-sleep");
    std::fs::copy("/bin/sleep", &bin).unwrap();
    std::os::unix::fs::chown(&bin, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let mut child = Child::spawn(Command::new(&bin).arg("0.5"));
    let pid = child.pid();
    let mut seen = Vec::new();
    assert!(
        collect(&mut src, pid, &mut seen, |s| s
            .iter()
            .any(|e| matches!(e, Event::State { kind: StateKind::Exec, .. })))
        .await,
        "{seen:?}"
    );
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap().to_string();
    child.wait();
    let exec = seen
        .iter()
        .find_map(|e| if let Event::State { kind: StateKind::Exec, state: s } = e { Some(*s) } else { None })
        .unwrap();
    assert_eq!(exec.euid, 65534, "euid after commit_creds; /proc says {uid_line:?}; {seen:?}");
    assert_eq!(exec.comm.as_bytes(), b"nobody-sleep");
    assert_eq!(count(&seen, |e| matches!(e, Event::State { kind: StateKind::Rename, .. })), 0, "{seen:?}");
}

#[guard_test(needs = [root, ebpf])]
async fn threads_give_one_fork_and_only_the_last_exit_counts() {
    let mut src = load(None);
    let mut child = Child::helper("threads");
    let pid = child.pid();
    child.expect_line("joined");
    let start = stat_start_ticks(pid);
    let mut seen = Vec::new();
    settle(&mut src, pid, &mut seen).await;
    assert_eq!(count(&seen, is_fork), 1, "three threads made no FORK: {seen:?}");
    assert_eq!(count(&seen, is_exit), 0, "three threads ended, the process did not: {seen:?}");
    child.close_stdin();
    child.wait();
    assert!(collect(&mut src, pid, &mut seen, |s| s.iter().any(is_exit)).await, "{seen:?}");
    settle(&mut src, pid, &mut seen).await;
    assert_eq!(count(&seen, is_exit), 1, "{seen:?}");
    assert!(seen.iter().all(|e| e.id().start_ticks == start), "{start}: {seen:?}");
}

#[guard_test(needs = [root, ebpf])]
async fn renaming_the_leader_gives_rename_and_renaming_a_thread_does_not() {
    let mut src = load(None);
    let mut child = Child::helper("rename");
    let pid = child.pid();
    child.expect_line("renamed");
    let start = stat_start_ticks(pid);
    let mut seen = Vec::new();
    settle(&mut src, pid, &mut seen).await;
    let renames: Vec<_> =
        seen.iter().filter(|e| matches!(e, Event::State { kind: StateKind::Rename, .. })).filter_map(name).collect();
    assert_eq!(renames, ["guard-leader1", "guard-leader2"], "prctl and /proc/PID/comm of the leader only: {seen:?}");
    assert!(seen.iter().all(|e| e.id().start_ticks == start), "{start}: {seen:?}");
}

#[guard_test(needs = [root, ebpf])]
async fn setresuid_of_the_leader_gives_setuid_with_the_new_euid() {
    let mut src = load(None);
    if matches!(src.cred_tracking(), CredTracking::Audit { .. }) {
        panic!("neither the credential hook nor the setuid tracepoints attached: {:?}", src.cred_tracking());
    }
    let mut child = Child::helper("setuid");
    let pid = child.pid();
    child.expect_line("setuid");
    let start = stat_start_ticks(pid);
    let mut seen = Vec::new();
    settle(&mut src, pid, &mut seen).await;
    let setuids: Vec<_> = seen
        .iter()
        .filter_map(|e| if let Event::State { kind: StateKind::Setuid, state: s } = e { Some(*s) } else { None })
        .collect();
    assert_eq!(setuids.len(), 1, "the thread's own setresuid is not the process's: {seen:?}");
    assert_eq!(setuids[0].euid, 65534);
    assert_eq!(setuids[0].id.start_ticks, start);
}

#[guard_test(needs = [root, ebpf])]
async fn when_the_leader_exits_first_the_last_thread_reports_exit_with_the_leaders_start() {
    let mut src = load(None);
    let mut child = Child::helper("leader_exits_first");
    let pid = child.pid();
    child.expect_line("ready");
    let start = stat_start_ticks(pid);
    let mut seen = Vec::new();
    settle(&mut src, pid, &mut seen).await;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        status.contains("\nState:\tZ (zombie)\n") && status.contains("\nThreads:\t2\n"),
        "a zombie leader and one thread: {status}"
    );
    assert_eq!(count(&seen, is_exit), 0, "the leader alone exited: {seen:?}");
    child.close_stdin();
    child.wait();
    assert!(collect(&mut src, pid, &mut seen, |s| s.iter().any(is_exit)).await, "{seen:?}");
    settle(&mut src, pid, &mut seen).await;
    assert_eq!(count(&seen, is_exit), 1, "{seen:?}");
    assert!(seen.iter().all(|e| e.id().start_ticks == start), "{start}: {seen:?}");
}

#[guard_test(needs = [root, ebpf])]
async fn exec_from_a_thread_keeps_the_pid_and_the_leaders_start() {
    let mut src = load(None);
    let mut child = Child::helper("exec_from_thread");
    let pid = child.pid();
    child.expect_line("ready");
    let start = stat_start_ticks(pid);
    let mut seen = Vec::new();
    child.send_line();
    let is_sleep_exec =
        |e: &Event| matches!(e, Event::State { kind: StateKind::Exec, state: s } if s.comm.as_bytes() == b"sleep");
    assert!(collect(&mut src, pid, &mut seen, |s| s.iter().any(is_sleep_exec)).await, "{seen:?}");
    assert_eq!(std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap(), "sleep\n");
    child.wait();
    assert!(collect(&mut src, pid, &mut seen, |s| s.iter().any(is_exit)).await, "{seen:?}");
    settle(&mut src, pid, &mut seen).await;
    assert_eq!(count(&seen, is_exit), 1, "the old leader's exit in de_thread() is not the process's: {seen:?}");
    assert_eq!(count(&seen, |e| matches!(e, Event::State { kind: StateKind::Rename, .. })), 0, "{seen:?}");
    assert!(seen.iter().all(|e| e.id().start_ticks == start), "{start}: {seen:?}");
}

#[guard_test(needs = [root, ebpf])]
async fn a_full_ring_counts_lost_records() {
    let mut src = load(Some(4096));
    assert_eq!(src.lost(), 0);
    // The bound only catches a hang: 400 forks took longer than the default in an arm64 guest
    // under TCG.
    let mut child = Child::helper("forks").within(CHILD_END);
    child.wait();
    let lost = src.lost();
    assert!(lost > 0, "400 forks and exits into a 4096-byte ring lost nothing");
    // Draining works after a loss, and the count never goes back.
    let drained = src.drain(usize::MAX, |e| {
        e.expect("decodes");
    });
    assert!(drained > 0 && drained < 4096 / 40);
    assert!(src.lost() >= lost);
}

#[guard_test]
fn ring_sizes_that_are_not_a_power_of_two_of_at_least_a_page_are_refused() {
    for bytes in [0, 1000, 2048, 3 << 12] {
        let e =
            EbpfSource::load(&EbpfOptions { ring_bytes: Some(bytes), ..Default::default() }).err().expect("refused");
        assert_eq!(e.reason(), "bad_ring_size", "{bytes}: {e}");
    }
}

#[guard_test(needs = [root, ebpf])]
async fn readable_returns_while_records_remain_after_a_partial_drain() {
    let mut src = load(None);
    for _ in 0..3 {
        Child::spawn(&mut Command::new("true")).wait();
    }
    // The programs ran in the children, so their records are in the ring by now; the kernel
    // sends no further wake-up for them once we stop early.
    tokio::time::timeout(WAIT, src.readable()).await.expect("records are waiting").unwrap();
    assert_eq!(
        src.drain(1, |e| {
            e.expect("decodes");
        }),
        1
    );
    tokio::time::timeout(Duration::from_millis(100), src.readable())
        .await
        .expect("still readable after a partial drain")
        .unwrap();
    assert!(
        src.drain(usize::MAX, |e| {
            e.expect("decodes");
        }) >= 8,
        "3 × (FORK, EXEC, EXIT) less the one"
    );
    // After a full drain, a few new records (below 1/16 of the ring: submitted without a
    // wake-up) are seen by the next readable() at once.
    Child::spawn(&mut Command::new("true")).wait();
    tokio::time::timeout(Duration::from_millis(100), src.readable())
        .await
        .expect("records submitted without a wake-up are still readable")
        .unwrap();
    assert!(
        src.drain(usize::MAX, |e| {
            e.expect("decodes");
        }) >= 3
    );
}

/// The kernel side batches wake-ups: a reader asleep on an empty ring is woken once the
/// unread records reach 1/16 of the ring (here 16 KiB: 1 KiB, about 21 records), not before.
#[guard_test(needs = [root, ebpf])]
async fn a_sleeping_reader_is_woken_once_the_ring_is_a_sixteenth_full() {
    let mut src = load(Some(16 * 1024));
    tokio::time::sleep(Duration::from_millis(100)).await;
    src.drain(usize::MAX, |_| {});
    let waiter = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        // 12 processes: 36+ records, over the 1 KiB mark.
        for _ in 0..12 {
            Child::spawn(&mut Command::new("true")).wait();
        }
    };
    let (r, ()) = tokio::join!(tokio::time::timeout(WAIT, src.readable()), waiter);
    r.expect("a ring 1/16 full wakes the reader").unwrap();
    // At least the 1 KiB that triggers the wake-up (the ring sees the whole machine, so other
    // tests' processes may have filled it further, even past its size).
    assert!(
        src.drain(usize::MAX, |e| {
            e.expect("decodes");
        }) >= 21
    );
}

#[guard_test(needs = [root, ebpf])]
fn loading_without_privileges_is_permission_denied() {
    // Root loads them here (the test's need); the helper without privileges may not.
    drop(load(None));
    let mut child = Child::helper("unprivileged_load");
    child.expect_line("permission_denied");
    child.wait();
}

guard_test::main!(helpers = helper_main);
