//! The validators behind both [`super::parse`] (first problem = the ERROR line) and
//! [`problems`] (`guard-user validate`: every problem, each with its fix). One pass over the
//! document builds the `Config` and the problem list together, so the two cannot disagree.
use std::{fmt, path::Path, time::Duration};

use serde_json::{Map, Value};

use super::*;

#[path = "sessions.rs"]
mod sessions;
#[path = "slots.rs"]
mod slots;
pub use slots::{all_patterns as all_slot_patterns, slot_of_pattern};

use crate::{
    duration::{parse_duration_max, DurationError},
    pattern::PatternSetError,
};

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
    pub fn error(&self) -> Option<&ConfigError> {
        self.error.as_ref()
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
        other => pattern_problem(list, index, pattern, &other.to_string()),
    }
}

/// `list` is the key the patterns are under: `excludeCommands` or `sessions.roots`.
fn pattern_problem(list: PatternList, index: Option<usize>, pattern: &str, reason: &str) -> Problem {
    let key = index.map_or_else(|| list.key().to_string(), |i| format!("{}[{i}]", list.key()));
    let what = format!(
        "\"{}\" is not a valid bash extended regex ({})",
        escape::text_capped(pattern.as_bytes(), 60),
        // The matcher's own fixed text: nothing of the account's to escape.
        reason.chars().filter(|c| !c.is_control()).collect::<String>()
    );
    let fix = FIX_INVALID_PATTERN;
    let error = ConfigError::Pattern { list, pattern: prefix(pattern), index, why: what.clone(), fix };
    Problem { key, what, fix: fix.into(), warning: false, error: Some(error) }
}

/// The config error of an in-process compile of `excludeCommands` (tests compare with it).
#[cfg(test)]
pub(super) fn pattern_error(list: PatternList, index: Option<usize>, pattern: &str, reason: &str) -> ConfigError {
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
}

impl Checker {
    fn error(&mut self, key: impl Into<String>, what: String, fix: &'static str, error: ConfigError) {
        self.problems.push(Problem { key: key.into(), what, fix: fix.into(), warning: false, error: Some(error) });
    }

    /// A problem with `v`, the value of `log_key` (or with its element `index`), logged as
    /// `config_malformed <log_key> value=<v> [index=<i>] reason=<what> fix=<fix>`.
    fn bad(&mut self, log_key: &'static str, index: Option<usize>, what: String, fix: &'static str, v: &Value) {
        let key = index.map_or_else(|| log_key.to_string(), |i| format!("{log_key}[{i}]"));
        let value = shown_value(v, takes_string(log_key));
        self.error(key, what.clone(), fix, ConfigError::Value { key: log_key, value, index, why: what, fix });
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
                "threshold" => match whole(v, 1, MAX_THRESHOLD as u64, " (no account can have more processes)") {
                    Ok(n) => c.threshold = n as u32,
                    Err(what) => self.bad("threshold", None, what, FIX_THRESHOLD, v),
                },
                "timeout" => match duration(v, MAX_TIMEOUT) {
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
                "logMaxSizeMB" => match v.as_f64() {
                    Some(mb) if mb > 0.0 && mb <= MAX_LOG_MB => c.log_max_bytes = ((mb * 1048576.0) as u64).max(1),
                    Some(mb) if mb > MAX_LOG_MB => {
                        self.bad("logMaxSizeMB", None, format!("{} is more than {MAX_LOG_MB}", shown(v)), FIX_LOG, v)
                    }
                    Some(_) => self.bad("logMaxSizeMB", None, format!("{} is not above 0", shown(v)), FIX_LOG, v),
                    None => self.bad("logMaxSizeMB", None, format!("{} is {}", shown(v), kind(v)), FIX_LOG, v),
                },
                "stateFile" => match state_file(v) {
                    Ok(s) => c.state_file = expand_tilde(s, home),
                    Err(what) => self.bad("stateFile", None, what, FIX_STATE, v),
                },
                "warnBefore" => match duration(v, MAX_TIMEOUT) {
                    Ok(d) => c.warn_before = d,
                    Err(what) => self.bad("warnBefore", None, what, FIX_WARN_BEFORE, v),
                },
                "repeatAfter" => match whole(v, 1, MAX_REPEAT_AFTER as u64, "") {
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
            match cpu.as_f64() {
                Some(x) if x > 0.0 && x <= MAX_PEGGED_CPU => s.pegged_cpu = x,
                Some(_) => {
                    let what = format!("{} is not above 0 and at most {MAX_PEGGED_CPU}", shown(cpu));
                    self.bad("stallWatch.peggedCpu", None, what, FIX_PEGGED_CPU, cpu);
                }
                None => {
                    let what = format!("{} is {}", shown(cpu), kind(cpu));
                    self.bad("stallWatch.peggedCpu", None, what, FIX_PEGGED_CPU, cpu);
                }
            }
        }
        if let Some(window) = map.get("peggedFor") {
            match duration(window, MAX_PEGGED_FOR) {
                Ok(d) if d >= MIN_PEGGED_FOR => s.pegged_for = d,
                Ok(_) => {
                    let what = format!("{} is shorter than 10s", shown(window));
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
                format!("stallWatch.{}", escape::text(key.as_bytes())),
                "is not a key guard knows, so it is ignored".into(),
                fix,
            );
        }
        (self.problems.len() == before).then_some(Some(s))
    }
}

/// A whole number in `min..=max`, or what is wrong with `v`.
fn whole(v: &Value, min: u64, max: u64, why_max: &str) -> Result<u64, String> {
    let Value::Number(n) = v else { return Err(format!("{} is {}", shown(v), kind(v))) };
    if let Some(u) = n.as_u64() {
        return if u < min {
            Err(format!("{u} is below {min}"))
        } else if u > max {
            Err(format!("{u} is more than {max}{why_max}"))
        } else {
            Ok(u)
        };
    }
    // Not a u64: a negative integer, or a number JSON wrote with a fraction or an exponent.
    let f = n.as_f64().unwrap_or(f64::NAN);
    if f < 0.0 {
        Err(format!("{} is negative", shown(v)))
    } else if f.fract() != 0.0 || f <= max as f64 {
        Err(format!("{} is not a whole number", shown(v)))
    } else {
        Err(format!("{} is more than {max}{why_max}", shown(v)))
    }
}

/// A duration as `timeout` takes it (a unit string, whole seconds, or a digit string), at
/// most `max`, or what is wrong with `v`.
fn duration(v: &Value, max: Duration) -> Result<Duration, String> {
    let most = if max == MAX_TIMEOUT { "1 year".to_string() } else { crate::duration::human(max) };
    match v {
        Value::String(s) => parse_duration_max(s, max).map_err(|e| match e {
            DurationError::Malformed { .. } => format!("{} is not a duration", shown(v)),
            DurationError::TooLong { .. } => format!("{} is more than {most}", shown(v)),
        }),
        Value::Number(_) => whole(v, 0, max.as_secs(), &format!(" seconds ({most})")).map(Duration::from_secs),
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

/// What kind of JSON value `v` is, for "… is a string".
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `v` as a human reads it in a problem: JSON, escaped to one printable line, cut at 60 bytes.
fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => format!("\"{}\"", escape::text_capped(s.as_bytes(), 60)),
        other => escape::text_capped(&json_prefix(other, 61), 60),
    }
}

/// The keys whose value may be a string: theirs is shown as its text (`value=1d`).
fn takes_string(log_key: &str) -> bool {
    matches!(
        log_key,
        "timeout" | "warnBefore" | "stateFile" | "stallWatch.peggedFor" | "sessions.leftovers" | "sessions.grace"
    )
}

/// A value as the log shows it (docs/log.md): a string where the key takes one as its text,
/// anything else as its compact JSON, so a value of the wrong type never passes for one of the
/// right type (`"30"` where a number belongs is `"30"`, not `30`). Only the first
/// [`MAX_SHOWN_VALUE`] + 1 bytes: the display cuts at [`MAX_SHOWN_VALUE`] (escaped) and a
/// megabyte value is never copied or serialized whole.
fn shown_value(v: &Value, takes_string: bool) -> Vec<u8> {
    match v {
        Value::String(s) if takes_string => s.as_bytes()[..s.len().min(MAX_SHOWN_VALUE + 1)].to_vec(),
        other => json_prefix(other, MAX_SHOWN_VALUE + 1),
    }
}

/// The first `limit` bytes of `v`'s compact JSON; serializing stops there.
fn json_prefix(v: &Value, limit: usize) -> Vec<u8> {
    struct Prefix(Vec<u8>, usize);
    impl std::io::Write for Prefix {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.1 - self.0.len());
            self.0.extend_from_slice(&buf[..n]);
            Ok(n) // 0 once full: serde_json stops with a WriteZero error
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut out = Prefix(Vec::new(), limit);
    let _ = serde_json::to_writer(&mut out, v);
    out.0
}

/// `s`, or its first [`MAX_SHOWN_VALUE`] + 1 bytes (to the next character boundary) when longer:
/// enough for the display to cut and mark the cut.
fn prefix(s: &str) -> String {
    let mut end = s.len().min(MAX_SHOWN_VALUE + 1);
    while !s.is_char_boundary(end) {
        end += 1;
    }
    s[..end].to_string()
}

/// The known key an unknown one was probably meant to be (same ignoring case, or at most two
/// edits away).
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
