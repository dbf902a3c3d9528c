//! Sessions and their leftovers: the pure half (docs/configuration.md `sessions`, docs/log.md
//! `LEFTOVER` and `REAPED`).
//!
//! The pump's lineage ([`crate::lineage`]) knows which session each process was forked into; a
//! tick hands [`decide_sessions`] that view, the verdict on each pending exec it read
//! ([`super::roots`]), the `excludeCommands` verdicts of the members it may stop, and the
//! [`SessionBook`] it holds between ticks. The plan says which pending sessions become roots,
//! what to log, which processes get SIGTERM or SIGKILL this tick (or, in a dry run, are only
//! verified: the plan says which), which sessions are settled, and when the next step is due
//! (the deadline timer wakes the tick then).
//!
//! An ended session goes through steps across ticks, never inside one (a tick has a deadline;
//! the 10 s between SIGTERM and SIGKILL would eat it): *grace* (until `grace` after the root
//! ended: its live members are then its leftovers, one `LEFTOVER` line each); with `"stop"`,
//! *term* (SIGTERM to every leftover that is not protected, then up to [`STOP_WAIT`]); *kill*
//! (SIGKILL to what is left, new members included, checked again [`KILL_CHECK`] later); then
//! one `REAPED` line and the session is settled, its survivors listed until they exit. Rounds go
//! on while each finds members it has not signalled yet (at least [`KILL_ROUNDS`], at most
//! [`MAX_KILL_ROUNDS`]), and between rounds the tick chases ([`chase`]) what signalled members
//! fork meanwhile, so a leftover that keeps forking new pids cannot outrun them.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{CmdVerdict, Now, Signal};
use crate::log::{Kind, Line, Notice, What};
use crate::{
    comm::Comm,
    config::{Config, Leftovers, Sessions},
    domain::Outcome,
    event::{ProcId, ProcState},
    lineage::{Caps, LineageCmd, SessionId, SessionRow, SessionsView},
};

pub use super::roots::{RootVerdict, MAX_ROOT_COMMAND};
pub use super::sessions_chase::{chase, chase_asks};
pub use super::sessions_status::{status, MAX_STATUS_PROCESSES, MAX_STATUS_SESSIONS};

/// Seconds from SIGTERM to SIGKILL (systemd's `TimeoutStopSec` role).
pub const STOP_WAIT: f64 = 10.0;
/// Seconds from a SIGKILL round to the look that closes the session (or kills what appeared).
pub const KILL_CHECK: f64 = 1.0;
/// SIGKILL rounds at least: what a round left alive (unkillable for now) is tried again.
pub const KILL_ROUNDS: u32 = 3;
/// SIGKILL rounds at most: a session whose members still fork faster than the rounds and the
/// chase after that is closed with them as survivors (still listed, until they exit).
pub const MAX_KILL_ROUNDS: u32 = 30;

/// Where an ended session stands.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Phase {
    /// Waiting for `grace` after the root ended.
    Grace,
    /// SIGTERM sent at `at`.
    Term { at: f64 },
    /// The `round`th SIGKILL round ran at `at`.
    Kill { at: f64, round: u32 },
}

/// A root session as the tick remembers it.
#[derive(Clone, Debug, PartialEq)]
pub struct RootInfo {
    /// The root as last seen alive (its name is `REAPED`'s `name=`).
    pub root: ProcState,
    /// Its command line when it was classified, cut to [`MAX_ROOT_COMMAND`] bytes.
    pub command: Vec<u8>,
    /// That command line's whole length (the status says how many bytes were left out).
    pub command_len: usize,
    /// When it was recognised (unix seconds: shown, never timed).
    pub since: f64,
}

/// An ended root session on its way to settled.
#[derive(Clone, Debug, PartialEq)]
pub struct EndedSession {
    pub root: RootInfo,
    /// When the tick first saw it ended (the pump wakes the tick at the exit, so this is the
    /// exit give or take a tick's start), on the monotonic clock, like every step's time.
    pub ended_at: f64,
    pub phase: Phase,
    /// Leftovers given a `LEFTOVER` line (each gets one).
    pub announced: BTreeSet<ProcId>,
    /// Leftovers that are never ended (`excludes`, `excludeCommands`), given a `SKIPPED` line.
    pub protected: BTreeSet<ProcId>,
    /// Leftovers whose command line the matcher could not decide within its bounds at a step:
    /// not signalled then (`SKIPPED … match_budget`, once), decided again at the next step.
    pub undecided: BTreeSet<ProcId>,
    /// Leftovers sent a signal.
    pub signalled: BTreeSet<ProcId>,
}

/// Totals since the daemon started (status, metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionTotals {
    /// `LEFTOVER` lines.
    pub leftovers: u64,
    /// `REAPED` lines.
    pub reaped: u64,
    /// Leftovers ended (the sum of `REAPED`'s `count=`).
    pub stopped: u64,
}

/// The caps of a tick's reading of pending execs, reached since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadingCaps {
    /// Ticks that had more pending execs than they are handed.
    pub candidates: u64,
    /// Ticks whose command-line byte budget left candidates for the next tick.
    pub command_bytes: u64,
}

/// What the tick holds about sessions between ticks. Not persisted: a restart forgets the
/// sessions in their grace or stop (their leftovers are then processes without a session).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SessionBook {
    pub roots: BTreeMap<SessionId, RootInfo>,
    pub ended: BTreeMap<SessionId, EndedSession>,
    /// Settled sessions whose leftovers are still listed: their root, for `tree`.
    pub reported: BTreeMap<SessionId, RootInfo>,
    pub totals: SessionTotals,
    pub reading: ReadingCaps,
    /// The caps already said (`WARN sessions_cap`), once each per run.
    pub warned_caps: BTreeSet<&'static str>,
}

/// The bounds a tick's sessions work under, for the `WARN sessions_cap` lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionLimits {
    pub caps: Caps,
    /// Pending execs handed to one tick.
    pub candidates: usize,
    /// Bytes of candidates' command lines one tick holds.
    pub command_bytes: usize,
}

/// How to tell a process's age from its start time (clock ticks since boot).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ages {
    /// The boot time, unix seconds.
    pub boot_unix: f64,
    pub ticks_per_sec: u64,
}

impl Ages {
    /// Whole seconds since `p` started, at `now`.
    pub fn of(&self, p: &ProcState, now: f64) -> u64 {
        let started = self.boot_unix + p.id.start_ticks as f64 / self.ticks_per_sec.max(1) as f64;
        (now - started).max(0.0) as u64
    }
}

/// This tick's reading of the pending execs ([`super::roots::read_candidates`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RootsRead {
    pub verdicts: HashMap<SessionId, RootVerdict>,
    /// The last candidate read: the next tick's reading starts after it.
    pub read_after: Option<SessionId>,
    /// The byte budget left candidates for the next tick.
    pub capped: bool,
}

/// Everything [`decide_sessions`] decides on.
#[derive(Clone, Copy, Debug)]
pub struct SessionsInput<'a> {
    pub view: &'a SessionsView,
    pub config: &'a Config,
    pub sessions: &'a Sessions,
    /// Steps are timed on the monotonic clock; ages and `since` on the wall clock.
    pub now: Now,
    pub dry_run: bool,
    pub ages: Ages,
    pub roots: &'a RootsRead,
    /// `excludeCommands` verdicts of the members [`due_members`] named; a member without one is
    /// protected (`match_budget`), never ended.
    pub verdicts: &'a HashMap<ProcId, CmdVerdict>,
    pub book: &'a SessionBook,
    pub limits: SessionLimits,
}

/// One process to signal for a session.
#[derive(Clone, Debug, PartialEq)]
pub struct ReapTarget {
    pub proc: ProcState,
    pub session: SessionId,
    pub root_pid: u32,
}

/// What one tick does about sessions.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionPlan {
    /// For the pump: classifications, where the reading goes on, doomed members, settled
    /// sessions.
    pub commands: Vec<LineageCmd>,
    /// `WARN sessions_cap`, `LEFTOVER`, `SKIPPED` and `REAPED` lines, before any signal of this
    /// tick.
    pub lines: Vec<Line>,
    /// How [`SessionPlan::term`] is signalled: SIGTERM, or verified only in a dry run.
    pub term_signal: Signal,
    pub term: Vec<ReapTarget>,
    /// SIGKILL, each after the identity check.
    pub kill: Vec<ReapTarget>,
    /// The book after this tick, before the signals' outcomes ([`after_reap`] adds those).
    pub book: SessionBook,
    /// The next step due (monotonic clock), for the deadline timer.
    pub next_deadline: Option<f64>,
    /// Leftovers ended, counted when their session's `REAPED` line says so.
    pub ended: u64,
}

fn step_due(e: Option<&EndedSession>, grace: f64, now: f64) -> bool {
    match e.map(|e| (e.ended_at, e.phase)) {
        None => grace <= 0.0,
        Some((ended_at, Phase::Grace)) => now >= ended_at + grace,
        Some((_, Phase::Term { at })) => now >= at + STOP_WAIT,
        Some((_, Phase::Kill { at, .. })) => now >= at + KILL_CHECK,
    }
}

/// The members whose `excludeCommands` verdicts a tick needs before [`decide_sessions`]: those
/// of every ended session whose next step is due at `now` (monotonic), when leftovers are stopped.
pub fn due_members(view: &SessionsView, book: &SessionBook, sessions: &Sessions, now: f64) -> Vec<ProcState> {
    if sessions.leftovers != Leftovers::Stop {
        return Vec::new();
    }
    let grace = sessions.grace.as_secs_f64();
    // Every tick while a session is being stopped, not only at its steps: the verdict cache keeps
    // only what a tick asked about, and a round it could not finish goes on from there.
    let asked = |row: &SessionRow| match book.ended.get(&row.id) {
        Some(e) if matches!(e.phase, Phase::Term { .. } | Phase::Kill { .. }) => true,
        e => step_due(e, grace, now),
    };
    view.sessions
        .iter()
        .filter(|row| row.ended && !row.reported && asked(row))
        .flat_map(|row| row.members.iter().copied())
        .collect()
}

fn skipped(p: &ProcState, reason: &'static str) -> Line {
    Line::Skipped { pid: p.id.pid, name: p.comm, reason }
}

fn earliest(a: Option<f64>, b: f64) -> Option<f64> {
    Some(a.map_or(b, |a| a.min(b)))
}

/// `WARN sessions_cap what=<cap> limit=<n>` for each cap reached and not said yet.
fn cap_lines(view: &SessionsView, book: &mut SessionBook, limits: &SessionLimits) -> Vec<Line> {
    let c = view.counts.caps;
    let hits: [(&'static str, u64, usize); 7] = [
        ("sessions", c.sessions, limits.caps.sessions),
        ("members", c.members, limits.caps.members),
        ("nodes", c.nodes, limits.caps.nodes),
        ("pending_execs", c.pending_execs, limits.caps.pending),
        ("reported", c.reported, limits.caps.reported),
        ("candidates", book.reading.candidates, limits.candidates),
        ("command_bytes", book.reading.command_bytes, limits.command_bytes),
    ];
    let mut lines = Vec::new();
    for (what, hit, limit) in hits {
        if hit > 0 && book.warned_caps.insert(what) {
            lines.push(Line::Warn(Notice::new(What::SessionsCap).with("what", what).with("limit", limit)));
        }
    }
    lines
}

/// The pending execs this tick read: roots, not roots, waiting; and where the reading goes on.
fn classify(input: &SessionsInput, plan: &mut SessionPlan) {
    let SessionsInput { view, now, roots, limits, .. } = *input;
    for c in &view.candidates {
        let cmd = match roots.verdicts.get(&c.session) {
            Some(RootVerdict::Root { command }) => {
                let command_len = command.len();
                let command = command[..command_len.min(MAX_ROOT_COMMAND)].to_vec();
                plan.book.roots.insert(c.session, RootInfo { root: c.process, command, command_len, since: now.wall });
                LineageCmd::Classified { session: c.session, root: true }
            }
            Some(RootVerdict::Other) => LineageCmd::Classified { session: c.session, root: false },
            Some(RootVerdict::WaitEmpty) => LineageCmd::WaitedEmpty(c.session),
            // Not read this tick (over the budget): read first next tick.
            None => continue,
        };
        plan.commands.push(cmd);
    }
    if let Some(after) = roots.read_after {
        plan.commands.push(LineageCmd::ReadAfter(after));
    }
    if view.counts.pending as usize > limits.candidates {
        plan.book.reading.candidates += 1;
    }
    if roots.capped {
        plan.book.reading.command_bytes += 1;
    }
}

/// The plan for this tick (see the module doc).
pub fn decide_sessions(input: &SessionsInput) -> SessionPlan {
    let SessionsInput { view, config, sessions, now: clocks, dry_run, ages, roots, verdicts, book, limits } = *input;
    let now = clocks.mono;
    let mut plan = SessionPlan {
        commands: Vec::new(),
        lines: Vec::new(),
        term_signal: Signal::unless_dry(dry_run, Signal::Term),
        term: Vec::new(),
        kill: Vec::new(),
        book: book.clone(),
        next_deadline: None,
        ended: 0,
    };
    classify(input, &mut plan);
    plan.lines = cap_lines(view, &mut plan.book, &limits);
    // What the pump no longer has is forgotten (turned off and on, or refused at the cap).
    let known: BTreeSet<SessionId> = view.sessions.iter().map(|r| r.id).collect();
    let classified: BTreeSet<SessionId> =
        plan.book.roots.keys().copied().filter(|id| roots.verdicts.contains_key(id)).collect();
    plan.book.roots.retain(|id, _| known.contains(id) || classified.contains(id));
    plan.book.ended.retain(|id, _| known.contains(id));
    plan.book.reported.retain(|id, _| known.contains(id));
    let grace = sessions.grace.as_secs_f64();
    for row in &view.sessions {
        if row.reported {
            continue;
        }
        if !row.ended {
            if let (Some(info), Some(state)) = (plan.book.roots.get_mut(&row.id), row.root_state) {
                info.root = state;
            }
            continue;
        }
        let mut e = plan.book.ended.remove(&row.id).unwrap_or_else(|| EndedSession {
            root: book.roots.get(&row.id).cloned().unwrap_or(RootInfo {
                root: ProcState { id: row.root, euid: 0, comm: Comm::new(b"") },
                command: Vec::new(),
                command_len: 0,
                since: clocks.wall,
            }),
            ended_at: now,
            phase: Phase::Grace,
            announced: BTreeSet::new(),
            protected: BTreeSet::new(),
            undecided: BTreeSet::new(),
            signalled: BTreeSet::new(),
        });
        plan.book.roots.remove(&row.id);
        let due = step_due(Some(&e), grace, now);
        let mut step = Step { row, e: &mut e, lines: &mut plan.lines, wall: clocks.wall, ages };
        let keep = match (step.e.phase, due) {
            (Phase::Grace, false) => {
                plan.next_deadline = earliest(plan.next_deadline, step.e.ended_at + grace);
                true
            }
            (Phase::Grace, true) => {
                step.announce();
                if row.members.is_empty() || sessions.leftovers == Leftovers::Report {
                    false
                } else {
                    let targets = step.targets(config, verdicts);
                    if dry_run {
                        // Verified only; the DRY_RUN lines come from the outcomes (after_reap).
                        plan.term.extend(targets);
                        false
                    } else if targets.is_empty() && !step.undecided_left() && step.all_protected() {
                        let line = step.reaped();
                        plan.lines.push(line);
                        false
                    } else if targets.is_empty() && !step.undecided_left() {
                        // Every one not protected was gone by the time its command line was read
                        // (a leftover moving to new pids): no SIGTERM to send, so the SIGKILL
                        // rounds start now, each judging the members it finds.
                        step.e.phase = Phase::Kill { at: now, round: 0 };
                        plan.next_deadline = earliest(plan.next_deadline, now + KILL_CHECK);
                        true
                    } else {
                        step.e.phase = Phase::Term { at: now };
                        plan.next_deadline = earliest(plan.next_deadline, now + STOP_WAIT);
                        plan.commands.extend(targets.iter().map(|t| LineageCmd::Doom(t.proc.id)));
                        plan.term.extend(targets);
                        true
                    }
                }
            }
            (Phase::Term { at }, due) | (Phase::Kill { at, .. }, due) => {
                let (round, wait) = match step.e.phase {
                    Phase::Kill { round, .. } => (round, KILL_CHECK),
                    _ => (0, STOP_WAIT),
                };
                let left: Vec<&ProcState> = row.members.iter().filter(|p| !step.e.protected.contains(&p.id)).collect();
                // Members no round signalled yet (and decided): forked since, or new to the lineage.
                let fresh = left.iter().any(|p| !step.e.signalled.contains(&p.id) && !step.e.undecided.contains(&p.id));
                let done = round >= MAX_KILL_ROUNDS || (round >= KILL_ROUNDS && !fresh);
                // In the SIGKILL rounds an empty list waits for the round's check: a leftover that
                // keeps moving to new pids can be between two of them when the tick looks.
                let gone = left.is_empty() && (due || matches!(step.e.phase, Phase::Term { .. }));
                if gone || (due && done) {
                    // A survivor forked since the last round is a leftover all the same.
                    step.announce();
                    let line = step.reaped();
                    plan.lines.push(line);
                    false
                } else if due {
                    step.announce();
                    let targets = step.targets(config, verdicts);
                    step.e.phase = Phase::Kill { at: now, round: round + 1 };
                    plan.next_deadline = earliest(plan.next_deadline, now + KILL_CHECK);
                    plan.commands.extend(targets.iter().map(|t| LineageCmd::Doom(t.proc.id)));
                    plan.kill.extend(targets);
                    true
                } else {
                    plan.next_deadline = earliest(plan.next_deadline, at + wait);
                    true
                }
            }
        };
        if keep {
            plan.book.ended.insert(row.id, e);
        } else {
            plan.commands.push(LineageCmd::Settle(row.id));
            plan.book.reported.insert(row.id, e.root);
        }
    }
    plan.book.totals.leftovers += plan.lines.iter().filter(|l| l.kind() == Kind::Leftover).count() as u64;
    plan
}

/// One ended session's step.
struct Step<'a> {
    row: &'a SessionRow,
    e: &'a mut EndedSession,
    lines: &'a mut Vec<Line>,
    /// Unix time, for ages.
    wall: f64,
    ages: Ages,
}

impl Step<'_> {
    /// `LEFTOVER` for each live member not yet announced.
    fn announce(&mut self) {
        for p in &self.row.members {
            if self.e.announced.insert(p.id) {
                self.lines.push(Line::Leftover {
                    pid: p.id.pid,
                    name: p.comm,
                    root: self.e.root.root.id.pid,
                    age_secs: self.ages.of(p, self.wall),
                });
            }
        }
    }

    /// Whether every live member is protected (`excludes`, `excludeCommands`).
    fn all_protected(&self) -> bool {
        self.row.members.iter().all(|p| self.e.protected.contains(&p.id))
    }

    /// Whether a live member is still undecided (its session then waits for the next step).
    fn undecided_left(&self) -> bool {
        self.row.members.iter().any(|p| self.e.undecided.contains(&p.id))
    }

    /// The live members to signal; the protected ones get one `SKIPPED` line each, and so do the
    /// undecided ones (once), which are not signalled at this step.
    fn targets(&mut self, config: &Config, verdicts: &HashMap<ProcId, CmdVerdict>) -> Vec<ReapTarget> {
        let mut out = Vec::new();
        for p in &self.row.members {
            let reason = if config.is_excluded(&p.comm) {
                "excluded_name"
            } else {
                match verdicts.get(&p.id).copied() {
                    Some(CmdVerdict::End) => {
                        self.e.undecided.remove(&p.id);
                        let target = ReapTarget { proc: *p, session: self.row.id, root_pid: self.e.root.root.id.pid };
                        out.push(target);
                        continue;
                    }
                    Some(CmdVerdict::Gone) => continue,
                    Some(CmdVerdict::Excluded { .. }) => "excluded_command",
                    Some(CmdVerdict::TooLong) => "cmdline_too_long",
                    // Not read in time this tick: decided again at the next step, as below.
                    Some(CmdVerdict::Deferred) => {
                        if self.e.undecided.insert(p.id) {
                            self.lines.push(skipped(p, "read_budget"));
                        }
                        continue;
                    }
                    // Undecided in this tick's round (a hostile pattern or command line, or a
                    // round out of time): never ended on a guess; decided again at the next step.
                    Some(CmdVerdict::Budget) | None => {
                        if self.e.undecided.insert(p.id) {
                            self.lines.push(skipped(p, "match_budget"));
                        }
                        continue;
                    }
                }
            };
            self.e.undecided.remove(&p.id);
            if self.e.protected.insert(p.id) {
                self.lines.push(skipped(p, reason));
            }
        }
        out
    }

    /// `REAPED root=… name=… count=<ended> survivors=<alive>`.
    fn reaped(&self) -> Line {
        let alive: BTreeSet<ProcId> = self.row.members.iter().map(|p| p.id).collect();
        let ended = self.e.signalled.iter().filter(|id| !alive.contains(id)).count();
        Line::Reaped {
            root: self.e.root.root.id.pid,
            name: self.e.root.root.comm,
            count: ended as u64,
            survivors: alive.len() as u64,
        }
    }
}

/// What the signals of a tick add: `DRY_RUN` lines (or `SKIPPED … identity_changed` for a
/// leftover whose identity no longer held) for a dry run's verified targets; the signalled
/// processes, the `REAPED` totals and the leftovers ended ([`SessionPlan::ended`]) in the book.
pub fn after_reap(plan: &mut SessionPlan, term: &[Outcome], kill: &[Outcome]) -> Vec<Line> {
    let mut lines = Vec::new();
    for (t, o) in plan.term.iter().zip(term) {
        match o {
            Outcome::Verified if plan.term_signal == Signal::Verify => {
                lines.push(Line::DryRunLeftover { pid: t.proc.id.pid, name: t.proc.comm, root: t.root_pid })
            }
            Outcome::Refused(_) => lines.push(skipped(&t.proc, "identity_changed")),
            _ => {
                if let Some(e) = plan.book.ended.get_mut(&t.session) {
                    e.signalled.insert(t.proc.id);
                }
            }
        }
    }
    record(&mut plan.book, &plan.kill, kill);
    for l in &plan.lines {
        if let Line::Reaped { count, .. } = l {
            plan.book.totals.reaped += 1;
            plan.book.totals.stopped += count;
            plan.ended += count;
        }
    }
    lines
}

/// Signals sent to `targets` (`outcomes[i]` is target `i`'s): those that reached their process
/// count as signalled for their session's `REAPED`.
pub fn record(book: &mut SessionBook, targets: &[ReapTarget], outcomes: &[Outcome]) {
    for (t, o) in targets.iter().zip(outcomes) {
        if matches!(o, Outcome::Ended { .. } | Outcome::Termed) {
            if let Some(e) = book.ended.get_mut(&t.session) {
                e.signalled.insert(t.proc.id);
            }
        }
    }
}

#[cfg(test)]
#[path = "sessions_tests.rs"]
mod tests;
