//! Types shared by guard's BPF programs (`guard-ebpf`) and its daemon (`guard-user`).
//!
//! Everything that crosses the kernel/user boundary is `#[repr(C)]`, has no implicit padding
//! (flags are `u32`, never `bool`), and is `aya::Pod` only with the `user` feature so the BPF
//! side stays free of aya's user-space crate.
#![no_std]

/// Length of `task_struct::comm`, including the terminating NUL.
pub const COMM_LEN: usize = 16;

/// What happened to a process. Stored in [`RawEvent::kind`].
pub mod kind {
    /// A new process (not a thread) was created by fork/clone without `CLONE_THREAD`.
    pub const FORK: u32 = 1;
    /// A process executed a new program: new name, possibly a new effective uid.
    pub const EXEC: u32 = 2;
    /// The last thread of a process exited (`group_dead`): the process is no longer live.
    pub const EXIT: u32 = 3;
    /// The thread-group leader was renamed (prctl(PR_SET_NAME) or a write to /proc/PID/comm).
    pub const RENAME: u32 = 4;
    /// The credentials of a thread-group leader changed: its effective uid entered or left the
    /// watched account (the `commit_creds` hook: the setuid family, exec of a set-user-ID
    /// binary), or, where only the syscall tracepoints attach, it called the setuid family. The
    /// record carries the new effective uid.
    pub const SETUID: u32 = 5;
}

/// One ring-buffer record. 40 bytes, no padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawEvent {
    /// One of [`kind`].
    pub kind: u32,
    /// Thread-group id (what user space calls the pid) in the initial pid namespace.
    pub pid: u32,
    /// For FORK: the parent's tgid. For EXEC: the tid that called execve. Else 0.
    pub aux: u32,
    /// Effective uid of the process, in the initial user namespace.
    pub euid: u32,
    /// `task_struct::start_boottime` of the group leader, in ns: with the pid, the identity of
    /// a process (the same value /proc/PID/stat field 22 reports in clock ticks).
    pub start_boottime_ns: u64,
    /// The leader's `comm`, NUL padded.
    pub comm: [u8; COMM_LEN],
}

impl RawEvent {
    pub const SIZE: usize = core::mem::size_of::<RawEvent>();
}

// The layouts the other side relies on: a field added without its padding breaks the build.
const _: () = assert!(RawEvent::SIZE == 40);
const _: () = assert!(TaskRecord::SIZE == 56);
const _: () = assert!(core::mem::size_of::<CpuCtl>() == 24);

/// Kernel structure offsets, found by user space in the running kernel's BTF and written into the
/// programs' read-only data at load (`GUARD_OFFSETS`), so one object works on every kernel. The
/// verifier sees them as constants (a frozen read-only map), so a program adds them to the typed
/// BTF pointers it gets from its tracepoint and loads fields directly (no helper call per field).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    /// `task_struct::pid`
    pub task_pid: u32,
    /// `task_struct::tgid`, always `task_pid + 4` (user space refuses other layouts): the task
    /// iterator reads both with one 8-byte read.
    pub task_tgid: u32,
    /// `task_struct::flags` (for `PF_KTHREAD`)
    pub task_flags: u32,
    /// `task_struct::comm`
    pub task_comm: u32,
    /// `task_struct::real_cred`: the objective credentials, which /proc/PID/status reports and
    /// `ps -u` selects by (`cred` differs from it only inside override_creds()).
    pub task_cred: u32,
    /// `task_struct::start_boottime`
    pub task_start_boottime: u32,
    /// `task_struct::group_leader`
    pub task_group_leader: u32,
    /// `task_struct::signal`
    pub task_signal: u32,
    /// `signal_struct::live` (an `atomic_t`): 0 once every thread has exited. Used where the
    /// exit tracepoint has no `group_dead` argument (kernels before 6.16).
    pub signal_live: u32,
    /// `cred::euid`
    pub cred_euid: u32,
    /// `cred::uid` (the real uid: exec of a set-user-ID binary keeps it, so an exec that takes a
    /// process out of the account is still reported where the credential hook is missing).
    pub cred_uid: u32,
    /// Byte of `task_struct::in_execve` (a one-bit field, set from alloc_bprm() to
    /// free_bprm()), so the rename that exec itself does (`__set_task_comm` in
    /// begin_new_exec(), before the new credentials) is left to the EXEC event.
    pub task_in_execve: u32,
    /// The bit of `in_execve` in that byte; 0 when the kernel has no such field (then exec
    /// also yields a RENAME, with the old euid, right before its EXEC).
    pub in_execve_mask: u32,
    /// Non-zero when `sched_process_exit` carries `group_dead` as its second argument.
    pub exit_has_group_dead: u32,
    /// `task_struct::exit_state` (`EXIT_ZOMBIE`, `EXIT_DEAD`), for the task iterator.
    pub task_exit_state: u32,
    /// `task_struct::se` + `sched_entity::sum_exec_runtime`: the thread's CPU time in ns.
    pub task_sum_exec_runtime: u32,
    /// `signal_struct::sum_sched_runtime`: CPU time in ns of the group's threads that were
    /// already released (`__exit_signal()` adds each one's `sum_exec_runtime` there).
    pub signal_sum_sched_runtime: u32,
}

impl KernelOffsets {
    /// All zero: the value in the object file, which the loader replaces (a `static` needs a
    /// `const` initializer, which `Default` is not).
    pub const ZERO: KernelOffsets = KernelOffsets {
        task_pid: 0,
        task_tgid: 0,
        task_flags: 0,
        task_comm: 0,
        task_cred: 0,
        task_start_boottime: 0,
        task_group_leader: 0,
        task_signal: 0,
        signal_live: 0,
        cred_euid: 0,
        cred_uid: 0,
        task_in_execve: 0,
        in_execve_mask: 0,
        exit_has_group_dead: 0,
        task_exit_state: 0,
        task_sum_exec_runtime: 0,
        signal_sum_sched_runtime: 0,
    };
}

/// How the credential fallback recognises a setuid-family call on the raw syscall tracepoints
/// (`sys_enter`/`sys_exit`, which every syscall of every ABI passes, 32-bit compat calls
/// included, unlike the per-syscall tracepoints): the architecture's syscall numbers and where
/// a compat call shows, written by user space into `GUARD_SYSCALLS` at load (the BPF object is
/// the same for every architecture). All zero (the object file's value) matches nothing.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetuidSyscalls {
    /// Offset in `struct pt_regs` of the syscall number at syscall exit (x86_64 `orig_ax`,
    /// arm64 `syscallno`), read as a u32.
    pub regs_nr: u32,
    /// Non-zero: the compat test reads `pt_regs` at `compat_off` (arm64: `pstate`, whose
    /// `PSR_MODE32_BIT` marks an AArch32 task); zero: the current `task_struct` (x86_64:
    /// `thread_info.status`, whose `TS_COMPAT` marks a 32-bit syscall in progress, `int 0x80`
    /// from a 64-bit program included).
    pub compat_in_regs: u32,
    /// Where the compat flag is (see `compat_in_regs`), read as a u32.
    pub compat_off: u32,
    /// The flag's bits; 0: this architecture has no compat syscalls.
    pub compat_mask: u32,
    /// ANDed with a native number before the compare (x86_64: clears x32's `__X32_SYSCALL_BIT`,
    /// whose setuid family shares the 64-bit numbers). 0 (the object file's value): nothing
    /// matches.
    pub native_mask: u32,
    /// Native `setuid`, `setreuid`, `setresuid`.
    pub native: [u32; 3],
    /// Compat `setuid`, `setreuid`, `setresuid` (16-bit uids) and `setuid32`, `setreuid32`,
    /// `setresuid32` (i386 and ARM EABI number them alike).
    pub compat: [u32; 6],
}

impl SetuidSyscalls {
    /// Matches nothing: the object file's value.
    pub const NONE: SetuidSyscalls = SetuidSyscalls {
        regs_nr: 0,
        compat_in_regs: 0,
        compat_off: 0,
        compat_mask: 0,
        native_mask: 0,
        native: [0; 3],
        compat: [0; 6],
    };
}

const _: () = assert!(core::mem::size_of::<SetuidSyscalls>() == 56);

/// `GUARD_UID` for programs that report every account's processes (no filter). No process can
/// have this effective uid: `(uid_t)-1` is the kernel's invalid uid (setresuid reads it as
/// "unchanged").
pub const ALL_ACCOUNTS: u32 = u32::MAX;

/// One record of the `task_iter` program (`iter/task`), written with `bpf_seq_write`: the
/// iterator visits every task (thread) of the machine once, in tid order, and emits one record
/// for each task that is not a kernel thread. 56 bytes, no padding.
///
/// A thread-group leader's record (`tid == tgid`) carries the process's identity and state; a
/// record of another thread (`tid != tgid`) only adds that thread's CPU time to its process.
/// The group's CPU time is therefore the sum of its records' `cpu_ns`, which is what the kernel
/// computes for /proc/PID/stat's utime+stime (`thread_group_cputime()`,
/// kernel/sched/cputime.c): `signal->sum_sched_runtime` (threads already gone, carried by the
/// leader's record) plus `se.sum_exec_runtime` of every thread still linked to the group.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskRecord {
    /// Thread-group id (the pid user space knows), initial pid namespace.
    pub tgid: u32,
    /// This task's own id; equal to `tgid` for the group leader.
    pub tid: u32,
    /// Effective uid (`real_cred->euid`, initial user namespace). Leader records only.
    pub euid: u32,
    /// `task_struct::exit_state` of this task: 0 while it runs, `EXIT_ZOMBIE` or `EXIT_DEAD`.
    pub exit_state: u32,
    /// `signal_struct::live`: threads of the group that have not yet passed the point of no
    /// return in do_exit(). 0 once the whole group has exited (the EXIT event's moment).
    pub live: u32,
    /// Reserved, 0 (keeps the next field 8-aligned without implicit padding).
    pub _pad: u32,
    /// `task_struct::start_boottime` of this task in ns (the leader's: the process's identity).
    pub start_boottime_ns: u64,
    /// CPU time in ns: this thread's `se.sum_exec_runtime`, plus, on the leader's record,
    /// `signal->sum_sched_runtime` (the group's released threads).
    pub cpu_ns: u64,
    /// `task_struct::comm`, NUL padded. Leader records only (a thread's name is not the
    /// process's name).
    pub comm: [u8; COMM_LEN],
}

impl TaskRecord {
    pub const SIZE: usize = core::mem::size_of::<TaskRecord>();
}

/// A [`TaskRecord`] with `tgid == 0` is a marker (no task has tgid 0 in the iterator: the idle
/// tasks are not in the pid table), its kind in `tid`: the end of a complete session, written
/// by the program's last call (the one without a task)...
pub const TASK_MARK_END: u32 = 0;
/// ... or a task whose record could not be built (a failed kernel read): the session misses a
/// process, so user space does not trust it.
pub const TASK_MARK_BROKEN: u32 = 1;

/// The stall watch's CPU accounting (`sched_stat_runtime` in guard-ebpf): CPU time one process
/// of the watched account used since user space last drained the map it is in. 32 bytes, no
/// padding. Identity and name are read when the entry is created (the process's first run in
/// the interval), so an idle process never costs anything.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuRun {
    /// CPU ns of all the group's threads in this interval (`sched_stat_runtime`'s deltas).
    pub ns: u64,
    /// The group leader's `start_boottime` in ns (the process's identity with its tgid).
    pub start_boottime_ns: u64,
    /// The group leader's comm, NUL padded.
    pub comm: [u8; COMM_LEN],
}

/// What user space tells the accounting program (`CPU_CTL[0]`). 24 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuCtl {
    /// Non-zero: account `uid`'s processes; 0: the program returns at once (stall watch off).
    pub enabled: u32,
    /// The watched account (effective uid, `real_cred->euid`).
    pub uid: u32,
    /// Bit 0 picks the map the program adds to (`CPU_RUN_A` when 0, `CPU_RUN_B` when 1); user
    /// space flips it, then drains the other one.
    pub generation: u32,
    pub _pad: u32,
    /// Processes younger than this (ns since the leader started, boot clock) are not accounted:
    /// none can be in a stall-watch incident yet, and a fork storm's short-lived processes
    /// would each cost an entry the next sample drains.
    pub min_age_ns: u64,
}

/// Entries of each of the two accounting maps: processes of the account that may run in one
/// interval. One that cannot get an entry is counted in `CPU_LOST` and user space does not
/// trust that sample.
pub const CPU_RUN_ENTRIES: u32 = 16_384;

/// `EXIT_DEAD` from include/linux/sched.h (`task_struct::exit_state`): being released.
pub const EXIT_DEAD: u32 = 0x10;
/// `EXIT_ZOMBIE` from include/linux/sched.h: exited, not yet reaped.
pub const EXIT_ZOMBIE: u32 = 0x20;

/// Index of the lost-event counter in the `LOST` per-CPU array.
pub const LOST_INDEX: u32 = 0;
/// Default ring-buffer size in bytes (a power of two, a multiple of the page size). Its pages
/// are mapped into the daemon twice (the kernel's wrap-around mapping) and all resident: 2 MiB
/// cost 4 MiB of RSS, 256 KiB cost 0.5 MiB. 256 KiB hold ~5,400 records: 0.7 s of the bench's
/// fork+exec storm (7,300 events/s, measured lossless) with the reader stalled, which is woken
/// at 1/16 (16 KiB); a loss costs one resync, ~10 ms with the task iterator.
pub const DEFAULT_RING_BYTES: u32 = 256 << 10;

/// `PF_KTHREAD` from include/linux/sched.h: the task is a kernel thread.
pub const PF_KTHREAD: u32 = 0x0020_0000;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: both are repr(C), Copy, built only of integers, with no padding.
    unsafe impl aya::Pod for super::RawEvent {}
    unsafe impl aya::Pod for super::KernelOffsets {}
    unsafe impl aya::Pod for super::SetuidSyscalls {}
    unsafe impl aya::Pod for super::TaskRecord {}
    unsafe impl aya::Pod for super::CpuRun {}
    unsafe impl aya::Pod for super::CpuCtl {}
}
