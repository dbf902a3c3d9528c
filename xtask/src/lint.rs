//! `cargo xtask lint`: the gate CI runs before the tests — `cargo fmt --check` and
//! `cargo clippy --all-targets -D warnings` over the host workspace, then the same over the BPF
//! crate with its own nightly toolchain (its `rust-toolchain.toml`), when that toolchain has
//! clippy and rustfmt (say so and skip otherwise).
use std::process::Command;

use anyhow::{bail, Context};

use crate::{build, build_ebpf};

#[derive(clap::Args, Debug, Default)]
pub struct Options {
    /// Only the host workspace (skip guard-ebpf).
    #[arg(long)]
    pub host_only: bool,
}

fn step(name: &str, cmd: &mut Command) -> anyhow::Result<()> {
    println!("lint: {name}");
    let status = cmd.status().with_context(|| format!("running {name}"))?;
    if !status.success() {
        bail!("{name} failed ({status})");
    }
    Ok(())
}

/// Whether `rustup component list --toolchain nightly --installed` lists `component`.
fn nightly_has(component: &str) -> bool {
    Command::new("rustup")
        .args(["component", "list", "--toolchain", "nightly", "--installed"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l.starts_with(component)))
        .unwrap_or(false)
}

pub fn run(opts: Options) -> anyhow::Result<()> {
    let root = build_ebpf::workspace_root();
    step("cargo fmt --all --check", build::host_cargo().args(["fmt", "--all", "--check"]).current_dir(&root))?;
    step(
        "cargo clippy --workspace --all-targets -- -D warnings",
        build::host_cargo().args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]).current_dir(&root),
    )?;
    if opts.host_only {
        return Ok(());
    }
    let ebpf = root.join("guard-ebpf");
    // The BPF crate builds `core` from source (build-std), so even clippy needs the nightly's
    // rust-src: a fresh machine has the toolchain without it.
    build_ebpf::ensure_rust_src()?;
    if nightly_has("rustfmt") {
        step("guard-ebpf: cargo fmt --check", build_ebpf::ebpf_cargo().args(["fmt", "--check"]).current_dir(&ebpf))?;
    } else {
        println!("lint: guard-ebpf fmt skipped: the nightly toolchain has no rustfmt (rustup component add rustfmt --toolchain nightly)");
    }
    if nightly_has("clippy") {
        step(
            "guard-ebpf: cargo clippy -- -D warnings",
            build_ebpf::ebpf_cargo().args(["clippy", "--release", "--", "-D", "warnings"]).current_dir(&ebpf),
        )?;
    } else {
        println!("lint: guard-ebpf clippy skipped: the nightly toolchain has no clippy (rustup component add clippy --toolchain nightly)");
    }
    Ok(())
}
