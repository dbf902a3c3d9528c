//! Releasing what a daemon left frozen: every process in an instance's frozen cgroup goes back
//! where the journal says it came from (else where its parent lives, else the top), the cgroup is
//! thawed first so nothing waits however the moves go, and the emptied cgroups are removed.
//!
//! Run by the daemon at its start (for its own instance, before it holds anything), by its
//! releaser process when the daemon ends however it ends, and by the unit's `ExecStartPre=` and
//! `ExecStopPost=` and `uninstall` for every instance no daemon holds (`guard-user
//! __slots-release`). Each step is idempotent, so two of them at once do no harm.
use std::{fs, os::unix::fs::MetadataExt, path::Path};

use super::{journal, Hierarchy, Instance, TOP};

/// Releases everything `instance` holds. Returns how many processes were put back.
pub fn release_instance(instance: &Instance, lock_dir: &Path) -> usize {
    let jpath = journal::path(lock_dir, &instance.name);
    let entries = journal::read(&jpath);
    let _ = instance.thaw();
    let mut n = 0;
    for pid in instance.held_pids() {
        let start = super::start_of(pid);
        let origin = entries.iter().find(|e| e.pid == pid && Some(e.start) == start).map(|e| e.origin.as_str());
        if instance.hierarchy.put_back(pid, origin).is_ok() {
            n += 1;
        }
    }
    journal::remove(&jpath);
    n
}

/// Every instance under the hierarchy's `guard-user/` whose daemon is gone (no lock held on
/// `<lock_dir>/<instance>.lock`): released and removed. Returns (instance, processes put back).
pub fn sweep(hierarchy: &Hierarchy, lock_dir: &Path) -> Vec<(String, usize)> {
    let Ok(dir) = fs::read_dir(hierarchy.mount.join(TOP)) else { return Vec::new() };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !entry.file_type().is_ok_and(|t| t.is_dir()) || lock_held(&lock_dir.join(format!("{name}.lock"))) {
            continue;
        }
        let instance = Instance::new(hierarchy.clone(), name.clone());
        let n = release_instance(&instance, lock_dir);
        instance.remove();
        out.push((name, n));
    }
    out
}

/// Whether a daemon holds the lock file at `path`: its `flock` appears in `/proc/locks` (read,
/// never taken: taking it even for a moment could make a daemon starting then exit as a second
/// one).
pub fn lock_held(path: &Path) -> bool {
    let Ok(meta) = fs::metadata(path) else { return false };
    let dev = meta.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let want = format!("{major:02x}:{minor:02x}:{}", meta.ino());
    fs::read_to_string("/proc/locks").unwrap_or_default().lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // `1: FLOCK  ADVISORY  WRITE 1234 00:19:567 0 EOF` (a blocked waiter has `->` first).
        f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&want.as_str())
    })
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn a_held_flock_is_seen_without_taking_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.lock");
        let f = fs::File::create(&p).unwrap();
        assert!(!lock_held(&p));
        // SAFETY: flock on an fd we own.
        assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
        assert!(lock_held(&p));
        drop(f);
        assert!(!lock_held(&p));
        assert!(!lock_held(&dir.path().join("missing.lock")));
    }
}
