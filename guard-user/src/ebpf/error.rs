//! Why loading or attaching the programs failed, as a typed error with the token of its
//! `WARN backend_fallback` line, and the aya error chain turned into a readable detail.
use aya::programs::ProgramError;

use crate::btf::BtfError;

#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    #[error("this guard-user was built without BPF programs (build it with `cargo xtask build`)")]
    NoObject,
    #[error("ring buffer of {bytes} bytes: must be a power of two of at least the page size ({page})")]
    RingSize { bytes: u32, page: u32 },
    #[error(transparent)]
    Btf(#[from] BtfError),
    /// EPERM or EACCES from the kernel. What it means depends on who asked: without the
    /// capabilities it is advice to get them; with them, the kernel refuses this kind of program
    /// whatever the privileges (said so, never "needs root" to root).
    #[error("{}", permission_text(what, detail))]
    Permission { what: String, detail: String },
    #[error("cannot load the BPF object: {detail}")]
    Load { detail: String },
    #[error("cannot load or attach `{program}` to `{tracepoint}`: {detail}")]
    Attach { program: String, tracepoint: String, detail: String },
    #[error("BPF map `{name}` is missing or of the wrong type")]
    Map { name: &'static str },
    #[error("the account's uid {0} is the value that means every account")]
    Account(u32),
}

impl EbpfError {
    /// The token for `WARN backend_fallback reason=<token>`.
    pub fn reason(&self) -> &'static str {
        match self {
            EbpfError::NoObject => "no_bpf_object",
            EbpfError::RingSize { .. } => "bad_ring_size",
            EbpfError::Btf(_) => "no_btf",
            EbpfError::Permission { .. } => "permission_denied",
            EbpfError::Load { .. } | EbpfError::Map { .. } | EbpfError::Account(_) => "load_failed",
            EbpfError::Attach { .. } => "attach_failed",
        }
    }
}

/// Whether this process holds what loading BPF programs and attaching the tp_btf ones need
/// (`CapEff` in /proc/self/status): CAP_BPF (39) and CAP_PERFMON (38), or CAP_SYS_ADMIN (21).
/// Unknown (no /proc) counts as held: the kernel's answer then speaks for itself.
pub fn holds_bpf_capabilities() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return true };
    let Some(hex) = status.lines().find_map(|l| l.strip_prefix("CapEff:")) else { return true };
    let Ok(caps) = u64::from_str_radix(hex.trim(), 16) else { return true };
    let has = |bit: u32| caps & (1u64 << bit) != 0;
    has(21) || (has(38) && has(39))
}

/// [`EbpfError::Permission`]'s text, one line: advice to the process that lacks the
/// capabilities, and to one that holds them, what the refusal means.
fn permission_text(what: &str, detail: &str) -> String {
    permission_text_for(holds_bpf_capabilities(), what, detail)
}

/// [`permission_text`] for a process that `holds` the capabilities or not.
fn permission_text_for(holds: bool, what: &str, detail: &str) -> String {
    if holds {
        format!(
            "the kernel refused {what} although this process holds CAP_BPF and CAP_PERFMON: it does not allow \
             this kind of program here (no BPF trampolines for fentry, lockdown, or a security module) ({detail})"
        )
    } else {
        format!("{what} needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN): run guard-user as root or under the shipped unit ({detail})")
    }
}

/// Whether an aya error comes from EPERM/EACCES somewhere down its source chain.
pub(super) fn is_permission(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if matches!(io.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES)) {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

/// An error's text with its sources and, for a verifier rejection, the end of the verifier's
/// log (the part that says which instruction it refused).
///
/// One line unless the verifier said something: aya's chain repeats a source's text in its
/// parent's (`…returned Operation not permitted (os error 1). Verifier output: : Operation not
/// permitted (os error 1)`), and an EPERM before the verifier ran leaves an empty log, which
/// used to add two stderr lines (two journal entries) saying nothing.
pub(super) fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(err) = cur {
        let text = err.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = err.source();
    }
    if let Some(ProgramError::LoadError { verifier_log, .. }) = e.downcast_ref::<ProgramError>() {
        let log = verifier_log.to_string();
        let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
        // aya writes "Verifier output: <log>" into the error's text; an empty log leaves a dangling colon.
        if let Some(head) = s.strip_suffix("Verifier output: ").or_else(|| s.strip_suffix(". Verifier output:")) {
            s = head.trim_end_matches([' ', '.']).to_string();
        }
        if !lines.is_empty() {
            s.push_str("\nverifier log (end):\n");
            s.push_str(&lines[lines.len().saturating_sub(30)..].join("\n"));
        }
    }
    s
}

pub(super) fn program_error(program: &str, tracepoint: &str, e: ProgramError) -> EbpfError {
    let detail = describe(&e);
    if is_permission(&e) {
        EbpfError::Permission { what: format!("attaching `{program}`"), detail }
    } else {
        EbpfError::Attach { program: program.into(), tracepoint: tracepoint.into(), detail }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_single_tokens() {
        let errors = [
            EbpfError::NoObject,
            EbpfError::RingSize { bytes: 1, page: 4096 },
            EbpfError::Permission { what: String::new(), detail: String::new() },
            EbpfError::Load { detail: String::new() },
            EbpfError::Attach { program: String::new(), tracepoint: String::new(), detail: String::new() },
            EbpfError::Map { name: "EVENTS" },
        ];
        for e in errors {
            let r = e.reason();
            assert!(!r.is_empty() && r.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'), "{r}");
        }
    }

    /// Root with every capability is never told it "needs root": it is told what the refusal
    /// means; only a process without them gets the advice to run as root. One line either way.
    #[test]
    fn a_refusal_is_advice_only_to_whom_lacks_the_capabilities() {
        let held = permission_text_for(true, "attaching `commit_creds`", "Operation not permitted (os error 1)");
        assert!(held.starts_with("the kernel refused attaching `commit_creds` although this process holds"), "{held}");
        assert!(!held.contains("run guard-user as root"), "{held}");
        let lacking = permission_text_for(false, "attaching `commit_creds`", "Operation not permitted (os error 1)");
        assert!(lacking.starts_with("attaching `commit_creds` needs CAP_BPF and CAP_PERFMON"), "{lacking}");
        for text in [held, lacking] {
            assert_eq!(text.lines().count(), 1, "{text}");
            assert_eq!(text.matches("os error 1").count(), 1, "{text}");
        }
    }

    /// A chain whose parent repeats its source's text is said once, on one line.
    #[test]
    fn an_error_chain_that_repeats_itself_is_described_once() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "`sys_enter` failed: {}", self.0)
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Outer(std::io::Error::from_raw_os_error(libc::EPERM));
        let text = describe(&e);
        assert_eq!(text, "`sys_enter` failed: Operation not permitted (os error 1)");
        assert!(is_permission(&e));
    }
}
