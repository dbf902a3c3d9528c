//! Reading /proc: the bootstrap and resync snapshot, the audit, the `procfs` backend, command
//! lines, and the identity re-check before every signal.
//!
//! Field meanings: proc(5). `stat` field 22 (`starttime`) is `task->start_boottime` in clock
//! ticks (fs/proc/array.c), the same clock the BPF programs report in ns.
use std::{fs, io};

use guard_common::PF_KTHREAD;

use crate::{
    budget::{Budget, Fill, Stop, PROC_FILE_BYTES},
    comm::Comm,
    event::{ProcId, ProcState},
};

/// What `stat` tells us about one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    pub comm: Comm,
    /// One-letter state (R, S, D, Z, X, …).
    pub state: u8,
    pub flags: u32,
    pub start_ticks: u64,
}

/// Parses `/proc/PID/stat`. The comm sits in parentheses and may itself contain `)` and
/// spaces, so the fields after it are found from the *last* `)`.
pub fn parse_stat(buf: &[u8]) -> Option<Stat> {
    let open = buf.iter().position(|&b| b == b'(')?;
    let close = buf.iter().rposition(|&b| b == b')')?;
    if close < open {
        return None;
    }
    let comm = Comm::new(&buf[open + 1..close]);
    let rest = std::str::from_utf8(buf.get(close + 2..)?).ok()?;
    // rest starts at field 3 (state); field n is rest[n - 3].
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.as_bytes().first().copied()?;
    let flags = fields.nth(5)?.parse::<u32>().ok()?; // field 9
    let start_ticks = fields.nth(12)?.parse::<u64>().ok()?; // field 22
    Some(Stat { comm, state, flags, start_ticks })
}

/// The effective uid from `/proc/PID/status` (`Uid: real effective saved fs`), for the
/// processes whose /proc directory owner does not say it (see [`snapshot`]).
///
/// Read as bytes, line by line: the `Name:` line holds the process's name with only line breaks
/// and backslashes escaped (`proc_task_name(m, p, true)`), so any other byte comes raw, and a
/// name that is not UTF-8 must not hide the process (a scan would not count it, the enforcer's
/// identity check would never pass).
pub fn parse_status_euid(buf: &[u8]) -> Option<u32> {
    let line = buf.split(|&b| b == b'\n').find(|l| l.starts_with(b"Uid:"))?;
    std::str::from_utf8(line).ok()?.split_ascii_whitespace().nth(2)?.parse().ok()
}

/// Reads one process's live state; `None` when it is gone, a kernel thread, or a zombie whose
/// whole group has exited. A zombie leader whose other threads still run counts (docs/architecture.md:
/// until the whole group has exited). The euid is exact: see [`snapshot`].
pub fn read_process(pid: u32, buf: &mut Vec<u8>) -> Option<ProcState> {
    proc_fd()?.read_process(pid, buf)
}

/// `/proc`, opened once for the life of the process.
fn proc_fd() -> Option<&'static ProcDir> {
    static PROC: std::sync::OnceLock<Option<ProcDir>> = std::sync::OnceLock::new();
    PROC.get_or_init(|| ProcDir::open().ok()).as_ref()
}

fn has_live_threads(pid: u32) -> bool {
    fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.count() > 1).unwrap_or(false)
}

/// Every live process on the machine (not only the account's: a setuid can move a process
/// into the account, and the table tracks all of them).
///
/// This is the bootstrap's critical path (10,000 processes: bench figure 4), so it is faster
/// than [`read_process`] per pid, with the same result:
/// - the effective uid comes from the owner of `/proc/PID` when that owner is exact, which saves
///   reading (and the kernel formatting) `status`, the most expensive file: the directory's
///   owner is the euid as our user namespace maps it, dumpable or not (`task_dump_owner` makes
///   a non-dumpable process's *files* root's, not its directory), so a non-zero owner of a
///   process in *our* user namespace (the initial one: loading BPF needs it) is its euid;
///   anything else (euid 0, a process in another user namespace) reads `status`;
/// - paths are resolved from one `/proc` directory fd;
/// - the pids are split over up to 4 threads (fewer if threads cannot be created: a host whose
///   pid space a fork bomb has exhausted still gets its scan, in this thread).
pub fn snapshot() -> io::Result<Vec<ProcState>> {
    let proc = proc_fd().ok_or_else(|| io::Error::other("cannot open /proc"))?;
    let pids: Vec<u32> =
        fs::read_dir("/proc")?.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()).collect();
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).clamp(1, 4);
    let chunk = pids.len().div_ceil(threads).max(256);
    let scan = |pids: &[u32]| -> Vec<ProcState> {
        let mut buf = Vec::with_capacity(2048);
        pids.iter().filter_map(|&pid| proc.read_process(pid, &mut buf)).collect()
    };
    let mut out = Vec::with_capacity(pids.len());
    std::thread::scope(|sc| {
        let mut chunks = pids.chunks(chunk);
        let first = chunks.next().unwrap_or(&[]);
        let mut handles = Vec::new();
        let mut inline = Vec::new();
        for c in chunks {
            match std::thread::Builder::new().name("guard-scan".into()).spawn_scoped(sc, || scan(c)) {
                Ok(h) => handles.push(h),
                Err(_) => inline.push(c),
            }
        }
        out.extend(scan(first));
        for c in inline {
            out.extend(scan(c));
        }
        for h in handles {
            out.extend(h.join().expect("a /proc scan thread panicked"));
        }
    });
    Ok(out)
}

/// An open `/proc`, for resolving `PID/…` without walking `/proc` each time.
struct ProcDir {
    fd: std::os::fd::OwnedFd,
    /// (st_dev, st_ino) of this process's user namespace; `None` (a kernel without user
    /// namespaces) reads `status` for every process.
    own_userns: Option<(u64, u64)>,
}

impl ProcDir {
    fn open() -> io::Result<ProcDir> {
        use std::os::unix::fs::MetadataExt;
        let ns = fs::metadata("/proc/self/ns/user").ok().map(|ns| (ns.dev(), ns.ino()));
        let dir = fs::File::open("/proc")?;
        Ok(ProcDir { fd: dir.into(), own_userns: ns })
    }

    fn stat_at(&self, path: &std::ffi::CStr) -> Option<libc::stat> {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid dirfd, a NUL-terminated path, and a stat buffer we own.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            (libc::fstatat(self.fd.as_raw_fd(), path.as_ptr(), &mut st, 0) == 0).then_some(st)
        }
    }

    fn open_at(&self, path: &std::ffi::CStr) -> Option<fs::File> {
        use std::os::fd::{AsRawFd, FromRawFd};
        // SAFETY: openat on a valid dirfd; the fd is owned by the File from here on.
        let fd = unsafe { libc::openat(self.fd.as_raw_fd(), path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        (fd >= 0).then(|| unsafe { fs::File::from_raw_fd(fd) })
    }

    /// A small /proc file, at most [`PROC_FILE_BYTES`] of it (what the scan needs is at its start).
    fn read_at(&self, path: &std::ffi::CStr, buf: &mut Vec<u8>) -> Option<()> {
        let mut f = self.open_at(path)?;
        Budget::bytes(PROC_FILE_BYTES).fill(&mut f, PROC_FILE_BYTES, buf).ok()?;
        Some(())
    }

    /// One process (see [`read_process`]), the euid from the directory's owner when that is
    /// exact, else from `status`.
    fn read_process(&self, pid: u32, buf: &mut Vec<u8>) -> Option<ProcState> {
        let path = |leaf: &str| std::ffi::CString::new(format!("{pid}{leaf}")).unwrap();
        self.read_at(&path("/stat"), buf)?;
        let stat = parse_stat(buf)?;
        if stat.flags & PF_KTHREAD != 0 || stat.state == b'X' {
            return None;
        }
        if stat.state == b'Z' && !has_live_threads(pid) {
            return None;
        }
        let owner = self.stat_at(&path("")).map(|st| st.st_uid).filter(|&uid| uid != 0);
        let in_our_userns = || {
            self.own_userns.is_some_and(|own| {
                self.stat_at(&path("/ns/user")).is_some_and(|st| ({ st.st_dev }, { st.st_ino }) == own)
            })
        };
        let euid = match owner {
            Some(uid) if in_our_userns() => uid,
            _ => {
                self.read_at(&path("/status"), buf)?;
                parse_status_euid(buf)?
            }
        };
        Some(ProcState { id: ProcId { pid, start_ticks: stat.start_ticks }, euid, comm: stat.comm })
    }
}

/// What reading one command line gave (see [`read_cmdline`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmdRead {
    /// The buffer holds it: the whole command line, or, when it is longer than the `max` asked
    /// for, its first `max + 1` bytes (so the caller knows it cannot be matched whole).
    Text,
    /// The process is gone (or was never there).
    Gone,
    /// The budget stopped the read before the end: its deadline, or its bytes.
    Stopped(Stop),
}

/// The command line as docs/configuration.md defines it: NUL-separated arguments joined by
/// single spaces, no trailing space; kernel threads and zombies have an empty one. Read into
/// `buf` through `budget`: at most `max + 1` bytes, in [`crate::budget::CHUNK`]s with the
/// deadline checked between them, so a process that makes its own memory slow to read (the
/// kernel reads a command line page by page under the process's memory-map lock) costs at most
/// one chunk past the deadline.
pub fn read_cmdline(pid: u32, max: usize, budget: &mut Budget, buf: &mut Vec<u8>) -> CmdRead {
    buf.clear();
    if let Err(stop) = budget.in_time() {
        return CmdRead::Stopped(stop);
    }
    let path = std::ffi::CString::new(format!("{pid}/cmdline")).expect("no NUL in a number");
    let Some(mut f) = proc_fd().and_then(|p| p.open_at(&path)) else { return CmdRead::Gone };
    match budget.fill(&mut f, max.saturating_add(1), buf) {
        Ok(Fill::Stopped(stop)) => return CmdRead::Stopped(stop),
        Ok(Fill::Whole | Fill::Full) => {}
        Err(_) => return CmdRead::Gone,
    }
    join_arguments(buf, max);
    CmdRead::Text
}

/// NULs between arguments become spaces; the last argument's NUL goes (unless the text was cut).
fn join_arguments(raw: &mut Vec<u8>, max: usize) {
    if raw.len() <= max && raw.last() == Some(&0) {
        raw.pop();
    }
    for b in raw.iter_mut() {
        if *b == 0 {
            *b = b' ';
        }
    }
}

/// Whether process `pid` is there (its /proc directory opens; a zombie is there too).
pub fn exists(pid: u32) -> bool {
    let path = std::ffi::CString::new(format!("{pid}/cmdline")).expect("no NUL in a number");
    proc_fd().and_then(|p| p.open_at(&path)).is_some()
}


/// The live processes of `euid` with their group CPU time in ns (`stat` fields 14 and 15,
/// utime + stime, in clock ticks): the stall watch's sample where the BPF task iterator is not
/// available. One /proc pass: its cost grows with the machine's processes, which is why the
/// iterator is preferred.
pub fn cpu_sample(euid: u32) -> io::Result<Vec<(ProcState, u64)>> {
    let proc = proc_fd().ok_or_else(|| io::Error::other("cannot open /proc"))?;
    let ns_per_tick = 1_000_000_000 / crate::event::clock_ticks_per_sec();
    let mut buf = Vec::with_capacity(1024);
    let mut out = Vec::new();
    for e in fs::read_dir("/proc")? {
        let Some(pid) = e.ok().and_then(|e| e.file_name().to_str()?.parse::<u32>().ok()) else { continue };
        let Some(p) = proc.read_process(pid, &mut buf) else { continue };
        if p.euid != euid {
            continue;
        }
        let path = std::ffi::CString::new(format!("{pid}/stat")).expect("no NUL");
        if proc.read_at(&path, &mut buf).is_none() {
            continue;
        }
        let Some(ticks) = parse_stat_cpu(&buf) else { continue };
        out.push((p, ticks * ns_per_tick));
    }
    Ok(out)
}

/// utime + stime (fields 14 and 15) of a `stat` line, in clock ticks.
pub fn parse_stat_cpu(buf: &[u8]) -> Option<u64> {
    let close = buf.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(buf.get(close + 2..)?).ok()?;
    // rest starts at field 3; fields 14 and 15 are rest[11] and rest[12].
    let mut f = rest.split_ascii_whitespace().skip(11);
    Some(f.next()?.parse::<u64>().ok()? + f.next()?.parse::<u64>().ok()?)
}

/// When the machine booted, unix seconds (`btime` of `/proc/stat`), read once: with a start time
/// in clock ticks since boot it gives a process's age. 0 when unreadable.
pub fn boot_unix() -> f64 {
    static BOOT: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *BOOT.get_or_init(|| {
        let stat = fs::read_to_string("/proc/stat").unwrap_or_default();
        stat.lines().find_map(|l| l.strip_prefix("btime ")?.trim().parse::<f64>().ok()).unwrap_or(0.0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_parentheses_and_spaces_in_the_comm_parses() {
        let line = b"4242 (we ird) (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100 18446744073709551615";
        let s = parse_stat(line).unwrap();
        assert_eq!(s.comm.as_bytes(), b"we ird) (x)");
        assert_eq!(s.state, b'S');
        assert_eq!(s.flags, 4194560);
        assert_eq!(s.start_ticks, 987654);
    }

    /// The kernel writes the comm raw (fs/proc/array.c, `proc_task_name(m, task, false)`): any
    /// byte but NUL, so a name can fake the fields after it or hold a line break.
    #[test]
    fn stat_of_a_hostile_fifteen_byte_name_gives_all_its_bytes() {
        for name in [&b"x) R 9 9\n\xff ( \n)"[..], b") S 1 (\xfe\t\x1b=\\ \n\n", b"(((((((((((((((", b"               "]
        {
            let mut line = b"4242 (".to_vec();
            line.extend_from_slice(name);
            line.extend_from_slice(b") S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100\n");
            let s = parse_stat(&line).unwrap_or_else(|| panic!("{:?}", Comm::new(name)));
            assert_eq!((s.comm.as_bytes(), s.state, s.start_ticks), (name, b'S', 987654));
        }
    }

    #[test]
    fn stat_cpu_is_utime_plus_stime() {
        let line = b"4242 (a) b) R 1 4242 4242 0 -1 4194560 100 0 0 0 170 30 0 0 20 0 1 0 987654 1000";
        assert_eq!(parse_stat_cpu(line), Some(200));
    }

    #[test]
    fn status_gives_the_effective_uid_not_the_real_one() {
        let status = b"Name:\tsu\nUmask:\t0022\nState:\tS\nUid:\t1000\t0\t0\t0\nGid:\t1000\t1000\t1000\t1000\n";
        assert_eq!(parse_status_euid(status), Some(0));
    }

    #[test]
    fn status_of_a_process_whose_name_is_not_utf8_gives_its_euid() {
        let status = b"Name:\tx)\\ R\\n\xff\nUmask:\t0022\nState:\tS\nUid:\t4201\t4201\t4201\t4201\n";
        assert_eq!(parse_status_euid(status), Some(4201));
    }

    /// The euid shortcut (the /proc/PID owner) agrees with `status` for every process,
    /// including a non-dumpable one of another uid (whose files, not its directory, root owns).
    #[test]
    fn the_snapshot_agrees_with_status_for_every_process() {
        let mut kids = Vec::new();
        if unsafe { libc::geteuid() } == 0 {
            for dumpable in [1, 0] {
                // SAFETY: the child only makes raw syscalls, then pauses until killed.
                let pid = unsafe { libc::fork() };
                if pid == 0 {
                    unsafe {
                        libc::prctl(libc::PR_SET_DUMPABLE, dumpable);
                        libc::syscall(libc::SYS_setresuid, 4242, 4242, 4242);
                        libc::prctl(libc::PR_SET_DUMPABLE, dumpable);
                        loop {
                            libc::pause();
                        }
                    }
                }
                kids.push(pid as u32);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        } else {
            eprintln!(
                "the_snapshot_agrees_with_status: not root, so no process of another uid is made (own processes only)"
            );
        }
        let snap = snapshot().unwrap();
        let mut compared = 0;
        for p in &snap {
            let Ok(status) = fs::read(format!("/proc/{}/status", p.id.pid)) else { continue };
            let Ok(stat) = fs::read(format!("/proc/{}/stat", p.id.pid)) else { continue };
            if parse_stat(&stat).map(|s| s.start_ticks) == Some(p.id.start_ticks) {
                assert_eq!(parse_status_euid(&status), Some(p.euid), "pid {}", p.id.pid);
                compared += 1;
            }
        }
        for k in &kids {
            let p = snap.iter().find(|p| p.id.pid == *k).expect("the child is in the snapshot");
            assert_eq!(p.euid, 4242, "child {k}");
            unsafe { libc::kill(*k as i32, libc::SIGKILL) };
            unsafe { libc::waitpid(*k as i32, std::ptr::null_mut(), 0) };
        }
        assert!(compared > 2, "compared {compared}");
    }

    #[test]
    fn this_process_reads_back_with_its_own_uid_and_start_time() {
        let me = std::process::id();
        let mut buf = Vec::new();
        let p = read_process(me, &mut buf).unwrap();
        assert_eq!(p.euid, unsafe { libc::geteuid() });
        let stat = fs::read(format!("/proc/{me}/stat")).unwrap();
        assert_eq!(p.id.start_ticks, parse_stat(&stat).unwrap().start_ticks);
        assert!(snapshot().unwrap().iter().any(|q| q.id == p.id));
    }

    #[test]
    fn cmdline_joins_arguments_with_single_spaces() {
        // Two commands, so the shell stays (with one, bash and dash exec it in place of themselves,
        // and a slow guest read the command line only after that).
        let mut child = std::process::Command::new("sh").args(["-c", "sleep 30; :", "x", ""]).spawn().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut line = Vec::new();
        while std::time::Instant::now() < deadline {
            line.clear();
            let read = read_cmdline(child.id(), 1 << 20, &mut Budget::bytes(usize::MAX), &mut line);
            assert_eq!(read, CmdRead::Text);
            if line.starts_with(b"sh") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(line, b"sh -c sleep 30; : x ");
    }
}
