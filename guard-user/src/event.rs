//! Typed process events: what the BPF programs (or a recorded trace) tell the table.
//!
//! One decoder turns ring-buffer bytes into an [`Event`] or a [`DecodeError`]; [`Event::encode`]
//! is its inverse so tests can record and replay traces without a kernel.
#[cfg(any(test, feature = "testing"))]
use guard_common::COMM_LEN;
use guard_common::{kind, RawEvent};

use crate::{comm::Comm, pod};

/// Identity of a process: pid plus start time, so a recycled pid is never mistaken for the
/// process that held it before.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcId {
    /// Thread-group id in the initial pid namespace.
    pub pid: u32,
    /// Start time in clock ticks since boot (`/proc/PID/stat` field 22).
    pub start_ticks: u64,
}

/// The state of a process an event reports: every event carries the full state (absolute, not a
/// delta), so replaying events over a /proc snapshot converges to the truth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcState {
    pub id: ProcId,
    /// Effective uid, as `ps -u` selects.
    pub euid: u32,
    /// The thread-group leader's comm.
    pub comm: Comm,
}

/// What a [`Event::State`] reports: why the process's state is news. The table and the policy
/// treat every kind alike (an upsert); traces, logs and the session lineage tell them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateKind {
    /// The process ran a new program.
    Exec,
    /// The process's leader was renamed.
    Rename,
    /// The process's effective uid changed without exec.
    Setuid,
}

impl StateKind {
    /// The kind's name in traces (`"ev":"exec"`) and diagnostics.
    pub fn token(self) -> &'static str {
        match self {
            StateKind::Exec => "exec",
            StateKind::Rename => "rename",
            StateKind::Setuid => "setuid",
        }
    }

    /// The kind a trace names, if it is one.
    #[cfg(any(test, feature = "testing"))]
    pub fn from_token(token: &str) -> Option<StateKind> {
        [StateKind::Exec, StateKind::Rename, StateKind::Setuid].into_iter().find(|k| k.token() == token)
    }

    /// `RawEvent::kind` of the kernel's record.
    #[cfg(any(test, feature = "testing"))]
    fn raw(self) -> u32 {
        match self {
            StateKind::Exec => kind::EXEC,
            StateKind::Rename => kind::RENAME,
            StateKind::Setuid => kind::SETUID,
        }
    }
}

/// When the kernel wakes the pump (the value of the BPF programs' `EXEC_WAKE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// At the drain timer, or when the ring is a sixteenth full: an idle host's few events cost
    /// one wake-up a second.
    Timer = 0,
    /// As soon as a record comes after the pump read everything (the ring's adaptive
    /// notification): heavy-command slots hold a matching exec within milliseconds, and start
    /// the next in line at a holder's exit.
    Adaptive = 1,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A new process (not a thread), named like its parent.
    Fork { child: ProcState, parent_pid: u32 },
    /// The process's current state (a new program, name or effective uid: `kind` says which).
    State { kind: StateKind, state: ProcState },
    /// The whole thread group exited.
    Exit(ProcId),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("event record is {0} bytes, expected {expected}", expected = RawEvent::SIZE)]
    Size(usize),
    #[error("event record has unknown kind {0}")]
    Kind(u32),
    #[error("event record has pid 0")]
    ZeroPid,
}

/// Converts the kernel's `start_boottime` (ns) to clock ticks the way /proc does
/// (`nsec_to_clock_t`, fs/proc/array.c), so both sources agree on identities.
pub fn ns_to_ticks(ns: u64) -> u64 {
    ns / (1_000_000_000 / clock_ticks_per_sec())
}

/// `sysconf(_SC_CLK_TCK)`: USER_HZ, 100 on every Linux architecture we run on.
pub fn clock_ticks_per_sec() -> u64 {
    static TCK: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TCK.get_or_init(|| {
        // SAFETY: sysconf has no memory-safety preconditions.
        let v = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        if v > 0 {
            v as u64
        } else {
            100
        }
    })
}

impl Event {
    /// Decodes one ring-buffer record: exactly one `RawEvent`, read as that type.
    pub fn decode(bytes: &[u8]) -> Result<Event, DecodeError> {
        let raw: RawEvent = pod::read(bytes).ok_or(DecodeError::Size(bytes.len()))?;
        if raw.pid == 0 {
            return Err(DecodeError::ZeroPid);
        }
        let id = ProcId { pid: raw.pid, start_ticks: ns_to_ticks(raw.start_boottime_ns) };
        let state = ProcState { id, euid: raw.euid, comm: Comm::from_kernel(&raw.comm) };
        let state_of = |kind| Event::State { kind, state };
        Ok(match raw.kind {
            kind::FORK => Event::Fork { child: state, parent_pid: raw.aux },
            kind::EXEC => state_of(StateKind::Exec),
            kind::RENAME => state_of(StateKind::Rename),
            kind::SETUID => state_of(StateKind::Setuid),
            kind::EXIT => Event::Exit(id),
            other => return Err(DecodeError::Kind(other)),
        })
    }

    /// The record the kernel would have written for this event (start time in whole ticks).
    #[cfg(any(test, feature = "testing"))]
    pub fn encode(&self) -> [u8; RawEvent::SIZE] {
        let (k, state, aux) = match *self {
            Event::Fork { child, parent_pid } => (kind::FORK, Some(child), parent_pid),
            Event::State { kind, state } => (kind.raw(), Some(state), 0),
            Event::Exit(_) => (kind::EXIT, None, 0),
        };
        let id = self.id();
        let raw = RawEvent {
            kind: k,
            pid: id.pid,
            aux,
            euid: state.map_or(0, |s| s.euid),
            start_boottime_ns: id.start_ticks * (1_000_000_000 / clock_ticks_per_sec()),
            comm: state.map_or([0; COMM_LEN], |s| s.comm.to_kernel()),
        };
        let mut out = [0u8; RawEvent::SIZE];
        out.copy_from_slice(pod::bytes(&raw));
        out
    }

    pub fn id(&self) -> ProcId {
        match self {
            Event::Fork { child, .. } => child.id,
            Event::State { state, .. } => state.id,
            Event::Exit(id) => *id,
        }
    }

    /// The process's state the event carries (all but an exit).
    pub fn state(&self) -> Option<ProcState> {
        match *self {
            Event::Fork { child, .. } => Some(child),
            Event::State { state, .. } => Some(state),
            Event::Exit(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(pid: u32, name: &str) -> ProcState {
        ProcState { id: ProcId { pid, start_ticks: 12_345 }, euid: 1000, comm: Comm::new(name.as_bytes()) }
    }

    fn st(kind: StateKind, pid: u32, name: &str) -> Event {
        Event::State { kind, state: state(pid, name) }
    }

    #[test]
    fn every_event_kind_round_trips_through_the_kernel_record() {
        let events = [
            Event::Fork { child: state(10, "agentihooks"), parent_pid: 9 },
            st(StateKind::Exec, 11, "sleep"),
            st(StateKind::Rename, 12, "fifteen-bytes!!"),
            st(StateKind::Setuid, 13, "su"),
            Event::Exit(ProcId { pid: 14, start_ticks: 7 }),
        ];
        for e in events {
            assert_eq!(Event::decode(&e.encode()).unwrap(), e, "{e:?}");
        }
    }

    #[test]
    fn truncated_unknown_and_zero_pid_records_are_rejected() {
        let good = st(StateKind::Exec, 11, "sleep").encode();
        assert_eq!(Event::decode(&good[..39]), Err(DecodeError::Size(39)));
        let mut bad = good;
        bad[0] = 99;
        assert_eq!(Event::decode(&bad), Err(DecodeError::Kind(99)));
        let mut zero = good;
        zero[4..8].fill(0);
        assert_eq!(Event::decode(&zero), Err(DecodeError::ZeroPid));
    }

    /// The decoder reads the record as guard-common's `RawEvent`: one byte more or less than
    /// that type is refused, a garbled kind is refused, and the ring's unaligned records decode.
    #[test]
    fn a_record_that_is_not_exactly_one_raw_event_is_refused() {
        let good = st(StateKind::Setuid, 13, "su").encode();
        let mut longer = good.to_vec();
        longer.push(0);
        assert_eq!(Event::decode(&longer), Err(DecodeError::Size(RawEvent::SIZE + 1)));
        assert_eq!(Event::decode(&[]), Err(DecodeError::Size(0)));
        let mut garbled = good;
        garbled[0..4].copy_from_slice(&0xdead_beef_u32.to_ne_bytes());
        assert_eq!(Event::decode(&garbled), Err(DecodeError::Kind(0xdead_beef)));
        let mut unaligned = [0u8; RawEvent::SIZE + 3];
        unaligned[3..].copy_from_slice(&good);
        assert_eq!(Event::decode(&unaligned[3..]), Ok(st(StateKind::Setuid, 13, "su")));
    }

    #[test]
    fn decoder_never_panics_on_arbitrary_bytes() {
        // A small deterministic corpus; the fuzz target in tests/ runs the long version.
        let mut rng = guard_test::rng::Rng(0x9e37_79b9_7f4a_7c15);
        for len in 0..64 {
            let mut buf = vec![0u8; len];
            for b in &mut buf {
                *b = rng.byte();
            }
            let _ = Event::decode(&buf);
        }
    }
}
