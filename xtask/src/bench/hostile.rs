//! The `hostile` figure: `tests/tests/hostile.rs` in its long form (`GUARD_HOSTILE=long`: 300
//! processes sharing a 1 MiB command line, 16 distinct ones, 200 execs of a session root with
//! 1 MiB each, a process flipping the protection of 8 GiB, the state and config bombs, a Redis
//! endpoint answering 80 MiB, costly patterns), against the measured binary under the unit's
//! `MemoryMax=64M` and `TasksMax=32`, once per repetition. Reported: the daemon's peak memory
//! (its cgroup's; target ≤ 48 MiB, three quarters of the limit), its median and longest tick,
//! the most tasks it held, and whether the control pile was ended on time (the test's own
//! verdict: target every repetition).
use std::process::Command;

use anyhow::Context as _;
use serde_json::{json, Value};

use super::{Bench, Row};

impl Bench<'_> {
    pub(super) fn hostile(
        &mut self,
        rows: &mut Vec<Row>,
        raw: &mut serde_json::Map<String, Value>,
    ) -> anyhow::Result<()> {
        let mut reports = Vec::new();
        let mut passed = Vec::new();
        for rep in 0..self.opts.reps {
            println!("bench: hostile {}/{}", rep + 1, self.opts.reps);
            let out = Command::new("cargo")
                .args(["test", "-p", "integration-tests", "--test", "hostile", "--", "--nocapture"])
                .env("GUARD_HOSTILE", "long")
                .env("GUARD_USER_BIN", &self.binary)
                .output()
                .context("running tests/tests/hostile.rs")?;
            let stderr = String::from_utf8_lossy(&out.stderr);
            let report: Value = stderr
                .lines()
                .find_map(|l| l.strip_prefix("hostile: "))
                .and_then(|j| serde_json::from_str(j).ok())
                .with_context(|| format!("the hostile test printed no report:\n{stderr}"))?;
            if !out.status.success() {
                println!("bench: hostile {}: the test failed:\n{}", rep + 1, String::from_utf8_lossy(&out.stdout));
            }
            passed.push(if out.status.success() { 1.0 } else { 0.0 });
            reports.push(report);
        }
        let col = |k: &str| reports.iter().filter_map(|r| r[k].as_f64()).collect::<Vec<_>>();
        rows.push(Row::at_most(
            "hostile account: daemon peak memory (cgroup), MemoryMax=64M",
            col("peak_mib"),
            "MiB",
            48.0,
        ));
        rows.push(Row::info("hostile account: median tick", super::ms(&col("tick_secs_median")), "ms"));
        rows.push(Row::info("hostile account: longest tick", super::ms(&col("tick_secs_max")), "ms"));
        rows.push(Row::info("hostile account: most tasks at once (TasksMax=32)", col("tasks_peak"), ""));
        rows.push(Row::info("hostile account: processes protected for an unread command line", col("unread"), ""));
        rows.push(Row::at_least(
            "hostile account: control pile ended on time (share of runs)",
            passed.clone(),
            "",
            1.0,
        ));
        raw.insert("hostile".into(), json!({"reports": reports, "passed": passed}));
        Ok(())
    }
}
