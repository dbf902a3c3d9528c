//! The operator's configuration (docs/configuration.md), read and validated on every tick.
//!
//! [`parse`] takes bytes, so tests feed it directly; [`load`] adds the file, read as the account
//! ([`read_account_file`]: its rights, regular files only, at most [`MAX_CONFIG_BYTES`], never
//! blocking). [`problems`] lists every problem of a document with its fix (`guard-user
//! validate`); `parse` fails with the first of them, so the two can never disagree. A
//! [`ConfigError`] carries that problem's reason and fix: [`ConfigError::log_reason`] is the
//! `ERROR` line's text (`config_malformed threshold value="30" reason="\"30\" is a string"
//! fix="write a whole number >= 1, e.g. 30"`), which the status file, the Redis heartbeat, the
//! stream and `check` show as it is.
//!
//! Every value is bounded here (see the `MAX_…` constants for each bound and why), so nothing
//! downstream — deadline timers, rotation, the stall watch — meets a number it cannot hold.
//! `excludeCommands` stay strings: compiling them is the matcher's job, not the parser's.
use std::{
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
    time::Duration,
};

#[cfg(test)]
use crate::pattern::Pattern;
use crate::{
    escape,
    safefs::{read_account_file, Follow, FsIdentity, ReadError},
};

mod check;
mod doc;
#[cfg(test)]
mod tests;

pub use check::{
    all_slot_patterns, problems, refused_patterns, refused_patterns_of, slot_of_pattern, too_broad_root, Problem,
};

/// Configs beyond this size are refused without being read (a config is a few hundred bytes).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// The deepest nesting `parse` accepts: serde_json's recursion limit (128) refuses the 128th
/// level as `config_malformed json`, never a stack overflow. A real config nests two levels.
pub const MAX_JSON_DEPTH: usize = 127;
/// The kernel's `PID_MAX_LIMIT` on 64-bit: no account can ever have more processes, so a
/// larger threshold could never be reached and is a mistake.
pub const MAX_THRESHOLD: u32 = 4 * 1024 * 1024;
/// `timeout` and `warnBefore`: at most a year (see [`crate::duration::ONE_YEAR`]).
pub const MAX_TIMEOUT: Duration = crate::duration::ONE_YEAR;
/// 4 GiB: rotation beyond that is not rotation; the bound keeps the byte count far from overflow.
pub const MAX_LOG_MB: f64 = 4096.0;
/// A name enforced more than 1000 times a day is a loop whatever the setting; the bound also
/// caps the enforcement history the guard keeps per name for `REPEAT`.
pub const MAX_REPEAT_AFTER: u32 = 1000;
/// `stallWatch.peggedCpu` is in cores; 1024 is more than any host the guard runs on has.
pub const MAX_PEGGED_CPU: f64 = 1024.0;
/// `stallWatch.peggedFor` bounds: a window shorter than a few samples reports bursts, and one
/// longer than a day is no longer a "stall watch" (and would hold samples for a day).
pub const MIN_PEGGED_FOR: Duration = Duration::from_secs(10);
pub const MAX_PEGGED_FOR: Duration = Duration::from_secs(24 * 3600);
/// `excludes`: names are compared against 15-byte comms; 1024 names and 255 bytes are generous.
pub const MAX_EXCLUDES: usize = 1024;
pub const MAX_EXCLUDE_LEN: usize = 255;
/// `excludeCommands`: the static bounds checked before any compile (the matcher adds its own
/// bounds on compile and match cost).
pub const MAX_PATTERNS: usize = 256;
pub const MAX_PATTERN_LEN: usize = 1024;
/// Unknown keys one document lists (the rest are counted), and unknown keys the daemon warns
/// about one by one in a run (past it, one line says the rest are not reported): a config
/// written for a newer guard has a few; 256 of 200 bytes at most is ~50 KB kept for a run.
pub const MAX_UNKNOWN_KEYS: usize = 256;
/// `stateFile`: PATH_MAX including its NUL.
pub const MAX_STATE_FILE_LEN: usize = 4095;
/// The bytes of escaped text a config value or pattern is shown with (then `…`): the account
/// writes the config, so a megabyte string must still make a short `ERROR` line, status field
/// and heartbeat.
pub const MAX_SHOWN_VALUE: usize = 200;
/// The same for the reason a problem gives (validate's text; it quotes at most 60 bytes of the
/// value, so this bound is never reached by a reason guard wrote).
pub const MAX_SHOWN_REASON: usize = 400;

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
pub const DEFAULT_WARN_BEFORE: Duration = Duration::from_secs(600);
pub const DEFAULT_REPEAT_AFTER: u32 = 3;
pub const DEFAULT_STALL_WATCH: StallWatch = StallWatch { pegged_cpu: 0.75, pegged_for: Duration::from_secs(300) };

/// The keys docs/configuration.md defines, in the order they are checked (the first problem is the ERROR line).
pub const KNOWN_KEYS: &[&str] = &[
    "threshold",
    "timeout",
    "excludes",
    "excludeCommands",
    "logMaxSizeMB",
    "stateFile",
    "warnBefore",
    "repeatAfter",
    "stallWatch",
    "sessions",
    "slots",
];

/// The stall watch's settings (docs/configuration.md).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StallWatch {
    /// Cores a process must use in every sample of the window, in (0, 1024].
    pub pegged_cpu: f64,
    /// How long it must stay pegged before it is reported.
    pub pegged_for: Duration,
}

/// A validated configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Live processes of one name that flag the name.
    pub threshold: u32,
    /// How long a flagged name stays at/over the threshold before it is enforced.
    pub timeout: Duration,
    /// Names never flagged or ended (they are counted and shown), compared ignoring ASCII case.
    pub excludes: Vec<String>,
    /// Command lines matching any of these are never ended. Validated as text only (count,
    /// length, no NUL); the matcher compiles them.
    pub exclude_commands: Vec<String>,
    /// Log rotation size in bytes.
    pub log_max_bytes: u64,
    /// Where flag clocks live, `~` already expanded.
    pub state_file: PathBuf,
    /// One `WARNING` per incident this long before enforcement; zero turns it off.
    pub warn_before: Duration,
    /// Enforcements of one name within 24 h that log `REPEAT`.
    pub repeat_after: u32,
    /// The stall watch, `None` when turned off (`"stallWatch": false`).
    pub stall_watch: Option<StallWatch>,
    /// Session roots and their leftovers (docs/configuration.md); `None` when off.
    pub sessions: Option<Sessions>,
    /// Heavy-command slots (docs/configuration.md `slots`), in the order they are tried (by name);
    /// empty when off.
    pub slots: Vec<Slot>,
    /// Keys we do not know: a warning, not an error (a newer config on an older guard). At
    /// most [`MAX_UNKNOWN_KEYS`], sorted, each cut to 200 bytes (`…` marks a cut).
    pub unknown_keys: Vec<String>,
    /// Unknown keys past the [`MAX_UNKNOWN_KEYS`] kept: counted, not listed.
    pub unknown_keys_unlisted: usize,
    /// Keys written more than once (the last one is used): a warning for the daemon
    /// (`WARN config_repeated_key`), an error for `validate`. Only keys guard knows are
    /// tracked, so at most one entry per known key and member.
    pub repeated_keys: Vec<RepeatedKey>,
}

/// A key the file writes more than once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepeatedKey {
    /// `threshold`, `stallWatch.peggedCpu`.
    pub key: String,
    /// The lines of its first few occurrences (1-based).
    pub lines: Vec<usize>,
    /// How many times it is written.
    pub count: usize,
}

/// `sessions` (docs/configuration.md): which processes are session roots, and what happens to
/// what a root leaves behind when it ends.
#[derive(Clone, Debug, PartialEq)]
pub struct Sessions {
    /// Bash extended regexes on the command line, validated like `excludeCommands`.
    pub roots: Vec<String>,
    pub leftovers: Leftovers,
    /// How long after a root ends its session's live processes count as leftovers.
    pub grace: Duration,
}

/// What happens to a session's leftovers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leftovers {
    /// `LEFTOVER` lines only.
    Report,
    /// `LEFTOVER` lines, then SIGTERM, 10 s, SIGKILL, and one `REAPED` line.
    Stop,
}

impl Leftovers {
    pub fn token(self) -> &'static str {
        match self {
            Leftovers::Report => "report",
            Leftovers::Stop => "stop",
        }
    }
}

/// One heavy-command slot (docs/configuration.md `slots`): at most `max` process trees of a command
/// matching `commands` run at once for the account; the rest wait their turn (`queue`) or are
/// only reported (`report`).
#[derive(Clone, Debug, PartialEq)]
pub struct Slot {
    /// 1 to [`MAX_SLOT_NAME`] bytes of `[A-Za-z0-9_.-]`: written raw in lines, labels and rows.
    pub name: String,
    /// Bash extended regexes on the command line, validated like `excludeCommands`.
    pub commands: Vec<String>,
    /// Trees that may hold the slot at once.
    pub max: u32,
    /// A waiting command is let go after this long, never starved.
    pub max_wait: Duration,
    pub mode: SlotMode,
}

/// What a slot does to a command that finds it full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotMode {
    /// `SLOT_WAIT … mode=report` only; the command runs.
    Report,
    /// The command waits, frozen, for its turn.
    Queue,
}

/// Slots one config may name: each is a queue and a metric series; a host has a few kinds of
/// heavy command.
pub const MAX_SLOTS: usize = 16;
/// A slot's name, in bytes.
pub const MAX_SLOT_NAME: usize = 32;
/// Patterns of all the slots together: they are compiled into one list beside `excludeCommands`
/// (256), in a matcher of their own, so the list stays within the matcher's bounds.
pub const MAX_SLOT_PATTERNS: usize = 64;
/// `max` at most: more holders than that is no slot.
pub const MAX_SLOT_HOLDERS: u32 = 1024;
/// `maxWait` bounds and default.
pub const MIN_MAX_WAIT: Duration = Duration::from_secs(1);
pub const MAX_MAX_WAIT: Duration = Duration::from_secs(24 * 3600);
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(30 * 60);

/// `sessions.grace` when the key is absent.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);
/// `sessions.grace` at most: a day (a grace longer than that is a session that never ends).
pub const MAX_GRACE: Duration = Duration::from_secs(24 * 3600);

impl Config {
    /// The configuration with every key at its default (`home` expands `~`).
    #[cfg(any(test, feature = "testing"))]
    pub fn defaults(home: &Path) -> Config {
        parse(b"{}", home).expect("the defaults are valid")
    }

    pub fn is_excluded(&self, name: &crate::comm::Comm) -> bool {
        self.excludes.iter().any(|e| name.eq_ignore_case(e))
    }

    /// Compiles `excludeCommands` in this process with `regcomp` (the daemon compiles them in
    /// the sandboxed matcher; tests compare with this). The error is the pattern's
    /// `config_malformed excludeCommands pattern=…`.
    #[cfg(test)]
    pub(crate) fn compile_exclude_commands(&self) -> Result<Vec<Pattern>, ConfigError> {
        self.exclude_commands
            .iter()
            .enumerate()
            .map(|(i, p)| {
                Pattern::new(p)
                    .map_err(|e| check::pattern_error(PatternList::ExcludeCommands, Some(i), p, &e.to_string()))
            })
            .collect()
    }
}

/// The lists of patterns a config has (one byte, so [`ConfigError`] stays small).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatternList {
    ExcludeCommands,
    SessionsRoots,
    /// Every slot's `commands`, as one list (an index counts across the slots in their order).
    SlotCommands,
}

impl PatternList {
    /// The key the list is under.
    pub fn key(self) -> &'static str {
        match self {
            PatternList::ExcludeCommands => "excludeCommands",
            PatternList::SessionsRoots => "sessions.roots",
            PatternList::SlotCommands => "slots.commands",
        }
    }

    /// How the matcher's errors name a pattern of this list.
    pub fn source(self) -> crate::pattern::Source {
        match self {
            PatternList::ExcludeCommands => crate::pattern::Source::EXCLUDE_COMMANDS,
            PatternList::SessionsRoots => crate::pattern::Source::SESSIONS_ROOTS,
            PatternList::SlotCommands => crate::pattern::Source::SLOT_COMMANDS,
        }
    }
}

/// One static problem of an `excludeCommands` list: `index` names the pattern, or `None` for
/// the list as a whole (too many).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PatternIssue {
    pub index: Option<usize>,
    pub what: String,
}

/// The checks on `excludeCommands` that need no compile: at most [`MAX_PATTERNS`] patterns of
/// at most [`MAX_PATTERN_LEN`] bytes, none with a NUL (bash cannot hold one), none whose static
/// cost the bounded matcher refuses ([`crate::pattern::check_static`]: nested repeats that
/// multiply into millions of regex nodes are refused here, before any compile).
pub fn check_patterns_static(patterns: &[String]) -> Vec<PatternIssue> {
    let mut issues = Vec::new();
    if patterns.len() > MAX_PATTERNS {
        issues
            .push(PatternIssue { index: None, what: format!("{} patterns, more than {MAX_PATTERNS}", patterns.len()) });
    }
    for (i, p) in patterns.iter().enumerate() {
        if p.contains('\0') {
            issues.push(PatternIssue { index: Some(i), what: "contains a NUL character".into() });
        } else if p.len() > MAX_PATTERN_LEN {
            issues.push(PatternIssue {
                index: Some(i),
                what: format!("is {} bytes long, more than {MAX_PATTERN_LEN}", p.len()),
            });
        } else if let Err(crate::pattern::PatternSetError::TooCostly { why, .. }) =
            crate::pattern::check_static(std::slice::from_ref(p), &crate::pattern::Limits::default())
        {
            issues.push(PatternIssue { index: Some(i), what: format!("is too costly: {why}") });
        }
    }
    issues
}

/// Why a config cannot be used. `Display` is the head of the `ERROR` log line (what is wrong
/// where: `config_malformed threshold value=0`); [`ConfigError::log_reason`] adds validate's
/// reason and fix. Every value the account controls in either is escaped and quoted as log
/// values are, and cut to [`MAX_SHOWN_VALUE`].
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config_missing path={}", escape::log_value(path.as_os_str().as_bytes()))]
    Missing { path: PathBuf },
    /// Refused before parsing: not readable by the account, not a regular file, too large.
    #[error("config_unreadable path={} {}", escape::log_value(error.path().as_os_str().as_bytes()), error.log_fields())]
    Unreadable { error: ReadError },
    /// Not JSON, or JSON that is not an object.
    #[error("config_malformed json line={line} column={column}")]
    Json {
        line: usize,
        column: usize,
        /// validate's reason (`invalid JSON at line 3 column 1 (trailing comma)`).
        why: String,
        fix: &'static str,
    },
    /// A key's value is of the wrong type or out of bounds.
    #[error("config_malformed {key} value={}", shown_value(value, *string))]
    Value {
        key: &'static str,
        /// What the file holds: the text of a string, else the value's JSON (a number as the
        /// file writes it). At most [`MAX_SHOWN_VALUE`] + 1 bytes, so the display knows whether
        /// to cut.
        value: Vec<u8>,
        /// `value` is the text of a string where the key takes none: shown quoted whatever it
        /// holds (`value="30"` for the string "30"; the number 30 is `value=30`).
        string: bool,
        /// The element of a list (`excludes[3]`) the problem is about.
        index: Option<usize>,
        /// validate's reason (`"30" is a string`).
        why: String,
        fix: &'static str,
    },
    #[error("config_malformed {} pattern={}", list.key(), escape::log_value_capped(pattern.as_bytes(), MAX_SHOWN_VALUE))]
    Pattern {
        /// The list the pattern is in.
        list: PatternList,
        /// The pattern as written, or its first [`MAX_SHOWN_VALUE`] + 1 bytes or more.
        pattern: String,
        index: Option<usize>,
        why: String,
        fix: &'static str,
    },
}

/// `value=` of a `config_malformed` line: a log value, always quoted when it is a string's text.
fn shown_value(value: &[u8], string: bool) -> String {
    if string {
        escape::log_string_capped(value, MAX_SHOWN_VALUE)
    } else {
        escape::log_value_capped(value, MAX_SHOWN_VALUE)
    }
}

impl ConfigError {
    /// The `ERROR` line's token: the word [`log_reason`](Self::log_reason) starts with.
    pub fn what(&self) -> crate::log::What {
        use crate::log::What;
        match self {
            ConfigError::Missing { .. } => What::ConfigMissing,
            ConfigError::Unreadable { .. } => What::ConfigUnreadable,
            ConfigError::Json { .. } | ConfigError::Value { .. } | ConfigError::Pattern { .. } => What::ConfigMalformed,
        }
    }

    /// What to do about it, for humans (`check`, `validate`, stderr), beyond the log line's reason.
    pub fn fix(&self) -> &'static str {
        match self {
            ConfigError::Missing { .. } => "create it (guard-user install links the shipped config)",
            ConfigError::Unreadable { error } => error.fix(),
            ConfigError::Json { fix, .. } | ConfigError::Value { fix, .. } | ConfigError::Pattern { fix, .. } => fix,
        }
    }

    /// The `ERROR` line's text after `ERROR `: the head ([`Display`](std::fmt::Display)), the
    /// list element (`index=`), validate's reason (`reason=`, where the head has none of its own)
    /// and the fix (`fix=`), in the log's one grammar. The status file, the heartbeat, the stream
    /// and `check` show exactly this, so no two of them can say different things.
    pub fn log_reason(&self) -> String {
        use std::fmt::Write as _;
        let mut s = self.to_string();
        let (index, why) = match self {
            ConfigError::Value { index, why, .. } | ConfigError::Pattern { index, why, .. } => (*index, Some(why)),
            ConfigError::Json { why, .. } => (None, Some(why)),
            // `config_unreadable` has a `reason=` token of its own; a missing file needs none.
            ConfigError::Missing { .. } | ConfigError::Unreadable { .. } => (None, None),
        };
        if let Some(i) = index {
            let _ = write!(s, " index={i}");
        }
        if let Some(why) = why {
            let _ = write!(s, " reason={}", escape::log_value_capped(why.as_bytes(), MAX_SHOWN_REASON));
        }
        let _ = write!(s, " fix={}", escape::log_value(self.fix().as_bytes()));
        s
    }

    /// Whether the account itself was refused reading the file (as opposed to a bad file).
    pub fn is_permission_denied(&self) -> bool {
        matches!(self, ConfigError::Unreadable { error: ReadError::Denied { .. } })
    }
}

/// Reads the config file's bytes as the account (`who`). Follows a symlink at `path` (the
/// config is usually a link into a checkout), with the account's rights only.
pub fn read(path: &Path, who: FsIdentity) -> Result<Vec<u8>, ConfigError> {
    read_account_file(path, who, MAX_CONFIG_BYTES, Follow::Links).map_err(|error| match error {
        ReadError::NotFound { path } => ConfigError::Missing { path },
        error => ConfigError::Unreadable { error },
    })
}

/// Reads and validates the config file, as the account `who`.
pub fn load(path: &Path, home: &Path, who: FsIdentity) -> Result<Config, ConfigError> {
    parse(&read(path, who)?, home)
}

/// Validates config bytes. `home` expands a leading `~` in `stateFile`. The error is the first
/// of [`problems`].
pub fn parse(bytes: &[u8], home: &Path) -> Result<Config, ConfigError> {
    check::check(bytes, home)
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
