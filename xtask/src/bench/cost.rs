//! What a guard costs the machine beyond its account (issue 28):
//!
//! - `bpf`: the kernel's own time per run of each of a daemon's programs
//!   (`kernel.bpf_stats_enabled`, see `bpfstats`), for a storm of the guarded account and for
//!   one of another account (what every other process of the machine pays per daemon). Target:
//!   ≤ 250 ns for an unguarded fork + exec (with its credential commit) + exit + rename.
//! - `accounts`: a fork+exec storm of an unguarded account with 0, 1 and 8 daemons guarding
//!   other accounts (created as `guardbench1`…`guardbench8` when missing). Target: 8 daemons
//!   slow it by ≤ 2 %.
//! - `stall`: a daemon's CPU per storm exec of its own account with the stall watch on (its
//!   default) and off, in the same repetition. Target: on / off ≤ 1.2×.
use std::{collections::BTreeMap, fs, os::unix::fs::chown, path::PathBuf, thread, time::Duration};

use serde_json::{json, Value};

use super::{
    bpfstats::{self, StatsEnabled},
    procs::{self, Account, Daemon},
    Bench, Row, NEVER,
};

/// Accounts the `accounts` figure guards (never the storm's), and the unguarded one of `bpf`.
const OTHER_ACCOUNTS: usize = 8;
const OTHER_UID_BASE: u32 = 4300;

/// The event programs whose runs make "one process" (fork, exec with its credential commit,
/// exit, rename), by what `bpfstats::programs_of` calls them.
const PROCESS_EVENTS: [&str; 5] =
    ["sched_process_fork", "sched_process_exec", "sched_process_exit", "task_rename", "commit_creds"];

pub fn other_accounts() -> anyhow::Result<Vec<(String, Account)>> {
    (1..=OTHER_ACCOUNTS)
        .map(|i| {
            let name = format!("guardbench{i}");
            let who = procs::ensure_account(&name, OTHER_UID_BASE + i as u32)?;
            Ok((name, who))
        })
        .collect()
}

impl Bench<'_> {
    /// A fresh home for a daemon guarding `who` (owned by it), with `config`.
    fn home_as(&mut self, tag: &str, config: &str, who: Account) -> anyhow::Result<PathBuf> {
        self.runs += 1;
        let home = self.out.join(format!("home-{tag}-{}", self.runs));
        let _ = fs::remove_dir_all(&home);
        fs::create_dir_all(&home)?;
        let cfg = home.join("guard-config.json");
        fs::write(&cfg, config)?;
        chown(&home, Some(who.uid), Some(who.gid))?;
        chown(&cfg, Some(who.uid), Some(who.gid))?;
        Ok(home)
    }

    fn storm_secs(&self) -> u64 {
        if self.opts.long {
            60
        } else {
            10
        }
    }

    /// `bpf`: ns per run of each program, guarded and unguarded, beside the no-op program's
    /// (the measurement's own part of every run, `bpf_floor`).
    pub(super) fn bpf_cost(
        &mut self,
        rows: &mut Vec<Row>,
        raw: &mut serde_json::Map<String, Value>,
    ) -> anyhow::Result<()> {
        let floor_exe = super::snapshot::build_example("bpf_floor")?;
        let others = other_accounts()?;
        let (other_name, other) = others[0].clone();
        let workers = thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
        let _stats = StatsEnabled::on()?;
        let floor_probe = FloorProbe::start(&floor_exe)?;
        let mut per: BTreeMap<(bool, String), Vec<f64>> = BTreeMap::new();
        let (mut floor, mut gross_unguarded, mut net_unguarded, mut gross_guarded) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut samples = Vec::new();
        for rep in 0..self.opts.reps {
            println!(
                "bench: bpf {}/{} (5 s storms of {other_name}, unguarded, and of {}, guarded)",
                rep + 1,
                self.opts.reps,
                self.opts.user
            );
            let mut d = self.daemon("bpf", "ebpf", NEVER, true)?;
            d.wait_ticks(1, Duration::from_secs(30))?;
            for (guarded, who) in [(false, other), (true, self.who)] {
                let before = bpfstats::programs_of(d.pid())?;
                let floor_before = floor_probe.counters()?;
                let storm = procs::storm_renaming(workers, Duration::from_secs(5), who)?;
                let after = bpfstats::programs_of(d.pid())?;
                let floor_ns = floor_probe.counters()?.ns_per_run_since(&floor_before).unwrap_or(0.0);
                let (mut total, mut runs) = (0.0, 0);
                let mut rep_json = serde_json::Map::new();
                for (name, c) in &after {
                    let b = before.get(name).copied().unwrap_or_default();
                    let Some(ns) = c.ns_per_run_since(&b) else { continue };
                    per.entry((guarded, name.clone())).or_default().push(ns);
                    if PROCESS_EVENTS.iter().any(|p| name.starts_with(p)) {
                        total += ns;
                        runs += 1;
                    }
                    rep_json.insert(name.clone(), json!({"ns_per_run": ns, "runs": c.runs_since(&b)}));
                }
                if guarded {
                    gross_guarded.push(total);
                } else {
                    floor.push(floor_ns);
                    gross_unguarded.push(total);
                    net_unguarded.push(total - runs as f64 * floor_ns);
                }
                samples.push(json!({"guarded": guarded, "processes": storm.spawned, "floor_ns": floor_ns,
                                    "programs_in_total": runs, "programs": rep_json}));
            }
            drop(d);
        }
        rows.push(Row::info(
            "BPF ns per run, a no-op program on sched_process_fork (the measurement floor)",
            floor.clone(),
            "ns",
        ));
        for ((guarded, name), v) in &per {
            let who = if *guarded { "guarded" } else { "unguarded" };
            rows.push(Row::info(format!("BPF ns per run, {name}, {who} account"), v.clone(), "ns"));
        }
        rows.push(Row::info(
            "BPF ns per unguarded process (fork + exec + credential commit + exit + rename), as measured",
            gross_unguarded.clone(),
            "ns",
        ));
        rows.push(Row::at_most(
            "BPF ns per unguarded process, less the floor once per program run",
            net_unguarded.clone(),
            "ns",
            250.0,
        ));
        rows.push(Row::info(
            "BPF ns per guarded process (the same programs), as measured",
            gross_guarded.clone(),
            "ns",
        ));
        raw.insert(
            "bpf".into(),
            json!({"unguarded_account": other_name, "floor_ns": floor, "total_unguarded_ns": gross_unguarded,
                   "net_unguarded_ns": net_unguarded, "total_guarded_ns": gross_guarded, "samples": samples}),
        );
        Ok(())
    }

    /// `accounts`: an unguarded storm with 0, 1 and 8 daemons of other accounts running.
    pub(super) fn accounts_cost(
        &mut self,
        rows: &mut Vec<Row>,
        raw: &mut serde_json::Map<String, Value>,
    ) -> anyhow::Result<()> {
        let others = other_accounts()?;
        let secs = self.storm_secs();
        let workers = thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
        let (mut zero, mut one, mut eight) = (Vec::new(), Vec::new(), Vec::new());
        for rep in 0..self.opts.reps {
            println!(
                "bench: accounts {}/{} ({secs} s storms of {} with 0, 1, 8 daemons of other accounts)",
                rep + 1,
                self.opts.reps,
                self.opts.user
            );
            let rate = |s: procs::StormResult| s.spawned as f64 / s.seconds;
            zero.push(rate(procs::storm(workers, Duration::from_secs(secs), self.who)?));
            let mut daemons = Vec::new();
            for (i, (name, who)) in others.iter().enumerate() {
                let home = self.home_as(&format!("accounts-{name}"), NEVER, *who)?;
                // The production cadence: the figure is what their programs cost others.
                daemons.push(Daemon::start_with(&self.binary, name, &home, "ebpf", true, "60s", &[])?);
                if i == 0 {
                    daemons[0].wait_ticks(1, Duration::from_secs(30))?;
                    one.push(rate(procs::storm(workers, Duration::from_secs(secs), self.who)?));
                }
            }
            for d in &mut daemons {
                d.wait_ticks(1, Duration::from_secs(60))?;
            }
            eight.push(rate(procs::storm(workers, Duration::from_secs(secs), self.who)?));
        }
        let slow = |with: &[f64]| zero.iter().zip(with).map(|(z, w)| z / w).collect::<Vec<_>>();
        rows.push(Row::info("unguarded storm exec/s, no daemon", zero.clone(), "/s"));
        rows.push(Row::info("unguarded storm exec/s, 1 daemon of another account", one.clone(), "/s"));
        rows.push(Row::info("unguarded storm exec/s, 8 daemons of other accounts", eight.clone(), "/s"));
        rows.push(Row::info("slowdown, 1 daemon (without / with)", slow(&one), "×"));
        rows.push(Row::at_most("slowdown, 8 daemons (without / with)", slow(&eight), "×", 1.02));
        raw.insert(
            "accounts".into(),
            json!({"seconds": secs, "workers": workers, "exec_per_s_0": zero, "exec_per_s_1": one, "exec_per_s_8": eight}),
        );
        Ok(())
    }

    /// `stall`: a daemon's CPU per storm exec of its account, stall watch on and off.
    pub(super) fn stall_cost(
        &mut self,
        rows: &mut Vec<Row>,
        raw: &mut serde_json::Map<String, Value>,
    ) -> anyhow::Result<()> {
        let secs = self.storm_secs();
        let workers = thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
        let off_config = r#"{"threshold": 1000000, "timeout": "1h", "stallWatch": false}"#;
        let (mut on, mut off, mut lost) = (Vec::new(), Vec::new(), Vec::new());
        for rep in 0..self.opts.reps {
            println!(
                "bench: stall {}/{} ({secs} s storms of {}, stall watch on, then off)",
                rep + 1,
                self.opts.reps,
                self.opts.user
            );
            for (config, out) in [(NEVER, &mut on), (off_config, &mut off)] {
                let mut d = self.daemon("stall", "ebpf", config, true)?;
                d.wait_ticks(1, Duration::from_secs(30))?;
                let (l0, r0) = (d.field("lost_events").unwrap_or(0), d.field("resyncs").unwrap_or(0));
                let (c0, _) = procs::cpu_secs(d.pid())?;
                let storm = procs::storm(workers, Duration::from_secs(secs), self.who)?;
                // The accounting's entries are drained by the next tick: count it.
                let t = d.field("ticks").unwrap_or(0);
                let s = d.wait_ticks(t + 2, Duration::from_secs(10))?;
                let (c1, _) = procs::cpu_secs(d.pid())?;
                out.push((c1 - c0) * 1e6 / storm.spawned.max(1) as f64);
                let l = s["lost_events"].as_u64().unwrap_or(0) - l0 + s["resyncs"].as_u64().unwrap_or(0) - r0;
                lost.push(l as f64);
            }
        }
        let ratio: Vec<f64> = on.iter().zip(&off).map(|(a, b)| a / b.max(1e-9)).collect();
        rows.push(Row::info("daemon CPU per storm exec, stall watch on", on.clone(), "µs"));
        rows.push(Row::info("daemon CPU per storm exec, stall watch off", off.clone(), "µs"));
        rows.push(Row::at_most("daemon CPU per storm exec, on / off", ratio.clone(), "×", 1.2));
        rows.push(Row::at_most("stall storms: lost events + resyncs", lost.clone(), "", 0.0));
        raw.insert("stall".into(), json!({"seconds": secs, "us_per_exec_on": on, "us_per_exec_off": off, "ratio": ratio, "lost_plus_resyncs": lost}));
        Ok(())
    }
}

/// The `bpf_floor` example: the no-op program, attached while this lives.
struct FloorProbe {
    child: std::process::Child,
}

impl FloorProbe {
    fn start(exe: &std::path::Path) -> anyhow::Result<FloorProbe> {
        use std::io::BufRead as _;
        let mut child = std::process::Command::new(exe)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
        let probe = FloorProbe { child };
        anyhow::ensure!(line.trim() == "ready", "bpf_floor said {line:?}");
        Ok(probe)
    }

    /// The no-op program's counters.
    fn counters(&self) -> anyhow::Result<bpfstats::Counters> {
        let progs = bpfstats::programs_of(self.child.id())?;
        progs.into_values().next().ok_or_else(|| anyhow::anyhow!("bpf_floor holds no program"))
    }
}

impl Drop for FloorProbe {
    fn drop(&mut self) {
        self.child.stdin.take();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
