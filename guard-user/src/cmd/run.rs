//! `guard-user run` (also bare `guard-user`): validates the arguments, then runs the daemon.
use std::{os::unix::ffi::OsStrExt, process::ExitCode};

use anyhow::Context;

use super::RunArgs;
use crate::{
    account::Purpose,
    daemon::{
        self,
        flags::{run_flags, RunFlags},
        instance, DaemonOptions,
    },
};

pub fn options(args: &RunArgs) -> anyhow::Result<DaemonOptions> {
    let (account, home, config_path) = super::account(&args.account, "run", Purpose::Acts)?;
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    // Only root can signal another uid's processes and write in its home as that account: a
    // daemon started without root for someone else would log `cannot write the log` on every
    // line and end nothing.
    anyhow::ensure!(
        euid == 0 || euid == account.uid,
        "guarding {} (uid {}) needs root: only root may signal another account's processes and write its \
         files as that account; run it with sudo, or without --user to guard yourself",
        account.name,
        account.uid
    );
    let RunFlags { interval, audit_interval, backend, metrics_file } = run_flags(args, &account.name)?;
    if args.account.home.is_some() {
        anyhow::ensure!(home.is_dir(), "--home {}: not a directory", crate::escape::text(home.as_os_str().as_bytes()));
    } else {
        anyhow::ensure!(
            home.is_dir(),
            "the home of {} in the passwd database, {}, is not a directory: create it, or pass --home DIR for the \
             guard's files",
            account.name,
            crate::escape::text(home.as_os_str().as_bytes())
        );
    }
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
