//! The worker's hardening, done by the worker itself right after exec and before it reads
//! anything the account wrote. The worker runs glibc's regex engine on hostile patterns and
//! texts; if that ever goes worse than slow (a memory-safety bug), what it can do is this much:
//!
//! 0. It names itself `guard-matcher` (exec'd through /proc/self/exe it would show as `exe`).
//! 1. `oom_score_adj` 1000: under the unit's `MemoryMax`, the kernel's OOM killer picks the
//!    worker, never the daemon (best effort; reported in `Ready`).
//! 2. Every descriptor but stdin/stdout/stderr is closed (the progress page stays mapped).
//! 3. rlimits: `RLIMIT_DATA` (heap) and `RLIMIT_AS` (everything, a backstop) a fixed amount
//!    above what the freshly started worker uses; `RLIMIT_STACK`; `RLIMIT_CPU` as a backstop
//!    should the parent die mid-match; no core dumps, no file writes (`RLIMIT_FSIZE` 0), no new
//!    descriptors (`RLIMIT_NOFILE` 3), no new processes (`RLIMIT_NPROC` 0), nothing locked.
//! 4. When started as root: an empty group list, then gid, then uid set to `run_as` (65534
//!    `nobody` by default: not root, and not the guarded account, which could signal it). All
//!    capabilities go with uid 0. Checked after the fact with `getresuid`/`getresgid`/`getgroups`.
//! 5. `PR_SET_DUMPABLE` 0 (no ptrace or /proc/PID/mem by other `nobody` processes, no core) and
//!    `PR_SET_NO_NEW_PRIVS` 1.
//! 6. Crash handlers (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) on an alternate stack note the
//!    signal in the progress page and exit: a stack overflow in glibc's recursion is then a
//!    clean, explained death, with no syscall beyond `exit_group` (Rust's own overflow handler
//!    would need `sigaction`, which the filter refuses).
//! 7. seccomp (x86-64 and aarch64): only read, write, close, memory management (brk, mmap and
//!    mprotect without `PROT_EXEC`, munmap, mremap, madvise), futex, clock_gettime, sched_yield,
//!    what `abort()` needs (rt_sigprocmask, getpid, gettid, and tgkill to itself only),
//!    rt_sigreturn, exit and exit_group. Anything else traps: a SIGSYS handler notes the
//!    syscall number in the progress page and exits with status 159, so the parent can say
//!    *which* call a glibc update started to need instead of failing silently.
//!
//! Every step that makes a security promise fails the start-up if it fails; the parent then
//! reports the worker as broken (and the daemon protects rather than guesses).
use std::{
    ffi::c_int,
    sync::atomic::{AtomicPtr, AtomicU32, Ordering},
};

use super::{page::SharedPage, protocol::Init};

/// The exit status of a worker stopped by its seccomp filter (128 + SIGSYS).
pub(crate) const EXIT_BLOCKED_SYSCALL: c_int = 159;

/// What was set up.
pub(crate) struct Applied {
    pub uid: u32,
    pub gid: u32,
    pub identity_dropped: bool,
    pub seccomp: bool,
    pub oom_score_adj: bool,
}

/// Applies every step of the module doc, in order.
pub(crate) fn enter(init: &Init, page: &'static SharedPage) -> Result<Applied, String> {
    // Exec'd through /proc/self/exe, the worker would be called `exe` in ps and top.
    let name = c"guard-matcher";
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr(), 0, 0, 0) };
    let oom_score_adj = std::fs::write("/proc/self/oom_score_adj", b"1000").is_ok();
    let status = std::fs::read_to_string("/proc/self/status").map_err(|e| format!("read /proc/self/status: {e}"))?;
    let kib = |key: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let (data_now, size_now) = (kib("VmData:"), kib("VmSize:"));

    close_descriptors_from(3)?;

    let slack = 16 << 20;
    set_limit(libc::RLIMIT_CORE, 0, "RLIMIT_CORE")?;
    set_limit(libc::RLIMIT_FSIZE, 0, "RLIMIT_FSIZE")?;
    set_limit(libc::RLIMIT_MEMLOCK, 0, "RLIMIT_MEMLOCK")?;
    set_limit(libc::RLIMIT_NOFILE, 3, "RLIMIT_NOFILE")?;
    set_limit(libc::RLIMIT_STACK, init.stack_bytes, "RLIMIT_STACK")?;
    set_limit(libc::RLIMIT_DATA, data_now.saturating_add(init.memory_bytes), "RLIMIT_DATA")?;
    let address_space =
        size_now.saturating_add(init.memory_bytes).saturating_add(init.stack_bytes).saturating_add(slack);
    set_limit(libc::RLIMIT_AS, address_space, "RLIMIT_AS")?;
    // Soft then hard: SIGXCPU at the soft limit, SIGKILL a few seconds later.
    let cpu = libc::rlimit { rlim_cur: init.cpu_seconds, rlim_max: init.cpu_seconds.saturating_add(5) };
    // SAFETY: setrlimit reads one rlimit we own.
    if unsafe { libc::setrlimit(libc::RLIMIT_CPU, &cpu) } != 0 {
        return Err(format!("setrlimit(RLIMIT_CPU): {}", std::io::Error::last_os_error()));
    }

    // SAFETY: geteuid has no preconditions.
    let identity_dropped = match init.run_as {
        Some((uid, gid)) if unsafe { libc::geteuid() } == 0 => {
            drop_identity(uid, gid)?;
            true
        }
        _ => false,
    };
    // After the switch: RLIMIT_NPROC binds only non-root users.
    set_limit(libc::RLIMIT_NPROC, 0, "RLIMIT_NPROC")?;

    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(format!("prctl(PR_SET_DUMPABLE): {}", std::io::Error::last_os_error()));
    }
    // SAFETY: as above.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(format!("prctl(PR_SET_NO_NEW_PRIVS): {}", std::io::Error::last_os_error()));
    }

    install_crash_handlers(page)?;
    // SAFETY: getuid/getgid/getpid have no preconditions. (Before the filter, which does not
    // allow the first two.)
    let (uid, gid, pid) = unsafe { (libc::getuid(), libc::getgid(), libc::getpid()) };
    let seccomp = init.seccomp && install_seccomp(page, pid as u32)?;
    Ok(Applied { uid, gid, identity_dropped, seccomp, oom_score_adj })
}

fn set_limit(resource: libc::__rlimit_resource_t, value: u64, name: &str) -> Result<(), String> {
    let limit = libc::rlimit { rlim_cur: value, rlim_max: value };
    // SAFETY: setrlimit reads one rlimit we own.
    if unsafe { libc::setrlimit(resource, &limit) } != 0 {
        return Err(format!("setrlimit({name}, {value}): {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Closes every descriptor from `first` on: `close_range` (Linux 5.9), else one by one.
fn close_descriptors_from(first: c_int) -> Result<(), String> {
    // SAFETY: closing descriptors this process owns; nothing else in the worker holds them.
    if unsafe { libc::syscall(libc::SYS_close_range, first as libc::c_uint, libc::c_uint::MAX, 0) } == 0 {
        return Ok(());
    }
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit we own.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    for fd in first..(limit.rlim_cur.min(1 << 16) as c_int) {
        // SAFETY: as above; EBADF for descriptors that are not open is expected.
        unsafe { libc::close(fd) };
    }
    Ok(())
}

fn drop_identity(uid: u32, gid: u32) -> Result<(), String> {
    let err = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
    // SAFETY: plain credential syscalls with integer arguments (a NULL list of length 0).
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0 {
            return Err(err("setgroups([])"));
        }
        if libc::setresgid(gid, gid, gid) != 0 {
            return Err(err(&format!("setresgid({gid})")));
        }
        if libc::setresuid(uid, uid, uid) != 0 {
            return Err(err(&format!("setresuid({uid})")));
        }
    }
    let (mut r, mut e, mut s) = (0, 0, 0);
    let (mut rg, mut eg, mut sg) = (0, 0, 0);
    // SAFETY: each call writes three ids we own; getgroups(0, NULL) only counts.
    let (groups, ok) = unsafe {
        (
            libc::getgroups(0, std::ptr::null_mut()),
            libc::getresuid(&mut r, &mut e, &mut s) == 0 && libc::getresgid(&mut rg, &mut eg, &mut sg) == 0,
        )
    };
    if !ok || [r, e, s] != [uid; 3] || [rg, eg, sg] != [gid; 3] || groups != 0 {
        return Err(format!("identity switch did not hold: uids {r}/{e}/{s} gids {rg}/{eg}/{sg} groups {groups}"));
    }
    Ok(())
}

/// Where the crash handler notes the signal (the progress page's slot).
static CRASH_SLOT: AtomicPtr<AtomicU32> = AtomicPtr::new(std::ptr::null_mut());

extern "C" fn on_crash(signal: c_int, _info: *mut libc::siginfo_t, _context: *mut libc::c_void) {
    let slot = CRASH_SLOT.load(Ordering::Acquire);
    if !slot.is_null() {
        // SAFETY: the slot points into the progress page, mapped for the worker's whole life.
        unsafe { &*slot }.store(signal as u32, Ordering::Release);
    }
    // SAFETY: exit_group is allowed by the filter and async-signal-safe.
    unsafe { libc::syscall(libc::SYS_exit_group, 128 + signal) };
}

/// Installs `on_crash` for the fatal signals, on an alternate stack of its own (the main stack
/// is what overflowed).
fn install_crash_handlers(page: &'static SharedPage) -> Result<(), String> {
    const ALT_STACK: usize = 64 << 10;
    CRASH_SLOT.store(std::ptr::from_ref(page.crash_signal_slot()).cast_mut(), Ordering::Release);
    // SAFETY: a fresh private anonymous mapping, checked, never unmapped (the worker's life).
    let stack = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            ALT_STACK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if stack == libc::MAP_FAILED {
        return Err(format!("mmap the signal stack: {}", std::io::Error::last_os_error()));
    }
    let alt = libc::stack_t { ss_sp: stack, ss_flags: 0, ss_size: ALT_STACK };
    // SAFETY: `alt` describes the mapping above.
    if unsafe { libc::sigaltstack(&alt, std::ptr::null_mut()) } != 0 {
        return Err(format!("sigaltstack: {}", std::io::Error::last_os_error()));
    }
    for signal in [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE, libc::SIGABRT] {
        // SAFETY: a zeroed sigaction is valid; we fill the handler and flags.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_crash as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: installs a handler; `action` outlives the call.
        if unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) } != 0 {
            return Err(format!("sigaction({signal}): {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// Where the SIGSYS handler notes the blocked syscall (the progress page's slot).
static BLOCKED_SLOT: AtomicPtr<AtomicU32> = AtomicPtr::new(std::ptr::null_mut());

extern "C" fn on_sigsys(_signal: c_int, info: *mut libc::siginfo_t, _context: *mut libc::c_void) {
    // `si_syscall` sits after `si_signo`, `si_errno`, `si_code`, padding and `si_call_addr`
    // (the `_sigsys` member of the union at offset 16 on 64-bit Linux).
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers; for SIGSYS from
    // seccomp the `_sigsys` member is the one filled.
    let nr = unsafe { info.cast::<u8>().add(24).cast::<c_int>().read() };
    let slot = BLOCKED_SLOT.load(Ordering::Acquire);
    if !slot.is_null() {
        // SAFETY: the slot points into the progress page, mapped for the worker's whole life.
        unsafe { &*slot }.store((nr as u32).wrapping_add(1), Ordering::Release);
    }
    // SAFETY: exit_group is allowed by the filter and async-signal-safe.
    unsafe { libc::syscall(libc::SYS_exit_group, EXIT_BLOCKED_SYSCALL) };
}

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64

/// Installs the filter; `Ok(false)` on an architecture it does not know.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn install_seccomp(page: &'static SharedPage, pid: u32) -> Result<bool, String> {
    BLOCKED_SLOT.store(std::ptr::from_ref(page.blocked_syscall_slot()).cast_mut(), Ordering::Release);
    // SAFETY: a zeroed sigaction is valid; we fill the handler and flags.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_sigsys as *const () as usize;
    action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
    // SAFETY: installs a handler for SIGSYS; `action` outlives the call.
    if unsafe { libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut()) } != 0 {
        return Err(format!("sigaction(SIGSYS): {}", std::io::Error::last_os_error()));
    }
    let program = filter(pid);
    let prog = libc::sock_fprog { len: program.len() as u16, filter: program.as_ptr().cast_mut() };
    // SAFETY: `prog` points at `program`, alive for the call; the kernel copies it.
    if unsafe { libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog as *const libc::sock_fprog) } != 0 {
        return Err(format!("prctl(PR_SET_SECCOMP): {}", std::io::Error::last_os_error()));
    }
    Ok(true)
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn install_seccomp(_page: &'static SharedPage, _pid: u32) -> Result<bool, String> {
    Ok(false)
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn filter(pid: u32) -> Vec<libc::sock_filter> {
    use libc::{BPF_ABS, BPF_JEQ, BPF_JMP, BPF_JSET, BPF_K, BPF_LD, BPF_RET, BPF_W};
    let stmt = |code: u32, k: u32| libc::sock_filter { code: code as u16, jt: 0, jf: 0, k };
    let jump = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter { code: code as u16, jt, jf, k };
    // struct seccomp_data: nr at 0, arch at 4, args[i] at 16 + 8 i (the low half first on
    // little-endian, the only byte order of the two architectures).
    const NR: u32 = 0;
    const ARCH: u32 = 4;
    const ARG0_LOW: u32 = 16;
    const ARG2_LOW: u32 = 16 + 2 * 8;
    let allow = libc::SECCOMP_RET_ALLOW;
    let trap = libc::SECCOMP_RET_TRAP;
    let allowed = [
        libc::SYS_read,
        libc::SYS_write,
        libc::SYS_close,
        libc::SYS_brk,
        libc::SYS_munmap,
        libc::SYS_mremap,
        libc::SYS_madvise,
        libc::SYS_futex,
        libc::SYS_clock_gettime,
        libc::SYS_sched_yield,
        libc::SYS_rt_sigreturn,
        libc::SYS_rt_sigprocmask,
        libc::SYS_getpid,
        libc::SYS_gettid,
        libc::SYS_exit,
        libc::SYS_exit_group,
    ];
    let mut p = vec![
        stmt(BPF_LD | BPF_W | BPF_ABS, ARCH),
        jump(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH, 1, 0),
        stmt(BPF_RET | BPF_K, libc::SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_LD | BPF_W | BPF_ABS, NR),
    ];
    for nr in allowed {
        p.push(jump(BPF_JMP | BPF_JEQ | BPF_K, nr as u32, 0, 1));
        p.push(stmt(BPF_RET | BPF_K, allow));
    }
    // mmap and mprotect, but never executable memory.
    for nr in [libc::SYS_mmap, libc::SYS_mprotect] {
        p.push(jump(BPF_JMP | BPF_JEQ | BPF_K, nr as u32, 0, 4));
        p.push(stmt(BPF_LD | BPF_W | BPF_ABS, ARG2_LOW));
        p.push(jump(BPF_JMP | BPF_JSET | BPF_K, libc::PROT_EXEC as u32, 1, 0));
        p.push(stmt(BPF_RET | BPF_K, allow));
        p.push(stmt(BPF_RET | BPF_K, trap));
    }
    // tgkill, to itself only (`abort` raising SIGABRT).
    p.push(jump(BPF_JMP | BPF_JEQ | BPF_K, libc::SYS_tgkill as u32, 0, 4));
    p.push(stmt(BPF_LD | BPF_W | BPF_ABS, ARG0_LOW));
    p.push(jump(BPF_JMP | BPF_JEQ | BPF_K, pid, 0, 1));
    p.push(stmt(BPF_RET | BPF_K, allow));
    p.push(stmt(BPF_RET | BPF_K, trap));
    p.push(stmt(BPF_RET | BPF_K, trap));
    p
}
