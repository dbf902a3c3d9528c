//! The tick's side of sessions (docs/configuration.md `sessions`): gather (the command lines of
//! pending execs, matched against `sessions.roots` in their own sandboxed matcher), decide
//! ([`decide_sessions`], pure), apply (the lineage's answers to the pump, the lines, SIGTERM or
//! SIGKILL through the enforcer's pidfd and identity check, never a wait).
//!
//! Roots are matched here, off the pump: reading `/proc/PID/cmdline` can block on a hostile
//! process, and the pump must keep draining. So a root is recognised by the command line a tick
//! reads after its exec (within one interval of it), and the lineage keeps what the process
//! forks meanwhile in a pending session until the tick says whether it is a root.
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use super::{
    cmdlines::{CmdlineReader, Read},
    effects::Effects,
    keeper::LineageMode,
    pump::PumpHandle,
};
use crate::{
    budget::{Held, Pool},
    config::{self, Config, ConfigError},
    event::{clock_ticks_per_sec, ProcId, ProcState},
    lineage::{SessionId, SessionsView},
    log::{Kind, Line, Notice},
    pattern::{MatchOutcome, Progress, Resume},
    policy::{
        sessions::{
            after_reap, decide_sessions, due_members, status, Ages, RootVerdict, SessionBook, SessionsInput,
            MAX_ROOT_COMMAND,
        },
        CmdVerdict, Now,
    },
    status::SessionsStatus,
};

/// The lineage a valid config asks for: on while `sessions` names at least one root.
pub fn mode(config: &Config, uid: u32) -> LineageMode {
    match &config.sessions {
        Some(s) if !s.roots.is_empty() => LineageMode::On { uid },
        _ => LineageMode::Off,
    }
}

/// The matching round for roots: at most 2 s, and a quarter of the tick's deadline.
fn round_budget(deadline: Duration) -> Duration {
    (deadline / 4).min(Duration::from_secs(2))
}

/// What the tick holds about sessions between ticks.
#[derive(Default)]
pub struct SessionsTick {
    pub book: SessionBook,
    /// The roots matcher could not run at the last tick (warned once per outage).
    roots_down: bool,
    /// Whether the roots list compiled at this tick.
    roots_ok: bool,
}

/// What one tick's sessions work left for the report.
#[derive(Default)]
pub struct Done {
    pub next_deadline: Option<f64>,
    pub status: Option<SessionsStatus>,
    /// `SKIPPED` and `DRY_RUN` lines logged, for the totals.
    pub skipped: u64,
    pub dry_runs: u64,
}

impl SessionsTick {
    /// Compiles `sessions.roots` in the roots matcher (once per change). A list it refuses is a
    /// config error, as for `excludeCommands`; a matcher that cannot run leaves the pending
    /// execs unclassified until it can (no root is recognised meanwhile: nothing is reaped).
    pub fn set_roots(&mut self, fx: &mut Effects, config: &Config) -> Result<(), ConfigError> {
        self.roots_ok = false;
        let Some(s) = config.sessions.as_ref().filter(|s| !s.roots.is_empty()) else {
            self.book = SessionBook { totals: self.book.totals, ..Default::default() };
            return Ok(());
        };
        match fx.roots.set_patterns(&s.roots) {
            Ok(()) => {
                self.roots_down = false;
                self.roots_ok = true;
            }
            Err(e) if e.is_config_error() => {
                tracing::warn!("sessions.roots refused: {e}");
                return Err(config::refused_patterns_of(config::PatternList::SessionsRoots, &s.roots, &e));
            }
            Err(e) => {
                if !self.roots_down {
                    self.roots_down = true;
                    tracing::error!("{e}");
                    fx.log.write(&Line::Warn(Notice::new("pattern_matcher_down").with("reason", "roots_worker")));
                }
            }
        }
        Ok(())
    }

    /// The members whose `excludeCommands` verdicts this tick needs (added to the tick's own
    /// round, so every command line is matched once per tick).
    pub fn due(&self, view: Option<&SessionsView>, config: &Config, now: Now) -> Vec<ProcState> {
        match (view, config.sessions.as_ref()) {
            (Some(v), Some(s)) => due_members(v, &self.book, s, now.mono),
            _ => Vec::new(),
        }
    }

    /// Classifies, decides and applies (see the module doc).
    pub fn run(&mut self, ctx: Ctx) -> Done {
        let Ctx { fx, pump, view, config, verdicts, now, dry_run, deadline, pool } = ctx;
        let (Some(view), Some(sessions)) = (view, config.sessions.as_ref()) else { return Done::default() };
        let roots = if self.roots_ok { classify(fx, pool, view, deadline) } else { HashMap::new() };
        let ages = Ages { boot_unix: fx.procs.boot_unix(), ticks_per_sec: clock_ticks_per_sec() };
        let input =
            SessionsInput { view, config, sessions, now, dry_run, ages, roots: &roots, verdicts, book: &self.book };
        let mut plan = decide_sessions(&input);
        // The status shows the lineage after this tick's answers (a root recognised now is listed
        // now, not a tick later).
        let after = if plan.commands.is_empty() { None } else { pump.lineage_blocking(plan.commands.clone()) };
        for line in &plan.lines {
            fx.emit(line, now.wall);
        }
        let procs = |t: &[crate::policy::sessions::ReapTarget]| t.iter().map(|t| t.proc).collect::<Vec<_>>();
        let term = match (plan.term.is_empty(), dry_run) {
            (true, _) => Vec::new(),
            (false, true) => fx.signals.verify_all(&procs(&plan.term)),
            (false, false) => fx.signals.term_all(&procs(&plan.term)),
        };
        let kill = if plan.kill.is_empty() { Vec::new() } else { fx.signals.kill_all(&procs(&plan.kill)) };
        let after_lines = after_reap(&mut plan, &term, &kill, dry_run);
        for line in &after_lines {
            fx.emit(line, now.wall);
        }
        self.book = plan.book;
        let status = status(after.as_ref().unwrap_or(view), &self.book, sessions, ages, now);
        let count = |kind| plan.lines.iter().chain(&after_lines).filter(|l| l.kind() == kind).count() as u64;
        Done {
            next_deadline: plan.next_deadline,
            status: Some(status),
            skipped: count(Kind::Skipped),
            dry_runs: count(Kind::DryRun),
        }
    }
}

/// What [`SessionsTick::run`] works with.
pub struct Ctx<'a> {
    pub fx: &'a mut Effects,
    pub pump: &'a PumpHandle,
    pub view: Option<&'a SessionsView>,
    pub config: &'a Config,
    /// `excludeCommands` verdicts, including those of [`SessionsTick::due`]'s members.
    pub verdicts: &'a HashMap<ProcId, CmdVerdict>,
    /// Both clocks: the steps are timed on the monotonic one, the status shows wall times.
    pub now: Now,
    pub dry_run: bool,
    /// The tick's deadline; the roots round takes a share of what is left.
    pub deadline: Duration,
    /// The tick's pool of command-line bytes held for a matcher.
    pub pool: &'a Pool,
}

/// The verdict on each candidate's command line: read through the tick's [`CmdlineReader`]
/// (its deadline, and the pool every command line waiting for a matcher is held in), then
/// matched against the roots in one bounded round. Gone, too long or undecided within the
/// matcher's bounds is not a root; one not read in time, or that did not fit the pool, or that
/// the round had no time for, is asked again next tick.
fn classify(fx: &mut Effects, pool: &Pool, view: &SessionsView, deadline: Duration) -> HashMap<SessionId, RootVerdict> {
    let max = fx.roots.max_text_bytes();
    let mut out = HashMap::new();
    let mut asked: Vec<(SessionId, Held)> = Vec::new();
    let now = Instant::now();
    let ends = now + round_budget(deadline);
    let mut reader = CmdlineReader::for_phase(&mut *fx.procs, pool.clone(), now, ends);
    for c in &view.candidates {
        let cmd = match reader.read(c.process.id.pid, max) {
            // Right after an exec the new image's arguments may not be set up yet: next tick.
            Read::Text if reader.text().is_empty() => continue,
            // Not read in time, or no room to hold it now: next tick.
            Read::Text if reader.text().len() <= max => match reader.hold(reader.text()) {
                Some(held) => held,
                None => continue,
            },
            Read::Deferred(_) => continue,
            Read::Text | Read::Gone => {
                out.insert(c.session, RootVerdict::Other);
                continue;
            }
        };
        // Adopted with its parent's command line: a fork that never exec'd, not a root (a
        // root is recognised at its exec; its forks are its session).
        if c.parent.is_some_and(|pp| reader.read(pp, max) == Read::Text && reader.text() == &*cmd) {
            out.insert(c.session, RootVerdict::Other);
            continue;
        }
        asked.push((c.session, cmd));
    }
    drop(reader);
    if !asked.is_empty() {
        let texts: Vec<&[u8]> = asked.iter().map(|(_, t)| &**t).collect();
        let from = vec![Resume::default(); texts.len()];
        let outcomes = fx.roots.classify_from(&texts, &from, ends);
        drop(texts);
        for ((session, command), o) in asked.into_iter().zip(outcomes) {
            let verdict = match o {
                // What the status keeps of it, not the whole text.
                Progress::Settled(MatchOutcome::Matched(_)) => {
                    RootVerdict::Root { command: command[..command.len().min(MAX_ROOT_COMMAND)].to_vec() }
                }
                Progress::Settled(MatchOutcome::NoMatch | MatchOutcome::Budget) => RootVerdict::Other,
                Progress::Unsettled(_) => continue,
            };
            out.insert(session, verdict);
        }
    }
    out
}
