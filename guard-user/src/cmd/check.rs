//! `guard-user check` (docs/operations.md): reports drift of the installation; changes nothing.
use std::{process::ExitCode, time::SystemTime};

use super::InstallArgs;
use crate::install::{self, Layout, Systemctl};

pub fn main(args: InstallArgs) -> anyhow::Result<ExitCode> {
    let l = Layout::for_check(&super::install::request(&args)?)?;
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
    for s in &report.skipped {
        println!("  skipped: {s}");
    }
    // Not drift, so on stderr: stdout stays the drift lines or the `[OK]` line.
    for n in &notes {
        eprintln!("{n}");
    }
    Ok(if report.drift.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
