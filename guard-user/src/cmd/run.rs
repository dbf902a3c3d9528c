//! `guard-user run` (in progress).
use std::process::ExitCode;

pub fn main(_args: impl std::fmt::Debug) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet")
}
