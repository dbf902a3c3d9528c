//! Typed process events: what the BPF programs (or a recorded trace) tell the table.
//!
//! One decoder turns ring-buffer bytes into an [`Event`] or a [`DecodeError`]; [`Event::encode`]
//! is its inverse so tests can record and replay traces without a kernel.
use guard_common::{kind, RawEvent, COMM_LEN};

use crate::comm::Comm;

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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A new process (not a thread), named like its parent.
    Fork { child: ProcState, parent_pid: u32 },
    /// The process ran a new program.
    Exec(ProcState),
    /// The process's leader was renamed.
    Rename(ProcState),
    /// The process's effective uid changed without exec.
    Setuid(ProcState),
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
    /// Decodes one ring-buffer record.
    pub fn decode(bytes: &[u8]) -> Result<Event, DecodeError> {
        if bytes.len() != RawEvent::SIZE {
            return Err(DecodeError::Size(bytes.len()));
        }
        let u32_at = |o: usize| u32::from_ne_bytes(bytes[o..o + 4].try_into().unwrap());
        let raw_kind = u32_at(0);
        let pid = u32_at(4);
        let aux = u32_at(8);
        let euid = u32_at(12);
        let start_ns = u64::from_ne_bytes(bytes[16..24].try_into().unwrap());
        let mut comm = [0u8; COMM_LEN];
        comm.copy_from_slice(&bytes[24..24 + COMM_LEN]);
        if pid == 0 {
            return Err(DecodeError::ZeroPid);
        }
        let id = ProcId { pid, start_ticks: ns_to_ticks(start_ns) };
        let state = ProcState { id, euid, comm: Comm::from_kernel(&comm) };
        Ok(match raw_kind {
            kind::FORK => Event::Fork { child: state, parent_pid: aux },
            kind::EXEC => Event::Exec(state),
            kind::RENAME => Event::Rename(state),
            kind::SETUID => Event::Setuid(state),
            kind::EXIT => Event::Exit(id),
            other => return Err(DecodeError::Kind(other)),
        })
    }

    /// The record the kernel would have written for this event (start time in whole ticks).
    pub fn encode(&self) -> [u8; RawEvent::SIZE] {
        let (k, state, aux) = match *self {
            Event::Fork { child, parent_pid } => (kind::FORK, Some(child), parent_pid),
            Event::Exec(s) => (kind::EXEC, Some(s), 0),
            Event::Rename(s) => (kind::RENAME, Some(s), 0),
            Event::Setuid(s) => (kind::SETUID, Some(s), 0),
            Event::Exit(_) => (kind::EXIT, None, 0),
        };
        let id = self.id();
        let mut out = [0u8; RawEvent::SIZE];
        out[0..4].copy_from_slice(&k.to_ne_bytes());
        out[4..8].copy_from_slice(&id.pid.to_ne_bytes());
        out[8..12].copy_from_slice(&aux.to_ne_bytes());
        let ns = id.start_ticks * (1_000_000_000 / clock_ticks_per_sec());
        out[16..24].copy_from_slice(&ns.to_ne_bytes());
        if let Some(s) = state {
            out[12..16].copy_from_slice(&s.euid.to_ne_bytes());
            out[24..24 + COMM_LEN].copy_from_slice(&s.comm.to_kernel());
        }
        out
    }

    pub fn id(&self) -> ProcId {
        match self {
            Event::Fork { child, .. } => child.id,
            Event::Exec(s) | Event::Rename(s) | Event::Setuid(s) => s.id,
            Event::Exit(id) => *id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(pid: u32, name: &str) -> ProcState {
        ProcState { id: ProcId { pid, start_ticks: 12_345 }, euid: 1000, comm: Comm::new(name.as_bytes()) }
    }

    #[test]
    fn every_event_kind_round_trips_through_the_kernel_record() {
        let events = [
            Event::Fork { child: state(10, "agentihooks"), parent_pid: 9 },
            Event::Exec(state(11, "sleep")),
            Event::Rename(state(12, "fifteen-bytes!!")),
            Event::Setuid(state(13, "su")),
            Event::Exit(ProcId { pid: 14, start_ticks: 7 }),
        ];
        for e in events {
            assert_eq!(Event::decode(&e.encode()).unwrap(), e, "{e:?}");
        }
    }

    #[test]
    fn truncated_unknown_and_zero_pid_records_are_rejected() {
        let good = Event::Exec(state(11, "sleep")).encode();
        assert_eq!(Event::decode(&good[..39]), Err(DecodeError::Size(39)));
        let mut bad = good;
        bad[0] = 99;
        assert_eq!(Event::decode(&bad), Err(DecodeError::Kind(99)));
        let mut zero = good;
        zero[4..8].fill(0);
        assert_eq!(Event::decode(&zero), Err(DecodeError::ZeroPid));
    }

    #[test]
    fn decoder_never_panics_on_arbitrary_bytes() {
        // A small deterministic corpus; the fuzz target in tests/ runs the long version.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in 0..64 {
            let mut buf = vec![0u8; len];
            for b in &mut buf {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            let _ = Event::decode(&buf);
        }
    }
}
