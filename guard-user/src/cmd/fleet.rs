//! `guard-user status --fleet`: every guard's heartbeat on the swarm Redis (docs/operations.md), as a table
//! or as JSON.
use std::{
    process::ExitCode,
    time::{SystemTime, UNIX_EPOCH},
};

use crate::mirror::{fleet, Endpoint, Heartbeat};
use crate::status::escape_for_terminal;

pub fn main(json: bool) -> anyhow::Result<ExitCode> {
    let endpoint = Endpoint::from_env();
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

/// An aligned table of heartbeats: host, user, age of the last tick, backend, flagged names,
/// kills. Columns are separated by at least two spaces; no line has trailing spaces. Any guard on
/// the endpoint writes these values (and the flagged names come from its account's processes), so
/// every text cell goes through [`escape_for_terminal`]: one heartbeat is one row.
pub fn fleet_table(hbs: &[Heartbeat], now: SystemTime) -> String {
    let now_secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let text = |s: &str| escape_for_terminal(s.as_bytes());
    let mut rows = vec![["HOST", "USER", "LAST TICK", "BACKEND", "FLAGGED", "KILLS"].map(String::from)];
    for hb in hbs {
        let flagged = if hb.flagged.is_empty() {
            "-".to_owned()
        } else {
            hb.flagged.iter().map(|n| text(n)).collect::<Vec<_>>().join(",")
        };
        let backend = if hb.dry_run { format!("{} (dry run)", text(&hb.backend)) } else { text(&hb.backend) };
        rows.push([
            text(&hb.host),
            text(&hb.user),
            format!("{} ago", age(now_secs.saturating_sub(hb.last_tick))),
            backend,
            flagged,
            hb.kills.to_string(),
        ]);
    }
    let mut widths = [0usize; 6];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            line.push_str(cell);
            if i + 1 < row.len() {
                line.extend(std::iter::repeat_n(' ', widths[i] - cell.chars().count() + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn age(secs: u64) -> String {
    match secs {
        0..120 => format!("{secs}s"),
        120..7200 => format!("{}m", secs / 60),
        7200..172_800 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}
