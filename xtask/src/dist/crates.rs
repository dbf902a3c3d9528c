//! Which crates end up inside the packaged binary, for the copyright file: guard-user's normal
//! dependencies (host workspace) and guard-ebpf's (the BPF object it embeds), from
//! `cargo metadata`'s resolved graph. Build dependencies and proc-macro crates run at build time
//! only and are left out, as are guard's own workspace crates.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use anyhow::Context as _;
use serde_json::Value;

use super::debian::Crate;
use crate::build::host_cargo;

pub fn linked(root: &Path) -> anyhow::Result<BTreeSet<Crate>> {
    let mut all = BTreeSet::new();
    for (manifest, start, platform) in
        [("Cargo.toml", "guard-user", Some("x86_64-unknown-linux-gnu")), ("guard-ebpf/Cargo.toml", "guard-ebpf", None)]
    {
        let mut cargo = host_cargo();
        cargo.args(["metadata", "--format-version", "1", "--locked", "--manifest-path"]).arg(root.join(manifest));
        if let Some(p) = platform {
            cargo.args(["--filter-platform", p]);
        }
        let out = cargo.output().context("running cargo metadata")?;
        anyhow::ensure!(
            out.status.success(),
            "cargo metadata --manifest-path {manifest} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let meta: Value = serde_json::from_slice(&out.stdout).context("parsing cargo metadata")?;
        all.extend(reachable(&meta, start)?);
    }
    Ok(all)
}

/// The non-workspace crates `start` links, following normal (not build, not dev) dependency edges
/// and skipping proc-macro crates.
pub fn reachable(meta: &Value, start: &str) -> anyhow::Result<BTreeSet<Crate>> {
    let packages: BTreeMap<&str, &Value> = meta["packages"]
        .as_array()
        .context("no packages in cargo metadata")?
        .iter()
        .filter_map(|p| Some((p["id"].as_str()?, p)))
        .collect();
    let members: BTreeSet<&str> =
        meta["workspace_members"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let nodes: BTreeMap<&str, &Value> = meta["resolve"]["nodes"]
        .as_array()
        .context("no resolve graph in cargo metadata")?
        .iter()
        .filter_map(|n| Some((n["id"].as_str()?, n)))
        .collect();
    let first = packages
        .iter()
        .find(|(id, p)| p["name"] == start && members.contains(*id))
        .map(|(id, _)| *id)
        .with_context(|| format!("{start} is not a workspace member"))?;
    let is_proc_macro = |p: &Value| {
        p["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| t["kind"].as_array().is_some_and(|k| k.contains(&"proc-macro".into())))
    };
    let mut seen = BTreeSet::from([first]);
    let mut todo = vec![first];
    while let Some(id) = todo.pop() {
        for dep in nodes.get(id).and_then(|n| n["deps"].as_array()).into_iter().flatten() {
            let normal = dep["dep_kinds"].as_array().into_iter().flatten().any(|k| k["kind"].is_null());
            let Some(dep_id) = dep["pkg"].as_str() else { continue };
            if normal && packages.get(dep_id).is_some_and(|p| !is_proc_macro(p)) && seen.insert(dep_id) {
                todo.push(dep_id);
            }
        }
    }
    Ok(seen
        .into_iter()
        .filter(|id| !members.contains(id))
        .map(|id| {
            let p = packages[id];
            let s = |k: &str| p[k].as_str().unwrap_or("").to_string();
            let license =
                p["license"].as_str().map(str::to_string).unwrap_or_else(|| "see the crate's license file".into());
            Crate { name: s("name"), version: s("version"), license }
        })
        .collect())
}
