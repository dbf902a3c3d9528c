//! Reading /proc: the bootstrap and resync snapshot, the audit, the `procfs` backend, command
//! lines, and the identity re-check before every signal.
//!
//! Field meanings: proc(5). `stat` field 22 (`starttime`) is `task->start_boottime` in clock
//! ticks (fs/proc/array.c), the same clock the BPF programs report in ns.
use std::{
    fs,
    io::{self, Read},
    path::PathBuf,
};

use guard_common::PF_KTHREAD;

use crate::{
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

/// The effective uid from `/proc/PID/status` (`Uid: real effective saved fs`). /proc's
/// directory owner is not used: it shows root for non-dumpable (e.g. setuid) processes.
pub fn parse_status_euid(buf: &[u8]) -> Option<u32> {
    let text = std::str::from_utf8(buf).ok()?;
    let line = text.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_ascii_whitespace().nth(2)?.parse().ok()
}

fn read_small(path: &str, buf: &mut Vec<u8>) -> io::Result<()> {
    buf.clear();
    fs::File::open(path)?.read_to_end(buf)?;
    Ok(())
}

/// Reads one process's live state; `None` when it is gone, a kernel thread, or a zombie whose
/// whole group has exited. A zombie leader whose other threads still run counts (SPEC §1:
/// until the whole group has exited).
pub fn read_process(pid: u32, buf: &mut Vec<u8>) -> Option<ProcState> {
    read_small(&format!("/proc/{pid}/stat"), buf).ok()?;
    let stat = parse_stat(buf)?;
    if stat.flags & PF_KTHREAD != 0 || stat.state == b'X' {
        return None;
    }
    if stat.state == b'Z' && !has_live_threads(pid) {
        return None;
    }
    read_small(&format!("/proc/{pid}/status"), buf).ok()?;
    let euid = parse_status_euid(buf)?;
    Some(ProcState { id: ProcId { pid, start_ticks: stat.start_ticks }, euid, comm: stat.comm })
}

fn has_live_threads(pid: u32) -> bool {
    fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.count() > 1).unwrap_or(false)
}

/// Every live process on the machine (not only the account's: a setuid can move a process
/// into the account, and the table tracks all of them).
pub fn snapshot() -> io::Result<Vec<ProcState>> {
    let mut out = Vec::with_capacity(1024);
    let mut buf = Vec::with_capacity(2048);
    for entry in fs::read_dir("/proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if let Some(p) = read_process(pid, &mut buf) {
            out.push(p);
        }
    }
    Ok(out)
}

/// The command line as SPEC §3 defines it: NUL-separated arguments joined by single spaces,
/// no trailing space. `None` when the process is gone. Kernel threads and zombies have an
/// empty one.
pub fn cmdline(pid: u32) -> Option<Vec<u8>> {
    let mut raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    if raw.last() == Some(&0) {
        raw.pop();
    }
    for b in &mut raw {
        if *b == 0 {
            *b = b' ';
        }
    }
    Some(raw)
}

/// `/proc/PID` for a pid (used by the enforcer's identity check).
pub fn proc_dir(pid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}"))
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

    #[test]
    fn status_gives_the_effective_uid_not_the_real_one() {
        let status = b"Name:\tsu\nUmask:\t0022\nState:\tS\nUid:\t1000\t0\t0\t0\nGid:\t1000\t1000\t1000\t1000\n";
        assert_eq!(parse_status_euid(status), Some(0));
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
        let mut child = std::process::Command::new("sh").args(["-c", "sleep 30", "x", ""]).spawn().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut line = Vec::new();
        while std::time::Instant::now() < deadline {
            line = cmdline(child.id()).unwrap();
            if line.starts_with(b"sh") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(line, b"sh -c sleep 30 x ");
    }
}
