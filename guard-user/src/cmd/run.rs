//! `guard-user run` (also bare `guard-user`): validates the arguments, then runs the daemon.
use std::process::ExitCode;

use anyhow::Context;

use super::{AccountArgs, RunArgs};
use crate::{
    account::Account,
    daemon::{self, instance, Backend, DaemonOptions},
    duration::parse_duration,
};

/// The account and where its files live (shared by every subcommand).
pub fn resolve_account(args: &AccountArgs) -> anyhow::Result<(Account, std::path::PathBuf, std::path::PathBuf)> {
    let account = Account::resolve(args.user.as_deref())?;
    let home = args.home.clone().unwrap_or_else(|| account.home.clone());
    let config = args.config.clone().unwrap_or_else(|| home.join("guard-config.json"));
    Ok((account, home, config))
}

pub fn options(args: &RunArgs) -> anyhow::Result<DaemonOptions> {
    let (account, home, config_path) = resolve_account(&args.account)?;
    if args.account.user.is_none() {
        anyhow::ensure!(account.uid != 0, "{}", NO_IMPLICIT_ROOT);
        // Said once, on the terminal that started it: whom a bare `run` guards, and why.
        let sudo = std::env::var("SUDO_USER").is_ok_and(|u| u == account.name);
        let from = if sudo { "$SUDO_USER, who ran sudo" } else { "the invoking user" };
        tracing::info!(
            "guarding {} (uid {}, from {from}); --user NAME guards another account",
            account.name,
            account.uid
        );
    }
    let metrics_file = args.metrics_file.as_deref().map(metrics_file).transpose()?;
    let interval = parse_duration(&args.interval).context("--interval")?;
    anyhow::ensure!(!interval.is_zero(), "--interval must be longer than 0s");
    let audit_interval = parse_duration(&args.audit_interval).context("--audit-interval")?;
    anyhow::ensure!(!audit_interval.is_zero(), "--audit-interval must be longer than 0s");
    let backend: Backend = args.backend.parse().map_err(anyhow::Error::msg)?;
    anyhow::ensure!(home.is_dir(), "--home {}: not a directory", home.display());
    // Absolute, so log lines, the heartbeat and `stateFile` expansion do not depend on the cwd.
    let home = home.canonicalize().with_context(|| format!("--home {}", home.display()))?;
    Ok(DaemonOptions {
        account,
        home,
        config_path,
        dry_run: args.dry_run,
        interval,
        backend,
        audit_interval,
        ring_bytes: args.ring_bytes,
        deadline_timer: !args.no_deadline_timer,
        metrics_file,
    })
}

/// Why a bare `run` as root does not start: the default account (`$SUDO_USER`, else the invoking
/// user) would be root itself, and a guard enforcing on root's processes is never what an
/// operator meant without saying so. `--user root` still guards root.
pub const NO_IMPLICIT_ROOT: &str = "no account to guard: run as root without --user (and not through sudo), \
     guard-user would guard root's own processes; name the account to guard, e.g. guard-user run --user alice \
     (or --user root if root's processes are really what you mean)";

/// `--metrics-file PATH`: node_exporter's textfile collector reads only `*.prom`, so any other
/// name would be written every tick and never collected. Refused before anything starts.
fn metrics_file(path: &std::path::Path) -> anyhow::Result<std::path::PathBuf> {
    let name = path.file_name().map(|n| n.as_encoded_bytes()).unwrap_or_default();
    anyhow::ensure!(
        name.len() > ".prom".len() && name.ends_with(b".prom"),
        "--metrics-file {}: node_exporter's textfile collector reads only files whose name ends in .prom, \
         so it would never read this one; name it e.g. guard-<account>.prom",
        crate::escape::text(path.as_os_str().as_encoded_bytes())
    );
    Ok(path.to_path_buf())
}

pub fn main(args: RunArgs) -> anyhow::Result<ExitCode> {
    let opts = options(&args)?;
    let dir = instance::lock_dir();
    let _lock = match instance::acquire(&dir, opts.account.uid, &opts.account.name, &opts.home) {
        Ok(lock) => lock,
        Err(e @ instance::InstanceError::Held { .. }) => {
            eprintln!("guard-user: {e}");
            return Ok(ExitCode::from(75));
        }
        Err(e) => return Err(e.into()),
    };
    crate::ebpf::limit_heap();
    // Blocking-pool threads (ticks, /proc rebuilds) are kept for the daemon's life: with tokio's
    // 10 s default a 60 s tick would need a new thread each time, and when a fork bomb has
    // exhausted the pid space (exactly when the guard must act) thread creation fails.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_keep_alive(std::time::Duration::from_secs(100 * 365 * 86_400))
        .enable_all()
        .build()?;
    let result = rt.block_on(daemon::run(opts));
    // A tick abandoned on a hang or a stop may still hold a blocking thread: do not wait for it.
    rt.shutdown_background();
    Ok(ExitCode::from(result?.exit_code()))
}
