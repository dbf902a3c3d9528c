//! `guard-user check` (docs/operations.md): reports drift of the installation; changes nothing.
use std::{process::ExitCode, time::SystemTime};

use super::InstallArgs;
use crate::{
    account::Account,
    install::{self, Layout, Systemctl},
};

/// `check` for the account the arguments name. As root with no account named (no `--user`, not
/// through sudo), root's own instance is never what is meant: every instance installed in the
/// unit directory is checked instead, each under a line naming it.
pub fn main(args: InstallArgs) -> anyhow::Result<ExitCode> {
    let resolved = Account::resolve(args.account.user.as_deref())?;
    if !resolved.is_implicit_root() {
        return check_one(&args, &resolved.account);
    }
    anyhow::ensure!(
        args.account.home.is_none() && args.account.config.is_none(),
        "--home and --config name one account's files: pass --user NAME with them"
    );
    let unit_dir = args.unit_dir.clone().unwrap_or_else(|| super::install::UNIT_DIR.into());
    let accounts = install::installed_accounts(&unit_dir);
    if accounts.is_empty() {
        println!(
            "no guard is installed in {} (no guard-user@ACCOUNT.service.d/home.conf): guard-user install --user NAME \
             installs one",
            install::shown(&unit_dir)
        );
        return Ok(ExitCode::from(1));
    }
    let mut drift = false;
    for name in &accounts {
        // The first line names whom it read (no --user was given).
        println!("{}:", install::instance_name(name));
        // An account removed (userdel) without `uninstall` leaves its instance: drift to say,
        // and the other instances are checked all the same.
        let Ok(account) = Account::by_name(name.as_str()) else {
            let dir = unit_dir.join(format!("{}.d", install::instance_name(name)));
            println!(
                "the account {name} no longer exists, yet its guard is installed ({}): systemctl disable --now {} and \
                 remove that directory",
                install::shown(&dir),
                install::instance_name(name)
            );
            drift = true;
            continue;
        };
        drift |= check_one(&args, &account)? != ExitCode::SUCCESS;
    }
    Ok(if drift { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

fn check_one(args: &InstallArgs, account: &Account) -> anyhow::Result<ExitCode> {
    let l = Layout::for_check(&super::install::request(args, account)?)?;
    let mut report = install::check(&l, &Systemctl, SystemTime::now());
    // docs/operations.md: the fleet heartbeat at the current endpoint. A missing heartbeat is drift; an
    // unreachable Redis is said but is not drift (the guard never depends on Redis).
    // Why a drift line is there (e.g. how a drop-in differs): on stderr with the other notes.
    let mut notes = std::mem::take(&mut report.notes);
    {
        use crate::mirror::{check_lines, read_heartbeat, Endpoint};
        let endpoint = Endpoint::from_env();
        let host = crate::daemon::hostname();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let result = rt.block_on(read_heartbeat(&endpoint, &host, &l.account.name, Some(l.account.uid)));
        if let Some(line) = check_lines(&endpoint, &host, &l.account.name, &result) {
            // What an account's listener holds is no heartbeat to hold this guard to: said, not drift.
            if result.as_ref().map_or(true, |r| r.written_by.is_some()) {
                notes.push(line);
            } else {
                report.drift.push(line);
            }
        }
    }
    for d in &report.drift {
        println!("{d}");
    }
    if report.drift.is_empty() {
        // A missing or untrusted record is drift, so the source is known here unless the record
        // was one of the checks skipped for want of root.
        match report.source.as_deref() {
            Some(source) => println!("[OK] Host guard in sync with {}", install::shown(source)),
            None => println!("[OK] Host guard in sync (its config source was not checked)"),
        }
    }
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 && !report.skipped.is_empty() {
        println!("not root, so these checks were skipped:");
    }
    // After the verdict: what the service runs with beyond its drop-in.
    if let Some(flags) = &report.flags {
        println!("{flags}");
    }
    for s in &report.skipped {
        println!("  skipped: {s}");
    }
    // Not drift, so on stderr: stdout stays the drift lines or the `[OK]` line.
    for n in &notes {
        eprintln!("{n}");
    }
    Ok(if report.drift.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
