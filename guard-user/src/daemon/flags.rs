//! `run`'s own flags (everything but the account and its files) validated into what the daemon
//! uses: the one rule `run` applies at start and `check` applies to the flags the unit would add
//! from `/etc/default/guard-user` (`GUARD_ARGS`), so a setting the service would refuse is found
//! before a restart loops on it.
use std::{
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
    time::Duration,
};

use super::Backend;
use crate::duration::{parse_duration, DurationError};

/// The flags, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunFlags {
    pub interval: Duration,
    pub audit_interval: Duration,
    pub backend: Backend,
    pub metrics_file: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum FlagError {
    #[error("{flag}: {source}")]
    Duration { flag: &'static str, source: DurationError },
    #[error("{flag} must be longer than 0s")]
    Zero { flag: &'static str },
    #[error("{0}")]
    Backend(String),
    #[error(
        "--metrics-file {0}: node_exporter's textfile collector reads only files whose name ends in .prom, so it \
         would never read this one; name it e.g. guard-<account>.prom, or give its directory"
    )]
    MetricsName(String),
}

/// The flags of `args`, for `account` (the metrics file's name when `--metrics-file` names a
/// directory).
pub fn run_flags(args: &guard_cli::RunArgs, account: &str) -> Result<RunFlags, FlagError> {
    let interval = duration("--interval", &args.interval)?;
    let audit_interval = duration("--audit-interval", &args.audit_interval)?;
    let backend = args.backend.parse().map_err(FlagError::Backend)?;
    let metrics_file = args.metrics_file.as_deref().map(|p| metrics_file(p, account)).transpose()?;
    Ok(RunFlags { interval, audit_interval, backend, metrics_file })
}

fn duration(flag: &'static str, text: &str) -> Result<Duration, FlagError> {
    let d = parse_duration(text).map_err(|source| FlagError::Duration { flag, source })?;
    if d.is_zero() {
        return Err(FlagError::Zero { flag });
    }
    Ok(d)
}

/// `--metrics-file PATH`: node_exporter's textfile collector reads only `*.prom`, so any other
/// name would be written every tick and never collected; refused before anything starts. A
/// directory (one that exists, or a path ending in `/`) gets `guard-<account>.prom` inside it,
/// so one `GUARD_ARGS` serves every instance of the unit with a file each.
pub fn metrics_file(path: &Path, account: &str) -> Result<PathBuf, FlagError> {
    if path.as_os_str().as_bytes().ends_with(b"/") || path.is_dir() {
        return Ok(path.join(format!("guard-{account}.prom")));
    }
    let name = path.file_name().map(|n| n.as_encoded_bytes()).unwrap_or_default();
    if name.len() > ".prom".len() && name.ends_with(b".prom") {
        Ok(path.to_path_buf())
    } else {
        Err(FlagError::MetricsName(crate::escape::text(path.as_os_str().as_bytes())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> guard_cli::RunArgs {
        use clap::Parser as _;
        let mut argv = vec!["guard-user", "run"];
        argv.extend_from_slice(extra);
        match guard_cli::Cli::try_parse_from(argv).unwrap().command {
            Some(guard_cli::Command::Run(a)) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_metrics_directory_gets_a_file_per_account() {
        let dir = tempfile::tempdir().unwrap();
        let f = run_flags(&args(&["--metrics-file", dir.path().to_str().unwrap()]), "alice").unwrap();
        assert_eq!(f.metrics_file, Some(dir.path().join("guard-alice.prom")));
        let f = run_flags(&args(&["--metrics-file", "/nowhere/yet/"]), "bob").unwrap();
        assert_eq!(f.metrics_file, Some(PathBuf::from("/nowhere/yet/guard-bob.prom")));
        assert!(matches!(run_flags(&args(&["--metrics-file", "/x/guard.txt"]), "a"), Err(FlagError::MetricsName(_))));
    }

    #[test]
    fn durations_are_checked_with_the_flag_they_came_from() {
        let e = run_flags(&args(&["--interval", "soon"]), "a").unwrap_err().to_string();
        assert!(e.starts_with("--interval: `soon` is not a duration"), "{e}");
        let e = run_flags(&args(&["--audit-interval", "0s"]), "a").unwrap_err().to_string();
        assert_eq!(e, "--audit-interval must be longer than 0s");
        assert_eq!(run_flags(&args(&["--interval", "30s"]), "a").unwrap().interval, Duration::from_secs(30));
    }
}
