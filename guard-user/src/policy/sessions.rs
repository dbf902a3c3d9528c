//! Sessions and their leftovers: the pure half (docs/configuration.md `sessions`, docs/log.md
//! `LEFTOVER` and `REAPED`).
//!
//! The pump's lineage ([`crate::lineage`]) knows which session each process was forked into; a
//! tick hands [`decide_sessions`] that view, the verdict on each pending exec's command line
//! (a root or not), the `excludeCommands` verdicts of the members it may stop, and the
//! [`SessionBook`] it holds between ticks. The plan says which pending sessions become roots,
//! what to log, which processes get SIGTERM or SIGKILL this tick, which sessions are settled,
//! and when the next step is due (the deadline timer wakes the tick then).
//!
//! An ended session goes through steps across ticks, never inside one (a tick has a deadline;
//! the 10 s between SIGTERM and SIGKILL would eat it): *grace* (until `grace` after the root
//! ended: its live members are then its leftovers, one `LEFTOVER` line each); with `"stop"`,
//! *term* (SIGTERM to every leftover that is not protected, then up to [`STOP_WAIT`]); *kill*
//! (SIGKILL to what is left, new members included, checked again [`KILL_CHECK`] later, at most
//! [`KILL_ROUNDS`] rounds); then one `REAPED` line and the session is settled. It closes early
//! once nothing but protected members is left.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{CmdVerdict, Now};
use crate::log::{Kind, Line};
use crate::{
    comm::Comm,
    config::{Config, Leftovers, Sessions},
    enforcer::Outcome,
    event::{ProcId, ProcState},
    lineage::{LineageCmd, SessionId, SessionRow, SessionsView},
    status::{SessionProcess, SessionStatus, SessionsStatus},
};

/// Seconds from SIGTERM to SIGKILL (systemd's `TimeoutStopSec` role).
pub const STOP_WAIT: f64 = 10.0;
/// Seconds from a SIGKILL round to the look that closes the session (or kills what appeared).
pub const KILL_CHECK: f64 = 1.0;
/// SIGKILL rounds at most: a member forked while a round ran is killed by the next one; a
/// session whose members still fork after three rounds is closed with them as survivors.
pub const KILL_ROUNDS: u32 = 3;
/// Sessions listed in the status file (`tree`); the rest are counted.
pub const MAX_STATUS_SESSIONS: usize = 64;
/// Processes listed per session in the status file; the rest are counted.
pub const MAX_STATUS_PROCESSES: usize = 256;
/// Bytes of a root's command line kept for `tree` (escaped when shown).
pub const MAX_ROOT_COMMAND: usize = 256;

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

/// What the tick holds about sessions between ticks. Not persisted: a restart forgets the
/// sessions in their grace or stop (their leftovers are then processes without a session).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SessionBook {
    pub roots: BTreeMap<SessionId, RootInfo>,
    pub ended: BTreeMap<SessionId, EndedSession>,
    pub totals: SessionTotals,
}

/// The classification of one pending session's command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RootVerdict {
    /// Matches `sessions.roots`; the command line as read.
    Root { command: Vec<u8> },
    /// Matches none, could not be decided within the matcher's bounds, or is gone: not a root
    /// (fail safe: a session that is not one reaps nothing).
    Other,
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
    /// This tick's verdict on the candidates of `view`.
    pub roots: &'a HashMap<SessionId, RootVerdict>,
    /// `excludeCommands` verdicts of the members [`due_members`] named; a member without one is
    /// protected (`match_budget`), never ended.
    pub verdicts: &'a HashMap<ProcId, CmdVerdict>,
    pub book: &'a SessionBook,
}

/// One process to signal for a session.
#[derive(Clone, Debug, PartialEq)]
pub struct ReapTarget {
    pub proc: ProcState,
    pub session: SessionId,
    pub root_pid: u32,
}

/// What one tick does about sessions.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SessionPlan {
    /// For the pump: classifications and settled sessions.
    pub commands: Vec<LineageCmd>,
    /// `LEFTOVER`, `SKIPPED` and `REAPED` lines, before any signal of this tick.
    pub lines: Vec<Line>,
    /// SIGTERM (or, in a dry run, only verified: `DRY_RUN`).
    pub term: Vec<ReapTarget>,
    /// SIGKILL, each after the identity check.
    pub kill: Vec<ReapTarget>,
    /// The book after this tick, before the signals' outcomes ([`after_reap`] adds those).
    pub book: SessionBook,
    /// The next step due (monotonic clock), for the deadline timer.
    pub next_deadline: Option<f64>,
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
    view.sessions.iter().filter(|row| row.ended && asked(row)).flat_map(|row| row.members.iter().copied()).collect()
}

fn skipped(p: &ProcState, reason: &'static str) -> Line {
    Line::Skipped { pid: p.id.pid, name: p.comm, reason }
}

fn earliest(a: Option<f64>, b: f64) -> Option<f64> {
    Some(a.map_or(b, |a| a.min(b)))
}

/// The plan for this tick (see the module doc).
pub fn decide_sessions(input: &SessionsInput) -> SessionPlan {
    let SessionsInput { view, config, sessions, now: clocks, dry_run, ages, roots, verdicts, book } = *input;
    let now = clocks.mono;
    let mut plan = SessionPlan { book: book.clone(), ..Default::default() };
    for c in &view.candidates {
        let root = match roots.get(&c.session) {
            Some(RootVerdict::Root { command }) => {
                let command = command[..command.len().min(MAX_ROOT_COMMAND)].to_vec();
                plan.book.roots.insert(c.session, RootInfo { root: c.process, command, since: clocks.wall });
                true
            }
            Some(RootVerdict::Other) => false,
            // Not read this tick (over the tick's share): asked again next tick.
            None => continue,
        };
        plan.commands.push(LineageCmd::Classified { session: c.session, root });
    }
    // What the pump no longer has is forgotten (turned off and on, or refused at the cap).
    let known: BTreeSet<SessionId> = view.sessions.iter().map(|r| r.id).collect();
    let classified: BTreeSet<SessionId> = plan.book.roots.keys().copied().filter(|id| roots.contains_key(id)).collect();
    plan.book.roots.retain(|id, _| known.contains(id) || classified.contains(id));
    plan.book.ended.retain(|id, _| known.contains(id));
    let grace = sessions.grace.as_secs_f64();
    for row in &view.sessions {
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
                    plan.commands.push(LineageCmd::Settle(row.id));
                    false
                } else {
                    let targets = step.targets(config, verdicts);
                    if dry_run {
                        // Verified only; the DRY_RUN lines come from the outcomes (after_reap).
                        plan.term.extend(targets);
                        plan.commands.push(LineageCmd::Settle(row.id));
                        false
                    } else if targets.is_empty() && !step.undecided_left() {
                        let line = step.reaped();
                        plan.lines.push(line);
                        plan.commands.push(LineageCmd::Settle(row.id));
                        false
                    } else {
                        step.e.phase = Phase::Term { at: now };
                        plan.next_deadline = earliest(plan.next_deadline, now + STOP_WAIT);
                        plan.term.extend(targets);
                        true
                    }
                }
            }
            (Phase::Term { at }, due) | (Phase::Kill { at, .. }, due) => {
                let round = match step.e.phase {
                    Phase::Kill { round, .. } => round,
                    _ => 0,
                };
                let left = row.members.iter().any(|p| !step.e.protected.contains(&p.id));
                if !left || (due && round >= KILL_ROUNDS) {
                    let line = step.reaped();
                    plan.lines.push(line);
                    plan.commands.push(LineageCmd::Settle(row.id));
                    false
                } else if due {
                    step.announce();
                    let targets = step.targets(config, verdicts);
                    step.e.phase = Phase::Kill { at: now, round: round + 1 };
                    plan.next_deadline = earliest(plan.next_deadline, now + KILL_CHECK);
                    plan.kill.extend(targets);
                    true
                } else {
                    let wait = if round == 0 { STOP_WAIT } else { KILL_CHECK };
                    plan.next_deadline = earliest(plan.next_deadline, at + wait);
                    true
                }
            }
        };
        if keep {
            plan.book.ended.insert(row.id, e);
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
/// processes, and the `REAPED` totals, in the book.
pub fn after_reap(plan: &mut SessionPlan, term: &[Outcome], kill: &[Outcome], dry_run: bool) -> Vec<Line> {
    let mut lines = Vec::new();
    for (t, o) in plan.term.iter().zip(term) {
        match o {
            Outcome::Verified if dry_run => {
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
    for (t, o) in plan.kill.iter().zip(kill) {
        if matches!(o, Outcome::Ended { .. }) {
            if let Some(e) = plan.book.ended.get_mut(&t.session) {
                e.signalled.insert(t.proc.id);
            }
        }
    }
    for l in &plan.lines {
        if let Line::Reaped { count, .. } = l {
            plan.book.totals.reaped += 1;
            plan.book.totals.stopped += count;
        }
    }
    lines
}

/// The status of `view` (the lineage after this tick's answers) with what `book` remembers.
pub fn status(view: &SessionsView, book: &SessionBook, sessions: &Sessions, ages: Ages, now: Now) -> SessionsStatus {
    let grace = sessions.grace.as_secs_f64();
    let wall = |mono: f64| now.wall_of(mono);
    let c = view.counts;
    let mut rows = Vec::new();
    for row in view.sessions.iter().take(MAX_STATUS_SESSIONS) {
        let (info, ended) = match (book.roots.get(&row.id), book.ended.get(&row.id)) {
            (_, Some(e)) => (Some(&e.root), Some(e)),
            (info, None) => (info, None),
        };
        let root = row.root_state.or(info.map(|i| i.root));
        let (stage, due_at) = match ended.map(|e| (e.ended_at, e.phase)) {
            None if row.ended => ("grace", Some(now.wall + grace)),
            None => ("live", None),
            Some((at, Phase::Grace)) => ("grace", Some(wall(at + grace))),
            Some((_, Phase::Term { at })) => ("stopping", Some(wall(at + STOP_WAIT))),
            Some((_, Phase::Kill { at, .. })) => ("stopping", Some(wall(at + KILL_CHECK))),
        };
        rows.push(SessionStatus {
            root_pid: row.root.pid,
            root_start: row.root.start_ticks,
            root_name: root.map(|r| r.comm.to_string()).unwrap_or_default(),
            command: info.map(|i| crate::escape::text(&i.command)).unwrap_or_default(),
            since: info.map(|i| i.since),
            root_age_secs: row.root_state.map(|r| ages.of(&r, now.wall)),
            stage: stage.into(),
            ended_at: ended.map(|e| wall(e.ended_at)),
            due_at,
            processes: row
                .members
                .iter()
                .take(MAX_STATUS_PROCESSES)
                .map(|p| SessionProcess { pid: p.id.pid, start: p.id.start_ticks, name: p.comm.to_string() })
                .collect(),
            processes_omitted: row.members.len().saturating_sub(MAX_STATUS_PROCESSES) as u64,
        });
    }
    let pending_leftovers = view.sessions.iter().filter(|r| r.ended).map(|r| r.members.len() as u64).sum::<u64>();
    SessionsStatus {
        leftovers: sessions.leftovers.token().into(),
        grace_secs: grace,
        live: c.live,
        ended: c.ended,
        pending_leftovers,
        leftovers_total: book.totals.leftovers,
        reaped_total: book.totals.reaped,
        stopped_total: book.totals.stopped,
        tracked: c.nodes,
        pending_execs: c.pending,
        untracked_total: c.untracked_total,
        unclassified_total: c.unclassified_total,
        roots_refused_total: c.roots_refused_total,
        sessions_omitted: view.sessions.len().saturating_sub(MAX_STATUS_SESSIONS) as u64,
        sessions: rows,
    }
}

#[cfg(test)]
#[path = "sessions_tests.rs"]
mod tests;
