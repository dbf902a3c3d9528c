//! Reading one process for every way it can hold PATH, through its `/proc/PID` directory fd
//! (so a pid reused meanwhile reads as gone, never as the new process):
//!
//! - `cwd` and `root` of every thread with a working directory of its own (a thread can
//!   `unshare(CLONE_FS)`; `kcmp(KCMP_FS)` tells which share one), and of the threads of a process
//!   whose leader has exited (its own links are then gone, the process lives on);
//! - `exe`, and every file-backed line of `maps` (a file mapped and then closed, a shared
//!   library), from a live thread;
//! - every open fd of every distinct fd table (`kcmp(KCMP_FILES)`).
//!
//! Nothing per fd or mapping is kept but the first [`MAX_FDS_LISTED`] fd numbers that hold
//! PATH and a count, so 100,000 fds or 65,000 mappings cost time (bounded by the shared
//! [`Budget`] and the pool's progress watch), not memory.
use std::{
    ffi::CString,
    io::{self, BufRead, Read},
    os::fd::{AsRawFd, OwnedFd, RawFd},
    sync::atomic::{AtomicU64, Ordering},
};

use super::{
    pool::Progress,
    sys::{self, Entries},
    within::{Place, Within},
};
use crate::{escape::ShownCmdline, event::ProcState, procfs};

/// Fd numbers listed per process (the count says how many hold PATH in all).
pub const MAX_FDS_LISTED: usize = 16;
/// The most of a command line shown: 4 KiB, and how many bytes were left out.
const MAX_COMMAND_SHOWN: usize = crate::escape::SHOWN_CMDLINE_BYTES;
/// Threads read per process at most (each distinct fs or fd table is read; see the module doc).
const MAX_TASKS: usize = 65_536;
/// Distinct fs / fd tables kept per process for the `kcmp` comparisons.
const MAX_TABLES: usize = 64;
/// Bytes of a command line counted past what is shown, when `stat` does not say its length.
const MAX_COMMAND_COUNTED: u64 = 8 << 20;

/// How a process holds PATH.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ways {
    pub cwd: bool,
    pub root: bool,
    pub exe: bool,
    pub fd: bool,
    pub mmap: bool,
}

impl Ways {
    pub fn any(&self) -> bool {
        self.cwd || self.root || self.exe || self.fd || self.mmap
    }

    /// `cwd`, `root`, `exe`, `fd`, `mmap`: those that hold, in that order.
    pub fn names(&self) -> Vec<&'static str> {
        [(self.cwd, "cwd"), (self.root, "root"), (self.exe, "exe"), (self.fd, "fd"), (self.mmap, "mmap")]
            .into_iter()
            .filter_map(|(on, n)| on.then_some(n))
            .collect()
    }
}

/// What a holder is doing with PATH, and what it is.
#[derive(Clone, Debug, PartialEq)]
pub struct Holding {
    pub ways: Ways,
    /// The first fds that hold PATH, lowest first as the kernel lists them.
    pub fds: Vec<u32>,
    /// How many fds hold PATH in all.
    pub fd_count: u64,
    pub cpu_secs: f64,
    pub age_secs: u64,
    /// Its command line (arguments joined by spaces) as output shows it: the first 4 KiB.
    pub command: ShownCmdline,
    /// Where its executable is (`/proc/PID/exe`'s text), when readable.
    pub exe: Option<Vec<u8>>,
    /// Why it was read in part, when it was (it may hold PATH in more ways, or by more fds,
    /// than these).
    pub incomplete: Option<String>,
}

/// What reading one process found.
#[derive(Clone, Debug, PartialEq)]
pub enum Examined {
    Holds(Box<Holding>),
    Clear,
    /// Exited (or its pid was reused) while it was read.
    Gone,
    /// The caller may not read it: another account's process, read without root.
    Forbidden,
    /// Read in part (why): it may hold PATH.
    Incomplete(String),
}

/// Fds and mapping lines read by one run of `holders`, at most: each costs a syscall or a line
/// of text, and a machine of processes with 100,000 fds each would otherwise take minutes.
pub struct Budget(AtomicU64);

impl Budget {
    pub fn new(units: u64) -> Budget {
        Budget(AtomicU64::new(units))
    }

    fn take(&self) -> bool {
        self.0.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_ok()
    }
}

fn c(path: &str) -> CString {
    CString::new(path).expect("no NUL in a /proc path")
}

fn is_denied(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM))
}

/// Fields of a `stat` line after the comm (field 3 first): the comm may hold spaces and `)`.
fn stat_fields(stat: &[u8]) -> Option<Vec<&str>> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    Some(std::str::from_utf8(stat.get(close + 2..)?).ok()?.split_ascii_whitespace().collect())
}

/// Field `n` (1-based, as proc(5) numbers them) of a `stat` line's fields.
fn field(fields: &[&str], n: usize) -> Option<u64> {
    fields.get(n.checked_sub(3)?)?.parse().ok()
}

fn read_all(dir: RawFd, path: &str, max: usize) -> io::Result<Vec<u8>> {
    let f = std::fs::File::from(sys::open_read(dir, &c(path))?);
    let mut buf = Vec::new();
    f.take(max as u64).read_to_end(&mut buf)?;
    Ok(buf)
}

/// What one pass over a process found so far.
#[derive(Default)]
struct Found {
    ways: Ways,
    fds: Vec<u32>,
    fd_count: u64,
    /// Why a part could not be read, when one could not.
    partial: Option<String>,
}

impl Found {
    fn place(&mut self, place: Place, way: impl FnOnce(&mut Ways)) -> bool {
        match place {
            Place::Inside => {
                way(&mut self.ways);
                true
            }
            Place::Outside => false,
            Place::Unknown(why) => {
                self.partial.get_or_insert_with(|| why.to_string());
                false
            }
        }
    }
}

/// Reads process `p` (see the module doc).
pub fn examine(within: &Within, p: &ProcState, budget: &Budget, progress: &Progress) -> Examined {
    let pid = p.id.pid;
    crate::daemon::fault::hang_if("holders_read", u64::from(pid));
    let dir = match sys::open_path(sys::CWD, &c(&format!("/proc/{pid}")), true) {
        Ok(d) => d,
        Err(_) => return Examined::Gone,
    };
    let d = dir.as_raw_fd();
    let Ok(stat) = read_all(d, "stat", 4096) else { return Examined::Gone };
    let Some(fields) = stat_fields(&stat) else { return Examined::Gone };
    if field(&fields, 22) != Some(p.id.start_ticks) {
        return Examined::Gone;
    }
    let zombie_leader = fields.first() == Some(&"Z");
    let threads = field(&fields, 20).unwrap_or(1);
    let tids = if threads > 1 || zombie_leader { list_tasks(d, pid) } else { vec![pid] };
    let mut found = Found::default();
    let (mut fs_tables, mut fd_tables): (Vec<u32>, Vec<u32>) = (Vec::new(), Vec::new());
    // The task whose links name the process's memory (exe, maps, cmdline): a live thread.
    let mut mm = (!zombie_leader).then_some(pid);
    for &tid in &tids {
        progress.tick();
        let prefix = if tid == pid { String::new() } else { format!("task/{tid}/") };
        if !shares(&fs_tables, tid, sys::KCMP_FS) {
            match within.place_of_link(d, &c(&format!("{prefix}cwd"))) {
                Ok(place) => {
                    found.place(place, |w| w.cwd = true);
                    if fs_tables.len() < MAX_TABLES {
                        fs_tables.push(tid);
                    }
                    mm.get_or_insert(tid);
                }
                Err(e) if is_denied(&e) => return Examined::Forbidden,
                Err(_) => {} // an exited leader's, or a thread gone meanwhile
            }
            if let Ok(place) = within.place_of_link(d, &c(&format!("{prefix}root"))) {
                found.place(place, |w| w.root = true);
            }
        }
        if !shares(&fd_tables, tid, sys::KCMP_FILES) {
            match read_fds(within, d, &format!("{prefix}fd"), budget, progress, &mut found) {
                Ok(true) if fd_tables.len() < MAX_TABLES => fd_tables.push(tid),
                Ok(_) => {}
                Err(e) if is_denied(&e) => return Examined::Forbidden,
                Err(_) => {}
            }
        }
    }
    let mm_prefix = match mm {
        Some(t) if t != pid => format!("task/{t}/"),
        _ => String::new(),
    };
    if mm.is_some() {
        if let Ok(place) = within.place_of_link(d, &c(&format!("{mm_prefix}exe"))) {
            found.place(place, |w| w.exe = true);
        }
        match read_maps(within, d, &format!("{mm_prefix}maps"), budget, progress, &mut found) {
            Err(e) if is_denied(&e) => return Examined::Forbidden,
            _ => {}
        }
    }
    if !found.ways.any() {
        return match found.partial {
            Some(why) => Examined::Incomplete(why),
            None => Examined::Clear,
        };
    }
    let (cpu_secs, age_secs) = cpu_and_age(&fields).unwrap_or((0.0, 0));
    let (head, omitted) = command(d, &mm_prefix, &fields);
    let command = ShownCmdline::of_prefix(&head, head.len() + omitted as usize);
    let exe = sys::read_link_at(d, &c(&format!("{mm_prefix}exe")), 4096).ok();
    Examined::Holds(Box::new(Holding {
        ways: found.ways,
        fds: found.fds,
        fd_count: found.fd_count,
        cpu_secs,
        age_secs,
        command,
        exe,
        incomplete: found.partial,
    }))
}

/// Whether `tid` shares the `kind` table with a task already read.
fn shares(tables: &[u32], tid: u32, kind: libc::c_int) -> bool {
    tables.iter().any(|&t| sys::kcmp_same(t, tid, kind) == Some(true))
}

fn list_tasks(dir: RawFd, pid: u32) -> Vec<u32> {
    let mut tids = vec![pid];
    if let Ok(fd) = sys::open_read(dir, c"task") {
        let mut e = Entries::new(fd);
        while let Some(name) = e.next_name() {
            if tids.len() >= MAX_TASKS {
                break;
            }
            if let Some(t) = std::str::from_utf8(name).ok().and_then(|s| s.parse().ok()).filter(|&t| t != pid) {
                tids.push(t);
            }
        }
    }
    tids
}

/// Every fd of one table; `Ok(false)` when it is not there (an exited leader's).
fn read_fds(
    within: &Within,
    dir: RawFd,
    path: &str,
    budget: &Budget,
    progress: &Progress,
    found: &mut Found,
) -> io::Result<bool> {
    let fd: OwnedFd = match sys::open_read(dir, &c(path)) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(false),
        Err(e) => return Err(e),
    };
    let mut entries = Entries::new(fd);
    let mut link = format!("{path}/");
    let base = link.len();
    while let Some(name) = entries.next_name() {
        if !budget.take() {
            found.partial.get_or_insert_with(|| "over the read budget of this run".into());
            break;
        }
        progress.tick();
        let Some(n) = std::str::from_utf8(name).ok().and_then(|s| s.parse::<u32>().ok()) else { continue };
        link.truncate(base);
        link.push_str(&n.to_string());
        match within.place_of_link(dir, &c(&link)) {
            Ok(place) => {
                if found.place(place, |w| w.fd = true) {
                    found.fd_count += 1;
                    if found.fds.len() < MAX_FDS_LISTED {
                        found.fds.push(n);
                    }
                }
            }
            Err(e) if is_denied(&e) => return Err(e),
            Err(_) => {} // closed meanwhile
        }
    }
    Ok(true)
}

/// One file-backed `maps` line: device (the superblock's), inode, path text.
pub(super) fn parse_maps_line(line: &[u8]) -> Option<(u64, u64, &[u8])> {
    // start-end perms offset major:minor inode [spaces path]
    let mut rest = line;
    let mut next = || {
        let start = rest.iter().position(|&b| b != b' ')?;
        let len = rest[start..].iter().position(|&b| b == b' ').unwrap_or(rest.len() - start);
        let word = &rest[start..start + len];
        rest = &rest[start + len..];
        Some(word)
    };
    let (_range, _perms, _offset, dev, ino) = (next()?, next()?, next()?, next()?, next()?);
    let ino: u64 = std::str::from_utf8(ino).ok()?.parse().ok()?;
    if ino == 0 {
        return None;
    }
    let (major, minor) = std::str::from_utf8(dev).ok()?.split_once(':')?;
    let dev = libc::makedev(u32::from_str_radix(major, 16).ok()?, u32::from_str_radix(minor, 16).ok()?);
    let path = &rest[rest.iter().position(|&b| b != b' ').unwrap_or(rest.len())..];
    Some((dev, ino, path))
}

/// The file-backed mappings until one holds PATH, one decision per run of mappings of one
/// file: through `PROCMAP_QUERY` where the kernel has it (no line formatted, a path only when
/// the device and inode do not settle it), else from `maps`' text.
fn read_maps(
    within: &Within,
    dir: RawFd,
    path: &str,
    budget: &Budget,
    progress: &Progress,
    found: &mut Found,
) -> io::Result<()> {
    let f = std::fs::File::from(sys::open_read(dir, &c(path))?);
    let mut addr = 0;
    let mut last: Option<(u64, u64)> = None;
    let mut name = Vec::new();
    loop {
        let (m, _) = match sys::query_mapping(f.as_raw_fd(), addr, None) {
            Ok(Some(q)) => q,
            Ok(None) => return Ok(()),
            Err(e) if addr == 0 && matches!(e.raw_os_error(), Some(libc::ENOTTY) | Some(libc::EINVAL)) => break,
            Err(e) => return Err(e),
        };
        if !budget.take() {
            found.partial.get_or_insert_with(|| "over the read budget of this run".into());
            return Ok(());
        }
        progress.tick();
        addr = m.end;
        if last == Some((m.dev, m.ino)) {
            continue;
        }
        last = Some((m.dev, m.ino));
        let text = || {
            name.resize(4097, 0);
            let (_, len) = sys::query_mapping(f.as_raw_fd(), m.start, Some(&mut name)).ok()??;
            Some((name[..len.min(4096)].to_vec(), false))
        };
        if found.place(within.place_of_mapping(dir, m.dev, m.ino, text), |w| w.mmap = true) {
            return Ok(());
        }
    }
    read_maps_text(within, dir, f, budget, progress, found)
}

/// [`read_maps`] from `maps`' text (kernels before 6.11).
fn read_maps_text(
    within: &Within,
    dir: RawFd,
    f: std::fs::File,
    budget: &Budget,
    progress: &Progress,
    found: &mut Found,
) -> io::Result<()> {
    let mut r = io::BufReader::with_capacity(64 * 1024, f);
    let mut line = Vec::with_capacity(256);
    let mut last: Option<(u64, u64)> = None;
    loop {
        line.clear();
        // A line is at most ~100 bytes plus a path (PATH_MAX, escaped): cap it anyway.
        if (&mut r).take(4 * 4096 + 256).read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        if !budget.take() {
            found.partial.get_or_insert_with(|| "over the read budget of this run".into());
            return Ok(());
        }
        progress.tick();
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        let Some((dev, ino, name)) = parse_maps_line(text) else { continue };
        if last == Some((dev, ino)) {
            continue;
        }
        last = Some((dev, ino));
        if found.place(within.place_of_mapping(dir, dev, ino, || Some((name.to_vec(), true))), |w| w.mmap = true) {
            return Ok(()); // one mapping says it; the rest would say nothing more
        }
    }
}

/// CPU seconds (utime + stime) and age from a `stat` line's fields.
fn cpu_and_age(fields: &[&str]) -> Option<(f64, u64)> {
    let hz = crate::event::clock_ticks_per_sec() as f64;
    let cpu = (field(fields, 14)? + field(fields, 15)?) as f64 / hz;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?.as_secs_f64();
    let age = (now - procfs::boot_unix() - field(fields, 22)? as f64 / hz).max(0.0) as u64;
    Some((cpu, age))
}

/// The first [`MAX_COMMAND_SHOWN`] bytes of the command line and how many were left out: from
/// `stat`'s `arg_start`/`arg_end` (fields 48 and 49) when it says, else counted up to
/// [`MAX_COMMAND_COUNTED`] (a rewritten argv can run past `arg_end`).
fn command(dir: RawFd, prefix: &str, fields: &[&str]) -> (Vec<u8>, u64) {
    let Ok(fd) = sys::open_read(dir, &c(&format!("{prefix}cmdline"))) else { return (Vec::new(), 0) };
    let mut f = std::fs::File::from(fd);
    let mut raw = Vec::with_capacity(MAX_COMMAND_SHOWN + 1);
    if (&mut f).take(MAX_COMMAND_SHOWN as u64 + 1).read_to_end(&mut raw).is_err() {
        return (Vec::new(), 0);
    }
    let mut not_shown = 0;
    if raw.len() > MAX_COMMAND_SHOWN {
        raw.truncate(MAX_COMMAND_SHOWN);
        let args = field(fields, 49).zip(field(fields, 48)).map(|(end, start)| end.saturating_sub(start));
        // arg_end counts the last argument's NUL, which is not shown.
        not_shown = match args.map(|a| a.saturating_sub(1)) {
            Some(len) if len > MAX_COMMAND_SHOWN as u64 => len - MAX_COMMAND_SHOWN as u64,
            _ => {
                let rest = io::copy(&mut (&mut f).take(MAX_COMMAND_COUNTED), &mut io::sink()).unwrap_or(0);
                1 + rest
            }
        };
    } else if raw.last() == Some(&0) {
        raw.pop();
    }
    for b in &mut raw {
        if *b == 0 {
            *b = b' ';
        }
    }
    (raw, not_shown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_give_device_inode_and_path() {
        let line = b"7f1c2a000000-7f1c2a022000 r--p 00000000 fd:01 1835132                    /usr/lib/x86_64-linux-gnu/libc.so.6";
        let (dev, ino, path) = parse_maps_line(line).unwrap();
        assert_eq!((dev, ino, path), (libc::makedev(0xfd, 1), 1835132, &b"/usr/lib/x86_64-linux-gnu/libc.so.6"[..]));
        let spaced = b"7f1c2a000000-7f1c2a022000 rw-s 00001000 00:2a 77  /home/a/x y (deleted)";
        assert_eq!(parse_maps_line(spaced).unwrap().2, b"/home/a/x y (deleted)");
        assert_eq!(parse_maps_line(b"7ffd5c5b4000-7ffd5c5d5000 rw-p 00000000 00:00 0     [stack]"), None);
        assert_eq!(parse_maps_line(b"garbage"), None);
        let big_minor = b"1000-2000 r--p 00000000 103:1a2 5 /x";
        assert_eq!(parse_maps_line(big_minor).unwrap().0, libc::makedev(0x103, 0x1a2));
    }

    #[test]
    fn stat_fields_are_numbered_as_proc_5_numbers_them() {
        let stat = b"42 (a) b) S 1 42 42 0 -1 4194560 100 0 0 0 170 30 0 0 20 0 3 0 987654 1000";
        let f = stat_fields(stat).unwrap();
        assert_eq!(f[0], "S");
        assert_eq!(
            (field(&f, 14), field(&f, 15), field(&f, 20), field(&f, 22)),
            (Some(170), Some(30), Some(3), Some(987654))
        );
    }

    /// The mapping query and the text of `maps` (what kernels before 6.11 have) find the same.
    #[test]
    fn a_mapped_and_closed_file_is_found_by_the_query_and_by_the_text() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("m (deleted)");
        std::fs::write(&file, b"x").unwrap();
        let within = Within::new(super::super::Target::open(dir.path()).unwrap());
        let f = std::fs::File::open(&file).unwrap();
        // SAFETY: a fresh read-only mapping, never touched, unmapped below.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0) };
        assert_ne!(p, libc::MAP_FAILED);
        drop(f);
        let (budget, progress) = (Budget::new(1 << 20), Progress::default());
        let mut by_query = Found::default();
        read_maps(&within, sys::CWD, "/proc/self/maps", &budget, &progress, &mut by_query).unwrap();
        let mut by_text = Found::default();
        let maps = std::fs::File::from(sys::open_read(sys::CWD, c"/proc/self/maps").unwrap());
        read_maps_text(&within, sys::CWD, maps, &budget, &progress, &mut by_text).unwrap();
        unsafe { libc::munmap(p, 4096) };
        assert!(by_query.ways.mmap && by_text.ways.mmap);
        let mut after = Found::default();
        read_maps(&within, sys::CWD, "/proc/self/maps", &budget, &progress, &mut after).unwrap();
        assert!(!after.ways.mmap, "unmapped");
    }

    #[test]
    fn a_long_command_line_is_shown_to_4_kib_with_the_bytes_left_out() {
        // sleep sums its arguments: 30 s and a 10,000-digit zero.
        let long = "0".repeat(10_000);
        // A name of its own: other tests of this binary end piles of `sleep`.
        let bin = tempfile::tempdir().unwrap();
        let exe = bin.path().join("gholdcmd");
        // A link, not a copy: a copy still open for writing in this process when another test's
        // child forks cannot be exec'd (ETXTBSY). The kernel names the process after the link.
        std::os::unix::fs::symlink("/bin/sleep", &exe).unwrap();
        let mut child = std::process::Command::new(&exe).args(["30", &long]).spawn().unwrap();
        let dir = sys::open_path(sys::CWD, &c(&format!("/proc/{}", child.id())), true).unwrap();
        let mut shown = Vec::new();
        let mut last = (Vec::new(), 0);
        // Until the child has exec'd (a loaded machine can take seconds to get there).
        let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::time::Instant::now() < until {
            let stat = read_all(dir.as_raw_fd(), "stat", 4096).unwrap();
            let fields = stat_fields(&stat).unwrap();
            let got = command(dir.as_raw_fd(), "", &fields);
            last = got.clone();
            let head = format!("{} 30 ", exe.display());
            if got.0.starts_with(head.as_bytes()) {
                // Read again: the stat above may predate the exec (its argument bounds were the
                // parent's), while the command line was read after it.
                let stat = read_all(dir.as_raw_fd(), "stat", 4096).unwrap();
                let got = command(dir.as_raw_fd(), "", &stat_fields(&stat).unwrap());
                shown = got.0.clone();
                assert_eq!(got.1, (head.len() + 10_000 - MAX_COMMAND_SHOWN) as u64);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let seen = String::from_utf8_lossy(&last.0[..last.0.len().min(80)]).into_owned();
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(shown.len(), MAX_COMMAND_SHOWN, "the command line was never read whole: {seen:?}, {}", last.1);
    }
}
