//! `cargo xtask test [--long] [-- <cargo test args>]`: every test of the host workspace.
//!
//! Builds the BPF object first and hands its path to the build through `GUARD_EBPF_OBJ`, so
//! the kernel tests load what was just built. Those tests need root (BPF, signals to other
//! uids) and skip without it; the Redis tests need a `redis-server` binary, which is installed
//! with apt-get when missing and possible. The same tests in guests of other kernels are
//! `cargo xtask vm`.
use std::{ffi::OsString, process::Command};

use crate::{build, build_ebpf, run::is_root};

#[derive(clap::Args, Debug)]
pub struct Options {
    /// Also run the long tests (sets GUARD_LONG_TESTS=1).
    #[arg(long)]
    pub long: bool,
    /// Arguments for `cargo test --workspace`, after `--` (e.g. `-- -p guard-user -- --test-threads=1`).
    #[arg(last = true)]
    pub cargo_args: Vec<OsString>,
}

pub fn run(opts: Options) -> anyhow::Result<()> {
    let object = build_ebpf::build(&build_ebpf::Options::default())?;
    let root = is_root();
    if !root {
        eprintln!("test: WARNING: not root — the kernel tests (BPF loading, signalling other uids) will skip; run `sudo -E cargo xtask test`");
    }
    ensure_redis_server(root);

    let mut cargo = build::host_cargo();
    cargo
        .args(["test", "--workspace"])
        .args(&opts.cargo_args)
        .env("GUARD_EBPF_OBJ", &object)
        .current_dir(build_ebpf::workspace_root());
    if opts.long {
        cargo.env("GUARD_LONG_TESTS", "1");
    }
    println!(
        "test: cargo test --workspace{}{} (GUARD_EBPF_OBJ={})",
        opts.cargo_args.iter().map(|a| format!(" {}", a.to_string_lossy())).collect::<String>(),
        if opts.long { ", GUARD_LONG_TESTS=1" } else { "" },
        object.display()
    );
    build_ebpf::run_checked(&mut cargo, "cargo test --workspace")
}

/// Makes `redis-server` available for the Redis mirror tests; never fails the run (those
/// tests say themselves what is missing).
fn ensure_redis_server(root: bool) {
    if let Some(path) = build_ebpf::which("redis-server") {
        println!("redis-server: present ({})", path.display());
        return;
    }
    if !root || build_ebpf::which("apt-get").is_none() {
        eprintln!("redis-server: missing and cannot install it here (needs root and apt-get); the Redis tests will skip or fail");
        return;
    }
    println!("redis-server: installing (apt-get install -y redis-server)");
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends", "redis-server"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    if install() {
        return;
    }
    // A fresh machine may have no package lists yet.
    println!("redis-server: install failed; running apt-get update and retrying");
    let updated = Command::new("apt-get").arg("update").status().is_ok_and(|s| s.success());
    if !(updated && install()) {
        eprintln!("redis-server: could not be installed; the Redis tests will skip or fail");
    }
}
