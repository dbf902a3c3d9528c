//! `guard-user install` and `guard-user uninstall` (SPEC §8): resolve where things go, call
//! [`crate::install`], print the SPEC lines.
use std::{path::PathBuf, process::ExitCode};

use anyhow::Context;

use super::InstallArgs;
use crate::install::{self, Layout, Outcome, Systemctl};

/// Default `--unit-dir` and `--bin-dir`.
pub const UNIT_DIR: &str = "/etc/systemd/system";
pub const BIN_DIR: &str = "/usr/local/bin";

/// Validates the arguments into a [`Layout`] (shared with `check`).
pub fn layout(args: &InstallArgs) -> anyhow::Result<Layout> {
    let (account, home, config_link) = super::run::resolve_account(&args.account)?;
    let source = install::resolve_source(args.config_source.as_deref())?;
    Ok(Layout {
        account,
        home,
        config_link,
        source,
        unit_dir: args.unit_dir.clone().unwrap_or_else(|| PathBuf::from(UNIT_DIR)),
        bin_dir: args.bin_dir.clone().unwrap_or_else(|| PathBuf::from(BIN_DIR)),
    })
}

fn require_root(what: &str) -> anyhow::Result<()> {
    // SAFETY: geteuid cannot fail.
    anyhow::ensure!(unsafe { libc::geteuid() } == 0, "{what} needs root (run it with sudo)");
    Ok(())
}

pub fn main(args: InstallArgs) -> anyhow::Result<ExitCode> {
    require_root("install")?;
    let l = layout(&args)?;
    anyhow::ensure!(l.home.is_dir(), "{}: not a directory", l.home.display());
    let exe = std::env::current_exe().context("finding this binary to install")?;
    let (outcome, changes) = install::install(&l, &exe, &Systemctl).context("install")?;
    let code = match outcome {
        Outcome::Scheduled => {
            println!(
                "[OK] Host guard installed for {} in {} from {}, every 60s as {}",
                l.account.name,
                l.home.display(),
                l.source.display(),
                l.instance()
            );
            ExitCode::SUCCESS
        }
        Outcome::NotScheduled => {
            println!("[!!] Host guard linked in {}; systemd is not running, so the guard is not scheduled", l.home.display());
            ExitCode::from(1)
        }
    };
    if changes.is_empty() {
        println!("[OK] (already installed, nothing changed)");
    }
    for c in &changes {
        println!("  {c}");
    }
    Ok(code)
}

pub fn uninstall(args: InstallArgs) -> anyhow::Result<ExitCode> {
    require_root("uninstall")?;
    let l = layout(&args)?;
    let (changes, others) = install::uninstall(&l, &Systemctl).context("uninstall")?;
    println!(
        "[OK] Host guard removed for {}; kept {} and the log",
        l.account.name,
        l.config_link.display()
    );
    if !others.is_empty() {
        println!("  kept {} and {}: still used by {}", l.unit_path().display(), l.bin_path().display(), others.join(", "));
    }
    if changes.is_empty() {
        println!("  nothing was installed");
    }
    for c in &changes {
        println!("  {c}");
    }
    Ok(ExitCode::SUCCESS)
}
