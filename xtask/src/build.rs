//! `cargo xtask build [--release] [--target aarch64-unknown-linux-gnu]`: the BPF object, then
//! guard-user embedding it, for the build machine or cross-built for another architecture
//! ([`crate::arch`]: the rustup target and Debian's cross toolchain are installed when missing).
//!
//! guard-user's build script embeds the object named by `GUARD_EBPF_OBJ`; passing the
//! absolute path means it never silently falls back to a stale or missing default. The object
//! is the same for every architecture (little-endian BPF).
use std::{env, path::PathBuf, process::Command};

use crate::{arch::Arch, build_ebpf};

#[derive(clap::Args, Debug)]
pub struct Options {
    /// Build guard-user with the release profile.
    #[arg(long)]
    pub release: bool,
    /// The Rust target to build guard-user for (x86_64-unknown-linux-gnu or
    /// aarch64-unknown-linux-gnu); default: the build machine's.
    #[arg(long, value_name = "TRIPLE")]
    pub target: Option<String>,
}

pub fn run(opts: Options) -> anyhow::Result<()> {
    let arch = opts.target.as_deref().map(Arch::from_target).transpose()?.unwrap_or_else(Arch::host);
    let started = std::time::Instant::now();
    let binary = build_for(opts.release, arch)?;
    println!("guard-user ({}): built in {:.1}s", arch.rust_target(), started.elapsed().as_secs_f64());
    println!("guard-user: {}", binary.display());
    Ok(())
}

/// Builds everything for the build machine and returns the path of the guard-user binary.
pub fn build(release: bool) -> anyhow::Result<PathBuf> {
    build_for(release, Arch::host())
}

/// Builds the BPF object and guard-user for `arch`; returns the binary's path
/// (`target/<profile>/guard-user`, `target/<triple>/<profile>/guard-user` for a cross build).
pub fn build_for(release: bool, arch: Arch) -> anyhow::Result<PathBuf> {
    let object = build_ebpf::build(&build_ebpf::Options::default())?;
    arch.ensure_toolchain()?;
    let profile = if release { "release" } else { "debug" };
    println!(
        "guard-user: cargo build -p guard-user{}{} (GUARD_EBPF_OBJ={})",
        if release { " --release" } else { "" },
        if arch.is_host() { String::new() } else { format!(" --target {}", arch.rust_target()) },
        object.display()
    );
    let mut cargo = host_cargo();
    cargo.args(["build", "-p", "guard-user"]).env("GUARD_EBPF_OBJ", &object).current_dir(build_ebpf::workspace_root());
    arch.cargo_args(&mut cargo);
    if release {
        cargo.arg("--release");
    }
    build_ebpf::run_checked(&mut cargo, "building guard-user")?;
    let binary = build_ebpf::target_dir().join(arch.target_subdir()).join(profile).join("guard-user");
    anyhow::ensure!(binary.is_file(), "the build succeeded but left no binary at {}", binary.display());
    Ok(binary)
}

/// The cargo that runs xtask (the host toolchain), for builds of the host workspace.
pub fn host_cargo() -> Command {
    Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}
