//! How a process entering or leaving the account through a credential change reaches the ring:
//! the fentry hook on `commit_creds` where it attaches, else the setuid-family syscall
//! tracepoints (which need tracefs), else nothing (the audit catches up).
use aya::{
    programs::{FEntry, TracePoint},
    Ebpf,
};

use super::{error::program_error, tracefs::ensure_tracefs, EbpfError};

/// The kernel function every credential change goes through (kernel/cred.c): the setuid
/// family, exec's install of the new credentials, and a few that never change the euid
/// (setfsuid, capset, keyrings). The only writer of `task->real_cred` after fork.
pub(super) const CRED_HOOK: &str = "commit_creds";

/// Uid-changing syscalls whose exit we watch where the credential hook cannot attach. setfsuid
/// does not change the euid; the `*32` variants exist only for 32-bit ABIs, which raise no
/// syscall tracepoints on x86_64.
const SETUID_SYSCALLS: [&str; 3] = ["setuid", "setreuid", "setresuid"];

/// One program on the three syscall-exit tracepoints of the setuid family (it reports), and one
/// on their enter tracepoints (it notes who may leave).
const SETUID_PROGRAM: &str = "sys_exit_setuid";
const SETUID_ENTER_PROGRAM: &str = "sys_enter_setuid";

/// How a process entering or leaving the account through a credential change (the setuid
/// family, an exec of a set-user-ID binary) reaches the table.
#[derive(Debug)]
pub enum CredTracking {
    /// The fentry hook on `commit_creds`: every change, at once.
    Hook,
    /// The hook could not attach (why); the setuid-family syscall tracepoints did. An exec of
    /// a set-user-ID binary that takes a process out of the account is still reported by the
    /// exec program when the process's real uid is the account's; otherwise the audit sees it.
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
/// 5.11), else the setuid-family tracepoints, else nothing (the audit). Returns the tracking
/// and the program that reports, for the lost-event count.
pub(super) fn attach_creds(ebpf: &mut Ebpf, btf: &aya::Btf, skip_hook: bool) -> (CredTracking, Option<&'static str>) {
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
    match ensure_tracefs().and_then(|()| attach_setuid(ebpf)) {
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

/// The enter program on the three enter tracepoints first (so no exit misses its enter), then
/// the exit program on the three exit tracepoints.
fn attach_setuid(ebpf: &mut Ebpf) -> Result<(), EbpfError> {
    for (prog, side) in [(SETUID_ENTER_PROGRAM, "enter"), (SETUID_PROGRAM, "exit")] {
        let p: &mut TracePoint = ebpf
            .program_mut(prog)
            .ok_or_else(|| EbpfError::Attach {
                program: prog.into(),
                tracepoint: "syscalls".into(),
                detail: "not in the object".into(),
            })?
            .try_into()
            .map_err(|e| program_error(prog, "syscalls", e))?;
        p.load().map_err(|e| program_error(prog, "syscalls", e))?;
        for sc in SETUID_SYSCALLS {
            let tp = format!("sys_{side}_{sc}");
            p.attach("syscalls", &tp).map_err(|e| match program_error(prog, &format!("syscalls/{tp}"), e) {
                // Debian's default level 3 (a distribution patch) restricts perf_event_open, which
                // classic tracepoints attach through, to CAP_SYS_ADMIN whatever CAP_PERFMON says.
                EbpfError::Permission { what, detail } => match perf_event_paranoid() {
                    Some(level) if level > 2 => EbpfError::PerfParanoid { what, level, detail },
                    _ => EbpfError::Permission { what, detail },
                },
                other => other,
            })?;
        }
    }
    Ok(())
}

fn perf_event_paranoid() -> Option<i32> {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").ok()?.trim().parse().ok()
}
