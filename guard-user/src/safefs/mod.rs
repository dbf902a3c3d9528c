//! Files in the account's home, written so that a link planted there cannot make a root daemon
//! write anywhere the account itself could not (docs/operations.md).
//!
//! Three layers:
//! 1. Every file operation runs with the account's file-system identity ([`FsIdentity::scope`]:
//!    per-thread `setfsuid`/`setfsgid` and an empty per-thread group list), so the kernel's
//!    own permission checks treat the daemon as the account: a symlink or hard link to a file
//!    the account cannot write is refused with EACCES, and new files belong to the account.
//! 2. The final component is opened with `O_NOFOLLOW`; an appended-to file must be a regular
//!    file with one link, owned by the account.
//! 3. Whole-file writes go to a fresh temp file (`O_EXCL`), are fsynced, and renamed over the
//!    target, so a reader sees the old or the new file, never a torn one, and a link at the
//!    target is replaced, not written through.
//!
//! Reads of files the account controls go through [`read_account_file`] (`read.rs`): as the
//! account, regular files only, size-capped, never blocking.
mod identity;
mod read;

pub use identity::FsIdentity;
#[cfg(any(test, feature = "testing"))]
pub use identity::{thread_effective_caps, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH};
pub use read::{read_account_file, Follow, ReadError};
#[cfg(any(test, feature = "testing"))]
pub use read::FileKind;

use std::{
    ffi::OsString,
    fs::{self, File, OpenOptions},
    io::{self, Write},
    os::unix::{
        ffi::OsStringExt,
        fs::{MetadataExt, OpenOptionsExt},
    },
    path::{Path, PathBuf},
};

#[derive(Debug, thiserror::Error)]
pub enum SafeFsError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("{}: refusing to write through it: {why}", path.display())]
    Unsafe { path: PathBuf, why: &'static str },
}

const NO_IDENTITY: &str = "cannot take the account's file-system identity";

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SafeFsError + '_ {
    move |source| SafeFsError::Io { path: path.to_path_buf(), source }
}

/// Replaces `path` with `bytes` atomically (mode 0644): see [`atomic_write_mode`].
pub fn atomic_write(path: &Path, bytes: &[u8], who: FsIdentity) -> Result<(), SafeFsError> {
    atomic_write_mode(path, bytes, 0o644, who)
}

/// [`atomic_write`] without the fsyncs, for files the daemon rewrites from memory every tick
/// (status, metrics): readers still see the old file or the new one, whole; after a power loss
/// the next tick writes it again. Two fsyncs per tick would only cost I/O (and ~10 ms before the
/// first status, measured at start-up).
pub fn atomic_replace(path: &Path, bytes: &[u8], who: FsIdentity) -> Result<(), SafeFsError> {
    write_then_rename(path, bytes, 0o644, who, false)
}

/// Appends one record with a single `write` (O_APPEND), rotating `path` to `path.1` first
/// when it has reached `max_bytes`.
pub fn append_rotating(path: &Path, record: &[u8], max_bytes: u64, who: FsIdentity) -> Result<(), SafeFsError> {
    let scope = who.scope();
    if !scope.is_as_account() {
        return Err(SafeFsError::Unsafe { path: path.into(), why: NO_IDENTITY });
    }
    let mut f = open_append(path, who)?;
    let size = f.metadata().map_err(io_err(path))?.len();
    if size >= max_bytes {
        let mut rotated = path.as_os_str().to_os_string().into_vec();
        rotated.extend_from_slice(b".1");
        let rotated = PathBuf::from(OsString::from_vec(rotated));
        // rename replaces a link planted at .1 rather than writing through it.
        fs::rename(path, &rotated).map_err(io_err(path))?;
        f = open_append(path, who)?;
    }
    f.write_all(record).map_err(io_err(path))
}

fn open_append(path: &Path, who: FsIdentity) -> Result<File, SafeFsError> {
    let f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                SafeFsError::Unsafe { path: path.into(), why: "it is a symbolic link" }
            } else {
                SafeFsError::Io { path: path.into(), source: e }
            }
        })?;
    let meta = f.metadata().map_err(io_err(path))?;
    if !meta.file_type().is_file() {
        return Err(SafeFsError::Unsafe { path: path.into(), why: "it is not a regular file" });
    }
    if meta.nlink() > 1 {
        return Err(SafeFsError::Unsafe { path: path.into(), why: "it has more than one hard link" });
    }
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 && meta.uid() != who.uid {
        return Err(SafeFsError::Unsafe { path: path.into(), why: "it is not owned by the guarded account" });
    }
    Ok(f)
}

#[cfg(test)]
mod read_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> FsIdentity {
        FsIdentity::current()
    }

    #[test]
    fn atomic_write_replaces_a_planted_symlink_instead_of_following_it() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        fs::write(&outside, "precious").unwrap();
        let state = dir.path().join("state.json");
        std::os::unix::fs::symlink(&outside, &state).unwrap();
        atomic_write(&state, b"{}", me()).unwrap();
        assert_eq!(fs::read_to_string(&outside).unwrap(), "precious");
        assert!(!fs::symlink_metadata(&state).unwrap().file_type().is_symlink());
        assert_eq!(fs::read_to_string(&state).unwrap(), "{}");
    }

    #[test]
    fn appending_refuses_symlinks_and_hard_links() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        fs::write(&outside, "precious").unwrap();
        let log = dir.path().join("guard-daemon.log");
        std::os::unix::fs::symlink(&outside, &log).unwrap();
        assert!(matches!(append_rotating(&log, b"x\n", 1 << 20, me()), Err(SafeFsError::Unsafe { .. })));
        fs::remove_file(&log).unwrap();
        fs::hard_link(&outside, &log).unwrap();
        assert!(matches!(append_rotating(&log, b"x\n", 1 << 20, me()), Err(SafeFsError::Unsafe { .. })));
        assert_eq!(fs::read_to_string(&outside).unwrap(), "precious");
    }

    #[test]
    fn the_log_rotates_to_dot_one_once_it_reaches_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("guard-daemon.log");
        for i in 0..5 {
            append_rotating(&log, format!("line{i}\n").as_bytes(), 12, me()).unwrap();
        }
        // 6 bytes per line, limit 12: rotate before the 3rd and the 5th line.
        assert_eq!(fs::read_to_string(&log).unwrap(), "line4\n");
        assert_eq!(fs::read_to_string(dir.path().join("guard-daemon.log.1")).unwrap(), "line2\nline3\n");
    }
}

// --- added for install (the `install` helper's hunk; the rest of this file is the `files` helper's) ---

impl FsIdentity {
    /// Root's own identity: [`FsIdentity::scope`] changes nothing. For root-owned targets
    /// (install's unit files and binary), never for the account's home.
    pub const ROOT: FsIdentity = FsIdentity { uid: 0, gid: 0 };
}

/// The one atomic write (state, status, metrics, install's unit files and binary): a temp file
/// beside `path` (`O_EXCL|O_NOFOLLOW`, as `who`), the final `mode` set on it before the rename
/// (so the umask cannot narrow it and the target never exists with another mode), fsync, rename
/// over `path` (a planted link there is replaced, never followed), fsync the directory.
pub fn atomic_write_mode(path: &Path, bytes: &[u8], mode: u32, who: FsIdentity) -> Result<(), SafeFsError> {
    write_then_rename(path, bytes, mode, who, true)
}

fn write_then_rename(path: &Path, bytes: &[u8], mode: u32, who: FsIdentity, sync: bool) -> Result<(), SafeFsError> {
    use std::os::unix::fs::PermissionsExt;
    let scope = who.scope();
    if !scope.is_as_account() {
        return Err(SafeFsError::Unsafe { path: path.into(), why: NO_IDENTITY });
    }
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut tmp_name: OsString = path.file_name().unwrap_or_default().to_os_string();
    // One fixed name per target, not per pid: a temp file left by a daemon killed mid-write is
    // then reused by the next one instead of piling up.
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    let _ = fs::remove_file(&tmp);
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
            .map_err(io_err(&tmp))?;
        f.write_all(bytes).map_err(io_err(&tmp))?;
        f.set_permissions(fs::Permissions::from_mode(mode)).map_err(io_err(&tmp))?;
        if sync {
            f.sync_all().map_err(io_err(&tmp))?;
        }
        fs::rename(&tmp, path).map_err(io_err(path))?;
        if sync {
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod install_tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn atomic_write_mode_sets_the_mode_the_umask_would_narrow() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("guard-user");
        // 0775: the usual umask 022 would make it 0755 if the mode were left to open(2).
        atomic_write_mode(&bin, b"\x7fELF", 0o775, FsIdentity::ROOT).unwrap();
        assert_eq!(fs::metadata(&bin).unwrap().permissions().mode() & 0o7777, 0o775);
        assert_eq!(fs::read(&bin).unwrap(), b"\x7fELF");
        assert!(!dir.path().join("guard-user.tmp").exists());
    }
}
