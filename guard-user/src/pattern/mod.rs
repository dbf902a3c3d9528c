//! `excludeCommands` patterns with exactly the meaning bash gives `[[ $cmdline =~ $pattern ]]`,
//! matched so that the account that writes them cannot crash, hang or bloat the root daemon.
//!
//! # Layout
//! - [`Pattern`] (this file): the raw in-process glibc wrapper, bash's exact semantics. It has
//!   no bounds at all: `(a*)*\1` on a long text runs for minutes and takes gigabytes, `()(\1\1)+`
//!   overflows any stack, `((a{1,255}){1,255}){1,255}` takes seconds and gigabytes to compile.
//!   Only the worker process and the oracle tests use it; the daemon never does.
//! - [`habits`]: syntax of other regex dialects (`\d`, `[\w]`, `+?`, `(?i)`) that bash reads
//!   another way, with what it reads and what to write; `validate` and `match` report them.
//! - [`limits`]: [`Limits`] (every bound, with why it has its value) and [`check_static`], the
//!   checks that need no process (count, length, NUL, a static cost estimate). Config validation
//!   calls it.
//! - [`matcher`]: [`Matcher`], the parent side. It owns a worker child process that holds the
//!   compiled set; the daemon asks it which pattern each command line matches, with deadlines.
//! - `worker` and `sandbox`: the child side (`guard-user __pattern-worker`): hardening (identity,
//!   rlimits, seccomp), then a loop compiling and matching what the parent sends.
//! - `protocol`: the length-prefixed frames between the two; `page`: the shared progress page
//!   that tells the parent which text and pattern a killed worker was running.
//!
//! # Semantics
//! docs/configuration.md defines a pattern by what bash does with it, so this module does what bash does
//! (`sh_regmatch` in bash's `lib/sh/shmatch.c`, checked against bash 5.2 by
//! `tests/pattern_oracle.rs`, directly and through the bounded [`Matcher`]):
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

mod child;
pub mod habits;
pub mod limits;
pub mod match_all;
pub mod matcher;
mod page;
mod protocol;
mod round;
mod sandbox;
pub mod worker;

pub use limits::{check_static, Limits, PatternSetError, Source};
pub use matcher::{MatchOutcome, Matcher, Progress, Resume};
#[cfg(any(test, feature = "testing"))]
pub use {limits::CostReason, matcher::ProbeOutcome};

/// Why a configured pattern cannot be used.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum PatternError {
    /// `regcomp` rejected the pattern; `reason` is `regerror`'s text.
    #[error("invalid pattern `{pattern}`: {reason}")]
    Invalid { pattern: String, reason: String },
    /// The pattern has a NUL byte, which no bash variable (and no C string) can hold.
    #[error("invalid pattern {pattern:?}: it contains a NUL byte, which bash cannot hold")]
    Nul { pattern: String },
    /// glibc ran out of memory compiling it (`REG_ESPACE`, or an allocation failed on the way):
    /// under the worker's memory limit this is "too costly", not a verdict on the pattern.
    #[error("pattern `{pattern}` needs more memory to compile than it may use")]
    OutOfMemory { pattern: String },
}

/// `regexec` could not decide: glibc ran out of memory on the way (see [`Pattern::try_match`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Undecided;

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
        let c_pattern = CString::new(pattern).map_err(|_| PatternError::Nul { pattern: pattern.to_owned() })?;
        // SAFETY: `regex_t` is plain C data for which all-zero is a valid "not compiled" value
        // (bash initialises it the same way); `regcomp` overwrites it.
        let mut regex: Box<libc::regex_t> = Box::new(unsafe { std::mem::zeroed() });
        set_errno(0);
        // SAFETY: `regex` points to writable memory for one `regex_t`, `c_pattern` is
        // NUL-terminated and outlives the call.
        let code = unsafe { libc::regcomp(&mut *regex, c_pattern.as_ptr(), libc::REG_EXTENDED) };
        let out_of_memory = errno() == libc::ENOMEM;
        if code == libc::REG_ESPACE || (code == 0 && out_of_memory) {
            if code == 0 {
                // SAFETY: compiled successfully (perhaps without an optimisation glibc could not
                // allocate), so it is freed exactly once, here.
                unsafe { libc::regfree(&mut *regex) };
            }
            return Err(PatternError::OutOfMemory { pattern: pattern.to_owned() });
        }
        if code != 0 {
            // On failure glibc has already freed whatever it allocated, so no `regfree`
            // (which POSIX leaves undefined after a failed `regcomp`).
            return Err(PatternError::Invalid { pattern: pattern.to_owned(), reason: error_text(code, &regex) });
        }
        let slots = pattern.bytes().filter(|&b| b == b'(').count() + 1;
        Ok(Pattern { source: pattern.to_owned(), regex, slots })
    }

    /// Whether `[[ $text =~ $pattern ]]` would succeed. `text` may be any bytes, of any length
    /// (see the module doc for a NUL inside it).
    #[cfg(any(test, feature = "testing"))]
    pub fn is_match(&self, text: &[u8]) -> bool {
        self.match_code(text) == 0
    }

    /// [`Pattern::is_match`], but `Err(Undecided)` where glibc ran out of memory on the way.
    ///
    /// glibc does not always report that: some allocation failures inside `regexec` are
    /// swallowed and it answers `REG_NOMATCH` (seen with `(a*)*\1` under a 64 MiB address-space
    /// limit, where without the limit it matches). Every failed `malloc` sets `errno` to
    /// `ENOMEM`, so an `ENOMEM` left behind by the call marks its answer as unreliable. It errs
    /// on the safe side: an allocation that failed and was then retried another way still
    /// counts, which can only turn an answer into `Undecided` (a protected process).
    pub fn try_match(&self, text: &[u8]) -> Result<bool, Undecided> {
        set_errno(0);
        let code = self.match_code(text);
        match code {
            0 => Ok(true),
            libc::REG_NOMATCH if errno() != libc::ENOMEM => Ok(false),
            _ => Err(Undecided),
        }
    }

    /// `regexec`'s return code for `text`.
    fn match_code(&self, text: &[u8]) -> c_int {
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
    fn exec(&self, text: *const c_char, end: Option<libc::regoff_t>) -> c_int {
        const UNSET: libc::regmatch_t = libc::regmatch_t { rm_so: -1, rm_eo: -1 };
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
                slots[0] = libc::regmatch_t { rm_so: 0, rm_eo: end };
                libc::REG_STARTEND
            }
            None => 0,
        };
        // Anything but 0 (REG_NOMATCH, or REG_ESPACE when glibc runs out of memory on a
        // pathological back-reference) is "no match" for `is_match`, as bash's
        // `if (regexec (...))` treats it; `try_match` tells them apart.
        // SAFETY: the regex compiled successfully and lives as long as `self`; `text` is valid
        // for `end` bytes (or up to its NUL when `end` is `None`); `slots` has `slots.len()`
        // writable entries; `regexec` does not retain any pointer after returning.
        unsafe { libc::regexec(&*self.regex, text, slots.len(), slots.as_mut_ptr(), flags) }
    }

    /// The pattern as configured.
    #[cfg(any(test, feature = "testing"))]
    pub fn as_str(&self) -> &str {
        &self.source
    }
}

/// This thread's `errno`.
fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn set_errno(value: c_int) {
    // SAFETY: `__errno_location` returns this thread's errno slot, valid for the thread's life.
    unsafe { *libc::__errno_location() = value };
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
mod tests;
