//! The processes working in a directory (`guard-user holders DIR`, docs/operations.md): those of
//! one account whose working directory is DIR or below it, as a checkout about to be removed
//! would have them, and ending them the checked way (SIGTERM, up to 10 s, SIGKILL, each through
//! a pidfd after the identity check).
use std::{
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::{
    enforcer::{Enforcer, Outcome},
    event::ProcState,
    procfs,
};

/// One process working in the directory.
#[derive(Clone, Debug, PartialEq)]
pub struct Holder {
    pub proc: ProcState,
    /// Its working directory (under the directory asked about).
    pub cwd: PathBuf,
    /// Its executable, when readable (`/proc/PID/exe`).
    pub program: Option<PathBuf>,
    /// User + system CPU time, seconds.
    pub cpu_secs: f64,
    /// Seconds since it started.
    pub age_secs: u64,
}

/// Whether `cwd` is `dir` or below it, compared by whole components (`/a/repo2` is not under
/// `/a/repo`). A working directory removed meanwhile (` (deleted)`) is not under anything.
pub fn is_within(cwd: &Path, dir: &Path) -> bool {
    !cwd.as_os_str().as_bytes().ends_with(b" (deleted)") && cwd.starts_with(dir)
}

fn read_link(pid: u32, leaf: &str) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/{leaf}")).ok()
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

/// The live processes of `uid` working in `dir` (already canonical), sorted by pid.
pub fn find(dir: &Path, uid: u32) -> std::io::Result<Vec<Holder>> {
    let mut out = Vec::new();
    for p in procfs::snapshot()?.into_iter().filter(|p| p.euid == uid && p.id.pid != std::process::id()) {
        let Some(cwd) = read_link(p.id.pid, "cwd") else { continue };
        if !is_within(&cwd, dir) {
            continue;
        }
        let Some((cpu_secs, age_secs)) = cpu_and_age(&p) else { continue };
        out.push(Holder { proc: p, cwd, program: read_link(p.id.pid, "exe"), cpu_secs, age_secs });
    }
    out.sort_by_key(|h| h.proc.id.pid);
    Ok(out)
}

/// What became of one holder `--stop` was asked to end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// Gone after SIGTERM.
    Termed,
    /// Still itself after the wait: sent SIGKILL.
    Killed,
    /// Left the directory before the SIGTERM: left alone.
    MovedOut,
    /// Not signalled (gone, or its identity changed, or not one we may signal), or alive under
    /// another identity after SIGTERM.
    Left,
}

/// Ends `holders` that still work in `dir`: SIGTERM to each (pidfd, identity check), up to
/// `wait` for them to leave, SIGKILL to those still themselves. Blocking (a command, not the
/// daemon).
pub fn stop(holders: &[Holder], dir: &Path, enforcer: &Enforcer, wait: Duration) -> Vec<Stopped> {
    let mut out = vec![Stopped::Left; holders.len()];
    let mut termed = Vec::new();
    for (i, h) in holders.iter().enumerate() {
        if !read_link(h.proc.id.pid, "cwd").is_some_and(|c| is_within(&c, dir)) {
            out[i] = Stopped::MovedOut;
            continue;
        }
        if enforcer.term_all(std::slice::from_ref(&h.proc)) == [Outcome::Termed] {
            termed.push(i);
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
    fn a_directory_holds_itself_and_what_is_below_it_by_whole_components() {
        let dir = Path::new("/work/repo");
        assert!(is_within(Path::new("/work/repo"), dir));
        assert!(is_within(Path::new("/work/repo/src/x"), dir));
        assert!(!is_within(Path::new("/work/repo2"), dir));
        assert!(!is_within(Path::new("/work"), dir));
        assert!(!is_within(Path::new("/work/repo (deleted)"), dir));
    }

    #[test]
    fn this_process_is_found_in_its_own_working_directory_only_when_asked_about_another_account() {
        let me = crate::procfs::read_process(std::process::id(), &mut Vec::new()).unwrap();
        let cwd = std::env::current_dir().unwrap().canonicalize().unwrap();
        // The command leaves itself out: it is not what holds the directory.
        assert!(find(&cwd, me.euid).unwrap().iter().all(|h| h.proc.id != me.id));
        let (cpu, _) = cpu_and_age(&me).unwrap();
        assert!(cpu >= 0.0);
    }
}
