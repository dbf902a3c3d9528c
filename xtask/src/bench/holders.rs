//! The `holders` figure: `guard-user holders DIR` against `lsof +D DIR` and `fuser -m DIR` on
//! one checkout of 20,000 files (200 directories of 100) held by 2,000 processes of the account
//! (1,000 working in one of its directories, 500 with one of its files open, 500 with one
//! mapped and closed), all three run as root over the whole machine, one after the other in
//! each repetition. Reported: each one's wall time and CPU (its children's user + system time,
//! getrusage), how many processes each listed, and the ratios to `holders`.
use std::{
    ffi::CString,
    fs,
    os::unix::ffi::OsStrExt,
    path::Path,
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::Context as _;
use serde_json::{json, Value};

use super::{
    procs::{become_account, children_cpu_secs, Account},
    Bench, Row,
};

const DIRS: usize = 200;
const FILES_PER_DIR: usize = 100;
const HOLDERS: usize = 2_000;

/// The holding processes; killed and reaped on drop.
struct Holding(Vec<libc::pid_t>);

impl Drop for Holding {
    fn drop(&mut self) {
        for &pid in &self.0 {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        for &pid in &self.0 {
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
        }
    }
}

/// The checkout: `d<i>/f<j>`, each file one byte (so it can be mapped).
fn checkout(dir: &Path) -> anyhow::Result<()> {
    let _ = fs::remove_dir_all(dir);
    for i in 0..DIRS {
        let d = dir.join(format!("d{i}"));
        fs::create_dir_all(&d)?;
        for j in 0..FILES_PER_DIR {
            fs::write(d.join(format!("f{j}")), b"x")?;
        }
    }
    Ok(())
}

/// Forks the holders (xtask is single-threaded here; each child makes raw syscalls only).
fn spawn(dir: &Path, who: Account) -> anyhow::Result<Holding> {
    let comm = CString::new("gbhold")?;
    let paths: Vec<CString> = (0..HOLDERS)
        .map(|k| {
            let d = dir.join(format!("d{}", k % DIRS));
            let p = if k < HOLDERS / 2 { d } else { d.join(format!("f{}", k % FILES_PER_DIR)) };
            CString::new(p.as_os_str().as_bytes())
        })
        .collect::<Result<_, _>>()?;
    let mut held = Holding(Vec::with_capacity(HOLDERS));
    for (k, path) in paths.iter().enumerate() {
        // SAFETY: single-threaded parent; the child makes only raw syscalls and never returns.
        let pid = unsafe { libc::fork() };
        anyhow::ensure!(pid >= 0, "fork failed after {k} holders: {}", std::io::Error::last_os_error());
        if pid == 0 {
            unsafe {
                if k < HOLDERS / 2 {
                    libc::chdir(path.as_ptr());
                } else {
                    libc::chdir(c"/".as_ptr());
                    let fd = libc::open(path.as_ptr(), libc::O_RDONLY);
                    if k >= HOLDERS * 3 / 4 {
                        libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_SHARED, fd, 0);
                        libc::close(fd);
                    }
                }
                become_account(&comm, who);
                loop {
                    libc::pause();
                }
            }
        }
        held.0.push(pid);
    }
    Ok(held)
}

/// One run of `cmd`: (wall s, CPU s, pids it listed by `pids_of` its stdout).
fn timed(cmd: &mut Command, pids_of: impl Fn(&str) -> usize) -> anyhow::Result<(f64, f64, usize)> {
    let before = children_cpu_secs();
    let start = Instant::now();
    let out = cmd.stderr(Stdio::null()).output().with_context(|| format!("running {cmd:?}"))?;
    let wall = start.elapsed().as_secs_f64();
    Ok((wall, children_cpu_secs() - before, pids_of(&String::from_utf8_lossy(&out.stdout))))
}

/// Distinct numbers in column `col` (0-based) of the lines after the first `skip` (lsof's PIDs).
fn distinct(text: &str, skip: usize, col: usize) -> usize {
    let pids: std::collections::BTreeSet<u32> =
        text.lines().skip(skip).filter_map(|l| l.split_whitespace().nth(col)?.parse().ok()).collect();
    pids.len()
}

impl Bench<'_> {
    pub(super) fn holders(
        &mut self,
        rows: &mut Vec<Row>,
        raw: &mut serde_json::Map<String, Value>,
    ) -> anyhow::Result<()> {
        for tool in ["lsof", "fuser"] {
            anyhow::ensure!(
                crate::build_ebpf::which(tool).is_some(),
                "the holders figure compares with {tool}: apt-get install lsof psmisc"
            );
        }
        let dir = self.out.join("holders-checkout");
        checkout(&dir)?;
        let t = Instant::now();
        let _held = spawn(&dir, self.who)?;
        println!("bench: {HOLDERS} holders of {} files up in {:.2} s", DIRS * FILES_PER_DIR, t.elapsed().as_secs_f64());
        let mut s: [Vec<f64>; 9] = Default::default();
        for rep in 0..self.opts.reps {
            println!("bench: holders {}/{}", rep + 1, self.opts.reps);
            // Text output, as an operator reads it: a headline, a header, one row per holder.
            let g = timed(Command::new(&self.binary).arg("holders").arg(&dir), |t| {
                // The headline ends `: N hold it` (`none holds it`).
                let count = t.lines().next().and_then(|l| l.rsplit(": ").next()?.split(' ').next()?.parse().ok());
                count.unwrap_or(0)
            })?;
            let l = timed(Command::new("lsof").arg("+D").arg(&dir), |t| distinct(t, 1, 1))?;
            // fuser prints the pids on stdout and the access letters on stderr.
            let f = timed(Command::new("fuser").arg("-m").arg(&dir), |t| {
                t.split_whitespace()
                    .filter_map(|w| w.parse::<u32>().ok())
                    .collect::<std::collections::BTreeSet<_>>()
                    .len()
            })?;
            for (i, (wall, cpu, n)) in [g, l, f].into_iter().enumerate() {
                s[i].push(wall * 1e3);
                s[3 + i].push(cpu * 1e3);
                s[6 + i].push(n as f64);
            }
        }
        let ratio = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x / y.max(1e-9)).collect::<Vec<_>>();
        let n = format!("{HOLDERS} holders, {} files", DIRS * FILES_PER_DIR);
        rows.push(Row::info(format!("guard-user holders (wall), {n}"), s[0].clone(), "ms"));
        rows.push(Row::info(format!("guard-user holders (CPU), {n}"), s[3].clone(), "ms"));
        rows.push(Row::info(format!("lsof +D (CPU), {n}"), s[4].clone(), "ms"));
        rows.push(Row::info(format!("lsof +D (wall), {n}"), s[1].clone(), "ms"));
        rows.push(Row::info(format!("fuser -m (wall), {n}"), s[2].clone(), "ms"));
        rows.push(Row::info("lsof +D / guard-user holders (wall)", ratio(&s[1], &s[0]), "×"));
        rows.push(Row::info("fuser -m / guard-user holders (wall)", ratio(&s[2], &s[0]), "×"));
        // CPU, not wall: on a shared machine the wall time is mostly waiting for a core.
        rows.push(Row::at_least("lsof +D / guard-user holders (CPU)", ratio(&s[4], &s[3]), "×", 3.0));
        rows.push(Row::info("fuser -m / guard-user holders (CPU)", ratio(&s[5], &s[3]), "×"));
        rows.push(Row::at_least("holders found by guard-user holders", s[6].clone(), "", HOLDERS as f64));
        rows.push(Row::info("holders found by lsof +D", s[7].clone(), ""));
        rows.push(Row::info("processes found by fuser -m (the whole filesystem)", s[8].clone(), ""));
        raw.insert(
            "holders".into(),
            json!({"holders": HOLDERS, "files": DIRS * FILES_PER_DIR, "wall_ms": {"guard": s[0], "lsof": s[1], "fuser": s[2]},
                   "cpu_ms": {"guard": s[3], "lsof": s[4], "fuser": s[5]},
                   "found": {"guard": s[6], "lsof": s[7], "fuser": s[8]}}),
        );
        let _ = fs::remove_dir_all(&dir);
        Ok(())
    }
}
