//! Which command lines need the matcher at all (docs/architecture.md, the trust boundary).
//!
//! The tick and `explain` read a command line, then ask [`route`] whether its verdict is already
//! known; only [`Route::Ask`] goes to the sandboxed matcher. Pure: the reading, the cache and
//! the matcher are the caller's (`daemon::verdicts`).
use super::CmdVerdict;

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

    const MAX: usize = 1 << 20;

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
