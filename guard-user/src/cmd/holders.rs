//! `guard-user holders PATH [--user NAME] [--json] [--stop]` (docs/operations.md): every process
//! that holds PATH, each with its user, and per account the exact command that stops them;
//! exit 0 when none does, 1 when some do, 2 on an error (or none found but a process not read
//! completely). `--stop` needs `--user` and ends only that account's holders (SIGTERM, up to
//! 10 s, SIGKILL, each through a pidfd after the identity check); exit 0 when none is left.
use std::{collections::BTreeMap, os::unix::ffi::OsStrExt, process::ExitCode, sync::Arc, time::Duration};

use anyhow::Context;
use serde::Serialize;

use super::HoldersArgs;
use crate::{
    account::Account,
    duration::human,
    enforcer::Enforcer,
    escape,
    holders::{self, Holder, Limits, Report, Stopped, Target, Unread, Within},
};

/// How long `--stop` waits between SIGTERM and SIGKILL.
pub const STOP_WAIT: Duration = Duration::from_secs(10);
/// Fd numbers listed on a text line (JSON lists up to 16).
const FDS_ON_A_LINE: usize = 4;

/// Whose processes were read.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Read<'a> {
    /// `--user`: that account's.
    Account(&'a Account),
    /// Every process of the machine (as root, without `--user`).
    Machine,
    /// Those the caller may read (not root, without `--user`).
    Caller,
}

impl Read<'_> {
    fn token(&self) -> &'static str {
        match self {
            Read::Account(_) => "account",
            Read::Machine => "machine",
            Read::Caller => "caller",
        }
    }
}

#[derive(Serialize)]
struct Json {
    path: String,
    kind: &'static str,
    read: &'static str,
    user: Option<String>,
    holders: Vec<Row>,
    unread: Vec<UnreadRow>,
    not_readable: usize,
}

#[derive(Serialize)]
struct Row {
    pid: u32,
    user: String,
    uid: u32,
    name: String,
    exe: Option<String>,
    command: String,
    command_omitted_bytes: usize,
    /// The command line as a terminal line shows it (escape::ShownCmdline::line).
    #[serde(skip)]
    command_line: String,
    holds: Vec<&'static str>,
    fds: Vec<u32>,
    fd_count: u64,
    cpu_secs: f64,
    age_secs: u64,
    /// The command that stops it (its account's holders), none for root's.
    stop: Option<String>,
    /// Why it was read in part, if it was.
    incomplete: Option<String>,
    /// With `--stop`: `stopped`, `killed`, `moved_out` or `left`.
    outcome: Option<&'static str>,
}

#[derive(Serialize)]
struct UnreadRow {
    pid: u32,
    user: String,
    uid: u32,
    name: String,
    why: String,
}

/// Account names by uid, looked up once each (the uid itself when there is no entry).
#[derive(Default)]
struct Users(BTreeMap<u32, String>);

impl Users {
    fn name(&mut self, uid: u32) -> String {
        self.0.entry(uid).or_insert_with(|| Account::by_uid(uid).map_or_else(|_| uid.to_string(), |a| a.name)).clone()
    }
}

/// The exact command that stops `user`'s holders of `path`, safe to paste.
fn stop_command(path: &[u8], user: &str) -> String {
    let user = escape::shell_word(user.as_bytes());
    let flag = if user.starts_with('-') { format!("--user={user}") } else { format!("--user {user}") };
    format!("guard-user holders {} {flag} --stop", escape::shell_word(path))
}

pub fn main(args: HoldersArgs) -> anyhow::Result<ExitCode> {
    let account = args.user.as_deref().map(|u| Account::resolve(Some(u)).map(|r| r.account)).transpose()?;
    if args.stop && account.is_none() {
        let owner = std::fs::metadata(&args.path)
            .ok()
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
            .filter(|&u| u != 0)
            .and_then(|u| Account::by_uid(u).ok())
            .map_or_else(|| "NAME".to_string(), |a| a.name);
        anyhow::bail!(
            "holders --stop needs --user: it ends one account's holders only, never root's or another account's \
             that hold the same path; name the account, e.g. {}",
            stop_command(args.path.as_os_str().as_bytes(), &owner)
        );
    }
    let root = unsafe { libc::geteuid() } == 0;
    let read = match &account {
        Some(a) => Read::Account(a),
        None if root => Read::Machine,
        None => Read::Caller,
    };
    let target = Target::open(&args.path)?;
    let within = Arc::new(Within::new(target));
    let limits = Limits::default();
    let mut report = holders::find(&within, account.as_ref().map(|a| a.uid), limits).context("reading /proc")?;
    not_readable_in_scope(&mut report, account.is_some() || root);
    let outcomes = match &account {
        Some(a) if args.stop && !report.holders.is_empty() => {
            let enforcer = Enforcer::new(a.uid, std::process::id(), STOP_WAIT);
            Some(holders::stop(&within, &report.holders, &enforcer, STOP_WAIT, limits))
        }
        _ => None,
    };
    let mut users = Users::default();
    let doc = json(&within.target, read, &report, outcomes.as_deref(), &mut users);
    if args.json {
        println!("{}", crate::status::json_for_terminal(&serde_json::to_string_pretty(&doc)?));
    } else {
        print!("{}", render(&doc, &args, &within.target));
    }
    let left = match &outcomes {
        Some(o) => o.iter().any(|o| matches!(o, Stopped::Left)) || !report.unread.is_empty(),
        None => !report.holders.is_empty(),
    };
    Ok(if left {
        ExitCode::from(1)
    } else if !report.unread.is_empty() {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

/// A process the caller may not read is in scope when it was asked for (`--user`, or root
/// reading the machine) or is the caller's own (one that is not dumpable): it may hold PATH, so
/// it is listed as unread. Other accounts' processes, out of a non-root caller's scope, are only
/// counted.
fn not_readable_in_scope(report: &mut Report, all_in_scope: bool) {
    let me = unsafe { libc::geteuid() };
    let (mine, others): (Vec<_>, Vec<_>) =
        std::mem::take(&mut report.forbidden).into_iter().partition(|p| all_in_scope || p.euid == me);
    let why = if me == 0 {
        "its /proc files refused root too (a process with capabilities this one lacks, or a security module's rule)"
    } else {
        "only root can read its /proc files (another account's, or not dumpable): run this as root"
    };
    report.unread.extend(mine.into_iter().map(|proc| Unread { proc, why: why.into() }));
    report.unread.sort_by_key(|u| u.proc.id.pid);
    report.forbidden = others;
}

fn outcome_token(o: Stopped) -> &'static str {
    match o {
        Stopped::Termed => "stopped",
        Stopped::Killed => "killed",
        Stopped::MovedOut => "moved_out",
        Stopped::Left => "left",
    }
}

/// One holder's row; `stop` is its account's stop command, except root's unless asked for.
fn row(h: &Holder, path: &[u8], outcome: Option<Stopped>, root_asked: bool, users: &mut Users) -> Row {
    let user = users.name(h.proc.euid);
    let c = &h.holding;
    Row {
        pid: h.proc.id.pid,
        uid: h.proc.euid,
        name: h.proc.comm.to_string(),
        exe: c.exe.as_deref().map(escape::text),
        command: escape::text(c.command.head()),
        command_omitted_bytes: c.command.omitted(),
        command_line: c.command.line(),
        holds: c.ways.names(),
        fds: c.fds.clone(),
        fd_count: c.fd_count,
        cpu_secs: c.cpu_secs,
        age_secs: c.age_secs,
        stop: (h.proc.euid != 0 || root_asked).then(|| stop_command(path, &user)),
        incomplete: c.incomplete.clone(),
        user: escape::text(user.as_bytes()),
        outcome: outcome.map(outcome_token),
    }
}

fn unread_row(u: &Unread, users: &mut Users) -> UnreadRow {
    UnreadRow {
        pid: u.proc.id.pid,
        user: escape::text(users.name(u.proc.euid).as_bytes()),
        uid: u.proc.euid,
        name: u.proc.comm.to_string(),
        why: u.why.clone(),
    }
}

fn json(target: &Target, read: Read, report: &Report, outcomes: Option<&[Stopped]>, users: &mut Users) -> Json {
    let path = &target.resolved;
    // `--user root` asked for root's: its stop command is then the one asked for.
    let root_asked = matches!(read, Read::Account(_));
    let holders = report
        .holders
        .iter()
        .enumerate()
        .map(|(i, h)| row(h, path, outcomes.map(|o| o[i]), root_asked, users))
        .collect();
    Json {
        path: escape::text(path),
        kind: if target.is_dir() { "directory" } else { "file" },
        read: read.token(),
        user: match read {
            Read::Account(a) => Some(escape::text(a.name.as_bytes())),
            _ => None,
        },
        holders,
        unread: report.unread.iter().map(|u| unread_row(u, users)).collect(),
        not_readable: report.forbidden.len(),
    }
}

/// The first line: what PATH is, whose processes were read, how many hold it.
fn headline(doc: &Json, args: &HoldersArgs, target: &Target) -> String {
    let given = args.path.as_os_str().as_bytes();
    let mut what = doc.path.clone();
    if given != target.resolved.as_slice() {
        what += &format!(" (what {} resolves to)", escape::text(given));
    }
    if target.is_dir() {
        what += " and everything below it";
    }
    let whose = match (doc.read, &doc.user) {
        ("account", Some(u)) => format!("{u}'s processes"),
        ("machine", _) => "every process of the machine (read as root)".to_string(),
        _ => {
            let me = Account::by_uid(unsafe { libc::geteuid() }).map(|a| a.name).unwrap_or_else(|_| "you".into());
            format!("the processes {} can read", escape::text(me.as_bytes()))
        }
    };
    let count = match doc.holders.len() {
        0 => "none holds it".to_string(),
        1 => "1 holds it".to_string(),
        n => format!("{n} hold it"),
    };
    format!("{what}, in {whose}: {count}\n")
}

fn holds_text(r: &Row) -> String {
    let mut parts = Vec::new();
    for w in &r.holds {
        if *w == "fd" {
            let mut list: Vec<String> = r.fds.iter().take(FDS_ON_A_LINE).map(u32::to_string).collect();
            let more = r.fd_count.saturating_sub(list.len() as u64);
            if more > 0 {
                list.push(format!("+{more}"));
            }
            parts.push(format!("fd({})", list.join(",")));
        } else {
            parts.push(w.to_string());
        }
    }
    parts.join(",")
}

fn render(doc: &Json, args: &HoldersArgs, target: &Target) -> String {
    use std::fmt::Write as _;
    let mut out = headline(doc, args, target);
    if !doc.holders.is_empty() {
        let _ = writeln!(out, "{:>8}  {:<12} {:>9} {:>8}  {:<16} COMMAND", "PID", "USER", "CPU", "AGE", "HOLDS");
        for r in &doc.holders {
            let command = if r.command_line.is_empty() { format!("[{}]", r.name) } else { r.command_line.clone() };
            let _ = writeln!(
                out,
                "{:>8}  {:<12} {:>8.2}s {:>8}  {:<16} {command}",
                r.pid,
                r.user,
                r.cpu_secs,
                human(Duration::from_secs(r.age_secs)),
                holds_text(r)
            );
        }
    }
    for r in doc.holders.iter().filter(|r| r.incomplete.is_some()) {
        let why = r.incomplete.as_deref().unwrap_or_default();
        let _ = writeln!(out, "{} was read in part ({why}): it may hold it in more ways than listed", r.pid);
    }
    if !doc.unread.is_empty() {
        let _ = writeln!(out, "not read completely, so they may hold it too:");
        for u in &doc.unread {
            let _ = writeln!(out, "{:>8}  {:<12} {:<16} {}", u.pid, u.user, u.name, u.why);
        }
    }
    if doc.not_readable > 0 {
        let _ =
            writeln!(out, "{} processes of other accounts were not read: only root can read them", doc.not_readable);
    }
    if args.stop {
        for r in &doc.holders {
            let what = match r.outcome {
                Some("stopped") => "stopped (gone after SIGTERM)",
                Some("killed") => "killed (SIGKILL after 10s)",
                Some("moved_out") => "left alone: it no longer holds the path",
                _ => "left alone: gone, its identity changed, or it could not be read again",
            };
            let _ = writeln!(out, "{} {}: {what}", r.pid, r.name);
        }
        return out;
    }
    // One command per account, in the order its holders are listed.
    let mut seen = Vec::new();
    for r in &doc.holders {
        match &r.stop {
            Some(cmd) if !seen.contains(cmd) => {
                let _ = writeln!(out, "to stop {}'s the checked way: {cmd}", r.user);
                seen.push(cmd.clone());
            }
            _ => {}
        }
    }
    if doc.read != "account" && doc.holders.iter().any(|r| r.uid == 0) {
        let _ = writeln!(out, "root's are listed only: no command here stops them (end them yourself if you mean to)");
    }
    out
}
