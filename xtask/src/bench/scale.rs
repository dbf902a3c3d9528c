//! The `scale` figure: a daemon at 0, 10,000 and 50,000 idle processes of its account, in one
//! repetition: start-up (spawn → first status, task-iterator table) against one `ps -e` pass at
//! 50,000 (target ≤ 0.10×), tick CPU at each N (target: flat, 50,000 / 0 ≤ 1.25×), RSS at
//! 10,000 tracked (target ≤ 7 MiB) and the bytes one more tracked process costs (the RSS slope
//! from 10,000 to 50,000, target ≤ 150 B), and where the resident memory at 10,000 goes
//! (`/proc/PID/smaps` by mapping).
//!
//! 50,000 processes need pid_max and threads-max above that (raised for the run when lower)
//! and about 3 GiB of kernel memory (the figure is skipped, with the reason, below 6 GiB
//! available).
use std::{collections::BTreeMap, fs, time::Duration};

use anyhow::Context as _;
use serde_json::{json, Value};

use super::{median, procs, wait_for_file, Bench, Row, NEVER};

const STEPS: [usize; 3] = [0, 10_000, 50_000];

/// One daemon run at one N.
struct Run {
    startup_ms: f64,
    tick_ms: f64,
    rss_kib: u64,
    tracked: u64,
    smaps: BTreeMap<String, u64>,
}

impl Bench<'_> {
    pub(super) fn scale(
        &mut self,
        rows: &mut Vec<Row>,
        raw: &mut serde_json::Map<String, Value>,
    ) -> anyhow::Result<()> {
        let avail = mem_available_kib().unwrap_or(0);
        if avail < 6 << 20 {
            println!("bench: scale skipped: {} MiB available, 50,000 processes need about 3 GiB", avail >> 10);
            return Ok(());
        }
        raise(&[("/proc/sys/kernel/pid_max", 131_072), ("/proc/sys/kernel/threads-max", 200_000)]);
        let mut by_n: BTreeMap<usize, Vec<Run>> = BTreeMap::new();
        let mut ps_wall = Vec::new();
        for rep in 0..self.opts.reps {
            let mut sleepers = Vec::new();
            let mut spawned = 0;
            for n in STEPS {
                if n > spawned {
                    sleepers.push(procs::Sleepers::spawn(n - spawned, "gbscale", self.who)?);
                    spawned = n;
                }
                println!("bench: scale {}/{}, N={n}", rep + 1, self.opts.reps);
                if n == 50_000 {
                    ps_wall.push(procs::ps_pass()?.1 * 1e3);
                }
                let run = self.scale_run(n)?;
                by_n.entry(n).or_default().push(run);
            }
            drop(sleepers);
        }
        let col = |n: usize, f: &dyn Fn(&Run) -> f64| by_n[&n].iter().map(f).collect::<Vec<_>>();
        let startup = col(50_000, &|r| r.startup_ms);
        let ratio: Vec<f64> = startup.iter().zip(&ps_wall).map(|(s, p)| s / p).collect();
        let tick: BTreeMap<usize, Vec<f64>> = STEPS.iter().map(|&n| (n, col(n, &|r| r.tick_ms))).collect();
        let flat: Vec<f64> = tick[&50_000].iter().zip(&tick[&0]).map(|(a, b)| a / b.max(1e-9)).collect();
        let rss: BTreeMap<usize, Vec<f64>> =
            STEPS.iter().map(|&n| (n, col(n, &|r| r.rss_kib as f64 / 1024.0))).collect();
        let slope: Vec<f64> = by_n[&50_000]
            .iter()
            .zip(&by_n[&10_000])
            .map(|(a, b)| {
                (a.rss_kib as f64 - b.rss_kib as f64) * 1024.0 / (a.tracked as f64 - b.tracked as f64).max(1.0)
            })
            .collect();
        rows.push(Row::info("ps -e -o pid=,comm= pass (wall), N=50,000", ps_wall.clone(), "ms"));
        rows.push(Row::info("start-up (spawn → first status), N=50,000", startup.clone(), "ms"));
        rows.push(Row::at_most("start-up / ps pass, N=50,000", ratio.clone(), "×", 0.10));
        for n in STEPS {
            rows.push(Row::info(format!("tick CPU, ebpf, N={n}"), tick[&n].clone(), "ms"));
        }
        rows.push(Row::at_most("tick CPU, N=50,000 / N=0", flat.clone(), "×", 1.25));
        for n in STEPS {
            if n == 10_000 {
                rows.push(Row::at_most("daemon RSS, 10,000 tracked", rss[&n].clone(), "MiB", 7.0));
            } else {
                rows.push(Row::info(format!("daemon RSS, {n} tracked"), rss[&n].clone(), "MiB"));
            }
        }
        rows.push(Row::at_most("bytes per tracked process (RSS slope 10,000 → 50,000)", slope.clone(), "B", 150.0));
        // Where the resident memory of the 10,000 run goes (medians over the repetitions).
        let mut kinds: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for r in &by_n[&10_000] {
            for (k, v) in &r.smaps {
                kinds.entry(k.clone()).or_default().push(*v as f64);
            }
        }
        for (k, v) in &kinds {
            rows.push(Row::info(format!("RSS at 10,000 tracked: {k}"), v.clone(), "KiB"));
        }
        raw.insert(
            "scale".into(),
            json!({
                "ps_wall_ms": ps_wall, "startup_ms_50000": startup, "ratio": ratio,
                "tick_ms": tick.iter().map(|(n, v)| (n.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
                "rss_mib": rss.iter().map(|(n, v)| (n.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
                "bytes_per_process": slope,
                "tracked": by_n.iter().map(|(n, v)| (n.to_string(), json!(v.iter().map(|r| r.tracked).collect::<Vec<_>>()))).collect::<serde_json::Map<_, _>>(),
                "smaps_kib_10000": kinds.iter().map(|(k, v)| (k.clone(), json!(median(v)))).collect::<serde_json::Map<_, _>>(),
            }),
        );
        Ok(())
    }

    /// A daemon with N processes of the account: start-up, tick CPU over `--ticks` ticks after its
    /// second, then RSS and its breakdown.
    fn scale_run(&mut self, n: usize) -> anyhow::Result<Run> {
        let mut d = self.daemon(&format!("scale-{n}"), "ebpf", NEVER, true)?;
        let first = wait_for_file(&d.status_path(), Duration::from_secs(60))?;
        let startup_ms = first.duration_since(d.spawned_at).as_secs_f64() * 1e3;
        let s0 = d.wait_ticks(2, Duration::from_secs(60))?;
        let (c0, _) = procs::cpu_secs(d.pid())?;
        let t0 = s0["ticks"].as_u64().unwrap_or(0);
        let s1 = d.wait_ticks(t0 + self.opts.ticks, Duration::from_secs(self.opts.ticks * 3 + 20))?;
        let (c1, _) = procs::cpu_secs(d.pid())?;
        let ticks = (s1["ticks"].as_u64().unwrap_or(0) - t0).max(1) as f64;
        Ok(Run {
            startup_ms,
            tick_ms: (c1 - c0) * 1e3 / ticks,
            rss_kib: procs::rss_kib(d.pid())?,
            tracked: s1["tracked_processes"].as_u64().unwrap_or(0),
            smaps: smaps_by_kind(d.pid())?,
        })
    }
}

/// Resident KiB of a process by kind of mapping (`/proc/PID/smaps`): the binary's pages, the
/// shared libraries, the heap, the BPF maps (the ring buffer, mapped twice), the main stack,
/// other anonymous memory (thread stacks, mmapped buffers), the rest.
pub fn smaps_by_kind(pid: u32) -> anyhow::Result<BTreeMap<String, u64>> {
    let text = fs::read_to_string(format!("/proc/{pid}/smaps")).context("reading smaps")?;
    let mut out = BTreeMap::new();
    let mut kind = String::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            // A mapping header: address perms offset dev inode [path].
            let path = line.split_whitespace().nth(5).unwrap_or("");
            kind = match path {
                "" => "anonymous (thread stacks, buffers)",
                "[heap]" => "heap",
                "[stack]" => "main stack",
                p if p.contains("bpf") => "BPF maps (ring buffer)",
                p if p.ends_with("/guard-user") => "guard-user binary",
                p if p.contains(".so") => "shared libraries",
                _ => "other",
            }
            .to_string();
        } else if first == "Rss:" {
            let kib: u64 = fields.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            *out.entry(kind.clone()).or_insert(0) += kib;
        }
    }
    Ok(out)
}

fn mem_available_kib() -> Option<u64> {
    let text = fs::read_to_string("/proc/meminfo").ok()?;
    text.lines().find_map(|l| l.strip_prefix("MemAvailable:"))?.split_whitespace().next()?.parse().ok()
}

/// Raises each sysctl to at least its value (never lowers one).
fn raise(limits: &[(&str, u64)]) {
    for &(path, want) in limits {
        let now: u64 = fs::read_to_string(path).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
        if now < want {
            let _ = fs::write(path, want.to_string());
        }
    }
}
