//! The `matcher` figure (issue 25): the CPU the daemon and its sandboxed matcher use per tick
//! while a hostile `excludeCommands` list faces processes that never change and are never due.
//!
//! The list: 128 valid patterns `(a*)*\1b{0,i}x` (i = 0..127), each of which backtracks until
//! the per-match bound kills the worker on a long run of `a`. The processes: six of one name
//! (`gbmatch`, a link to `sleep`) whose `argv[0]` holds 3,000 `a`s. Config: threshold 6, timeout
//! a year, so the name is flagged at the first tick and never due. 4 s ticks (the report's),
//! dry run. CPU is read from `/proc/<pid>/stat`: the daemon's utime + stime, the workers it
//! reaped (cutime + cstime), and the live worker's utime + stime, at every tick the status file
//! reports. The same run with `GUARD_MATCH_CACHE=off` (the cache keeps nothing) sits beside it.
use std::{
    fs,
    os::unix::{
        fs::{symlink, PermissionsExt},
        process::CommandExt,
    },
    path::PathBuf,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use serde_json::{json, Value};

use super::{procs::Daemon, Bench, Row};

/// Ticks per run with the cache: the first settles what its budget allows, the next ones the
/// rest; the last `STEADY` are the steady figure.
const TICKS: u64 = 25;
const STEADY: u64 = 10;
/// Ticks per run without the cache (every tick costs the same).
const TICKS_NO_CACHE: u64 = 8;
const INTERVAL_SECS: f64 = 4.0;

impl Bench<'_> {
    pub(super) fn matcher(
        &mut self,
        rows: &mut Vec<Row>,
        raw: &mut serde_json::Map<String, Value>,
    ) -> anyhow::Result<()> {
        let patterns: Vec<String> = (0..128).map(|i| format!("(a*)*\\1b{{0,{i}}}x")).collect();
        let config =
            json!({"threshold": 6, "timeout": "8760h", "excludes": [], "excludeCommands": patterns}).to_string();
        let _hostile = Hostile::spawn(6, self.who)?;
        let (mut first, mut settle, mut settle_ticks, mut steady, mut off) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for rep in 0..self.opts.reps {
            println!(
                "bench: matcher {}/{} ({TICKS} ticks with the cache, {TICKS_NO_CACHE} without)",
                rep + 1,
                self.opts.reps
            );
            let per_tick = self.hostile_run(&config, TICKS, &[])?;
            first.push(per_tick[0]);
            // Settled: the first tick from which every later one costs under 50 ms.
            let settled_at =
                (0..per_tick.len()).find(|&i| per_tick[i..].iter().all(|&c| c < 0.05)).unwrap_or(per_tick.len());
            settle.push(per_tick[..settled_at].iter().sum::<f64>());
            settle_ticks.push(settled_at as f64);
            let tail = &per_tick[per_tick.len() - STEADY as usize..];
            steady.push(tail.iter().sum::<f64>() / tail.len() as f64);
            let per_tick_off = self.hostile_run(&config, TICKS_NO_CACHE, &[("GUARD_MATCH_CACHE", "off")])?;
            // Its first tick also pays for start-up: the rest only.
            let rest = &per_tick_off[1..];
            off.push(rest.iter().sum::<f64>() / rest.len() as f64);
            raw.insert(
                format!("matcher_rep{rep}"),
                json!({"cpu_s_per_tick": per_tick, "cpu_s_per_tick_no_cache": per_tick_off}),
            );
        }
        let ms = |v: &[f64]| v.iter().map(|s| s * 1e3).collect::<Vec<_>>();
        let pct_at_60 = |v: &[f64]| v.iter().map(|s| s / 60.0 * 100.0).collect::<Vec<_>>();
        rows.push(Row::info("matcher: 1st tick CPU (start-up included), hostile list, 4 s ticks", ms(&first), "ms"));
        rows.push(Row::info("matcher: CPU until every verdict settled", ms(&settle), "ms"));
        rows.push(Row::info("matcher: ticks until every verdict settled", settle_ticks.clone(), "ticks"));
        rows.push(Row::at_most("matcher: steady tick CPU, daemon + worker", ms(&steady), "ms", 600.0));
        rows.push(Row::at_most("matcher: steady tick CPU at 60 s ticks", pct_at_60(&steady), "% of a core", 1.0));
        rows.push(Row::info("matcher: tick CPU without the cache, 4 s ticks", ms(&off), "ms"));
        raw.insert(
            "matcher".into(),
            json!({"interval_s": INTERVAL_SECS, "first_tick_s": first, "settle_s": settle, "settle_ticks": settle_ticks,
                   "steady_s_per_tick": steady, "no_cache_s_per_tick": off}),
        );
        Ok(())
    }

    /// One daemon over `ticks` ticks: the CPU of each tick (the first from the daemon's start).
    fn hostile_run(&mut self, config: &str, ticks: u64, env: &[(&str, &str)]) -> anyhow::Result<Vec<f64>> {
        self.runs += 1;
        let home = self.home(&format!("matcher-{}", self.runs), config)?;
        let mut d = Daemon::start_env(&self.binary, &self.opts.user, &home, "ebpf", true, "4s", &[], env)?;
        let mut per_tick = Vec::new();
        let mut last = 0.0;
        for t in 1..=ticks {
            d.wait_ticks(t, Duration::from_secs(30))?;
            let now = tree_cpu_secs(d.pid())?;
            per_tick.push(now - last);
            last = now;
        }
        let names = d.status().map(|s| s["names"].clone()).unwrap_or(Value::Null);
        anyhow::ensure!(
            names.to_string().contains("gbmatch"),
            "the hostile name was never flagged (status names: {names})"
        );
        Ok(per_tick)
    }
}

/// The hostile processes, ended and reaped on drop.
struct Hostile {
    children: Vec<Child>,
    dir: PathBuf,
}

impl Hostile {
    fn spawn(n: usize, who: super::procs::Account) -> anyhow::Result<Hostile> {
        // A directory the account can search, holding `gbmatch`: comm comes from the name exec
        // was given, so a link to sleep runs as `gbmatch`.
        let dir = std::env::temp_dir().join(format!("guard-bench-matcher-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
        let link = dir.join("gbmatch");
        symlink("/bin/sleep", &link)?;
        let mut h = Hostile { children: Vec::new(), dir };
        for i in 0..n {
            let arg0 = format!("gbmatch{i} {}", "a".repeat(3000));
            let child = Command::new(&link)
                .arg0(arg0)
                .arg("1000000")
                .uid(who.uid)
                .gid(who.gid)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .with_context(|| format!("starting {}", link.display()))?;
            h.children.push(child);
        }
        // Each must have exec'd (and so be `gbmatch` with its long argv) before a daemon starts.
        let until = Instant::now() + Duration::from_secs(5);
        for c in &h.children {
            while fs::read_to_string(format!("/proc/{}/comm", c.id())).map(|s| s.trim() != "gbmatch").unwrap_or(true) {
                anyhow::ensure!(Instant::now() < until, "a gbmatch process did not start");
                thread::sleep(Duration::from_millis(5));
            }
        }
        Ok(h)
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// CPU seconds of `pid`, the children it reaped and its live children (the matcher's worker).
fn tree_cpu_secs(pid: u32) -> anyhow::Result<f64> {
    let (own, reaped) = stat_cpu(pid)?;
    let mut total = own + reaped;
    for task in fs::read_dir(format!("/proc/{pid}/task"))? {
        let children = fs::read_to_string(task?.path().join("children")).unwrap_or_default();
        for child in children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()) {
            // A worker reaped meanwhile is in the next reading's cutime.
            if let Ok((own, reaped)) = stat_cpu(child) {
                total += own + reaped;
            }
        }
    }
    Ok(total)
}

/// (utime + stime, cutime + cstime) of `pid`, in seconds.
fn stat_cpu(pid: u32) -> anyhow::Result<(f64, f64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat.rsplit_once(") ").context("malformed stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let field = |i: usize| -> anyhow::Result<f64> { Ok(f.get(i).context("short stat")?.parse::<u64>()? as f64 / hz) };
    Ok((field(11)? + field(12)?, field(13)? + field(14)?))
}
