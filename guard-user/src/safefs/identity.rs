//! Running file operations with the account's file-system identity, on one thread.
//!
//! Linux checks file access against the *file-system* uid and gid (`setfsuid(2)`), which are
//! per thread, so one thread can act as the account while the rest of the daemon stays root.
//!
//! Capabilities: capabilities(7), "Effect of user ID changes on capabilities": when the
//! file-system uid changes from 0 to non-zero, the kernel clears CAP_CHOWN, CAP_DAC_OVERRIDE,
//! CAP_DAC_READ_SEARCH, CAP_FOWNER, CAP_FSETID, CAP_LINUX_IMMUTABLE, CAP_MAC_OVERRIDE and
//! CAP_MKNOD from the thread's *effective* set (and raises them again from the permitted set when
//! it changes back to 0). So inside a scope, root's CAP_DAC_READ_SEARCH — which the shipped unit
//! grants — does not let a link planted by the account reach a file the account cannot read.
//! That fix-up does not happen under the `SECBIT_NO_SETUID_FIXUP` securebit, so the scope does not
//! rely on it: it reads the thread's effective set after the switch and clears any of those
//! capabilities still there, restoring them when it ends. `root_read_is_refused_even_with_cap_dac_read_search`
//! (in `guard-user/tests/hostile_files.rs`) proves it as root.
//!
//! The supplementary groups are emptied for the scope rather than set to the account's: root
//! then reads with at most the account's rights (its own uid and primary gid), never more.
//!
//! A thread spawned while a scope is active inherits the account's identity (clone(2) copies
//! the creating thread's credentials), so nothing inside a scope spawns threads.

/// Whose file-system identity file operations use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsIdentity {
    pub uid: u32,
    pub gid: u32,
}

/// Restores the previous file-system identity when dropped (also on panic).
pub struct FsScope {
    /// Whether this scope switched anything (a root daemon acting for a non-root account).
    active: bool,
    /// Whether file access on this thread is now checked as `who` (true when no switch was
    /// needed because the process already is `who`, or cannot be more than itself).
    as_account: bool,
    groups: Vec<libc::gid_t>,
    /// Effective capabilities this scope cleared itself (the fix-up did not): restored on drop.
    cleared_caps: Option<[CapData; 2]>,
}

/// Capability numbers from `<linux/capability.h>` (the libc crate does not define them).
pub const CAP_CHOWN: u32 = 0;
pub const CAP_DAC_OVERRIDE: u32 = 1;
pub const CAP_DAC_READ_SEARCH: u32 = 2;
pub const CAP_FOWNER: u32 = 3;
pub const CAP_FSETID: u32 = 4;
pub const CAP_LINUX_IMMUTABLE: u32 = 9;
pub const CAP_MKNOD: u32 = 27;
pub const CAP_MAC_OVERRIDE: u32 = 32;

/// The capabilities the kernel's fsuid fix-up clears (capabilities(7)), as capget's two words.
const FS_CAPS: [u32; 2] = [
    1 << CAP_CHOWN
        | 1 << CAP_DAC_OVERRIDE
        | 1 << CAP_DAC_READ_SEARCH
        | 1 << CAP_FOWNER
        | 1 << CAP_FSETID
        | 1 << CAP_LINUX_IMMUTABLE
        | 1 << CAP_MKNOD,
    1 << (CAP_MAC_OVERRIDE - 32),
];

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_VERSION_3: u32 = 0x2008_0522;

/// This thread's capability sets (pid 0 = the calling thread).
fn capget() -> Option<[CapData; 2]> {
    let mut hdr = CapHeader { version: CAP_VERSION_3, pid: 0 };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget writes two CapData for version 3, both owned here.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut hdr as *mut CapHeader, data.as_mut_ptr()) };
    (rc == 0).then_some(data)
}

fn capset(data: &[CapData; 2]) -> bool {
    let mut hdr = CapHeader { version: CAP_VERSION_3, pid: 0 };
    // SAFETY: capset reads two CapData for version 3; it changes only the calling thread.
    unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()) == 0 }
}

/// The calling thread's file-system uid (`setfsuid(-1)` changes nothing and returns it).
fn current_fsuid() -> u32 {
    // SAFETY: an invalid id is rejected by the kernel, which returns the current one.
    unsafe { libc::syscall(libc::SYS_setfsuid, u32::MAX as usize) as u32 }
}

impl FsIdentity {
    /// The identity this process has (its effective uid and gid).
    #[cfg(any(test, feature = "testing"))]
    pub fn current() -> FsIdentity {
        // SAFETY: geteuid/getegid cannot fail.
        unsafe { FsIdentity { uid: libc::geteuid(), gid: libc::getegid() } }
    }

    /// Runs file operations as the account until the returned scope drops. A no-op when the
    /// daemon is not root (it can then only reach what its own uid can) or the account is root.
    pub fn scope(&self) -> FsScope {
        // SAFETY: geteuid cannot fail.
        let euid = unsafe { libc::geteuid() };
        if euid != 0 || self.uid == 0 {
            // A non-root process acting for another account reads with its own, lesser rights.
            return FsScope { active: false, as_account: true, groups: Vec::new(), cleared_caps: None };
        }
        // SAFETY: plain syscalls on the calling thread's credentials. The raw syscalls (not
        // glibc's wrappers) are used because glibc broadcasts setgroups to every thread.
        let groups = unsafe {
            let n = libc::getgroups(0, std::ptr::null_mut());
            let mut groups = vec![0 as libc::gid_t; n.max(0) as usize];
            if n > 0 {
                libc::getgroups(n, groups.as_mut_ptr());
            }
            libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>());
            libc::syscall(libc::SYS_setfsgid, self.gid as usize);
            libc::syscall(libc::SYS_setfsuid, self.uid as usize);
            groups
        };
        let mut scope = FsScope { active: true, as_account: current_fsuid() == self.uid, groups, cleared_caps: None };
        // Without the fix-up (SECBIT_NO_SETUID_FIXUP), clear the file capabilities ourselves.
        match capget() {
            Some(caps) if caps[0].effective & FS_CAPS[0] != 0 || caps[1].effective & FS_CAPS[1] != 0 => {
                let mut lowered = caps;
                lowered[0].effective &= !FS_CAPS[0];
                lowered[1].effective &= !FS_CAPS[1];
                if capset(&lowered) {
                    scope.cleared_caps = Some(caps);
                } else {
                    scope.as_account = false;
                }
            }
            Some(_) => {}
            None => scope.as_account = false,
        }
        scope
    }
}

impl FsScope {
    /// Whether file access on this thread is checked with (at most) the account's rights. False
    /// only when a switch failed; a reader must then refuse rather than read as root.
    pub fn is_as_account(&self) -> bool {
        self.as_account
    }
}

impl Drop for FsScope {
    fn drop(&mut self) {
        if self.active {
            // SAFETY: see FsIdentity::scope.
            unsafe {
                libc::syscall(libc::SYS_setfsuid, 0usize);
                libc::syscall(libc::SYS_setfsgid, 0usize);
                libc::syscall(libc::SYS_setgroups, self.groups.len(), self.groups.as_ptr());
            }
            if let Some(caps) = &self.cleared_caps {
                capset(caps);
            }
        }
    }
}

impl From<&crate::account::Account> for FsIdentity {
    fn from(a: &crate::account::Account) -> FsIdentity {
        FsIdentity { uid: a.uid, gid: a.gid }
    }
}

/// This thread's effective capability bits (for tests that prove the scope drops them).
#[cfg(any(test, feature = "testing"))]
pub fn thread_effective_caps() -> u64 {
    capget().map(|c| c[0].effective as u64 | (c[1].effective as u64) << 32).unwrap_or(0)
}
