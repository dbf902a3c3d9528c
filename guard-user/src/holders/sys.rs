//! The few syscalls `holders` makes, each a small safe wrapper over one libc call: `statx`
//! (identity without waiting on a filesystem), `openat(O_PATH)` (a handle on a directory without
//! opening it), `readlinkat`, `getdents64` and `kcmp`. Paths are relative to a directory fd, so
//! what a process's `/proc/PID` directory names is read through that one directory: once the
//! pid is reused, every lookup through the old fd fails instead of reading the new process.
use std::{
    ffi::CStr,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
};

/// The current directory as a `dir` argument: an absolute path ignores it.
pub const CWD: RawFd = libc::AT_FDCWD;

/// What `statx` says of one object: enough to tell two objects apart and what kind each is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ident {
    pub dev: u64,
    pub ino: u64,
    /// `st_mode` (type bits and permissions).
    pub mode: u32,
    pub nlink: u32,
    /// The mount the object was reached through (Linux 5.8+); `None` on older kernels.
    pub mnt_id: Option<u64>,
}

impl Ident {
    pub fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }

    /// (dev, ino): the object itself, whatever path or mount reached it.
    pub fn object(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }
}

/// `statx(dir, path)`, following a final symlink when `follow` (how `/proc/PID/cwd`, `fd/N` and
/// `exe` lead to what they name: through the kernel's own reference, never their text). An
/// empty `path` is `dir` itself. `AT_STATX_DONT_SYNC`: a network or FUSE filesystem answers
/// from its cache instead of asking its server, so a hung server cannot hang `holders` here;
/// device and inode numbers never change, so a cached answer is exact for them.
pub fn statx_at(dir: RawFd, path: &CStr, follow: bool) -> io::Result<Ident> {
    let mut flags = libc::AT_STATX_DONT_SYNC;
    if !follow {
        flags |= libc::AT_SYMLINK_NOFOLLOW;
    }
    if path.is_empty() {
        flags |= libc::AT_EMPTY_PATH;
    }
    let mask = libc::STATX_TYPE | libc::STATX_MODE | libc::STATX_INO | libc::STATX_NLINK | libc::STATX_MNT_ID;
    // SAFETY: statx is plain data, for which all zeroes is valid; the call writes only into it.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statx buffer we own.
    if unsafe { libc::statx(dir, path.as_ptr(), flags, mask, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Ident {
        dev: libc::makedev(st.stx_dev_major, st.stx_dev_minor),
        ino: st.stx_ino,
        mode: u32::from(st.stx_mode),
        nlink: st.stx_nlink,
        mnt_id: (st.stx_mask & libc::STATX_MNT_ID != 0).then_some(st.stx_mnt_id),
    })
}

fn open_at(dir: RawFd, path: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: openat with a NUL-terminated path; a non-negative result is a new fd we own.
    let fd = unsafe { libc::openat(dir, path.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A handle on what `path` names (`O_PATH`: nothing is opened on its filesystem), following
/// symlinks on the way (a magic link such as `/proc/PID/cwd` leads to the very directory the
/// process holds, on the mount it holds it through); `dir_only` refuses anything else.
pub fn open_path(dir: RawFd, path: &CStr, dir_only: bool) -> io::Result<OwnedFd> {
    open_at(dir, path, libc::O_PATH | if dir_only { libc::O_DIRECTORY } else { 0 })
}

/// `path` opened for reading (a `/proc` file or directory).
pub fn open_read(dir: RawFd, path: &CStr) -> io::Result<OwnedFd> {
    open_at(dir, path, libc::O_RDONLY)
}

/// What the symlink `path` says, at most `max` bytes (longer: `ENAMETOOLONG`).
pub fn read_link_at(dir: RawFd, path: &CStr, max: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; max + 1];
    // SAFETY: the buffer is valid for `buf.len()` bytes of writes.
    let n = unsafe { libc::readlinkat(dir, path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    if n > max {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    buf.truncate(n);
    Ok(buf)
}

/// Reads the entries of an open directory in `getdents64` batches: one syscall per 32 KiB of
/// names, no allocation per entry, `.` and `..` left out.
pub struct Entries {
    fd: OwnedFd,
    buf: Vec<u8>,
    at: usize,
    len: usize,
}

impl Entries {
    pub fn new(fd: OwnedFd) -> Entries {
        Entries { fd, buf: vec![0; 32 * 1024], at: 0, len: 0 }
    }

    /// The next name, `None` at the end (or on an error: a directory that vanished mid-read).
    pub fn next_name(&mut self) -> Option<&[u8]> {
        loop {
            if self.at >= self.len {
                // SAFETY: the buffer is valid for its length; getdents64 writes whole records.
                let n = unsafe {
                    libc::syscall(libc::SYS_getdents64, self.fd.as_raw_fd(), self.buf.as_mut_ptr(), self.buf.len())
                };
                if n <= 0 {
                    return None;
                }
                (self.at, self.len) = (0, n as usize);
            }
            // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
            let rec = &self.buf[self.at..self.len];
            if rec.len() < 20 {
                return None;
            }
            let reclen = usize::from(u16::from_ne_bytes([rec[16], rec[17]]));
            if reclen < 20 || reclen > rec.len() {
                return None;
            }
            let start = self.at + 19;
            self.at += reclen;
            let len = {
                let raw = &self.buf[start..start + reclen - 19];
                raw.iter().position(|&b| b == 0).unwrap_or(raw.len())
            };
            let dots = matches!(&self.buf[start..start + len], b"." | b"..");
            if !dots {
                return Some(&self.buf[start..start + len]);
            }
        }
    }
}

/// `kcmp(2)` types: whether two tasks share one table of open files, one working/root directory.
pub const KCMP_FILES: libc::c_int = 2;
pub const KCMP_FS: libc::c_int = 3;

/// Whether tasks `a` and `b` share the `kind` resource; `None` when the kernel cannot say
/// (no kcmp, a task gone, not permitted).
pub fn kcmp_same(a: u32, b: u32, kind: libc::c_int) -> Option<bool> {
    // SAFETY: kcmp has no memory arguments for these types.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, a as libc::pid_t, b as libc::pid_t, kind, 0usize, 0usize) };
    (r >= 0).then_some(r == 0)
}

/// `struct procmap_query` (include/uapi/linux/fs.h, Linux 6.11+).
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: libc::c_ulong =
    (3 << 30) | ((std::mem::size_of::<ProcmapQuery>() as libc::c_ulong) << 16) | (0x66 << 8) | 17;
const PROCMAP_QUERY_COVERING_OR_NEXT_VMA: u64 = 0x10;
const PROCMAP_QUERY_FILE_BACKED_VMA: u64 = 0x20;

/// One file-backed mapping, as `PROCMAP_QUERY` gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// The superblock's device, as `maps` shows it.
    pub dev: u64,
    pub ino: u64,
}

/// What `PROCMAP_QUERY` says of the first file-backed mapping at or after `addr` of the process
/// whose `maps` file `maps` is: `Ok(None)` past the last one. With `name`, the mapped file's path
/// (as `d_path` writes it, ` (deleted)` appended when unlinked) is written there and its length
/// returned. Where the kernel predates it (Linux 6.11), `ENOTTY`.
///
/// Unlike reading `maps`, nothing is formatted: no line per mapping, no path unless asked for
/// (formatting the paths was half of what `holders` cost on 2,000 processes).
pub fn query_mapping(maps: RawFd, addr: u64, name: Option<&mut [u8]>) -> io::Result<Option<(Mapping, usize)>> {
    let mut q = ProcmapQuery {
        size: std::mem::size_of::<ProcmapQuery>() as u64,
        query_flags: PROCMAP_QUERY_COVERING_OR_NEXT_VMA | PROCMAP_QUERY_FILE_BACKED_VMA,
        query_addr: addr,
        ..ProcmapQuery::default()
    };
    if let Some(buf) = &name {
        q.vma_name_size = buf.len().min(u32::MAX as usize) as u32;
        q.vma_name_addr = buf.as_ptr() as u64;
    }
    // SAFETY: the struct is the kernel's layout and ours; the name buffer (when given) is valid
    // for `vma_name_size` bytes of writes and outlives the call.
    if unsafe { libc::ioctl(maps, PROCMAP_QUERY as _, &mut q) } != 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENOENT) { Ok(None) } else { Err(e) };
    }
    let m = Mapping { start: q.vma_start, end: q.vma_end, dev: libc::makedev(q.dev_major, q.dev_minor), ino: q.inode };
    // vma_name_size comes back as the name's length with its NUL.
    Ok(Some((m, (q.vma_name_size as usize).saturating_sub(1))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    #[test]
    fn entries_list_every_name_but_the_dots() {
        let dir = tempfile::tempdir().unwrap();
        let mut want: Vec<Vec<u8>> = (0..2000).map(|i| format!("f{i} x").into_bytes()).collect();
        for n in &want {
            std::fs::write(dir.path().join(std::str::from_utf8(n).unwrap()), b"").unwrap();
        }
        let c = CString::new(dir.path().as_os_str().as_encoded_bytes()).unwrap();
        let mut e = Entries::new(open_read(CWD, &c).unwrap());
        let mut got = Vec::new();
        while let Some(n) = e.next_name() {
            got.push(n.to_vec());
        }
        got.sort();
        want.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn statx_follows_proc_links_to_the_object_itself() {
        let me = statx_at(CWD, c"/proc/self/cwd", true).unwrap();
        let cwd = std::fs::metadata(".").unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(me.object(), (cwd.dev(), cwd.ino()));
        assert!(me.is_dir());
        let link = statx_at(CWD, c"/proc/self/cwd", false).unwrap();
        assert!(!link.is_dir(), "without follow, the link itself");
    }

    #[test]
    fn kcmp_says_a_thread_shares_its_process_files() {
        let me = std::process::id();
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(200));
        });
        let tid = rx.recv().unwrap();
        // None where the kernel has no kcmp (CONFIG_KCMP off): holders then reads every thread.
        if let Some(same) = kcmp_same(me, tid, KCMP_FILES) {
            assert!(same);
        }
        t.join().unwrap();
    }

    #[test]
    fn procmap_query_gives_what_maps_shows_without_formatting_it() {
        let maps = std::fs::read("/proc/self/maps").unwrap();
        let f = std::fs::File::from(open_read(CWD, c"/proc/self/maps").unwrap());
        let mut name = vec![0u8; 4097];
        let first = match query_mapping(f.as_raw_fd(), 0, Some(&mut name)) {
            Err(e) if e.raw_os_error() == Some(libc::ENOTTY) => {
                eprintln!("no PROCMAP_QUERY before Linux 6.11: holders reads maps as text here");
                return;
            }
            r => r.unwrap().expect("a process maps its executable"),
        };
        let (m, len) = first;
        let line = format!("{:x}-{:x} ", m.start, m.end);
        let shown = maps.split(|&b| b == b'\n').find(|l| l.starts_with(line.as_bytes())).expect("the same mapping");
        let (dev, ino, path) = super::super::process::parse_maps_line(shown).unwrap();
        assert_eq!((dev, ino, path), (m.dev, m.ino, &name[..len]));
        assert!(query_mapping(f.as_raw_fd(), u64::MAX - 4096, None).unwrap().is_none(), "past the last one");
    }
}
