//! Reading a file the account controls (its config, state file, status file), from a root
//! daemon or a root command, without reading anything the account could not and without
//! blocking (docs/operations.md, docs/architecture.md).
//!
//! 1. Everything runs inside the account's [`FsIdentity::scope`], so the kernel's own checks —
//!    file modes, directory search rights, `/proc/<pid>/fd` access — are the account's. Root's
//!    CAP_DAC_READ_SEARCH is not in the effective set there (see `identity.rs`).
//! 2. The path is first opened with `O_PATH` (and `O_NOFOLLOW` when links are not followed),
//!    which opens nothing: no FIFO reader joins a pipe, no device driver runs, no tty is
//!    acquired. `fstat` on that handle names what it is; only a regular file goes on.
//! 3. That very inode is then opened for reading through `/proc/self/fd/<n>` (so no rename between
//!    the two steps can swap it) with `O_RDONLY|O_NONBLOCK|O_NOCTTY|O_CLOEXEC`; the permission
//!    check happens here, as the account. Without /proc mounted, the path is opened again the
//!    same way and must be the same inode.
//! 4. Its size must be within the cap, and at most `cap + 1` bytes are read, so a file that grew
//!    past the cap after the check (or a /proc file that reports size 0) is refused too.
//!
//! The errors are what the account's own `open` would have told it — "missing" and "permission
//! denied" are the kernel's answers to the account, not to root — so a link never tells the
//! account whether a path it cannot reach exists.
use std::{
    ffi::CString,
    fmt,
    fs::File,
    io::{self, Read},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::{ffi::OsStrExt, fs::MetadataExt},
    },
    path::{Path, PathBuf},
};

use super::FsIdentity;

/// Whether the last component of the path may be a symbolic link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Follow {
    /// The config: usually a link into a checkout; followed, as the account.
    Links,
    /// State and status: files the daemon itself creates, never links.
    NoLinks,
}

/// What a path is when it is not a regular file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    Directory,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
    Symlink,
    Unknown,
}

impl FileKind {
    fn of(mode: u32) -> Option<FileKind> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => return None,
            libc::S_IFDIR => FileKind::Directory,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDevice,
            libc::S_IFBLK => FileKind::BlockDevice,
            libc::S_IFLNK => FileKind::Symlink,
            _ => FileKind::Unknown,
        })
    }

    /// The one-word token the log uses (`kind=fifo`).
    pub fn token(self) -> &'static str {
        match self {
            FileKind::Directory => "directory",
            FileKind::Fifo => "fifo",
            FileKind::Socket => "socket",
            FileKind::CharDevice => "char_device",
            FileKind::BlockDevice => "block_device",
            FileKind::Symlink => "symlink",
            FileKind::Unknown => "unknown",
        }
    }
}

impl fmt::Display for FileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FileKind::Directory => "a directory",
            FileKind::Fifo => "a FIFO (named pipe)",
            FileKind::Socket => "a socket",
            FileKind::CharDevice => "a character device",
            FileKind::BlockDevice => "a block device",
            FileKind::Symlink => "a symbolic link, which is not followed here",
            FileKind::Unknown => "not a regular file",
        })
    }
}

/// Why an account file could not be read. Every variant names the file; [`ReadError::fix`]
/// says what to do; [`ReadError::log_fields`] gives the `reason=…` of its log line.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{}: no such file", shown(path))]
    NotFound { path: PathBuf },
    #[error("{}: permission denied to uid {uid}", shown(path))]
    Denied { path: PathBuf, uid: u32 },
    #[error("{}: it is {kind}", shown(path))]
    NotRegular { path: PathBuf, kind: FileKind },
    #[error("{}: larger than the {max} bytes allowed", shown(path))]
    TooLarge { path: PathBuf, max: u64 },
    #[error("{}: it was replaced while being opened", shown(path))]
    Changed { path: PathBuf },
    #[error("{}: cannot take uid {uid}'s file-system identity to read it", shown(path))]
    Identity { path: PathBuf, uid: u32 },
    #[error("{}: {source}", shown(path))]
    Io { path: PathBuf, source: io::Error },
}

fn shown(path: &Path) -> crate::escape::Escaped<'_> {
    crate::escape::Escaped(path.as_os_str().as_bytes())
}

impl ReadError {
    pub fn path(&self) -> &Path {
        match self {
            ReadError::NotFound { path }
            | ReadError::Denied { path, .. }
            | ReadError::NotRegular { path, .. }
            | ReadError::TooLarge { path, .. }
            | ReadError::Changed { path }
            | ReadError::Identity { path, .. }
            | ReadError::Io { path, .. } => path,
        }
    }

    /// The log line's fields after `path=`: `reason=<token>` and, where it helps, one more key
    /// (`kind=fifo`, `max_bytes=1048576`, `error="…"`).
    pub fn log_fields(&self) -> String {
        match self {
            ReadError::NotFound { .. } => "reason=missing".into(),
            ReadError::Denied { .. } => "reason=permission_denied".into(),
            ReadError::NotRegular { kind, .. } => format!("reason=not_regular kind={}", kind.token()),
            ReadError::TooLarge { max, .. } => format!("reason=too_large max_bytes={max}"),
            ReadError::Changed { .. } => "reason=replaced_while_opening".into(),
            ReadError::Identity { .. } => "reason=identity".into(),
            ReadError::Io { source, .. } => {
                format!("reason=io error={}", crate::escape::log_value(source.to_string().as_bytes()))
            }
        }
    }

    /// What the operator (or the account) does about it.
    pub fn fix(&self) -> &'static str {
        match self {
            ReadError::NotFound { .. } => "create the file, or point to an existing one",
            ReadError::Denied { .. } => {
                "make the file (and every directory on its path) readable by the guarded account; \
                 root reads it with the account's rights only"
            }
            ReadError::NotRegular { kind: FileKind::Symlink, .. } => {
                "remove the link; the guard writes this file itself and never follows a link here"
            }
            ReadError::NotRegular { .. } => "replace it with a regular file",
            ReadError::TooLarge { .. } => "shrink the file below the limit",
            ReadError::Changed { .. } => "stop replacing the file; the next read tries again",
            ReadError::Identity { .. } => "run the guard as root (it needs setfsuid) or as the account itself",
            ReadError::Io { .. } => "check the file system holding it",
        }
    }
}

fn open_at(path: &CString, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: `path` is a valid C string; the returned fd is owned by the OwnedFd.
    let fd = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        Err(io::Error::last_os_error())
    } else {
        // SAFETY: `fd` was just returned by open and is not owned elsewhere.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

fn fstat(fd: &OwnedFd) -> io::Result<libc::stat> {
    // SAFETY: fstat fills one stat we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// Reads `path` as the account, refusing anything but a regular file of at most `cap` bytes.
/// Never blocks on a FIFO, device or socket: those are errors that name what they are, and
/// nothing is read from them.
pub fn read_account_file(path: &Path, who: FsIdentity, cap: u64, follow: Follow) -> Result<Vec<u8>, ReadError> {
    let p = || path.to_path_buf();
    let io = |source: io::Error| match source.raw_os_error() {
        Some(libc::ENOENT | libc::ENOTDIR) => ReadError::NotFound { path: p() },
        Some(libc::EACCES | libc::EPERM) => ReadError::Denied { path: p(), uid: who.uid },
        Some(libc::ENXIO) => ReadError::NotRegular { path: p(), kind: FileKind::Unknown },
        _ => ReadError::Io { path: p(), source },
    };
    let Ok(cpath) = CString::new(path.as_os_str().as_bytes()) else {
        return Err(ReadError::NotFound { path: p() }); // a NUL cannot be in a path
    };
    let scope = who.scope();
    if !scope.is_as_account() {
        return Err(ReadError::Identity { path: p(), uid: who.uid });
    }
    let nofollow = if follow == Follow::NoLinks { libc::O_NOFOLLOW } else { 0 };
    let handle = open_at(&cpath, libc::O_PATH | nofollow).map_err(io)?;
    let st = fstat(&handle).map_err(io)?;
    if let Some(kind) = FileKind::of(st.st_mode) {
        return Err(ReadError::NotRegular { path: p(), kind });
    }
    let read_flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY;
    let magic = CString::new(format!("/proc/self/fd/{}", handle.as_raw_fd())).expect("no NUL in a number");
    let fd = match open_at(&magic, read_flags) {
        Ok(fd) => fd,
        // No /proc: open the path itself and make sure it is still the inode checked above.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            let fd = open_at(&cpath, read_flags | nofollow).map_err(io)?;
            let again = fstat(&fd).map_err(io)?;
            if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) {
                return Err(ReadError::Changed { path: p() });
            }
            fd
        }
        Err(e) => return Err(io(e)),
    };
    drop(handle);
    let file = File::from(fd);
    let meta = file.metadata().map_err(io)?;
    if !meta.file_type().is_file() || meta.ino() != st.st_ino {
        return Err(ReadError::Changed { path: p() });
    }
    // The size only now, after the account's permission check: a file it cannot read is
    // "permission denied" whatever its size.
    if meta.len() > cap {
        return Err(ReadError::TooLarge { path: p(), max: cap });
    }
    let mut buf = Vec::with_capacity(meta.len() as usize);
    file.take(cap.saturating_add(1)).read_to_end(&mut buf).map_err(io)?;
    if buf.len() as u64 > cap {
        return Err(ReadError::TooLarge { path: p(), max: cap });
    }
    drop(scope);
    Ok(buf)
}
