//! The only values `install` writes into a unit file, each validated into a type that can only
//! hold what systemd reads back as exactly that value, and the escaping of each directive.
//!
//! Every rule below is systemd's own (checked against `src/core/load-fragment.c` and
//! `src/basic/extract-word.c`, systemd 252 as in Debian bookworm, and by parsing our output
//! with a real systemd in the tests):
//!
//! - `ExecStart=` argv\[0\]: split by `extract_first_word(EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE)`,
//!   then `%` specifiers, and refused unless `string_is_safe` (no quote, backslash or control
//!   character). We write an [`Executable`]: `[A-Za-z0-9/._+-]` only, raw.
//! - `ExecStart=` arguments: the same word splitting (whitespace separates words outside quotes;
//!   inside `"…"` a backslash escapes C-style: `\\` is `\`, `\"` is `"`); then `%` specifiers on
//!   each word (`%%` is `%`, any other `%x` is a specifier or an error); at exec time `$VAR` and
//!   `${VAR}` are expanded and `$$` is `$` (systemd.service(5), "Command lines"). We write `"`, the
//!   path with `\` → `\\`, `"` → `\"`, `%` → `%%`, `$` → `$$`, and `"`.
//! - `ReadWritePaths=`: `extract_first_word(EXTRACT_UNQUOTE)` (quotes group, a backslash takes
//!   the next byte literally, no C escapes: `\x20` is `x20`), then `%` specifiers
//!   (`unit_path_printf`), then `path_simplify_and_warn(PATH_CHECK_ABSOLUTE)`: valid UTF-8,
//!   absolute, normalized; a leading `-` or `+` is a flag (systemd.exec(5)). We write `"`, the
//!   path with `\` → `\\`, `"` → `\"`, `%` → `%%` (no `$`: nothing is expanded there), and `"`.
//!
//! What no directive can carry is refused with an error naming the value: a path that is not
//! valid UTF-8 (`path_simplify_and_warn` rejects it), holds a control character (a newline
//! ends the assignment, and a unit should not carry terminal controls), is not absolute and
//! normalized (no `.`, `..`, `//` or trailing `/`), or is longer than PATH_MAX. Quoting is
//! unconditional, so a space, `;`, `'` or a leading `-`/`+`/`@`/`!` never changes the meaning.
//! An account name goes into the unit's instance name and `--user`, so it is held to the
//! characters both accept without escaping: `[A-Za-z_][A-Za-z0-9_.-]{0,31}`.
use std::{fmt, path::Path};

/// Longest path systemd's `path_is_valid` accepts (PATH_MAX including the NUL).
const PATH_MAX: usize = 4096;
/// The longest account name `useradd` creates by default (and utmp can hold).
const NAME_MAX: usize = 32;

/// Why a value cannot go into a unit file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitValueError {
    #[error("{what} {shown} is not valid UTF-8, which systemd refuses in a unit file; {fix}")]
    NotUtf8 { what: &'static str, shown: String, fix: &'static str },
    #[error("{what} {shown} holds a control character (e.g. a newline), which a unit file cannot carry; {fix}")]
    Control { what: &'static str, shown: String, fix: &'static str },
    #[error("{what} {shown} is not an absolute, normalized path (no `.`, `..`, `//` or trailing `/`); {fix}")]
    NotNormalized { what: &'static str, shown: String, fix: &'static str },
    #[error("{what} {shown} is longer than systemd accepts ({PATH_MAX} bytes); {fix}")]
    TooLong { what: &'static str, shown: String, fix: &'static str },
    #[error(
        "{what} {shown} may hold only letters, digits and `/._+-` (it is written unquoted into the unit's \
         ExecStart= and Documentation=); {fix}"
    )]
    UnsafeExecutable { what: &'static str, shown: String, fix: &'static str },
    #[error(
        "account name {shown:?} cannot be a systemd instance name as is: it must match \
         [A-Za-z_][A-Za-z0-9_.-]{{0,31}}; guard an account with such a name by running the daemon yourself"
    )]
    AccountName { shown: String },
}

/// A path shown in an error: guard's escaped form in quotes ([`super::quoted`]), so a hostile
/// name prints on one line.
fn shown(p: &Path) -> String {
    super::quoted(p)
}

/// An absolute, normalized, UTF-8 path without control characters: something every
/// directive below can carry exactly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitPath(String);

impl UnitPath {
    /// Validates `p`; `what` (e.g. `--home`) and `fix` name the value and the way out in the error.
    pub fn new(what: &'static str, p: &Path, fix: &'static str) -> Result<UnitPath, UnitValueError> {
        let s = p.to_str().ok_or_else(|| UnitValueError::NotUtf8 { what, shown: shown(p), fix })?;
        if s.chars().any(char::is_control) {
            return Err(UnitValueError::Control { what, shown: shown(p), fix });
        }
        if !is_normalized_absolute(s) {
            return Err(UnitValueError::NotNormalized { what, shown: shown(p), fix });
        }
        if s.len() >= PATH_MAX {
            return Err(UnitValueError::TooLong { what, shown: shown(p), fix });
        }
        Ok(UnitPath(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn as_path(&self) -> &Path {
        Path::new(&self.0)
    }

    /// The path as one `ExecStart=` argument (see the module table).
    pub fn exec_arg(&self) -> String {
        quote(&self.0, true)
    }

    /// The path as one `ReadWritePaths=` entry (see the module table).
    pub fn path_list_item(&self) -> String {
        quote(&self.0, false)
    }
}

impl fmt::Display for UnitPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `/` followed by non-empty components that are not `.` or `..` (or `/` itself).
fn is_normalized_absolute(s: &str) -> bool {
    if s == "/" {
        return true;
    }
    match s.strip_prefix('/') {
        Some(rest) => rest.split('/').all(|c| !c.is_empty() && c != "." && c != ".."),
        None => false,
    }
}

fn quote(s: &str, exec: bool) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '%' => out.push_str("%%"),
            '$' if exec => out.push_str("$$"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The binary a unit runs: a [`UnitPath`] whose every byte is one systemd takes literally in
/// any position (`string_is_safe`, no specifier, no quoting), so it is written raw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Executable(UnitPath);

impl Executable {
    pub fn new(p: &Path) -> Result<Executable, UnitValueError> {
        const WHAT: &str = "the binary's path";
        const FIX: &str = "install from a directory with a plain name (--bin-dir DIR)";
        let path = UnitPath::new(WHAT, p, FIX)?;
        let safe = |c: char| c.is_ascii_alphanumeric() || "/._+-".contains(c);
        if !path.as_str().chars().all(safe) {
            return Err(UnitValueError::UnsafeExecutable { what: WHAT, shown: shown(p), fix: FIX });
        }
        Ok(Executable(path))
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl fmt::Display for Executable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An account name that is a valid systemd instance name and a plain `--user` word.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountName(String);

impl AccountName {
    pub fn new(name: &str) -> Result<AccountName, UnitValueError> {
        let mut chars = name.chars();
        let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
        if first_ok && rest_ok && name.len() <= NAME_MAX {
            Ok(AccountName(name.to_string()))
        } else {
            Err(UnitValueError::AccountName { shown: name.to_string() })
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for AccountName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Splits an `ExecStart=` value written by [`UnitPath::exec_arg`] (and raw words) back into
/// its arguments, undoing exactly our escaping. `None` for anything we would not have written
/// (an unknown escape, a lone `%` or `$`, an unbalanced quote): a drop-in that does not parse
/// is not ours.
pub fn split_exec_line(line: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.next_if(|&c| c == ' ').is_some() {}
        let Some(&first) = chars.peek() else { return Some(words) };
        let mut word = String::new();
        if first == '"' {
            chars.next();
            loop {
                match chars.next()? {
                    '"' => break,
                    '\\' => match chars.next()? {
                        c @ ('\\' | '"') => word.push(c),
                        _ => return None,
                    },
                    c @ ('%' | '$') => {
                        if chars.next()? != c {
                            return None;
                        }
                        word.push(c);
                    }
                    c => word.push(c),
                }
            }
            if chars.peek().is_some_and(|&c| c != ' ') {
                return None;
            }
        } else {
            while let Some(c) = chars.next_if(|&c| c != ' ') {
                if matches!(c, '"' | '\\' | '%' | '$' | '\'') || c.is_control() {
                    return None;
                }
                word.push(c);
            }
        }
        words.push(word);
    }
}
