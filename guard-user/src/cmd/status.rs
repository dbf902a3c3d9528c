//! `guard-user status [--json]` (SPEC §7): reads the status file the daemon writes every tick.
use std::{process::ExitCode, time::SystemTime};

use super::StatusArgs;
use crate::{config, duration::human, status};

fn now() -> f64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// `status --fleet`: every heartbeat on the current swarm Redis endpoint.
fn fleet(json: bool) -> anyhow::Result<ExitCode> {
    use crate::redis_mirror::{fleet, fleet_table, Endpoint};
    let endpoint = Endpoint::resolve(|k| std::env::var(k).ok());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    match rt.block_on(fleet(&endpoint)) {
        Ok(hbs) if json => println!("{}", serde_json::to_string_pretty(&hbs)?),
        Ok(hbs) if hbs.is_empty() => println!("no guard heartbeat on {}", endpoint.redacted()),
        Ok(hbs) => print!("{}", fleet_table(&hbs, SystemTime::now())),
        Err(e) => {
            eprintln!("guard-user status --fleet: {e}");
            return Ok(ExitCode::from(1));
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn main(args: StatusArgs) -> anyhow::Result<ExitCode> {
    if args.fleet {
        return fleet(args.json);
    }
    let (_account, home, config_path) = super::run::resolve_account(&args.account)?;
    let state_file = config::load(&config_path, &home)
        .map(|c| c.state_file)
        .unwrap_or_else(|_| config::expand_tilde(config::DEFAULT_STATE_FILE, &home));
    let path = status::path_beside(&state_file);
    let s = match status::read(&path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("guard-user status: no status: {e}. Is the guard running? (guard-user check tells)");
            return Ok(ExitCode::from(1));
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(ExitCode::SUCCESS);
    }
    let age = (now() - s.last_tick).max(0.0);
    let stale = age > 2.0 * s.interval_secs.max(1.0);
    let rows = [
        ("user", format!("{} (uid {})", s.user, s.uid)),
        ("pid", s.pid.to_string()),
        ("backend", format!("{}{}", s.backend, if s.dry_run { " (dry run)" } else { "" })),
        ("uptime", human(std::time::Duration::from_secs_f64((now() - s.started_at).max(0.0)))),
        (
            "last tick",
            format!("{} ago{}", human(std::time::Duration::from_secs_f64(age)), if stale { " (STALE: the guard is not ticking)" } else { "" }),
        ),
        ("events", s.events.to_string()),
        ("lost events", s.lost_events.to_string()),
        ("resyncs", s.resyncs.to_string()),
        ("kills", s.kills.to_string()),
        ("tracked", format!("{} processes", s.tracked_processes)),
    ];
    for (k, v) in rows {
        println!("{k:<12} {v}");
    }
    if let Some(e) = &s.config_error {
        println!("{:<12} {e}", "config");
    }
    println!();
    if s.names.is_empty() {
        println!("no name at or over half the threshold");
    } else {
        println!("{:<16} {:>6} {:>9} {:<19} {:>10} {:>10} {:>9}", "NAME", "COUNT", "THRESHOLD", "FLAGGED SINCE", "TIME LEFT", "WOULD SKIP", "WOULD END");
        for n in &s.names {
            let since = n.flagged_since.map(|t| crate::log::local_timestamp(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs_f64(t)));
            let left = n.time_left_secs.map(|t| human(std::time::Duration::from_secs_f64(t)));
            let dash = || "-".to_string();
            println!(
                "{:<16} {:>6} {:>9} {:<19} {:>10} {:>10} {:>9}",
                n.name,
                n.count,
                n.threshold,
                since.unwrap_or_else(dash),
                left.unwrap_or_else(dash),
                n.would_skip.map(|v| v.to_string()).unwrap_or_else(dash),
                n.would_end.map(|v| v.to_string()).unwrap_or_else(dash)
            );
        }
    }
    Ok(if stale { ExitCode::from(1) } else { ExitCode::SUCCESS })
}
