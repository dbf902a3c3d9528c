//! `cargo xtask build [--release]`: the BPF object, then guard-user embedding it.
//!
//! guard-user's build script embeds the object named by `GUARD_EBPF_OBJ`; passing the
//! absolute path means it never silently falls back to a stale or missing default.
use std::{env, path::PathBuf, process::Command};

use crate::build_ebpf;

#[derive(clap::Args, Debug)]
pub struct Options {
    /// Build guard-user with the release profile.
    #[arg(long)]
    pub release: bool,
}

pub fn run(opts: Options) -> anyhow::Result<()> {
    let binary = build(opts.release)?;
    println!("guard-user: {}", binary.display());
    Ok(())
}

/// Builds everything and returns the path of the guard-user binary.
pub fn build(release: bool) -> anyhow::Result<PathBuf> {
    let object = build_ebpf::build(&build_ebpf::Options::default())?;
    let profile = if release { "release" } else { "debug" };
    println!(
        "guard-user: cargo build -p guard-user{} (GUARD_EBPF_OBJ={})",
        if release { " --release" } else { "" },
        object.display()
    );
    let mut cargo = host_cargo();
    cargo.args(["build", "-p", "guard-user"]).env("GUARD_EBPF_OBJ", &object).current_dir(build_ebpf::workspace_root());
    if release {
        cargo.arg("--release");
    }
    build_ebpf::run_checked(&mut cargo, "building guard-user")?;
    let binary = build_ebpf::target_dir().join(profile).join("guard-user");
    anyhow::ensure!(binary.is_file(), "the build succeeded but left no binary at {}", binary.display());
    Ok(binary)
}

/// The cargo that runs xtask (the host toolchain), for builds of the host workspace.
pub fn host_cargo() -> Command {
    Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}
