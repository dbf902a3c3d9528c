//! What holds a path (`guard-user holders PATH`, docs/operations.md): every process that holds
//! PATH, or anything below it when PATH is a directory, in any of the ways `lsof +D` sees (its
//! working directory, its root directory, its executable, an open fd, a mapped file), and
//! ending one account's holders the checked way (SIGTERM, up to 10 s, SIGKILL, each through a
//! pidfd after the identity check).
//!
//! Where `lsof +D` stats every file of the tree and then looks for those in every process,
//! this looks at what each process holds and asks only of that whether it is below PATH, by
//! device and inode (`within`): the cost follows the processes and what they hold, not the
//! size of the tree, and no path text (a symlink, a bind mount, a name ending ` (deleted)`)
//! can hide a holder or invent one.
//!
//! # Layout
//! - `within`: PATH ([`Target`]) and whether a held object is PATH or below it ([`Within`]);
//! - `process`: reading one process's every way of holding, within bounds ([`Examined`]);
//! - `pool`: the worker threads and their progress watch, so a `/proc` read that blocks
//!   leaves one process unread (and says so) instead of hanging the command;
//! - `unix`: the files unix sockets are bound to (the kernel's socket diagnostics);
//! - `sys`: the syscalls (statx, O_PATH opens, getdents64, kcmp, PROCMAP_QUERY).
use std::{
    io,
    sync::Arc,
    time::{Duration, Instant},
};

use crate::{domain::Outcome, enforcer::Enforcer, event::ProcState, procfs};

mod pool;
mod process;
mod sys;
mod unix;
mod within;

pub use pool::Bounds;
pub use process::{Examined, Holding};
#[cfg(any(test, feature = "testing"))]
pub use process::Ways;
pub use within::{Target, Within};

/// One process that holds PATH.
#[derive(Clone, Debug, PartialEq)]
pub struct Holder {
    pub proc: ProcState,
    pub holding: Holding,
}

/// One process that could not be read completely: it may hold PATH.
#[derive(Clone, Debug, PartialEq)]
pub struct Unread {
    pub proc: ProcState,
    pub why: String,
}

/// What one look at the processes found.
#[derive(Debug, Default)]
pub struct Report {
    /// Sorted by pid.
    pub holders: Vec<Holder>,
    /// Sorted by pid.
    pub unread: Vec<Unread>,
    /// Processes the caller may not read (other accounts', without root): not looked at.
    pub forbidden: Vec<ProcState>,
    /// Processes read in all.
    pub read: usize,
}

/// How much one run may take.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub bounds: Bounds,
    /// Fds and mapping lines read in all (about a µs each).
    pub budget: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        let workers = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).clamp(1, 4);
        Limits {
            bounds: Bounds { workers, stall: Duration::from_secs(5), max_abandoned: 16 },
            budget: crate::daemon::fault::number("holders_budget").unwrap_or(8_000_000),
        }
    }
}

/// Reads every process in scope (`uid`: that account's; `None`: every one the caller can
/// read), this one left out.
pub fn find(within: &Arc<Within>, uid: Option<u32>, limits: Limits) -> io::Result<Report> {
    let me = std::process::id();
    let procs: Vec<ProcState> =
        procfs::snapshot()?.into_iter().filter(|p| p.id.pid != me && uid.is_none_or(|u| p.euid == u)).collect();
    let mut report = Report::default();
    for (proc, outcome) in examine_all(within, procs, limits) {
        let why = match outcome {
            pool::Outcome::Done(Examined::Holds(h)) => {
                report.holders.push(Holder { proc, holding: *h });
                report.read += 1;
                continue;
            }
            pool::Outcome::Done(Examined::Clear) => {
                report.read += 1;
                continue;
            }
            pool::Outcome::Done(Examined::Gone) => continue,
            pool::Outcome::Done(Examined::Forbidden) => {
                report.forbidden.push(proc);
                continue;
            }
            pool::Outcome::Done(Examined::Incomplete(why)) => why,
            pool::Outcome::Stalled => {
                format!("its /proc files stopped answering for {} s", limits.bounds.stall.as_secs())
            }
            pool::Outcome::NotStarted => {
                format!("not read: {} reads of other processes had blocked", limits.bounds.max_abandoned)
            }
        };
        report.unread.push(Unread { proc, why });
    }
    report.holders.sort_by_key(|h| h.proc.id.pid);
    report.unread.sort_by_key(|u| u.proc.id.pid);
    Ok(report)
}

fn examine_all(
    within: &Arc<Within>,
    procs: Vec<ProcState>,
    limits: Limits,
) -> Vec<(ProcState, pool::Outcome<Examined>)> {
    let budget = Arc::new(process::Budget::new(limits.budget));
    let w = within.clone();
    let work = Arc::new(move |p: &ProcState, progress: &pool::Progress| process::examine(&w, p, &budget, progress));
    let outcomes = pool::run(procs.clone(), limits.bounds, work);
    procs.into_iter().zip(outcomes).collect()
}

/// CPU seconds and age of `p`, from `/proc/PID/stat`, if it is still itself.
pub fn cpu_and_age(p: &ProcState) -> Option<(f64, u64)> {
    let stat = std::fs::read(format!("/proc/{}/stat", p.id.pid)).ok()?;
    if procfs::parse_stat(&stat)?.start_ticks != p.id.start_ticks {
        return None;
    }
    let hz = crate::event::clock_ticks_per_sec() as f64;
    let cpu = procfs::parse_stat_cpu(&stat)? as f64 / hz;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?.as_secs_f64();
    let age = (now - procfs::boot_unix() - p.id.start_ticks as f64 / hz).max(0.0) as u64;
    Some((cpu, age))
}

/// What became of one holder `--stop` was asked to end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// Gone after SIGTERM.
    Termed,
    /// Still itself after the wait: sent SIGKILL.
    Killed,
    /// No longer held PATH when read again right before the SIGTERM: left alone.
    MovedOut,
    /// Not signalled (gone, its identity changed, another account's, or it could not be read
    /// again), or alive under another identity after SIGTERM.
    Left,
}

/// Ends `holders` that still hold PATH: each is read again (bounded, as [`find`] reads), then
/// SIGTERM to those that still hold it (pidfd, identity check, which also refuses any process
/// not of the enforcer's account), up to `wait` for them to exit, SIGKILL to those still
/// themselves. Blocking (a command, not the daemon).
pub fn stop(
    within: &Arc<Within>,
    holders: &[Holder],
    enforcer: &Enforcer,
    wait: Duration,
    limits: Limits,
) -> Vec<Stopped> {
    let mut out = vec![Stopped::Left; holders.len()];
    let again = examine_all(within, holders.iter().map(|h| h.proc).collect(), limits);
    let mut termed = Vec::new();
    for (i, (proc, outcome)) in again.iter().enumerate() {
        match outcome {
            pool::Outcome::Done(Examined::Holds(_)) => {
                // The identity check refuses a process no longer itself or of another account.
                let sent = enforcer.term_all(std::slice::from_ref(proc));
                if sent == [Outcome::Termed] {
                    termed.push(i);
                }
            }
            pool::Outcome::Done(Examined::Clear) => out[i] = Stopped::MovedOut,
            _ => {}
        }
    }
    let alive = |i: usize| {
        let mut buf = Vec::new();
        procfs::read_process(holders[i].proc.id.pid, &mut buf).is_some_and(|p| p.id == holders[i].proc.id)
    };
    let until = Instant::now() + wait;
    while termed.iter().any(|&i| alive(i)) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    for i in termed {
        out[i] = if !alive(i) {
            Stopped::Termed
        } else if matches!(enforcer.kill_all(std::slice::from_ref(&holders[i].proc))[..], [Outcome::Ended { .. }]) {
            Stopped::Killed
        } else {
            Stopped::Left
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_never_its_own_holder_and_a_child_in_the_directory_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let within = Arc::new(Within::new(Target::open(dir.path()).unwrap()));
        let me = crate::procfs::read_process(std::process::id(), &mut Vec::new()).unwrap();
        // This process holds the directory too (Target keeps it open), and is left out.
        // A name of its own: other tests of this binary end piles of `sleep`.
        let bin = tempfile::tempdir().unwrap();
        let exe = bin.path().join("gholdcwd");
        // A link, not a copy: a copy still open for writing in this process when another test's
        // child forks cannot be exec'd (ETXTBSY). The kernel names the process after the link.
        std::os::unix::fs::symlink("/bin/sleep", &exe).unwrap();
        let mut child = std::process::Command::new(&exe).arg("30").current_dir(dir.path()).spawn().unwrap();
        let want = [Ways { cwd: true, ..Ways::default() }];
        let mut found = Vec::new();
        // Until the child has exec'd: before, it also holds this process's fds (the O_PATH one
        // on the directory among them, close-on-exec).
        let until = Instant::now() + Duration::from_secs(60);
        while found != want && Instant::now() < until {
            let r = find(&within, Some(me.euid), Limits::default()).unwrap();
            assert!(r.holders.iter().all(|h| h.proc.id != me.id), "{r:?}");
            found = r.holders.iter().filter(|h| h.proc.id.pid == child.id()).map(|h| h.holding.ways).collect();
            std::thread::sleep(Duration::from_millis(10));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(found, want);
    }
}
