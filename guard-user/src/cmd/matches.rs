//! `guard-user match --pattern P [--cmdline TEXT]…` (docs/operations.md), through the same bounded,
//! sandboxed matcher the daemon uses, so it answers what the daemon would — including `budget`
//! where the match cannot finish within its bounds — and never hangs on a pattern.
use std::{
    io::{Read, Write},
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant},
};

use super::MatchArgs;
use crate::{
    pattern::{habits, Limits, MatchOutcome, Matcher, PatternSetError},
    procfs,
};

/// The whole command is bounded by this, however many processes and whatever the pattern.
const OVERALL: Duration = Duration::from_secs(60);

pub fn main(args: MatchArgs) -> anyhow::Result<ExitCode> {
    let limits = Limits::default();
    let mut matcher = Matcher::new(PathBuf::from("/proc/self/exe"), limits.clone());
    if let Err(e) = matcher.set_patterns(std::slice::from_ref(&args.pattern)) {
        eprintln!("guard-user match: {}", refused(&args.pattern, &e));
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
    let word = |o: MatchOutcome| match o {
        MatchOutcome::Matched(_) => "match",
        MatchOutcome::NoMatch => "other",
        MatchOutcome::Budget => "budget",
    };
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
    procs.sort_by_key(|p| p.id.pid);
    let listed: Vec<(u32, Vec<u8>)> = procs
        .iter()
        .filter(|p| p.id.pid != std::process::id())
        .filter_map(|p| Some((p.id.pid, read_cmdline(p.id.pid, limits.max_text_bytes)?)))
        .collect();
    let texts: Vec<&[u8]> = listed.iter().map(|(_, c)| c.as_slice()).collect();
    let outcomes = matcher.classify(&texts, deadline);
    for ((pid, cmdline), outcome) in listed.iter().zip(outcomes) {
        writeln!(out, "{} {pid} {}", word(outcome), escape(cmdline))?;
    }
    Ok(ExitCode::SUCCESS)
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

/// `/proc/PID/cmdline` as the daemon matches it (arguments joined by single spaces, no trailing
/// one), read up to `max + 1` bytes: a longer one is `budget` anyway, and a process cannot make
/// this command hold megabytes per line.
fn read_cmdline(pid: u32, max: usize) -> Option<Vec<u8>> {
    let file = std::fs::File::open(format!("/proc/{pid}/cmdline")).ok()?;
    let mut raw = Vec::new();
    file.take(max as u64 + 2).read_to_end(&mut raw).ok()?;
    if raw.last() == Some(&0) {
        raw.pop();
    }
    for b in &mut raw {
        if *b == 0 {
            *b = b' ';
        }
    }
    Some(raw)
}

/// A command line as one line of output: printable UTF-8 as is; control characters (C0, DEL,
/// C1), line and paragraph separators, bidirectional overrides and bytes that are not UTF-8 as
/// `\n`, `\t`, `\r`, `\xNN` or `\u{NNNN}`; a backslash doubled, so the escaping is unambiguous.
/// (A local helper; the shared escaping of log values lives with the log writer.)
fn escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                c if (c as u32) < 0x20 || c == '\u{7f}' => out.push_str(&format!("\\x{:02x}", c as u32)),
                c if c.is_control()
                    || matches!(c, '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}')
                    || ('\u{202a}'..='\u{202e}').contains(&c)
                    || ('\u{2066}'..='\u{2069}').contains(&c) =>
                {
                    out.push_str(&format!("\\u{{{:04x}}}", c as u32))
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn a_forged_line_stays_on_one_line() {
        assert_eq!(
            escape(b"sleep 1\nmatch 1 /usr/bin/agentihooks swarm tick"),
            "sleep 1\\nmatch 1 /usr/bin/agentihooks swarm tick"
        );
        assert_eq!(escape(b"a\rb\tc\x1b[2Jd\x7f"), "a\\rb\\tc\\x1b[2Jd\\x7f");
        assert_eq!(escape(b"back\\slash"), "back\\\\slash");
    }

    #[test]
    fn utf8_is_kept_and_everything_else_is_visible() {
        assert_eq!(escape("café ünï".as_bytes()), "café ünï");
        assert_eq!(escape(b"q\xff\xfe"), "q\\xff\\xfe");
        assert_eq!(escape("a\u{2028}b\u{202e}c\u{85}".as_bytes()), "a\\u{2028}b\\u{202e}c\\u{0085}");
        assert!(!escape(&(0u8..=255).collect::<Vec<_>>()).contains(['\n', '\r', '\u{85}']));
    }
}
