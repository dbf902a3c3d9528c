//! The credential programs: a leader entering or leaving the account through a credential
//! change (the `commit_creds` fentry, typed or with probe reads), and the fallback where no
//! fentry attaches: the raw syscall tracepoints, filtered to the setuid family of both ABIs.
use super::*;

/// fentry on `commit_creds(new)` (kernel/cred.c): the calling task's credentials are about to
/// become `new`. A leader whose euid enters or leaves the account is reported with the new
/// euid (the table adds or drops it at once; before this hook only the 10-minute audit saw a
/// uid change where the syscall tracepoints could not attach). The current task comes typed
/// from `bpf_get_current_task_btf` (Linux ≥ 5.11).
#[fentry(function = "commit_creds")]
pub fn commit_creds(ctx: FEntryContext) -> i32 {
    finish(try_commit_creds(ctx.as_ptr()))
}

fn try_commit_creds(ctx: *mut c_void) -> Res {
    let Some(new) = arg_ptr(ctx, 0) else { return Ok(()) };
    let new_euid: u32 = new.get(off!(cred_euid));
    // SAFETY: no preconditions; the result is typed (and never NULL) for the verifier.
    let task = Kptr(unsafe { bpf_get_current_task_btf() } as *const u8);
    let Some(old_euid) = euid_of(task) else { return Ok(()) };
    if !cred_news(old_euid, new_euid) {
        return Ok(());
    }
    if task.get::<u32>(off!(task_pid)) != task.get::<u32>(off!(task_tgid)) {
        return Ok(()); // a thread's own credentials are not the process's
    }
    emit(kind::SETUID, task, 0, new_euid, None)
}

/// [`commit_creds`] for kernels without `bpf_get_current_task_btf` (before 5.11): the current
/// task's fields are copied with helper calls.
#[fentry(function = "commit_creds")]
pub fn commit_creds_probe(ctx: FEntryContext) -> i32 {
    finish(try_commit_creds_probe(ctx.as_ptr()))
}

fn try_commit_creds_probe(ctx: *mut c_void) -> Res {
    let Some(new) = arg_ptr(ctx, 0) else { return Ok(()) };
    let new_euid: u32 = new.get(off!(cred_euid));
    let task = unsafe { bpf_get_current_task() };
    let cred: u64 = read(task, off!(task_cred))?;
    if !cred_news(read(cred, off!(cred_euid))?, new_euid) {
        return Ok(());
    }
    let ids: u64 = read(task, off!(task_pid))?;
    if ids as u32 != (ids >> 32) as u32 {
        return Ok(());
    }
    emit_untyped(kind::SETUID, task, new_euid)
}

/// [`emit`] for a task pointer the verifier does not type.
#[inline(always)]
fn emit_untyped(event_kind: u32, task: u64, euid: u32) -> Res {
    let leader: u64 = read(task, off!(task_group_leader))?;
    let tgid: u32 = read(task, off!(task_tgid))?;
    let start: u64 = read(leader, off!(task_start_boottime))?;
    let comm = read(leader, off!(task_comm))?;
    submit(RawEvent { kind: event_kind, pid: tgid, aux: 0, euid, start_boottime_ns: start, comm })
}

/// Whether the syscall `nr` in progress (at its entry or exit, `regs` its registers) is one of
/// the setuid family, of the native ABI or of the 32-bit compat one (`GUARD_SYSCALLS`). Most
/// syscalls are answered by comparing `nr` with nine constants; the compat flag is read only for
/// a number of the family.
#[inline(always)]
fn setuid_call(regs: Kptr, nr: u32) -> Result<bool, i64> {
    let native_mask = sc!(native_mask);
    if native_mask == 0 {
        return Ok(false); // not configured by the loader
    }
    let native = [sc!(native[0]), sc!(native[1]), sc!(native[2])];
    let compat = [sc!(compat[0]), sc!(compat[1]), sc!(compat[2]), sc!(compat[3]), sc!(compat[4]), sc!(compat[5])];
    let in_native = native.contains(&(nr & native_mask));
    if !in_native && !compat.contains(&nr) {
        return Ok(false);
    }
    let mask = sc!(compat_mask);
    let is_compat = mask != 0
        && if sc!(compat_in_regs) != 0 {
            regs.get::<u32>(sc!(compat_off)) & mask != 0
        } else {
            // The current task, copied with a helper: bpf_get_current_task_btf is 5.11+.
            read::<u32>(unsafe { bpf_get_current_task() }, sc!(compat_off))? & mask != 0
        };
    Ok(if is_compat { compat.contains(&nr) } else { in_native })
}

/// tp_btf on the raw `sys_enter(regs, id)`, attached only where the `commit_creds` hook cannot
/// attach: for a setuid-family call (either ABI), notes a leader of the account (its euid is
/// about to change, or not), for [`sys_exit_setuid`]. The raw tracepoint sees every syscall,
/// 32-bit compat ones included (the per-syscall `syscalls/` tracepoints skip those), and
/// attaches without perf_event_open (which Debian's `perf_event_paranoid=3` refuses to a unit
/// without CAP_SYS_ADMIN).
#[btf_tracepoint(function = "sys_enter")]
pub fn sys_enter_setuid(ctx: BtfTracePointContext) -> i32 {
    let ctx = ctx.as_ptr();
    let Some(regs) = arg_ptr(ctx, 0) else { return 0 };
    match setuid_call(regs, arg_u64(ctx, 1) as u32) {
        Ok(false) => 0,
        Ok(true) => finish(try_setuid_enter()),
        Err(e) => finish(Err(e)),
    }
}

fn try_setuid_enter() -> Res {
    if guard_uid() == ALL_ACCOUNTS {
        return Ok(()); // the exit side reports every call
    }
    let task = unsafe { bpf_get_current_task() };
    let ids: u64 = read(task, off!(task_pid))?;
    let tid = ids as u32;
    if tid != (ids >> 32) as u32 {
        return Ok(());
    }
    let cred: u64 = read(task, off!(task_cred))?;
    if !watched(read(cred, off!(cred_euid))?) {
        return Ok(());
    }
    SETUID_FROM.insert(tid, 1, 0).map_err(|e| e as i64)
}

/// tp_btf on the raw `sys_exit(regs, ret)`, attached only where the `commit_creds` hook cannot
/// attach: the caller's credentials are committed by then. Only the leader's euid is the
/// process's (what `ps -u` shows). Reported when the new euid is the account's and the enter
/// side did not note it (entering), or the enter side noted it and the new one is not
/// (leaving); watching every account, every leader's call.
#[btf_tracepoint(function = "sys_exit")]
pub fn sys_exit_setuid(ctx: BtfTracePointContext) -> i32 {
    let ctx = ctx.as_ptr();
    let Some(regs) = arg_ptr(ctx, 0) else { return 0 };
    match setuid_call(regs, regs.get(sc!(regs_nr))) {
        Ok(false) => 0,
        Ok(true) => finish(try_setuid()),
        Err(e) => finish(Err(e)),
    }
}

fn try_setuid() -> Res {
    let task = unsafe { bpf_get_current_task() };
    let ids: u64 = read(task, off!(task_pid))?;
    let tid = ids as u32;
    if tid != (ids >> 32) as u32 {
        return Ok(());
    }
    let cred: u64 = read(task, off!(task_cred))?;
    let euid: u32 = read(cred, off!(cred_euid))?;
    if guard_uid() != ALL_ACCOUNTS {
        // SAFETY: the value is only tested for presence.
        let was = unsafe { SETUID_FROM.get(tid) }.is_some();
        if was {
            let _ = SETUID_FROM.remove(tid);
        }
        if was == watched(euid) {
            return Ok(());
        }
    }
    emit_untyped(kind::SETUID, task, euid)
}
