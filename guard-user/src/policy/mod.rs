//! The policy: pure functions of (table view, config, flag clocks, now) → what a tick does.
//!
//! No kernel, no files, no clock: the daemon passes everything in, tests call it directly.
//! [`plan`] is docs/architecture.md steps 3–6 for names; [`decide::decide`] builds a whole tick on it (the
//! per-process half of step 5, the lines, the status rows); [`line`] is a log line as data;
//! [`time`] the two clocks (elapsed time is monotonic, the state file's times are wall times);
//! [`memory`] what the policy remembers between ticks (clocks, incidents, stall, warn-once) and
//! the tick's `begin → Plan → finish`; [`cmdline`] which command lines need the matcher.
#[cfg(any(test, feature = "testing"))]
use crate::pattern::Pattern;
use crate::{comm::Comm, config::Config};

pub mod cmdline;
pub mod decide;
pub mod incidents;
pub mod memory;
pub mod outage;
pub mod roots;
pub mod sessions;
mod sessions_chase;
mod sessions_status;
pub mod slots;
#[cfg(test)]
mod slots_tests;
pub mod stall;
#[cfg(test)]
mod tests;
pub mod time;

pub use decide::{AccountView, CmdVerdict};
#[cfg(any(test, feature = "testing"))]
pub use {decide::decide, decide::TickInput, incidents::Incidents};
pub use memory::Memory;
pub use time::Now;

/// Flag clocks: name → when it first reached the threshold, keyed by the name's bytes. The
/// policy's are on the daemon's monotonic clock; the state file's are unix seconds ([`time`]).
pub use crate::domain::FlagClocks;

/// How a plan's targets are signalled. The plan carries it, dry run included, so the tick's IO
/// sends exactly what it is told and decides nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM to all, one wait, SIGKILL to those still themselves (the count rule).
    End,
    /// SIGTERM, nothing waited for (a session's leftovers).
    Term,
    /// SIGKILL (a session's leftovers, after their SIGTERM).
    Kill,
    /// A dry run: the identities are verified, nothing is sent (`DRY_RUN`).
    Verify,
}

impl Signal {
    /// `real`, or [`Signal::Verify`] in a dry run.
    pub fn unless_dry(dry_run: bool, real: Signal) -> Signal {
        if dry_run {
            Signal::Verify
        } else {
            real
        }
    }
}

/// What the tick does about one name at/over the threshold.
#[derive(Clone, Debug, PartialEq)]
pub struct NameVerdict {
    pub name: Comm,
    pub count: u32,
    /// When the name was first flagged, on the monotonic clock ([`time`]); it also names the
    /// incident (a warning is given once per flag clock).
    pub first_flagged: f64,
    /// First tick at/over the threshold: logged `first_flagged=now`.
    pub newly_flagged: bool,
    /// Flagged for at least `timeout`: end its processes (but the excluded ones).
    pub enforce: bool,
}

impl NameVerdict {
    /// Seconds since the name was flagged (never negative, even if the clock stepped back).
    pub fn elapsed_secs(&self, now: f64) -> f64 {
        (now - self.first_flagged).max(0.0)
    }

    /// When enforcement is due (on the monotonic clock).
    pub fn deadline(&self, config: &Config) -> f64 {
        self.first_flagged + config.timeout.as_secs_f64()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct NamePlan {
    /// Every non-excluded name at/over the threshold, sorted by name.
    pub names: Vec<NameVerdict>,
    /// The flag clocks to store: exactly the names in `names` (dropped and excluded names are
    /// gone, so their clock restarts when they come back).
    pub clocks: FlagClocks,
}

impl NamePlan {
    /// The earliest enforcement deadline among names not enforced this tick (for the deadline
    /// timer; on the monotonic clock).
    pub fn next_deadline(&self, config: &Config) -> Option<f64> {
        self.names.iter().filter(|v| !v.enforce).map(|v| v.deadline(config)).reduce(f64::min)
    }
}

/// docs/architecture.md steps 3–6.
pub fn plan(counts: &[(Comm, u32)], config: &Config, clocks: &FlagClocks, now: f64) -> NamePlan {
    let mut names: Vec<NameVerdict> = counts
        .iter()
        .filter(|(name, count)| *count >= config.threshold && !config.is_excluded(name))
        .map(|&(name, count)| {
            let (first_flagged, newly_flagged) = match clocks.get(&name) {
                // A clock in the future (never made by `time::to_memory`, which reads a future
                // file time as now) counts from now rather than never.
                Some(&t) if t.is_finite() && t <= now => (t, false),
                Some(_) => (now, false),
                None => (now, true),
            };
            let enforce = now - first_flagged >= config.timeout.as_secs_f64();
            NameVerdict { name, count, first_flagged, newly_flagged, enforce }
        })
        .collect();
    names.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
    let clocks = names.iter().map(|v| (v.name, v.first_flagged)).collect();
    NamePlan { names, clocks }
}

/// The verdict of compiled `excludeCommands` patterns on one command line, matched in-process.
#[cfg(any(test, feature = "testing"))]
pub fn classify(cmdline: &[u8], patterns: &[Pattern]) -> CmdVerdict {
    match patterns.iter().position(|p| p.is_match(cmdline)) {
        Some(index) => CmdVerdict::Excluded { index },
        None => CmdVerdict::End,
    }
}

/// `first_flagged=<m>m_ago`: whole minutes, rounded down.
pub fn minutes_ago(elapsed_secs: f64) -> u64 {
    (elapsed_secs / 60.0).floor() as u64
}
