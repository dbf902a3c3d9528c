//! `excludeCommands` patterns with exactly the meaning bash gives `[[ $cmdline =~ $pattern ]]`.
//!
//! SPEC §3 defines a pattern by what bash does with it, so this module does what bash does
//! (`sh_regmatch` in bash's `lib/sh/shmatch.c`, checked against bash 5.2 by
//! `tests/pattern_oracle.rs`):
//!
//! - compile with glibc's `regcomp(REG_EXTENDED)` — no `REG_NOSUB`, because a bash built with
//!   arrays always fills `BASH_REMATCH`, and no `REG_ICASE` (bash adds it only under
//!   `shopt -s nocasematch`, which a config cannot ask for);
//! - match with `regexec(…, re_nsub + 1, pmatch, 0)`. The number of match slots is not cosmetic:
//!   asked for more than one, glibc also checks that sub-matches can be placed
//!   (`prune_impossible_nodes`), and the two paths disagree on some patterns — glibc 2.36 says
//!   `a|(^a*|b){,2}.+` does not match `ab` when given bash's two slots, and does with one. So
//!   this passes what bash passes, quirks included; the oracle test holds such cases.
//! - a pattern bash cannot hold (one with a NUL) or that `regcomp` rejects is invalid, as
//!   `[[ =~ ]]` returning 2 is.
//!
//! An unquoted `$pattern` reaches `regcomp` unchanged: bash's quoting for `=~` only
//! backslash-escapes characters that were *quoted* in the word, and nothing in a variable's
//! value is. The same holds for the text: `$cmdline` on the left is compared byte for byte.
//!
//! What glibc's ERE means, worth knowing when writing a pattern (all pinned by the oracle):
//! a backslash inside brackets is literal (`[\]` matches a backslash); `\<`, `\>`, `\b`, `\w` are
//! GNU word operators; back-references are one digit (`\10` is `\1` then `0`); `{,m}` means
//! `{0,m}`; a leading `*`, `a{1` or `a{2,1}` are invalid; `a||b` and `()` are valid and match
//! the empty string, so they match every command line.
//!
//! # Locale
//! `regcomp` reads `LC_CTYPE` and `LC_COLLATE`. The daemon never calls `setlocale`, so it runs
//! in the C locale whatever the environment says: every byte is one character (UTF-8 text is
//! matched byte by byte, so `[é]` is a set of two bytes and `.` matches one byte of a multibyte
//! character), ranges like `[a-z]` are byte ranges, and `[[:alpha:]]` is ASCII only. The oracle
//! test runs bash with `LC_ALL=C` to compare like with like.
//!
//! # Text with a NUL
//! A command line is NUL-separated arguments joined by spaces, so it has no NUL, and bash could
//! not hold one anyway. Should a caller pass one, it is not a terminator: the whole slice is
//! matched (through `REG_STARTEND`) and the NUL is an ordinary byte that only bracket negations
//! like `[^a]` match (`.` never matches NUL under POSIX syntax). A pattern therefore cannot match
//! a prefix that a hidden NUL cut off.
use std::ffi::{c_char, c_int, CString};
use std::fmt;

/// Why a configured pattern cannot be used.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum PatternError {
    /// `regcomp` rejected the pattern; `reason` is `regerror`'s text.
    #[error("invalid pattern `{pattern}`: {reason}")]
    Invalid { pattern: String, reason: String },
    /// The pattern has a NUL byte, which no bash variable (and no C string) can hold.
    #[error("invalid pattern {pattern:?}: it contains a NUL byte, which bash cannot hold")]
    Nul { pattern: String },
}

/// One compiled `excludeCommands` pattern.
pub struct Pattern {
    /// The pattern as configured; `Clone` recompiles it and `Debug`/logs show it.
    source: String,
    /// The compiled regex. Boxed so its address never changes between `regcomp` and `regfree`,
    /// whatever happens to the `Pattern` (glibc does not promise a `regex_t` may move).
    regex: Box<libc::regex_t>,
    /// Match slots handed to `regexec`: one more than the number of `(` in the source, which is
    /// at least `re_nsub + 1`. glibc clamps any surplus to exactly `re_nsub + 1`, the number bash
    /// passes, and the libc crate keeps `re_nsub` private, so this bound stands in for it.
    slots: usize,
}

// SAFETY: a compiled `regex_t` is heap data owned by this value alone, with no tie to the thread
// that compiled it, so it may be used and `regfree`d on any thread (`Send`). `regexec` takes the
// regex by `const` pointer and POSIX requires it to be thread-safe; glibc serialises the one
// piece of state it updates while matching (the DFA state cache) behind the regex's own lock
// (`lock_lock (dfa->lock)` in `regexec`), so concurrent `is_match` calls through `&Pattern` are
// sound (`Sync`). Nothing else ever touches the regex through a shared reference.
unsafe impl Send for Pattern {}
unsafe impl Sync for Pattern {}

impl Pattern {
    /// Compiles `pattern` as bash's `[[ =~ ]]` does (`REG_EXTENDED`, C locale).
    pub fn new(pattern: &str) -> Result<Pattern, PatternError> {
        let c_pattern = CString::new(pattern).map_err(|_| PatternError::Nul {
            pattern: pattern.to_owned(),
        })?;
        // SAFETY: `regex_t` is plain C data for which all-zero is a valid "not compiled" value
        // (bash initialises it the same way); `regcomp` overwrites it.
        let mut regex: Box<libc::regex_t> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: `regex` points to writable memory for one `regex_t`, `c_pattern` is
        // NUL-terminated and outlives the call.
        let code = unsafe { libc::regcomp(&mut *regex, c_pattern.as_ptr(), libc::REG_EXTENDED) };
        if code != 0 {
            // On failure glibc has already freed whatever it allocated, so no `regfree`
            // (which POSIX leaves undefined after a failed `regcomp`).
            return Err(PatternError::Invalid {
                pattern: pattern.to_owned(),
                reason: error_text(code, &regex),
            });
        }
        let slots = pattern.bytes().filter(|&b| b == b'(').count() + 1;
        Ok(Pattern {
            source: pattern.to_owned(),
            regex,
            slots,
        })
    }

    /// Whether `[[ $text =~ $pattern ]]` would succeed. `text` may be any bytes, of any length
    /// (see the module doc for a NUL inside it).
    pub fn is_match(&self, text: &[u8]) -> bool {
        let Ok(end) = libc::regoff_t::try_from(text.len()) else {
            // `REG_STARTEND` bounds are `int` in glibc. Linux caps an exec's arguments at
            // 6 MiB, so a command line never gets here; a caller's giant text is matched up to
            // its first NUL the ordinary C way.
            let upto_nul = text.split(|&b| b == 0).next().unwrap_or_default();
            let c_text = CString::new(upto_nul).expect("split at the first NUL");
            return self.exec(c_text.as_ptr(), None);
        };
        self.exec(text.as_ptr().cast::<c_char>(), Some(end))
    }

    /// Runs `regexec` on `text`, bounded by `end` (`REG_STARTEND`) or else by its NUL.
    fn exec(&self, text: *const c_char, end: Option<libc::regoff_t>) -> bool {
        const UNSET: libc::regmatch_t = libc::regmatch_t {
            rm_so: -1,
            rm_eo: -1,
        };
        let mut on_stack = [UNSET; 8];
        let mut on_heap = Vec::new();
        let slots: &mut [libc::regmatch_t] = if self.slots <= on_stack.len() {
            &mut on_stack[..self.slots]
        } else {
            on_heap.resize(self.slots, UNSET);
            &mut on_heap
        };
        let flags: c_int = match end {
            Some(end) => {
                slots[0] = libc::regmatch_t {
                    rm_so: 0,
                    rm_eo: end,
                };
                libc::REG_STARTEND
            }
            None => 0,
        };
        // SAFETY: the regex compiled successfully and lives as long as `self`; `text` is valid
        // for `end` bytes (or up to its NUL when `end` is `None`); `slots` has `slots.len()`
        // writable entries; `regexec` does not retain any pointer after returning.
        let code =
            unsafe { libc::regexec(&*self.regex, text, slots.len(), slots.as_mut_ptr(), flags) };
        // Anything but a match (REG_NOMATCH, or REG_ESPACE when glibc runs out of memory on a
        // pathological back-reference) is "no match", as bash's `if (regexec (...))` treats it.
        code == 0
    }

    /// The pattern as configured.
    pub fn as_str(&self) -> &str {
        &self.source
    }
}

/// `regerror`'s message for `code`.
fn error_text(code: c_int, regex: &libc::regex_t) -> String {
    // SAFETY: a NULL buffer of size 0 asks only for the needed size (NUL included).
    let needed = unsafe { libc::regerror(code, regex, std::ptr::null_mut(), 0) };
    let mut buf = vec![0u8; needed.max(1)];
    // SAFETY: `buf` has `buf.len()` writable bytes; `regerror` NUL-terminates within them.
    unsafe { libc::regerror(code, regex, buf.as_mut_ptr().cast::<c_char>(), buf.len()) };
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

impl Drop for Pattern {
    fn drop(&mut self) {
        // SAFETY: `regex` was compiled successfully by `new` and is freed exactly once, here.
        unsafe { libc::regfree(&mut *self.regex) };
    }
}

impl Clone for Pattern {
    fn clone(&self) -> Pattern {
        Pattern::new(&self.source).expect("a pattern that compiled once compiles again")
    }
}

impl fmt::Debug for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Pattern").field(&self.source).finish()
    }
}

/// Two patterns are equal when their sources are: the same source always has the same meaning.
impl PartialEq for Pattern {
    fn eq(&self, other: &Pattern) -> bool {
        self.source == other.source
    }
}

impl Eq for Pattern {}

#[cfg(test)]
mod tests {
    use super::*;

    const SHIPPED: [&str; 4] = [
        "(^|[ /])agentihooks swarm tick( |$)",
        " -m scripts[.]swarm[.]scheduled_tick( |$)",
        "(^|[ /])agentihooks select-profile( |$)",
        "(^|[ /])agentihooks swarm (tick-watch|prober|waker)( |$)",
    ];

    fn matches(pattern: &str, text: &str) -> bool {
        Pattern::new(pattern).unwrap().is_match(text.as_bytes())
    }

    #[test]
    fn shipped_patterns_protect_the_swarm_helpers() {
        assert!(matches(SHIPPED[0], "/usr/bin/agentihooks swarm tick"));
        assert!(matches(SHIPPED[0], "node /x/agentihooks swarm tick --once"));
        assert!(matches(
            SHIPPED[1],
            "python3 -m scripts.swarm.scheduled_tick"
        ));
        assert!(matches(
            SHIPPED[2],
            "node /x/agentihooks select-profile foo"
        ));
        assert!(matches(SHIPPED[3], "agentihooks swarm prober"));
        assert!(matches(
            SHIPPED[3],
            "/opt/agentihooks swarm tick-watch --all"
        ));
    }

    #[test]
    fn shipped_patterns_do_not_protect_lookalikes() {
        assert!(!matches(SHIPPED[0], "/usr/bin/agentihooks swarm ticker"));
        assert!(!matches(SHIPPED[0], "myagentihooks swarm tick"));
        assert!(!matches(
            SHIPPED[1],
            "python3 -m scripts_swarm.scheduled_tick"
        ));
        assert!(!matches(
            SHIPPED[1],
            "python3 -m scripts.swarm.scheduled_tick2"
        ));
        assert!(!matches(SHIPPED[2], "agentihooks select-profiles"));
        assert!(!matches(SHIPPED[3], "agentihooks swarm wakers"));
    }

    #[test]
    fn invalid_pattern_reports_regerror_text() {
        let err = Pattern::new("(unclosed").unwrap_err();
        let PatternError::Invalid { pattern, reason } = &err else {
            panic!("expected Invalid, got {err:?}");
        };
        assert_eq!(pattern, "(unclosed");
        assert_eq!(reason, "Unmatched ( or \\(");
        assert_eq!(
            err.to_string(),
            "invalid pattern `(unclosed`: Unmatched ( or \\("
        );
        assert!(matches!(
            Pattern::new("a{2,1}"),
            Err(PatternError::Invalid { .. })
        ));
        assert!(matches!(
            Pattern::new("[[:nope:]]"),
            Err(PatternError::Invalid { .. })
        ));
    }

    #[test]
    fn pattern_with_nul_is_rejected() {
        let err = Pattern::new("a\0b").unwrap_err();
        assert_eq!(
            err,
            PatternError::Nul {
                pattern: "a\0b".into()
            }
        );
        assert!(err.to_string().contains("NUL"), "{err}");
    }

    #[test]
    fn non_utf8_text_is_matched_byte_by_byte() {
        let p = Pattern::new("^caf.{2}$").unwrap();
        assert!(
            p.is_match("café".as_bytes()),
            "é is two bytes in the C locale"
        );
        assert!(Pattern::new("x[^a]y").unwrap().is_match(b"x\xffy"));
        assert!(
            Pattern::new("^[\u{e9}]$").unwrap().is_match(b"\xa9"),
            "[é] is a set of bytes"
        );
        assert!(!Pattern::new("^[[:alpha:]]$").unwrap().is_match(b"\xe9"));
    }

    #[test]
    fn embedded_nul_is_an_ordinary_byte_not_a_terminator() {
        assert!(!Pattern::new("a$").unwrap().is_match(b"a\0b"));
        assert!(Pattern::new("b$").unwrap().is_match(b"a\0b"));
        assert!(!Pattern::new("a.b").unwrap().is_match(b"a\0b"));
        assert!(Pattern::new("a[^x]b").unwrap().is_match(b"a\0b"));
    }

    #[test]
    fn back_references_have_one_digit() {
        let p = Pattern::new("(a|ab)(c|bcd)(d*)\\3$").unwrap();
        assert!(p.is_match(b"abcd"));
        assert!(Pattern::new("^(.)\\1$").unwrap().is_match(b"zz"));
        assert!(!Pattern::new("^(.)\\1$").unwrap().is_match(b"zy"));
        // `\10` is `\1` then `0`; ten groups also take the heap path for match slots.
        let many = Pattern::new("((((((((((x))))))))))\\10").unwrap();
        assert!(many.is_match(b"xx0"));
        assert!(!many.is_match(b"xx"));
    }

    #[test]
    fn long_text_matches_at_its_end() {
        let mut text = vec![b'x'; 1 << 20];
        text.extend_from_slice(b" agentihooks swarm tick");
        assert!(Pattern::new(SHIPPED[0]).unwrap().is_match(&text));
    }

    #[test]
    fn clone_debug_and_as_str_keep_the_source() {
        let p = Pattern::new(SHIPPED[1]).unwrap();
        let q = p.clone();
        assert_eq!(q.as_str(), SHIPPED[1]);
        assert_eq!(p, q);
        assert!(q.is_match(b"python3 -m scripts.swarm.scheduled_tick"));
        assert_eq!(format!("{p:?}"), format!("Pattern({:?})", SHIPPED[1]));
    }

    #[test]
    fn pattern_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Pattern>();
        let p = std::sync::Arc::new(Pattern::new("(a|b)+c").unwrap());
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let p = p.clone();
                std::thread::spawn(move || {
                    (0..2000).all(|_| p.is_match(b"ababc") && !p.is_match(b"abab"))
                })
            })
            .collect();
        assert!(handles.into_iter().all(|h| h.join().unwrap()));
    }
}
