//! `guard-user explain NAME [--json]` (docs/operations.md): every live process of the account with that name,
//! and the verdict the next enforcing tick would reach for each, plus when enforcement is due.
//! Read-only, no daemon needed: the daemon's own gather step (`daemon::gather`) on one /proc
//! scan, then the policy's `Memory::begin` the daemon runs, so the answer cannot drift from what
//! the daemon does. The plan is never finished: nothing is signalled, nothing saved.
use std::{io::Write, process::ExitCode, time::Duration};

use serde_json::json;

use super::ExplainArgs;
use crate::{
    comm::Comm,
    config,
    daemon::{
        effects::{Clock, Procfs, SystemClock},
        gather::{gather, Request, Snapshots, Sources},
        keeper::LineageMode,
        pump::Snapshot,
        verdicts::VerdictCache,
    },
    duration::human,
    escape::log_value as escape,
    event::{clock_ticks_per_sec, ProcState},
    log::local_timestamp,
    policy::{memory::Input, CmdVerdict, Memory},
    procfs,
    safefs::FsIdentity,
    state,
    status::escape_for_terminal,
    table::{ProcessTable, Scope},
};

/// One process, explained.
struct Row {
    pid: u32,
    age: Duration,
    cmdline: Vec<u8>,
    verdict: CmdVerdict,
    /// The heavy-command slot it holds or waits for, as the running guard last said.
    slot: Option<super::slots_view::Place>,
}

/// Seconds since boot (the clock /proc's start times count from).
fn uptime_secs() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

fn age(p: &ProcState) -> Duration {
    let started = p.id.start_ticks as f64 / clock_ticks_per_sec() as f64;
    Duration::from_secs_f64((uptime_secs() - started).max(0.0))
}

/// Where the name stands, `--json`'s `enforcement` (docs/json.md); the first line of the text
/// says the same in a sentence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Enforcement {
    /// In `excludes`: never enforced.
    Excluded,
    /// Below the threshold.
    NotFlagged,
    /// At the threshold without a flag clock: the next tick flags it.
    FlaggedNextTick,
    /// Flagged, enforcement ahead.
    Scheduled,
    /// Flagged and due: the next tick enforces.
    DueNow,
}

impl Enforcement {
    fn as_str(self) -> &'static str {
        match self {
            Enforcement::Excluded => "excluded",
            Enforcement::NotFlagged => "not_flagged",
            Enforcement::FlaggedNextTick => "flagged_next_tick",
            Enforcement::Scheduled => "scheduled",
            Enforcement::DueNow => "due_now",
        }
    }
}

/// The verdict as `explain --json` gives it (docs/json.md): `verdict` (`end`, `skip`, `gone`),
/// and for a skip the `SKIPPED` line's reason and the pattern that protects it.
fn verdict_json(v: CmdVerdict, patterns: &[String], excluded: bool) -> serde_json::Value {
    let skip = |reason: &str, index: Option<usize>| {
        json!({
            "verdict": "skip",
            "skip_reason": reason,
            "pattern_index": index,
            "pattern": index.map(|i| patterns.get(i).map_or("?", String::as_str)),
        })
    };
    if excluded {
        return skip("excluded_name", None);
    }
    match v {
        CmdVerdict::End => json!({"verdict": "end", "skip_reason": null, "pattern_index": null, "pattern": null}),
        CmdVerdict::Excluded { index } => skip("excluded_command", Some(index)),
        CmdVerdict::Budget => skip("match_budget", None),
        CmdVerdict::TooLong => skip("cmdline_too_long", None),
        CmdVerdict::Gone => json!({"verdict": "gone", "skip_reason": null, "pattern_index": null, "pattern": null}),
    }
}

fn verdict_text(v: CmdVerdict, patterns: &[String], excluded: bool) -> String {
    if excluded {
        return "skip: excludes".into();
    }
    match v {
        CmdVerdict::End => "end".into(),
        CmdVerdict::Excluded { index } => {
            // Quoted when it holds a space (a pattern may start with one), as log values are.
            format!(
                "skip: excludeCommands[{index}] {}",
                escape(patterns.get(index).map(String::as_bytes).unwrap_or(b"?"))
            )
        }
        CmdVerdict::Budget => {
            "skip: match_budget (the pattern could not be decided in time; the process is protected)".into()
        }
        CmdVerdict::TooLong => "skip: cmdline_too_long (the command line is longer than 1 MiB, which is never \
                                 matched on a cut-off prefix; the process is protected)"
            .into(),
        CmdVerdict::Gone => "gone".into(),
    }
}

/// One `/proc` scan as the pump would hand it, with the processes of the explained name as
/// the only members (whatever their count): the only ones matched, and shown.
struct Scan {
    table: ProcessTable,
    name: Comm,
}

impl Snapshots for Scan {
    fn snapshot(&mut self, _min_count: u32, _lineage: LineageMode) -> Option<Snapshot> {
        let mut view = self.table.view(1);
        view.members.retain(|n, _| *n == self.name);
        Some(Snapshot { view, stats: Default::default(), sessions: None })
    }
}

pub fn main(args: ExplainArgs) -> anyhow::Result<ExitCode> {
    let (account, home, config_path) = super::run::resolve_account(&args.account)?;
    let who = FsIdentity::from(&account);
    let config = match config::load(&config_path, &home, who) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("guard-user explain: {}: {}", config_path.display(), e.log_reason());
            return Ok(ExitCode::from(1));
        }
    };
    let name = Comm::new(args.name.as_bytes());
    let scope = Scope { account: account.uid, ignore_pid: Some(std::process::id()) };
    let table = ProcessTable::from_snapshot(procfs::snapshot()?, scope);
    let patterns = &config.exclude_commands;
    let mut matcher = crate::daemon::effects::sandboxed_matcher();
    if let Err(e) = matcher.set_patterns(patterns) {
        eprintln!("guard-user explain: {}: {e}", config_path.display());
        return Ok(ExitCode::from(1));
    }
    let max = matcher.limits().max_text_bytes;
    // The daemon's gather step on one /proc scan: the state file read (never moved aside),
    // this name's processes matched with the same rules, no cache, nothing signalled.
    let mut memory = Memory::default();
    let clock = SystemClock;
    let src = Sources {
        snapshots: &mut Scan { table, name },
        state: &mut |path| state::load_state(path, who),
        procs: &mut Procfs::default(),
        classifier: &mut matcher,
        cache: &mut VerdictCache::with_cap(0),
        clock: &clock,
    };
    let req = Request {
        config: &config,
        lineage: LineageMode::Off,
        extra: &mut |_, _| Vec::new(),
        matcher_up: true,
        budget: Duration::from_secs(10),
        ends_by: std::time::Instant::now() + Duration::from_secs(10),
        keep_cmdlines: true,
    };
    let gathered = gather(src, &mut memory, req).expect("a /proc scan is always there");
    for line in &gathered.lines {
        let why = match line {
            crate::log::Line::Error(n) | crate::log::Line::Warn(n) => n.what.clone(),
            other => other.body(),
        };
        eprintln!("guard-user explain: {why} (treated as empty, as the daemon would)");
    }
    let (verdicts, cmdlines) = (&gathered.verdicts, &gathered.cmdlines);
    let procs = gathered.snapshot.view.members.get(&name).cloned().unwrap_or_default();
    let was_flagged = memory.clocks().contains_key(&name);
    let now = Clock::now(&clock);
    let input = Input { view: &gathered.snapshot.view, config: &config, now, verdicts };
    let plan = memory.begin(input);
    let plan = plan.decided();
    let excluded = config.is_excluded(&name);
    // Slots live in the daemon only: its last status says who holds or waits.
    let status_path = crate::status::locate(&config_path, &home, who);
    let slots = crate::status::read(&status_path, who).ok().and_then(|s| s.slots);
    let rows: Vec<Row> = procs
        .iter()
        .map(|p| Row {
            pid: p.id.pid,
            age: age(p),
            // An excluded name is not matched; its command lines are read to be shown.
            cmdline: cmdlines
                .get(&p.id.pid)
                .cloned()
                .or_else(|| excluded.then(|| procfs::cmdline_capped(p.id.pid, max)).flatten())
                .unwrap_or_default(),
            verdict: verdicts.get(&p.id).copied().unwrap_or(CmdVerdict::Gone),
            slot: slots.as_ref().and_then(|s| super::slots_view::place_of(s, p.id.pid, p.id.start_ticks)),
        })
        .collect();
    let count = procs.len() as u32;
    let flagged = plan.status.iter().find(|r| r.flagged_since.is_some() && r.name == name.to_string());
    let stage = match (excluded, flagged) {
        (true, _) => Enforcement::Excluded,
        (false, None) => Enforcement::NotFlagged,
        (false, Some(_)) if !was_flagged => Enforcement::FlaggedNextTick,
        (false, Some(row)) if row.time_left_secs.unwrap_or(0.0) <= 0.0 => Enforcement::DueNow,
        (false, Some(_)) => Enforcement::Scheduled,
    };
    let when = match (stage, flagged) {
        (Enforcement::Excluded, _) => format!("never enforced: {} is in excludes", escape(name.as_bytes())),
        (Enforcement::FlaggedNextTick, _) => format!(
            "at the threshold ({count} live processes, threshold {}) but not flagged yet: the next tick flags it, \
             and enforcement is due {} after that",
            config.threshold,
            human(config.timeout)
        ),
        (Enforcement::DueNow | Enforcement::Scheduled, Some(row)) => {
            let since = row.flagged_since.unwrap_or(now.wall);
            let left = row.time_left_secs.unwrap_or(0.0);
            let flagged_at = local_timestamp(std::time::UNIX_EPOCH + Duration::from_secs_f64(since.max(0.0)));
            if stage == Enforcement::DueNow {
                format!(
                    "flagged since {flagged_at}; enforcement is due now (the next tick ends the processes marked end)"
                )
            } else {
                let due = local_timestamp(std::time::UNIX_EPOCH + Duration::from_secs_f64((now.wall + left).max(0.0)));
                format!(
                    "flagged since {flagged_at}; enforcement due at {due} (in {})",
                    human(Duration::from_secs_f64(left))
                )
            }
        }
        _ => format!(
            "not flagged: {count} live process{} of {}, threshold {}",
            if count == 1 { "" } else { "es" },
            account.name,
            config.threshold
        ),
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        // Only a flagged name has a flag time; a name the next tick flags is due `timeout` after.
        let flagged_since = flagged
            .filter(|_| matches!(stage, Enforcement::Scheduled | Enforcement::DueNow))
            .and_then(|r| r.flagged_since);
        let due_in = match stage {
            Enforcement::FlaggedNextTick => Some(config.timeout.as_secs_f64()),
            Enforcement::Scheduled | Enforcement::DueNow => flagged.and_then(|r| r.time_left_secs),
            Enforcement::Excluded | Enforcement::NotFlagged => None,
        };
        let due_at = due_in.filter(|_| flagged_since.is_some()).map(|left| now.wall + left);
        let processes = rows.iter().map(|r| {
            let mut p = json!({
                "pid": r.pid,
                "age_secs": r.age.as_secs(),
                "cmdline": String::from_utf8_lossy(&r.cmdline),
                "cmdline_escaped": escape(&r.cmdline),
            });
            if let (Some(p), serde_json::Value::Object(v)) =
                (p.as_object_mut(), verdict_json(r.verdict, patterns, excluded))
            {
                p.extend(v);
            }
            if let (Some(obj), Some(place)) = (p.as_object_mut(), r.slot.as_ref()) {
                obj.insert("slot".into(), json!(place));
            }
            p
        });
        let doc = json!({
            "name": name.to_string(),
            "user": account.name,
            "count": count,
            "threshold": config.threshold,
            "excluded": excluded,
            "enforcement": stage.as_str(),
            "flagged_since_unix": flagged_since,
            "due_in_secs": due_in,
            "due_at_unix": due_at,
            "processes": processes.collect::<Vec<_>>(),
        });
        writeln!(out, "{}", crate::status::json_for_terminal(&serde_json::to_string_pretty(&doc)?))?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(out, "{}: {when}", escape(name.as_bytes()))?;
    if rows.is_empty() {
        writeln!(out, "no live process of {} is named {}", account.name, escape(name.as_bytes()))?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(out, "{:>8} {:>8}  VERDICT\n{:>19}COMMAND", "PID", "AGE", "")?;
    for r in &rows {
        writeln!(out, "{:>8} {:>8}  {}", r.pid, human(r.age), verdict_text(r.verdict, patterns, excluded))?;
        writeln!(out, "{:>19}{}", "", escape_for_terminal(&r.cmdline))?;
        if let Some(place) = &r.slot {
            writeln!(out, "{:>19}{}", "", super::slots_view::place_text(place, now.wall))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
