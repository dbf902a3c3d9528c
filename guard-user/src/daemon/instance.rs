//! One daemon per (account, home) (docs/operations.md): an exclusive `flock` on a lock file where the
//! account cannot write, so the account can neither hold the lock to keep its guard from
//! starting nor remove it to start a second one.
//!
//! Root's lock lives in `/run/guard-user/` (0700, root's; the shipped unit's
//! `RuntimeDirectory=guard-user` makes it writable under `ProtectSystem=strict`). A daemon run
//! as the account itself (no root: the procfs fallback) locks in `$XDG_RUNTIME_DIR/guard-user/`
//! or `/tmp/guard-user-<uid>/`. The file is named after the uid and a hash of the canonical
//! home, and holds the holder's pid for the second daemon's message.
use std::{
    fs::{self, File, OpenOptions},
    io::{Read, Seek, Write},
    os::{
        fd::AsRawFd,
        unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt},
    },
    path::{Path, PathBuf},
};

#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    /// Exit status 75 (EX_TEMPFAIL): another daemon guards this pair.
    #[error("another guard-user (pid {pid}) already guards {user} in {home}; stop it first (systemctl stop guard-user@{user}.service, or kill {pid})")]
    Held { pid: String, user: String, home: String },
    #[error("the lock directory {}: {why}", path.display())]
    Dir { path: PathBuf, why: String },
    #[error("the lock file {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

/// Held for the daemon's life; the lock goes when the process ends (however it ends).
#[derive(Debug)]
pub struct InstanceLock {
    _file: File,
}

/// FNV-1a, 64 bits: a stable short name for a path (not a security boundary: the directory is).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Where this process keeps its lock files.
pub fn lock_dir() -> PathBuf {
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid == 0 {
        return PathBuf::from("/run/guard-user");
    }
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d).join("guard-user"),
        None => PathBuf::from(format!("/tmp/guard-user-{euid}")),
    }
}

/// The directory must be ours, a real directory, and closed to everyone else.
fn ensure_dir(dir: &Path) -> Result<(), InstanceError> {
    let bad = |why: String| InstanceError::Dir { path: dir.into(), why };
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(bad(e.to_string())),
    }
    let m = fs::symlink_metadata(dir).map_err(|e| bad(e.to_string()))?;
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    if !m.file_type().is_dir() {
        return Err(bad("it is not a directory (a link?); remove it".into()));
    }
    if m.uid() != euid {
        return Err(bad(format!("it belongs to uid {}, not {euid}; remove it", m.uid())));
    }
    if m.mode() & 0o022 != 0 {
        return Err(bad(format!("others may write to it (mode {:o}); chmod 700 it", m.mode() & 0o7777)));
    }
    Ok(())
}

/// The lock file of (`uid`, `home`) in `dir`.
fn lock_path(dir: &Path, uid: u32, home: &Path) -> PathBuf {
    dir.join(format!("{}.lock", instance_name(uid, home)))
}

/// The daemon instance of (`uid`, `home`): its lock's name, also its slots' cgroup's and
/// journal's (`<uid>-<hash of the home>`). `home` as `run` canonicalized it.
pub fn instance_name(uid: u32, home: &Path) -> String {
    format!("{uid}-{:016x}", fnv1a(home.as_os_str().as_encoded_bytes()))
}

/// Where a root daemon keeps its own copy of the status file, beside its lock, and the lock
/// file that names the daemon which wrote it (see [`crate::status::read_trusted`]). `None`
/// unless this process is root: only root's lock directory is out of the account's reach.
/// `home` is canonicalized as `run` does before it takes the lock.
pub fn trusted_status(uid: u32, home: &Path) -> Option<crate::status::TrustedCopy> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let home = home.canonicalize().unwrap_or_else(|_| home.to_path_buf());
    let lock = lock_path(&lock_dir(), uid, &home);
    Some(crate::status::TrustedCopy { status: lock.with_extension("status.json"), lock })
}

/// Takes the lock for (`uid`, `home`) in `dir`, or says who holds it.
pub fn acquire(dir: &Path, uid: u32, user: &str, home: &Path) -> Result<InstanceLock, InstanceError> {
    ensure_dir(dir)?;
    let path = lock_path(dir, uid, home);
    let io = |source| InstanceError::Io { path: path.clone(), source };
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(io)?;
    // SAFETY: flock on an fd we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(io(e));
        }
        let mut text = String::new();
        let _ = file.read_to_string(&mut text);
        let pid = text.lines().next().unwrap_or("?").trim().to_string();
        return Err(InstanceError::Held { pid, user: user.into(), home: home.display().to_string() });
    }
    file.set_len(0).map_err(io)?;
    file.rewind().map_err(io)?;
    writeln!(file, "{}\n{}", std::process::id(), home.display()).map_err(io)?;
    Ok(InstanceLock { _file: file })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_for_the_same_pair_names_the_holder_and_another_home_is_free() {
        let dir = tempfile::tempdir().unwrap();
        let locks = dir.path().join("locks");
        let first = acquire(&locks, 1000, "alice", Path::new("/home/alice")).unwrap();
        // flock locks belong to the open file description: a second open in this process conflicts too.
        match acquire(&locks, 1000, "alice", Path::new("/home/alice")) {
            Err(InstanceError::Held { pid, .. }) => assert_eq!(pid, std::process::id().to_string()),
            other => panic!("expected Held, got {other:?}"),
        }
        acquire(&locks, 1000, "alice", Path::new("/tmp/other-home")).unwrap();
        drop(first);
        acquire(&locks, 1000, "alice", Path::new("/home/alice")).unwrap();
    }

    #[test]
    fn a_lock_directory_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(acquire(&open, 1, "a", Path::new("/h")), Err(InstanceError::Dir { .. })));
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path(), &link).unwrap();
        assert!(matches!(acquire(&link, 1, "a", Path::new("/h")), Err(InstanceError::Dir { .. })));
    }
}
