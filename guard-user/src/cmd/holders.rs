//! `guard-user holders DIR [--user NAME] [--json] [--stop]` (docs/operations.md): the account's
//! processes working in DIR or below it, each with the command that stops it; exit 0 when there
//! are none, 1 when some. `--stop` ends them (SIGTERM, up to 10 s, SIGKILL, each through a pidfd
//! after the identity check) and prints what became of each; exit 0 when none is left.
use std::{process::ExitCode, time::Duration};

use anyhow::Context;
use serde::Serialize;

use super::HoldersArgs;
use crate::{
    duration::human,
    enforcer::Enforcer,
    escape,
    holders::{self, Holder, Stopped},
};

/// How long `--stop` waits between SIGTERM and SIGKILL.
pub const STOP_WAIT: Duration = Duration::from_secs(10);

#[derive(Serialize)]
struct Row {
    pid: u32,
    name: String,
    program: Option<String>,
    cwd: String,
    cpu_secs: f64,
    age_secs: u64,
    /// The command that stops it.
    stop: String,
    /// With `--stop`: `stopped`, `killed`, `moved_out` or `left`.
    #[serde(skip_serializing_if = "Option::is_none")]
    outcome: Option<&'static str>,
}

fn row(h: &Holder, outcome: Option<Stopped>) -> Row {
    Row {
        pid: h.proc.id.pid,
        name: h.proc.comm.to_string(),
        program: h.program.as_ref().map(|p| escape::text(p.as_os_str().as_encoded_bytes())),
        cwd: escape::text(h.cwd.as_os_str().as_encoded_bytes()),
        cpu_secs: h.cpu_secs,
        age_secs: h.age_secs,
        stop: format!("kill {}", h.proc.id.pid),
        outcome: outcome.map(|o| match o {
            Stopped::Termed => "stopped",
            Stopped::Killed => "killed",
            Stopped::MovedOut => "moved_out",
            Stopped::Left => "left",
        }),
    }
}

pub fn main(args: HoldersArgs) -> anyhow::Result<ExitCode> {
    let purpose = if args.stop { crate::account::Purpose::Acts } else { crate::account::Purpose::Reads };
    let (account, _, _) = super::account(&args.account, "holders", purpose)?;
    let shown_dir = escape::text(args.dir.as_os_str().as_encoded_bytes());
    let dir = args.dir.canonicalize().with_context(|| format!("{shown_dir}: cannot resolve the directory"))?;
    let found = holders::find(&dir, account.uid).context("reading /proc")?;
    let outcomes = if args.stop && !found.is_empty() {
        let enforcer = Enforcer::new(account.uid, std::process::id(), STOP_WAIT);
        Some(holders::stop(&found, &dir, &enforcer, STOP_WAIT))
    } else {
        None
    };
    let rows: Vec<Row> = found.iter().enumerate().map(|(i, h)| row(h, outcomes.as_ref().map(|o| o[i]))).collect();
    if args.json {
        println!("{}", crate::status::json_for_terminal(&serde_json::to_string_pretty(&rows)?));
    } else {
        print!("{}", render(&rows, &shown_dir, args.stop));
    }
    let left = match &outcomes {
        Some(o) => o.iter().any(|o| matches!(o, Stopped::Left)),
        None => !rows.is_empty(),
    };
    Ok(if left { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

fn render(rows: &[Row], dir: &str, stopping: bool) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if rows.is_empty() {
        let _ = writeln!(out, "no process of the account works in {dir}");
        return out;
    }
    let _ = writeln!(out, "{:>8}  {:<16} {:>9} {:>8}  {:<14} PROGRAM / CWD", "PID", "NAME", "CPU", "AGE", "STOP WITH");
    for r in rows {
        let _ = writeln!(
            out,
            "{:>8}  {:<16} {:>8.2}s {:>8}  {:<14} {} / {}",
            r.pid,
            r.name,
            r.cpu_secs,
            human(Duration::from_secs(r.age_secs)),
            r.stop,
            r.program.as_deref().unwrap_or("?"),
            r.cwd
        );
    }
    if stopping {
        for r in rows {
            let what = match r.outcome {
                Some("stopped") => "stopped (gone after SIGTERM)",
                Some("killed") => "killed (SIGKILL after 10s)",
                Some("moved_out") => "left alone: it left the directory",
                _ => "left alone: gone, or its identity changed",
            };
            let _ = writeln!(out, "{} {}: {what}", r.pid, r.name);
        }
    } else {
        let _ = writeln!(out, "to stop them all the checked way: guard-user holders {dir} --stop");
    }
    out
}
