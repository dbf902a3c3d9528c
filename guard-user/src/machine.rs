//! The machine's process count for `status`, the metrics (`guard_machine_processes`) and the
//! heartbeat: what `ps -e` counts, from one `stat("/proc")` instead of a table of every process.
//!
//! The kernel keeps a count of processes (`nr_processes()`: thread-group leaders, kernel
//! threads included, a zombie until it is reaped) and reports it as part of the link count of
//! `/proc` (fs/proc/root.c, `proc_root_getattr`: `nlink = proc_root.nlink + nr_processes()`).
//! `ps -e` lists the numeric entries of `/proc`, which are the same processes, so the two agree
//! (in the initial pid namespace, where the daemon runs: a container's `/proc` lists its own).
//! `proc_root.nlink` is the link count of `/proc` itself: 2 plus the subdirectories the kernel
//! registered there (`proc_register` counts each directory entry it adds), a constant for the
//! kernel's life except when a module adds or removes a directory under `/proc`. It is measured
//! as the link count less the pids of one whole listing (see [`calibrate`]), again every
//! [`RECALIBRATE`].
use std::{
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// How often the link count of `/proc` without its processes is measured again.
pub const RECALIBRATE: Duration = Duration::from_secs(600);

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

/// `proc_root.nlink`: the link count of `/proc` less the processes its listing has, taken when
/// nothing forked or exited between the two reads (a few tries; under a storm of forks the last
/// one, off by the few that came and went). The whole listing, not only the entries before the
/// first pid: on some kernels (5.10 here) the link count has registered entries the head of the
/// listing does not show. One listing every [`RECALIBRATE`] (names only: 0.2 s at 50,000
/// processes), never per tick.
fn calibrate(proc: &Path) -> Option<u64> {
    let mut last = None;
    for _ in 0..5 {
        let before = nlink(proc)?;
        let pids = fs::read_dir(proc)
            .ok()?
            .filter_map(Result::ok)
            .filter(|e| e.file_name().as_encoded_bytes().first().is_some_and(u8::is_ascii_digit))
            .count() as u64;
        last = Some(before.saturating_sub(pids));
        if nlink(proc)? == before {
            break;
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The base counted from the head of the listing is the link count less every process the
    /// whole listing has (retried until nothing forked or exited between the two reads).
    #[test]
    fn the_base_is_the_link_count_without_the_listed_processes() {
        let base = calibrate(Path::new("/proc")).unwrap();
        for _ in 0..100 {
            let before = nlink(Path::new("/proc")).unwrap();
            let pids = listed();
            if nlink(Path::new("/proc")) == Some(before) {
                assert_eq!(base, before - pids);
                return;
            }
        }
        panic!("the link count of /proc never held still");
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
