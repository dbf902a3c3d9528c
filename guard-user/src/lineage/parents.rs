//! Parent links from `/proc/PID/stat` (field 4, `ppid`), for the processes the lineage adopts
//! from a scan (see the module doc of [`crate::lineage`]). A read of `stat` formats the task's
//! fields without touching its memory, so a hostile process cannot make it block the way a
//! read of its `cmdline` can; it still runs on a blocking thread, off the pump.
use crate::event::ProcId;

/// `(ppid, start time in clock ticks)` from a `stat` line. The comm may hold `)` and spaces, so
/// fields are counted from the last `)`.
pub fn parse_stat_parent(buf: &[u8]) -> Option<(u32, u64)> {
    let close = buf.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(buf.get(close + 2..)?).ok()?;
    // rest starts at field 3 (state): ppid is field 4, starttime field 22.
    let mut fields = rest.split_ascii_whitespace();
    let ppid = fields.nth(1)?.parse().ok()?;
    let start = fields.nth(17)?.parse().ok()?;
    Some((ppid, start))
}

/// The parent pid of each process of `ids` that is still itself (same start time); the others
/// are left out (gone, or their pid reused).
pub fn read_parents(ids: &[ProcId]) -> Vec<(ProcId, u32)> {
    ids.iter()
        .filter_map(|id| {
            let buf = std::fs::read(format!("/proc/{}/stat", id.pid)).ok()?;
            let (ppid, start) = parse_stat_parent(&buf)?;
            (start == id.start_ticks).then_some((*id, ppid))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_comes_from_after_the_last_parenthesis_whatever_the_name_holds() {
        let line = b"4242 (x) 9 9 (y) S 4100 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100\n";
        assert_eq!(parse_stat_parent(line), Some((4100, 987654)));
        assert_eq!(parse_stat_parent(b"4242 (x) S"), None);
    }

    #[test]
    fn this_process_reads_back_with_its_real_parent() {
        let me = std::process::id();
        let stat = std::fs::read(format!("/proc/{me}/stat")).unwrap();
        let start = crate::procfs::parse_stat(&stat).unwrap().start_ticks;
        let id = ProcId { pid: me, start_ticks: start };
        // SAFETY: getppid has no preconditions.
        let ppid = unsafe { libc::getppid() } as u32;
        assert_eq!(read_parents(&[id, ProcId { pid: me, start_ticks: start + 1 }]), [(id, ppid)]);
    }
}
