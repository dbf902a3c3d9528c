//! `guard-user match --pattern P [--cmdline TEXT]…` (docs/operations.md), through the same bounded,
//! sandboxed matcher the daemon uses, so it answers what the daemon would — including `budget`
//! where the match cannot finish within its bounds — and never hangs on a pattern.
//!
//! Without `--cmdline`, the account's command lines are read as the daemon reads them (one
//! buffer, a pool of 4 MiB for what waits for the matcher, each distinct text matched once) and
//! each line shows at most the first 4 KiB of one, escaped, and how many bytes were left out.
use std::{
    collections::HashMap,
    hash::{BuildHasher, RandomState},
    io::Write,
    path::PathBuf,
    process::ExitCode,
    sync::Arc,
    time::{Duration, Instant},
};

use super::MatchArgs;
use crate::{
    budget::{Held, Pool, HELD_CMDLINE_BYTES},
    daemon::{
        cmdlines::{CmdlineReader, Read},
        effects::Procfs,
    },
    escape::ShownCmdline,
    pattern::{habits, match_all, Limits, MatchOutcome, Matcher, PatternSetError},
    procfs,
};

/// The whole command is bounded by this, however many processes and whatever the pattern.
const OVERALL: Duration = Duration::from_secs(60);

fn word(o: MatchOutcome) -> &'static str {
    match o {
        MatchOutcome::Matched(_) => "match",
        MatchOutcome::NoMatch => "other",
        MatchOutcome::Budget => "budget",
    }
}

pub fn main(args: MatchArgs) -> anyhow::Result<ExitCode> {
    let limits = Limits::default();
    let mut matcher = Matcher::new(PathBuf::from("/proc/self/exe"), limits.clone());
    // With --roots the pattern is tried as one of `sessions.roots`: its errors are named so, as
    // validate and the daemon name them.
    let list = if args.roots { "sessions.roots: " } else { "" };
    if let Err(e) = matcher.set_patterns(std::slice::from_ref(&args.pattern)) {
        eprintln!("guard-user match: {list}{}", refused(&args.pattern, &e));
        return Ok(ExitCode::from(2));
    }
    let habits = habits::habits(&args.pattern);
    if !habits.is_empty() {
        // Valid, and answered as bash reads it; said first, since it may not be what was meant.
        eprintln!(
            "guard-user match: note: --pattern is written in another regex dialect: {}",
            habits::describe(&habits)
        );
    }
    let deadline = Instant::now() + OVERALL;
    if args.roots {
        let probes = matcher.classify(match_all::PROBES, deadline);
        if match_all::too_broad_for_roots(&probes) {
            // The daemon's and validate's words for it, about --pattern.
            let p = crate::config::too_broad_root(Some(0), &args.pattern);
            eprintln!("guard-user match: {list}--pattern {}; {}", p.what, p.fix);
            return Ok(ExitCode::from(2));
        }
    }
    let mut out = std::io::stdout().lock();
    if !args.cmdline.is_empty() {
        let texts: Vec<&[u8]> = args.cmdline.iter().map(|t| t.as_bytes()).collect();
        for outcome in matcher.classify(&texts, deadline) {
            writeln!(out, "{}", word(outcome))?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let (account, _, _) = super::account(&args.account, "match", crate::account::Purpose::ShowsCommandLines)?;
    let mut procs: Vec<_> = procfs::snapshot()?.into_iter().filter(|p| p.euid == account.uid).collect();
    procs.retain(|p| p.id.pid != std::process::id());
    procs.sort_by_key(|p| p.id.pid);
    let mut source = Procfs::default();
    let mut reader = CmdlineReader::new(&mut source, Pool::new(HELD_CMDLINE_BYTES), deadline, OVERALL / 4);
    let mut pending = Pending::default();
    for p in &procs {
        let row = match reader.read(p.id.pid, limits.max_text_bytes) {
            Read::Gone => continue,
            // Not read within its share of the time: the daemon would protect it too.
            Read::Deferred(_) => Row { pid: p.id.pid, shown: Arc::default(), text: None },
            Read::Text => {
                let text = reader.text();
                let index = match pending.find(text) {
                    Some(i) => i,
                    None => {
                        if !reader.fits(text.len()) {
                            pending.flush(&mut matcher, deadline, &mut out)?;
                        }
                        let held = reader.hold(text).expect("a text of at most 1 MiB fits an empty pool");
                        pending.add(held)
                    }
                };
                // Rows of one text share its shown form: 4 KiB per distinct text, not per process.
                Row { pid: p.id.pid, shown: Arc::clone(&pending.shown[index]), text: Some(index) }
            }
        };
        pending.rows.push(row);
    }
    pending.flush(&mut matcher, deadline, &mut out)?;
    Ok(ExitCode::SUCCESS)
}

/// One output line waiting for its text's verdict.
struct Row {
    pid: u32,
    shown: Arc<ShownCmdline>,
    /// Its text in [`Pending::texts`]; `None` when it was not read in time (`budget`).
    text: Option<usize>,
}

/// Rows in pid order and the distinct texts they need, matched together when the pool is full.
#[derive(Default)]
struct Pending {
    rows: Vec<Row>,
    texts: Vec<Held>,
    /// Each text's shown form (its first 4 KiB, escaped), shared by its rows.
    shown: Vec<Arc<ShownCmdline>>,
    /// Texts by length and hash (a match is confirmed byte for byte).
    by_hash: HashMap<(usize, u64), Vec<usize>>,
    hasher: RandomState,
}

impl Pending {
    fn key(&self, text: &[u8]) -> (usize, u64) {
        (text.len(), self.hasher.hash_one(text))
    }

    fn find(&self, text: &[u8]) -> Option<usize> {
        self.by_hash.get(&self.key(text))?.iter().copied().find(|&i| *self.texts[i] == *text)
    }

    fn add(&mut self, held: Held) -> usize {
        let i = self.texts.len();
        self.by_hash.entry(self.key(&held)).or_default().push(i);
        self.shown.push(Arc::new(ShownCmdline::of(&held)));
        self.texts.push(held);
        i
    }

    /// Matches the texts, prints the rows in order, forgets both.
    fn flush(&mut self, matcher: &mut Matcher, deadline: Instant, out: &mut impl Write) -> std::io::Result<()> {
        let texts: Vec<&[u8]> = self.texts.iter().map(|t| &**t).collect();
        let outcomes = if texts.is_empty() { Vec::new() } else { matcher.classify(&texts, deadline) };
        for r in self.rows.drain(..) {
            let outcome = r.text.and_then(|i| outcomes.get(i).copied()).unwrap_or(MatchOutcome::Budget);
            writeln!(out, "{} {} {}", word(outcome), r.pid, r.shown)?;
        }
        self.texts.clear();
        self.shown.clear();
        self.by_hash.clear();
        Ok(())
    }
}

/// Why `--pattern` was refused, about the pattern itself (the list the error type speaks of is
/// the config's, which `match` does not read), with what bash has instead of another dialect's
/// syntax.
fn refused(pattern: &str, e: &PatternSetError) -> String {
    let shown = crate::escape::text_capped(pattern.as_bytes(), 200);
    let hint = || {
        let h = habits::habits(pattern);
        if h.is_empty() {
            String::new()
        } else {
            format!("; {}", habits::describe(&h))
        }
    };
    match e {
        PatternSetError::Invalid { reason, .. } => {
            format!("--pattern \"{shown}\" is not a valid bash extended regex: {reason}{}", hint())
        }
        PatternSetError::TooCostly { why, .. } => format!("--pattern \"{shown}\" is too costly to match safely: {why}"),
        PatternSetError::TooLong { len, max, .. } => {
            format!("--pattern is {len} bytes long, more than {max}; match a distinctive part of the command line")
        }
        PatternSetError::Nul { .. } => "--pattern contains a NUL byte, which bash cannot hold".to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Pool;

    /// A matcher-free check of what a line shows: the first 4 KiB escaped, and the bytes left out.
    #[test]
    fn a_forged_or_huge_command_line_stays_one_short_line() {
        let pool = Pool::new(64);
        let mut p = Pending::default();
        let held = pool.hold(b"sleep 1\nmatch 1 x").unwrap();
        let i = p.add(held);
        assert_eq!(p.find(b"sleep 1\nmatch 1 x"), Some(i));
        assert_eq!(p.find(b"sleep 1"), None);
        let huge = [b"a\n".repeat(1 << 19), b"b".to_vec()].concat();
        let line = format!("other 7 {}", ShownCmdline::of(&huge));
        assert_eq!(line.lines().count(), 1);
        assert!(line.len() < 8300 && line.ends_with(&format!("…[+{} bytes]", huge.len() - 4096)), "{}", line.len());
    }
}
