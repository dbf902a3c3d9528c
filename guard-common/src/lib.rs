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
    /// The effective uid of a thread-group leader changed without exec (setuid family).
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

/// Kernel structure offsets, found by user space in the running kernel's BTF and handed to the
/// programs through the `OFFSETS` array map, so one object works on every kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    /// `task_struct::pid`
    pub task_pid: u32,
    /// `task_struct::tgid`
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
    /// Byte of `task_struct::in_execve` (a one-bit field, set from alloc_bprm() to
    /// free_bprm()), so the rename that exec itself does (`__set_task_comm` in
    /// begin_new_exec(), before the new credentials) is left to the EXEC event.
    pub task_in_execve: u32,
    /// The bit of `in_execve` in that byte; 0 when the kernel has no such field (then exec
    /// also yields a RENAME, with the old euid, right before its EXEC).
    pub in_execve_mask: u32,
    /// Non-zero when `sched_process_exit` carries `group_dead` as its second argument.
    pub exit_has_group_dead: u32,
    /// Non-zero once user space filled this struct; programs emit nothing before.
    pub ready: u32,
}

/// Index of the lost-event counter in the `LOST` per-CPU array.
pub const LOST_INDEX: u32 = 0;
/// Default ring-buffer size in bytes (a power of two, a multiple of the page size).
pub const DEFAULT_RING_BYTES: u32 = 2 << 20;

/// `PF_KTHREAD` from include/linux/sched.h: the task is a kernel thread.
pub const PF_KTHREAD: u32 = 0x0020_0000;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: both are repr(C), Copy, built only of integers, with no padding.
    unsafe impl aya::Pod for super::RawEvent {}
    unsafe impl aya::Pod for super::KernelOffsets {}
}
