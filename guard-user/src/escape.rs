//! One text form for bytes the account controls (process names, command lines, config values,
//! paths), used everywhere guard writes them out: log values, `Comm`'s `Display` (and so the
//! status file, the Redis mirror and the state file's keys), and one-line terminal output.
//!
//! The escaped form ([`text`]) is valid UTF-8 without a control character, a line break or an
//! invisible character, and it decodes back to the exact bytes ([`unescape`]):
//!
//! | input | written as |
//! |---|---|
//! | `\` | `\\` |
//! | newline, tab, carriage return | `\n`, `\t`, `\r` |
//! | any other byte below 0x20, and 0x7f | `\xNN` (two lowercase hex digits) |
//! | a byte that is not part of valid UTF-8 | `\xNN` |
//! | a C1 control (U+0080–U+009F), a space other than U+0020 (U+00A0, U+2028, U+2029, U+3000, …), an invisible formatting or bidi control (U+200B–U+200F, U+202A–U+202E, U+2066–U+2069, U+FEFF, …) | each of its UTF-8 bytes as `\xNN` |
//! | anything else, including space, `=` and `"` | itself |
//!
//! Why each row: a newline or carriage return would start a new log line; other controls drive
//! terminals (ESC sequences); invalid bytes would be replaced by U+FFFD, which made two names
//! one (`q\xff` and `q\xfe`); U+2028/U+2029 are line breaks to many viewers; bidi controls and
//! invisible characters make text read differently from its bytes. The backslash itself is
//! escaped so the decoding is unambiguous: `\xff` is one byte, `\\xff` is four characters.
//!
//! A log value ([`push_log_value`]) is the escaped form, double-quoted when it is empty or holds
//! a space, `=` or `"` (a `"` inside the quotes is written `\"`), so `name=x KILLED pid=1` can
//! only ever read as one `name` key.
use std::fmt::{self, Write as _};

/// Whether a valid character is written as its escaped UTF-8 bytes (see the module table).
fn hidden(c: char) -> bool {
    c.is_control()
        || (c.is_whitespace() && c != ' ')
        || matches!(
            c,
            '\u{00ad}'
                | '\u{034f}'
                | '\u{061c}'
                | '\u{115f}'
                | '\u{1160}'
                | '\u{17b4}'
                | '\u{17b5}'
                | '\u{180b}'..='\u{180f}'
                | '\u{200b}'..='\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2060}'..='\u{206f}'
                | '\u{3164}'
                | '\u{fe00}'..='\u{fe0f}'
                | '\u{feff}'
                | '\u{ffa0}'
                | '\u{fff0}'..='\u{fffb}'
                | '\u{e0000}'..='\u{e0fff}'
        )
}

fn push_byte(out: &mut String, b: u8) {
    match b {
        b'\\' => out.push_str("\\\\"),
        b'\n' => out.push_str("\\n"),
        b'\t' => out.push_str("\\t"),
        b'\r' => out.push_str("\\r"),
        _ => {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
}

/// Appends the escaped form of `bytes` to `out`.
pub fn push_text(out: &mut String, bytes: &[u8]) {
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' || hidden(c) {
                let mut buf = [0u8; 4];
                for &b in c.encode_utf8(&mut buf).as_bytes() {
                    push_byte(out, b);
                }
            } else {
                out.push(c);
            }
        }
        for &b in chunk.invalid() {
            push_byte(out, b);
        }
    }
}

/// The escaped form of `bytes`: one line, printable, decodable by [`unescape`].
pub fn text(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    push_text(&mut out, bytes);
    out
}

/// [`text`] cut to at most `max` bytes of output, never inside an escape sequence, with `…`
/// appended when something was cut: a command line for one row of a terminal table (`status`,
/// `match`, `explain`).
pub fn text_capped(bytes: &[u8], max: usize) -> String {
    // Every byte escapes to at least one byte, so nothing past the first `max + 1` bytes can
    // show, and the text of those is over `max` exactly when the whole is: escaping a 1 MiB
    // value to show 200 bytes of it would be waste. (A character cut at `max + 1` becomes
    // `\xNN` units that start past `max - 3` and so never fit either.)
    let bytes = &bytes[..bytes.len().min(max.saturating_add(1))];
    cap_escaped(text(bytes), max)
}

/// An escaped text cut to at most `max` bytes between two escape units, `…` appended when cut.
fn cap_escaped(full: String, max: usize) -> String {
    if full.len() <= max {
        return full;
    }
    // Walk the escaped text unit by unit (a character, or a `\…` sequence) so a cut never
    // leaves half an escape that would decode differently.
    let mut end = 0;
    let mut it = full.char_indices().peekable();
    while let Some((i, c)) = it.next() {
        let len = if c == '\\' {
            match it.next() {
                Some((_, 'x')) => {
                    it.next();
                    it.next();
                    4
                }
                _ => 2,
            }
        } else {
            c.len_utf8()
        };
        if i + len > max {
            break;
        }
        end = i + len;
    }
    let mut out = full[..end].to_string();
    out.push('…');
    out
}

/// Text that should already be in escaped form but came from a file the account can edit (a
/// name in the status file): returned as it is when it holds nothing hidden, else with each
/// hidden character (control, line break, invisible, see the module table) written as `\xNN`
/// bytes. Backslashes are left alone, so a valid escaped text is unchanged; for display only.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(hidden) {
        return text.into();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if hidden(c) {
            for &b in c.encode_utf8(&mut [0u8; 4]).as_bytes() {
                let _ = write!(out, "\\x{b:02x}");
            }
        } else {
            out.push(c);
        }
    }
    out.into()
}

/// Whether an escaped text must be quoted as a log value.
fn needs_quotes(escaped: &str) -> bool {
    escaped.is_empty() || escaped.contains([' ', '=', '"'])
}

/// Appends `bytes` as one log value: escaped, and quoted when empty or holding ` `, `=`, `"`.
pub fn push_log_value(out: &mut String, bytes: &[u8]) {
    push_quoted(out, &text(bytes));
}

/// Appends an escaped text as a log value, quoted when it must be.
fn push_quoted(out: &mut String, escaped: &str) {
    if needs_quotes(escaped) {
        out.push('"');
        out.push_str(&escaped.replace('"', "\\\""));
        out.push('"');
    } else {
        out.push_str(escaped);
    }
}

/// `bytes` as one log value (see [`push_log_value`]).
pub fn log_value(bytes: &[u8]) -> String {
    let mut out = String::new();
    push_log_value(&mut out, bytes);
    out
}

/// `bytes` as one log value whose escaped text is cut to at most `max` bytes, with `…` appended
/// when something was cut ([`text_capped`]): a value the account controls that may be huge (a
/// config value) makes a bounded line, and still reads back with the log's one grammar.
pub fn log_value_capped(bytes: &[u8], max: usize) -> String {
    let mut out = String::new();
    push_quoted(&mut out, &text_capped(bytes, max));
    out
}

/// `bytes` as one shell word that bash (and zsh) reads back as exactly those bytes, and that
/// shows on a terminal as one line of printable text: a command printed for the operator to
/// paste (`holders`' stop command), whatever the account named its directory.
///
/// Letters, digits and `_@%+=:,./-` stay bare; other printable text goes in single quotes (a `'`
/// written `'\''`); text holding a line break, a control or invisible character or bytes that
/// are not UTF-8 is written `$'…'` with those bytes as `\xNN` (and `\\`, `\'`).
pub fn shell_word(bytes: &[u8]) -> String {
    let bare = |b: &u8| b.is_ascii_alphanumeric() || b"_@%+=:,./-".contains(b);
    if !bytes.is_empty() && bytes.iter().all(bare) {
        return String::from_utf8_lossy(bytes).into_owned();
    }
    let shown = text(bytes);
    if shown.as_bytes() == bytes {
        return format!("'{}'", shown.replace('\'', r"'\''"));
    }
    let mut out = String::from("$'");
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str(r"\\"),
                '\'' => out.push_str(r"\'"),
                c if hidden(c) => {
                    for &b in c.encode_utf8(&mut [0u8; 4]).as_bytes() {
                        let _ = write!(out, "\\x{b:02x}");
                    }
                }
                c => out.push(c),
            }
        }
        for &b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out.push('\'');
    out
}

/// [`log_value_capped`], quoted whatever it holds: the text of a string shown where another
/// type belongs (`value="30"` is the string "30"; the number is `value=30`).
pub fn log_string_capped(bytes: &[u8], max: usize) -> String {
    format!("\"{}\"", text_capped(bytes, max).replace('"', "\\\""))
}

/// Bytes of a command line that any output shows (`explain`, `match`, `tree`, `holders`): the
/// account may make one 1 MiB long, and root's terminal and memory are not its to fill.
pub const SHOWN_CMDLINE_BYTES: usize = 4096;

/// A command line as guard's output shows it: its first [`SHOWN_CMDLINE_BYTES`] bytes and how
/// many bytes were left out. Build it once from the bytes read and keep it instead of them; it
/// costs at most 4 KiB whatever the command line.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct ShownCmdline {
    head: Box<[u8]>,
    omitted: usize,
}

impl ShownCmdline {
    /// The shown part of `text`, a whole command line.
    pub fn of(text: &[u8]) -> ShownCmdline {
        ShownCmdline::of_prefix(text, text.len())
    }

    /// The shown part of a command line of `total` bytes that starts with `prefix` (at least
    /// [`SHOWN_CMDLINE_BYTES`] of it, or all of it).
    pub fn of_prefix(prefix: &[u8], total: usize) -> ShownCmdline {
        let head = &prefix[..prefix.len().min(SHOWN_CMDLINE_BYTES).min(total)];
        ShownCmdline { head: head.into(), omitted: total - head.len() }
    }

    /// The bytes shown.
    pub fn head(&self) -> &[u8] {
        &self.head
    }

    /// Bytes of the command line left out after [`ShownCmdline::head`].
    pub fn omitted(&self) -> usize {
        self.omitted
    }

    /// The command line's length.
    pub fn total(&self) -> usize {
        self.head.len() + self.omitted
    }

    /// The shown bytes as text, bytes that are not UTF-8 replaced by U+FFFD (`--json`'s
    /// `cmdline`).
    pub fn lossy(&self) -> String {
        String::from_utf8_lossy(&self.head).into_owned()
    }

    /// One log value of the shown bytes ([`log_value`]; `--json`'s `cmdline_escaped`).
    pub fn log_value(&self) -> String {
        log_value(&self.head)
    }

    /// What a terminal line shows: the escaped bytes ([`text`]), then `…[+<n> bytes]` when
    /// some were left out. The marker cannot be part of the escaped text (a `[` after `…` is
    /// never written by the escaping), so a reader always tells a cut line from a whole one.
    pub fn line(&self) -> String {
        let mut out = text(&self.head);
        if self.omitted > 0 {
            let _ = write!(out, "…[+{} bytes]", self.omitted);
        }
        out
    }
}

impl fmt::Display for ShownCmdline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.line())
    }
}

/// Displays bytes in their escaped form, e.g. `format!("{}", Escaped(path.as_os_str().as_bytes()))`.
pub struct Escaped<'a>(pub &'a [u8]);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&text(self.0))
    }
}

/// Why a text is not an escaped form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnescapeError {
    #[error("a backslash ends the text")]
    TrailingBackslash,
    #[error("unknown escape `\\{0}` at byte {1}")]
    Unknown(char, usize),
    #[error("`\\x` must be followed by two lowercase hex digits (byte {0})")]
    BadHex(usize),
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// Decodes an escaped text back to its bytes. Accepts exactly the escapes [`text`] writes, plus
/// `\"` (from a quoted log value); any other character stands for its own UTF-8 bytes.
pub fn unescape(escaped: &str) -> Result<Vec<u8>, UnescapeError> {
    let s = escaped.as_bytes();
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] != b'\\' {
            out.push(s[i]);
            i += 1;
            continue;
        }
        let Some(&e) = s.get(i + 1) else { return Err(UnescapeError::TrailingBackslash) };
        match e {
            b'\\' => out.push(b'\\'),
            b'"' => out.push(b'"'),
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'x' => {
                let (Some(hi), Some(lo)) = (s.get(i + 2).and_then(|&c| hex(c)), s.get(i + 3).and_then(|&c| hex(c)))
                else {
                    return Err(UnescapeError::BadHex(i));
                };
                out.push(hi << 4 | lo);
                i += 2;
            }
            _ => {
                let c = escaped[i + 1..].chars().next().unwrap_or('?');
                return Err(UnescapeError::Unknown(c, i));
            }
        }
        i += 2;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_single_byte_round_trips_and_escapes_to_printable_text() {
        for b in 0..=255u8 {
            let e = text(&[b]);
            assert_eq!(unescape(&e).unwrap(), vec![b], "{b:#x} → {e}");
            assert!(!e.chars().any(hidden), "{b:#x} → {e:?}");
        }
        assert_eq!(text(b"a\nb\tc\rd\x1b[31m\x7f"), "a\\nb\\tc\\rd\\x1b[31m\\x7f");
    }

    #[test]
    fn invalid_utf8_is_kept_byte_for_byte_so_two_names_stay_two() {
        assert_eq!(text(b"q\xff"), "q\\xff");
        assert_eq!(text(b"q\xfe"), "q\\xfe");
        assert_ne!(text(b"q\xff"), text(b"q\xfe"));
        // A literal backslash-x is not a byte escape.
        assert_eq!(text(b"q\\xff"), "q\\\\xff");
        assert_eq!(unescape("q\\\\xff").unwrap(), b"q\\xff");
        // Valid multibyte text stays readable.
        assert_eq!(text("café ✓".as_bytes()), "café ✓");
    }

    #[test]
    fn line_separators_c1_controls_and_bidi_controls_are_escaped() {
        assert_eq!(text("a\u{2028}b".as_bytes()), "a\\xe2\\x80\\xa8b");
        assert_eq!(text("a\u{85}b".as_bytes()), "a\\xc2\\x85b");
        assert_eq!(text("\u{202e}gpj.exe".as_bytes()), "\\xe2\\x80\\xaegpj.exe");
        assert_eq!(text("a\u{a0}b\u{feff}".as_bytes()), "a\\xc2\\xa0b\\xef\\xbb\\xbf");
    }

    #[test]
    fn log_values_are_quoted_when_empty_or_holding_space_equals_or_quote() {
        assert_eq!(log_value(b"plain"), "plain");
        assert_eq!(log_value(b""), "\"\"");
        assert_eq!(log_value(b"a=b c"), "\"a=b c\"");
        assert_eq!(log_value(b"x KILLED pid=1"), "\"x KILLED pid=1\"");
        assert_eq!(log_value(b"say \"hi\""), "\"say \\\"hi\\\"\"");
        assert_eq!(log_value(b"back\\slash"), "back\\\\slash");
        assert_eq!(log_value(b"a\nb"), "a\\nb");
    }

    #[test]
    fn unescape_rejects_what_text_never_writes() {
        assert_eq!(unescape("a\\"), Err(UnescapeError::TrailingBackslash));
        assert!(matches!(unescape("\\q"), Err(UnescapeError::Unknown('q', 0))));
        assert_eq!(unescape("\\xF0"), Err(UnescapeError::BadHex(0)));
        assert_eq!(unescape("\\x0"), Err(UnescapeError::BadHex(0)));
        assert_eq!(unescape("ok\\\"").unwrap(), b"ok\"");
    }

    #[test]
    fn printable_leaves_escaped_text_alone_and_escapes_what_is_hidden() {
        let escaped = text(b"q\xff\\ ok");
        assert!(matches!(printable(&escaped), std::borrow::Cow::Borrowed(_)));
        assert_eq!(printable("row\nforged\u{2028}x\u{1b}[2J"), r"row\x0aforged\xe2\x80\xa8x\x1b[2J");
    }

    #[test]
    fn capped_text_never_cuts_an_escape_in_half() {
        let cmd = b"python3 -c \xff\xfe\n\x1b rest of a long command line";
        for max in 0..80 {
            let t = text_capped(cmd, max);
            let body = t.strip_suffix('…').unwrap_or(&t);
            assert!(body.len() <= max, "{max}: {t}");
            let bytes = unescape(body).unwrap_or_else(|e| panic!("{max}: {t}: {e}"));
            assert!(cmd.starts_with(&bytes), "{max}: {t}");
        }
        assert_eq!(text_capped(b"short", 10), "short");
    }

    #[test]
    fn a_command_line_is_shown_as_its_first_4_kib_and_the_bytes_left_out() {
        let huge = vec![b'a'; 1 << 20];
        let shown = ShownCmdline::of(&huge);
        assert_eq!((shown.head().len(), shown.omitted(), shown.total()), (4096, (1 << 20) - 4096, 1 << 20));
        assert_eq!(shown.line(), format!("{}…[+{} bytes]", "a".repeat(4096), (1 << 20) - 4096));
        let short = ShownCmdline::of(b"sleep 30\nx");
        assert_eq!((short.line(), short.omitted()), ("sleep 30\\nx".to_string(), 0));
        // The head is escaped like any account text: nothing in it can end the line.
        let mut hostile = b"x\n\x1b[2J\n".repeat(2000);
        hostile.extend_from_slice(b"\nKILLED pid=1");
        let line = ShownCmdline::of(&hostile).line();
        assert!(!line.contains(['\n', '\x1b']) && line.ends_with(" bytes]"), "{line}");
        assert_eq!(ShownCmdline::of_prefix(b"abc", 10).line(), "abc…[+7 bytes]");
        assert_eq!(ShownCmdline::of(b"a b").log_value(), "\"a b\"");
    }

    #[test]
    fn capping_reads_only_what_can_show_and_gives_what_the_whole_would() {
        let samples: [&[u8]; 4] = [
            b"plain ascii text",
            "ab\u{e9}\u{20ac}\u{1f600}\n\u{202e}x".as_bytes(),
            b"q\xff\xfe\\x\x1b[2J",
            b"\xe2\x82",
        ];
        for bytes in samples {
            for max in 0..40 {
                assert_eq!(text_capped(bytes, max), cap_escaped(text(bytes), max), "{bytes:?} at {max}");
            }
        }
        let huge = vec![b'a'; 1 << 20];
        assert_eq!(log_value_capped(&huge, 8), "aaaaaaaa…");
        assert_eq!(log_value_capped(b"\"30\"", 200), r#""\"30\"""#);
        assert_eq!(log_value_capped(b"30", 200), "30");
    }

    /// bash itself reads each word back: the bytes come out exactly, and the word shows as one
    /// printable line.
    #[test]
    fn a_shell_word_is_read_back_by_bash_as_its_bytes() {
        let samples: [&[u8]; 12] = [
            b"/home/alice/work",
            b"/home/alice/my work",
            b"/tmp/it's",
            b"/tmp/$(touch /tmp/pwned)`id`;rm -rf ~ *",
            b"/tmp/x (deleted)",
            b"/tmp/line\nbreak\nfor real: \n",
            b"/tmp/\x1b[2J\x07bell",
            b"/tmp/q\xff\xfe",
            b"/tmp/back\\slash\\'quote'",
            "/tmp/caf\u{e9}/\u{202e}txt".as_bytes(),
            b"!event",
            b"",
        ];
        for bytes in samples {
            let word = shell_word(bytes);
            assert!(!word.chars().any(|c| c.is_control()), "{word}");
            let out =
                std::process::Command::new("bash").args(["-c", &format!("printf %s {word}")]).output().expect("bash");
            assert!(out.status.success(), "{word}: {}", String::from_utf8_lossy(&out.stderr));
            assert_eq!(out.stdout, bytes, "{word}");
        }
        assert_eq!(shell_word(b"/home/alice/work"), "/home/alice/work");
        assert_eq!(shell_word(b"/tmp/it's"), r"'/tmp/it'\''s'");
        assert_eq!(shell_word(b"a\nb"), r"$'a\x0ab'");
    }
}
