//! Problems of a pattern (`excludeCommands[i]`, `sessions.roots[i]`): refused by the matcher
//! (invalid, too costly), or valid but written in another dialect's syntax that bash reads
//! another way ([`crate::pattern::habits`]).
use super::{prefix, ConfigError, PatternList, Problem, FIX_INVALID_PATTERN};
use crate::{escape, pattern::PatternSetError};

impl Problem {
    /// A pattern the sandboxed matcher refused, logged as `config_malformed excludeCommands
    /// pattern=<p> index=<i>` with the matcher's reason (`validate` compiles each one alone, so it says
    /// which `index` that was).
    pub fn refused_pattern(index: usize, pattern: &str, e: &PatternSetError) -> Problem {
        refused_problem(PatternList::ExcludeCommands, Some(index), pattern, e)
    }

    /// [`Problem::refused_pattern`] for a pattern of `sessions.roots`.
    pub fn refused_root(index: usize, pattern: &str, e: &PatternSetError) -> Problem {
        refused_problem(PatternList::SessionsRoots, Some(index), pattern, e)
    }

    /// A problem only `validate` reports: the daemon uses the document as it is (e.g. a pattern
    /// that matches every command line, docs/configuration.md), so there is no `ERROR` line.
    pub fn validate_only(key: String, what: String, fix: String) -> Problem {
        Problem { key, what, fix, warning: false, error: None }
    }
}

fn refused_problem(list: PatternList, index: Option<usize>, pattern: &str, e: &PatternSetError) -> Problem {
    match e {
        PatternSetError::Invalid { reason, .. } => pattern_problem(list, index, pattern, reason),
        PatternSetError::TooCostly { why, .. } => {
            pattern_problem(list, index, pattern, &format!("too costly to match safely ({why})"))
        }
        PatternSetError::Worker(_) => pattern_problem(list, index, pattern, &format!("could not be checked: {e}")),
        other => pattern_problem(list, index, pattern, &other.in_list(list.source()).to_string()),
    }
}

/// `list` is the key the patterns are under: `excludeCommands` or `sessions.roots`.
pub(super) fn pattern_problem(list: PatternList, index: Option<usize>, pattern: &str, reason: &str) -> Problem {
    let key = index.map_or_else(|| list.key().to_string(), |i| format!("{}[{i}]", list.key()));
    let mut what = format!(
        "\"{}\" is not a valid bash extended regex ({})",
        escape::text_capped(pattern.as_bytes(), 60),
        // The matcher's own fixed text: nothing of the account's to escape.
        reason.chars().filter(|c| !c.is_control()).collect::<String>()
    );
    // `(?i)` and the like: say it is another dialect's syntax, and what bash has instead.
    let habits = crate::pattern::habits::habits(pattern);
    if !habits.is_empty() {
        what.push_str(": ");
        what.push_str(&crate::pattern::habits::describe(&habits[..habits.len().min(3)]));
    }
    let fix = FIX_INVALID_PATTERN;
    let error = ConfigError::Pattern { list, pattern: prefix(pattern), index, why: what.clone(), fix };
    Problem { key, what, fix: fix.into(), warning: false, error: Some(error) }
}

/// The config error of an in-process compile of `excludeCommands` (tests compare with it).
#[cfg(test)]
pub(in crate::config) fn pattern_error(
    list: PatternList,
    index: Option<usize>,
    pattern: &str,
    reason: &str,
) -> ConfigError {
    pattern_problem(list, index, pattern, reason).error.expect("a pattern problem is an error")
}

/// The config error of a pattern list the daemon's sandboxed matcher refused: the problem,
/// reason and fix `validate` gives for that pattern, so the log, status, heartbeat and `check`
/// never word it another way.
pub fn refused_patterns(patterns: &[String], e: &PatternSetError) -> ConfigError {
    refused_patterns_of(PatternList::ExcludeCommands, patterns, e)
}

/// [`refused_patterns`] for the list under `list` (`sessions.roots`).
pub fn refused_patterns_of(list: PatternList, patterns: &[String], e: &PatternSetError) -> ConfigError {
    let index = e.index();
    let pattern = index.and_then(|i| patterns.get(i)).map(String::as_str).or(e.pattern()).unwrap_or_default();
    refused_problem(list, index, pattern, e).error.expect("a pattern problem is an error")
}

impl Problem {
    /// A valid pattern with syntax of another dialect (`\d`, `+?`, `[\w]`): `validate` reports
    /// it (an error where bash matches other command lines than that dialect would, a warning
    /// where it matches the same ones another way); the daemon honours the pattern as bash
    /// reads it, so there is no `ERROR` line.
    pub fn habits(list: PatternList, index: usize, pattern: &str) -> Option<Problem> {
        let habits = crate::pattern::habits::habits(pattern);
        if habits.is_empty() {
            return None;
        }
        let what = format!(
            "\"{}\" is written in another regex dialect: {}",
            escape::text_capped(pattern.as_bytes(), 60),
            crate::pattern::habits::describe(&habits[..habits.len().min(3)])
        );
        let fix = "write it as bash reads it, and try it with guard-user match --pattern".to_string();
        let warning = !habits.iter().any(|h| h.changes_matches);
        Some(Problem { key: format!("{}[{index}]", list.key()), what, fix, warning, error: None })
    }
}
