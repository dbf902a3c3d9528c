//! Which command lines a tick reads, in what order, and which of them need the matcher at all
//! (docs/architecture.md, the trust boundary).
//!
//! [`reading_order`] names the processes whose command lines the tick (and `explain`) reads;
//! after each read, [`route`] says whether its verdict is already known; only [`Route::Ask`]
//! goes to the sandboxed matcher. Pure: the reading, its budget, the cache and the matcher are
//! the caller's (`daemon::verdicts`).
use std::collections::HashMap;

use super::{AccountView, CmdVerdict, FlagClocks};
use crate::{config::Config, event::ProcId, event::ProcState};

/// Why a process's command line was not read at a tick; it decides where the process stands in
/// the next tick's [`reading_order`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deferred {
    /// The tick's reading time ran out before its turn: it is read first next tick, so no
    /// process waits more than one tick behind others however long the reads before it take.
    NotReached,
    /// Its own read overran its share of the tick (a process can make its memory slow to
    /// read): it is read last next tick, after every other process had its turn.
    Slow,
}

/// A process whose command line the last tick did not read: why, and since which tick it has been
/// waiting for its turn (a process read late again keeps its place in the queue).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub why: Deferred,
    /// The tick (a count the caller keeps) at which it was first left unread.
    pub since: u64,
}

/// Command lines at most this long are cheap to read and to match: nearly every real one (a
/// shell's, an editor's, a build's) is. Longer ones, and texts on which a pattern overran, are
/// read after every cheap one.
pub const CHEAP_BYTES: usize = 4096;

/// What is known of the cost of a process's command line (see [`reading_order`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cost {
    /// Never read.
    Unknown,
    /// At most [`CHEAP_BYTES`] when last read, and no pattern overran on it.
    Cheap,
    /// Longer, or a text a pattern overran on and that is not settled yet.
    Costly,
}

/// The processes whose command lines a tick reads, in order: every member of a name at or over
/// the threshold (and every extra process the tick added to the view, e.g. a session's
/// leftovers due for a step) whose name `excludes` does not list, since an excluded name is never
/// ended and its command lines decide nothing. In order:
/// 1. the cheap ones: processes whose command line was at most [`CHEAP_BYTES`] when last read
///    and whose text no pattern overran on (`cost` says; one never read is cheap unless a
///    member of its name is costly: forks share their argv, so new forks of a name of long
///    command lines cannot go first by being new). The account can make a command line 1 MiB
///    long, slow to read and slow to match, but not for a process it does not own: with its long
///    ones read after every short one, a name of ordinary command lines is read, matched and
///    decided every tick, however many long ones wait (a loaded host reads few of them per tick);
/// 2. then the costly ones, the same way;
/// 3. last, the processes whose read overran its share at the last tick ([`Deferred::Slow`]).
///
/// Within 1 and 2: first the processes the last tick did not reach ([`Deferred::NotReached`]),
/// those waiting longest first: a queue, so however many there are, a process waits at most as
/// many ticks as it takes to read the ones ahead of it; then, name by name, the name flagged
/// longest first (the one due, or nearest to it, is decided first if time runs out), names not
/// flagged yet last, ties in name order; each name's processes in the view's order (by pid).
pub fn reading_order<'a>(
    view: &'a AccountView,
    config: &Config,
    clocks: &FlagClocks,
    deferred: &HashMap<ProcId, Waiting>,
    cost: impl Fn(ProcId) -> Cost,
) -> Vec<&'a ProcState> {
    let mut names: Vec<_> = view.members.iter().filter(|(name, _)| !config.is_excluded(name)).collect();
    // The sort is stable: the map's name order stays among equal flag times.
    names.sort_by(|(a, _), (b, _)| {
        let at = |n| clocks.get(n).copied().unwrap_or(f64::INFINITY);
        at(*a).total_cmp(&at(*b))
    });
    let mut order: Vec<(&ProcState, bool)> = Vec::new();
    for (_, members) in names {
        let costs: Vec<Cost> = members.iter().map(|p| cost(p.id)).collect();
        let name_costly = costs.contains(&Cost::Costly);
        for (p, c) in members.iter().zip(costs) {
            order.push((p, c == Cost::Costly || (c == Cost::Unknown && name_costly)));
        }
    }
    let rank = |(p, costly): &(&ProcState, bool)| match deferred.get(&p.id) {
        Some(Waiting { why: Deferred::Slow, .. }) => (2, 0, 0),
        Some(Waiting { why: Deferred::NotReached, since }) => (u8::from(*costly), 0, *since),
        None => (u8::from(*costly), 1, 0),
    };
    // Stable: equal ranks keep the names' order.
    order.sort_by_key(rank);
    order.into_iter().map(|(p, _)| p).collect()
}

/// Whether a process's verdict needs its command line at all: with no pattern nothing can
/// protect it, so it is `End` unread (the enforcer still checks its identity before a signal).
pub fn needs_reading(has_patterns: bool) -> bool {
    has_patterns
}

/// Where one command line's verdict comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Known without matching: `End` with no pattern, `TooLong` past the matcher's cap,
    /// `Budget` while the matcher is down.
    Decided(CmdVerdict),
    /// A verdict settled earlier on exactly this text (the verdict cache).
    Cached(CmdVerdict),
    /// Send it to the matcher.
    Ask,
}

/// The rules, in order:
/// 1. no pattern protects nothing: `End`, whatever the text's length or the matcher's health;
/// 2. a text longer than the matcher takes (`max`) is never matched on a cut-off prefix (`$`
///    would change meaning): protected as `TooLong`, a reason of its own;
/// 3. a verdict settled on exactly this text is served (`settled`, asked only past rules 1–2);
/// 4. while the matcher cannot run, whatever it would have been asked is protected (`Budget`):
///    a broken worker must never make a process endable.
pub fn route(
    has_patterns: bool,
    len: usize,
    max: usize,
    matcher_up: bool,
    settled: impl FnOnce() -> Option<CmdVerdict>,
) -> Route {
    if !has_patterns {
        return Route::Decided(CmdVerdict::End);
    }
    if len > max {
        return Route::Decided(CmdVerdict::TooLong);
    }
    if let Some(v) = settled() {
        return Route::Cached(v);
    }
    if !matcher_up {
        return Route::Decided(CmdVerdict::Budget);
    }
    Route::Ask
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::Comm;

    const MAX: usize = 1 << 20;

    fn proc(pid: u32, name: &str) -> ProcState {
        ProcState { id: ProcId { pid, start_ticks: 1 }, euid: 4201, comm: Comm::new(name.as_bytes()) }
    }

    fn view(procs: &[ProcState]) -> AccountView {
        let mut v = AccountView::default();
        for p in procs {
            v.members.entry(p.comm).or_default().push(*p);
        }
        v
    }

    fn pids(order: &[&ProcState]) -> Vec<u32> {
        order.iter().map(|p| p.id.pid).collect()
    }

    #[test]
    fn the_name_flagged_longest_is_read_first_and_excluded_names_are_never_read() {
        let procs = [proc(1, "aa"), proc(2, "bb"), proc(3, "cc"), proc(4, "bash"), proc(5, "aa")];
        let clocks: FlagClocks = [(Comm::new(b"cc"), 10.0), (Comm::new(b"bb"), 20.0)].into_iter().collect();
        let config = Config::defaults(std::path::Path::new("/home/x"));
        assert!(config.is_excluded(&Comm::new(b"bash")));
        let v = view(&procs);
        let order = reading_order(&v, &config, &clocks, &HashMap::new(), |_| Cost::Cheap);
        assert_eq!(pids(&order), [3, 2, 1, 5], "cc (flagged first), bb, then aa not flagged yet; bash never");
    }

    #[test]
    fn a_process_not_reached_goes_first_next_tick_and_a_slow_one_last() {
        let procs = [proc(1, "aa"), proc(2, "aa"), proc(3, "aa"), proc(4, "bb")];
        let clocks: FlagClocks = [(Comm::new(b"aa"), 1.0), (Comm::new(b"bb"), 2.0)].into_iter().collect();
        let wait = |why, since| Waiting { why, since };
        let deferred: HashMap<ProcId, Waiting> =
            [(procs[0].id, wait(Deferred::Slow, 3)), (procs[3].id, wait(Deferred::NotReached, 2))]
                .into_iter()
                .collect();
        let v = view(&procs);
        let order = reading_order(&v, &Config::defaults(std::path::Path::new("/h")), &clocks, &deferred, |_| Cost::Cheap);
        assert_eq!(pids(&order), [4, 2, 3, 1]);
        // Among the ones left unread, the longest waiting first, whatever their names' flags.
        let deferred: HashMap<ProcId, Waiting> = [
            (procs[0].id, wait(Deferred::NotReached, 7)),
            (procs[2].id, wait(Deferred::NotReached, 5)),
            (procs[3].id, wait(Deferred::NotReached, 6)),
        ]
        .into_iter()
        .collect();
        let order = reading_order(&v, &Config::defaults(std::path::Path::new("/h")), &clocks, &deferred, |_| Cost::Cheap);
        assert_eq!(pids(&order), [3, 4, 1, 2]);
    }

    #[test]
    fn every_cheap_command_line_is_read_before_any_costly_one_and_a_slow_one_last() {
        // 1–4 of a name flagged long ago whose command lines were long (costly) when last read,
        // 5 and 6 of a name flagged last with short ones; 2 and 6 were not reached last tick, 3
        // overran its share.
        let procs = [proc(1, "big"), proc(2, "big"), proc(3, "big"), proc(4, "big"), proc(5, "new"), proc(6, "new")];
        let clocks: FlagClocks = [(Comm::new(b"big"), 1.0), (Comm::new(b"new"), 50.0)].into_iter().collect();
        let wait = |why, since| Waiting { why, since };
        let deferred: HashMap<ProcId, Waiting> = [
            (procs[1].id, wait(Deferred::NotReached, 4)),
            (procs[2].id, wait(Deferred::Slow, 4)),
            (procs[5].id, wait(Deferred::NotReached, 9)),
        ]
        .into_iter()
        .collect();
        let costly = |id: ProcId| if id.pid <= 4 { Cost::Costly } else { Cost::Cheap };
        let v = view(&procs);
        let config = Config::defaults(std::path::Path::new("/h"));
        let order = reading_order(&v, &config, &clocks, &deferred, costly);
        assert_eq!(pids(&order), [6, 5, 2, 1, 4, 3], "cheap (waiting, then by flag), costly, slow");
        // A process never read is cheap, unless its name has a costly member: a new fork of a
        // name of long command lines does not go first.
        let cost = |id: ProcId| match id.pid {
            1 => Cost::Costly,
            2 | 5 => Cost::Unknown,
            _ => Cost::Cheap,
        };
        let order = reading_order(&v, &config, &clocks, &HashMap::new(), cost);
        assert_eq!(pids(&order), [3, 4, 5, 6, 1, 2]);
    }

    #[test]
    fn only_a_list_with_patterns_needs_command_lines() {
        assert!(!needs_reading(false));
        assert!(needs_reading(true));
    }

    #[test]
    fn a_process_the_matcher_cannot_be_asked_about_is_protected() {
        assert_eq!(route(true, 10, MAX, false, || None), Route::Decided(CmdVerdict::Budget));
        assert_eq!(route(true, 10, MAX, true, || None), Route::Ask);
    }

    #[test]
    fn without_patterns_nothing_is_protected_even_with_the_matcher_down_or_a_padded_command_line() {
        assert_eq!(route(false, 10, MAX, false, || None), Route::Decided(CmdVerdict::End));
        assert_eq!(route(false, MAX + 1, MAX, true, || None), Route::Decided(CmdVerdict::End));
    }

    #[test]
    fn a_command_line_past_the_cap_is_protected_as_too_long_never_matched_cut() {
        let never = || -> Option<CmdVerdict> { panic!("a text past the cap is never looked up") };
        assert_eq!(route(true, MAX + 1, MAX, true, never), Route::Decided(CmdVerdict::TooLong));
        assert_eq!(route(true, MAX, MAX, true, || None), Route::Ask, "exactly the cap is matched");
    }

    #[test]
    fn a_settled_verdict_is_served_even_while_the_matcher_is_down() {
        let end = || Some(CmdVerdict::End);
        assert_eq!(route(true, 10, MAX, false, end), Route::Cached(CmdVerdict::End));
        let excluded = || Some(CmdVerdict::Excluded { index: 2 });
        assert_eq!(route(true, 10, MAX, true, excluded), Route::Cached(CmdVerdict::Excluded { index: 2 }));
    }
}
