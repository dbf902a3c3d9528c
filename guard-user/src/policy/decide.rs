//! `decide`: one tick's whole plan, from what the daemon gathered (docs/architecture.md).
//!
//! Pure: no kernel, no files, no clock. [`super::memory::Memory::begin`] calls [`decide`] on
//! what the daemon gathered (the account's view of the live table, the config, "now", and a
//! verdict for the command line of every process that could be ended) and the flag clocks and
//! incidents the memory holds; `Plan::finish` asks [`after_signals`] for the lines the signal
//! outcomes produce, and `Memory::complete` [`complete`] for `TICK_COMPLETE`. Every rule of a
//! tick lives in `policy/`; the tick's IO decides nothing.
use std::collections::{BTreeMap, HashMap};

use super::{
    incidents::{self, Incidents},
    minutes_ago, plan, FlagClocks, Now, Signal,
};
use crate::{
    comm::Comm,
    config::Config,
    domain::{NameStatus, Outcome},
    event::{ProcId, ProcState},
    log::line::{Ended, Line, UnflagReason},
};

/// The table's view of the account is the tick's input.
pub use crate::table::AccountView;

/// What the command line of one process says about ending it (docs/architecture.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmdVerdict {
    /// Gone (no command line to read): not signalled.
    Gone,
    /// Matches `excludeCommands[index]`: left alone.
    Excluded { index: usize },
    /// The bounded matcher could not decide in time: protected, never ended.
    Budget,
    /// The command line is longer than the matcher takes (1 MiB): never matched on a cut-off
    /// prefix, so protected while the pattern list is not empty (nothing can protect it
    /// otherwise). A reason of its own, because a real program almost never has one: the
    /// account may have padded its arguments to be protected, and the operator must see that.
    TooLong,
    /// Its command line was not read in time this tick (the tick's reading time ran out before
    /// it, or its own read overran its share): protected this tick, read again next tick.
    Deferred,
    /// Matches no pattern: ended when its name is enforced.
    End,
}

/// Everything a tick decides on.
#[derive(Clone, Copy, Debug)]
pub struct TickInput<'a> {
    pub view: &'a AccountView,
    pub config: &'a Config,
    /// The flag clocks in memory (the authority; the state file is their persistence), on the
    /// monotonic clock, as every time of the incidents.
    pub clocks: &'a FlagClocks,
    /// Elapsed time is measured on `now.mono`; `now.wall` only dates the status rows.
    pub now: Now,
    /// Verdicts for the processes of names at/over the threshold; a process without one is
    /// treated as gone.
    pub verdicts: &'a HashMap<ProcId, CmdVerdict>,
    /// Warnings given and enforcements counted so far.
    pub incidents: &'a Incidents,
    /// `--dry-run`: the targets are verified, never signalled ([`TickPlan::signal`]).
    pub dry_run: bool,
}

/// One process to signal (or, in dry run, to verify).
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    pub proc: ProcState,
    /// The name's count this tick (for the `KILLED`/`DRY_RUN` line).
    pub count: u32,
    /// Seconds since the name was flagged (the line's `elapsed=`).
    pub elapsed_secs: f64,
}

/// What one tick does.
#[derive(Clone, Debug, PartialEq)]
pub struct TickPlan {
    /// The clocks to hold (and persist when they changed).
    pub clocks: FlagClocks,
    /// Lines before any signal: `FLAGGED` per flagged name, `SKIPPED` per protected process of
    /// an enforced name.
    pub lines: Vec<Line>,
    /// Every process to end, across every due name: signalled together (docs/architecture.md: all SIGTERMs,
    /// one wait, then the SIGKILLs).
    pub targets: Vec<Target>,
    /// How the targets are signalled: [`Signal::End`], or [`Signal::Verify`] in a dry run.
    pub signal: Signal,
    /// Status rows: flagged names and names at or over half the threshold.
    pub status: Vec<NameStatus>,
    /// Names at/over the threshold (`TICK_COMPLETE flagged=`).
    pub flagged: usize,
    /// The earliest enforcement deadline of a name not enforced now, or the earliest warning
    /// still to give (on the monotonic clock).
    pub next_deadline: Option<f64>,
    /// The incidents after this tick's warnings (enforcements are counted by [`after_signals`]).
    pub incidents: Incidents,
}

/// docs/architecture.md steps 3–6 and the per-process half of step 5, for one tick.
pub fn decide(input: &TickInput) -> TickPlan {
    let TickInput { view, config, clocks, now: both, verdicts, incidents: before, dry_run } = *input;
    let now = both.mono;
    let names = plan(&view.counts, config, clocks, now);
    let mut inc = before.clone();
    incidents::prune(&mut inc, &names.clocks, now);
    let mut next_deadline = names.next_deadline(config);
    let mut lines = unflagged(view, config, clocks, &names.clocks, now);
    let mut targets = Vec::new();
    let mut status = Vec::new();
    for v in &names.names {
        let elapsed = v.elapsed_secs(now);
        let minutes_ago = (!v.newly_flagged).then(|| minutes_ago(elapsed));
        lines.push(Line::Flagged { name: v.name, count: v.count, minutes_ago });
        let (mut skip, mut end) = (0u32, 0u32);
        for p in view.members.get(&v.name).map(Vec::as_slice).unwrap_or_default() {
            let reason = match verdicts.get(&p.id).copied().unwrap_or(CmdVerdict::Gone) {
                CmdVerdict::End => {
                    end += 1;
                    if v.enforce {
                        targets.push(Target { proc: *p, count: v.count, elapsed_secs: elapsed });
                    }
                    continue;
                }
                CmdVerdict::Gone => "identity_changed",
                CmdVerdict::Excluded { .. } => {
                    skip += 1;
                    "excluded_command"
                }
                CmdVerdict::Budget => {
                    skip += 1;
                    "match_budget"
                }
                CmdVerdict::TooLong => {
                    skip += 1;
                    "cmdline_too_long"
                }
                CmdVerdict::Deferred => {
                    skip += 1;
                    "read_budget"
                }
            };
            // SKIPPED is an enforcement's line: a flagged name waiting for its timeout skips nothing yet.
            if v.enforce {
                lines.push(skipped(p.id.pid, v.name, reason));
            }
        }
        if let Some(at) = incidents::warning_due(v, config, &inc).filter(|at| *at > now) {
            next_deadline = Some(next_deadline.map_or(at, |d| d.min(at)));
        }
        if let Some(w) = incidents::warning(v, config, now, end, skip, &mut inc) {
            lines.push(w);
        }
        // Warned and not yet enforced: `status` shows the warning from this row's figures.
        let warned = !v.enforce && inc.warned.get(&v.name) == Some(&v.first_flagged);
        status.push(NameStatus {
            name: v.name.to_string(),
            count: v.count,
            threshold: config.threshold,
            flagged_since: Some(both.wall_of(v.first_flagged)),
            time_left_secs: Some((v.deadline(config) - now).max(0.0)),
            would_skip: Some(skip),
            would_end: Some(end),
            excluded: false,
            warned,
        });
    }
    // `status` also shows names on their way (at or over half the threshold, not excluded), and
    // excluded names at or over it: never ended, but a pile hiding under one is seen.
    let half = config.threshold.div_ceil(2);
    for (name, count) in &view.counts {
        let excluded = config.is_excluded(name);
        if (*count >= half && *count < config.threshold && !excluded) || (excluded && *count >= config.threshold) {
            status.push(NameStatus {
                name: name.to_string(),
                count: *count,
                threshold: config.threshold,
                excluded,
                ..Default::default()
            });
        }
    }
    status.sort_by(|a, b| b.count.cmp(&a.count).then(a.name.cmp(&b.name)));
    let signal = Signal::unless_dry(dry_run, Signal::End);
    TickPlan {
        next_deadline,
        flagged: names.names.len(),
        clocks: names.clocks,
        lines,
        targets,
        signal,
        status,
        incidents: inc,
    }
}

/// `UNFLAGGED` for every name whose clock this tick drops (docs/architecture.md step 6): below
/// the threshold, or excluded now. Its clock starts again when it comes back, so a pile that dips
/// under the threshold at a tick, or is renamed away for one, starts its `timeout` over; this
/// line says so, with how long the clock had run, so such a dip is never silent.
fn unflagged(view: &AccountView, config: &Config, held: &FlagClocks, kept: &FlagClocks, now: f64) -> Vec<Line> {
    held.iter()
        .filter(|(name, _)| !kept.contains_key(*name))
        .map(|(name, since)| {
            let count = view.counts.iter().find(|(n, _)| n == name).map_or(0, |(_, c)| *c);
            let reason = if config.is_excluded(name) { UnflagReason::Excluded } else { UnflagReason::BelowThreshold };
            Line::Unflagged { name: *name, count, flagged_for_mins: minutes_ago((now - since).max(0.0)), reason }
        })
        .collect()
}

fn skipped(pid: u32, name: Comm, reason: &'static str) -> Line {
    Line::Skipped { pid, name, reason }
}

/// What the signals of a tick add to it.
#[derive(Clone, Debug, PartialEq)]
pub struct AfterSignals {
    /// `KILLED`/`DRY_RUN`/`SKIPPED` in target order, then any `REPEAT`.
    pub lines: Vec<Line>,
    /// `KILLED` lines.
    pub kills: u64,
    /// The incidents with this tick's enforcements counted.
    pub incidents: Incidents,
}

/// The lines the signal outcomes produce (`outcomes[i]` belongs to `plan.targets[i]`), and the
/// enforcements they add to the repeat bookkeeping. `now` is on the monotonic clock.
pub fn after_signals(plan: &TickPlan, outcomes: &[Outcome], config: &Config, now: f64) -> AfterSignals {
    let mut lines = Vec::with_capacity(outcomes.len());
    let mut kills = 0;
    let mut kills_by_name: BTreeMap<Comm, u32> = BTreeMap::new();
    for (t, outcome) in plan.targets.iter().zip(outcomes) {
        let ended = Ended { pid: t.proc.id.pid, name: t.proc.comm, count: t.count, elapsed_secs: t.elapsed_secs };
        lines.push(match outcome {
            // Gone after SIGTERM, or sent SIGKILL as itself (see enforcer's doc).
            Outcome::Ended { .. } => {
                kills += 1;
                *kills_by_name.entry(t.proc.comm).or_default() += 1;
                Line::Killed(ended)
            }
            Outcome::Verified => Line::DryRun(ended),
            // Not signalled, or it changed identity after SIGTERM and was left alone.
            Outcome::Refused(_) | Outcome::Survived | Outcome::Termed => {
                skipped(t.proc.id.pid, t.proc.comm, "identity_changed")
            }
        });
    }
    let mut incidents = plan.incidents.clone();
    lines.extend(incidents::record_enforcements(&kills_by_name, config, now, &mut incidents));
    AfterSignals { lines, kills, incidents }
}

/// `TICK_COMPLETE`, closing every tick (docs/architecture.md step 7).
pub fn complete(flagged: usize, kills: u64, errors: u32) -> Line {
    Line::TickComplete { flagged, kills, errors }
}
