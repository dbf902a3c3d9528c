//! The `snapshot` figure: one view of every process of the machine, from /proc and from the BPF
//! task iterator, with 10,000 idle processes of the account.
//!
//! - start-up: spawn → first status file of a daemon whose start-up table comes from the /proc
//!   scan (`GUARD_SNAPSHOT=procfs`) and of one that reads the task iterator
//!   (`GUARD_SNAPSHOT=iter`), each as a ratio to one `ps -e -o pid=,comm=` pass made in the
//!   same repetition (target ≤ 0.10× with the iterator);
//! - the daemon's RSS once it tracks the 10,000 (target ≤ 8 MiB with the iterator);
//! - the CPU of one snapshot each way and of one stall-watch sample (the account's processes
//!   that used CPU, from the scheduler's accounting, target ≤ 2 ms; the task iterator's pass
//!   over every process, the fallback, beside it), measured in one process by guard-user's
//!   `snapshot_cost` example, which xtask builds here.
use std::{
    process::Command,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use serde_json::{json, Value};

use super::{median, ms, procs, wait_for_file, Bench, Row};
use crate::build_ebpf;

const N: usize = 10_000;

impl Bench<'_> {
    pub(super) fn snapshot(
        &mut self,
        rows: &mut Vec<Row>,
        raw: &mut serde_json::Map<String, Value>,
    ) -> anyhow::Result<()> {
        let probe = build_example("snapshot_cost")?;
        let t = Instant::now();
        let sleepers = procs::Sleepers::spawn(N, "gbsnap", self.who)?;
        println!("bench: {} sleepers up in {:.2} s", sleepers.len(), t.elapsed().as_secs_f64());
        let (mut ps_wall, mut ps_cpu) = (Vec::new(), Vec::new());
        let (mut boot_proc, mut boot_iter, mut rss_proc, mut rss_iter, mut tracked) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for rep in 0..self.opts.reps {
            println!("bench: snapshot {}/{}", rep + 1, self.opts.reps);
            let (cpu, wall) = procs::ps_pass()?;
            ps_cpu.push(cpu);
            ps_wall.push(wall);
            for (mode, boot, rss) in
                [("procfs", &mut boot_proc, &mut rss_proc), ("iter", &mut boot_iter, &mut rss_iter)]
            {
                let (b, r, n) = self.start_up(mode)?;
                boot.push(b);
                rss.push(r);
                if mode == "iter" {
                    tracked.push(n as f64);
                }
            }
        }
        let samples = run_probe(&probe, self.who.uid, self.opts.reps.max(5))?;
        let col = |key: &str| samples.iter().map(|s| s[key].as_f64().unwrap_or(f64::NAN)).collect::<Vec<_>>();
        let (iter_cpu, proc_cpu, sample_cpu) = (col("iter_cpu_ms"), col("procfs_cpu_ms"), col("sample_cpu_ms"));
        let rt_sample_cpu = col("rt_sample_cpu_ms");
        let ratio = |boot: &[f64]| boot.iter().zip(&ps_wall).map(|(b, p)| b / (p * 1e3)).collect::<Vec<_>>();
        let speedup: Vec<f64> = proc_cpu.iter().zip(&iter_cpu).map(|(p, i)| p / i.max(1e-9)).collect();

        rows.push(Row::info("ps -e -o pid=,comm= pass (wall), N=10,000", ms(&ps_wall), "ms"));
        rows.push(Row::info("start-up (spawn → first status), /proc scan, N=10,000", boot_proc.clone(), "ms"));
        rows.push(Row::info("start-up (spawn → first status), task iterator, N=10,000", boot_iter.clone(), "ms"));
        rows.push(Row::info("start-up / ps pass, /proc scan", ratio(&boot_proc), "×"));
        rows.push(Row::at_most("start-up / ps pass, task iterator", ratio(&boot_iter), "×", 0.10));
        rows.push(Row::info("snapshot CPU, /proc scan, N=10,000", proc_cpu.clone(), "ms"));
        rows.push(Row::info("snapshot CPU, task iterator, N=10,000", iter_cpu.clone(), "ms"));
        rows.push(Row::info("snapshot CPU, /proc scan / task iterator", speedup.clone(), "×"));
        rows.push(Row::at_most(
            "stall-watch CPU sample (scheduler accounting, the daemon's), N=10,000 idle",
            rt_sample_cpu.clone(),
            "ms",
            2.0,
        ));
        rows.push(Row::info("stall-watch CPU sample (task-iterator fallback), N=10,000", sample_cpu.clone(), "ms"));
        rows.push(Row::info("daemon RSS, /proc start-up, 10,000 tracked", rss_proc.clone(), "MiB"));
        rows.push(Row::at_most("daemon RSS, task-iterator start-up, 10,000 tracked", rss_iter.clone(), "MiB", 8.0));
        raw.insert(
            "snapshot".into(),
            json!({"n": N, "ps_wall_ms": ms(&ps_wall), "ps_cpu_ms": ms(&ps_cpu), "startup_ms_procfs": boot_proc,
                   "startup_ms_iter": boot_iter, "rss_mib_procfs": rss_proc, "rss_mib_iter": rss_iter,
                   "tracked_iter": tracked, "probe": samples,
                   "median_sample_cpu_ms": median(&sample_cpu), "median_rt_sample_cpu_ms": median(&rt_sample_cpu)}),
        );
        drop(sleepers);
        Ok(())
    }

    /// One daemon start with `GUARD_SNAPSHOT=<mode>`: (spawn → first status in ms, RSS in MiB
    /// after two more ticks, tracked processes).
    fn start_up(&mut self, mode: &str) -> anyhow::Result<(f64, f64, u64)> {
        self.runs += 1;
        let home = self.home(&format!("snapshot-{mode}-{}", self.runs), self.opts.never())?;
        // The start-up phases land in the home's .stderr file next to it (the profile behind the figure).
        let env = [("GUARD_SNAPSHOT", mode), ("GUARD_TRACE_STARTUP", "1")];
        let mut d = procs::Daemon::start_env(&self.binary, &self.opts.user, &home, "ebpf", true, "1s", &[], &env)?;
        let first = wait_for_file(&d.status_path(), Duration::from_secs(30))?;
        let boot = first.duration_since(d.spawned_at).as_secs_f64() * 1e3;
        let s = d.wait_ticks(3, Duration::from_secs(30))?;
        let rss = procs::rss_kib(d.pid())? as f64 / 1024.0;
        Ok((boot, rss, s["tracked_processes"].as_u64().unwrap_or(0)))
    }
}

/// Builds one of guard-user's examples (release, with the BPF object) and returns it.
pub(super) fn build_example(name: &str) -> anyhow::Result<std::path::PathBuf> {
    let object = build_ebpf::build(&build_ebpf::Options::default())?;
    let mut cargo = crate::build::host_cargo();
    cargo
        .args(["build", "--release", "-p", "guard-user", "--example", name])
        .env("GUARD_EBPF_OBJ", &object)
        .current_dir(build_ebpf::workspace_root());
    build_ebpf::run_checked(&mut cargo, &format!("building the {name} example"))?;
    let path = build_ebpf::target_dir().join("release/examples").join(name);
    anyhow::ensure!(path.is_file(), "no {}", path.display());
    Ok(path)
}

/// `snapshot_cost <uid> <reps>`: one JSON object per repetition.
fn run_probe(probe: &std::path::Path, uid: u32, reps: usize) -> anyhow::Result<Vec<Value>> {
    let out =
        Command::new(probe).args([uid.to_string(), reps.to_string()]).output().context("running snapshot_cost")?;
    anyhow::ensure!(out.status.success(), "snapshot_cost failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).with_context(|| format!("snapshot_cost said {l:?}")))
        .collect()
}
