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
        let (named, by_name);
        by_name = b.by_name;
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
mod tests {
    use super::*;
    use std::{fs, os::unix::fs::symlink};

    fn within(p: &Path) -> Within {
        Within::new(Target::open(p).unwrap())
    }

    fn link_place(w: &Within, p: &Path) -> Place {
        // This process's own fd to `p`, through its /proc link, as a holder's would be read.
        let f = fs::File::open(p).unwrap();
        let link = CString::new(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap();
        w.place_of_link(sys::CWD, &link).unwrap()
    }

    #[test]
    fn a_directory_holds_itself_and_what_is_below_it_by_device_and_inode() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("repo");
        let deep = repo.join("a/b/c");
        fs::create_dir_all(&deep).unwrap();
        fs::create_dir_all(tmp.path().join("repo2")).unwrap();
        fs::create_dir_all(repo.join("x (deleted)")).unwrap();
        fs::write(repo.join("a/f"), b"x").unwrap();
        fs::write(repo.join("a/g (deleted)"), b"x").unwrap();
        fs::write(tmp.path().join("outside"), b"x").unwrap();
        symlink(tmp.path().join("outside"), repo.join("link-out")).unwrap();
        symlink(repo.join("a"), tmp.path().join("link-in")).unwrap();
        let w = within(&repo);
        for inside in [&repo, &deep, &repo.join("x (deleted)"), &repo.join("a/f"), &repo.join("a/g (deleted)")] {
            assert_eq!(link_place(&w, inside), Place::Inside, "{}", inside.display());
        }
        // Reached through a symlink outside: still the object inside.
        assert_eq!(link_place(&w, &tmp.path().join("link-in/f")), Place::Inside);
        for outside in [&tmp.path().join("repo2"), tmp.path(), &tmp.path().join("outside"), &repo.join("link-out")] {
            assert_eq!(link_place(&w, outside), Place::Outside, "{}", outside.display());
        }
        // Asked again: the same answers, from the caches.
        assert_eq!(link_place(&w, &deep), Place::Inside);
        assert_eq!(link_place(&w, &tmp.path().join("outside")), Place::Outside);
    }

    #[test]
    fn a_removed_file_or_directory_is_below_nothing_and_a_renamed_one_is_where_it_went() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("repo");
        fs::create_dir_all(repo.join("gone")).unwrap();
        fs::write(repo.join("f"), b"x").unwrap();
        fs::write(repo.join("moved"), b"x").unwrap();
        let w = within(&repo);
        let held_dir = fs::File::open(repo.join("gone")).unwrap();
        let held_file = fs::File::open(repo.join("f")).unwrap();
        let held_moved = fs::File::open(repo.join("moved")).unwrap();
        fs::remove_dir(repo.join("gone")).unwrap();
        fs::remove_file(repo.join("f")).unwrap();
        // A new file where the removed one was: another inode, not what is held.
        fs::write(repo.join("f"), b"new").unwrap();
        fs::rename(repo.join("moved"), tmp.path().join("moved")).unwrap();
        let place = |f: &fs::File| {
            let link = CString::new(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap();
            w.place_of_link(sys::CWD, &link).unwrap()
        };
        assert_eq!(place(&held_dir), Place::Outside);
        assert_eq!(place(&held_file), Place::Outside);
        assert_eq!(place(&held_moved), Place::Outside);
    }

    #[test]
    fn a_file_as_path_is_held_only_as_itself() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("f (deleted)");
        fs::write(&f, b"x").unwrap();
        fs::write(tmp.path().join("f"), b"y").unwrap();
        let w = within(&f);
        assert!(!w.target.is_dir());
        assert_eq!(link_place(&w, &f), Place::Inside);
        assert_eq!(link_place(&w, &tmp.path().join("f")), Place::Outside);
        assert_eq!(link_place(&w, tmp.path()), Place::Outside);
    }

    #[test]
    fn a_mapping_is_found_by_its_maps_line_through_its_parent() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("repo");
        fs::create_dir_all(repo.join("n\nl")).unwrap();
        fs::write(repo.join("n\nl/lib (deleted)"), b"x").unwrap();
        let m = fs::metadata(repo.join("n\nl/lib (deleted)")).unwrap();
        let w = within(&repo);
        let text = [repo.as_os_str().as_bytes(), b"/n\\012l/lib (deleted)"].concat();
        // maps shows the superblock's device; on most filesystems that is st_dev.
        let dev = w.target.sb_dev.unwrap_or(m.dev());
        let named = |t: &[u8]| Some((t.to_vec(), true));
        assert_eq!(w.place_of_mapping(sys::CWD, dev, m.ino() + 1, || named(&text)), Place::Outside, "another inode");
        let fresh = within(&repo);
        assert_eq!(fresh.place_of_mapping(sys::CWD, dev, m.ino(), || named(b"/nowhere/lib")), Place::Outside);
        assert_eq!(w.place_of_mapping(sys::CWD, dev, m.ino(), || named(&text)), Place::Inside);
        // Decided once: the name is not asked for again.
        assert_eq!(w.place_of_mapping(sys::CWD, dev, m.ino(), || panic!("asked again")), Place::Inside);
    }

    #[test]
    fn a_socket_is_held_where_the_file_it_is_bound_to_is() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("repo");
        fs::create_dir_all(repo.join("run")).unwrap();
        let inside = std::os::unix::net::UnixListener::bind(repo.join("run/s.sock")).unwrap();
        let outside = std::os::unix::net::UnixListener::bind(tmp.path().join("s.sock")).unwrap();
        let unbound = std::os::unix::net::UnixStream::pair().unwrap().0;
        let place = |w: &Within, fd: RawFd| {
            let link = CString::new(format!("/proc/self/fd/{fd}")).unwrap();
            w.place_of_link(sys::CWD, &link).unwrap()
        };
        let w = within(&repo);
        assert_eq!(place(&w, inside.as_raw_fd()), Place::Inside);
        assert_eq!(place(&w, outside.as_raw_fd()), Place::Outside);
        assert_eq!(place(&w, unbound.as_raw_fd()), Place::Outside);
        // The socket file as PATH.
        let file = within(&repo.join("run/s.sock"));
        assert_eq!(place(&file, inside.as_raw_fd()), Place::Inside);
        assert_eq!(place(&file, outside.as_raw_fd()), Place::Outside);
        // Its file removed and another bound at the same name: the first holds nothing now, as
        // the socket diagnostics tell (they give each socket's own file). Where the kernel has
        // none, /proc/net/unix gives only the name, and both sockets are taken to hold the file
        // there now (unix.rs): a holder too many, never one missed.
        fs::remove_file(repo.join("run/s.sock")).unwrap();
        let _again = std::os::unix::net::UnixListener::bind(repo.join("run/s.sock")).unwrap();
        let expect = if unix::has_diagnostics() { Place::Outside } else { Place::Inside };
        assert_eq!(place(&within(&repo), inside.as_raw_fd()), expect);
    }

    /// A forked child that binds a unix socket by the relative name `rel.sock` in `dir` and
    /// pauses: its pid and the socket's fd.
    fn relative_binder(dir: &Path) -> (libc::pid_t, RawFd) {
        let dir = CString::new(dir.as_os_str().as_bytes()).unwrap();
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, s) in addr.sun_path.iter_mut().zip(b"rel.sock") {
            *d = *s as libc::c_char;
        }
        let mut pipe = [0; 2];
        // SAFETY: the child makes async-signal-safe calls only, on memory prepared before.
        unsafe {
            assert_eq!(libc::pipe(pipe.as_mut_ptr()), 0);
            let pid = libc::fork();
            if pid == 0 {
                let s = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
                let ok = libc::chdir(dir.as_ptr()) == 0 && libc::bind(s, (&raw const addr).cast(), len) == 0;
                let out: i32 = if ok { s } else { -1 };
                libc::write(pipe[1], (&raw const out).cast(), 4);
                loop {
                    libc::pause();
                }
            }
            let mut fd = 0i32;
            assert_eq!(libc::read(pipe[0], (&raw mut fd).cast(), 4), 4);
            libc::close(pipe[0]);
            libc::close(pipe[1]);
            assert!(fd >= 0, "the child could not bind its socket");
            (pid, fd)
        }
    }

    #[test]
    fn a_socket_known_by_a_relative_name_or_not_listed_at_all_is_never_taken_for_outside() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("repo");
        fs::create_dir_all(repo.join("run")).unwrap();
        fs::create_dir_all(tmp.path().join("elsewhere")).unwrap();
        let (pid, fd) = relative_binder(&repo.join("run"));
        let proc_dir = sys::open_path(sys::CWD, &CString::new(format!("/proc/{pid}")).unwrap(), true).unwrap();
        let link = CString::new(format!("fd/{fd}")).unwrap();
        let with = |path: &Path, listing: Result<HashMap<u64, unix::Bound>, &'static str>| {
            let w = within(path);
            w.sockets.set(listing).unwrap();
            w.place_of_link(proc_dir.as_raw_fd(), &link).unwrap()
        };
        let fallback = || unix::from_proc_net_unix().map_err(|e| e.why());
        assert!(fallback().unwrap().values().any(|b| b.by_name && b.path == b"rel.sock"), "{:?}", fallback());
        // Without socket diagnostics, the relative name is looked up from the holder's cwd.
        assert_eq!(with(&repo, fallback()), Place::Inside);
        assert_eq!(with(&repo.join("run/rel.sock"), fallback()), Place::Inside);
        assert_eq!(with(&tmp.path().join("elsewhere"), fallback()), Place::Outside);
        // No listing at all: the holder is read in part, not cleared.
        assert_eq!(with(&repo, Err("unlisted")), Place::Unknown("unlisted"));
        assert_eq!(with(&tmp.path().join("elsewhere"), Err("unlisted")), Place::Unknown("unlisted"));
        // SAFETY: our own child.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
    }

    #[test]
    fn candidates_try_the_text_as_written_and_as_the_kernel_may_have_changed_it() {
        assert_eq!(candidates(b"/a/b", false), [b"/a/b".to_vec()]);
        assert_eq!(candidates(b"/a/b (deleted)", false), [b"/a/b (deleted)".to_vec(), b"/a/b".to_vec()]);
        assert_eq!(candidates(b"/a\\012b", true), [b"/a\\012b".to_vec(), b"/a\nb".to_vec()]);
    }

    #[test]
    fn mountinfo_lines_give_each_mounts_device() {
        let line = b"36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue";
        assert_eq!(parse_mountinfo_line(line), Some((36, libc::makedev(98, 0))));
        assert_eq!(parse_mountinfo_line(b""), None);
    }
}
