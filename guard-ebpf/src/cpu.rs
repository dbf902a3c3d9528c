//! The stall watch's accounting (`sched_stat_runtime`) and the task iterator (start-up,
//! resync, audit, the CPU samples' fallback).
use super::*;

/// The stall watch's accounting: the scheduler reports every stretch of CPU a task used
/// (`update_curr()`: at each switch and scheduler tick, so a lone spinner too, every tick);
/// for a process of the watched account at least `CpuCtl::min_age_ns` old it is added to that
/// process's entry in this interval's map. Its cost follows the scheduler's activity, never
/// the number of idle processes; a fork storm's short-lived processes make no entry; and it
/// returns at once while the stall watch is off.
#[btf_tracepoint(function = "sched_stat_runtime")]
pub fn sched_stat_runtime(ctx: BtfTracePointContext) -> i32 {
    if try_runtime(ctx.as_ptr()).is_err() {
        count_in(&CPU_LOST);
    }
    0
}

#[inline(always)]
fn try_runtime(ctx: *mut c_void) -> Res {
    let ctl = match CPU_CTL.get(0) {
        Some(c) if c.enabled != 0 => *c,
        _ => return Ok(()),
    };
    let Some(task) = arg_ptr(ctx, 0) else { return Ok(()) };
    if euid_of(task) != Some(ctl.uid) {
        return Ok(());
    }
    let Some(leader) = task.ptr(off!(task_group_leader)) else { return Ok(()) };
    let start: u64 = leader.get(off!(task_start_boottime));
    // SAFETY: no preconditions (Linux ≥ 5.8; the same clock as `start_boottime`).
    if ctl.min_age_ns != 0 && unsafe { bpf_ktime_get_boot_ns() }.saturating_sub(start) < ctl.min_age_ns {
        return Ok(());
    }
    let ns = arg_u64(ctx, 1);
    let tgid: u32 = task.get(off!(task_tgid));
    let map = if ctl.generation & 1 == 0 { &CPU_RUN_A } else { &CPU_RUN_B };
    if add_runtime(map, tgid, ns) {
        return Ok(());
    }
    // A new entry: the task iterator's rule, kernel threads never count (they run as uid 0).
    if task.get::<u32>(off!(task_flags)) & PF_KTHREAD != 0 {
        return Ok(());
    }
    let run = CpuRun { ns, start_boottime_ns: start, comm: comm_of(leader)? };
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
/// folds threads into their process). It reports every account: the CPU samples' fallback and
/// the machine-wide checks need them; the daemon keeps its account's.
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
/// session's last) yields the end marker. The task pointer may be NULL to the verifier, so it
/// is copied out as a scalar and its fields with helper calls.
#[inline(always)]
fn try_task_iter(ctx: *mut c_void) -> Result<Option<TaskRecord>, i64> {
    // ctx->task, as a scalar (see the crate doc): offsets get added to it.
    let task: u64 = read(ctx as u64, 8)?;
    if task == 0 {
        return Ok(Some(TaskRecord { tgid: 0, tid: TASK_MARK_END, ..TaskRecord::default() }));
    }
    let flags: u32 = read(task, off!(task_flags))?;
    if flags & PF_KTHREAD != 0 {
        return Ok(None);
    }
    // pid and tgid are adjacent `pid_t`s (user space checks it: `KernelOffsets::task_tgid`), so
    // one read brings both; a probe read costs more than the task iterator's own step.
    let ids: u64 = read(task, off!(task_pid))?;
    let (tid, tgid) = (ids as u32, (ids >> 32) as u32);
    let mut rec = TaskRecord { tgid, tid, cpu_ns: read(task, off!(task_sum_exec_runtime))?, ..TaskRecord::default() };
    if tid == tgid {
        rec.exit_state = read(task, off!(task_exit_state))?;
        let signal: u64 = read(task, off!(task_signal))?;
        rec.live = read::<i32>(signal, off!(signal_live))? as u32;
        rec.cpu_ns += read::<u64>(signal, off!(signal_sum_sched_runtime))?;
        let cred: u64 = read(task, off!(task_cred))?;
        rec.euid = read(cred, off!(cred_euid))?;
        rec.start_boottime_ns = read(task, off!(task_start_boottime))?;
        rec.comm = read(task, off!(task_comm))?;
    }
    Ok(Some(rec))
}
