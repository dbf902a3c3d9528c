//! `guard-user check` (SPEC §8): reports drift of the installation; changes nothing.
use std::{process::ExitCode, time::SystemTime};

use anyhow::Context;

use super::InstallArgs;
use crate::install::{self, Systemctl};

pub fn main(args: InstallArgs) -> anyhow::Result<ExitCode> {
    let l = super::install::layout(&args)?;
    let exe = std::env::current_exe().context("finding this binary")?;
    let report = install::check(&l, &exe, &Systemctl, SystemTime::now());
    for d in &report.drift {
        println!("{d}");
    }
    if report.drift.is_empty() {
        println!("[OK] Host guard in sync with {}", l.source.display());
    }
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 && !report.skipped.is_empty() {
        println!("not root, so these checks were skipped:");
    }
    for s in &report.skipped {
        println!("  skipped: {s}");
    }
    Ok(if report.drift.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
