//! `guard-user explain NAME [--json]` (docs/operations.md): every live process of the account with that name,
//! and the verdict the next enforcing tick would reach for each, plus when enforcement is due.
//! Read-only, no daemon needed: the daemon's own gather step (`daemon::gather`) on one /proc
//! scan, then the policy's `Memory::begin` the daemon runs, so the answer cannot drift from what
//! the daemon does. The plan is never finished: nothing is signalled, nothing saved.
//!
//! Its memory does not grow with the command lines: they are read through the daemon's
//! reader (one buffer, a pool of 4 MiB for the matcher), only their first 4 KiB is kept for the
//! output (once per distinct text: forks share their argv), and the rows are written as they are
//! made, the JSON too, never built whole first.
use std::{
    cell::RefCell,
    io::Write,
    process::ExitCode,
    sync::Arc,
    time::{Duration, Instant},
};

use serde::{ser::SerializeSeq, Serialize, Serializer};

use super::ExplainArgs;
use crate::{
    budget::{Budget, Pool, HELD_CMDLINE_BYTES},
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
    escape::{log_value as escape, ShownCmdline},
    event::{clock_ticks_per_sec, ProcState},
    log::local_timestamp,
    policy::{memory::Input, CmdVerdict, Memory},
    procfs,
    safefs::FsIdentity,
    state,
    table::{ProcessTable, Scope},
};

/// How long `explain` may spend reading and matching command lines.
const OVERALL: Duration = Duration::from_secs(10);

/// One process, explained.
struct Row {
    pid: u32,
    age: Duration,
    cmdline: Arc<ShownCmdline>,
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
struct VerdictJson<'a> {
    verdict: &'static str,
    skip_reason: Option<&'static str>,
    pattern_index: Option<usize>,
    pattern: Option<&'a str>,
}

fn verdict_json(v: CmdVerdict, patterns: &[String], excluded: bool) -> VerdictJson<'_> {
    let skip = |reason, index: Option<usize>| VerdictJson {
        verdict: "skip",
        skip_reason: Some(reason),
        pattern_index: index,
        pattern: index.map(|i| patterns.get(i).map_or("?", String::as_str)),
    };
    let plain = |verdict| VerdictJson { verdict, skip_reason: None, pattern_index: None, pattern: None };
    if excluded {
        return skip("excluded_name", None);
    }
    match v {
        CmdVerdict::End => plain("end"),
        CmdVerdict::Excluded { index } => skip("excluded_command", Some(index)),
        CmdVerdict::Budget => skip("match_budget", None),
        CmdVerdict::TooLong => skip("cmdline_too_long", None),
        CmdVerdict::Deferred => skip("read_budget", None),
        CmdVerdict::Gone => plain("gone"),
    }
}

/// One element of `--json`'s `processes` (fields in the order serde_json's maps keep them).
#[derive(Serialize)]
struct ProcessJson<'a> {
    age_secs: u64,
    cmdline: String,
    cmdline_bytes: usize,
    cmdline_escaped: String,
    cmdline_omitted_bytes: usize,
    pattern: Option<&'a str>,
    pattern_index: Option<usize>,
    pid: u32,
    skip_reason: Option<&'static str>,
    /// Present when it heads a tree that holds or waits for a heavy-command slot.
    #[serde(skip_serializing_if = "Option::is_none")]
    slot: Option<super::slots_view::Place>,
    verdict: &'static str,
}

impl<'a> ProcessJson<'a> {
    fn of(r: &Row, patterns: &'a [String], excluded: bool) -> ProcessJson<'a> {
        let v = verdict_json(r.verdict, patterns, excluded);
        ProcessJson {
            age_secs: r.age.as_secs(),
            cmdline: r.cmdline.lossy(),
            cmdline_bytes: r.cmdline.total(),
            cmdline_escaped: r.cmdline.log_value(),
            cmdline_omitted_bytes: r.cmdline.omitted(),
            pattern: v.pattern,
            pattern_index: v.pattern_index,
            pid: r.pid,
            skip_reason: v.skip_reason,
            slot: r.slot.clone(),
            verdict: v.verdict,
        }
    }
}

/// `--json`'s whole document; `processes` is written row by row as it is serialized.
#[derive(Serialize)]
struct ExplainJson<'a> {
    count: u32,
    due_at_unix: Option<f64>,
    due_in_secs: Option<f64>,
    enforcement: &'static str,
    excluded: bool,
    flagged_since_unix: Option<f64>,
    name: String,
    processes: Rows<'a>,
    threshold: u32,
    user: &'a str,
}

/// The rows, made one at a time while they are written (see the module doc).
struct Rows<'a> {
    rows: RefCell<Option<Box<dyn Iterator<Item = Row> + 'a>>>,
    patterns: &'a [String],
    excluded: bool,
}

impl Serialize for Rows<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(None)?;
        for r in self.rows.borrow_mut().take().into_iter().flatten() {
            seq.serialize_element(&ProcessJson::of(&r, self.patterns, self.excluded))?;
        }
        seq.end()
    }
}

/// Writes JSON text with what a terminal would act on escaped ([`crate::status::json_for_terminal`]),
/// as it goes. serde_json writes whole characters in each call, so each is valid UTF-8.
struct TerminalJson<W: Write>(W);

impl<W: Write> Write for TerminalJson<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match std::str::from_utf8(buf) {
            Ok(text) => self.0.write_all(crate::status::json_for_terminal(text).as_bytes())?,
            Err(_) => self.0.write_all(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
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
        CmdVerdict::Deferred => "skip: read_budget (its command line could not be read in time; the process is \
                                  protected)"
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
    let (account, home, config_path) =
        super::account(&args.account, "explain", crate::account::Purpose::ShowsCommandLines)?;
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
        pool: Pool::new(HELD_CMDLINE_BYTES),
        clock: &clock,
    };
    let started = Instant::now();
    let req = Request {
        config: &config,
        lineage: LineageMode::Off,
        extra: &mut |_, _| Vec::new(),
        matcher_up: true,
        budget: OVERALL,
        ends_by: started + OVERALL,
        keep_cmdlines: true,
    };
    let gathered = gather(src, &mut memory, req).expect("a /proc scan is always there");
    for line in &gathered.lines {
        let why = match line {
            crate::log::Line::Error(n) | crate::log::Line::Warn(n) => n.head().to_string(),
            other => other.body(),
        };
        eprintln!("guard-user explain: {why} (treated as empty, as the daemon would)");
    }
    let (verdicts, cmdlines) = (&gathered.verdicts, &gathered.cmdlines);
    let procs = gathered.snapshot.view.members.get(&name).cloned().unwrap_or_default();
    let was_flagged = memory.clocks().contains_key(&name);
    let now = Clock::now(&clock);
    let input = Input { view: &gathered.snapshot.view, config: &config, now, verdicts, dry_run: false };
    let plan = memory.begin(input);
    let plan = plan.decided();
    let excluded = config.is_excluded(&name);
    // What the round did not read (an excluded name is not matched; with no excludeCommands
    // nothing is) is read here, one at a time into one buffer, only to be shown.
    let shown_only = RefCell::new((Vec::new(), Budget::until(started + 2 * OVERALL)));
    // Slots live in the daemon only: its last status says who holds or waits (as of its last
    // tick). Root reads root's own copy, as `status` and `tree` do: the one in the home is the
    // account's to rewrite.
    let slots = match crate::daemon::instance::trusted_status(who.uid, &home) {
        Some(copy) => crate::status::read_trusted_only(&copy),
        None => crate::status::read(&crate::status::locate(&config_path, &home, who), who),
    }
    .ok()
    .and_then(|s| s.slots);
    let rows = procs.iter().map(|p| Row {
        pid: p.id.pid,
        age: age(p),
        cmdline: cmdlines.get(&p.id.pid).cloned().unwrap_or_else(|| {
            let (buf, budget) = &mut *shown_only.borrow_mut();
            let read = procfs::read_cmdline(p.id.pid, max, budget, buf) == procfs::CmdRead::Text;
            Arc::new(if read { ShownCmdline::of(buf) } else { ShownCmdline::default() })
        }),
        verdict: verdicts.get(&p.id).copied().unwrap_or(CmdVerdict::Gone),
        slot: slots.as_ref().and_then(|s| super::slots_view::place_of(s, p.id.pid, p.id.start_ticks)),
    });
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
        let doc = ExplainJson {
            count,
            due_at_unix: due_at,
            due_in_secs: due_in,
            enforcement: stage.as_str(),
            excluded,
            flagged_since_unix: flagged_since,
            name: name.to_string(),
            processes: Rows { rows: RefCell::new(Some(Box::new(rows))), patterns, excluded },
            threshold: config.threshold,
            user: &account.name,
        };
        let mut json = TerminalJson(std::io::BufWriter::new(&mut out));
        serde_json::to_writer_pretty(&mut json, &doc)?;
        writeln!(json)?;
        json.flush()?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(out, "{}: {when}", escape(name.as_bytes()))?;
    if procs.is_empty() {
        writeln!(out, "no live process of {} is named {}", account.name, escape(name.as_bytes()))?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(out, "{:>8} {:>8}  VERDICT\n{:>19}COMMAND", "PID", "AGE", "")?;
    for r in rows {
        writeln!(out, "{:>8} {:>8}  {}", r.pid, human(r.age), verdict_text(r.verdict, patterns, excluded))?;
        writeln!(out, "{:>19}{}", "", r.cmdline.line())?;
        if let Some(place) = &r.slot {
            writeln!(out, "{:>19}{}", "", super::slots_view::place_text(place, now.wall))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
