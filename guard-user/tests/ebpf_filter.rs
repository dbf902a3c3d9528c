//! The in-kernel account filter against the running kernel: programs loaded for one account
//! put nothing of another account's processes into the ring, and a process that enters or
//! leaves the account through its credentials (setuid, exec of a set-user-ID binary) reaches
//! the table at once, with no scan or audit — through the `commit_creds` hook, and through the
//! raw syscall tracepoints where the hook is left out, for the 64-bit setuid family and the
//! 32-bit compat one (`setresuid32` by `int 0x80` on x86_64, by an AArch32 program on arm64).
//!
//! Needs root and the ebpf backend (`needs = [root, ebpf]`); the 32-bit tests a kernel that runs
//! 32-bit programs (`compat32`). Every test holds the host-wide test lock: they all watch
//! [`ACCOUNT`] and make processes enter it, so two at once (here or in another run on the host)
//! would see each other's helpers in their tables. Children that must fork, exec,
//! rename or change uid are this test binary re-executed as a helper mode
//! (`guard_test::child`). Every wait is bounded; a `Child` kills and reaps its process on drop.
mod ebpf_harness;

use std::{
    os::unix::{fs::PermissionsExt, process::CommandExt},
    process::Command,
    time::{Duration, Instant},
};

use guard_test::{
    child::{next_line, say, Child},
    guard_test,
    serial::serial,
};

use guard::{
    ebpf::{CredTracking, EbpfError, EbpfOptions, EbpfSource},
    event::{Event, StateKind},
    table::{ProcessTable, Scope},
};

const WAIT: Duration = Duration::from_secs(10);
/// The watched account, and another one (uids no other test uses).
const ACCOUNT: u32 = 4247;
const OTHER: u32 = 4248;

// ---------------------------------------------------------------------------------------------
// The helper side (runs in the child instead of the tests).

fn helper_main(mode: &str) {
    match mode {
        "workload" => helper_workload(),
        "enter_leave" => helper_enter_leave(),
        "visit" => helper_visit(),
        "enter_leave_compat" => helper_enter_leave_compat(),
        other => panic!("unknown helper mode {other}"),
    }
    std::process::exit(0);
}

fn set_name(name: &str) {
    let c = std::ffi::CString::new(name).unwrap();
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    assert_eq!(unsafe { libc::prctl(libc::PR_SET_NAME, c.as_ptr() as libc::c_ulong, 0, 0, 0) }, 0);
}

/// Everything the event programs see: forks that exec and exit, a fork without exec, renames
/// of the leader (prctl and /proc/self/comm) and of threads, threads that exit, an exec from a
/// thread's child. Run as [`OTHER`].
fn helper_workload() {
    for _ in 0..20 {
        let st = Command::new("/bin/true").status().unwrap();
        assert!(st.success());
    }
    // SAFETY: single-threaded here; the child only calls _exit.
    match unsafe { libc::fork() } {
        0 => unsafe { libc::_exit(0) },
        pid => unsafe {
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        },
    }
    set_name("filter-leader");
    std::fs::write("/proc/self/comm", "filter-leader2").unwrap();
    let threads: Vec<_> = (0..3)
        .map(|i| {
            std::thread::spawn(move || {
                set_name(&format!("filter-t{i}"));
                let st = Command::new("/bin/true").status().unwrap();
                assert!(st.success());
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    say("done");
}

/// Root: at each line from the test, the next step: effective uid [`ACCOUNT`] (entering it),
/// then root again (leaving it); the real and saved uids stay root, so both are allowed.
fn helper_enter_leave() {
    say("ready");
    next_line();
    // SAFETY: plain syscall on the only thread; -1 keeps the real and saved uids.
    assert_eq!(unsafe { libc::syscall(libc::SYS_setresuid, -1, ACCOUNT, -1) }, 0);
    say("entered");
    next_line();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::syscall(libc::SYS_setresuid, -1, 0, -1) }, 0);
    say("left");
    next_line();
}

/// Root, made what a set-user-ID program run by the account is (`sg`, `newgrp`): real uid
/// [`ACCOUNT`], effective uid root. At a line from the test it forks a child that exits at once,
/// and says the child's pid.
fn helper_visit() {
    // SAFETY: plain syscall on the only thread; root may set any ids.
    assert_eq!(unsafe { libc::syscall(libc::SYS_setresuid, ACCOUNT, 0, 0) }, 0);
    say("ready");
    next_line();
    // SAFETY: the child only calls _exit.
    let child = match unsafe { libc::fork() } {
        0 => unsafe { libc::_exit(0) },
        pid => pid,
    };
    // SAFETY: reaps our child.
    unsafe { libc::waitpid(child, std::ptr::null_mut(), 0) };
    say(&child.to_string());
    next_line();
}

/// [`helper_enter_leave`] through the 32-bit compat syscall `setresuid32` (`int 0x80`, which a
/// 64-bit program may use too: the kernel runs it as an ia32 syscall). Says "ok" at each step
/// like the AArch32 helper ([`aarch32_helper`]), the first after a harmless `getuid32`.
#[cfg(target_arch = "x86_64")]
fn helper_enter_leave_compat() {
    /// `int 0x80` with the ia32 syscall number and three arguments; returns eax.
    fn int80(nr: u32, a: u32, b: u32, c: u32) -> i32 {
        let ret: i32;
        // SAFETY: an ia32 syscall with integer arguments only; rbx is LLVM's, so it is swapped
        // in and out around the instruction, and r8–r11 are declared clobbered.
        unsafe {
            std::arch::asm!(
                "xchg {b:r}, rbx",
                "int 0x80",
                "xchg {b:r}, rbx",
                b = inout(reg) u64::from(a) => _,
                inlateout("eax") nr => ret,
                in("ecx") b,
                in("edx") c,
                out("r8") _, out("r9") _, out("r10") _, out("r11") _,
            );
        }
        ret
    }
    const GETUID32: u32 = 199;
    const SETRESUID32: u32 = 208;
    assert_eq!(int80(GETUID32, 0, 0, 0), 0, "getuid32 as root");
    say("ok");
    next_line();
    assert_eq!(int80(SETRESUID32, u32::MAX, ACCOUNT, u32::MAX), 0);
    say("ok");
    next_line();
    assert_eq!(int80(SETRESUID32, u32::MAX, 0, u32::MAX), 0);
    say("ok");
    next_line();
}

#[cfg(not(target_arch = "x86_64"))]
fn helper_enter_leave_compat() {
    unreachable!("on this architecture the compat helper is aarch32_helper's program");
}

/// A static AArch32 (ARM EABI5) program for arm64 kernels with 32-bit compat: says "ok",
/// waits for a line, `setresuid32(-1, ACCOUNT, -1)` (r7 = 208, `svc 0`), "ok", waits,
/// `setresuid32(-1, 0, -1)`, "ok", waits, exits 0 (3 if a call failed). Hand-assembled, so the
/// test needs no 32-bit toolchain; a CPU or kernel without AArch32 at EL0 refuses to exec it.
#[cfg(target_arch = "aarch64")]
fn aarch32_helper() -> Vec<u8> {
    const CODE: [u32; 39] = [
        0xE28F4094,                                                           // add   r4, pc, #0x94      r4 = &"ok\n"
        0xEB000018,                                                           // bl    say
        0xEB00001D,                                                           // bl    wait
        0xE3E00000,                                                           // mvn   r0, #0             -1
        0xE3000000 | ((ACCOUNT >> 12) << 16) | (1 << 12) | (ACCOUNT & 0xFFF), // movw r1, #ACCOUNT
        0xE3E02000,                                                           // mvn   r2, #0
        0xE3A070D0,                                                           // mov   r7, #208           setresuid32
        0xEF000000,                                                           // svc   0
        0xE3500000,                                                           // cmp   r0, #0
        0x1A00000D,                                                           // bne   fail
        0xEB00000F,                                                           // bl    say
        0xEB000014,                                                           // bl    wait
        0xE3E00000,                                                           // mvn   r0, #0
        0xE3A01000,                                                           // mov   r1, #0
        0xE3E02000,                                                           // mvn   r2, #0
        0xE3A070D0,                                                           // mov   r7, #208
        0xEF000000,                                                           // svc   0
        0xE3500000,                                                           // cmp   r0, #0
        0x1A000004,                                                           // bne   fail
        0xEB000006,                                                           // bl    say
        0xEB00000B,                                                           // bl    wait
        0xE3A00000,                                                           // mov   r0, #0
        0xE3A07001,                                                           // mov   r7, #1             exit
        0xEF000000,                                                           // svc   0
        0xE3A00003,                                                           // fail: mov r0, #3
        0xE3A07001,                                                           // mov   r7, #1
        0xEF000000,                                                           // svc   0
        0xE3A00001,                                                           // say:  mov r0, #1
        0xE1A01004,                                                           // mov   r1, r4
        0xE3A02003,                                                           // mov   r2, #3
        0xE3A07004,                                                           // mov   r7, #4             write
        0xEF000000,                                                           // svc   0
        0xE12FFF1E,                                                           // bx    lr
        0xE3A00000,                                                           // wait: mov r0, #0
        0xE24D1040,                                                           // sub   r1, sp, #64
        0xE3A02010,                                                           // mov   r2, #16
        0xE3A07003,                                                           // mov   r7, #3             read
        0xEF000000,                                                           // svc   0
        0xE12FFF1E,                                                           // bx    lr
    ];
    const BASE: u32 = 0x10000;
    const HEADERS: u32 = 52 + 32;
    let size = HEADERS + 4 * CODE.len() as u32 + 4;
    let mut elf = Vec::new();
    let mut put = |v: &[u8]| elf.extend_from_slice(v);
    // ELF32 header: little-endian, EM_ARM (40), ET_EXEC, EABI version 5.
    put(&[0x7f, b'E', b'L', b'F', 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    for (v, n) in [(2u32, 2), (40, 2), (1, 4), (BASE + HEADERS, 4), (52, 4), (0, 4), (0x0500_0000, 4)] {
        put(&v.to_le_bytes()[..n]);
    }
    for v in [52u16, 32, 1, 40, 0, 0] {
        put(&v.to_le_bytes());
    }
    // One PT_LOAD of the whole file, read and execute.
    for v in [1u32, 0, BASE, BASE, size, size, 5, 0x1000] {
        put(&v.to_le_bytes());
    }
    for word in CODE {
        put(&word.to_le_bytes());
    }
    put(b"ok\n\0");
    assert_eq!(elf.len() as u32, size);
    elf
}

// ---------------------------------------------------------------------------------------------
// The test side.

fn load(account: u32, skip_cred_hook: bool) -> EbpfSource {
    let opts = EbpfOptions { account: Some(account), ring_bytes: Some(1 << 20), skip_cred_hook, ..Default::default() };
    ebpf_harness::load(&opts)
}

/// Every record the ring holds now.
fn drain(src: &mut EbpfSource) -> Vec<Event> {
    let mut out = Vec::new();
    src.drain(usize::MAX, |e| out.push(e.expect("every record decodes")));
    out
}

/// The account's table fed only by the source's events (no scan), polled until `done` or the
/// deadline; returns `done`'s last answer.
fn table_until(src: &mut EbpfSource, table: &mut ProcessTable, done: impl Fn(&ProcessTable) -> bool) -> bool {
    let deadline = Instant::now() + WAIT;
    loop {
        for e in drain(src) {
            table.apply(&e);
        }
        if done(table) || Instant::now() >= deadline {
            return done(table);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn euid_in_proc(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}

#[guard_test(needs = [root, ebpf])]
fn another_accounts_processes_never_reach_the_ring() {
    let _serial = serial();
    let mut watched = load(ACCOUNT, false);
    // The same workload seen by programs loaded for its own account: it does make records.
    let mut own = load(OTHER, false);
    drain(&mut watched);
    drain(&mut own);
    let mut child = Child::helper_as("workload", OTHER);
    child.expect_line("done");
    child.wait();
    // Both rings see the same events as they happen: once the own account's ring holds the
    // whole workload, whatever leaked into the watched one is there too.
    let mut seen = Vec::new();
    let deadline = Instant::now() + WAIT;
    while seen.len() < 60 && Instant::now() < deadline {
        seen.extend(drain(&mut own));
        std::thread::sleep(Duration::from_millis(20));
    }
    let leaked = drain(&mut watched);
    // 20 × (fork, exec, exit) of /bin/true, a fork and its exit, two renames, 3 × (fork, exec,
    // exit) from threads, the helper's own exec and exit: well over 60 records.
    assert!(seen.len() >= 60, "the workload made {} records for its own account: {seen:?}", seen.len());
    assert!(seen.iter().all(|e| !matches!(e, Event::Fork { child, .. } | Event::State { kind: StateKind::Exec, state: child } if child.euid != OTHER)));
    assert_eq!(watched.lost(), 0);
    assert!(
        leaked.is_empty(),
        "{} records of account {OTHER} reached account {ACCOUNT}'s ring: {leaked:?}",
        leaked.len()
    );
}

/// Which setresuid the helper calls.
#[derive(Clone, Copy, PartialEq)]
enum Abi {
    /// The 64-bit syscall.
    Native,
    /// The 32-bit compat `setresuid32`.
    Compat,
}

/// The root helper that enters and leaves the account through `abi`, and the lines it says at
/// its three steps (the compat helpers say "ok" once before the first).
fn enter_leave_helper(abi: Abi, dir: &std::path::Path) -> (Child, [&'static str; 3]) {
    if abi == Abi::Native {
        return (Child::helper("enter_leave"), ["ready", "entered", "left"]);
    }
    #[cfg(target_arch = "aarch64")]
    let mut child = {
        let bin = dir.join("aarch32-enter-leave");
        std::fs::write(&bin, aarch32_helper()).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        Child::spawn(&mut Command::new(&bin))
    };
    #[cfg(not(target_arch = "aarch64"))]
    let mut child = {
        let _ = dir;
        Child::helper("enter_leave_compat")
    };
    child.expect_line("ok");
    (child, ["", "ok", "ok"])
}

/// Entering and leaving by setresuid (64-bit or 32-bit), with the hook and with the fallback
/// tracepoints.
fn setuid_enters_and_leaves_at_once(test: &str, skip_cred_hook: bool, abi: Abi) {
    let _serial = serial();
    let mut src = load(ACCOUNT, skip_cred_hook);
    match (src.cred_tracking(), skip_cred_hook) {
        (CredTracking::Hook, false) | (CredTracking::Syscalls { .. }, true) => {}
        // This development VM's kernel (6.18.44-fc) refuses every fentry program before its
        // verifier runs (EPERM, an empty verifier log; bpftool: "program_type tracing is NOT
        // available"). The VM guests' kernels attach the hook; here the fallback is what runs.
        (CredTracking::Syscalls { hook: hook @ EbpfError::Permission { .. } }, false) => {
            eprintln!(
                "note: {test}: this kernel refuses fentry programs ({hook}); the raw syscall tracepoints track instead"
            )
        }
        // Debian's arm64 6.1 kernel has no ftrace direct calls (CONFIG_DYNAMIC_FTRACE_WITH_
        // DIRECT_CALLS came to arm64 in 6.4): attaching any fentry program fails with the
        // kernel's ENOTSUPP (524). The daemon logs `WARN setuid_untracked reason=attach_failed
        // fallback=syscall_tracepoints` there.
        (CredTracking::Syscalls { hook: hook @ EbpfError::Attach { detail, .. } }, false)
            if detail.contains("os error 524") && arm64_before_direct_calls() =>
        {
            eprintln!("note: {test}: this kernel cannot attach fentry programs ({hook}); the fallback tracks instead")
        }
        (CredTracking::Syscalls { hook }, false) => {
            panic!("the commit_creds hook did not attach on a kernel with BTF: {hook}")
        }
        (other, _) => panic!("{test}: {other:?}"),
    }
    let dir = tempfile::tempdir().unwrap();
    let (mut child, lines) = enter_leave_helper(abi, dir.path());
    let pid = child.pid();
    if !lines[0].is_empty() {
        child.expect_line(lines[0]);
    }
    let mut table = ProcessTable::new(Scope::account(ACCOUNT));
    table_until(&mut src, &mut table, |_| false);
    assert!(table.is_empty(), "root's process is not the account's: {:?}", table.processes());
    child.send_line();
    child.expect_line(lines[1]);
    assert_eq!(euid_in_proc(pid), ACCOUNT);
    assert!(
        table_until(&mut src, &mut table, |t| t.processes().iter().any(|p| p.id.pid == pid)),
        "{test}: pid {pid} took the account's euid and the table does not hold it"
    );
    child.send_line();
    child.expect_line(lines[2]);
    assert_eq!(euid_in_proc(pid), 0);
    assert!(
        table_until(&mut src, &mut table, |t| t.is_empty()),
        "{test}: pid {pid} went back to root and the table still holds {:?}",
        table.processes()
    );
    child.send_line();
    assert!(child.wait().success(), "{test}: the helper failed");
}

#[guard_test(needs = [root, ebpf])]
fn a_root_process_that_setuids_into_the_account_is_tracked_at_once_and_dropped_when_it_leaves() {
    setuid_enters_and_leaves_at_once("filter: setuid through the hook", false, Abi::Native);
}

#[guard_test(needs = [root, ebpf])]
fn without_the_hook_the_setuid_tracepoints_track_the_same() {
    setuid_enters_and_leaves_at_once("filter: setuid through the tracepoints", true, Abi::Native);
}

/// `setresuid32` through the hook (which sees every credential change, whatever the ABI).
#[guard_test(needs = [root, ebpf, compat32])]
fn a_32_bit_setresuid32_into_the_account_is_tracked_at_once_through_the_hook() {
    setuid_enters_and_leaves_at_once("filter: setresuid32 through the hook", false, Abi::Compat);
}

/// The fallback's blind spot of old: the per-syscall tracepoints skip compat syscalls, so a
/// process re-entering the account through `setresuid32` stayed out of the table until the audit.
#[guard_test(needs = [root, ebpf, compat32])]
fn without_the_hook_a_32_bit_setresuid32_is_tracked_at_once_too() {
    setuid_enters_and_leaves_at_once("filter: setresuid32 through the tracepoints", true, Abi::Compat);
}

/// A process of another euid whose real uid is the account's (a set-user-ID program the account
/// ran) is followed: its forks and exits reach the ring, so the session lineage keeps what it
/// starts when that comes back to the account (docs/architecture.md). The table takes nothing.
#[guard_test(needs = [root, ebpf])]
fn a_set_user_id_visit_outside_the_account_reports_its_forks_and_exits() {
    let mut src = load(ACCOUNT, false);
    let mut child = Child::helper("visit");
    let pid = child.pid();
    child.expect_line("ready");
    drain(&mut src);
    child.send_line();
    let forked: u32 = child.read_line().trim().parse().unwrap();
    let deadline = Instant::now() + WAIT;
    let mut seen = Vec::new();
    let mut table = ProcessTable::new(Scope::account(ACCOUNT));
    loop {
        let got = drain(&mut src);
        for e in &got {
            table.apply(e);
        }
        seen.extend(got);
        let fork = seen.iter().any(|e| matches!(e, Event::Fork { child, parent_pid } if child.id.pid == forked && *parent_pid == pid && child.euid == 0));
        let exit = seen.iter().any(|e| matches!(e, Event::Exit(id) if id.pid == forked));
        if (fork && exit) || Instant::now() >= deadline {
            assert!(
                fork && exit,
                "the fork and exit of {forked} (real uid {ACCOUNT}, euid 0) did not reach the ring: {seen:?}"
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(table.is_empty(), "euid 0 is not the account's: {:?}", table.processes());
}

#[guard_test(needs = [root, ebpf])]
fn exec_of_a_setuid_root_binary_by_the_account_takes_the_process_out() {
    let _serial = serial();
    let mut src = load(ACCOUNT, false);
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.path().join("root-sleep");
    std::fs::copy("/bin/sleep", &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let script = format!("read line; exec {} 30", bin.display());
    let mut child = Child::spawn(Command::new("/bin/sh").args(["-c", &script]).uid(ACCOUNT).gid(ACCOUNT));
    let pid = child.pid();
    let mut table = ProcessTable::new(Scope::account(ACCOUNT));
    assert!(
        table_until(&mut src, &mut table, |t| t.processes().iter().any(|p| p.id.pid == pid)),
        "the account's shell {pid} is not in the table"
    );
    child.send_line();
    let deadline = Instant::now() + WAIT;
    while std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default() != "root-sleep\n" {
        assert!(Instant::now() < deadline, "the shell never exec'd the set-user-ID binary");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(euid_in_proc(pid), 0, "the exec made it root's");
    assert!(
        table_until(&mut src, &mut table, |t| t.is_empty()),
        "pid {pid} runs as root now and the table still holds {:?}",
        table.processes()
    );
}

guard_test::main!(helpers = helper_main);

/// An arm64 kernel older than 6.4: the only place a failed fentry attach (ENOTSUPP) is the
/// kernel's known limit rather than a regression of the hook.
fn arm64_before_direct_calls() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    cfg!(target_arch = "aarch64") && (major, minor) < (6, 4)
}
