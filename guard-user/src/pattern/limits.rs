//! Every bound on `excludeCommands`, and the checks that need no worker process.
//!
//! The account writes the patterns, so each bound below is what it costs the root daemon at
//! most, whatever the account writes. The numbers were measured on glibc 2.36 (Debian
//! bookworm, x86-64, 2 cores); DEVELOPERS.md ("The excludeCommands matcher") has the measurements.
//!
//! | bound | default | why this value |
//! |---|---|---|
//! | `max_patterns` | 256 | 10,000 simple patterns hold 276 MB compiled; 256 shipped-like ones hold ~7 MB, inside the worker's heap. A real list has a handful. |
//! | `max_pattern_bytes` | 1024 | a pattern is one command-line shape; 1 KiB is several times the longest sensible one and bounds the parse (nesting depth ≤ 512). |
//! | `max_expansion` | 2048 nodes | glibc copies a repeated atom once per count (`a{1,255}` is 255 copies) and its compile cost grows with the square of optional copies: 1,000 cost 9.5 MB and 20 ms, 3,000 cost 73 MB. 2048 lets any 1 KiB pattern without huge repeats through (a literal byte is one node) and refuses `((a{1,255}){1,255}){1,255}` (16.8 million) before anything is compiled; what passes is still bounded by `memory_bytes` and `compile`. |
//! | `max_text_bytes` | 1 MiB (slots: 64 KiB) | a command line is at most ~6 MiB (Linux's exec limit), almost always under 4 KiB. The shipped set takes 3.4 ms on a 1 MiB text (up to ~60 ms per pattern on a run of one byte), far inside `per_match`; a longer one is `Budget` (protected), never matched against a cut-off prefix (`$` would change meaning); for the slots, a longer one is no slot's (it never waits). |
//! | `spawn` | 2 s | starting the worker (exec, hardening, first frame) takes ~2 ms; 2 s absorbs a loaded host. |
//! | `compile` | 2 s | the shipped set compiles in 0.06 ms; patterns within `max_expansion` compile in ≤ ~150 ms. A set that needs more is refused as too costly, once per config change. |
//! | `per_match` | 250 ms | one pattern on one text. The shipped patterns take ≤ 60 ms on a 1 MiB text, microseconds on a real one (10,000 texts × 4 patterns: 22 ms through the worker); `(a*)*\1` needs seconds on 300 bytes. The worker is killed between 250 and ~315 ms into a regexec (the parent samples the progress page every quarter of it). |
//! | `strikes` | 3 | after three texts a pattern could not decide in one [`Round`](super::Round), it is skipped for the rest of the round (its texts are `Budget` unless a later pattern matches), so a hostile pattern costs at most ~1 s of a tick, not 250 ms per process. The same count bounds one text: after three patterns overran or ran out of memory on it, it is `Budget` without trying the rest (it is protected whatever they say), so a hostile text costs ~1 s too, not 250 ms per pattern. |
//! | `memory_bytes` | 14 MiB (the `sessions.roots` worker: 8 MiB, `Limits::roots`; the slots' worker: 4 MiB, `Limits::slots`) | the worker's heap (RLIMIT_DATA above what it had at start). The unit's `MemoryMax=64M` covers the daemon, this worker, the roots worker and the slots' worker, each at its bound at once (docs/architecture.md, "Bounds", adds them up); the worker at rest is 3.9 MB resident, 0.3 MB of it its own. 256 shipped-like patterns compile into ~7 MB; the shipped set matches a 1 MiB text in a few MB. `(a*)*\1` on 100 KiB reaches it in ~0.2 s and gets `Budget`. |
//! | `stack_bytes` | 4 MiB (roots: 2 MiB, slots: 1 MiB) | RLIMIT_STACK. Legitimate patterns recurse a few hundred frames at most (nesting depth ≤ 512 bytes/2); `()(\1\1)+` recurses without end and dies whatever the limit, so the limit only caps what such a crash touches. |
//! | `cpu_seconds` | 60 s | RLIMIT_CPU, a backstop should the parent die without killing the worker mid-match. It is cumulative, so the parent replaces a worker that used half of it (after hours of real matching) between calls. |
//! | `run_as` | 65534:65534 | the identity the worker takes when started as root: `nobody`, not root (it parses hostile input with a C engine) and not the guarded account (which could then signal it). |
use std::{fmt, time::Duration};

/// Every bound the bounded matcher enforces. [`Limits::default`] is what the daemon uses; tests
/// shrink some to reach them quickly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most patterns in one `excludeCommands` list.
    pub max_patterns: usize,
    /// Longest pattern, in bytes.
    pub max_pattern_bytes: usize,
    /// Largest static cost estimate of one pattern (regex nodes after glibc copies repeats).
    pub max_expansion: u64,
    /// Longest text the worker is asked about; a longer one is [`MatchOutcome::Budget`](super::MatchOutcome).
    pub max_text_bytes: usize,
    /// How long the worker may take to start and harden itself.
    pub spawn: Duration,
    /// How long compiling a whole list may take.
    pub compile: Duration,
    /// How long one pattern may run on one text.
    pub per_match: Duration,
    /// Failures of one pattern within one round after which the round stops running it; also
    /// the patterns that may fail (overrun, run out of memory) on one text before it is settled
    /// as `Budget`.
    pub strikes: u32,
    /// The worker's heap, in bytes, beyond what it had when it started.
    pub memory_bytes: u64,
    /// The worker's stack limit, in bytes.
    pub stack_bytes: u64,
    /// The worker's CPU-time backstop, in seconds.
    pub cpu_seconds: u64,
    /// `(uid, gid)` the worker switches to when started as root; `None` keeps root (tests only).
    pub run_as: Option<(u32, u32)>,
    /// Install the seccomp filter (read, write, memory and exit only). Off only to compare.
    pub seccomp: bool,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_patterns: 256,
            max_pattern_bytes: 1024,
            max_expansion: 2048,
            max_text_bytes: 1 << 20,
            spawn: Duration::from_secs(2),
            compile: Duration::from_secs(2),
            per_match: Duration::from_millis(250),
            strikes: 3,
            memory_bytes: 14 << 20,
            stack_bytes: 4 << 20,
            cpu_seconds: 60,
            run_as: Some((65534, 65534)),
            seccomp: true,
        }
    }
}

impl Limits {
    /// The `sessions.roots` worker's: the same bounds on a smaller heap and stack. A list of
    /// roots is a few patterns, and what it cannot decide within them is simply no root; the two
    /// workers and the daemon add up inside the unit's `MemoryMax=64M` (docs/architecture.md,
    /// "Bounds").
    pub fn roots() -> Limits {
        Limits { memory_bytes: 8 << 20, stack_bytes: 2 << 20, ..Limits::default() }
    }

    /// The slots' worker's (`daemon::slots_io`): `excludeCommands` and every slot's `commands`
    /// (the shipped four and a few slots compile in a fraction of it) in a 4 MiB heap and a 1 MiB
    /// stack, on command lines of at most 64 KiB. A longer command line is no slot's (it never
    /// waits); lists that do not compile within it are a config error (`ERROR config_malformed
    /// slots.commands`), and no command waits.
    pub fn slots() -> Limits {
        Limits { memory_bytes: 4 << 20, stack_bytes: 1 << 20, max_text_bytes: 64 << 10, ..Limits::default() }
    }
}

/// Why a pattern is too costly to use. Each displays a reason and a fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CostReason {
    /// The static estimate: repeats would make glibc build `nodes` regex nodes.
    Expansion { nodes: u64, max: u64 },
    /// Compiling the list did not finish within `limit`; this pattern was being compiled.
    CompileTime { limit: Duration },
    /// Compiling ran out of the worker's heap (`limit` bytes) at this pattern.
    CompileMemory { limit: u64 },
    /// The worker died compiling this pattern (e.g. glibc overflowed the worker's stack).
    CompileCrash { detail: String },
}

impl fmt::Display for CostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CostReason::Expansion { nodes, max } => write!(
                f,
                "its repeats expand to about {nodes} regex nodes, over the limit of {max}; keep the product of \
                 nested {{m,n}} counts times what they repeat small, e.g. write a{{1,255}} once instead of \
                 ((a{{1,255}}){{1,255}}){{1,255}}, or use * or + where any count will do"
            ),
            CostReason::CompileTime { limit } => write!(
                f,
                "compiling the list did not finish within {limit:?} and stopped at this pattern; simplify it \
                 (fewer nested or optional repeats), or split the list"
            ),
            CostReason::CompileMemory { limit } => write!(
                f,
                "compiling needs more than the matcher's {} MiB at this pattern; use fewer or smaller repeats \
                 ({{m,n}} with a large n is the usual cause), or fewer patterns",
                limit >> 20
            ),
            CostReason::CompileCrash { detail } => write!(
                f,
                "compiling it crashed the sandboxed matcher ({detail}); simplify it (less nesting, fewer repeats)"
            ),
        }
    }
}

/// Why a pattern list cannot be used. Displays as one line: the reason, then the fix, naming the
/// pattern as `excludeCommands[<i>]`; [`PatternSetError::in_list`] names it as the list it came
/// from says (`sessions.roots[<i>]`, or `guard-user match`'s `--pattern`). `pattern` fields hold
/// the pattern as written (account-controlled: escape before logging).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PatternSetError {
    TooMany {
        count: usize,
        max: usize,
    },
    TooLong {
        index: usize,
        len: usize,
        max: usize,
        prefix: String,
    },
    Nul {
        index: usize,
        pattern: String,
    },
    Invalid {
        index: usize,
        pattern: String,
        reason: String,
    },
    TooCostly {
        index: usize,
        pattern: String,
        why: CostReason,
    },
    /// The worker process could not be started or kept running; not a problem of the list.
    Worker(String),
}

impl std::error::Error for PatternSetError {}

/// Where a list of patterns comes from, for its messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Source {
    /// The key (`excludeCommands`) or option (`--pattern`) that holds the patterns.
    pub key: &'static str,
    /// Whether a pattern is named by its position (`key[<i>]`).
    pub indexed: bool,
}

impl Source {
    pub const EXCLUDE_COMMANDS: Source = Source { key: "excludeCommands", indexed: true };
    pub const SESSIONS_ROOTS: Source = Source { key: "sessions.roots", indexed: true };
    pub const SLOT_COMMANDS: Source = Source { key: "slots.commands", indexed: true };
}

/// [`PatternSetError`] named as its list says ([`PatternSetError::in_list`]).
pub struct InList<'a>(&'a PatternSetError, Source);

impl fmt::Display for InList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let InList(e, src) = self;
        let at = |index: &usize| if src.indexed { format!("{}[{index}]", src.key) } else { src.key.to_string() };
        match e {
            PatternSetError::TooMany { count, max } => write!(
                f,
                "{} has {count} patterns, more than {max}; merge patterns with | or remove unused ones",
                src.key
            ),
            PatternSetError::TooLong { index, len, max, .. } => write!(
                f,
                "{} is {len} bytes long, more than {max}; shorten it (match a distinctive part of the command line, \
                 not all of it)",
                at(index)
            ),
            PatternSetError::Nul { index, pattern } => {
                write!(f, "{} {pattern:?} contains a NUL byte, which bash cannot hold; remove it", at(index))
            }
            PatternSetError::Invalid { index, pattern, reason } => write!(
                f,
                "{} {pattern:?} is not a valid bash extended regex: {reason}; fix it and try it with guard-user \
                 match --pattern",
                at(index)
            ),
            PatternSetError::TooCostly { index, pattern, why } => {
                write!(f, "{} {pattern:?} is too costly: {why}", at(index))
            }
            PatternSetError::Worker(detail) => write!(
                f,
                "the sandboxed pattern matcher is not working: {detail}; this is not caused by the patterns (their \
                 processes are protected meanwhile): check that guard-user can start `guard-user __pattern-worker` \
                 and switch it to its run_as identity"
            ),
        }
    }
}

impl fmt::Display for PatternSetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        InList(self, Source::EXCLUDE_COMMANDS).fmt(f)
    }
}

impl PatternSetError {
    /// This error, naming its pattern as `src` holds it.
    pub fn in_list(&self, src: Source) -> InList<'_> {
        InList(self, src)
    }

    /// The offending pattern, for `ERROR config_malformed excludeCommands pattern=<pattern>` (a prefix
    /// for one too long to log).
    pub fn pattern(&self) -> Option<&str> {
        match self {
            PatternSetError::TooLong { prefix, .. } => Some(prefix),
            PatternSetError::Nul { pattern, .. }
            | PatternSetError::Invalid { pattern, .. }
            | PatternSetError::TooCostly { pattern, .. } => Some(pattern),
            PatternSetError::TooMany { .. } | PatternSetError::Worker(_) => None,
        }
    }

    /// The position of the offending pattern in the list, when one pattern is at fault.
    pub fn index(&self) -> Option<usize> {
        match self {
            PatternSetError::TooLong { index, .. }
            | PatternSetError::Nul { index, .. }
            | PatternSetError::Invalid { index, .. }
            | PatternSetError::TooCostly { index, .. } => Some(*index),
            PatternSetError::TooMany { .. } | PatternSetError::Worker(_) => None,
        }
    }

    /// Whether the list itself is at fault (a config error), rather than the worker.
    pub fn is_config_error(&self) -> bool {
        !matches!(self, PatternSetError::Worker(_))
    }
}

/// The checks that need no process, in the order a reader fixes them: the count, then each
/// pattern's NUL, length and static cost. Config validation calls this; [`Matcher::set_patterns`](super::Matcher::set_patterns)
/// calls it again before anything reaches the worker.
pub fn check_static(patterns: &[String], limits: &Limits) -> Result<(), PatternSetError> {
    if patterns.len() > limits.max_patterns {
        return Err(PatternSetError::TooMany { count: patterns.len(), max: limits.max_patterns });
    }
    for (index, pattern) in patterns.iter().enumerate() {
        if pattern.len() > limits.max_pattern_bytes {
            let mut cut = 64.min(pattern.len());
            while !pattern.is_char_boundary(cut) {
                cut -= 1;
            }
            let prefix = format!("{}…", &pattern[..cut]);
            return Err(PatternSetError::TooLong { index, len: pattern.len(), max: limits.max_pattern_bytes, prefix });
        }
        if pattern.contains('\0') {
            return Err(PatternSetError::Nul { index, pattern: pattern.clone() });
        }
        let nodes = expansion(pattern.as_bytes());
        if nodes > limits.max_expansion {
            return Err(PatternSetError::TooCostly {
                index,
                pattern: pattern.clone(),
                why: CostReason::Expansion { nodes, max: limits.max_expansion },
            });
        }
    }
    Ok(())
}

/// One parenthesised level while estimating.
#[derive(Default)]
struct Level {
    /// Cost of the alternatives already closed by `|`.
    closed: u64,
    /// Cost of the alternative being read.
    branch: u64,
    /// Cost of the last atom of `branch` (what a quantifier repeats); 0 when there is none.
    last: u64,
    /// Number of `|` at this level.
    bars: u64,
}

/// A static over-estimate of the regex nodes glibc builds for `pattern`, in the spirit of its
/// parser (`posix/regcomp.c`): every atom, anchor, bracket or back-reference is a node; a group
/// adds its open/close nodes; each `|` a node; `*` and `?` a node; `+` copies its atom once
/// (`a+` is `aa*`), `{m,n}` copies it `max(m, n)` times (`{m,}` m + 1 times). Counts multiply
/// through nesting, which is what makes `((a{1,255}){1,255}){1,255}` cost 16.8 million. It reads
/// any bytes, valid or not: an invalid pattern is left for `regcomp` to reject, and a `{` that
/// does not start a valid interval counts as a literal. Saturates instead of overflowing.
pub fn expansion(pattern: &[u8]) -> u64 {
    let mut stack = vec![Level::default()];
    let mut i = 0;
    while i < pattern.len() {
        let c = pattern[i];
        i += 1;
        let depth = stack.len();
        let top = stack.last_mut().expect("the outermost level is never popped");
        let atom = match c {
            b'(' => {
                stack.push(Level::default());
                continue;
            }
            b')' if depth > 1 => {
                let inner = stack.pop().expect("checked above");
                let group =
                    2u64.saturating_add(inner.closed).saturating_add(inner.branch.max(1)).saturating_add(inner.bars);
                let top = stack.last_mut().expect("the outermost level is never popped");
                top.branch = top.branch.saturating_add(group);
                top.last = group;
                continue;
            }
            b'|' => {
                top.closed = top.closed.saturating_add(top.branch.max(1));
                top.bars += 1;
                top.branch = 0;
                top.last = 0;
                continue;
            }
            b'*' | b'?' | b'+' if top.last > 0 => {
                let repeated = match c {
                    b'+' => top.last.saturating_mul(2).saturating_add(1),
                    _ => top.last.saturating_add(1),
                };
                requantify(top, repeated);
                continue;
            }
            b'{' if top.last > 0 => match interval(&pattern[i..]) {
                Some((copies, used)) => {
                    i += used;
                    let repeated = top.last.saturating_mul(copies.max(1)).saturating_add(1);
                    requantify(top, repeated);
                    continue;
                }
                None => 1,
            },
            b'[' => {
                i += bracket_len(&pattern[i..]);
                1
            }
            b'\\' => {
                i = (i + 1).min(pattern.len());
                1
            }
            _ => 1,
        };
        top.branch = top.branch.saturating_add(atom);
        top.last = atom;
    }
    // Unclosed groups (invalid, but estimate anyway): fold them outwards.
    while stack.len() > 1 {
        let inner = stack.pop().expect("more than one level");
        let top = stack.last_mut().expect("the outermost level is never popped");
        let unclosed = 1u64.saturating_add(inner.closed).saturating_add(inner.branch).saturating_add(inner.bars);
        top.branch = top.branch.saturating_add(unclosed);
    }
    let top = stack.pop().expect("the outermost level");
    top.closed.saturating_add(top.branch).saturating_add(top.bars)
}

/// Replaces the cost of the last atom of `level` by `repeated`.
fn requantify(level: &mut Level, repeated: u64) {
    level.branch = level.branch.saturating_sub(level.last).saturating_add(repeated);
    level.last = repeated;
}

/// `{m}`, `{m,}`, `{,n}`, `{m,n}` right after the `{`: how many copies glibc makes, and the bytes
/// read (through the `}`). `None` when it is not an interval (glibc then rejects it, or reads the
/// `{` literally).
fn interval(rest: &[u8]) -> Option<(u64, usize)> {
    let end = rest.iter().position(|&b| b == b'}')?;
    let body = &rest[..end];
    let number = |s: &[u8]| -> Option<Option<u64>> {
        if s.is_empty() {
            return Some(None);
        }
        if !s.iter().all(u8::is_ascii_digit) {
            return None;
        }
        // Past glibc's RE_DUP_MAX (32767) regcomp refuses it; saturate well above that.
        Some(Some(s.iter().take(12).fold(0u64, |n, d| n * 10 + u64::from(d - b'0'))))
    };
    let copies = match body.iter().position(|&b| b == b',') {
        None => number(body)??,
        Some(comma) => match (number(&body[..comma])?, number(&body[comma + 1..])?) {
            (Some(m), Some(n)) => m.max(n),
            (Some(m), None) => m.saturating_add(1),
            (None, Some(n)) => n,
            (None, None) => return None,
        },
    };
    Some((copies, end + 1))
}

/// Bytes of a bracket expression after its `[`, through its closing `]` (POSIX: a `]` first or
/// after `^` is literal; `[:…:]`, `[.….]`, `[=…=]` hold any bytes). The rest of the pattern when
/// it never closes.
fn bracket_len(rest: &[u8]) -> usize {
    let mut j = 0;
    if rest.get(j) == Some(&b'^') {
        j += 1;
    }
    if rest.get(j) == Some(&b']') {
        j += 1;
    }
    while j < rest.len() {
        match rest[j] {
            b']' => return j + 1,
            b'[' if matches!(rest.get(j + 1), Some(b':' | b'.' | b'=')) => {
                let kind = rest[j + 1];
                let close = rest[j + 2..].windows(2).position(|w| w[0] == kind && w[1] == b']');
                j = match close {
                    Some(at) => j + 2 + at + 2,
                    None => j + 1,
                };
            }
            _ => j += 1,
        }
    }
    rest.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_repeats_multiply() {
        assert_eq!(expansion(b"a{1,255}"), 256);
        let nested = expansion(b"((a{1,255}){1,255}){1,255}");
        assert!(nested > 16_000_000 && nested < 17_500_000, "{nested}");
        assert_eq!(expansion(b"a{3}{4}"), 4 * 4 + 1);
    }

    #[test]
    fn shipped_patterns_are_cheap() {
        for p in crate::config::DEFAULT_EXCLUDE_COMMANDS {
            let n = expansion(p.as_bytes());
            assert!((20..120).contains(&n), "{p}: {n}");
        }
    }

    #[test]
    fn a_kilobyte_of_literals_passes_the_default_limit() {
        let p = "x".repeat(1024);
        assert_eq!(expansion(p.as_bytes()), 1024);
        assert!(check_static(&[p], &Limits::default()).is_ok());
    }

    #[test]
    fn brackets_and_escapes_are_one_node() {
        assert_eq!(expansion(b"[({*]"), 1);
        assert_eq!(expansion(b"[]{]"), 1);
        assert_eq!(expansion(b"[^]a]"), 1);
        assert_eq!(expansion(b"[[:alpha:]{]"), 1);
        assert_eq!(expansion(b"\\{\\("), 2);
        assert_eq!(expansion(b"[a"), 1, "an unclosed bracket eats the rest");
    }

    #[test]
    fn invalid_intervals_count_as_literals() {
        assert_eq!(expansion(b"a{x}"), 4);
        assert_eq!(expansion(b"a{"), 2);
        assert_eq!(expansion(b"{5}"), 3, "nothing to repeat");
        assert_eq!(expansion(b"a{,}"), 4);
    }

    #[test]
    fn huge_counts_saturate_instead_of_overflowing() {
        let p = "(".repeat(20) + "a{999999999999}" + &")".repeat(20) + &"{999999999999}".repeat(20);
        assert_eq!(expansion(p.as_bytes()), u64::MAX);
        assert!(expansion(b"(((((") > 0);
        assert!(expansion(b")))))") == 5);
    }

    #[test]
    fn static_checks_come_in_order_and_say_how_to_fix() {
        let limits = Limits::default();
        let many: Vec<String> = (0..10_000).map(|i| format!("p{i}")).collect();
        let e = check_static(&many, &limits).unwrap_err();
        assert_eq!(e, PatternSetError::TooMany { count: 10_000, max: 256 });
        assert!(e.to_string().contains("merge patterns with |"), "{e}");

        let long = "é".repeat(600);
        let e = check_static(&["ok".into(), long], &limits).unwrap_err();
        let PatternSetError::TooLong { index: 1, len: 1200, max: 1024, prefix } = &e else { panic!("{e:?}") };
        assert!(prefix.ends_with('…') && prefix.len() <= 64 + 3, "{prefix}");

        let e = check_static(&["a\0b".into()], &limits).unwrap_err();
        assert!(matches!(e, PatternSetError::Nul { index: 0, .. }), "{e:?}");

        let e = check_static(&["((a{1,255}){1,255}){1,255}".into()], &limits).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, PatternSetError::TooCostly { index: 0, .. }), "{e:?}");
        assert!(text.contains("regex nodes") && text.contains("write a{1,255} once"), "{text}");
        assert!(!text.contains('\n'));
        assert_eq!(e.pattern(), Some("((a{1,255}){1,255}){1,255}"));
    }

    #[test]
    fn display_escapes_control_bytes_of_the_pattern() {
        let e = PatternSetError::Invalid { index: 2, pattern: "a\nKILLED".into(), reason: "Unmatched ( or \\(".into() };
        let text = e.to_string();
        assert!(!text.contains('\n'), "{text}");
        assert!(text.contains("\"a\\nKILLED\""), "{text}");
    }
}
