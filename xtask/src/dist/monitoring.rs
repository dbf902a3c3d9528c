//! The monitoring examples the package ships in `/usr/share/doc/guard-user/examples/`
//! (`packaging/monitoring/`): a Grafana dashboard with its provisioning file, and Prometheus
//! alert rules with their unit tests. Checked with the real Prometheus tool: `promtool check
//! rules` (syntax, expressions, templates) and `promtool test rules` (each alert quiet on a healthy
//! guard's series, firing with its labels and annotations on a broken one). That every metric they
//! name is one guard-user writes is guard-user's own test (`tests/doc_claims.rs`), which can
//! render its metrics file.
use std::{collections::BTreeSet, path::Path, process::Command};

use anyhow::{bail, Context as _};
use serde_json::Value;

use super::{ensure_tool, output};

/// Where the examples are in a checkout.
pub const SOURCE_DIR: &str = "packaging/monitoring";
/// The examples, installed as they are (an operator copies them into Grafana and Prometheus).
pub const FILES: &[&str] =
    &["guard-dashboard.json", "grafana-provisioning.yml", "guard-alerts.yml", "guard-alerts.test.yml"];

/// Checks the examples in `dir` (a checkout's `packaging/monitoring` or the package's
/// examples directory). Needs promtool (Debian: `prometheus`), installed when missing and root.
pub fn check(dir: &Path) -> anyhow::Result<()> {
    ensure_tool("promtool", "prometheus")?;
    let rules = output(
        Command::new("promtool").args(["check", "rules", "guard-alerts.yml"]).current_dir(dir),
        "promtool check rules",
    )?;
    println!("dist --check: promtool check rules: {}", rules.lines().last().unwrap_or("").trim());
    let tests = output(
        Command::new("promtool").args(["test", "rules", "guard-alerts.test.yml"]).current_dir(dir),
        "promtool test rules",
    )?;
    println!("dist --check: promtool test rules: {}", tests.lines().last().unwrap_or("").trim());
    let panels = dashboard(&dir.join("guard-dashboard.json"))?;
    println!("dist --check: guard-dashboard.json: {panels} panels, each querying the dashboard's Prometheus");
    Ok(())
}

/// The dashboard is JSON Grafana imports: unique panel ids, every panel and query on the
/// `${datasource}` variable (so it works with any Prometheus data source), every query a
/// non-empty expression. Returns the number of panels.
pub fn dashboard(path: &Path) -> anyhow::Result<usize> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let dash: Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let panels = dash["panels"].as_array().with_context(|| format!("{}: no panels", path.display()))?;
    let mut ids = BTreeSet::new();
    for p in panels {
        let title = p["title"].as_str().unwrap_or("(untitled)");
        if !ids.insert(p["id"].as_u64().with_context(|| format!("panel {title:?} has no id"))?) {
            bail!("panel {title:?} repeats id {}", p["id"]);
        }
        let targets = p["targets"].as_array().filter(|t| !t.is_empty());
        let targets = targets.with_context(|| format!("panel {title:?} has no query"))?;
        for ds in std::iter::once(&p["datasource"]).chain(targets.iter().map(|t| &t["datasource"])) {
            if ds["uid"] != "${datasource}" {
                bail!("panel {title:?} queries {ds} instead of the ${{datasource}} variable");
            }
        }
        if targets.iter().any(|t| t["expr"].as_str().is_none_or(|e| e.trim().is_empty())) {
            bail!("panel {title:?} has a query without an expression");
        }
    }
    Ok(panels.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dashboard_is_well_formed() {
        let dir = crate::build_ebpf::workspace_root().join(SOURCE_DIR);
        assert!(dashboard(&dir.join("guard-dashboard.json")).unwrap() >= 10);
    }

    /// Needs `promtool` (guard-test's `need::here`).
    mod needs_promtool {
        use super::*;

        #[test]
        #[ignore = "needs promtool: `cargo xtask test` runs it (--ignored); dist --check runs it too"]
        fn the_alert_rules_pass_promtool() {
            if !guard_test::need::here(&[guard_test::Need::Promtool], guard_test::Facts { bpf_object: false }) {
                return;
            }
            check(&crate::build_ebpf::workspace_root().join(SOURCE_DIR)).unwrap();
        }
    }
}
