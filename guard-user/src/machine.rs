//! The machine's process count for `status`, the metrics (`guard_machine_processes`) and the
//! heartbeat: what `ps -e` counts, from one `stat("/proc")` instead of a table of every process.
//!
//! The kernel keeps a count of processes (`nr_processes()`: thread-group leaders, kernel
//! threads included, a zombie until it is reaped) and reports it as part of the link count of
//! `/proc` (fs/proc/root.c, `proc_root_getattr`: `nlink = proc_root.nlink + nr_processes()`).
//! `ps -e` lists the numeric entries of `/proc`, which are the same processes, so the two agree
//! (in the initial pid namespace, where the daemon runs: a container's `/proc` lists its own).
//! `proc_root.nlink` is the link count of `/proc` itself (2 plus the subdirectories the kernel
//! registered there), a constant for the kernel's life except when a module adds or removes a
//! directory under `/proc`: it is measured by counting the numeric entries once while the link
//! count holds still, and measured again every [`RECALIBRATE`].
use std::{
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// How often the link count of `/proc` without its processes is measured again.
pub const RECALIBRATE: Duration = Duration::from_secs(600);

/// Attempts at a calibration whose link count holds still (processes come and go meanwhile).
const ATTEMPTS: usize = 5;

/// The machine's processes from the link count of a proc mount.
#[derive(Debug)]
pub struct MachineCount {
    proc: PathBuf,
    /// `proc_root.nlink`, and when it was measured.
    base: Option<(u64, Instant)>,
}

impl Default for MachineCount {
    fn default() -> Self {
        MachineCount::new("/proc")
    }
}

impl MachineCount {
    pub fn new(proc: impl Into<PathBuf>) -> MachineCount {
        MachineCount { proc: proc.into(), base: None }
    }

    /// Processes on the machine as `ps -e` counts them; `None` if `/proc` cannot be read.
    pub fn read(&mut self) -> Option<u64> {
        let stale = self.base.is_none_or(|(_, at)| at.elapsed() >= RECALIBRATE);
        if stale {
            if let Some(base) = calibrate(&self.proc) {
                self.base = Some((base, Instant::now()));
            }
        }
        let (base, _) = self.base?;
        Some(nlink(&self.proc)?.saturating_sub(base))
    }
}

fn nlink(proc: &Path) -> Option<u64> {
    fs::metadata(proc).ok().map(|m| m.nlink())
}

/// `proc_root.nlink`: the link count less the numeric entries, from a listing during which the
/// link count did not move (else `None` after a few attempts: the previous value stays).
fn calibrate(proc: &Path) -> Option<u64> {
    for _ in 0..ATTEMPTS {
        let before = nlink(proc)?;
        let pids = fs::read_dir(proc)
            .ok()?
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
            .count() as u64;
        if nlink(proc)? == before {
            return Some(base_from(before, pids));
        }
    }
    None
}

/// The link count without its processes (saturating: a listing can never hold more).
fn base_from(nlink: u64, pids: u64) -> u64 {
    nlink.saturating_sub(pids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_is_the_link_count_without_the_listed_processes() {
        assert_eq!(base_from(114, 105), 9);
        assert_eq!(base_from(3, 10), 0);
    }

    fn listed() -> u64 {
        fs::read_dir("/proc")
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
            .count() as u64
    }

    /// This machine's /proc: once calibrated, the count follows processes that start and end
    /// as the numeric entries of /proc do, which is what `ps -e` lists (each comparison is
    /// retried until nothing forked or exited between the two reads).
    #[test]
    fn the_count_follows_what_ps_e_lists() {
        let mut m = MachineCount::default();
        let agree = |m: &mut MachineCount| {
            for _ in 0..100 {
                let n = m.read().expect("/proc is readable");
                if listed() == n && m.read() == Some(n) {
                    return n;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            panic!("the link count of /proc never matched its listing");
        };
        agree(&mut m);
        let mut kids: Vec<_> =
            (0..30).map(|_| std::process::Command::new("sleep").arg("30").spawn().expect("spawn sleep")).collect();
        let with = agree(&mut m);
        for k in &mut kids {
            let _ = k.kill();
            let _ = k.wait();
        }
        let without = agree(&mut m);
        assert!(m.base.is_some_and(|(_, at)| at.elapsed() < RECALIBRATE), "calibrated once");
        assert!(with >= without + 25, "30 sleepers: {with} with them, {without} after (others come and go)");
    }

    #[test]
    fn a_mount_without_a_link_count_reads_as_none() {
        assert_eq!(MachineCount::new("/nonexistent/proc").read(), None);
    }
}
