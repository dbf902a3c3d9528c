//! `guard-user install` and `guard-user uninstall` (docs/operations.md): turn the arguments into an
//! [`install::Request`], call [`crate::install`], print the documented lines.
use std::{path::PathBuf, process::ExitCode};

use anyhow::Context;

use super::InstallArgs;
use crate::{
    account::{Account, Purpose},
    install::{self, shown, Layout, Outcome, Request, Systemctl},
};

/// Default `--unit-dir` and `--bin-dir`.
pub const UNIT_DIR: &str = "/etc/systemd/system";
pub const BIN_DIR: &str = "/usr/local/bin";

/// The request `install`, `check` and `uninstall` validate. `GUARD_PACKAGED_ROOT` (tests) moves
/// the packaged layout (`/usr/bin`, `/lib/systemd/system`, `/usr/share/guard-user`) under a
/// directory.
pub fn request(args: &InstallArgs, user: &Account) -> anyhow::Result<Request> {
    // Relative paths mean the caller's directory; the daemon runs in `/`.
    let absolute = |p: &PathBuf| std::path::absolute(p).with_context(|| format!("{}", p.display()));
    Ok(Request {
        account: user.clone(),
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
    let (account, _, _) = super::account(&args.account, "install", Purpose::Acts)?;
    let l = Layout::for_install(&request(&args, &account)?)?;
    let (outcome, changes) = install::install(&l, &Systemctl).context("install")?;
    let scheduled = outcome == Outcome::Scheduled;
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
    match (scheduled, changes.is_empty()) {
        (true, true) => println!("[OK] (already installed, nothing changed)"),
        // Not an outcome of its own: the `[!!]` line above is the one outcome.
        (false, true) => println!("  nothing changed"),
        _ => {}
    }
    for c in &changes {
        println!("  {c}");
    }
    if !scheduled {
        // The way forward (docs/operations.md, exit status 1): the command the unit would run.
        let argv = l.dropin()?.argv();
        println!("  nothing will start it here: run it as root under this host's own service manager:");
        println!("    {}", argv.iter().map(|w| shell_word(w)).collect::<Vec<_>>().join(" "));
        println!("  or run guard-user install again once systemd runs");
    }
    Ok(code)
}

/// `word` as a POSIX shell reads it back: bare when it is plain, else single-quoted.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_./:@%+=,-".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

pub fn uninstall(args: InstallArgs) -> anyhow::Result<ExitCode> {
    require_root("uninstall")?;
    let (account, _, _) = super::account(&args.account, "uninstall", Purpose::Acts)?;
    let l = Layout::for_uninstall(&request(&args, &account)?)?;
    let (changes, others) = install::uninstall(&l, &Systemctl).context("uninstall")?;
    // The daemon is stopped: nothing it held may stay frozen (its unit's ExecStopPost= did
    // this already where systemd runs; this covers a daemon that ran without it).
    let released = super::slots_release::release_all();
    println!("[OK] Host guard removed for {}; kept {} and the log", l.user, shown(&l.config_link));
    if released > 0 {
        println!("  released {released} commands a heavy-command slot held");
    }
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
