//! The config's keys as guard-user(8) lists them in CONFIGURATION (guard-config.json(5) has the
//! whole story). The binary's config parser is the authority: guard-user's
//! `tests/doc_claims.rs` holds this list to its keys, their order and their defaults.

/// One key of `guard-config.json`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConfigKey {
    pub key: &'static str,
    /// Its default as the file would write it (or what it is when left out).
    pub default: &'static str,
    /// What it does, one clause (plain text).
    pub meaning: &'static str,
}

const fn key(key: &'static str, default: &'static str, meaning: &'static str) -> ConfigKey {
    ConfigKey { key, default, meaning }
}

/// Every key, in the order the parser checks them.
pub const CONFIG_KEYS: &[ConfigKey] = &[
    key("threshold", "30", "live processes of one name that flag the name"),
    key("timeout", "\"1h\"", "how long a name stays flagged before its processes are ended"),
    key(
        "excludes",
        "the shells bash, sh, dash, zsh, fish, and node, python3, docker, claude, systemd, sshd, tmux, screen",
        "names that are counted but never flagged or ended (compared ignoring case)",
    ),
    key(
        "excludeCommands",
        "the 4 agentihooks swarm patterns of the shipped file",
        "bash extended regular expressions; a process whose command line matches one is never ended",
    ),
    key("logMaxSizeMB", "10", "the size in MiB at which the log is rotated"),
    key("stateFile", "\"~/guard-daemon-state.json\"", "where the flag times are kept; the status file goes beside it"),
    key("warnBefore", "\"10m\"", "one WARNING line per incident this long before enforcement; 0 turns it off"),
    key("repeatAfter", "3", "enforcements of one name within 24 hours that log REPEAT"),
    key(
        "stallWatch",
        "{\"peggedCpu\": 0.75, \"peggedFor\": \"5m\"}",
        "a report-only watch for processes that keep peggedCpu cores busy for peggedFor; false turns it off",
    ),
    key(
        "sessions",
        "off",
        "session roots (patterns) and what happens to the processes they leave behind: report or stop",
    ),
];
