//! The cgroup v2 freezer under heavy-command slots (docs/architecture.md, "Slots"): a waiting
//! command is moved into a frozen cgroup of guard's own and moved back to where it was when its
//! turn comes. A frozen task is neither stopped nor signalled (`cgroup_enter_frozen`, in the
//! signal-delivery path), so no parent sees a "Stopped" job or a SIGCHLD, which SIGSTOP would
//! give.
//!
//! # Where
//! `<cgroup2 mount>/guard-user/<instance>/wait`, `<instance>` being the daemon's lock name
//! (`<uid>-<hash of the home>`): one frozen cgroup per daemon, whatever the account runs, so the
//! account cannot make the daemon create cgroups. It sits at the top of the hierarchy, outside
//! every unit and every subtree delegated to the account: moving a process out of it needs write
//! access to the root cgroup's `cgroup.procs` (the kernel's delegation containment), which only
//! root has, so the account can neither escape the queue nor move another process in.
//!
//! # Back where it was
//! Each held process's cgroup (`/proc/PID/cgroup`) is written to a journal in root's runtime
//! directory before it is moved ([`journal`]), so whoever releases it (the daemon, its releaser
//! process when the daemon dies, the unit's `ExecStopPost=`, the next start) puts it back. A
//! process whose cgroup root cannot write to (one delegated to the account, under a user
//! manager, without `CAP_DAC_OVERRIDE`) is never held: it could not be put back. One whose
//! cgroup went away meanwhile goes to its parent's cgroup, else to the top of the hierarchy.
//!
//! # Identity
//! A cgroup takes pids, not pidfds. A pidfd is opened first and the process's start time and
//! effective uid checked; after the move the pidfd says whether the process lived throughout (if
//! it did, the pid was its own when it was written). A process that died in that window may have
//! had its pid reused: a process found in the frozen cgroup that is not one the daemon holds is
//! put back into its parent's cgroup at once ([`Instance::release_strangers`]).
use std::{
    fs,
    io::{self, Write},
    os::unix::fs::{DirBuilderExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

pub mod journal;
pub mod sweep;

/// Why slots cannot hold anything here (`WARN slots_unavailable reason=<token>`); they report.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    #[error("no cgroup v2 hierarchy is mounted (mount cgroup2, or boot with systemd's unified or hybrid hierarchy)")]
    NoCgroup2,
    #[error("the daemon is not in the initial cgroup namespace, so it cannot see where processes live")]
    CgroupNamespace,
    #[error("the kernel has no cgroup v2 freezer (cgroup.freeze, Linux 5.2)")]
    NoFreezer,
    #[error("cannot create {path}: {why} (the unit must not set ProtectControlGroups=, and the top of the hierarchy is created by its ExecStartPre=)")]
    NotWritable { path: String, why: String },
    #[error("the releaser process could not start: {0}")]
    Releaser(String),
}

impl Unavailable {
    pub fn token(&self) -> &'static str {
        match self {
            Unavailable::NoCgroup2 => "no_cgroup2",
            Unavailable::CgroupNamespace => "cgroup_namespace",
            Unavailable::NoFreezer => "no_freezer",
            Unavailable::NotWritable { .. } => "cgroup_not_writable",
            Unavailable::Releaser(_) => "releaser",
        }
    }
}

/// The directory under the hierarchy's top that holds every daemon's cgroups.
pub const TOP: &str = "guard-user";
/// The frozen cgroup inside an instance's directory.
pub const WAIT: &str = "wait";

/// The cgroup v2 hierarchy: where it is mounted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hierarchy {
    pub mount: PathBuf,
}

impl Hierarchy {
    /// The cgroup2 mount whose root is the hierarchy's root (`/sys/fs/cgroup` on a unified host,
    /// `/sys/fs/cgroup/unified` on a hybrid one), and this process in the initial namespace.
    pub fn find() -> Result<Hierarchy, Unavailable> {
        let info = fs::read_to_string("/proc/self/mountinfo").map_err(|_| Unavailable::NoCgroup2)?;
        let mount = mount_of(&info).ok_or(Unavailable::NoCgroup2)?;
        let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        match own.lines().find_map(|l| l.strip_prefix("0::")) {
            Some(p) if p.starts_with('/') && !p.starts_with("/..") => Ok(Hierarchy { mount }),
            _ => Err(Unavailable::CgroupNamespace),
        }
    }

    /// A cgroup's directory from its path in the hierarchy (`/user.slice/…`), or `None` for a
    /// path that is not one the kernel writes (relative, `..`, empty components).
    pub fn dir(&self, cgroup: &str) -> Option<PathBuf> {
        let rel = cgroup.strip_prefix('/')?;
        if cgroup.contains('\0') || rel.split('/').any(|c| c == ".." || c == "." || (c.is_empty() && !rel.is_empty())) {
            return None;
        }
        Some(if rel.is_empty() { self.mount.clone() } else { self.mount.join(rel) })
    }

    /// Where `pid` lives now: its line `0::<path>` in `/proc/PID/cgroup`.
    pub fn cgroup_of(pid: u32) -> Option<String> {
        let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        text.lines().find_map(|l| l.strip_prefix("0::")).map(str::to_string)
    }

    /// Moves `pid` into the cgroup at `cgroup` (a path in the hierarchy).
    pub fn move_to(&self, pid: u32, cgroup: &str) -> io::Result<()> {
        let dir = self.dir(cgroup).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        write_file(&dir.join("cgroup.procs"), pid.to_string().as_bytes())
    }

    /// Puts `pid` back: into `origin`, else where its parent lives, else the top (which takes any
    /// process). Returns where it went.
    pub fn put_back(&self, pid: u32, origin: Option<&str>) -> io::Result<String> {
        let parent = || Hierarchy::cgroup_of(parent_of(pid)?).filter(|c| !c.starts_with(&format!("/{TOP}/")));
        let mut last = io::Error::from_raw_os_error(libc::ENOENT);
        for target in [origin.map(str::to_string), parent(), Some("/".to_string())].into_iter().flatten() {
            match self.move_to(pid, &target) {
                Ok(()) => return Ok(target),
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Err(e),
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

/// The cgroup2 mount point in `mountinfo` whose root is `/`: `/sys/fs/cgroup` first.
fn mount_of(mountinfo: &str) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let fstype = post.split(' ').next()?;
            let mut f = pre.split(' ');
            let root = f.nth(3)?;
            let point = f.next()?;
            (fstype == "cgroup2" && root == "/").then(|| PathBuf::from(unescape_mount(point)))
        })
        .collect();
    found.sort_by_key(|p| (p != Path::new("/sys/fs/cgroup"), p.as_os_str().len()));
    found.into_iter().next()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = u32::from(b[i + 1] - b'0') * 64 + u32::from(b[i + 2] - b'0') * 8 + u32::from(b[i + 3] - b'0');
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Writes `bytes` to a cgroup file in one `write(2)` (cgroupfs takes one value per write).
fn write_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = fs::OpenOptions::new().write(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path)?;
    f.write_all(bytes)
}

/// Why one process was not held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotHeld {
    /// It exited, or its pid is another process's now.
    Gone,
    /// It is not the account's (any more), or it is root's.
    NotAccount,
    /// Root cannot write its cgroup (delegated to the account): it could not be put back.
    Unreturnable,
    /// The frozen cgroup refused it (`Io`), e.g. the cgroup was removed under the daemon.
    Io,
}

impl NotHeld {
    pub fn token(self) -> &'static str {
        match self {
            NotHeld::Gone => "gone",
            NotHeld::NotAccount => "not_account",
            NotHeld::Unreturnable => "delegated_cgroup",
            NotHeld::Io => "cgroup_error",
        }
    }
}

/// One daemon's cgroups.
#[derive(Clone, Debug)]
pub struct Instance {
    pub hierarchy: Hierarchy,
    /// `<instance>`, the lock's name: `<uid>-<hash>`.
    pub name: String,
}

impl Instance {
    pub fn new(hierarchy: Hierarchy, name: String) -> Instance {
        Instance { hierarchy, name }
    }

    /// The frozen cgroup's path in the hierarchy.
    pub fn wait_cgroup(&self) -> String {
        format!("/{TOP}/{}/{WAIT}", self.name)
    }

    pub fn dir(&self) -> PathBuf {
        self.hierarchy.mount.join(TOP).join(&self.name)
    }

    fn wait_dir(&self) -> PathBuf {
        self.dir().join(WAIT)
    }

    /// Creates the cgroups (0755, root's) and freezes the waiting one.
    pub fn prepare(&self) -> Result<(), Unavailable> {
        for dir in [self.hierarchy.mount.join(TOP), self.dir(), self.wait_dir()] {
            match fs::DirBuilder::new().mode(0o755).create(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(Unavailable::NotWritable { path: dir.display().to_string(), why: e.to_string() }),
            }
        }
        let freeze = self.wait_dir().join("cgroup.freeze");
        if !freeze.exists() {
            return Err(Unavailable::NoFreezer);
        }
        write_file(&freeze, b"1")
            .map_err(|e| Unavailable::NotWritable { path: freeze.display().to_string(), why: e.to_string() })
    }

    /// The processes in the frozen cgroup now.
    pub fn held_pids(&self) -> Vec<u32> {
        fs::read_to_string(self.wait_dir().join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Checks `pid` is the process started at `start` and the account's (`uid`, never root), and
    /// that root can write the cgroup it lives in (so it can be put back). Returns that cgroup.
    pub fn check(&self, pid: u32, start: u64, uid: u32) -> Result<String, NotHeld> {
        if uid == 0 || !is(pid, start, uid) {
            return Err(if is_alive_as(pid, start) { NotHeld::NotAccount } else { NotHeld::Gone });
        }
        // The daemon's own children (its matcher workers run as `nobody`, which an operator
        // could guard) are never held: a frozen worker would stall the daemon.
        if parent_of(pid) == Some(std::process::id()) {
            return Err(NotHeld::NotAccount);
        }
        let origin = Hierarchy::cgroup_of(pid).ok_or(NotHeld::Gone)?;
        if origin == self.wait_cgroup() {
            return Ok(origin);
        }
        let procs = self.hierarchy.dir(&origin).ok_or(NotHeld::Unreturnable)?.join("cgroup.procs");
        // Opening it for writing is the test: without CAP_DAC_OVERRIDE, root cannot write a
        // cgroup delegated to the account (owned by it).
        fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(procs)
            .map_err(|_| NotHeld::Unreturnable)?;
        Ok(origin)
    }

    /// Moves `pid` (checked by [`Instance::check`], its journal entry written) into the frozen
    /// cgroup. `Ok` when the process that was checked is the one now held.
    pub fn hold(&self, pid: u32, start: u64, uid: u32) -> Result<(), NotHeld> {
        let Some(pidfd) = crate::enforcer::pidfd_open(pid) else { return Err(NotHeld::Gone) };
        if !is(pid, start, uid) {
            return Err(NotHeld::Gone);
        }
        let moved = self.hierarchy.move_to(pid, &self.wait_cgroup());
        // The pidfd names the process checked above: alive now means the pid was its own when
        // it was written.
        if crate::enforcer::pidfd_exited(&pidfd) {
            self.release_strangers(&[]);
            return Err(NotHeld::Gone);
        }
        moved.map_err(|e| if e.raw_os_error() == Some(libc::ESRCH) { NotHeld::Gone } else { NotHeld::Io })?;
        // A set-user-ID exec between the check and the move: not the account's to hold.
        if !is(pid, start, uid) {
            let _ = self.hierarchy.put_back(pid, None);
            return Err(NotHeld::NotAccount);
        }
        Ok(())
    }

    /// Puts every process of the frozen cgroup that is not in `ours` (pid, start) back where
    /// its parent lives (a pid reused by another process between a check and a move).
    pub fn release_strangers(&self, ours: &[(u32, u64)]) -> usize {
        let mut n = 0;
        for pid in self.held_pids() {
            let start = start_of(pid);
            if !ours.iter().any(|&(p, s)| p == pid && Some(s) == start) && self.hierarchy.put_back(pid, None).is_ok() {
                n += 1;
            }
        }
        n
    }

    /// Lets the frozen cgroup run (a release of everything: the processes follow one by one).
    pub fn thaw(&self) -> io::Result<()> {
        write_file(&self.wait_dir().join("cgroup.freeze"), b"0")
    }

    /// Removes the (empty) cgroups; what is still populated stays.
    pub fn remove(&self) {
        let _ = fs::remove_dir(self.wait_dir());
        let _ = fs::remove_dir(self.dir());
    }
}

/// The start time (clock ticks since boot) of `pid`, from `/proc/PID/stat`.
pub fn start_of(pid: u32) -> Option<u64> {
    crate::procfs::parse_stat(&fs::read(format!("/proc/{pid}/stat")).ok()?).map(|s| s.start_ticks)
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    std::str::from_utf8(&stat[close + 2..]).ok()?.split_whitespace().nth(1)?.parse().ok()
}

fn euid_of(pid: u32) -> Option<u32> {
    crate::procfs::parse_status_euid(&fs::read(format!("/proc/{pid}/status")).ok()?)
}

/// `pid` is the process started at `start`, its effective uid is `uid`.
fn is(pid: u32, start: u64, uid: u32) -> bool {
    start_of(pid) == Some(start) && euid_of(pid) == Some(uid)
}

fn is_alive_as(pid: u32, start: u64) -> bool {
    start_of(pid) == Some(start)
}

/// The signals a process has pending (`SigPnd` | `ShdPnd` of `/proc/PID/status`) that ask it
/// to act: any but SIGCHLD, SIGCONT, SIGURG and SIGWINCH (which ask nothing of a waiting
/// command). A frozen process with a handler for SIGTERM or SIGINT holds the signal until it
/// thaws, so a waiting command its parent wants gone is let go at once.
pub fn wants_to_act(pid: u32) -> bool {
    let Ok(status) = fs::read(format!("/proc/{pid}/status")) else { return false };
    let quiet: u64 =
        [libc::SIGCHLD, libc::SIGCONT, libc::SIGURG, libc::SIGWINCH].iter().fold(0, |m, &s| m | 1u64 << (s - 1));
    status
        .split(|&b| b == b'\n')
        .filter_map(|l| l.strip_prefix(b"SigPnd:").or_else(|| l.strip_prefix(b"ShdPnd:")))
        .filter_map(|v| u64::from_str_radix(std::str::from_utf8(v).ok()?.trim(), 16).ok())
        .any(|mask| mask & !quiet != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unified_mount_is_found_first_and_a_hybrid_one_otherwise() {
        let hybrid = "30 25 0:26 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755\n\
                      31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw\n\
                      32 30 0:28 / /sys/fs/cgroup/systemd rw shared:11 - cgroup cgroup rw,name=systemd\n";
        assert_eq!(mount_of(hybrid), Some(PathBuf::from("/sys/fs/cgroup/unified")));
        let unified = "31 30 0:27 / /sys/fs/cgroup rw shared:10 - cgroup2 cgroup2 rw\n\
                       40 30 0:27 /x /mnt/cg\\040x rw - cgroup2 cgroup2 rw\n";
        assert_eq!(mount_of(unified), Some(PathBuf::from("/sys/fs/cgroup")));
        // A bind mount of a subtree (a container's view) is not the hierarchy.
        assert_eq!(mount_of("40 30 0:27 /x /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"), None);
        assert_eq!(unescape_mount("/mnt/a\\040b\\134c"), "/mnt/a b\\c");
    }

    #[test]
    fn a_cgroup_path_is_only_ever_one_below_the_mount() {
        let h = Hierarchy { mount: PathBuf::from("/sys/fs/cgroup") };
        assert_eq!(h.dir("/"), Some(PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(h.dir("/user.slice/a b.scope"), Some(PathBuf::from("/sys/fs/cgroup/user.slice/a b.scope")));
        for bad in ["", "user.slice", "/../etc", "/a/../../b", "/a//b", "/a/./b", "/a\0b"] {
            assert_eq!(h.dir(bad), None, "{bad:?}");
        }
    }
}
