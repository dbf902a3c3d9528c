//! `cargo xtask run [--release] -- <args>`: build, then become guard-user with `<args>`.
//!
//! Loading BPF programs needs root, so a non-root caller is re-run through `sudo -E` when
//! sudo exists. xtask `exec`s the binary rather than waiting on it: signals (Ctrl-C, SIGTERM)
//! reach guard-user directly and its exit code is the command's exit code.
use std::{ffi::OsString, os::unix::process::CommandExt as _, process::Command};

use anyhow::Context as _;

use crate::{build, build_ebpf, build_ebpf::is_root};

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
