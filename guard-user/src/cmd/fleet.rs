//! `guard-user status --fleet`: every guard's heartbeat on the swarm Redis (docs/operations.md), as a table
//! or as JSON. Exits 1 when a guard is not guarding: its last tick is stale, or that tick's config
//! was invalid (so it ended nothing) — the rules of `status`, applied to every row — and when the
//! endpoint's listening socket belongs to an account (`mirror::listener`): then every row is that
//! account's writing, marked so, and none can show that a guard is guarding.
use std::{
    process::ExitCode,
    time::{SystemTime, UNIX_EPOCH},
};

use serde::Serialize;

use crate::mirror::{fleet, listener::account_name, Endpoint, Heartbeat};
use crate::status::{escape_for_terminal, Freshness};

pub fn main(json: bool) -> anyhow::Result<ExitCode> {
    let endpoint = Endpoint::from_env();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let now = SystemTime::now();
    let read = match rt.block_on(fleet(&endpoint)) {
        Ok(read) => read,
        Err(e) => {
            eprintln!("guard-user status --fleet: {e}");
            return Ok(ExitCode::from(1));
        }
    };
    let written_by = read.written_by.map(account_name);
    let hbs = &read.value.beats;
    if let Some(who) = &written_by {
        eprintln!(
            "guard-user status --fleet: the swarm Redis at {} listens as {}, an account, so every heartbeat below was \
             written by that account, not necessarily by a guard",
            endpoint.redacted(),
            escape_for_terminal(who.as_bytes())
        );
    }
    if read.value.unread > 0 {
        eprintln!(
            "guard-user status --fleet: {} more heartbeat keys were not read (over the {} MiB read in all)",
            read.value.unread,
            crate::mirror::query::FLEET_BYTES >> 20
        );
    }
    let by = written_by.as_deref();
    if json {
        println!("{}", fleet_json(hbs, now, by));
    } else if hbs.is_empty() {
        println!("no guard heartbeat on {}", endpoint.redacted());
    } else {
        print!("{}", fleet_table(hbs, now, by));
    }
    Ok(fleet_exit_code(hbs, now, by))
}

/// What is wrong with one guard, as its heartbeat says, each as a short text; empty when healthy.
/// Staleness is the one rule of `status` ([`Freshness`]); a heartbeat expires after three
/// intervals, so a guard that stopped shows stale for one interval, then not at all.
/// `written_by`: the account whose listener it was read from, if it was.
pub fn problems(hb: &Heartbeat, now: SystemTime, written_by: Option<&str>) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(who) = written_by {
        out.push(format!("UNTRUSTED: written by account {}", escape_for_terminal(who.as_bytes())));
    }
    if Freshness::of(hb.last_tick as f64, hb.interval_secs as f64, now).stale {
        out.push("STALE".to_string());
    }
    if let Some(e) = &hb.config_error {
        // Already in the log's escaped form: shown as the log has it (only what a guard on the
        // endpoint could plant to hide text is escaped).
        out.push(format!("CONFIG INVALID: {}", crate::escape::printable(e)));
    }
    out
}

/// 1 when any guard is unhealthy ([`problems`]) or the heartbeats are an account's writing, else 0.
pub fn fleet_exit_code(hbs: &[Heartbeat], now: SystemTime, written_by: Option<&str>) -> ExitCode {
    if written_by.is_some() || hbs.iter().any(|hb| !problems(hb, now, None).is_empty()) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// One heartbeat in `status --fleet --json`: its fields, plus what only the reader can know (as
/// `status --json` adds them).
#[derive(Serialize)]
struct Row<'a> {
    #[serde(flatten)]
    heartbeat: &'a Heartbeat,
    /// The last tick is older than two intervals.
    stale: bool,
    /// Seconds since the last tick completed.
    last_tick_age_secs: f64,
    /// The account whose listening socket answered on the endpoint (`mirror::listener`): this
    /// row is its writing. `null` for a Redis no account owns.
    written_by_account: Option<&'a str>,
}

/// `status --fleet --json`: the heartbeats, each with `stale`, `last_tick_age_secs` and
/// `written_by_account`; safe to print on a terminal whatever a guard on the endpoint wrote.
pub fn fleet_json(hbs: &[Heartbeat], now: SystemTime, written_by: Option<&str>) -> String {
    let rows: Vec<Row> = hbs
        .iter()
        .map(|hb| {
            let f = Freshness::of(hb.last_tick as f64, hb.interval_secs as f64, now);
            Row { heartbeat: hb, stale: f.stale, last_tick_age_secs: f.age_secs, written_by_account: written_by }
        })
        .collect();
    crate::status::json_for_terminal(&serde_json::to_string_pretty(&rows).expect("heartbeats always serialize"))
}

/// An aligned table of heartbeats: host, user, age of the last tick, backend, flagged names,
/// kills, and health (`ok`, or what is wrong: [`problems`]). Columns are separated by at least
/// two spaces; no line has trailing spaces. Any guard on the endpoint writes these values (and the
/// flagged names come from its account's processes), so every text cell goes through
/// [`escape_for_terminal`]: one heartbeat is one row. The health comes last, so a long config
/// error does not push the other columns apart.
pub fn fleet_table(hbs: &[Heartbeat], now: SystemTime, written_by: Option<&str>) -> String {
    let now_secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let text = |s: &str| escape_for_terminal(s.as_bytes());
    let mut rows = vec![["HOST", "USER", "LAST TICK", "BACKEND", "FLAGGED", "KILLS", "HEALTH"].map(String::from)];
    for hb in hbs {
        let flagged = if hb.flagged.is_empty() {
            "-".to_owned()
        } else {
            hb.flagged.iter().map(|n| text(n)).collect::<Vec<_>>().join(",")
        };
        let backend = if hb.dry_run { format!("{} (dry run)", text(&hb.backend)) } else { text(&hb.backend) };
        let problems = problems(hb, now, written_by);
        rows.push([
            text(&hb.host),
            text(&hb.user),
            format!("{} ago", age(now_secs.saturating_sub(hb.last_tick))),
            backend,
            flagged,
            hb.kills.to_string(),
            if problems.is_empty() { "ok".to_owned() } else { problems.join(", ") },
        ]);
    }
    let mut widths = [0usize; 7];
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
