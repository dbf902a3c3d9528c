//! Patterns that match every command line (docs/configuration.md): `a||b`, `()`, `.*`, `^`, `$`.
//! Such a pattern protects every process of every enforced name, so a name that piles up is
//! flagged, warned about and then left alone: nothing is ever ended. It is valid (bash accepts
//! it) and the daemon honours it, but it is almost always a mistake — sparing a whole name is
//! what `excludes` is for — so `validate` reports it as a problem and the daemon logs
//! `WARN pattern_matches_all index=<i>` once per list.
//!
//! # How it is decided
//! Whether a regular expression matches every string is decidable, but not through `regcomp`,
//! and the pattern is the account's: it is compiled only in the sandboxed worker, never in the
//! daemon. So the worker is asked about [`PROBES`], command lines that share nothing: the empty
//! one, one space, one letter, one digit, punctuation, every printable ASCII character, control
//! and non-ASCII bytes, and ordinary commands ([`ORDINARY`]).
//! - A pattern that matches every command line matches each probe, so it is always reported
//!   (when the matcher can decide: a probe it leaves undecided reports nothing).
//! - A pattern reported matches the empty command line and each probe. One that does without
//!   matching every line needs an alternative for the empty line alone (`^$`, which matches
//!   nothing else) *and* alternatives that between them cover every probe — not a mistake made
//!   by accident, and one that protects nearly everything anyway.
//!
//! A list can also match every command line together (`^$` and `.`) with no single pattern
//! doing so: [`covers_every_probe`] tells `validate` that the list as a whole does.
//!
//! # `sessions.roots`: every *ordinary* command line
//! A roots pattern names the programs that start sessions; one that matches every ordinary
//! command line (a shell, a login shell, a sleep, a script, a package manager, a daemon by its
//! path: [`ORDINARY`]) names none, and would make nearly every process a root and every orphan a
//! leftover, even though it leaves odd lines (`~`, control bytes) alone: `[a-z]`, `[[:alnum:]]`,
//! `.`. So for roots a pattern, or the list together, is refused when it matches the empty command
//! line or every ordinary probe ([`too_broad_for_roots`]); one that leaves any ordinary line alone
//! (`^[^a]` leaves `apt update`) is a roots pattern, however odd.
use super::MatchOutcome;

/// Where the ordinary command lines start in [`PROBES`] (see the module doc).
pub const ORDINARY: usize = 8;

/// The probe command lines (see the module doc). Short, so a match on them costs microseconds.
pub const PROBES: &[&[u8]] = &[
    b"",
    b" ",
    b"x",
    b"0",
    b"~",
    b"--",
    b" !\"#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~",
    b"\x01\x1b\x7f\x80\xff",
    // [`ORDINARY`]: what an account runs every day.
    b"/usr/bin/sleep 600",
    b"bash",
    b"-bash",
    b"sh -c make",
    b"sleep 1",
    b"python3 x.py",
    b"apt update",
    b"/usr/bin/env",
    b"node server.js",
    b"git status",
    b"vim README.md",
    b"/usr/lib/systemd/systemd --user",
    b"top",
];

/// [`PROBES`] but the empty one: the command lines an exec can have (a heavy-command slot's
/// pattern is asked about these: `.` takes every command there is).
pub fn command_probes() -> &'static [&'static [u8]] {
    &PROBES[1..]
}

/// The outcomes of [`command_probes`] against one pattern alone: whether it matches every
/// command an exec can run.
pub fn matches_every_command(outcomes: &[MatchOutcome]) -> bool {
    outcomes.len() == PROBES.len() - 1 && outcomes.iter().all(|o| matches!(o, MatchOutcome::Matched(_)))
}

/// The outcomes of [`PROBES`] against one pattern alone: whether it matches every command line.
pub fn matches_every_probe(outcomes: &[MatchOutcome]) -> bool {
    outcomes.len() == PROBES.len() && outcomes.iter().all(|o| matches!(o, MatchOutcome::Matched(_)))
}

/// The outcomes of [`PROBES`] against a whole list (each the first pattern that matches): whether
/// the list as a whole matches every command line.
pub fn covers_every_probe(outcomes: &[MatchOutcome]) -> bool {
    matches_every_probe(outcomes)
}

/// What the outcomes of [`PROBES`] against a whole list say about which single pattern matches
/// every command line:
/// - `Found(i)`: every probe's first match is pattern `i`, so `i` matches them all;
/// - `None`: some probe matched nothing (or was undecided), so no pattern matches them all;
/// - `From(m)`: every probe matched, by different patterns. A pattern that matches them all is
///   at index `m` (the latest first match) or later: only those need asking one by one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListVerdict {
    Found(usize),
    None,
    From(usize),
}

pub fn list_verdict(outcomes: &[MatchOutcome]) -> ListVerdict {
    if !covers_every_probe(outcomes) {
        return ListVerdict::None;
    }
    let first: Vec<usize> =
        outcomes.iter().filter_map(|o| if let MatchOutcome::Matched(i) = o { Some(*i) } else { None }).collect();
    let latest = first.iter().copied().max().unwrap_or(0);
    if first.iter().all(|&i| i == latest) {
        ListVerdict::Found(latest)
    } else {
        ListVerdict::From(latest)
    }
}

/// For `sessions.roots` (docs/configuration.md): whether a pattern, or a list, is too broad to
/// name session roots: it matches the empty command line, or every ordinary one (see the module
/// doc). Such a list would make nearly every process a root, and so every orphan a leftover; it
/// is refused.
pub fn too_broad_for_roots(outcomes: &[MatchOutcome]) -> bool {
    !matches!(roots_verdict(outcomes), ListVerdict::None)
}

/// [`list_verdict`] for `sessions.roots`: `Found(i)` when pattern `i` matches the empty command
/// line or every ordinary probe; `From(m)` when the list as a whole matches every ordinary probe,
/// by different patterns, so a single one that does is at `m` or later (if none does alone, the
/// list together is too broad).
pub fn roots_verdict(outcomes: &[MatchOutcome]) -> ListVerdict {
    if outcomes.len() != PROBES.len() {
        return ListVerdict::None;
    }
    if let MatchOutcome::Matched(i) = outcomes[0] {
        return ListVerdict::Found(i);
    }
    let ordinary = &outcomes[ORDINARY..];
    if !ordinary.iter().all(|o| matches!(o, MatchOutcome::Matched(_))) {
        return ListVerdict::None;
    }
    let first: Vec<usize> =
        ordinary.iter().filter_map(|o| if let MatchOutcome::Matched(i) = o { Some(*i) } else { None }).collect();
    let latest = first.iter().copied().max().unwrap_or(0);
    if first.iter().all(|&i| i == latest) {
        ListVerdict::Found(latest)
    } else {
        ListVerdict::From(latest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pattern::Pattern;

    /// The outcomes the matcher would give for `patterns` on the probes (in-process glibc: these
    /// are fixed, benign test patterns).
    fn outcomes(patterns: &[&str]) -> Vec<MatchOutcome> {
        let compiled: Vec<Pattern> = patterns.iter().map(|p| Pattern::new(p).unwrap()).collect();
        PROBES
            .iter()
            .map(|t| match compiled.iter().position(|p| p.is_match(t)) {
                Some(i) => MatchOutcome::Matched(i),
                None => MatchOutcome::NoMatch,
            })
            .collect()
    }

    #[test]
    fn patterns_that_match_everything_are_told_from_those_that_match_much() {
        for all in ["a||b", "()", ".*", "^", "$", "x*", "|", "(^|[ /])*", "[[:print:]]*|.*"] {
            assert!(matches_every_probe(&outcomes(&[all])), "{all:?} matches every command line");
        }
        // The shipped patterns, and near misses that protect a great deal but not everything.
        let shipped = crate::config::DEFAULT_EXCLUDE_COMMANDS;
        let near = ["^$", ".", "\\b", "^[^/]*$", "[^z]", "^.{0,40}$", " |^$", "^[ -~]*$", "sleep|^$"];
        for p in shipped.iter().chain(&near) {
            assert!(!matches_every_probe(&outcomes(&[p])), "{p:?} does not match every command line");
        }
    }

    #[test]
    fn a_list_names_the_pattern_that_matches_everything_or_where_to_look() {
        let shipped = crate::config::DEFAULT_EXCLUDE_COMMANDS;
        assert_eq!(list_verdict(&outcomes(shipped)), ListVerdict::None);
        let mut with_all: Vec<&str> = shipped.to_vec();
        with_all.insert(2, "a||b");
        assert_eq!(list_verdict(&outcomes(&with_all)), ListVerdict::Found(2));
        // `^$` answers the empty line first, `.*` every other: look from `.*`'s index on.
        assert_eq!(list_verdict(&outcomes(&["^$", "x", ".*"])), ListVerdict::From(2));
        // Together, but neither alone.
        assert_eq!(list_verdict(&outcomes(&["^$", "."])), ListVerdict::From(1));
        assert!(!matches_every_probe(&outcomes(&["."])) && covers_every_probe(&outcomes(&["^$", "."])));
        // An undecided probe decides nothing.
        let mut undecided = outcomes(&["a||b"]);
        undecided[3] = MatchOutcome::Budget;
        assert_eq!(list_verdict(&undecided), ListVerdict::None);
    }

    #[test]
    fn a_roots_pattern_matching_the_empty_command_line_or_every_ordinary_one_is_too_broad() {
        let broad = [
            "^",
            ".*",
            "a||b",
            "$",
            "^$",
            "(^|x)",
            ".",
            "^[^z]",
            "[[:print:][:cntrl:]]|[^[:print:]]",
            // They leave `~` and control bytes alone, but no ordinary command line.
            "[a-z]",
            "[[:alnum:]]",
            "[[:lower:]]",
            "[^[:upper:]]",
        ];
        for b in broad {
            assert!(too_broad_for_roots(&outcomes(&[b])), "{b:?} is too broad for roots");
        }
        let fine = [
            "(^|/)agent-wrapper( |$)",
            "(^|[ /])claude( |$)",
            "^/usr/bin/python3 -m agent",
            // Odd, but it leaves `apt update` alone: not every ordinary command line.
            "^[^a]",
            "(^|/)bash( |$)",
        ];
        for p in fine {
            assert!(!too_broad_for_roots(&outcomes(&[p])), "{p:?} names roots");
        }
        assert_eq!(roots_verdict(&outcomes(&["wrapper", "^$"])), ListVerdict::Found(1));
        assert_eq!(roots_verdict(&outcomes(&["wrapper", ".", "x"])), ListVerdict::Found(1));
        // Together: a letter-led or a not-letter-led line is every non-empty line.
        assert_eq!(roots_verdict(&outcomes(&["^[^a-z]", "^[a-z]"])), ListVerdict::From(1));
        assert!(too_broad_for_roots(&outcomes(&["^[^a]", "^a"])));
        assert_eq!(roots_verdict(&outcomes(&["(^|/)agent-wrapper( |$)"])), ListVerdict::None);
        // An ordinary line left undecided decides nothing.
        let mut undecided = outcomes(&["[a-z]"]);
        undecided[ORDINARY + 1] = MatchOutcome::Budget;
        assert!(!too_broad_for_roots(&undecided));
    }

    /// More probes keep `excludeCommands`' meaning: only a pattern that matches every line is
    /// reported, and the slots' every-command check is unchanged for those that do.
    #[test]
    fn the_ordinary_probes_keep_what_every_other_list_means() {
        for p in ["[a-z]", "[[:alnum:]]", "^[^a]", " "] {
            assert!(!matches_every_probe(&outcomes(&[p])), "{p:?}");
        }
        let all: Vec<MatchOutcome> = command_probes().iter().map(|_| MatchOutcome::Matched(0)).collect();
        assert!(matches_every_command(&all));
    }
}
