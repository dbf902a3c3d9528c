//! Foresight beyond the kill (issue-level features, documented in docs/log.md): one `WARNING`
//! per incident when a flagged name's enforcement is due within `warnBefore`, and one `REPEAT`
//! a day for a name enforced `repeatAfter` times within 24 h (a respawn loop that killing will
//! not fix). Pure: the bookkeeping lives in [`Incidents`], which the state file persists.
use std::collections::BTreeMap;

use super::{FlagClocks, NameVerdict};
use crate::log::Line;
use crate::{
    comm::Comm,
    config::Config,
    domain::{cap_repeats, RepeatHistory, RepeatOffender, MAX_REPEAT_ENTRIES},
};

/// The window of `REPEAT`.
pub const DAY: f64 = 86_400.0;

/// What the incidents remember between ticks (and restarts: the state file holds it).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Incidents {
    /// Name → the flag clock it was warned for.
    pub warned: FlagClocks,
    /// Name → its enforcements within the last 24 h.
    pub repeats: BTreeMap<Comm, RepeatHistory>,
}

/// Whole minutes until `secs` have passed, rounded up (`due_in=1m` for 20 s: never `0m` before
/// the enforcement).
pub fn minutes_up(secs: f64) -> u64 {
    (secs.max(0.0) / 60.0).ceil() as u64
}

/// The `WARNING` for a flagged name not enforced this tick, when its enforcement is due within
/// `warnBefore` and this incident (this flag clock) has not been warned about.
pub fn warning(v: &NameVerdict, config: &Config, now: f64, ends: u32, skips: u32, inc: &mut Incidents) -> Option<Line> {
    if v.enforce || config.warn_before.is_zero() {
        return None;
    }
    let due_in = v.deadline(config) - now;
    if due_in > config.warn_before.as_secs_f64() || inc.warned.get(&v.name) == Some(&v.first_flagged) {
        return None;
    }
    inc.warned.insert(v.name, v.first_flagged);
    Some(Line::Warning { name: v.name, count: v.count, due_in_secs: due_in.max(0.0).ceil() as u64, ends, skips })
}

/// When a name's warning falls due (for the deadline timer), if it has not been given.
pub fn warning_due(v: &NameVerdict, config: &Config, inc: &Incidents) -> Option<f64> {
    if v.enforce || config.warn_before.is_zero() || inc.warned.get(&v.name) == Some(&v.first_flagged) {
        return None;
    }
    Some(v.deadline(config) - config.warn_before.as_secs_f64())
}

/// Forgets warnings of incidents that ended (the name dropped below the threshold, or its clock
/// restarted) and enforcements older than a day, then keeps the repeat histories within their
/// bounds ([`cap_repeats`]: one sort, so 170,000 names cost milliseconds, not minutes).
pub fn prune(inc: &mut Incidents, clocks: &FlagClocks, now: f64) {
    inc.warned.retain(|name, at| clocks.get(name) == Some(at));
    for h in inc.repeats.values_mut() {
        h.enforcements.retain(|(t, _)| now - t < DAY && *t <= now);
        // A report in the future (a clock that stepped back) counts from now, never for ever.
        h.reported = h.reported.map(|r| r.min(now));
    }
    inc.repeats.retain(|_, h| !h.enforcements.is_empty() || h.reported.is_some_and(|r| now - r < DAY));
    cap_repeats(&mut inc.repeats);
}

/// Records this tick's enforcements (names with at least one `KILLED`) and returns the `REPEAT`
/// lines due: a name enforced `repeatAfter` times within 24 h, not reported for a day.
pub fn record_enforcements(
    kills_by_name: &BTreeMap<Comm, u32>,
    config: &Config,
    now: f64,
    inc: &mut Incidents,
) -> Vec<Line> {
    let mut lines = Vec::new();
    for (name, kills) in kills_by_name.iter().filter(|(_, k)| **k > 0) {
        let h = inc.repeats.entry(*name).or_default();
        h.enforcements.retain(|(t, _)| now - t < DAY);
        h.enforcements.push((now, *kills));
        if h.enforcements.len() > MAX_REPEAT_ENTRIES {
            h.enforcements.remove(0);
        }
        let (e, k) = totals(h);
        if e >= config.repeat_after && h.reported.is_none_or(|r| now - r >= DAY) {
            h.reported = Some(now);
            lines.push(Line::Repeat { name: *name, enforcements_24h: e, kills_24h: k });
        }
    }
    lines
}

fn totals(h: &RepeatHistory) -> (u32, u32) {
    (h.enforcements.len() as u32, h.enforcements.iter().map(|(_, k)| *k).sum())
}

/// Names at or over `repeatAfter` enforcements within the last 24 h, for `status`.
pub fn offenders(inc: &Incidents, config: &Config, now: f64) -> Vec<RepeatOffender> {
    inc.repeats
        .iter()
        .filter_map(|(name, h)| {
            let recent: Vec<_> = h.enforcements.iter().filter(|(t, _)| now - t < DAY).collect();
            let e = recent.len() as u32;
            (e >= config.repeat_after).then(|| RepeatOffender {
                name: name.to_string(),
                enforcements_24h: e,
                kills_24h: recent.iter().map(|(_, k)| *k).sum(),
            })
        })
        .collect()
}
