//! guard-user's command line: every subcommand, option and help text, as clap types.
//!
//! It is its own crate so that two programs share one definition: the `guard-user` binary parses
//! its arguments with it, and `cargo xtask dist` renders the man pages and the shell completions
//! from the same command tree (clap_mangen, clap_complete), so the daemon binary carries no
//! generator. Nothing here has behaviour: guard-user's `cmd` module validates these values
//! into library types.
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueHint};

mod config_keys;
mod exit_status;
pub use config_keys::{ConfigKey, CONFIG_KEYS};
pub use exit_status::{exit_statuses, ExitStatus, EXIT_STATUSES};

#[derive(Parser, Debug)]
#[command(name = "guard-user", version, about = "Ends process names that pile up for one account on a workstation.")]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Bare `guard-user [--dry-run …]` is `guard-user run [--dry-run …]`.
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the daemon (the default).
    Run(RunArgs),
    /// Show what an excludeCommands pattern matches: match, other, or budget.
    #[command(
        long_about = "Show what an excludeCommands pattern matches, exactly as the daemon would: through the same \
                      bounded, sandboxed matcher. Prints `match`, `other` or `budget` for each --cmdline TEXT, or without \
                      --cmdline one line `match|other|budget <pid> <cmdline>` per live process of the account \
                      (control characters in the command line escaped). `budget` means the match could not finish \
                      within its time and memory bounds: the daemon then protects the process \
                      (SKIPPED reason=match_budget), it never ends it. An invalid or too costly pattern exits 2 \
                      with the reason and how to fix it."
    )]
    Match(MatchArgs),
    /// Explain a name: its live processes, the verdict the next enforcing tick would reach for each, and when.
    Explain(ExplainArgs),
    /// Show the running guard's status from its status file.
    Status(StatusArgs),
    /// Show the account's sessions: each root with its processes, leftovers waiting, being stopped or reported.
    #[command(long_about = "Show the account's sessions (the config's `sessions`) as the running guard's \
                      last tick saw them: each live root with its pid, command (its first 256 bytes, escaped, \
                      with the bytes left out) and age, every process of its session with its CPU seconds and age \
                      (read from /proc now; a process no longer itself is left out), the sessions whose root ended \
                      with when their leftovers are due or that they are being stopped, and the reported leftovers \
                      (LEFTOVER), listed under their ended root until they exit, so the log is never the only list. \
                      Run as root it reads the daemon's own copy of the status (in /run/guard-user, where the \
                      account cannot write), never the file in the account's home. Only a running guard knows the \
                      lineage (it comes from fork events /proc no longer shows): exit 1 when its status is missing \
                      or its last tick is stale.")]
    Tree(TreeArgs),
    /// List every process that holds a path (its working or root directory, its executable, an open file or a
    /// mapping there), with the command that stops one account's.
    #[command(long_about = "List every process that holds PATH: a directory and everything below it, or a file, \
                      held in any way `lsof +D` sees: as its working directory (cwd), its root directory (root), \
                      its executable (exe), an open file descriptor (fd) or a mapped file (mmap, also one mapped \
                      and then closed). Objects are compared by device and inode, never by path text, so \
                      symlinks, bind mounts and names ending ` (deleted)` neither hide nor invent a holder. \
                      Without --user, every process the caller can read (as root: the whole machine), each with \
                      its user; with --user, that account's only. One line each: pid, user, CPU seconds, age, how \
                      it holds PATH, and its command line (escaped, at most 4 KiB, with the bytes left out); \
                      then, per account, the exact command that stops them. A process whose /proc files could \
                      not be read completely (they stopped answering, or the run's read budget ran out) is \
                      listed apart: it may hold PATH. Exit 0 when no process holds PATH, 1 when some do, 2 on \
                      an error (PATH does not exist, an unknown account, --stop without --user, or no holder \
                      found but a process not read completely). With --stop (which needs --user), end that \
                      account's holders only: each is read again, then SIGTERM through a pidfd after the \
                      identity check (pid, start time, name, uid), up to 10 s, then SIGKILL to those still \
                      themselves; one line per process; exit 0 when none is left.")]
    Holders(HoldersArgs),
    /// Report drift of the installation; changes nothing.
    Check(InstallArgs),
    /// Install (or repair) the guard for an account under systemd.
    Install(InstallArgs),
    /// Stop and remove what install added (keeps the config link and the log).
    Uninstall(InstallArgs),
    /// Record one account's process events from the kernel into a trace file (for replay tests).
    // A developer's tool (the replay fixtures): hidden from --help, the man pages and completions.
    #[command(hide = true)]
    Record(RecordArgs),
    /// Check a config file and print every problem with its fix (exit 1 when invalid).
    #[command(long_about = "Check a config file and print every problem with its fix, one line each \
                      (<key>: <what is wrong>; <how to fix it>), then a verdict; exit 0 when valid, 1 when not. \
                      The file is read with the account's rights, as the daemon reads it, and its patterns are \
                      compiled in the daemon's sandboxed matcher. Stricter than the daemon where the daemon \
                      would run on silently: an unknown key (the daemon warns and keeps that setting at its \
                      default) and a pattern that matches every command line (the daemon warns and protects \
                      every process of every enforced name) are errors here. Meant for the CI of the \
                      repository the config links into.")]
    Validate(ValidateArgs),
    /// Print the systemd unit template this binary installs for `--bin-dir` (`cargo xtask dist`
    /// packages exactly what the packaged binary's `check` compares with).
    #[command(name = "__unit", hide = true)]
    Unit(UnitArgs),
    /// Internal: the sandboxed excludeCommands matcher the daemon starts (pattern::worker).
    #[command(name = "__pattern-worker", hide = true)]
    PatternWorker,
    /// Internal: puts back every command heavy-command slots hold. With --instance, the
    /// daemon's releaser: waits for its stdin to close (the daemon ended), then releases that
    /// instance. Without, releases every instance no daemon holds (the unit's ExecStartPre= and
    /// ExecStopPost=).
    #[command(name = "__slots-release", hide = true)]
    SlotsRelease(SlotsReleaseArgs),
}

#[derive(Args, Debug, Clone, Default)]
pub struct SlotsReleaseArgs {
    /// The daemon instance (`<uid>-<hash>`) whose releaser this is.
    #[arg(long, value_name = "NAME")]
    pub instance: Option<String>,
    /// Accepted for the unit's command line (`--user %i`); every instance no daemon holds is
    /// released whatever it names.
    #[arg(long, value_name = "NAME|UID")]
    pub user: Option<String>,
}

/// Which account, and where its files are: shared by every subcommand.
#[derive(Args, Debug, Clone, Default)]
pub struct AccountArgs {
    /// The account, by name or uid (default: $SUDO_USER as root through sudo, else the invoking user;
    /// as root with neither, a command that acts or prints command lines asks for --user, check
    /// checks every installed instance, and one that only reads says it read root's).
    #[arg(long, value_name = "NAME|UID", value_hint = ValueHint::Username)]
    pub user: Option<String>,
    /// Use DIR instead of the account's home for every default path.
    #[arg(long, value_name = "DIR", value_hint = ValueHint::DirPath)]
    pub home: Option<PathBuf>,
    /// Config file (default: <home>/guard-config.json).
    #[arg(long, value_name = "FILE", value_hint = ValueHint::FilePath)]
    pub config: Option<PathBuf>,
}

#[derive(Args, Debug, Clone, Default)]
pub struct RunArgs {
    #[command(flatten)]
    pub account: AccountArgs,
    /// Log what would be ended instead of ending it.
    #[arg(long)]
    pub dry_run: bool,
    /// Time between ticks, e.g. 60s, 1m, 1s.
    #[arg(long, value_name = "DUR", default_value = "60s")]
    pub interval: String,
    /// Event source: ebpf, procfs, or auto (ebpf, falling back to procfs).
    #[arg(long, value_name = "auto|ebpf|procfs", default_value = "auto", value_parser = ["auto", "ebpf", "procfs"])]
    pub backend: String,
    /// How often the ebpf table is compared with /proc (RESYNC reason=drift on a mismatch).
    #[arg(long, value_name = "DUR", default_value = "10m")]
    pub audit_interval: String,
    /// Ring buffer size in bytes (a power of two ≥ 4096; tests use a tiny one to force loss).
    #[arg(long, value_name = "BYTES", hide = true)]
    pub ring_bytes: Option<u32>,
    /// Do not arm the deadline timer: enforce only on interval ticks.
    #[arg(long, hide = true)]
    pub no_deadline_timer: bool,
    /// Write Prometheus metrics to PATH after every tick (atomically), for node_exporter's textfile
    /// collector: PATH must end in .prom, the only files the collector reads, or be a directory,
    /// which gets guard-<account>.prom.
    #[arg(long, value_name = "PATH", value_hint = ValueHint::FilePath)]
    pub metrics_file: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct MatchArgs {
    #[command(flatten)]
    pub account: AccountArgs,
    /// A bash extended regex, as in excludeCommands.
    #[arg(long, value_name = "P")]
    pub pattern: String,
    /// Try P as a sessions.roots pattern: refused (exit 2) when it matches every ordinary command line or the empty one, as validate and the daemon refuse it.
    #[arg(long)]
    pub roots: bool,
    /// A command line to test; repeatable; prints match, other or budget for each. Without it, every live process of the account.
    #[arg(long, value_name = "TEXT")]
    pub cmdline: Vec<String>,
}

#[derive(Args, Debug, Clone)]
pub struct StatusArgs {
    #[command(flatten)]
    pub account: AccountArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// List every guard's heartbeat on the swarm Redis.
    #[arg(long)]
    pub fleet: bool,
}

#[derive(Args, Debug, Clone)]
pub struct TreeArgs {
    #[command(flatten)]
    pub account: AccountArgs,
    /// Print JSON instead of a tree.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug, Clone)]
pub struct HoldersArgs {
    /// Only this account's processes (name or uid); --stop needs it. Without it, every process the caller can
    /// read (as root, every process of the machine).
    #[arg(long, value_name = "NAME|UID", value_hint = ValueHint::Username)]
    pub user: Option<String>,
    /// A directory (a checkout about to be removed, say: it and everything below it) or a file.
    #[arg(value_name = "PATH", value_hint = ValueHint::AnyPath)]
    pub path: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// End the --user account's holders: SIGTERM, up to 10 s, SIGKILL, each through a pidfd after the identity
    /// check.
    #[arg(long)]
    pub stop: bool,
}

#[derive(Args, Debug, Clone)]
pub struct ValidateArgs {
    #[command(flatten)]
    pub account: AccountArgs,
    /// The config file to check (default: --config, else <home>/guard-config.json).
    #[arg(value_name = "FILE", value_hint = ValueHint::FilePath)]
    pub file: Option<PathBuf>,
}

#[derive(Args, Debug, Clone, Default)]
pub struct InstallArgs {
    #[command(flatten)]
    pub account: AccountArgs,
    /// The config the account's guard-config.json links to; it must be one the service can see (not under
    /// /tmp, /var/tmp, /run/user). Default for install: the source the last install recorded, else
    /// /usr/share/guard-user/guard-config.json on a packaged host, else config/guard-config.json of the
    /// source checkout this binary was built in. Default for check: the recorded source.
    #[arg(long, value_name = "FILE", value_hint = ValueHint::FilePath)]
    pub config_source: Option<PathBuf>,
    /// Where the systemd unit goes (default /etc/systemd/system).
    #[arg(long, value_name = "DIR", value_hint = ValueHint::DirPath)]
    pub unit_dir: Option<PathBuf>,
    /// Where the binary goes (default /usr/local/bin).
    #[arg(long, value_name = "DIR", value_hint = ValueHint::DirPath)]
    pub bin_dir: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct RecordArgs {
    #[command(flatten)]
    pub account: AccountArgs,
    /// Where the trace goes.
    #[arg(long, value_name = "FILE", value_hint = ValueHint::FilePath)]
    pub out: PathBuf,
    /// How long to record, e.g. 10s.
    #[arg(long, value_name = "DUR", default_value = "10s")]
    pub seconds: String,
    /// A line of text kept in the trace's header.
    #[arg(long, value_name = "TEXT")]
    pub note: Option<String>,
}

#[derive(Args, Debug, Clone)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub account: AccountArgs,
    /// The process name (comm, at most 15 bytes; longer names are cut as the kernel cuts them).
    #[arg(value_name = "NAME")]
    pub name: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug, Clone)]
pub struct UnitArgs {
    /// Directory the binary is installed in (the unit's ExecStart).
    #[arg(long, value_name = "DIR", default_value = "/usr/bin")]
    pub bin_dir: PathBuf,
}
