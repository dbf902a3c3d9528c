//! `cargo xtask run [--release] -- <args>`: build, then become guard-user with `<args>`.
//!
//! Loading BPF programs needs root, so a non-root caller is re-run through `sudo -E` when
//! sudo exists. xtask `exec`s the binary rather than waiting on it: signals (Ctrl-C, SIGTERM)
//! reach guard-user directly and its exit code is the command's exit code.
use std::{ffi::OsString, os::unix::process::CommandExt as _, process::Command};

use anyhow::Context as _;

use crate::{build, build_ebpf};

#[derive(clap::Args, Debug)]
pub struct Options {
    /// Build and run the release profile.
    #[arg(long)]
    pub release: bool,
    /// Arguments for guard-user, after `--` (e.g. `cargo xtask run -- --dry-run`).
    #[arg(last = true)]
    pub args: Vec<OsString>,
}

pub fn run(opts: Options) -> anyhow::Result<()> {
    let binary = build::build(opts.release)?;
    let mut command = if is_root() {
        Command::new(&binary)
    } else if let Some(sudo) = build_ebpf::which("sudo") {
        eprintln!("run: not root; re-running through sudo -E (loading BPF programs needs root)");
        let mut sudo = Command::new(sudo);
        sudo.arg("-E").arg(&binary);
        sudo
    } else {
        eprintln!(
            "run: not root and no sudo: loading BPF programs needs root, so the ebpf backend will fail \
             (the procfs backend still runs)"
        );
        Command::new(&binary)
    };
    command.args(&opts.args);
    let err = command.exec();
    Err(err).with_context(|| format!("starting {}", binary.display()))
}

/// Whether xtask runs with effective uid 0. `/proc/self` is owned by the effective uid, which
/// spares xtask a libc dependency; `id -u` is the fallback.
pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match std::fs::metadata("/proc/self") {
        Ok(meta) => meta.uid() == 0,
        Err(_) => Command::new("id")
            .arg("-u")
            .output()
            .map(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
            .unwrap_or(false),
    }
}
