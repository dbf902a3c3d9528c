//! `guard-user tree [--json]` (docs/operations.md): the account's live sessions as the running
//! guard's last tick saw them (its status), each root with its command and age, each process of
//! the session with its CPU seconds and age read from /proc now, the leftovers of ended sessions
//! waiting for their grace or being stopped, and those reported (or left alive by the stop) that
//! still run. Only the daemon knows the lineage (it comes from fork events /proc no longer shows),
//! so without a running guard there is nothing to show.
//!
//! Run as root, `tree` reads the daemon's own copy of the status (beside its instance lock, where
//! the account cannot write), never the file in the account's home, which the account could make
//! list anything (or nothing). Run as anyone else, it reads the file in the home, which is then
//! the caller's own. Every text is shown escaped, and a process is shown only while /proc says it
//! is still itself (same start time) and the account's.
use std::{fmt::Write as _, process::ExitCode, time::Duration, time::SystemTime};

use serde::Serialize;

use super::TreeArgs;
use crate::{
    comm::Comm,
    domain::{SessionStatus, SessionsStatus},
    duration::human,
    escape,
    event::{ProcId, ProcState},
    status,
};

/// One process as `tree` shows it.
#[derive(Serialize, Debug)]
struct Shown {
    pid: u32,
    name: String,
    cpu_secs: f64,
    age_secs: u64,
}

/// One session as `tree` shows it.
#[derive(Serialize, Debug)]
struct Session {
    root_pid: u32,
    root_name: String,
    /// Its first 256 bytes, escaped (the daemon's status keeps no more).
    command: String,
    /// Bytes of the command line after those, not shown (0 when it is shown whole).
    command_omitted_bytes: u64,
    /// `live`, `grace`, `stopping` or `reported`.
    stage: String,
    root_age_secs: Option<u64>,
    /// For an ended session: seconds until its next step (its leftovers are due, or the SIGKILL).
    due_in_secs: Option<f64>,
    processes: Vec<Shown>,
    /// Processes the status file did not list (over its cap) or that are gone since.
    processes_not_shown: u64,
}

/// `tree --json` (docs/json.md): the counts of the first line and the sessions.
#[derive(Serialize, Debug)]
struct TreeJson<'a> {
    stale: bool,
    /// `report` or `stop`.
    leftovers: &'a str,
    grace_secs: f64,
    live: u64,
    ended: u64,
    reported: u64,
    sessions: &'a [Session],
    sessions_not_shown: u64,
    /// Heavy-command slots, when any is configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    slots: Option<&'a crate::status::SlotsStatus>,
}

pub fn main(args: TreeArgs) -> anyhow::Result<ExitCode> {
    let (account, home, config_path) = super::account(&args.account, "tree", crate::account::Purpose::Reads)?;
    let who = crate::safefs::FsIdentity::from(&account);
    let path = status::locate(&config_path, &home, who);
    let copy = crate::daemon::instance::trusted_status(account.uid, &home);
    let read = match &copy {
        Some(copy) => status::read_trusted_only(copy),
        None => status::read(&path, who),
    };
    let s = match read {
        Ok(s) => s,
        Err(e) if e.is_missing() => {
            let (what, shown) = match &copy {
                Some(c) => ("no status from a guard running as root for this account", &c.status),
                None => ("no status file yet", &path),
            };
            eprintln!(
                "guard-user tree: {what} ({}): sessions are known only to a running guard; is it running? (guard-user check tells)",
                escape::text(shown.as_os_str().as_encoded_bytes())
            );
            return Ok(ExitCode::from(1));
        }
        Err(e) => {
            eprintln!("guard-user tree: {e}");
            return Ok(ExitCode::from(1));
        }
    };
    let now = SystemTime::now();
    let stale = s.freshness(now).stale;
    let Some(sessions) = s.sessions.as_ref() else {
        if let Some(slots) = s.slots.as_ref() {
            // Heavy-command slots are process trees too: their holders and their queue.
            if args.json {
                let out = serde_json::json!({ "stale": stale, "slots": slots });
                println!("{}", crate::status::json_for_terminal(&serde_json::to_string_pretty(&out)?));
            } else {
                let mut out = String::new();
                super::slots_view::render(&mut out, slots, now);
                print!("{}", out.trim_start_matches('\n'));
            }
            return Ok(if stale { ExitCode::from(1) } else { ExitCode::SUCCESS });
        }
        eprintln!("guard-user tree: sessions are off (the config has no \"sessions\" with roots)");
        return Ok(if stale { ExitCode::from(1) } else { ExitCode::SUCCESS });
    };
    let now_secs = now.duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let shown: Vec<Session> = sessions.sessions.iter().map(|row| session(row, s.uid, now_secs)).collect();
    if args.json {
        let out = TreeJson {
            stale,
            leftovers: &sessions.leftovers,
            grace_secs: sessions.grace_secs,
            live: sessions.live,
            ended: sessions.ended,
            reported: sessions.reported,
            sessions: &shown,
            sessions_not_shown: sessions.sessions_omitted,
            slots: s.slots.as_ref(),
        };
        println!("{}", crate::status::json_for_terminal(&serde_json::to_string_pretty(&out)?));
    } else {
        let mut text = render(sessions, &shown, stale);
        if let Some(slots) = s.slots.as_ref() {
            super::slots_view::render(&mut text, slots, now);
        }
        print!("{text}");
    }
    Ok(if stale { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

fn session(row: &SessionStatus, uid: u32, now: f64) -> Session {
    let mut processes = Vec::new();
    for p in &row.processes {
        let id = ProcId { pid: p.pid, start_ticks: p.start };
        let mut buf = Vec::new();
        // Still itself and the account's: else the file (the account's) or time moved on.
        let Some(live) = crate::procfs::read_process(p.pid, &mut buf).filter(|q| q.id == id && q.euid == uid) else {
            continue;
        };
        let Some((cpu_secs, age_secs)) = crate::holders::cpu_and_age(&live) else { continue };
        processes.push(Shown { pid: p.pid, name: live.comm.to_string(), cpu_secs, age_secs });
    }
    let processes_not_shown = row.processes_omitted + (row.processes.len() - processes.len()) as u64;
    let root =
        ProcState { id: ProcId { pid: row.root_pid, start_ticks: row.root_start }, euid: uid, comm: Comm::new(b"") };
    Session {
        root_pid: row.root_pid,
        root_name: row.root_name.clone(),
        command: row.command.clone(),
        command_omitted_bytes: row.command_omitted_bytes,
        stage: row.stage.clone(),
        root_age_secs: (row.stage == "live").then(|| crate::holders::cpu_and_age(&root).map(|(_, a)| a)).flatten(),
        due_in_secs: row.due_at.map(|at| (at - now).max(0.0)),
        processes,
        processes_not_shown,
    }
}

fn text(s: &str) -> String {
    escape::printable(s).into_owned()
}

fn render(all: &SessionsStatus, sessions: &[Session], stale: bool) -> String {
    let mut out = String::new();
    if stale {
        out.push_str("(STALE: the guard is not ticking; this is its last view)\n");
    }
    let _ = writeln!(
        out,
        "{} live session{}, {} ended, {} with reported leftovers still running; leftovers are {} after {}",
        all.live,
        if all.live == 1 { "" } else { "s" },
        all.ended,
        all.reported,
        if all.leftovers == "stop" { "stopped" } else { "reported" },
        human(Duration::from_secs_f64(all.grace_secs.clamp(0.0, 1e9)))
    );
    for s in sessions {
        let state = match (s.stage.as_str(), s.due_in_secs) {
            ("live", _) => {
                format!("live {}", s.root_age_secs.map(|a| human(Duration::from_secs(a))).unwrap_or_default())
            }
            ("grace", Some(d)) => format!("ended, leftovers due in {}", human(Duration::from_secs_f64(d.min(1e9)))),
            ("stopping", _) => "ended, its leftovers being stopped".to_string(),
            ("reported", _) => "ended, these leftovers were reported (LEFTOVER) and still run".to_string(),
            (other, _) => format!("ended ({})", text(other)),
        };
        // The status holds the command in its escaped form already: shown as it is (only what
        // would hide something is escaped), then how many bytes were left out, as every command
        // line guard-user shows.
        let mut command = text(&s.command);
        if s.command_omitted_bytes > 0 {
            let _ = write!(command, "…[+{} bytes]", s.command_omitted_bytes);
        }
        let _ = writeln!(out, "\nroot {} {}  {}  {}", s.root_pid, text(&s.root_name), state, command);
        if s.processes.is_empty() && s.processes_not_shown == 0 {
            out.push_str("  (no process left)\n");
            continue;
        }
        let _ = writeln!(out, "  {:>8}  {:<16} {:>10} {:>8}", "PID", "NAME", "CPU", "AGE");
        for p in &s.processes {
            let _ = writeln!(
                out,
                "  {:>8}  {:<16} {:>9.2}s {:>8}",
                p.pid,
                text(&p.name),
                p.cpu_secs,
                human(Duration::from_secs(p.age_secs))
            );
        }
        if s.processes_not_shown > 0 {
            let _ = writeln!(
                out,
                "  … and {} more (over the {} listed per live session, or gone since the last tick)",
                s.processes_not_shown,
                crate::policy::sessions::MAX_STATUS_PROCESSES
            );
        }
    }
    if all.sessions_omitted > 0 {
        let _ = writeln!(
            out,
            "\n… and {} more live sessions (over the {} listed; every ended one is listed above; guard-user status --json counts them)",
            all.sessions_omitted,
            crate::policy::sessions::MAX_STATUS_SESSIONS
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The root's command is the status's escaped text shown once (a backslash stays `\\`, as
    /// every escaped command line shows it, never `\\\\`), then the bytes left out.
    #[test]
    fn a_root_command_is_escaped_once_and_says_the_bytes_left_out() {
        let command = escape::text(b"agent-wrapper a\\b \x1b");
        let session = |omitted| Session {
            root_pid: 200,
            root_name: "agent-wrapper".into(),
            command: command.clone(),
            command_omitted_bytes: omitted,
            stage: "reported".into(),
            root_age_secs: None,
            due_in_secs: None,
            processes: Vec::new(),
            processes_not_shown: 0,
        };
        let all = SessionsStatus::default();
        let out = render(&all, &[session(744)], false);
        let want = "root 200 agent-wrapper  ended, these leftovers were reported (LEFTOVER) and still run  \
                    agent-wrapper a\\\\b \\x1b…[+744 bytes]\n";
        assert!(out.contains(want), "{out}");
        let out = render(&all, &[session(0)], false);
        assert!(out.contains("still run  agent-wrapper a\\\\b \\x1b\n"), "{out}");
    }
}
