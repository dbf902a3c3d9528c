//! `guard-user __unit [--bin-dir DIR]` (hidden): prints the unit template this binary installs
//! for a binary in DIR. `cargo xtask dist` packages what the built binary prints, and
//! `dist --check` asks the extracted binary again, so the packaged unit is byte for byte the one
//! that binary's `check` compares with. (The man pages and completions are rendered by xtask
//! from the `guard-cli` crate; only the unit needs this binary's library.)
use std::{io::Write as _, process::ExitCode};

use anyhow::Context as _;

use super::UnitArgs;
use crate::install::{escape::Executable, unit_text};

pub fn main(args: UnitArgs) -> anyhow::Result<ExitCode> {
    let exe = Executable::new(&args.bin_dir.join("guard-user")).context("--bin-dir")?;
    std::io::stdout().write_all(unit_text(&exe).as_bytes()).context("writing the unit")?;
    Ok(ExitCode::SUCCESS)
}
