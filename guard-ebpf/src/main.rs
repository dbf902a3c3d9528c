//! guard's BPF programs.
//!
//! Each program turns one kernel event into a [`RawEvent`] in the `EVENTS` ring buffer:
//!
//! | program | attach point | emits |
//! |---|---|---|
//! | `sched_process_fork` | tp_btf `sched_process_fork(parent, child)` | FORK for a new process, never a thread |
//! | `sched_process_exec` | tp_btf `sched_process_exec(p, old_pid, bprm)` | EXEC (new comm, new euid) |
//! | `sched_process_exit_gd` | tp_btf `sched_process_exit(p, group_dead)` (Linux ≥ 6.16) | EXIT once the last thread is gone |
//! | `sched_process_exit_live` | tp_btf `sched_process_exit(p)` (older kernels) | EXIT when `signal->live` reached 0 (two threads exiting at once may both see 0: a duplicate EXIT, which the table ignores) |
//! | `task_rename` | tp_btf `task_rename(task, comm)` | RENAME of a group leader (not the rename exec does itself) |
//! | `sys_exit_setuid` | tracepoint `syscalls/sys_exit_set{,re,res}uid` | SETUID of a group leader |
//! | `task_iter` | iterator `iter/task` (Linux ≥ 5.8) | one [`TaskRecord`] per task to the reader of the iterator fd (start-up, resync, audit, CPU samples) |
//! | `sched_stat_runtime` | tp_btf `sched_stat_runtime(task, runtime)` | no record: adds the runtime to the task's process in `CPU_RUN_A`/`_B` (the stall watch's samples), for the watched account only |
//!
//! Structure offsets are not compiled in: user space reads them from the running kernel's BTF
//! (/sys/kernel/btf/vmlinux) and stores them in `OFFSETS`. A record that cannot be reserved
//! (ring buffer full) or read is counted in `LOST`, and user space rebuilds its table from /proc.
//! A run the kernel skips (a program does not nest on one CPU; a preempted one blocks the next
//! task's run there) never reaches us: the kernel counts it (`recursion_misses`), and user space
//! adds those counts to `LOST`'s.
//!
//! Wake-ups are batched: a record is submitted without waking user space until the ring holds a
//! sixteenth of its size; user space also drains on a short timer (`guard::ebpf::DRAIN_PERIOD`).
//! An idle host's few events then cost one wake-up per period instead of one per event.
//!
//! Task pointers are read out of the context with `bpf_probe_read_kernel`, which makes them
//! plain scalars for the verifier: we add run-time offsets to them, which it refuses on typed
//! BTF pointers.
#![no_std]
#![no_main]
// `atomic_xadd`: core's atomic types offer no fetch_add on the BPF target (it has no
// compare-and-swap), but the kernel's verifier takes an atomic add whose result is unused.
#![feature(core_intrinsics)]
#![allow(internal_features)]

use aya_ebpf::{
    bindings::seq_file,
    cty::c_void,
    helpers::{bpf_get_current_task, bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes, generated::bpf_seq_write},
    macros::{btf_tracepoint, map, tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{BtfTracePointContext, TracePointContext},
    EbpfContext,
};
use guard_common::{
    kind, CpuCtl, CpuRun, KernelOffsets, RawEvent, TaskRecord, COMM_LEN, CPU_RUN_ENTRIES, DEFAULT_RING_BYTES,
    PF_KTHREAD, TASK_MARK_BROKEN, TASK_MARK_END,
};

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);

#[map]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[map]
static OFFSETS: Array<KernelOffsets> = Array::with_max_entries(1, 0);

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

type Res = Result<(), i64>;

#[inline(always)]
fn offsets() -> Result<&'static KernelOffsets, i64> {
    match OFFSETS.get(0) {
        Some(o) if o.ready != 0 => Ok(o),
        _ => Err(0),
    }
}

/// Reads a `T` at `base + off` in kernel memory.
#[inline(always)]
fn read<T>(base: u64, off: u32) -> Result<T, i64> {
    unsafe { bpf_probe_read_kernel((base + off as u64) as *const T) }.map_err(|e| e as i64)
}

/// The `n`th tp_btf argument as a plain scalar (see the crate doc for why).
#[inline(always)]
fn arg(ctx: &BtfTracePointContext, n: usize) -> Result<u64, i64> {
    unsafe { bpf_probe_read_kernel((ctx.as_ptr() as *const u64).add(n)) }.map_err(|e| e as i64)
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

/// `BPF_RB_FORCE_WAKEUP` once the unread data reaches 1/16 of the ring, else
/// `BPF_RB_NO_WAKEUP` (user space's drain timer picks the records up).
#[inline(always)]
fn wakeup_flag() -> u64 {
    const BPF_RB_NO_WAKEUP: u64 = 1;
    const BPF_RB_FORCE_WAKEUP: u64 = 2;
    const BPF_RB_AVAIL_DATA: u64 = 0;
    const BPF_RB_RING_SIZE: u64 = 1;
    if EVENTS.query(BPF_RB_AVAIL_DATA) >= EVENTS.query(BPF_RB_RING_SIZE) / 16 {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

/// Fills and submits one record for the process whose leader is `leader`.
#[inline(always)]
fn emit(o: &KernelOffsets, event_kind: u32, task: u64, aux: u32, comm: Option<[u8; COMM_LEN]>) -> Res {
    let leader: u64 = read(task, o.task_group_leader)?;
    let tgid: u32 = read(task, o.task_tgid)?;
    let cred: u64 = read(task, o.task_cred)?;
    let euid: u32 = read(cred, o.cred_euid)?;
    let start: u64 = read(leader, o.task_start_boottime)?;
    let comm = match comm {
        Some(c) => c,
        None => read(leader, o.task_comm)?,
    };
    match EVENTS.reserve::<RawEvent>(0) {
        Some(mut slot) => {
            slot.write(RawEvent { kind: event_kind, pid: tgid, aux, euid, start_boottime_ns: start, comm });
            slot.submit(wakeup_flag());
            Ok(())
        }
        None => Err(1),
    }
}

/// Runs a handler; any failure to build or queue a record counts as a lost event.
#[inline(always)]
fn finish(r: Res) -> i32 {
    if let Err(code) = r {
        // code 0: offsets not loaded yet (before start-up finished): nothing to report.
        if code != 0 {
            count_lost();
        }
    }
    0
}

#[btf_tracepoint(function = "sched_process_fork")]
pub fn sched_process_fork(ctx: BtfTracePointContext) -> i32 {
    finish(try_fork(&ctx))
}

fn try_fork(ctx: &BtfTracePointContext) -> Res {
    let o = offsets()?;
    let parent = arg(ctx, 0)?;
    let child = arg(ctx, 1)?;
    let pid: u32 = read(child, o.task_pid)?;
    let tgid: u32 = read(child, o.task_tgid)?;
    if pid != tgid {
        return Ok(()); // a thread: the process already counts once
    }
    let flags: u32 = read(child, o.task_flags)?;
    if flags & PF_KTHREAD != 0 {
        return Ok(());
    }
    let parent_tgid: u32 = read(parent, o.task_tgid)?;
    emit(o, kind::FORK, child, parent_tgid, None)
}

#[btf_tracepoint(function = "sched_process_exec")]
pub fn sched_process_exec(ctx: BtfTracePointContext) -> i32 {
    finish(try_exec(&ctx))
}

fn try_exec(ctx: &BtfTracePointContext) -> Res {
    let o = offsets()?;
    let task = arg(ctx, 0)?;
    let old_pid = arg(ctx, 1)? as u32;
    emit(o, kind::EXEC, task, old_pid, None)
}

#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_process_exit_gd(ctx: BtfTracePointContext) -> i32 {
    finish(try_exit(&ctx, true))
}

#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_process_exit_live(ctx: BtfTracePointContext) -> i32 {
    finish(try_exit(&ctx, false))
}

fn try_exit(ctx: &BtfTracePointContext, has_group_dead: bool) -> Res {
    let o = offsets()?;
    let task = arg(ctx, 0)?;
    let group_dead = if has_group_dead {
        arg(ctx, 1)? & 0xff != 0
    } else {
        // do_exit() decrements signal->live before it fires the tracepoint.
        let signal: u64 = read(task, o.task_signal)?;
        let live: i32 = read(signal, o.signal_live)?;
        live == 0
    };
    if !group_dead {
        return Ok(());
    }
    let flags: u32 = read(task, o.task_flags)?;
    if flags & PF_KTHREAD != 0 {
        return Ok(());
    }
    emit(o, kind::EXIT, task, 0, None)
}

#[btf_tracepoint(function = "task_rename")]
pub fn task_rename(ctx: BtfTracePointContext) -> i32 {
    finish(try_rename(&ctx))
}

fn try_rename(ctx: &BtfTracePointContext) -> Res {
    let o = offsets()?;
    let task = arg(ctx, 0)?;
    let pid: u32 = read(task, o.task_pid)?;
    let tgid: u32 = read(task, o.task_tgid)?;
    if pid != tgid {
        return Ok(()); // a thread's name is not the process's name
    }
    let flags: u32 = read(task, o.task_flags)?;
    if flags & PF_KTHREAD != 0 {
        return Ok(());
    }
    // exec renames the task itself (begin_new_exec → __set_task_comm) before it commits the
    // new credentials; the EXEC event that follows reports both, so skip this one.
    if o.in_execve_mask != 0 && task == unsafe { bpf_get_current_task() } {
        let byte: u8 = read(task, o.task_in_execve)?;
        if byte as u32 & o.in_execve_mask != 0 {
            return Ok(());
        }
    }
    // The tracepoint fires before the copy into task->comm: take the new name from the argument,
    // as the kernel will keep it. `__set_task_comm` copies the string into the 16-byte comm
    // with its NUL (strscpy_pad, strlcpy before 6.x): at most 15 bytes. The helper writes at
    // most `len - 1` bytes and a NUL, so the buffer is the whole 16 bytes, never 15 (that kept
    // 14 and the name never matched /proc again).
    let src = arg(ctx, 1)?;
    let mut comm = [0u8; COMM_LEN];
    unsafe { bpf_probe_read_kernel_str_bytes(src as *const u8, &mut comm) }.map_err(|e| e as i64)?;
    emit(o, kind::RENAME, task, 0, Some(comm))
}

/// Attached to `syscalls/sys_exit_setuid`, `sys_exit_setreuid` and `sys_exit_setresuid`: the
/// caller's credentials are committed by then, so we report the current state, whatever the
/// return value. Only the leader's euid is the process's (what `ps -u` shows).
#[tracepoint]
pub fn sys_exit_setuid(ctx: TracePointContext) -> i32 {
    let _ = &ctx;
    finish(try_setuid())
}

fn try_setuid() -> Res {
    let o = offsets()?;
    let task = unsafe { bpf_get_current_task() };
    let pid: u32 = read(task, o.task_pid)?;
    let tgid: u32 = read(task, o.task_tgid)?;
    if pid != tgid {
        return Ok(());
    }
    emit(o, kind::SETUID, task, 0, None)
}

/// The stall watch's accounting: the scheduler reports every stretch of CPU a task used
/// (`update_curr()`: at each switch and scheduler tick, so a lone spinner too, every tick);
/// for a process of the watched account it is added to that process's entry in this
/// interval's map. Its cost follows the scheduler's activity, never the number of idle
/// processes, and it returns at once while the stall watch is off.
#[btf_tracepoint(function = "sched_stat_runtime")]
pub fn sched_stat_runtime(ctx: BtfTracePointContext) -> i32 {
    if let Err(code) = try_runtime(&ctx) {
        if code != 0 {
            count_in(&CPU_LOST);
        }
    }
    0
}

#[inline(always)]
fn try_runtime(ctx: &BtfTracePointContext) -> Res {
    let ctl = match CPU_CTL.get(0) {
        Some(c) if c.enabled != 0 => *c,
        _ => return Ok(()),
    };
    let o = offsets()?;
    let task = arg(ctx, 0)?;
    let cred: u64 = read(task, o.task_cred)?;
    if read::<u32>(cred, o.cred_euid)? != ctl.uid {
        return Ok(());
    }
    let ns = arg(ctx, 1)?;
    let tgid: u32 = read(task, o.task_tgid)?;
    let map = if ctl.generation & 1 == 0 { &CPU_RUN_A } else { &CPU_RUN_B };
    if add_runtime(map, tgid, ns) {
        return Ok(());
    }
    // A new entry: the task iterator's rule, kernel threads never count (they run as uid 0).
    if read::<u32>(task, o.task_flags)? & PF_KTHREAD != 0 {
        return Ok(());
    }
    let leader: u64 = read(task, o.task_group_leader)?;
    let run = CpuRun { ns, start_boottime_ns: read(leader, o.task_start_boottime)?, comm: read(leader, o.task_comm)? };
    // BPF_NOEXIST: another CPU may have created the entry since; then add to it.
    if map.insert(tgid, run, 1).is_ok() || add_runtime(map, tgid, ns) {
        Ok(())
    } else {
        Err(1)
    }
}

/// Adds `ns` to `tgid`'s entry if it has one. The add is atomic (threads of one process run on
/// several CPUs at once); its result is unused, which keeps it the plain `lock add` every
/// kernel's verifier takes (a fetching add needs Linux 5.12).
#[inline(always)]
fn add_runtime(map: &HashMap<u32, CpuRun>, tgid: u32, ns: u64) -> bool {
    match map.get_ptr_mut(tgid) {
        Some(run) => {
            // SAFETY: `run` points at a live, 8-aligned map value; `ns` is its first field.
            unsafe {
                core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
                    run as *mut u64,
                    ns,
                )
            };
            true
        }
        None => false,
    }
}

/// The task iterator (`iter/task`, kernel/bpf/task_iter.c): the kernel calls it once per task
/// of the reader's pid namespace, threads included, in tid order, while user space read()s the
/// iterator's fd; a last call with `task == NULL` ends each session. It writes one
/// [`TaskRecord`] per task that is not a kernel thread (see the record's doc for how user space
/// folds threads into their process).
///
/// aya-ebpf 0.2 has no macro and no context type for iterator programs, so the entry point is
/// written by hand: the `iter/task` section is what makes aya load it as `programs::Iter`, and
/// the context is `struct bpf_iter__task { struct bpf_iter_meta *meta; struct task_struct
/// *task; }`.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task")]
pub fn task_iter(ctx: *mut c_void) -> i32 {
    let rec = match try_task_iter(ctx) {
        Ok(Some(rec)) => rec,
        Ok(None) => return 0,
        // A task we could not read: user space must not take this session for the machine.
        Err(_) => TaskRecord { tgid: 0, tid: TASK_MARK_BROKEN, ..TaskRecord::default() },
    };
    // bpf_seq_write wants the seq_file as the typed pointer the verifier derives from loads of
    // the context itself (ctx->meta, then meta->seq), so these two are plain loads, not probe
    // reads; volatile keeps the compiler from turning them into anything else.
    // SAFETY: ctx points at a `struct bpf_iter__task` whose first field is `meta`, and meta's
    // first field is `seq` (include/linux/bpf.h, `struct bpf_iter_meta`).
    let seq = unsafe {
        let meta = core::ptr::read_volatile(ctx as *const *const *mut seq_file);
        core::ptr::read_volatile(meta)
    };
    // SAFETY: rec is initialized stack memory of the length given. A full seq buffer is not
    // an error to handle: the kernel shows the same task again in the next read().
    unsafe { bpf_seq_write(seq, &rec as *const TaskRecord as *const c_void, TaskRecord::SIZE as u32) };
    0
}

/// The record for the task in `ctx`; `None` for a kernel thread. The call without a task (the
/// session's last) yields the end marker.
#[inline(always)]
fn try_task_iter(ctx: *mut c_void) -> Result<Option<TaskRecord>, i64> {
    let o = offsets()?;
    // ctx->task, as a scalar (see the crate doc): runtime offsets get added to it.
    let task: u64 = read(ctx as u64, 8)?;
    if task == 0 {
        return Ok(Some(TaskRecord { tgid: 0, tid: TASK_MARK_END, ..TaskRecord::default() }));
    }
    let flags: u32 = read(task, o.task_flags)?;
    if flags & PF_KTHREAD != 0 {
        return Ok(None);
    }
    // pid and tgid are adjacent `pid_t`s (user space checks it: `KernelOffsets::task_tgid`), so
    // one read brings both; a probe read costs more than the task iterator's own step.
    let ids: u64 = read(task, o.task_pid)?;
    let (tid, tgid) = (ids as u32, (ids >> 32) as u32);
    let mut rec = TaskRecord { tgid, tid, cpu_ns: read(task, o.task_sum_exec_runtime)?, ..TaskRecord::default() };
    if tid == tgid {
        rec.exit_state = read(task, o.task_exit_state)?;
        let signal: u64 = read(task, o.task_signal)?;
        rec.live = read::<i32>(signal, o.signal_live)? as u32;
        rec.cpu_ns += read::<u64>(signal, o.signal_sum_sched_runtime)?;
        let cred: u64 = read(task, o.task_cred)?;
        rec.euid = read(cred, o.cred_euid)?;
        rec.start_boottime_ns = read(task, o.task_start_boottime)?;
        rec.comm = read(task, o.task_comm)?;
    }
    Ok(Some(rec))
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
