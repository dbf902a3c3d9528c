//! What the daemon keeps about names from tick to tick and across a restart: the flag clocks, the
//! warned incidents and the repeat histories, with the bounds that keep them small. `policy`
//! holds and changes them; `crate::state` reads and writes them as the state file.
use std::collections::BTreeMap;

use crate::comm::Comm;

/// Flag clocks: name → when it first reached the threshold, keyed by the name's bytes. In the
/// file (and in [`State`]) unix seconds with ms precision; the daemon holds them on its
/// monotonic clock (see `policy::time`).
pub type FlagClocks = BTreeMap<Comm, f64>;

/// Names with a repeat history (`REPEAT`): a respawn loop is one or a few names; the oldest go
/// first past this.
pub const MAX_REPEAT_NAMES: usize = 1024;

/// Enforcements kept per name (`repeatAfter` is at most 1000).
pub const MAX_REPEAT_ENTRIES: usize = 1000;

/// Enforcements kept across every name: 16 names enforced every minute for a day at
/// `repeatAfter` 1000, or 1024 names enforced 16 times each. An enforcement is ~70 bytes in
/// the file and 16 in memory; the oldest go first past this.
pub const MAX_REPEAT_TOTAL: usize = 16_384;

/// Everything that survives a restart: the flag clocks, and the bookkeeping of warnings and
/// repeat offenders (issue-level features that must not repeat or forget across a restart).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    pub clocks: FlagClocks,
    /// Names warned about (`WARNING`), with the flag clock they were warned for: one warning
    /// per incident, an incident being one flag clock.
    pub warned: FlagClocks,
    /// Enforcements per name over the last 24 h, for `REPEAT`.
    pub repeats: BTreeMap<Comm, RepeatHistory>,
}

/// One name's enforcements within the last 24 h.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RepeatHistory {
    /// (unix seconds, processes killed) per enforcing tick that killed any, oldest first.
    pub enforcements: Vec<(f64, u32)>,
    /// When `REPEAT` was last logged for the name.
    pub reported: Option<f64>,
}

impl RepeatHistory {
    /// The last time anything happened to the name (its newest enforcement or report).
    pub fn last_seen(&self) -> f64 {
        self.enforcements.last().map(|(t, _)| *t).into_iter().chain(self.reported).fold(f64::NEG_INFINITY, f64::max)
    }
}

/// Keeps `repeats` within [`MAX_REPEAT_NAMES`], [`MAX_REPEAT_ENTRIES`] per name and
/// [`MAX_REPEAT_TOTAL`] in all, dropping the oldest first. O(n log n) in the entries, whatever
/// they hold (one sort, never a scan per removal).
pub fn cap_repeats(repeats: &mut BTreeMap<Comm, RepeatHistory>) {
    for h in repeats.values_mut() {
        let over = h.enforcements.len().saturating_sub(MAX_REPEAT_ENTRIES);
        h.enforcements.drain(..over);
    }
    if repeats.len() > MAX_REPEAT_NAMES {
        let mut by_age: Vec<(f64, Comm)> = repeats.iter().map(|(n, h)| (h.last_seen(), *n)).collect();
        by_age.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut kept = BTreeMap::new();
        for (_, name) in &by_age[..MAX_REPEAT_NAMES] {
            kept.extend(repeats.remove_entry(name));
        }
        *repeats = kept;
    }
    let total: usize = repeats.values().map(|h| h.enforcements.len()).sum();
    if total > MAX_REPEAT_TOTAL {
        // The oldest enforcements across all names go, exactly as many as are over (many names
        // enforced in one tick share its time, so a cut by time alone could keep too many).
        let mut all: Vec<(f64, Comm)> =
            repeats.iter().flat_map(|(n, h)| h.enforcements.iter().map(move |(t, _)| (*t, *n))).collect();
        all.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut dropped: BTreeMap<Comm, usize> = BTreeMap::new();
        for (_, name) in &all[..total - MAX_REPEAT_TOTAL] {
            *dropped.entry(*name).or_default() += 1;
        }
        for (name, k) in dropped {
            if let Some(h) = repeats.get_mut(&name) {
                // Histories are kept oldest first (the daemon appends), so these are its oldest.
                h.enforcements.drain(..k);
            }
        }
    }
}
