//! The operator's configuration (SPEC §3), read and validated on every tick.
//!
//! [`parse`] takes bytes, so tests feed it directly; [`load`] adds the file. A [`ConfigError`]
//! displays as the reason of its `ERROR` log line (`config_malformed threshold value=0`), which is
//! also what `check` prints after "is invalid:".
use std::{
    io::Read,
    path::{Path, PathBuf},
    time::Duration,
};

use serde_json::Value;

use crate::{duration::parse_duration, pattern::Pattern};

/// Configs beyond this size are refused rather than parsed (a config is a few hundred bytes).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

pub const DEFAULT_THRESHOLD: u32 = 30;
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3600);
pub const DEFAULT_EXCLUDES: &[&str] =
    &["bash", "sh", "dash", "zsh", "fish", "node", "python3", "docker", "claude", "systemd", "sshd", "tmux", "screen"];
pub const DEFAULT_EXCLUDE_COMMANDS: &[&str] = &[
    "(^|[ /])agentihooks swarm tick( |$)",
    " -m scripts[.]swarm[.]scheduled_tick( |$)",
    "(^|[ /])agentihooks select-profile( |$)",
    "(^|[ /])agentihooks swarm (tick-watch|prober|waker)( |$)",
];
pub const DEFAULT_LOG_MAX_MB: f64 = 10.0;
pub const DEFAULT_STATE_FILE: &str = "~/guard-daemon-state.json";

const KNOWN_KEYS: &[&str] = &["threshold", "timeout", "excludes", "excludeCommands", "logMaxSizeMB", "stateFile"];

/// A validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Live processes of one name that flag the name.
    pub threshold: u32,
    /// How long a flagged name stays at/over the threshold before it is enforced.
    pub timeout: Duration,
    /// Names never counted, compared ignoring ASCII case.
    pub excludes: Vec<String>,
    /// Command lines matching any of these are never ended.
    pub exclude_commands: Vec<Pattern>,
    /// Log rotation size in bytes.
    pub log_max_bytes: u64,
    /// Where flag clocks live, `~` already expanded.
    pub state_file: PathBuf,
    /// Keys we do not know: a warning, not an error (a newer config on an older guard).
    pub unknown_keys: Vec<String>,
}

impl Config {
    /// The configuration with every key at its default (`home` expands `~`).
    pub fn defaults(home: &Path) -> Config {
        parse(b"{}", home).expect("the defaults are valid")
    }

    pub fn is_excluded(&self, name: &crate::comm::Comm) -> bool {
        self.excludes.iter().any(|e| name.eq_ignore_case(e))
    }

    /// The first `excludeCommands` pattern matching `cmdline`, if any.
    pub fn excluding_pattern(&self, cmdline: &[u8]) -> Option<&Pattern> {
        self.exclude_commands.iter().find(|p| p.is_match(cmdline))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config_missing path={}", path.display())]
    Missing { path: PathBuf },
    #[error("config_unreadable path={} error={source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("config_malformed json line={line} column={column}")]
    Json { line: usize, column: usize },
    #[error("config_malformed {key} value={value}")]
    Value { key: &'static str, value: String },
    #[error("config_malformed excludeCommands pattern={pattern}")]
    Pattern { pattern: String },
}

impl ConfigError {
    /// A hint for humans (stderr of `match`/`check`), beyond the log line's reason.
    pub fn fix(&self) -> &'static str {
        match self {
            ConfigError::Missing { .. } => "create it (guard-user install links the shipped config)",
            ConfigError::Io { .. } => "make it readable by root",
            ConfigError::Json { .. } => "fix the JSON syntax at that position",
            ConfigError::Value { key, .. } => match *key {
                "threshold" => "threshold must be an integer >= 1",
                "timeout" => "timeout must be \"<n>h\", \"<n>m\", \"<n>s\" or whole seconds",
                "excludes" => "excludes must be an array of process names",
                "excludeCommands" => "excludeCommands must be an array of strings",
                "logMaxSizeMB" => "logMaxSizeMB must be a number > 0",
                "stateFile" => "stateFile must be a non-empty path string",
                _ => "see SPEC §3",
            },
            ConfigError::Pattern { .. } => "write a valid bash extended regex (test it with guard-user match)",
        }
    }
}

/// Reads and validates the config file. Follows a symlink at `path` (the config is usually a
/// link into a checkout); it is only read.
pub fn load(path: &Path, home: &Path) -> Result<Config, ConfigError> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(ConfigError::Missing { path: path.into() }),
        Err(e) => return Err(ConfigError::Io { path: path.into(), source: e }),
    };
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ConfigError::Io { path: path.into(), source: e })?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(ConfigError::Value { key: "size", value: format!(">{MAX_CONFIG_BYTES}B") });
    }
    parse(&bytes, home)
}

/// Validates config bytes. `home` expands a leading `~` in `stateFile`.
pub fn parse(bytes: &[u8], home: &Path) -> Result<Config, ConfigError> {
    let root: Value = serde_json::from_slice(bytes).map_err(|e| ConfigError::Json { line: e.line(), column: e.column() })?;
    let Value::Object(map) = root else {
        // Valid JSON, but not an object: point at where the value starts.
        let (line, column) = first_non_space(bytes);
        return Err(ConfigError::Json { line, column });
    };
    let bad = |key: &'static str, v: &Value| ConfigError::Value { key, value: raw(v) };

    let threshold = match map.get("threshold") {
        None => DEFAULT_THRESHOLD,
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 && n <= u32::MAX as u64 => n as u32,
            _ => return Err(bad("threshold", v)),
        },
    };
    let timeout = match map.get("timeout") {
        None => DEFAULT_TIMEOUT,
        Some(Value::String(s)) => parse_duration(s).map_err(|_| bad("timeout", &map["timeout"]))?,
        Some(v) => match v.as_u64() {
            Some(n) => Duration::from_secs(n),
            None => return Err(bad("timeout", v)),
        },
    };
    let excludes = match map.get("excludes") {
        None => DEFAULT_EXCLUDES.iter().map(|s| s.to_string()).collect(),
        Some(v) => strings(v).ok_or_else(|| bad("excludes", v))?,
    };
    let exclude_commands = match map.get("excludeCommands") {
        None => DEFAULT_EXCLUDE_COMMANDS.iter().map(|p| Pattern::new(p).expect("shipped patterns compile")).collect(),
        Some(v) => {
            let list = strings(v).ok_or_else(|| bad("excludeCommands", v))?;
            list.into_iter()
                .map(|p| Pattern::new(&p).map_err(|_| ConfigError::Pattern { pattern: p }))
                .collect::<Result<Vec<_>, _>>()?
        }
    };
    let log_max_bytes = match map.get("logMaxSizeMB") {
        None => (DEFAULT_LOG_MAX_MB * 1048576.0) as u64,
        Some(v) => match v.as_f64() {
            Some(mb) if mb > 0.0 && mb.is_finite() && mb * 1048576.0 < u64::MAX as f64 => ((mb * 1048576.0) as u64).max(1),
            _ => return Err(bad("logMaxSizeMB", v)),
        },
    };
    let state_file = match map.get("stateFile") {
        None => expand_tilde(DEFAULT_STATE_FILE, home),
        Some(Value::String(s)) if !s.is_empty() && !s.contains('\0') => expand_tilde(s, home),
        Some(v) => return Err(bad("stateFile", v)),
    };
    let unknown_keys = map.keys().filter(|k| !KNOWN_KEYS.contains(&k.as_str())).cloned().collect();
    Ok(Config { threshold, timeout, excludes, exclude_commands, log_max_bytes, state_file, unknown_keys })
}

/// `~` and `~/x` expand to the account's home (the `--home` directory in tests); other paths
/// are taken as written, relative ones against the home.
pub fn expand_tilde(path: &str, home: &Path) -> PathBuf {
    if path == "~" {
        home.to_path_buf()
    } else if let Some(rest) = path.strip_prefix("~/") {
        home.join(rest)
    } else {
        home.join(path) // an absolute `path` replaces `home` entirely
    }
}

fn strings(v: &Value) -> Option<Vec<String>> {
    v.as_array()?.iter().map(|e| e.as_str().map(str::to_string)).collect()
}

/// A value as the log shows it: strings without quotes, anything else as compact JSON,
/// capped so a huge value cannot make a huge log line.
fn raw(v: &Value) -> String {
    let mut s = match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if s.len() > 200 {
        let mut cut = 200;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s.replace(['\n', '\r'], " ")
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

#[cfg(test)]
mod tests {
    use super::*;

    fn home() -> PathBuf {
        PathBuf::from("/home/u")
    }

    fn err(json: &str) -> String {
        parse(json.as_bytes(), &home()).unwrap_err().to_string()
    }

    #[test]
    fn an_empty_object_takes_every_default() {
        let c = parse(b"{}", &home()).unwrap();
        assert_eq!(c.threshold, 30);
        assert_eq!(c.timeout, Duration::from_secs(3600));
        assert_eq!(c.excludes.len(), 13);
        assert_eq!(c.exclude_commands.len(), 4);
        assert_eq!(c.log_max_bytes, 10 << 20);
        assert_eq!(c.state_file, PathBuf::from("/home/u/guard-daemon-state.json"));
    }

    #[test]
    fn timeout_accepts_units_integers_and_digit_strings() {
        for (j, s) in [(r#""2h""#, 7200), (r#""5m""#, 300), (r#""9s""#, 9), ("120", 120), (r#""120""#, 120)] {
            let c = parse(format!(r#"{{"timeout": {j}}}"#).as_bytes(), &home()).unwrap();
            assert_eq!(c.timeout, Duration::from_secs(s), "{j}");
        }
    }

    #[test]
    fn wrong_types_and_ranges_name_the_key_and_the_value() {
        assert_eq!(err(r#"{"threshold": 0}"#), "config_malformed threshold value=0");
        assert_eq!(err(r#"{"threshold": "30"}"#), "config_malformed threshold value=30");
        assert_eq!(err(r#"{"threshold": 2.5}"#), "config_malformed threshold value=2.5");
        assert_eq!(err(r#"{"timeout": "1d"}"#), "config_malformed timeout value=1d");
        assert_eq!(err(r#"{"timeout": -5}"#), "config_malformed timeout value=-5");
        assert_eq!(err(r#"{"excludes": "bash"}"#), "config_malformed excludes value=bash");
        assert_eq!(err(r#"{"excludes": [1]}"#), "config_malformed excludes value=[1]");
        assert_eq!(err(r#"{"logMaxSizeMB": 0}"#), "config_malformed logMaxSizeMB value=0");
        assert_eq!(err(r#"{"stateFile": 3}"#), "config_malformed stateFile value=3");
        assert_eq!(err(r#"{"excludeCommands": ["ok", "(unclosed"]}"#), "config_malformed excludeCommands pattern=(unclosed");
    }

    #[test]
    fn invalid_json_reports_line_and_column() {
        assert_eq!(err("{\n  \"threshold\": 3,\n}"), "config_malformed json line=3 column=1");
        assert_eq!(err(""), "config_malformed json line=1 column=0");
        assert_eq!(err("  [1]"), "config_malformed json line=1 column=3");
    }

    #[test]
    fn unknown_keys_are_kept_as_warnings_not_errors() {
        let c = parse(br#"{"threshold": 3, "colour": "blue"}"#, &home()).unwrap();
        assert_eq!(c.unknown_keys, vec!["colour".to_string()]);
    }

    #[test]
    fn deeply_nested_json_is_an_error_not_a_crash() {
        let deep = format!(r#"{{"x": {}{}}}"#, "[".repeat(100_000), "]".repeat(100_000));
        assert!(err(&deep).starts_with("config_malformed json"));
    }

    #[test]
    fn state_file_tilde_expands_to_the_home() {
        let c = parse(br#"{"stateFile": "~/s/state.json"}"#, &home()).unwrap();
        assert_eq!(c.state_file, PathBuf::from("/home/u/s/state.json"));
        let c = parse(br#"{"stateFile": "/var/lib/g.json"}"#, &home()).unwrap();
        assert_eq!(c.state_file, PathBuf::from("/var/lib/g.json"));
    }

    #[test]
    fn excludes_compare_ignoring_case() {
        let c = parse(br#"{"excludes": ["Sleep"]}"#, &home()).unwrap();
        assert!(c.is_excluded(&crate::comm::Comm::new(b"sleep")));
        assert!(!c.is_excluded(&crate::comm::Comm::new(b"sleeper")));
    }
}
