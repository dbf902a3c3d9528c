//! Ending processes: SIGTERM to every target, SIGKILL half a second later to survivors
//! (docs/architecture.md step 5), each signal through a pidfd and right after re-verifying the process's
//! identity (pid, start time, name, effective uid).
//!
//! Why the pidfd is opened *before* the check: a pidfd names the process that held the pid at
//! `pidfd_open` time. If /proc then shows our target's start time at that pid, the pidfd is the
//! target (the target existed before the open, so nothing else could hold its pid at that
//! moment). A pid recycled after the check cannot receive the signal: the pidfd still names the
//! old, dead process and the kernel answers ESRCH.
//!
//! # A process that dodged SIGTERM
//! A process that answers SIGTERM by renaming itself (or exec'ing) is alive under another
//! identity when SIGKILL is due, so it is left alone (`Survived`), as the identity rule says. If
//! it then takes its name back, it rejoins the pile, and the same dance would save it at every
//! enforcement, for ever. So the enforcer remembers such survivors (pid and start time, at most
//! [`MAX_DODGERS`], for a day): the next time one of them is a target, it already had its
//! SIGTERM, and it gets SIGKILL right after its identity check, with no grace to dodge in.
use std::{
    collections::HashMap,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::{Duration, Instant},
};

use crate::{
    domain::{Outcome, Refusal},
    event::{ProcId, ProcState},
    procfs,
};

/// Survivors of a SIGTERM remembered at most (the oldest go first): a few bytes each.
pub const MAX_DODGERS: usize = 4096;
/// How long a survivor is remembered: the `REPEAT` window.
pub const DODGER_MEMORY: Duration = Duration::from_secs(24 * 3600);

pub struct Enforcer {
    pub account_uid: u32,
    pub self_pid: u32,
    pub grace: Duration,
    /// Targets that survived their SIGTERM under another identity, and when (see the module
    /// doc): their next enforcement sends SIGKILL at once.
    dodgers: HashMap<ProcId, Instant>,
}

pub(crate) fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open has no memory arguments; a non-negative result is a new fd we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0 as libc::c_uint) };
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn pidfd_signal(fd: &OwnedFd, sig: i32) -> bool {
    // SAFETY: a null siginfo is allowed; the fd is a pidfd we own.
    unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, fd.as_raw_fd(), sig, std::ptr::null::<libc::siginfo_t>(), 0) == 0
    }
}

/// Whether the process behind `fd` has exited (it may still be a zombie).
pub(crate) fn pidfd_exited(fd: &OwnedFd) -> bool {
    let mut pfd = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd, count 1, no wait.
    unsafe { libc::poll(&mut pfd, 1, 0) == 1 && pfd.revents & libc::POLLIN != 0 }
}

impl Enforcer {
    pub fn new(account_uid: u32, self_pid: u32, grace: Duration) -> Enforcer {
        Enforcer { account_uid, self_pid, grace, dodgers: HashMap::new() }
    }

    fn remember_dodger(&mut self, id: ProcId, now: Instant) {
        self.dodgers.retain(|_, at| now.duration_since(*at) < DODGER_MEMORY);
        if self.dodgers.len() >= MAX_DODGERS {
            if let Some(oldest) = self.dodgers.iter().min_by_key(|(_, at)| **at).map(|(id, _)| *id) {
                self.dodgers.remove(&oldest);
            }
        }
        self.dodgers.insert(id, now);
    }

    /// Re-reads /proc and compares with what the decision was made on.
    pub fn verify(&self, target: &ProcState) -> Result<(), Refusal> {
        if target.id.pid == self.self_pid || target.id.pid <= 1 || target.euid != self.account_uid {
            return Err(Refusal::Forbidden);
        }
        let mut buf = Vec::with_capacity(1024);
        match procfs::read_process(target.id.pid, &mut buf) {
            Some(now) if now.id == target.id && now.comm == target.comm && now.euid == target.euid => Ok(()),
            _ => Err(Refusal::IdentityChanged),
        }
    }

    /// Opens a pidfd and verifies; the pidfd is returned only for a verified target.
    fn open_verified(&self, target: &ProcState) -> Result<OwnedFd, Refusal> {
        self.verify(target)?; // cheap refusal of forbidden targets before touching them
        let fd = pidfd_open(target.id.pid).ok_or(Refusal::IdentityChanged)?;
        self.verify(target)?;
        Ok(fd)
    }

    /// Dry run: the outcome a real run would start from, without a signal.
    pub fn verify_all(&self, targets: &[ProcState]) -> Vec<Outcome> {
        targets.iter().map(|t| self.verify(t).map_or_else(Outcome::Refused, |()| Outcome::Verified)).collect()
    }

    /// SIGTERM to each target that is still itself, without waiting (a session's leftovers:
    /// the SIGKILL comes 10 s later, at another tick; a tick never sleeps that long).
    pub fn term_all(&self, targets: &[ProcState]) -> Vec<Outcome> {
        self.signal_each(targets, libc::SIGTERM, Outcome::Termed)
    }

    /// SIGKILL to each target that is still itself: a fresh pidfd, then the identity check, as
    /// for the first signal (a pid recycled since cannot receive it).
    pub fn kill_all(&self, targets: &[ProcState]) -> Vec<Outcome> {
        self.signal_each(targets, libc::SIGKILL, Outcome::Ended { needed_sigkill: true })
    }

    fn signal_each(&self, targets: &[ProcState], sig: i32, sent: Outcome) -> Vec<Outcome> {
        targets
            .iter()
            .map(|t| match self.open_verified(t) {
                Ok(fd) if pidfd_signal(&fd, sig) => sent,
                // It exited between the check and the signal.
                Ok(_) => Outcome::Refused(Refusal::IdentityChanged),
                Err(r) => Outcome::Refused(r),
            })
            .collect()
    }

    /// Ends `targets` (already classified as End): SIGTERM to all, wait `grace` once, SIGKILL to
    /// the ones still alive as themselves. A target that dodged an earlier SIGTERM gets SIGKILL
    /// at once instead (see the module doc). Blocking (it sleeps): run it off the event loop.
    pub fn end_all(&mut self, targets: &[ProcState]) -> Vec<Outcome> {
        let mut outcomes = vec![Outcome::Refused(Refusal::IdentityChanged); targets.len()];
        let mut termed: Vec<(usize, OwnedFd)> = Vec::with_capacity(targets.len());
        for (i, t) in targets.iter().enumerate() {
            let dodged = self.dodgers.contains_key(&t.id);
            match self.open_verified(t) {
                Ok(fd) if dodged => {
                    if pidfd_signal(&fd, libc::SIGKILL) {
                        self.dodgers.remove(&t.id);
                        outcomes[i] = Outcome::Ended { needed_sigkill: true };
                    }
                }
                Ok(fd) => {
                    if pidfd_signal(&fd, libc::SIGTERM) {
                        outcomes[i] = Outcome::Ended { needed_sigkill: false };
                        termed.push((i, fd));
                    }
                }
                Err(r) => outcomes[i] = Outcome::Refused(r),
            }
        }
        if termed.is_empty() {
            return outcomes;
        }
        std::thread::sleep(self.grace);
        for (i, fd) in termed {
            // A pidfd polls readable once its process has exited (pidfd_open(2)).
            if pidfd_exited(&fd) {
                continue;
            }
            // Still alive and still the same process: the pidfd guarantees the second half,
            // the check guards against a name or uid change (an exec) during the grace period.
            outcomes[i] = if self.verify(&targets[i]).is_ok() && pidfd_signal(&fd, libc::SIGKILL) {
                Outcome::Ended { needed_sigkill: true }
            } else if pidfd_exited(&fd) {
                Outcome::Ended { needed_sigkill: false }
            } else {
                self.remember_dodger(targets[i].id, Instant::now());
                Outcome::Survived
            };
        }
        outcomes
    }
}
