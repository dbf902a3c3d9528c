//! What each exit status of each subcommand means: the one table the man pages' EXIT STATUS
//! sections are rendered from (xtask), and that guard-user's `tests/doc_claims.rs` holds to the
//! binary, driving every row it can into being and naming the test that covers the others.

/// One exit status of one subcommand (`"*"`: every subcommand).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitStatus {
    pub command: &'static str,
    pub code: u8,
    /// What it means, a clause for the man page (plain text: `-` is a hyphen).
    pub meaning: &'static str,
}

const fn row(command: &'static str, code: u8, meaning: &'static str) -> ExitStatus {
    ExitStatus { command, code, meaning }
}

/// Every subcommand's exit statuses, by subcommand in the order of `--help`, then those of all.
pub const EXIT_STATUSES: &[ExitStatus] = &[
    row("run", 0, "stopped by SIGTERM or SIGINT (STOPPED reason=signal)"),
    row("run", 70, "it hung (STOPPED reason=hang); systemd restarts it"),
    row("run", 75, "another guard-user already guards this account and home"),
    row("match", 0, "every answer was printed"),
    row("match", 2, "the pattern is invalid or too costly to match"),
    row("explain", 0, "the explanation was printed"),
    row("explain", 1, "the config is missing or invalid (the daemon ends nothing while it is)"),
    row("status", 0, "the guard is ticking and its config is valid (--fleet: every guard is)"),
    row(
        "status",
        1,
        "there is no status file, the last tick is older than two intervals, or its config was invalid (--fleet: \
         for any guard, or the swarm Redis is unreachable)",
    ),
    row("tree", 0, "the sessions were printed (or sessions are off) and the guard is ticking"),
    row("tree", 1, "there is no status file, or the last tick is older than two intervals"),
    row("holders", 0, "no process holds the path (with --stop: none is left)"),
    row("holders", 1, "some process holds it (with --stop: some are left)"),
    row("check", 0, "the installation is in sync"),
    row("check", 1, "drift, one line each (as root with no --user: on any installed guard, or none is installed)"),
    row("install", 0, "installed and started under systemd"),
    row("install", 1, "the config was linked, but systemd is not running, so the guard is not scheduled"),
    row("uninstall", 0, "removed (or nothing was installed)"),
    row("validate", 0, "the config is valid (warnings may be printed)"),
    row("validate", 1, "the config is invalid"),
    row(
        "*",
        2,
        "bad arguments, a fatal error (guard-user: what, on standard error; for run also STOPPED reason=error), or \
         no --user where the default would be root and the command acts or shows command lines",
    ),
    row("*", 141, "standard output was a pipe whose reader went away (guard-user explain NAME piped into head)"),
];

/// The rows that concern `command` (its own, then those of every subcommand), by code.
pub fn exit_statuses(command: &str) -> Vec<ExitStatus> {
    let mut rows: Vec<ExitStatus> =
        EXIT_STATUSES.iter().copied().filter(|s| s.command == command || s.command == "*").collect();
    rows.sort_by_key(|s| s.code);
    rows
}
