//! What came of signalling a target: the enforcer's answer, which `policy` turns into lines and
//! counts (the signalling itself is `crate::enforcer`).

/// Why a process was not signalled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Gone, or its pid now names another process, or its name/uid changed.
    IdentityChanged,
    /// The daemon itself, pid 1, or another uid: never signalled, whatever the table says.
    Forbidden,
}

/// The outcome for one target. `KILLED` is logged for [`Outcome::Ended`] only: the process is
/// gone after SIGTERM, or it was sent SIGKILL as itself (same pid, start time, name, uid), which
/// it cannot survive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Gone after SIGTERM (`needed_sigkill: false`) or sent SIGKILL as itself.
    Ended { needed_sigkill: bool },
    /// SIGTERM delivered, but at the end of the grace period it was alive under another identity
    /// (it renamed itself or exec'd): not sent SIGKILL, not `KILLED`.
    Survived,
    /// Dry run: the identity holds, nothing was sent.
    Verified,
    /// SIGTERM delivered, nothing waited for: a session's leftovers get their SIGKILL at a
    /// later tick (`Enforcer::term_all`, `Enforcer::kill_all`).
    Termed,
    /// Not signalled.
    Refused(Refusal),
}
