//! Habits from other regex dialects (PCRE, Python, JavaScript) that bash's extended regexes
//! read another way, found by reading a pattern's text: `\d` is the letter d to bash, `[\d]` a
//! backslash or a d, `ab+?c` makes `b+` optional, `(?i)` is not valid at all. `validate` and
//! `match` say which, what bash reads, and what to write instead; the daemon honours the
//! pattern as bash would (it is the meaning docs/configuration.md defines).
//!
//! Every claim is a [`Kind`] with its examples, and `tests/pattern_oracle.rs` runs every
//! example through bash's own `[[ =~ ]]`: a hint that stops being true fails that test.
//!
//! What glibc's regex (and so bash) does honour is left alone: the GNU operators `\w`, `\W`,
//! `\s`, `\S`, `\b`, `\B`, `\<`, `\>`, `` \` `` and `\'`, and back-references `\1`–`\9`.

/// One construct, what bash reads, what to write, and examples bash must agree with.
#[derive(Debug)]
// `written` and `examples` are the claim's evidence, kept beside the hint they prove so neither
// changes without the other: the oracle test runs every example through bash and the docs test
// reads `written`; the binary prints neither.
#[cfg_attr(
    not(any(test, feature = "testing")),
    expect(dead_code, reason = "the evidence for each hint, read only by the tests that check it against bash")
)]
pub struct Kind {
    /// The construct as written (for a letter escape, the letter's kind: `\d`).
    pub written: &'static str,
    /// What bash reads it as, a clause after "bash reads `…` as".
    pub reads_as: &'static str,
    /// What to write instead.
    pub fix: &'static str,
    /// Whether bash matches other command lines than the other dialect would (an error for
    /// `validate`), or the same ones by another way (`*?` is `*` made optional: a warning).
    pub changes_matches: bool,
    /// `(pattern, text, bash matches)`: checked against bash by the oracle test. A pattern bash
    /// refuses is written with `None` as its expected verdict in [`INVALID_EXAMPLES`].
    pub examples: &'static [(&'static str, &'static str, bool)],
}

/// Letter escapes with a fix of their own; any other letter bash does not honour is
/// [`OTHER_LETTER`].
pub const LETTERS: &[(char, Kind)] = &[
    (
        'd',
        Kind {
            written: "\\d",
            reads_as: "the letter d",
            fix: "write [0-9] for a digit",
            changes_matches: true,
            examples: &[("\\d", "d", true), ("\\d", "5", false), ("[0-9]", "5", true), ("[0-9]", "d", false)],
        },
    ),
    (
        'D',
        Kind {
            written: "\\D",
            reads_as: "the letter D",
            fix: "write [^0-9] for a non-digit",
            changes_matches: true,
            examples: &[("\\D", "D", true), ("\\D", "x", false), ("[^0-9]", "x", true), ("[^0-9]", "5", false)],
        },
    ),
    (
        'h',
        Kind {
            written: "\\h",
            reads_as: "the letter h",
            fix: "write [[:blank:]] for a space or tab",
            changes_matches: true,
            examples: &[("\\h", "h", true), ("\\h", " ", false), ("[[:blank:]]", "\t", true)],
        },
    ),
    (
        'A',
        Kind {
            written: "\\A",
            reads_as: "the letter A",
            fix: "write ^ for the start of the command line",
            changes_matches: true,
            examples: &[("\\Aab", "Aab", true), ("\\Aab", "ab", false), ("^ab", "ab", true)],
        },
    ),
    (
        'z',
        Kind {
            written: "\\z",
            reads_as: "the letter z",
            fix: "write $ for the end of the command line",
            changes_matches: true,
            examples: &[("ab\\z", "abz", true), ("ab\\z", "ab", false), ("ab$", "ab", true)],
        },
    ),
    (
        'Z',
        Kind {
            written: "\\Z",
            reads_as: "the letter Z",
            fix: "write $ for the end of the command line",
            changes_matches: true,
            examples: &[("ab\\Z", "abZ", true), ("ab\\Z", "ab", false)],
        },
    ),
    (
        't',
        Kind {
            written: "\\t",
            reads_as: "the letter t",
            fix: "write [[:blank:]] (a command line's arguments are joined by spaces)",
            changes_matches: true,
            examples: &[("a\\tb", "atb", true), ("a\\tb", "a\tb", false), ("a[[:blank:]]b", "a\tb", true)],
        },
    ),
    (
        'n',
        Kind {
            written: "\\n",
            reads_as: "the letter n",
            fix: "write [[:space:]] for any white space",
            changes_matches: true,
            examples: &[("a\\nb", "anb", true), ("a\\nb", "a\nb", false), ("a[[:space:]]b", "a\nb", true)],
        },
    ),
    (
        'x',
        Kind {
            written: "\\x",
            reads_as: "the letter x",
            fix: "write the character itself (\\x41 is x41 to bash)",
            changes_matches: true,
            examples: &[("\\x41", "x41", true), ("\\x41", "A", false)],
        },
    ),
    (
        'p',
        Kind {
            written: "\\p",
            reads_as: "the letter p (and {…} as a repeat count, which it refuses)",
            fix: "write a class such as [[:alpha:]]",
            changes_matches: true,
            examples: &[("\\pL", "pL", true), ("[[:alpha:]]", "q", true)],
        },
    ),
];

/// A letter escape bash reads as the letter itself, without a fix of its own.
pub const OTHER_LETTER: Kind = Kind {
    written: "\\<letter>",
    reads_as: "that letter itself",
    fix: "write the letter alone if you mean it, or a bracket expression such as [[:alpha:]]",
    changes_matches: true,
    examples: &[("\\Q", "Q", true), ("\\K", "K", true), ("\\R", "R", true), ("\\e", "e", true)],
};

/// `[\d]`, `[\w]`, … inside a bracket expression.
pub const BRACKET_ESCAPE: Kind = Kind {
    written: "[\\d]",
    reads_as: "two characters, a backslash and the letter, inside brackets",
    fix: "write [0-9] for \\d, [[:alnum:]_] for \\w, [[:space:]] for \\s",
    changes_matches: true,
    examples: &[("[\\d]", "\\", true), ("[\\d]", "d", true), ("[\\d]", "5", false), ("[\\w]", "a", false)],
};

/// `+?` and `{m,n}?`: not lazy.
pub const LAZY_OPTIONAL: Kind = Kind {
    written: "+?",
    reads_as: "a repetition made optional, not a lazy one (ab+?c matches ac)",
    fix: "drop the ? (bash has no lazy quantifiers; a pattern only has to match somewhere)",
    changes_matches: true,
    examples: &[("ab+?c", "ac", true), ("ab+c", "ac", false), ("ab{2,3}?c", "ac", true)],
};

/// `*?` and `??`: not lazy, but they match the same command lines.
pub const LAZY_SAME: Kind = Kind {
    written: "*?",
    reads_as: "a repetition made optional, which matches the same command lines here (bash has no lazy quantifiers)",
    fix: "drop the ?",
    changes_matches: false,
    examples: &[("a.*?b", "axxb", true), ("a.*?b", "ba", false), ("ab??c", "ac", true), ("ab??c", "abc", true)],
};

/// `*+`, `++`, `?+`, `}+`: not possessive, but they match the same command lines.
pub const POSSESSIVE: Kind = Kind {
    written: "++",
    reads_as: "a repetition repeated again, not a possessive one; it matches the same command lines here",
    fix: "drop the second quantifier",
    changes_matches: false,
    examples: &[("ab++c", "abbc", true), ("ab++c", "ac", false), ("ab*+c", "ac", true)],
};

/// `(?…)`: inline flags, non-capturing and named groups, lookarounds. glibc refuses them all.
pub const GROUP_SYNTAX: Kind = Kind {
    written: "(?",
    reads_as: "a syntax error: bash has no (?…) groups (inline flags, non-capturing or named groups, lookarounds)",
    fix: "write a plain group ( … ); for (?i) write each letter as [Aa]; there is no lookaround, so match the \
          text itself",
    changes_matches: true,
    examples: &[("([Aa])bc", "Abc", true)],
};

/// Patterns bash refuses (`[[ =~ ]]` returns 2), one per refused [`Kind`].
#[cfg(any(test, feature = "testing"))]
pub const INVALID_EXAMPLES: &[&str] =
    &["(?i)abc", "(?:ab)", "a(?=b)", "a(?!b)", "(?<=a)b", "(?<!a)b", "(?P<n>a)", "\\p{L}"];

/// The GNU operators bash does honour (never a habit), each with an example it must agree with.
#[cfg(any(test, feature = "testing"))]
pub const HONOURED: &[(&str, &str, bool)] = &[
    ("\\w", "a", true),
    ("\\w", "!", false),
    ("\\W", "!", true),
    ("\\s", " ", true),
    ("\\s", "a", false),
    ("\\S", "a", true),
    ("\\bfoo\\b", "a foo b", true),
    ("\\bfoo\\b", "afoob", false),
    ("\\<foo\\>", "a foo", true),
];

/// One habit found in a pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Habit {
    /// Byte offset in the pattern.
    pub at: usize,
    /// As written in this pattern (`\d`, `[\w]`, `+?`, `(?i`).
    pub written: String,
    /// What bash reads.
    pub reads_as: &'static str,
    pub fix: &'static str,
    pub changes_matches: bool,
}

impl Habit {
    fn of(at: usize, written: &str, kind: &Kind) -> Habit {
        Habit {
            at,
            written: written.to_string(),
            reads_as: kind.reads_as,
            fix: kind.fix,
            changes_matches: kind.changes_matches,
        }
    }
}

/// The honoured GNU escapes: `\w \W \s \S \b \B \< \> \` \'`.
fn honoured(c: char) -> bool {
    matches!(c, 'w' | 'W' | 's' | 'S' | 'b' | 'B' | '<' | '>' | '`' | '\'')
}

/// Every habit in `pattern`, in order.
pub fn habits(pattern: &str) -> Vec<Habit> {
    let chars: Vec<(usize, char)> = pattern.char_indices().collect();
    let mut out = Vec::new();
    // The previous item was a quantifier (so a `?` or `+` right after it is a habit).
    let mut after_quantifier: Option<char> = None;
    let mut i = 0;
    while i < chars.len() {
        let (at, c) = chars[i];
        let mut quantifier = None;
        match c {
            '\\' => {
                if let Some(&(_, e)) = chars.get(i + 1) {
                    if e.is_ascii_alphabetic() && !honoured(e) {
                        let kind = LETTERS.iter().find(|(l, _)| *l == e).map_or(&OTHER_LETTER, |(_, k)| k);
                        out.push(Habit::of(at, &format!("\\{e}"), kind));
                    }
                }
                i += 2;
                after_quantifier = None;
                continue;
            }
            '[' => {
                let end = bracket_end(&chars, i);
                // Inside: a backslash before a letter is a habit (bash reads both characters).
                let mut j = i + 1;
                while j + 1 < end {
                    let (bat, b) = chars[j];
                    if b == '\\' && chars[j + 1].1.is_ascii_alphabetic() {
                        let written: String = chars[i..end.min(chars.len())].iter().map(|(_, c)| c).collect();
                        out.push(Habit::of(bat, &written, &BRACKET_ESCAPE));
                        break;
                    }
                    j += 1;
                }
                i = end;
                after_quantifier = None;
                continue;
            }
            '(' if chars.get(i + 1).is_some_and(|&(_, n)| n == '?') => {
                // `(?i)`, `(?:`, `(?=`, `(?<!`, `(?P<n>`: up to the character that ends the opener.
                let mut written = String::from("(?");
                for &(_, n) in chars[i + 2..].iter().take(6) {
                    written.push(n);
                    if matches!(n, ')' | ':' | '=' | '!' | '>') {
                        break;
                    }
                }
                out.push(Habit::of(at, &written, &GROUP_SYNTAX));
                i += 2;
                after_quantifier = None;
                continue;
            }
            '*' | '+' | '?' => {
                if let Some(q) = after_quantifier {
                    let kind = match (q, c) {
                        ('+' | '}', '?') => Some(&LAZY_OPTIONAL),
                        ('*' | '?', '?') => Some(&LAZY_SAME),
                        (_, '+') => Some(&POSSESSIVE),
                        _ => None,
                    };
                    if let Some(kind) = kind {
                        let before = chars[i - 1].1;
                        out.push(Habit::of(chars[i - 1].0, &format!("{before}{c}"), kind));
                    }
                } else {
                    quantifier = Some(c);
                }
            }
            '{' => {
                // A repeat count `{m}`, `{m,}`, `{m,n}` (else a literal brace, as glibc reads it).
                let close = chars[i + 1..].iter().position(|&(_, c)| c == '}').map(|n| i + 1 + n);
                let count = close.filter(|&e| {
                    let inner: String = chars[i + 1..e].iter().map(|(_, c)| c).collect();
                    !inner.is_empty() && inner.chars().all(|c| c.is_ascii_digit() || c == ',')
                });
                if let Some(e) = count {
                    i = e + 1;
                    after_quantifier = Some('}');
                    continue;
                }
            }
            _ => {}
        }
        after_quantifier = quantifier;
        i += 1;
    }
    out
}

/// The index just past the bracket expression that starts at `start` (POSIX: a `]` right after
/// `[` or `[^` is a member; `[:…:]`, `[=…=]`, `[.….]` are one member each).
fn bracket_end(chars: &[(usize, char)], start: usize) -> usize {
    let mut j = start + 1;
    if chars.get(j).is_some_and(|&(_, c)| c == '^') {
        j += 1;
    }
    if chars.get(j).is_some_and(|&(_, c)| c == ']') {
        j += 1;
    }
    while j < chars.len() {
        match chars[j].1 {
            ']' => return j + 1,
            '[' if chars.get(j + 1).is_some_and(|&(_, c)| matches!(c, ':' | '=' | '.')) => {
                let delim = chars[j + 1].1;
                let close =
                    (j + 2..chars.len().saturating_sub(1)).find(|&k| chars[k].1 == delim && chars[k + 1].1 == ']');
                j = close.map_or(chars.len(), |k| k + 2);
            }
            _ => j += 1,
        }
    }
    chars.len()
}

/// The habits as one clause for a problem or an error: "bash reads `\d` as the letter d (write
/// [0-9] for a digit)", joined by "; ".
pub fn describe(habits: &[Habit]) -> String {
    habits
        .iter()
        .map(|h| format!("bash reads `{}` as {} ({})", h.written, h.reads_as, h.fix))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(p: &str) -> Vec<String> {
        habits(p).into_iter().map(|h| h.written).collect()
    }

    #[test]
    fn other_dialects_habits_are_found_where_they_are_written() {
        assert_eq!(found(r"\d+ --port \d{4}"), [r"\d", r"\d"]);
        assert_eq!(found(r"[\d]x[\w-]"), [r"[\d]", r"[\w-]"]);
        assert_eq!(found("ab+?c .*? a{2,3}?"), ["+?", "*?", "}?"]);
        assert_eq!(found("a++ b?+"), ["++", "?+"]);
        assert_eq!(found("(?i)x(?:y)(?=z)(?<!w)(?P<n>a)"), ["(?i)", "(?:", "(?=", "(?<!", "(?P<n>"]);
        assert_eq!(found(r"\Aab\z \x41 \Q"), [r"\A", r"\z", r"\x", r"\Q"]);
        let h = &habits(r"x\d")[0];
        assert_eq!((h.at, h.reads_as, h.changes_matches), (1, "the letter d", true));
        assert!(!habits("a*?").first().unwrap().changes_matches);
    }

    #[test]
    fn what_bash_honours_or_escapes_is_no_habit() {
        for p in [
            r"\w+\s\S\W\b\B\<\>",
            r"\\d",
            r"\.\*\?\+\(",
            r"(a)\1",
            "[[:digit:]]+",
            "[]d\\]",
            "[^]\\]",
            "a{2}b{1,}c{,3}",
            "a{x}?",
            "^(a|b)?$",
            "[[:alpha:]\\]",
            "(^|[ /])agentihooks swarm tick( |$)",
        ] {
            assert!(habits(p).is_empty(), "{p}: {:?}", habits(p));
        }
    }

    #[test]
    fn the_description_names_the_construct_what_bash_reads_and_the_fix() {
        assert_eq!(describe(&habits(r"\d+")), "bash reads `\\d` as the letter d (write [0-9] for a digit)");
    }
}
