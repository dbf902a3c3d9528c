//! The validators behind both [`super::parse`] (first problem = the ERROR line) and
//! [`problems`] (`guard-user validate`: every problem, each with its fix). One pass over the
//! document builds the `Config` and the problem list together, so the two cannot disagree.
use std::{fmt, path::Path, time::Duration};

use serde_json::{Map, Value};

use super::*;

#[path = "pattern_problems.rs"]
mod pattern_problems;
#[path = "sessions.rs"]
mod sessions;
#[cfg(test)]
pub(super) use pattern_problems::pattern_error;
pub use pattern_problems::{refused_patterns, refused_patterns_of};
pub use sessions::too_broad_root;
#[path = "shown.rs"]
mod shown;
#[path = "slots.rs"]
mod slots;
#[path = "written.rs"]
pub(super) mod written;
pub use slots::{all_patterns as all_slot_patterns, slot_of_pattern};

use shown::{kind, shown};
use shown::{prefix, shown_value, takes_string};

use crate::duration::{parse_duration_max, DurationError};

const FIX_JSON: &str = "fix the JSON syntax at that position";
const FIX_TOP: &str = r#"write one JSON object, e.g. {"threshold": 30}"#;
const FIX_THRESHOLD: &str = "write a whole number >= 1, e.g. 30";
const FIX_TIMEOUT: &str = r#"write "<n>h", "<n>m", "<n>s" or whole seconds, at most 1 year (8760h), e.g. "1h""#;
const FIX_WARN_BEFORE: &str = r#"write a duration as for timeout, e.g. "10m", or 0 to turn the warning off"#;
const FIX_EXCLUDES: &str = r#"write an array of process names as `ps -o comm` shows them, e.g. ["bash", "node"]"#;
const FIX_EXCLUDE_NAME: &str = r#"write each name as a string of at most 255 bytes without NUL, e.g. "node""#;
const FIX_EXCLUDES_COUNT: &str = "keep at most 1024 names";
const FIX_PATTERNS: &str = r#"write an array of bash extended regexes, e.g. ["(^|[ /])agentihooks swarm tick( |$)"]"#;
const FIX_PATTERN: &str =
    "write each pattern as a string of at most 1024 bytes without NUL, at most 256 of them (try one with guard-user match)";
const FIX_COSTLY: &str = "avoid nesting repeat counts (a{1,255} inside another {m,n}) and large counts; match a \
     distinctive word of the command line instead (try it with guard-user match)";
const FIX_LOG: &str = "write a number of MiB > 0 and <= 4096, e.g. 10";
const FIX_STATE: &str = r#"write the path of a file in a directory the account owns, e.g. "~/guard-daemon-state.json""#;
const FIX_REPEAT: &str = "write a whole number from 1 to 1000, e.g. 3";
const FIX_TOO_BIG: &str = "write the value docs/configuration.md describes for this key; no valid one is that large";
const FIX_STALL: &str = r#"write false to turn it off, or an object like {"peggedCpu": 0.75, "peggedFor": "5m"}"#;
const FIX_PEGGED_CPU: &str = "write the cores a process must keep busy, a number > 0 and <= 1024, e.g. 0.75";
const FIX_PEGGED_FOR: &str = r#"write a duration from 10s to 24h, e.g. "5m""#;
const FIX_INVALID_PATTERN: &str = "write a valid bash extended regex (try it with guard-user match --pattern)";

/// One problem of a config document, with what to do about it.
#[derive(Debug)]
pub struct Problem {
    /// Where: a key (`threshold`), an element (`excludes[2]`), a nested key
    /// (`stallWatch.peggedFor`), or `json` / `top level` / `file` for the document itself.
    pub key: String,
    /// What is wrong, quoting the value (escaped, so it prints on one line).
    pub what: String,
    /// How to fix it.
    pub fix: String,
    /// An unknown key: reported, but the config is still used.
    pub warning: bool,
    /// The `ERROR` line's reason for this problem; `None` for warnings.
    error: Option<ConfigError>,
}

impl Problem {
    /// The ERROR line's reason (`None` for a warning).
    #[cfg(any(test, feature = "testing"))]
    pub fn error(&self) -> Option<&ConfigError> {
        self.error.as_ref()
    }

    /// The daemon's error for this problem (`None` for what only `validate` reports).
    pub fn into_error(self) -> Option<ConfigError> {
        self.error
    }

    /// A problem that stopped the document from being read at all (missing, unreadable).
    pub fn from_error(error: ConfigError) -> Problem {
        let (key, what) = match &error {
            ConfigError::Unreadable { error } => ("file".to_string(), error.to_string()),
            ConfigError::Missing { path } => {
                ("file".to_string(), format!("{}: no such file", escape::Escaped(path.as_os_str().as_bytes())))
            }
            other => ("file".to_string(), other.to_string()),
        };
        Problem { key, what, fix: error.fix().to_string(), warning: false, error: Some(error) }
    }
}

/// `threshold: "30" is a string; write a whole number >= 1, e.g. 30`
impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}; {}", self.key, self.what, self.fix)
    }
}

/// Every problem of a config document, in the order `parse` meets them, warnings included.
pub fn problems(bytes: &[u8], home: &Path) -> Vec<Problem> {
    let mut c = Checker::default();
    c.run(bytes, home);
    c.problems
}

pub(super) fn check(bytes: &[u8], home: &Path) -> Result<Config, ConfigError> {
    let mut c = Checker::default();
    let config = c.run(bytes, home);
    match c.problems.into_iter().find_map(|p| p.error) {
        Some(e) => Err(e),
        None => Ok(config.expect("a document without errors yields a config")),
    }
}

#[derive(Default)]
struct Checker {
    problems: Vec<Problem>,
    /// Where each key is written, and its value's text as written ([`written::scan`]).
    written: written::Written,
}

impl Checker {
    fn error(&mut self, key: impl Into<String>, what: String, fix: &'static str, error: ConfigError) {
        self.problems.push(Problem { key: key.into(), what, fix: fix.into(), warning: false, error: Some(error) });
    }

    /// A problem with `v`, the value of `log_key` (or with its element `index`), logged as
    /// `config_malformed <log_key> value=<v> [index=<i>] reason=<what> fix=<fix>`.
    fn bad(&mut self, log_key: &'static str, index: Option<usize>, what: String, fix: &'static str, v: &Value) {
        let key = index.map_or_else(|| log_key.to_string(), |i| format!("{log_key}[{i}]"));
        // A string where the key takes none: its text, quoted (`value="30"`, never the number 30).
        let string = matches!(v, Value::String(_)) && !takes_string(log_key);
        let value = match (v, self.written.raw(log_key)) {
            // A number as the file writes it (`1e3`, 20 digits), not as a float prints it.
            (Value::Number(_), Some(raw)) if index.is_none() => raw.as_bytes().to_vec(),
            (Value::String(t), _) if string => t.as_bytes()[..t.len().min(MAX_SHOWN_VALUE + 1)].to_vec(),
            _ => shown_value(v, takes_string(log_key)),
        };
        let error = ConfigError::Value { key: log_key, value, string, index, why: what.clone(), fix };
        self.error(key, what, fix, error);
    }

    /// `v`, the value of `path`, as a problem quotes it: a number as written in the file.
    fn shown_at(&self, path: &str, v: &Value) -> String {
        match (v, self.written.raw(path)) {
            (Value::Number(_), Some(raw)) => escape::text_capped(raw.as_bytes(), 60),
            _ => shown(v),
        }
    }

    /// A key written more than once: serde (and so the daemon) uses the last one, which a
    /// reader of the file may not expect (`threshold` 5 on line 2, 50 on line 9). A warning the
    /// daemon logs once (`WARN config_repeated_key`), an error for `validate`.
    fn repeated(&mut self, config: &mut Config) {
        let repeated: Vec<written::Occurrences> = self.written.repeated().cloned().collect();
        for k in repeated {
            // A line named once (a file written on one line repeats a key on the same line).
            let mut distinct = k.lines.clone();
            distinct.dedup();
            let mut lines: Vec<String> = distinct.iter().map(|l| l.to_string()).collect();
            if k.count > k.lines.len() {
                lines.push("…".into());
            }
            let last = lines.pop().unwrap_or_default();
            let on = match lines.is_empty() {
                true => format!("line {last}"),
                false => format!("lines {} and {last}", lines.join(", ")),
            };
            let what = format!("is written {} times ({on}); the daemon uses the last one", k.count);
            self.warn(escape::text(k.path.as_bytes()), what, "keep only the one you mean".into());
            config.repeated_keys.push(RepeatedKey { key: k.path, lines: k.lines, count: k.count });
        }
    }

    fn warn(&mut self, key: String, what: String, fix: String) {
        self.problems.push(Problem { key, what, fix, warning: true, error: None });
    }

    fn run(&mut self, bytes: &[u8], home: &Path) -> Option<Config> {
        let doc = match super::doc::read(bytes) {
            Ok(d) => d,
            Err(e) => {
                let (line, column) = (e.line(), e.column());
                let msg = e.to_string();
                let msg = msg.split(" at line ").next().unwrap_or(&msg);
                let msg = if msg == "recursion limit exceeded" {
                    format!("nested deeper than {MAX_JSON_DEPTH} levels")
                } else {
                    msg.to_string()
                };
                let what = format!("invalid JSON at line {line} column {column} ({msg})");
                let error = ConfigError::Json { line, column, why: what.clone(), fix: FIX_JSON };
                self.error("json", what, FIX_JSON, error);
                return None;
            }
        };
        self.written = written::scan(bytes);
        let root = doc.root;
        let Value::Object(map) = root else {
            // Valid JSON, but not an object: point at where the value starts.
            let (line, column) = first_non_space(bytes);
            let what = format!("{} is {}", shown(&root), kind(&root));
            self.error("top level", what.clone(), FIX_TOP, ConfigError::Json { line, column, why: what, fix: FIX_TOP });
            return None;
        };
        let mut c = Config {
            threshold: DEFAULT_THRESHOLD,
            timeout: DEFAULT_TIMEOUT,
            excludes: DEFAULT_EXCLUDES.iter().map(|s| s.to_string()).collect(),
            exclude_commands: DEFAULT_EXCLUDE_COMMANDS.iter().map(|s| s.to_string()).collect(),
            log_max_bytes: (DEFAULT_LOG_MAX_MB * 1048576.0) as u64,
            state_file: expand_tilde(DEFAULT_STATE_FILE, home),
            warn_before: DEFAULT_WARN_BEFORE,
            repeat_after: DEFAULT_REPEAT_AFTER,
            stall_watch: Some(DEFAULT_STALL_WATCH),
            sessions: None,
            slots: Vec::new(),
            unknown_keys: Vec::new(),
            unknown_keys_unlisted: 0,
            repeated_keys: Vec::new(),
        };
        // KNOWN_KEYS order: the first problem found is the one the ERROR line reports.
        for &key in KNOWN_KEYS {
            let Some(v) = map.get(key) else { continue };
            if doc.cut.contains(&key) {
                let what = format!("holds more than {} JSON values", super::doc::MAX_KEY_VALUES);
                self.bad(key, None, what, FIX_TOO_BIG, v);
                continue;
            }
            match key {
                "threshold" => match whole(
                    v,
                    self.written.raw(key),
                    1,
                    MAX_THRESHOLD as u64,
                    " (no account can have more processes)",
                ) {
                    Ok(n) => c.threshold = n as u32,
                    Err(what) => self.bad("threshold", None, what, FIX_THRESHOLD, v),
                },
                "timeout" => match duration(v, self.written.raw(key), MAX_TIMEOUT) {
                    Ok(d) => c.timeout = d,
                    Err(what) => self.bad("timeout", None, what, FIX_TIMEOUT, v),
                },
                "excludes" => {
                    if let Some(list) = self.excludes(v) {
                        c.excludes = list;
                    }
                }
                "excludeCommands" => {
                    if let Some(list) = self.exclude_commands(v) {
                        c.exclude_commands = list;
                    }
                }
                "logMaxSizeMB" => {
                    let shown = self.shown_at(key, v);
                    match v.as_f64() {
                        Some(mb) if mb > 0.0 && mb <= MAX_LOG_MB => c.log_max_bytes = ((mb * 1048576.0) as u64).max(1),
                        Some(mb) if mb > MAX_LOG_MB => {
                            self.bad("logMaxSizeMB", None, format!("{shown} is more than {MAX_LOG_MB}"), FIX_LOG, v)
                        }
                        Some(_) => self.bad("logMaxSizeMB", None, format!("{shown} is not above 0"), FIX_LOG, v),
                        None => self.bad("logMaxSizeMB", None, format!("{shown} is {}", kind(v)), FIX_LOG, v),
                    }
                }
                "stateFile" => match state_file(v) {
                    Ok(s) => c.state_file = expand_tilde(s, home),
                    Err(what) => self.bad("stateFile", None, what, FIX_STATE, v),
                },
                "warnBefore" => match duration(v, self.written.raw(key), MAX_TIMEOUT) {
                    Ok(d) => c.warn_before = d,
                    Err(what) => self.bad("warnBefore", None, what, FIX_WARN_BEFORE, v),
                },
                "repeatAfter" => match whole(v, self.written.raw(key), 1, MAX_REPEAT_AFTER as u64, "") {
                    Ok(n) => c.repeat_after = n as u32,
                    Err(what) => self.bad("repeatAfter", None, what, FIX_REPEAT, v),
                },
                "stallWatch" => {
                    if let Some(s) = self.stall_watch(v) {
                        c.stall_watch = s;
                    }
                }
                "sessions" => {
                    if let Some(s) = self.sessions(v) {
                        c.sessions = s;
                    }
                }
                "slots" => {
                    if let Some(s) = self.slots(v) {
                        c.slots = s;
                    }
                }
                _ => unreachable!("every known key is checked"),
            }
        }
        self.repeated(&mut c);
        for key in doc.unknown {
            let fix = match closest(&key, KNOWN_KEYS) {
                Some(k) => format!("did you mean \"{k}\"? (an unknown key is ignored)"),
                None => format!("remove it; the keys are {}", KNOWN_KEYS.join(", ")),
            };
            self.warn(escape::text(key.as_bytes()), "is not a key guard knows, so it is ignored".into(), fix);
            c.unknown_keys.push(key);
        }
        if doc.more_unknown > 0 {
            c.unknown_keys_unlisted = doc.more_unknown;
            self.warn(
                "unknown keys".into(),
                format!("{} more keys guard does not know are not listed one by one", doc.more_unknown),
                format!("remove them; the keys are {}", KNOWN_KEYS.join(", ")),
            );
        }
        Some(c)
    }

    fn excludes(&mut self, v: &Value) -> Option<Vec<String>> {
        let Value::Array(items) = v else {
            self.bad("excludes", None, format!("{} is {}", shown(v), kind(v)), FIX_EXCLUDES, v);
            return None;
        };
        let before = self.problems.len();
        if items.len() > MAX_EXCLUDES {
            let what = format!("{} names, more than {MAX_EXCLUDES}", items.len());
            self.bad("excludes", None, what, FIX_EXCLUDES_COUNT, v);
        }
        let mut names = Vec::with_capacity(items.len().min(MAX_EXCLUDES));
        for (i, item) in items.iter().enumerate() {
            let what = match item {
                Value::String(s) if s.contains('\0') => "contains a NUL character".to_string(),
                Value::String(s) if s.len() > MAX_EXCLUDE_LEN => {
                    format!("is {} bytes long, more than {MAX_EXCLUDE_LEN}", s.len())
                }
                Value::String(s) => {
                    names.push(s.clone());
                    continue;
                }
                other => format!("{} is {}", shown(other), kind(other)),
            };
            self.bad("excludes", Some(i), what, FIX_EXCLUDE_NAME, v);
        }
        (self.problems.len() == before).then_some(names)
    }

    fn exclude_commands(&mut self, v: &Value) -> Option<Vec<String>> {
        self.patterns(PatternList::ExcludeCommands, v)
    }

    /// A list of patterns under `list` (`excludeCommands`, `sessions.roots`): the same static
    /// bounds for both, so neither can hold what the matcher refuses to compile.
    fn patterns(&mut self, list: PatternList, v: &Value) -> Option<Vec<String>> {
        let key = list.key();
        let Value::Array(items) = v else {
            self.bad(key, None, format!("{} is {}", shown(v), kind(v)), FIX_PATTERNS, v);
            return None;
        };
        let before = self.problems.len();
        let mut patterns = Vec::with_capacity(items.len().min(MAX_PATTERNS + 1));
        for (i, item) in items.iter().enumerate() {
            match item {
                Value::String(s) => patterns.push(s.clone()),
                other => {
                    let what = format!("{} is {}", shown(other), kind(other));
                    self.bad(key, Some(i), what, FIX_PATTERN, v);
                }
            }
        }
        if self.problems.len() > before {
            return None;
        }
        for issue in check_patterns_static(&patterns) {
            match issue.index {
                None => self.bad(key, None, issue.what, FIX_PATTERN, v),
                Some(i) => {
                    // A pattern too costly to match safely needs another fix than a malformed one.
                    let fix = if issue.what.starts_with("is too costly") { FIX_COSTLY } else { FIX_PATTERN };
                    let error = ConfigError::Pattern {
                        list,
                        pattern: prefix(&patterns[i]),
                        index: Some(i),
                        why: issue.what.clone(),
                        fix,
                    };
                    self.error(format!("{key}[{i}]"), issue.what, fix, error);
                }
            }
        }
        (self.problems.len() == before).then_some(patterns)
    }

    /// `Some(setting)` when valid (`Some(None)` = off), `None` after reporting a problem.
    fn stall_watch(&mut self, v: &Value) -> Option<Option<StallWatch>> {
        let map: &Map<String, Value> = match v {
            Value::Bool(false) => return Some(None),
            Value::Bool(true) => return Some(Some(DEFAULT_STALL_WATCH)),
            Value::Object(m) => m,
            other => {
                self.bad("stallWatch", None, format!("{} is {}", shown(other), kind(other)), FIX_STALL, v);
                return None;
            }
        };
        let before = self.problems.len();
        let mut s = DEFAULT_STALL_WATCH;
        if let Some(cpu) = map.get("peggedCpu") {
            let shown = self.shown_at("stallWatch.peggedCpu", cpu);
            match cpu.as_f64() {
                Some(x) if x > 0.0 && x <= MAX_PEGGED_CPU => s.pegged_cpu = x,
                Some(_) => {
                    let what = format!("{shown} is not above 0 and at most {MAX_PEGGED_CPU}");
                    self.bad("stallWatch.peggedCpu", None, what, FIX_PEGGED_CPU, cpu);
                }
                None => {
                    let what = format!("{shown} is {}", kind(cpu));
                    self.bad("stallWatch.peggedCpu", None, what, FIX_PEGGED_CPU, cpu);
                }
            }
        }
        if let Some(window) = map.get("peggedFor") {
            match duration(window, self.written.raw("stallWatch.peggedFor"), MAX_PEGGED_FOR) {
                Ok(d) if d >= MIN_PEGGED_FOR => s.pegged_for = d,
                Ok(_) => {
                    let what = format!("{} is shorter than 10s", self.shown_at("stallWatch.peggedFor", window));
                    self.bad("stallWatch.peggedFor", None, what, FIX_PEGGED_FOR, window);
                }
                Err(what) => self.bad("stallWatch.peggedFor", None, what, FIX_PEGGED_FOR, window),
            }
        }
        for key in map.keys().filter(|k| !matches!(k.as_str(), "peggedCpu" | "peggedFor")) {
            let fix = match closest(key, &["peggedCpu", "peggedFor"]) {
                Some(k) => format!("did you mean \"{k}\"? (an unknown key is ignored)"),
                None => "remove it; stallWatch holds peggedCpu and peggedFor".to_string(),
            };
            self.warn(
                format!("stallWatch.{}", shown_key(key)),
                "is not a key guard knows, so it is ignored".into(),
                fix,
            );
        }
        (self.problems.len() == before).then_some(Some(s))
    }
}

/// A whole number in `min..=max`, or what is wrong with `v`. `written` is the value's text in
/// the file when the scanner found it: problems quote it (`1e3`, a 20-digit number as written),
/// and it decides whether a number written with an exponent or a fraction (`1e3`, `30.0`) is
/// whole, exactly (a float cannot tell `30.0000000000000001` from 30). Such a number is taken:
/// JSON has one kind of number, and `1e3` is 1000.
fn whole(v: &Value, written: Option<&str>, min: u64, max: u64, why_max: &str) -> Result<u64, String> {
    let shown = match (v, written) {
        (Value::Number(_), Some(raw)) => escape::text_capped(raw.as_bytes(), 60),
        _ => shown(v),
    };
    let Value::Number(n) = v else { return Err(format!("{shown} is {}", kind(v))) };
    if let Some(u) = n.as_u64() {
        return if u < min {
            Err(format!("{shown} is below {min}"))
        } else if u > max {
            Err(format!("{shown} is more than {max}{why_max}"))
        } else {
            Ok(u)
        };
    }
    // Not a u64: a negative number, one beyond u64, or one written with a fraction or an exponent.
    let f = n.as_f64().unwrap_or(f64::NAN);
    let integral = written.and_then(is_whole_literal).unwrap_or(f.fract() == 0.0);
    if f < 0.0 {
        Err(format!("{shown} is negative"))
    } else if !integral {
        Err(format!("{shown} is not a whole number"))
    } else if f > max as f64 {
        Err(format!("{shown} is more than {max}{why_max}"))
    } else if f < min as f64 {
        Err(format!("{shown} is below {min}"))
    } else {
        Ok(f as u64)
    }
}

/// Whether a JSON number literal (`-1.50e2`) is a whole number, decided on its digits: the
/// digits left after the exponent moves the point are all zeros. `None` when it is not a
/// number literal (the float's answer is used then).
fn is_whole_literal(raw: &str) -> Option<bool> {
    let raw = raw.strip_prefix('-').unwrap_or(raw);
    let (mantissa, exp) = match raw.find(['e', 'E']) {
        Some(i) => (&raw[..i], raw[i + 1..].parse::<i64>().ok()?),
        None => (raw, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int.is_empty() || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    // The fraction's digits that stay after the point once the exponent moved it.
    let kept = frac.len() as i64 - exp.max(0);
    let lost_int = (-exp).max(0); // a negative exponent moves integer digits behind the point too
    let after: Vec<u8> =
        int.bytes().rev().take(lost_int as usize).chain(frac.bytes().rev().take(kept.max(0) as usize)).collect();
    Some(after.iter().all(|&b| b == b'0'))
}

/// A duration as `timeout` takes it (a unit string, whole seconds, or a digit string), at
/// most `max`, or what is wrong with `v` (`written`: as for [`whole`]).
fn duration(v: &Value, written: Option<&str>, max: Duration) -> Result<Duration, String> {
    let most = if max == MAX_TIMEOUT { "1 year".to_string() } else { crate::duration::human(max) };
    match v {
        Value::String(s) => parse_duration_max(s, max).map_err(|e| match e {
            DurationError::Malformed { .. } => format!("{} is not a duration", shown(v)),
            DurationError::TooLong { .. } => format!("{} is more than {most}", shown(v)),
        }),
        Value::Number(_) => whole(v, written, 0, max.as_secs(), &format!(" seconds ({most})")).map(Duration::from_secs),
        other => Err(format!("{} is {}", shown(other), kind(other))),
    }
}

fn state_file(v: &Value) -> Result<&str, String> {
    let Value::String(s) = v else { return Err(format!("{} is {}", shown(v), kind(v))) };
    if s.is_empty() {
        Err("is empty".into())
    } else if s.contains(char::is_control) {
        Err(format!("{} contains a control character (a newline, a tab, …)", shown(v)))
    } else if s.len() > MAX_STATE_FILE_LEN {
        Err(format!("is {} bytes long, more than {MAX_STATE_FILE_LEN}", s.len()))
    } else {
        Ok(s)
    }
}

/// The known key an unknown one was probably meant to be (same ignoring case, or at most two
/// edits away).
/// An unknown key inside a known one (`stallWatch`, `sessions`, a slot), escaped and cut as a
/// top-level one is ([`super::doc::MAX_KEY_SHOWN`] bytes): the account may write a 1 MiB key.
pub(super) fn shown_key(key: &str) -> String {
    escape::text_capped(key.as_bytes(), super::doc::MAX_KEY_SHOWN)
}

fn closest<'a>(key: &str, known: &[&'a str]) -> Option<&'a str> {
    if key.len() > 64 {
        return None;
    }
    known
        .iter()
        .map(|k| (edits(&key.to_ascii_lowercase(), &k.to_ascii_lowercase()), *k))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, k)| k)
}

/// Levenshtein distance between two short strings.
fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

fn first_non_space(bytes: &[u8]) -> (usize, usize) {
    let (mut line, mut column) = (1, 1);
    for &b in bytes {
        match b {
            b'\n' => {
                line += 1;
                column = 1;
            }
            b' ' | b'\t' | b'\r' => column += 1,
            _ => break,
        }
    }
    (line, column)
}
