//! `guard-user match --pattern P [--cmdline TEXT]…` (SPEC §7).
use std::{io::Write, process::ExitCode};

use super::MatchArgs;
use crate::{pattern::Pattern, procfs};

pub fn main(args: MatchArgs) -> anyhow::Result<ExitCode> {
    let pattern = match Pattern::new(&args.pattern) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("guard-user match: {e}; fix the pattern (it must be a bash extended regex)");
            return Ok(ExitCode::from(2));
        }
    };
    let mut out = std::io::stdout().lock();
    if !args.cmdline.is_empty() {
        for text in &args.cmdline {
            writeln!(out, "{}", if pattern.is_match(text.as_bytes()) { "match" } else { "other" })?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let (account, _, _) = super::run::resolve_account(&args.account)?;
    let mut procs: Vec<_> = procfs::snapshot()?.into_iter().filter(|p| p.euid == account.uid).collect();
    procs.sort_by_key(|p| p.id.pid);
    for p in procs {
        if p.id.pid == std::process::id() {
            continue;
        }
        let Some(cmd) = procfs::cmdline(p.id.pid) else { continue };
        let verdict = if pattern.is_match(&cmd) { "match" } else { "other" };
        writeln!(out, "{verdict} {} {}", p.id.pid, String::from_utf8_lossy(&cmd))?;
    }
    Ok(ExitCode::SUCCESS)
}
