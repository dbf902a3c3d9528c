//! Whether an object a process holds is PATH, or below it when PATH is a directory: decided by
//! device and inode, on the kernel's own references, never on path text.
//!
//! - **The object** comes from `statx` through the process's `/proc` link (`cwd`, `root`, `exe`,
//!   `fd/N`) or from its `maps` line (device and inode): the link's text, which names ending
//!   ` (deleted)`, renames and other mount namespaces make ambiguous, is never compared.
//! - **A directory** is below PATH when walking up from it reaches PATH: `openat(dir, "..")`
//!   from a handle on the very directory the process holds (opened through the magic link, on
//!   the mount it holds it through), comparing (device, inode) with PATH's at each step. `..`
//!   follows the kernel's dentry tree and crosses mounts upward, so a symlink, a bind mount of
//!   PATH elsewhere or a filesystem mounted below PATH neither hides nor invents a holder, and
//!   a directory removed since (no link left) is below nothing.
//! - **A file** (or FIFO, device) has no `..`: its parent comes from the link's text, and is
//!   believed only when that parent directory holds an entry with the object's own device and
//!   inode (checked with `statx`, not followed); the walk-up then starts from that parent. The
//!   text is tried as the kernel wrote it, then without a final ` (deleted)` (the kernel's
//!   suffix for an unlinked name), from this process's root and then from the holder's (a
//!   process in another mount namespace names paths from its own root). A file with no link
//!   left is below nothing; a file whose every candidate parent fails the check is outside.
//!   So the account's names can at worst hide a file it renames while `holders` reads it, which
//!   it could as well do by closing it.
//! - **PATH a file**: only its own (device, inode) is held.
//!
//! Every answer is kept per (mount, device, inode) (for the walk-up, every directory passed on
//! the way too), so 2,000 processes in one checkout cost one walk, and a shared library
//! mapped by all of them one parent check. `statx` runs with `AT_STATX_DONT_SYNC` and
//! `O_PATH` opens nothing, so a hung network or FUSE filesystem does not stall the walk; what
//! still can (a path lookup of a file's parent, a `/proc` read) is bounded by the caller's
//! progress watch (`pool`).
use std::{
    collections::{HashMap, HashSet},
    ffi::{CStr, CString},
    io,
    os::{
        fd::{AsRawFd, OwnedFd, RawFd},
        unix::ffi::OsStrExt,
    },
    path::Path,
    sync::{Mutex, OnceLock},
};

use super::{
    sys::{self, Ident},
    unix,
};

/// Longest link text read (PATH_MAX).
const PATH_MAX: usize = 4096;
/// Directories walked up from one object at most: far deeper than any tree a path can name
/// (PATH_MAX allows ~2,048 levels); deeper is an answer of its own ([`Place::Unknown`]).
pub const MAX_DEPTH: usize = 65_536;
/// Answers kept per cache (a few dozen bytes each); past it, answers are computed each time.
const MAX_CACHED: usize = 1 << 18;

/// Where one held object is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// PATH itself, or below it.
    Inside,
    Outside,
    /// Could not tell (why): the process may hold PATH.
    Unknown(&'static str),
}

/// PATH, resolved once (as the caller, symlinks followed: the operator named it).
#[derive(Debug)]
pub struct Target {
    pub ident: Ident,
    /// The name the kernel gives the object PATH resolved to: what is shown and what the stop
    /// command names.
    pub resolved: Vec<u8>,
    /// The device `/proc/PID/maps` shows for it (its superblock's; on btrfs it is not the
    /// `st_dev` of a file in a subvolume).
    pub sb_dev: Option<u64>,
    /// Held open so the name above keeps naming this object while `holders` runs.
    _fd: OwnedFd,
}

#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("{shown}: {err}; name an existing file or directory")]
    Open { shown: String, err: io::Error },
}

impl Target {
    pub fn open(path: &Path) -> Result<Target, TargetError> {
        let shown = || crate::escape::text(path.as_os_str().as_bytes());
        let err = |err| TargetError::Open { shown: shown(), err };
        let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| err(io::ErrorKind::InvalidInput.into()))?;
        let fd = sys::open_path(sys::CWD, &c, false).map_err(err)?;
        let ident = sys::statx_at(fd.as_raw_fd(), c"", true).map_err(err)?;
        let link = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("no NUL");
        let resolved = sys::read_link_at(sys::CWD, &link, PATH_MAX).map_err(err)?;
        let sb_dev = ident.mnt_id.and_then(|m| mount_devices().get(&m).copied());
        Ok(Target { ident, resolved, sb_dev, _fd: fd })
    }

    pub fn is_dir(&self) -> bool {
        self.ident.is_dir()
    }
}

/// Mount id → its superblock's device, from this process's `/proc/self/mountinfo` (field 1 and
/// field 3, `major:minor`), read once. Mounts of other namespaces are not in it.
fn mount_devices() -> &'static HashMap<u64, u64> {
    static MOUNTS: OnceLock<HashMap<u64, u64>> = OnceLock::new();
    MOUNTS.get_or_init(|| {
        let text = std::fs::read("/proc/self/mountinfo").unwrap_or_default();
        text.split(|&b| b == b'\n').filter_map(parse_mountinfo_line).collect()
    })
}

fn parse_mountinfo_line(line: &[u8]) -> Option<(u64, u64)> {
    let mut f = line.split(|&b| b == b' ');
    let id = std::str::from_utf8(f.next()?).ok()?.parse().ok()?;
    let (major, minor) = std::str::from_utf8(f.nth(1)?).ok()?.split_once(':')?;
    Some((id, libc::makedev(major.parse().ok()?, minor.parse().ok()?)))
}

/// A cache key: the object and the mount it was reached through (one directory can be below
/// PATH through one mount and outside it through another). `None` without mount ids.
fn key(id: &Ident) -> Option<(u64, u64, u64)> {
    id.mnt_id.map(|m| (m, id.dev, id.ino))
}

/// The answers for one PATH, shared by every thread reading processes.
pub struct Within {
    pub target: Target,
    /// Directories walked: below PATH or not.
    dirs: Mutex<HashMap<(u64, u64, u64), Place>>,
    /// Files whose parent was checked.
    files: Mutex<HashMap<(u64, u64, u64), Place>>,
    /// Mapped files (the device `maps` shows, inode).
    maps: Mutex<HashMap<(u64, u64), Place>>,
    /// Devices whose objects have no path (pipes, anonymous inodes): their link text is
    /// `pipe:[…]`, `anon_inode:…`.
    pathless: Mutex<HashSet<u64>>,
    /// Unix sockets bound to a file (`unix`), dumped once, when the first socket fd is read.
    sockets: OnceLock<Result<HashMap<u64, unix::Bound>, &'static str>>,
    /// Sockets whose file was checked, by socket inode.
    socks: Mutex<HashMap<u64, Place>>,
}

fn cached<K: std::hash::Hash + Eq>(map: &Mutex<HashMap<K, Place>>, k: &K) -> Option<Place> {
    map.lock().unwrap_or_else(|p| p.into_inner()).get(k).copied()
}

fn remember<K: std::hash::Hash + Eq>(map: &Mutex<HashMap<K, Place>>, k: K, place: Place) {
    if matches!(place, Place::Unknown(_)) {
        return;
    }
    let mut m = map.lock().unwrap_or_else(|p| p.into_inner());
    if m.len() < MAX_CACHED {
        m.insert(k, place);
    }
}

fn cstr(bytes: &[u8]) -> Option<CString> {
    CString::new(bytes).ok()
}

impl Within {
    pub fn new(target: Target) -> Within {
        Within {
            target,
            dirs: Mutex::default(),
            files: Mutex::default(),
            maps: Mutex::default(),
            pathless: Mutex::default(),
            sockets: OnceLock::new(),
            socks: Mutex::default(),
        }
    }

    /// Where the object the link `dir/link` leads to is (`cwd`, `root`, `exe`, `fd/N`, under
    /// a `/proc/PID` directory). An error is the link's (gone: `ENOENT`; another account's
    /// process read without root: `EACCES`).
    pub fn place_of_link(&self, dir: RawFd, link: &CStr) -> io::Result<Place> {
        let id = sys::statx_at(dir, link, true)?;
        if id.object() == self.target.ident.object() {
            return Ok(Place::Inside);
        }
        if id.mode & libc::S_IFMT == libc::S_IFSOCK {
            // The socket's own inode: what it holds is the file it is bound to, if any.
            return Ok(self.place_of_socket(dir, id.ino));
        }
        if !self.target.is_dir() || id.nlink == 0 {
            // A file as PATH is held only as itself; an object with no link left is below nothing.
            return Ok(Place::Outside);
        }
        if id.is_dir() {
            if let Some(p) = key(&id).and_then(|k| cached(&self.dirs, &k)) {
                return Ok(p);
            }
            return Ok(self.walk_up(sys::open_path(dir, link, true)?));
        }
        if id.mode & libc::S_IFMT == 0 || self.pathless.lock().unwrap_or_else(|p| p.into_inner()).contains(&id.dev) {
            return Ok(Place::Outside);
        }
        if let Some(p) = key(&id).and_then(|k| cached(&self.files, &k)) {
            return Ok(p);
        }
        let text = sys::read_link_at(dir, link, PATH_MAX)?;
        if !text.starts_with(b"/") {
            self.pathless.lock().unwrap_or_else(|p| p.into_inner()).insert(id.dev);
            return Ok(Place::Outside);
        }
        let same = |st: &Ident| st.object() == id.object();
        let place = self.via_parent(&from_roots(candidates(&text, false), dir), same);
        if let Some(k) = key(&id) {
            remember(&self.files, k, place);
        }
        Ok(place)
    }

    /// Where a mapped file is, from its device (the superblock's, as `maps` shows it) and
    /// inode, and, when that does not settle it, its path (`name`: the text and whether it is
    /// `maps`' escaped form, `\012` for a newline; ` (deleted)` appended when unlinked). A
    /// mapped file is judged once per run, by the name of the first mapping of it asked about
    /// (`maps` says nothing of the mount it was mapped through).
    pub fn place_of_mapping(
        &self,
        dir: RawFd,
        dev: u64,
        ino: u64,
        name: impl FnOnce() -> Option<(Vec<u8>, bool)>,
    ) -> Place {
        let t = &self.target;
        if ino == t.ident.ino && (dev == t.ident.dev || Some(dev) == t.sb_dev) {
            return Place::Inside;
        }
        if !t.is_dir() {
            return Place::Outside;
        }
        if let Some(p) = cached(&self.maps, &(dev, ino)) {
            return p;
        }
        let Some((text, escaped)) = name().filter(|(t, _)| t.starts_with(b"/")) else { return Place::Outside };
        let same = |st: &Ident| {
            st.ino == ino && (st.dev == dev || st.mnt_id.and_then(|m| mount_devices().get(&m).copied()) == Some(dev))
        };
        let place = self.via_parent(&from_roots(candidates(&text, escaped), dir), same);
        remember(&self.maps, (dev, ino), place);
        place
    }

    /// Where the file a unix socket is bound to is (see `unix`): the socket's inode is the
    /// fd's; the file is found by the name it was bound by (from the holder's working directory
    /// when relative) and believed only if it is that very file (its device and inode, of which
    /// the kernel reports the low 32 bits).
    fn place_of_socket(&self, proc_dir: RawFd, sock_ino: u64) -> Place {
        let sockets = self.sockets.get_or_init(|| unix::bound_sockets().map_err(|e| e.why()));
        let b = match sockets {
            Ok(all) => match all.get(&sock_ino) {
                Some(b) => b,
                None => return Place::Outside,
            },
            // Not listed is not "bound to nothing": the fd may be a socket file below PATH.
            Err(why) => return Place::Unknown(why),
        };
        let by_name = b.by_name;
        let named;
        let b = if by_name {
            // Known by a relative name only: the socket file at that name from the holder's
            // working directory now (as for the fallback's absolute names), never cached.
            let at = cstr(&[b"cwd/", &b.path[..]].concat());
            let st = at.and_then(|at| sys::statx_at(proc_dir, &at, false).ok());
            match st.filter(|st| st.mode & libc::S_IFMT == libc::S_IFSOCK) {
                Some(st) => {
                    named = unix::Bound { dev: st.dev, ino32: st.ino as u32, path: b.path.clone(), by_name: false };
                    &named
                }
                None => return Place::Outside,
            }
        } else {
            b
        };
        let sb_dev = |st: &Ident| st.mnt_id.and_then(|m| mount_devices().get(&m).copied());
        let same = |st: &Ident| {
            st.mode & libc::S_IFMT == libc::S_IFSOCK
                && st.ino & 0xffff_ffff == u64::from(b.ino32)
                && (st.dev == b.dev || sb_dev(st) == Some(b.dev))
        };
        let t = &self.target;
        if !t.is_dir() {
            let it = same(&t.ident) || (t.sb_dev == Some(b.dev) && same(&Ident { dev: b.dev, ..t.ident }));
            return if it { Place::Inside } else { Place::Outside };
        }
        if let Some(p) = cached(&self.socks, &sock_ino).filter(|_| !by_name) {
            return p;
        }
        let paths = if b.path.starts_with(b"/") {
            from_roots(vec![b.path.clone()], proc_dir)
        } else {
            vec![(proc_dir, [b"cwd/", &b.path[..]].concat())]
        };
        let place = self.via_parent(&paths, same);
        if !by_name {
            remember(&self.socks, sock_ino, place);
        }
        place
    }

    /// The first candidate (a path from a base directory) whose parent directory holds an entry
    /// that is the object (`same`), walked up from that parent. Outside when none checks out.
    fn via_parent(&self, candidates: &[(RawFd, Vec<u8>)], same: impl Fn(&Ident) -> bool) -> Place {
        for (base, cand) in candidates {
            let Some(slash) = cand.iter().rposition(|&b| b == b'/') else { continue };
            let (parent, name) = (&cand[..slash.max(1)], &cand[slash + 1..]);
            let (Some(parent), Some(name)) = (cstr(parent), cstr(name).filter(|n| !n.is_empty())) else { continue };
            let Ok(pfd) = sys::open_path(*base, &parent, true) else { continue };
            if sys::statx_at(pfd.as_raw_fd(), &name, false).is_ok_and(|st| same(&st)) {
                return self.walk_up(pfd);
            }
        }
        Place::Outside
    }

    /// Walks up from the directory `fd` (see the module doc), remembering the answer for
    /// every directory passed.
    fn walk_up(&self, mut fd: OwnedFd) -> Place {
        let target = self.target.ident.object();
        let mut passed = Vec::new();
        let mut below: Option<Ident> = None;
        let mut steps = 0;
        let place = loop {
            steps += 1;
            if steps > MAX_DEPTH {
                break Place::Unknown("more than 65,536 directories deep");
            }
            let Ok(id) = sys::statx_at(fd.as_raw_fd(), c"", true) else { break Place::Outside };
            if id.object() == target {
                break Place::Inside;
            }
            // `..` of the top directory is itself.
            if below.is_some_and(|b| b.object() == id.object() && b.mnt_id == id.mnt_id) {
                break Place::Outside;
            }
            if let Some(k) = key(&id) {
                if let Some(p) = cached(&self.dirs, &k) {
                    break p;
                }
                passed.push(k);
            }
            below = Some(id);
            match sys::open_path(fd.as_raw_fd(), c"..", true) {
                Ok(up) => fd = up,
                Err(_) => break Place::Outside,
            }
        };
        for k in passed {
            remember(&self.dirs, k, place);
        }
        place
    }
}

/// The paths a link or `maps` text may stand for: as written; for `maps`, with `\012` read
/// as the newline the kernel escaped (a name can also hold those four characters: both are
/// tried); each also without a final ` (deleted)` (the suffix may be the kernel's or part of
/// the name: only the parent check tells).
fn candidates(text: &[u8], maps: bool) -> Vec<Vec<u8>> {
    let mut out = vec![text.to_vec()];
    if maps && text.windows(4).any(|w| w == b"\\012") {
        let mut un = Vec::with_capacity(text.len());
        let mut i = 0;
        while i < text.len() {
            if text[i..].starts_with(b"\\012") {
                un.push(b'\n');
                i += 4;
            } else {
                un.push(text[i]);
                i += 1;
            }
        }
        out.push(un);
    }
    for i in 0..out.len() {
        if let Some(s) = out[i].strip_suffix(b" (deleted)") {
            let s = s.to_vec();
            out.push(s);
        }
    }
    out
}

/// Each candidate of an absolute path from this process's root, then from the holder's
/// (`proc_dir/root`: a process in another mount namespace names paths from its own root).
fn from_roots(paths: Vec<Vec<u8>>, proc_dir: RawFd) -> Vec<(RawFd, Vec<u8>)> {
    let theirs: Vec<(RawFd, Vec<u8>)> = paths.iter().map(|p| (proc_dir, [b"root", &p[..]].concat())).collect();
    paths.into_iter().map(|p| (sys::CWD, p)).chain(theirs).collect()
}

#[cfg(test)]
#[path = "within_tests.rs"]
mod tests;
