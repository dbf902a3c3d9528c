//! How a process entering or leaving the account through a credential change reaches the ring:
//! the fentry hook on `commit_creds` where it attaches, else the raw syscall tracepoints
//! filtered to the setuid family of both ABIs ([`super::syscalls`]), else nothing (the audit
//! catches up).
//!
//! The fallback once used the per-syscall tracepoints (`syscalls/sys_exit_setresuid`, …). Those
//! never fire for a 32-bit compat syscall, so `setresuid32` (`int 0x80`) re-entered the account
//! unseen, and they attach through perf_event_open, which Debian's `perf_event_paranoid=3`
//! refuses to the unit's CAP_BPF and CAP_PERFMON. The raw tracepoints (tp_btf `sys_enter`,
//! `sys_exit`) have neither gap and need no tracefs; they run for every syscall of the machine,
//! which the programs answer with a few compares (only while the hook is missing).
use aya::{
    programs::{BtfTracePoint, FEntry},
    Ebpf,
};

use super::{error::program_error, EbpfError};

/// The kernel function every credential change goes through (kernel/cred.c): the setuid
/// family, exec's install of the new credentials, and a few that never change the euid
/// (setfsuid, capset, keyrings). The only writer of `task->real_cred` after fork.
pub(super) const CRED_HOOK: &str = "commit_creds";

/// The raw syscall tracepoints the fallback attaches to (tp_btf: `btf_trace_sys_enter`, …).
pub(super) const SYSCALL_TRACEPOINTS: [&str; 2] = ["sys_enter", "sys_exit"];

/// One program on the syscall exit (it reports) and one on the entry (it notes who may leave).
const SETUID_PROGRAM: &str = "sys_exit_setuid";
const SETUID_ENTER_PROGRAM: &str = "sys_enter_setuid";

/// How a process entering or leaving the account through a credential change (the setuid
/// family, an exec of a set-user-ID binary) reaches the table.
#[derive(Debug)]
pub enum CredTracking {
    /// The fentry hook on `commit_creds`: every change, at once.
    Hook,
    /// The hook could not attach (why); the raw syscall tracepoints did, filtered to the setuid
    /// family (native and 32-bit compat). An exec of a set-user-ID binary that takes a process
    /// out of the account is still reported by the exec program when the process's real uid is
    /// the account's; otherwise the audit sees it.
    Syscalls { hook: EbpfError },
    /// Neither attached: uid changes without exec reach the table through the audit only.
    Audit { hook: EbpfError, syscalls: EbpfError },
}

impl CredTracking {
    /// `fallback=` of `WARN setuid_untracked`, and the hook's failure, when the hook is missing.
    pub fn fallback(&self) -> Option<(&'static str, &EbpfError)> {
        match self {
            CredTracking::Hook => None,
            CredTracking::Syscalls { hook } => Some(("syscall_tracepoints", hook)),
            CredTracking::Audit { hook, .. } => Some(("audit", hook)),
        }
    }
}

/// The credential hook on `commit_creds` (its typed variant, else the one for kernels before
/// 5.11), else the raw syscall tracepoints (`syscalls` says whether the programs got their
/// numbers and offsets), else nothing (the audit). Returns the tracking and the program that
/// reports, for the lost-event count.
pub(super) fn attach_creds(
    ebpf: &mut Ebpf,
    btf: &aya::Btf,
    skip_hook: bool,
    syscalls: Result<(), EbpfError>,
) -> (CredTracking, Option<&'static str>) {
    let mut hook_error = skip_hook.then(|| EbpfError::Attach {
        program: "commit_creds".into(),
        tracepoint: CRED_HOOK.into(),
        detail: "left out on request (EbpfOptions::skip_cred_hook)".into(),
    });
    for prog in ["commit_creds", "commit_creds_probe"].into_iter().filter(|_| !skip_hook) {
        match attach_fentry(ebpf, btf, prog) {
            Ok(()) => return (CredTracking::Hook, Some(prog)),
            Err(e) => {
                tracing::debug!("{prog}: {e}");
                // The first program's error says why (the second only exists for old kernels).
                hook_error.get_or_insert(e);
            }
        }
    }
    let hook = hook_error.expect("two attempts");
    match syscalls.and_then(|()| attach_setuid(ebpf, btf)) {
        Ok(()) => (CredTracking::Syscalls { hook }, Some(SETUID_PROGRAM)),
        Err(syscalls) => (CredTracking::Audit { hook, syscalls }, None),
    }
}

fn attach_fentry(ebpf: &mut Ebpf, btf: &aya::Btf, prog: &str) -> Result<(), EbpfError> {
    let p: &mut FEntry = ebpf
        .program_mut(prog)
        .ok_or_else(|| EbpfError::Attach {
            program: prog.into(),
            tracepoint: CRED_HOOK.into(),
            detail: "not in the object".into(),
        })?
        .try_into()
        .map_err(|e| program_error(prog, CRED_HOOK, e))?;
    p.load(CRED_HOOK, btf).map_err(|e| program_error(prog, CRED_HOOK, e))?;
    p.attach().map_err(|e| program_error(prog, CRED_HOOK, e))?;
    Ok(())
}

/// The enter program first (so no exit misses its enter), then the exit program.
fn attach_setuid(ebpf: &mut Ebpf, btf: &aya::Btf) -> Result<(), EbpfError> {
    for (prog, tp) in [SETUID_ENTER_PROGRAM, SETUID_PROGRAM].into_iter().zip(SYSCALL_TRACEPOINTS) {
        let p: &mut BtfTracePoint = ebpf
            .program_mut(prog)
            .ok_or_else(|| EbpfError::Attach {
                program: prog.into(),
                tracepoint: tp.into(),
                detail: "not in the object".into(),
            })?
            .try_into()
            .map_err(|e| program_error(prog, tp, e))?;
        p.load(tp, btf).map_err(|e| program_error(prog, tp, e))?;
        p.attach().map_err(|e| program_error(prog, tp, e))?;
    }
    Ok(())
}
