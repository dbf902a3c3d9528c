//! `guard-user status [--json]` (docs/operations.md): reads the status file the daemon writes every tick.
//! Both views exit 1 when the last tick is stale ([`Freshness`]) or its config was invalid (that
//! tick ended nothing): a guard that is not guarding never reads as healthy.
//!
//! The status file lives in the account's home, so the account can rewrite any of it: every text
//! shown goes through [`escape_for_terminal`] (a name holding a newline cannot forge a row) and
//! every number is shown without trusting it to be sane.
use std::{fmt::Write as _, process::ExitCode, time::Duration, time::SystemTime};

use serde::Serialize;

use super::StatusArgs;
use crate::{
    account::Purpose,
    duration::human,
    status::{self, escape_for_terminal, Freshness, Status},
};

pub fn main(args: StatusArgs) -> anyhow::Result<ExitCode> {
    if args.fleet {
        return super::fleet::main(args.json);
    }
    let (account, home, config_path) = super::account(&args.account, "status", Purpose::Reads)?;
    let who = crate::safefs::FsIdentity::from(&account);
    let path = status::locate(&config_path, &home, who);
    let copy = crate::daemon::instance::trusted_status(account.uid, &home);
    let s = match status::read_trusted(&path, who, copy.as_ref()) {
        Ok(s) => s,
        Err(e) => {
            if e.is_missing() {
                eprintln!(
                    "guard-user status: no status file yet ({}): the guard writes it after every tick; is it running? (guard-user check tells)",
                    path.display()
                );
            } else {
                eprintln!("guard-user status: {e}");
            }
            return Ok(ExitCode::from(1));
        }
    };
    let now = SystemTime::now();
    if args.json {
        println!("{}", render_json(&s, now));
    } else {
        print!("{}", render_table(&s, now));
    }
    Ok(if s.freshness(now).stale || s.config_error.is_some() { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// What `status --json` prints: the status file's fields, plus what only the reader can know.
#[derive(Serialize)]
struct Report<'a> {
    #[serde(flatten)]
    status: &'a Status,
    /// docs/operations.md: the last tick is older than two intervals (the exit code is then 1).
    stale: bool,
    /// Seconds since the last tick completed.
    last_tick_age_secs: f64,
}

/// `status --json`: pretty JSON of the status, `stale` and `last_tick_age_secs`. Control
/// characters are `\u` escapes (serde_json does that for C0; C1 and the bidirectional controls
/// are done here), so the JSON is also safe to print on a terminal.
pub fn render_json(s: &Status, now: SystemTime) -> String {
    let f = s.freshness(now);
    let report = Report { status: s, stale: f.stale, last_tick_age_secs: f.age_secs };
    status::json_for_terminal(&serde_json::to_string_pretty(&report).expect("a status always serializes"))
}

/// A duration from seconds the file claims: negative reads as zero, too large as the largest.
fn secs(x: f64) -> Duration {
    Duration::try_from_secs_f64(x.max(0.0)).unwrap_or(Duration::MAX)
}

fn text(s: &str) -> String {
    escape_for_terminal(s.as_bytes())
}

/// `status`: the daemon's figures, then one row per name at or over half the threshold, then the
/// optional sections (warnings, vitals, repeat offenders, pegged processes) when the daemon wrote them.
pub fn render_table(s: &Status, now: SystemTime) -> String {
    let Freshness { age_secs, stale } = s.freshness(now);
    let now_secs = now.duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let mut rows = vec![
        ("user", format!("{} (uid {})", text(&s.user), s.uid)),
        ("pid", s.pid.to_string()),
        ("backend", format!("{}{}", text(&s.backend), if s.dry_run { " (dry run)" } else { "" })),
        ("uptime", human(secs(now_secs - s.started_at))),
        (
            "last tick",
            format!("{} ago{}", human(secs(age_secs)), if stale { " (STALE: the guard is not ticking)" } else { "" }),
        ),
        ("events", s.events.to_string()),
        ("lost events", s.lost_events.to_string()),
        ("resyncs", s.resyncs.to_string()),
        ("kills", kills(s)),
        ("tracked", tracked(s)),
    ];
    if let Some(e) = &s.config_error {
        // The ERROR line's reason is already in the log's escaped form: shown as the log has it
        // (only what a hand-edited status file could hide is escaped).
        rows.push(("config", format!("INVALID, so nothing is ended: {}", crate::escape::printable(e))));
    }
    for n in s.names.iter().filter(|n| n.warned) {
        rows.push(("warning", warning(n)));
    }
    if s.cmdlines_unread_total > 0 {
        // Only once it happened: a guard that reads every command line in time says nothing.
        rows.push((
            "unread",
            format!(
                "{} command lines not read in time at the last tick, {} since start (each protected for its tick, read \
                 again at the next)",
                s.cmdlines_unread, s.cmdlines_unread_total
            ),
        ));
    }
    if let Some(x) = &s.sessions {
        // Counts only; `guard-user tree` lists the sessions.
        rows.push((
            "sessions",
            format!(
                "{} live, {} ended with {} leftovers pending, {} reported leftovers still running; {} leftovers, {} \
                 reaped since start (guard-user tree lists them)",
                x.live, x.ended, x.pending_leftovers, x.reported_leftovers, x.leftovers_total, x.reaped_total
            ),
        ));
        let reached: Vec<String> =
            x.caps.each().iter().filter(|(_, n)| *n > 0).map(|(what, n)| format!("{what} {n}")).collect();
        if !reached.is_empty() {
            // Each is also one `WARN sessions_cap` line: what was reached fails safe (untracked,
            // unclassified or refused, never reaped), and is said here until the daemon restarts.
            rows.push(("caps", format!("sessions caps reached (times): {}", reached.join(", "))));
        }
    }
    if let Some(x) = &s.slots {
        rows.push(("slots", super::slots_view::summary(x)));
    }
    if let Some(v) = s.vitals.as_ref().map(vitals).filter(|v| !v.is_empty()) {
        rows.push(("daemon", v));
    }
    let mut out = String::new();
    for (k, v) in rows {
        let _ = writeln!(out, "{k:<12} {v}");
    }
    out.push('\n');
    names(&mut out, s);
    if !s.repeat_offenders.is_empty() {
        let _ = writeln!(out, "\n{:<16} {:>16} {:>9}", "REPEAT OFFENDER", "ENFORCEMENTS 24H", "KILLS 24H");
        for r in &s.repeat_offenders {
            let _ = writeln!(out, "{:<16} {:>16} {:>9}", text(&r.name), r.enforcements_24h, r.kills_24h);
        }
    }
    if !s.pegged.is_empty() {
        let _ = writeln!(out, "\n{:<16} {:>8} {:>6} {:>10}", "PEGGED", "PID", "CPU", "FOR");
        for p in &s.pegged {
            let _ = writeln!(out, "{:<16} {:>8} {:>6.2} {:>10}", text(&p.name), p.pid, p.cpu, human(secs(p.for_secs)));
        }
    }
    if let Some(x) = &s.slots {
        super::slots_view::render(&mut out, x, now);
    }
    out
}

/// A `WARNING` given and not yet enforced, from the name's row: the `due_in=` of the line is
/// the time left rounded up to whole minutes.
fn warning(n: &crate::domain::NameStatus) -> String {
    let due = crate::policy::incidents::minutes_up(n.time_left_secs.unwrap_or(0.0));
    let (end, skip) = (n.would_end.unwrap_or(0), n.would_skip.unwrap_or(0));
    format!("{}: enforcement due in {due}m: ends {end}, skips {skip}", text(&n.name))
}

/// Every process ended, and by which rule when any was (older status files: `KILLED` lines only).
fn kills(s: &Status) -> String {
    let by = s.kills_by_reason;
    if by.total() == 0 {
        return s.kills.to_string();
    }
    format!("{} ({} ghost_detected, {} leftover)", s.kills, by.ghost_detected, by.leftover)
}

/// The account's processes, and the machine's when the daemon reported them (older status files
/// have only one number, which was the machine's).
fn tracked(s: &Status) -> String {
    match s.machine_processes {
        Some(machine) => format!("{} processes of {} ({machine} on the machine)", s.tracked_processes, text(&s.user)),
        None => format!("{} processes", s.tracked_processes),
    }
}

fn vitals(v: &status::Vitals) -> String {
    let mut parts = Vec::new();
    if let Some(cpu) = v.cpu_percent {
        parts.push(format!("cpu {cpu:.1}%"));
    }
    if let Some(rss) = v.rss_bytes {
        parts.push(format!("rss {:.1} MiB", rss as f64 / (1024.0 * 1024.0)));
    }
    match (v.tick_duration_last_secs, v.tick_duration_max_secs) {
        (Some(last), Some(max)) => parts.push(format!("tick {:.0} ms (max {:.0} ms)", last * 1e3, max * 1e3)),
        (Some(last), None) => parts.push(format!("tick {:.0} ms", last * 1e3)),
        (None, Some(max)) => parts.push(format!("tick max {:.0} ms", max * 1e3)),
        (None, None) => {}
    }
    if let Some(lag) = v.pump_lag_secs {
        parts.push(format!("pump lag {:.0} ms", lag * 1e3));
    }
    if let Some(rate) = v.events_per_sec {
        parts.push(format!("{rate:.0} events/s"));
    }
    parts.join(", ")
}

fn names(out: &mut String, s: &Status) {
    if s.names.is_empty() {
        out.push_str("no name at or over half the threshold\n");
        return;
    }
    let _ = writeln!(
        out,
        "{:<16} {:>6} {:>9} {:<19} {:>10} {:>10} {:>9}",
        "NAME", "COUNT", "THRESHOLD", "FLAGGED SINCE", "TIME LEFT", "WOULD SKIP", "WOULD END"
    );
    for n in &s.names {
        let since = n.flagged_since.map(|t| match SystemTime::UNIX_EPOCH.checked_add(secs(t)) {
            Some(at) => crate::log::local_timestamp(at),
            None => "?".to_string(),
        });
        let left = n.time_left_secs.map(|t| human(secs(t)));
        let dash = || "-".to_string();
        // An excluded name is never flagged: the column says why.
        let since = since.or_else(|| n.excluded.then(|| "excluded".to_string()));
        let _ = writeln!(
            out,
            "{:<16} {:>6} {:>9} {:<19} {:>10} {:>10} {:>9}",
            text(&n.name),
            n.count,
            n.threshold,
            since.unwrap_or_else(dash),
            left.unwrap_or_else(dash),
            n.would_skip.map(|v| v.to_string()).unwrap_or_else(dash),
            n.would_end.map(|v| v.to_string()).unwrap_or_else(dash)
        );
    }
}
