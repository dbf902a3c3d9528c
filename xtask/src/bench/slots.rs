//! The slots figure (docs/BENCH.md): eight memory- and CPU-heavy jobs of the account started at
//! once (each allocates and touches 1 GiB and burns 3 s of CPU: guard-user's `heavy_job`
//! example), with a daemon whose config has no slot and with one whose slot lets two run at a
//! time, alternating. Measured side by side: the wall time until the last job ends, the
//! machine's peak memory over its baseline (`MemTotal − MemAvailable`, sampled every 10 ms), and
//! the exec-to-held latency of every job that waited (as the job measured it, see the example).
use std::{
    fs,
    os::unix::{fs::PermissionsExt, process::CommandExt},
    path::Path,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::Context;
use serde_json::{json, Value};

use super::{median, row::Row, snapshot::build_example, Bench};

const JOBS: usize = 8;
const MIB: usize = 1024;
const CPU_MS: u64 = 3000;

/// One run's figures.
struct Run {
    wall: f64,
    peak_mib: f64,
    /// Seconds from spawn to frozen, per job that saw its freeze.
    latencies: Vec<f64>,
    /// Jobs that waited (saw a freeze, or were frozen before their `main`).
    waited: usize,
}

fn boottime_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The machine's memory in use, MiB (`MemTotal − MemAvailable`).
fn used_mib() -> f64 {
    let info = fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib = |key: &str| {
        info.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (kib("MemTotal:") - kib("MemAvailable:")) / 1024.0
}

impl Bench<'_> {
    pub(super) fn slots(
        &mut self,
        rows: &mut Vec<Row>,
        raw: &mut serde_json::Map<String, Value>,
    ) -> anyhow::Result<()> {
        let example = build_example("heavy_job")?;
        let (mut plain, mut slotted) = (Vec::new(), Vec::new());
        for rep in 0..self.opts.reps {
            println!("bench: slots {}/{} ({JOBS} jobs of {MIB} MiB and {CPU_MS} ms of CPU)", rep + 1, self.opts.reps);
            // Alternate which goes first, so a machine getting busier favours neither.
            for slotted_first in [rep % 2 == 1, rep % 2 == 0] {
                if slotted_first {
                    slotted.push(self.slots_run(&example, true)?);
                } else {
                    plain.push(self.slots_run(&example, false)?);
                }
            }
        }
        let wall = |v: &[Run]| v.iter().map(|r| r.wall).collect::<Vec<_>>();
        let peak = |v: &[Run]| v.iter().map(|r| r.peak_mib).collect::<Vec<_>>();
        let wall_ratio: Vec<f64> = plain.iter().zip(&slotted).map(|(p, s)| s.wall / p.wall).collect();
        let peak_ratio: Vec<f64> = plain.iter().zip(&slotted).map(|(p, s)| s.peak_mib / p.peak_mib.max(1.0)).collect();
        let latencies: Vec<f64> = slotted.iter().flat_map(|r| r.latencies.iter().map(|l| l * 1e3)).collect();
        rows.push(Row::info("slots: 8 heavy jobs, wall, no slot", wall(&plain), "s"));
        rows.push(Row::info("slots: 8 heavy jobs, wall, max 2", wall(&slotted), "s"));
        rows.push(Row::at_most("slots: wall, max 2 / no slot", wall_ratio.clone(), "×", 1.1));
        rows.push(Row::info("slots: peak memory over baseline, no slot", peak(&plain), "MiB"));
        rows.push(Row::info("slots: peak memory over baseline, max 2", peak(&slotted), "MiB"));
        rows.push(Row::at_most("slots: peak memory, max 2 / no slot", peak_ratio.clone(), "×", 0.35));
        rows.push(Row::info("slots: exec → held (spawn to frozen, each waiting job)", latencies.clone(), "ms"));
        raw.insert(
            "slots".into(),
            json!({"jobs": JOBS, "mib": MIB, "cpu_ms": CPU_MS, "wall_s_plain": wall(&plain),
                   "wall_s_max2": wall(&slotted), "peak_mib_plain": peak(&plain), "peak_mib_max2": peak(&slotted),
                   "wall_ratio": wall_ratio, "peak_ratio": peak_ratio, "held_latency_ms": latencies,
                   "waited_per_run": slotted.iter().map(|r| r.waited).collect::<Vec<_>>(),
                   "held_latency_ms_median": median(&latencies)}),
        );
        Ok(())
    }

    fn slots_run(&mut self, example: &Path, slotted: bool) -> anyhow::Result<Run> {
        let config = if slotted {
            r#"{"threshold": 1000000, "timeout": "1h", "excludes": [],
                "slots": {"heavy": {"commands": ["(^|/)heavyjob "], "max": 2, "mode": "queue"}}}"#
        } else {
            r#"{"threshold": 1000000, "timeout": "1h", "excludes": []}"#
        };
        let mut d = self.daemon(if slotted { "slots-max2" } else { "slots-none" }, "ebpf", config, false)?;
        let st = d.wait_ticks(2, Duration::from_secs(30))?;
        if slotted {
            anyhow::ensure!(
                st["slots"].is_object() && st["slots"]["unavailable"].is_null(),
                "slots cannot hold here: {}",
                st["slots"]
            );
        }
        let exe = d.home.join("heavyjob");
        fs::copy(example, &exe)?;
        fs::set_permissions(&exe, fs::Permissions::from_mode(0o755))?;
        let out = d.home.join("jobs.txt");
        fs::write(&out, "")?;
        fs::set_permissions(&out, fs::Permissions::from_mode(0o666))?;
        // Settle: the previous run's memory is given back (the kernel's count falls for a few
        // seconds after 8 GiB are freed) before the baseline: until it moves less than 32 MiB in
        // a second, for at most 30 s.
        let settle_by = Instant::now() + Duration::from_secs(30);
        let mut before = used_mib();
        let baseline = loop {
            thread::sleep(Duration::from_secs(1));
            let now = used_mib();
            if (now - before).abs() < 32.0 || Instant::now() > settle_by {
                break now;
            }
            before = now;
        };
        let started = Instant::now();
        let mut jobs: Vec<Child> = Vec::with_capacity(JOBS);
        for _ in 0..JOBS {
            let child = Command::new(&exe)
                .args([boottime_ns().to_string(), MIB.to_string(), CPU_MS.to_string()])
                .arg(&out)
                .uid(self.who.uid)
                .gid(self.who.gid)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .context("spawning heavyjob")?;
            jobs.push(child);
        }
        let mut peak = 0.0f64;
        let mut left = jobs.len();
        let deadline = started + Duration::from_secs(600);
        while left > 0 {
            peak = peak.max(used_mib() - baseline);
            left = jobs.iter_mut().map(|c| matches!(c.try_wait(), Ok(None))).filter(|&alive| alive).count();
            anyhow::ensure!(Instant::now() < deadline, "the heavy jobs did not finish in 10 minutes");
            thread::sleep(Duration::from_millis(10));
        }
        let wall = started.elapsed().as_secs_f64();
        for mut c in jobs {
            anyhow::ensure!(c.wait()?.success(), "a heavy job failed");
        }
        drop(d);
        let lines = fs::read_to_string(&out)?;
        let mut latencies = Vec::new();
        let mut waited = 0;
        for l in lines.lines() {
            let f: Vec<u64> = l.split(' ').filter_map(|x| x.parse().ok()).collect();
            let [_, spawned, main_at, held, _resumed, _end] = f[..] else { continue };
            if held > 0 {
                waited += 1;
                latencies.push(held.saturating_sub(spawned) as f64 / 1e9);
            } else if main_at.saturating_sub(spawned) > 150_000_000 {
                waited += 1;
            }
        }
        anyhow::ensure!(lines.lines().count() == JOBS, "{} of {JOBS} jobs reported", lines.lines().count());
        if slotted {
            anyhow::ensure!(waited >= JOBS - 2, "only {waited} of {JOBS} jobs waited");
        }
        println!(
            "bench:   {}: wall {wall:.2} s, peak {peak:.0} MiB over the baseline, {waited} waited",
            if slotted { "max 2" } else { "no slot" }
        );
        Ok(Run { wall, peak_mib: peak, latencies, waited })
    }
}
