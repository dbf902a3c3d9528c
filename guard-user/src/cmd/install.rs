//! `guard-user install` and `guard-user uninstall` (docs/operations.md): turn the arguments into an
//! [`install::Request`], call [`crate::install`], print the documented lines.
use std::{path::PathBuf, process::ExitCode};

use anyhow::Context;

use super::InstallArgs;
use crate::install::{self, shown, Layout, Outcome, Request, Systemctl};

/// Default `--unit-dir` and `--bin-dir`.
pub const UNIT_DIR: &str = "/etc/systemd/system";
pub const BIN_DIR: &str = "/usr/local/bin";

/// The request `install`, `check` and `uninstall` validate. `GUARD_PACKAGED_ROOT` (tests) moves
/// the packaged layout (`/usr/bin`, `/lib/systemd/system`, `/usr/share/guard-user`) under a
/// directory.
pub fn request(args: &InstallArgs) -> anyhow::Result<Request> {
    // Relative paths mean the caller's directory; the daemon runs in `/`.
    let absolute = |p: &PathBuf| std::path::absolute(p).with_context(|| format!("{}", p.display()));
    Ok(Request {
        user: args.account.user.clone(),
        home: args.account.home.as_ref().map(absolute).transpose()?,
        config: args.account.config.as_ref().map(absolute).transpose()?,
        config_source: args.config_source.clone(),
        unit_dir: args.unit_dir.clone().unwrap_or_else(|| PathBuf::from(UNIT_DIR)),
        bin_dir: args.bin_dir.clone().unwrap_or_else(|| PathBuf::from(BIN_DIR)),
        packaged_root: std::env::var_os("GUARD_PACKAGED_ROOT").map(PathBuf::from).unwrap_or_else(|| "/".into()),
        exe: std::env::current_exe().context("finding this binary")?,
    })
}

fn require_root(what: &str) -> anyhow::Result<()> {
    // SAFETY: geteuid cannot fail.
    anyhow::ensure!(unsafe { libc::geteuid() } == 0, "{what} needs root (run it with sudo)");
    Ok(())
}

pub fn main(args: InstallArgs) -> anyhow::Result<ExitCode> {
    require_root("install")?;
    let l = Layout::for_install(&request(&args)?)?;
    let (outcome, changes) = install::install(&l, &Systemctl).context("install")?;
    let code = match outcome {
        Outcome::Scheduled => {
            println!(
                "[OK] Host guard installed for {} in {} from {}, every 60s as {}",
                l.user,
                shown(&l.home),
                shown(l.source.as_deref().unwrap_or(std::path::Path::new(""))),
                l.instance()
            );
            ExitCode::SUCCESS
        }
        Outcome::NotScheduled => {
            println!(
                "[!!] Host guard linked in {}; systemd is not running, so the guard is not scheduled",
                shown(&l.home)
            );
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
    let l = Layout::for_uninstall(&request(&args)?)?;
    let (changes, others) = install::uninstall(&l, &Systemctl).context("uninstall")?;
    println!("[OK] Host guard removed for {}; kept {} and the log", l.user, shown(&l.config_link));
    if !others.is_empty() {
        println!("  kept {} and {}: still used by {}", shown(&l.unit_path()), shown(&l.bin_path()), others.join(", "));
    }
    if changes.is_empty() {
        println!("  nothing was installed");
    }
    for c in &changes {
        println!("  {c}");
    }
    Ok(ExitCode::SUCCESS)
}
