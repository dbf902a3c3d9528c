//! One module per subcommand. clap parses; each module validates its arguments into library
//! types, calls the library and returns the exit code. These are the edges where `anyhow` lives.
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

pub mod check;
pub mod install;
pub mod matches;
pub mod run;
pub mod status;

#[derive(Parser, Debug)]
#[command(name = "guard-user", version, about = "Ends process names that pile up on a workstation (see SPEC.md).")]
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
    /// Show what an excludeCommands pattern matches.
    Match(MatchArgs),
    /// Show the running guard's status from its status file.
    Status(StatusArgs),
    /// Report drift of the installation; changes nothing.
    Check(InstallArgs),
    /// Install (or repair) the guard for an account under systemd.
    Install(InstallArgs),
    /// Stop and remove what install added (keeps the config link and the log).
    Uninstall(InstallArgs),
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
}

#[derive(Args, Debug, Clone)]
pub struct MatchArgs {
    #[command(flatten)]
    pub account: AccountArgs,
    /// A bash extended regex, as in excludeCommands.
    #[arg(long, value_name = "P")]
    pub pattern: String,
    /// A command line to test; repeatable. Without it, every live process of the account.
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

#[derive(Args, Debug, Clone, Default)]
pub struct InstallArgs {
    #[command(flatten)]
    pub account: AccountArgs,
    /// The config the account's guard-config.json links to (default: the checkout's shipped config).
    #[arg(long, value_name = "FILE")]
    pub config_source: Option<PathBuf>,
    /// Where the systemd unit goes (default /etc/systemd/system).
    #[arg(long, value_name = "DIR")]
    pub unit_dir: Option<PathBuf>,
    /// Where the binary goes (default /usr/local/bin).
    #[arg(long, value_name = "DIR")]
    pub bin_dir: Option<PathBuf>,
}
