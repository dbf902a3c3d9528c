//! guard's BPF programs.
//!
//! Each event program turns one kernel event about a process of the watched account into a
//! [`RawEvent`] in the `EVENTS` ring buffer:
//!
//! | program | attach point | emits |
//! |---|---|---|
//! | `sched_process_fork` | tp_btf `sched_process_fork(parent, child)` | FORK for a new process, never a thread (of the account, or of its real uid: see below) |
//! | `sched_process_exec` | tp_btf `sched_process_exec(p, old_pid, bprm)` | EXEC (new comm, new euid) |
//! | `sched_process_exit_gd` | tp_btf `sched_process_exit(p, group_dead)` (Linux ≥ 6.16) | EXIT once the last thread is gone |
//! | `sched_process_exit_live` | tp_btf `sched_process_exit(p)` (older kernels) | EXIT when `signal->live` reached 0 (two threads exiting at once may both see 0: a duplicate EXIT, which the table ignores) |
//! | `task_rename` | tp_btf `task_rename(task, comm)` | RENAME of a group leader (not the rename exec does itself) |
//! | `commit_creds` | fentry `commit_creds(new)` (`commit_creds_probe` where `bpf_get_current_task_btf` is missing, Linux < 5.11) | SETUID when a leader's euid enters or leaves the account |
//! | `sys_enter_setuid`, `sys_exit_setuid` | tracepoints `syscalls/sys_{enter,exit}_set{,re,res}uid` (only where the fentry cannot attach) | SETUID when a leader's euid enters or leaves the account (the enter side notes a leader of the account in `SETUID_FROM`) |
//! | `task_iter` | iterator `iter/task` (Linux ≥ 5.8) | one [`TaskRecord`] per task to the reader of the iterator fd (start-up, resync, audit, CPU samples) |
//! | `sched_stat_runtime` | tp_btf `sched_stat_runtime(task, runtime)` | no record: adds the runtime to the task's process in `CPU_RUN_A`/`_B` (the stall watch's samples), for the watched account's processes old enough to matter |
//!
//! # The account filter
//!
//! A daemon guards one account, so its programs report only what concerns that account: its
//! processes, and processes entering or leaving it. The account's uid is a load-time constant
//! (`GUARD_UID` in read-only data; [`ALL_ACCOUNTS`] reports every process), and every program
//! tests it first, with one or two loads, before anything else. A process's account is its
//! group leader's effective uid in `real_cred` (what /proc/PID/status and `ps -u` show).
//! Which credentials each event tests, so that nothing entering or leaving the account is
//! missed:
//! - fork: the child's `real_cred` (copy_creds() gave it the forking thread's credentials): its
//!   euid, or its real uid. A set-user-ID program the account runs (`sg`, `newgrp`, `sudo`'s
//!   front end) keeps the account's real uid while its euid is another's: its forks and its exit
//!   are reported, so the session lineage keeps what it starts when that comes back to the
//!   account's uid (the table still holds only the account's euid). Only programs installed
//!   set-user-ID do this, so it adds a handful of records, never a flood the account controls;
//! - exec: the new `real_cred` (committed before the tracepoint): its euid, or its real uid (a
//!   set-user-ID binary run by the account keeps the real uid: the process leaves; reported
//!   here too in case the credential hook is missing), or any exec by a thread other than the
//!   leader (it becomes the leader, with its own credentials, without a credential commit);
//! - exit: the leader's `real_cred`, euid or real uid as for fork (a zombie leader keeps its
//!   credentials until it is released);
//! - rename: the renamed leader's `real_cred`;
//! - a credential change (`commit_creds`, which every setuid-family call and exec's credential
//!   install go through, and the only writer of `real_cred` after fork): the leader's old euid
//!   and the new one, reported when exactly one is the account's (a change within the account,
//!   or outside it, changes nothing the daemon's table holds).
//!
//! # Reading the kernel's structures
//!
//! Structure offsets are not compiled in: user space reads them from the running kernel's BTF
//! (/sys/kernel/btf/vmlinux) and writes them into `GUARD_OFFSETS` before loading. That data is
//! a frozen read-only map, so the verifier knows each offset as a constant: a program adds it to
//! the typed BTF pointer its tracepoint hands over and loads the field directly (a plain load,
//! no helper call), and pointers loaded that way are typed again. `__rcu` pointers such as
//! `real_cred` may be NULL to the verifier, so each loaded pointer is checked. Where a task
//! pointer is not typed (the iterator's context, `bpf_get_current_task()`), fields are copied
//! with `bpf_probe_read_kernel` instead.
//!
//! A record that cannot be reserved (ring buffer full) or built is counted in `LOST`, and user
//! space rebuilds its table. A run the kernel skips (a program does not nest on one CPU; a
//! preempted one blocks the next task's run there) never reaches us: the kernel counts it
//! (`recursion_misses`), and user space adds those counts to `LOST`'s.
//!
//! Wake-ups are batched: a record is submitted without waking user space until the ring holds
//! `GUARD_WAKE_BYTES` (a sixteenth of its size); user space also drains on a short timer
//! (`guard::ebpf::DRAIN_PERIOD`). An idle host's few events then cost one wake-up per period
//! instead of one per event.
#![no_std]
#![no_main]
// `atomic_xadd`: core's atomic types offer no fetch_add on the BPF target (it has no
// compare-and-swap), but the kernel's verifier takes an atomic add whose result is unused.
#![feature(core_intrinsics)]
#![allow(internal_features)]

use core::ptr::{addr_of, read_volatile};

use aya_ebpf::{
    bindings::seq_file,
    cty::c_void,
    helpers::{
        bpf_get_current_task, bpf_get_current_task_btf, bpf_ktime_get_boot_ns, bpf_probe_read_kernel,
        bpf_probe_read_kernel_str_bytes, generated::bpf_seq_write,
    },
    macros::{btf_tracepoint, fentry, map},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{BtfTracePointContext, FEntryContext},
    EbpfContext,
};
use guard_common::{
    kind, CpuCtl, CpuRun, KernelOffsets, RawEvent, SetuidSyscalls, TaskRecord, ALL_ACCOUNTS, COMM_LEN, CPU_RUN_ENTRIES,
    DEFAULT_RING_BYTES, PF_KTHREAD, TASK_MARK_BROKEN, TASK_MARK_END,
};

/// The watched account's uid (effective uid, initial user namespace), or [`ALL_ACCOUNTS`].
/// Written by the loader (`EbpfLoader::override_global`).
#[unsafe(no_mangle)]
static GUARD_UID: u32 = ALL_ACCOUNTS;

/// The running kernel's structure offsets, written by the loader (see the crate doc).
#[unsafe(no_mangle)]
static GUARD_OFFSETS: KernelOffsets = KernelOffsets::ZERO;

/// The setuid family's syscall numbers and the compat test (see [`SetuidSyscalls`]), written by
/// the loader.
#[unsafe(no_mangle)]
static GUARD_SYSCALLS: SetuidSyscalls = SetuidSyscalls::NONE;

/// Unread bytes in the ring at which a record wakes user space (a sixteenth of the ring),
/// written by the loader; 0 wakes it for every record.
#[unsafe(no_mangle)]
static GUARD_WAKE_BYTES: u64 = 0;

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);

#[map]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Non-zero while heavy-command slots are on: every record is submitted with the ring's adaptive
/// notification instead of waiting for the drain timer, so a matching exec reaches user space
/// within milliseconds (it is held before it has done anything worth mentioning) and a holder's
/// exit starts the next in line at once. Written by user space (`EbpfSource::wake_for`).
#[map]
static EXEC_WAKE: Array<u32> = Array::with_max_entries(1, 0);

/// The stall watch's per-process CPU time, two maps so user space drains one while the program
/// adds to the other (`CpuCtl::generation`). Preallocated (tracing programs may only update
/// preallocated hash maps).
#[map]
static CPU_RUN_A: HashMap<u32, CpuRun> = HashMap::with_max_entries(CPU_RUN_ENTRIES, 0);

#[map]
static CPU_RUN_B: HashMap<u32, CpuRun> = HashMap::with_max_entries(CPU_RUN_ENTRIES, 0);

#[map]
static CPU_CTL: Array<CpuCtl> = Array::with_max_entries(1, 0);

/// Accounting updates that found no entry and could not make one (per CPU).
#[map]
static CPU_LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// The setuid tracepoints' fallback: leaders that entered a setuid-family call with the
/// account's euid (tid → 1), so the exit side knows one that leaves. Threads in such a call at
/// once: a few; one that finds the map full counts as a lost event (a rebuild follows).
#[map]
static SETUID_FROM: HashMap<u32, u32> = HashMap::with_max_entries(1024, 0);

type Res = Result<(), i64>;

/// One offset of `GUARD_OFFSETS`, as the verifier's constant (a volatile read, so the compiler
/// neither folds the object file's zero into the code nor merges reads).
macro_rules! off {
    ($field:ident) => {
        // SAFETY: a field of a static; volatile only keeps the load.
        unsafe { read_volatile(addr_of!(GUARD_OFFSETS.$field)) }
    };
}

/// One field of `GUARD_SYSCALLS`, as the verifier's constant (see `off!`).
macro_rules! sc {
    ($($field:tt)+) => {
        // SAFETY: a field of a static; volatile only keeps the load.
        unsafe { read_volatile(addr_of!(GUARD_SYSCALLS.$($field)+)) }
    };
}

/// Whether `euid` is the watched account's (always, when the programs watch every account). The
/// verifier knows `GUARD_UID`, so it drops the branch that cannot run.
#[inline(always)]
fn watched(euid: u32) -> bool {
    let uid = guard_uid();
    uid == ALL_ACCOUNTS || euid == uid
}

#[inline(always)]
fn guard_uid() -> u32 {
    // SAFETY: a read of a static (see `off!`).
    unsafe { read_volatile(addr_of!(GUARD_UID)) }
}

/// Whether a credential change from `old` to `new` euid is news: it enters or leaves the
/// account, or, watching every account, the euid changed at all.
#[inline(always)]
fn cred_news(old: u32, new: u32) -> bool {
    if guard_uid() == ALL_ACCOUNTS {
        old != new
    } else {
        watched(old) != watched(new)
    }
}

/// A kernel pointer the verifier types from BTF (a tracepoint's argument, or a pointer field
/// loaded through one): fields are read with plain loads at the offsets of `GUARD_OFFSETS`.
#[derive(Clone, Copy)]
struct Kptr(*const u8);

impl Kptr {
    /// The field at `off` (a fault reads as zero: the verifier makes such loads fault-safe).
    #[inline(always)]
    fn get<T: Copy>(self, off: u32) -> T {
        // SAFETY: the verifier turns a load through a BTF pointer into a fault-safe load.
        unsafe { read_volatile(self.0.add(off as usize) as *const T) }
    }

    /// The pointer field at `off`, or `None` when it is NULL.
    #[inline(always)]
    fn ptr(self, off: u32) -> Option<Kptr> {
        let p: *const u8 = self.get(off);
        (!p.is_null()).then_some(Kptr(p))
    }

    fn addr(self) -> u64 {
        self.0 as u64
    }
}

/// The `n`th argument of a tp_btf or fentry program, as the typed pointer it is.
#[inline(always)]
fn arg_ptr(ctx: *mut c_void, n: usize) -> Option<Kptr> {
    // SAFETY: the context is an array of u64 arguments; the verifier checks the index.
    let p = unsafe { read_volatile((ctx as *const *const u8).add(n)) };
    (!p.is_null()).then_some(Kptr(p))
}

/// The `n`th argument as an integer (an argument of integer type).
#[inline(always)]
fn arg_u64(ctx: *mut c_void, n: usize) -> u64 {
    // SAFETY: as above.
    unsafe { read_volatile((ctx as *const u64).add(n)) }
}

/// The `n`th argument copied out of the context, for an argument the verifier would not let us
/// load (`const char *` on kernels before 5.16: "not a struct").
#[inline(always)]
fn arg_raw(ctx: *mut c_void, n: usize) -> Result<u64, i64> {
    // SAFETY: reads one u64 of the context.
    unsafe { bpf_probe_read_kernel((ctx as *const u64).add(n)) }.map_err(|e| e as i64)
}

/// The effective uid in a task's `real_cred`, or `None` when it has none.
#[inline(always)]
fn euid_of(task: Kptr) -> Option<u32> {
    Some(task.ptr(off!(task_cred))?.get(off!(cred_euid)))
}

/// Reads a `T` at `base + off` in kernel memory, for an untyped `base` (see the crate doc).
#[inline(always)]
fn read<T>(base: u64, off: u32) -> Result<T, i64> {
    unsafe { bpf_probe_read_kernel((base + off as u64) as *const T) }.map_err(|e| e as i64)
}

fn count_lost() {
    count_in(&LOST)
}

#[inline(always)]
fn count_in(counter: &PerCpuArray<u64>) {
    if let Some(p) = counter.get_ptr_mut(0) {
        // Per-CPU slot, so no other CPU writes it. A kernel that can preempt a tracing program
        // (they run with migration, not preemption, disabled) may let another of ours add on
        // this CPU in between, so two adds can become one; the counter still moves, and that
        // is all user space reads from it (it compares with the last value and rebuilds).
        unsafe { *p += 1 };
    }
}

/// `BPF_RB_FORCE_WAKEUP` once the unread data reaches `GUARD_WAKE_BYTES`, else
/// `BPF_RB_NO_WAKEUP` (user space's drain timer picks the records up).
#[inline(always)]
fn wakeup_flag() -> u64 {
    const BPF_RB_NO_WAKEUP: u64 = 1;
    const BPF_RB_FORCE_WAKEUP: u64 = 2;
    const BPF_RB_AVAIL_DATA: u64 = 0;
    // SAFETY: a read of a static (see `off!`).
    let wake = unsafe { read_volatile(addr_of!(GUARD_WAKE_BYTES)) };
    if EVENTS.query(BPF_RB_AVAIL_DATA) >= wake {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

/// The leader's comm (16 bytes, NUL padded). A helper copy: the verifier reads a char array
/// directly only on newer kernels.
#[inline(always)]
fn comm_of(leader: Kptr) -> Result<[u8; COMM_LEN], i64> {
    read(leader.addr(), off!(task_comm))
}

/// Fills and submits one record for the process of `task`, whose effective uid is `euid`.
#[inline(always)]
fn emit(event_kind: u32, task: Kptr, aux: u32, euid: u32, comm: Option<[u8; COMM_LEN]>) -> Res {
    let leader = task.ptr(off!(task_group_leader)).ok_or(1)?;
    let tgid: u32 = task.get(off!(task_tgid));
    let start: u64 = leader.get(off!(task_start_boottime));
    let comm = match comm {
        Some(c) => c,
        None => comm_of(leader)?,
    };
    submit(RawEvent { kind: event_kind, pid: tgid, aux, euid, start_boottime_ns: start, comm })
}

#[inline(always)]
fn submit(ev: RawEvent) -> Res {
    // 0: the ring's adaptive notification, a wake-up only when user space has read everything
    // before this record (it sleeps, or is about to): at once after a quiet spell, one wake-up
    // per drain in a storm (`bpf_ringbuf_commit`). Every record, not execs alone: an exec behind
    // an unread fork record would otherwise wait for the drain timer.
    const BPF_RB_ADAPTIVE: u64 = 0;
    let adaptive = EXEC_WAKE.get(0).is_some_and(|&on| on != 0);
    match EVENTS.reserve::<RawEvent>(0) {
        Some(mut slot) => {
            slot.write(ev);
            slot.submit(if adaptive { BPF_RB_ADAPTIVE } else { wakeup_flag() });
            Ok(())
        }
        None => Err(1),
    }
}

/// Runs a handler; any failure to build or queue a record counts as a lost event.
#[inline(always)]
fn finish(r: Res) -> i32 {
    if r.is_err() {
        count_lost();
    }
    0
}

#[btf_tracepoint(function = "sched_process_fork")]
pub fn sched_process_fork(ctx: BtfTracePointContext) -> i32 {
    finish(try_fork(ctx.as_ptr()))
}

/// The euid in a task's `real_cred` when the task is the account's or visits another uid with
/// the account's real uid (see the crate doc), else `None`.
#[inline(always)]
fn account_euid(task: Kptr) -> Option<u32> {
    let cred = task.ptr(off!(task_cred))?;
    let euid: u32 = cred.get(off!(cred_euid));
    (watched(euid) || watched(cred.get(off!(cred_uid)))).then_some(euid)
}

fn try_fork(ctx: *mut c_void) -> Res {
    let Some(child) = arg_ptr(ctx, 1) else { return Ok(()) };
    let Some(euid) = account_euid(child) else { return Ok(()) };
    if child.get::<u32>(off!(task_pid)) != child.get::<u32>(off!(task_tgid)) {
        return Ok(()); // a thread: the process already counts once
    }
    if child.get::<u32>(off!(task_flags)) & PF_KTHREAD != 0 {
        return Ok(());
    }
    let parent_tgid = match arg_ptr(ctx, 0) {
        Some(parent) => parent.get(off!(task_tgid)),
        None => 0,
    };
    emit(kind::FORK, child, parent_tgid, euid, None)
}

#[btf_tracepoint(function = "sched_process_exec")]
pub fn sched_process_exec(ctx: BtfTracePointContext) -> i32 {
    finish(try_exec(ctx.as_ptr()))
}

fn try_exec(ctx: *mut c_void) -> Res {
    let Some(task) = arg_ptr(ctx, 0) else { return Ok(()) };
    let Some(cred) = task.ptr(off!(task_cred)) else { return Ok(()) };
    let euid: u32 = cred.get(off!(cred_euid));
    let old_pid = arg_u64(ctx, 1) as u32;
    // See the crate doc: the account's euid, its real uid, or an exec by a non-leader thread.
    if !watched(euid) && !watched(cred.get(off!(cred_uid))) && old_pid == task.get::<u32>(off!(task_pid)) {
        return Ok(());
    }
    emit(kind::EXEC, task, old_pid, euid, None)
}

#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_process_exit_gd(ctx: BtfTracePointContext) -> i32 {
    finish(try_exit(ctx.as_ptr(), true))
}

#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_process_exit_live(ctx: BtfTracePointContext) -> i32 {
    finish(try_exit(ctx.as_ptr(), false))
}

fn try_exit(ctx: *mut c_void, has_group_dead: bool) -> Res {
    let Some(task) = arg_ptr(ctx, 0) else { return Ok(()) };
    let group_dead = if has_group_dead {
        arg_u64(ctx, 1) & 0xff != 0
    } else {
        // do_exit() decrements signal->live before it fires the tracepoint.
        match task.ptr(off!(task_signal)) {
            Some(signal) => signal.get::<i32>(off!(signal_live)) == 0,
            None => false,
        }
    };
    if !group_dead {
        return Ok(());
    }
    let Some(leader) = task.ptr(off!(task_group_leader)) else { return Ok(()) };
    let Some(euid) = account_euid(leader) else { return Ok(()) };
    if task.get::<u32>(off!(task_flags)) & PF_KTHREAD != 0 {
        return Ok(());
    }
    emit(kind::EXIT, task, 0, euid, None)
}

#[btf_tracepoint(function = "task_rename")]
pub fn task_rename(ctx: BtfTracePointContext) -> i32 {
    finish(try_rename(ctx.as_ptr()))
}

fn try_rename(ctx: *mut c_void) -> Res {
    let Some(task) = arg_ptr(ctx, 0) else { return Ok(()) };
    let Some(euid) = euid_of(task) else { return Ok(()) };
    if !watched(euid) {
        return Ok(());
    }
    if task.get::<u32>(off!(task_pid)) != task.get::<u32>(off!(task_tgid)) {
        return Ok(()); // a thread's name is not the process's name
    }
    if task.get::<u32>(off!(task_flags)) & PF_KTHREAD != 0 {
        return Ok(());
    }
    // exec renames the task itself (begin_new_exec → __set_task_comm) before it commits the
    // new credentials; the EXEC event that follows reports both, so skip this one.
    let mask = off!(in_execve_mask);
    if mask != 0 && task.addr() == unsafe { bpf_get_current_task() } {
        let byte: u8 = read(task.addr(), off!(task_in_execve))?;
        if byte as u32 & mask != 0 {
            return Ok(());
        }
    }
    // The tracepoint fires before the copy into task->comm: take the new name from the argument,
    // as the kernel will keep it. `__set_task_comm` copies the string into the 16-byte comm
    // with its NUL (strscpy_pad, strlcpy before 6.x): at most 15 bytes. The helper writes at
    // most `len - 1` bytes and a NUL, so the buffer is the whole 16 bytes, never 15 (that kept
    // 14 and the name never matched /proc again).
    let src = arg_raw(ctx, 1)?;
    let mut comm = [0u8; COMM_LEN];
    unsafe { bpf_probe_read_kernel_str_bytes(src as *const u8, &mut comm) }.map_err(|e| e as i64)?;
    emit(kind::RENAME, task, 0, euid, Some(comm))
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

/// Does nothing: `cargo xtask bench`'s measurement floor (its `bpf_floor` probe attaches it to
/// `sched_process_fork`; the daemon never loads it). With `kernel.bpf_stats_enabled`, a run's
/// time includes the kernel's own clock reads around it: this program's ns per run is that part.
#[btf_tracepoint(function = "sched_process_fork")]
pub fn noop(ctx: BtfTracePointContext) -> i32 {
    let _ = &ctx;
    0
}

mod cpu;
mod creds;
