//! tracefs, where classic tracepoints (the setuid family, the credential hook's fallback)
//! resolve their ids: found where it is mounted, or mounted by the daemon when it is nowhere.
//! tp_btf and fentry programs do not need it.
use std::{
    ffi::CString,
    io,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
};

use super::EbpfError;

/// Where classic tracepoints are looked up, and where we mount tracefs when nothing is mounted.
pub(super) const TRACEFS: &str = "/sys/kernel/tracing";
/// The older location, under debugfs; aya looks there too.
const DEBUGFS_TRACING: &str = "/sys/kernel/debug/tracing";

/// mount(2) of a tracefs failed.
#[derive(Debug, thiserror::Error)]
#[error("mount -t tracefs on {}: {source}", path.display())]
pub(super) struct MountError {
    path: PathBuf,
    #[source]
    source: io::Error,
}

/// `mount -t tracefs tracefs <target>`, with no flags and no data. The one mount the daemon
/// does, so a plain libc call rather than a crate for it.
pub(super) fn mount_tracefs(target: &Path) -> Result<(), MountError> {
    let fail = |source| MountError { path: target.to_path_buf(), source };
    let c_target = CString::new(target.as_os_str().as_bytes())
        .map_err(|_| fail(io::Error::new(io::ErrorKind::InvalidInput, "the path has a NUL byte")))?;
    let fstype = c"tracefs";
    // SAFETY: every pointer is a NUL-terminated string that outlives the call; data may be null.
    let rc = unsafe { libc::mount(fstype.as_ptr(), c_target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(fail(io::Error::last_os_error()))
    }
}

/// Makes sure a tracefs is mounted (classic tracepoints resolve their ids there), mounting one
/// at /sys/kernel/tracing when neither it nor the debugfs copy is.
pub(super) fn ensure_tracefs() -> Result<(), EbpfError> {
    if Path::new(TRACEFS).join("events").is_dir() || Path::new(DEBUGFS_TRACING).join("events").is_dir() {
        return Ok(());
    }
    let fail = |detail: String| EbpfError::Tracefs { path: TRACEFS.into(), detail };
    mount_tracefs(Path::new(TRACEFS)).map_err(|e| {
        fail(format!(
            "mount -t tracefs failed: {} (the kernel needs CONFIG_TRACING and mounting needs CAP_SYS_ADMIN)",
            e.source
        ))
    })?;
    if !Path::new(TRACEFS).join("events").is_dir() {
        return Err(fail("mounted, but it has no events directory (CONFIG_FTRACE_SYSCALLS?)".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A path the kernel cannot take is refused before the syscall, naming the path.
    #[test]
    fn a_target_with_a_nul_byte_is_refused_before_mounting() {
        let e = mount_tracefs(Path::new("/tmp/guard\0tracefs")).unwrap_err();
        assert_eq!(e.source.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("guard"), "{e}");
    }

    /// As root the wrapper really mounts a tracefs (the fallback's path when none is mounted):
    /// its `events` directory appears at the target, and goes with the unmount.
    #[test]
    #[ignore = "needs root: `cargo xtask test` runs it as root (--ignored)"]
    fn as_root_a_tracefs_is_mounted_where_asked() {
        use guard_test::need::{here, Need};
        if !here(&[Need::Root], guard_test::Facts { bpf_object: crate::ebpf::object_embedded() }) {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        // Root may mount a tracefs on every kernel guard runs on (the fallback relies on it).
        mount_tracefs(dir.path()).unwrap_or_else(|e| panic!("the kernel refused a tracefs mount as root: {e}"));
        let mounted = dir.path().join("events").is_dir();
        let c = CString::new(dir.path().as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) }, 0, "{}", io::Error::last_os_error());
        assert!(mounted, "no events directory in the mounted tracefs");
        assert!(!dir.path().join("events").exists());
    }

    /// The kernel's refusal comes back as its errno, with the path: ENOENT for a missing
    /// directory as root, EPERM without CAP_SYS_ADMIN. Either way nothing is mounted.
    #[test]
    fn a_refused_mount_carries_the_kernels_errno_and_the_path() {
        let target = Path::new("/nonexistent/guard-tracefs-test");
        let e = mount_tracefs(target).unwrap_err();
        assert!(matches!(e.source.raw_os_error(), Some(libc::ENOENT) | Some(libc::EPERM)), "{e}");
        assert_eq!(e.path, target);
        assert!(e.to_string().contains("/nonexistent/guard-tracefs-test"), "{e}");
    }
}
