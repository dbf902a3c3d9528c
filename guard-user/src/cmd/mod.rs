//! One module per subcommand. clap parses; each module validates its arguments into library
//! types, calls the library and returns the exit code. These are the edges where `anyhow` lives.
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

pub mod check;
pub mod explain;
pub mod fleet;
pub mod generate;
pub mod holders;
pub mod install;
pub mod matches;
pub mod record;
pub mod run;
pub mod status;
pub mod tree;
pub mod validate;

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
    /// Show the account's live sessions: each root with its processes, and leftovers waiting for their grace.
    Tree(tree::TreeArgs),
    /// List the account's processes working in a directory (or below it), with the command that stops each.
    Holders(holders::HoldersArgs),
    /// Report drift of the installation; changes nothing.
    Check(InstallArgs),
    /// Install (or repair) the guard for an account under systemd.
    Install(InstallArgs),
    /// Stop and remove what install added (keeps the config link and the log).
    Uninstall(InstallArgs),
    /// Record one account's process events from the kernel into a trace file (for replay tests).
    Record(RecordArgs),
    /// Check a config file and print every problem with its fix (exit 1 when invalid).
    Validate(ValidateArgs),
    /// Write the man pages, completions and unit a package ships (`cargo xtask dist`).
    #[command(name = "__generate", hide = true)]
    Generate(generate::GenerateArgs),
    /// Internal: the sandboxed excludeCommands matcher the daemon starts (pattern::worker).
    #[command(name = "__pattern-worker", hide = true)]
    PatternWorker,
}

/// Which account, and where its files are: shared by every subcommand.
#[derive(Args, Debug, Clone, Default)]
pub struct AccountArgs {
    /// Account to guard, by name or uid (default: $SUDO_USER under sudo, else the invoking user).
    #[arg(long, value_name = "NAME|UID")]
    pub user: Option<String>,
    /// Use DIR instead of the account's home for every default path.
    #[arg(long, value_name = "DIR")]
    pub home: Option<PathBuf>,
    /// Config file (default: <home>/guard-config.json).
    #[arg(long, value_name = "FILE")]
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
    #[arg(long, value_name = "auto|ebpf|procfs", default_value = "auto")]
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
    /// Write Prometheus metrics to PATH after every tick (atomically; for node_exporter's textfile collector).
    #[arg(long, value_name = "PATH")]
    pub metrics_file: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct MatchArgs {
    #[command(flatten)]
    pub account: AccountArgs,
    /// A bash extended regex, as in excludeCommands.
    #[arg(long, value_name = "P")]
    pub pattern: String,
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
pub struct ValidateArgs {
    #[command(flatten)]
    pub account: AccountArgs,
    /// The config file to check (default: --config, else <home>/guard-config.json).
    #[arg(value_name = "FILE")]
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
    #[arg(long, value_name = "FILE")]
    pub config_source: Option<PathBuf>,
    /// Where the systemd unit goes (default /etc/systemd/system).
    #[arg(long, value_name = "DIR")]
    pub unit_dir: Option<PathBuf>,
    /// Where the binary goes (default /usr/local/bin).
    #[arg(long, value_name = "DIR")]
    pub bin_dir: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct RecordArgs {
    #[command(flatten)]
    pub account: AccountArgs,
    /// Where the trace goes.
    #[arg(long, value_name = "FILE")]
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
