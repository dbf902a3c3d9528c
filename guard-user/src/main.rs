//! `guard-user`: the daemon and its operator commands (SPEC §7). See the library crate's docs.
use std::process::ExitCode;

use clap::Parser;
use guard::cmd::{self, Cli, Command};

fn main() -> ExitCode {
    guard::startup_phase("main");
    let cli = Cli::parse();
    let result = match cli.command.unwrap_or(Command::Run(cli.run)) {
        Command::Run(args) => cmd::run::main(args),
        Command::Match(args) => cmd::matches::main(args),
        Command::Status(args) => cmd::status::main(args),
        Command::Check(args) => cmd::check::main(args),
        Command::Install(args) => cmd::install::main(args),
        Command::Uninstall(args) => cmd::install::uninstall(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("guard-user: {err:#}");
            ExitCode::from(2)
        }
    }
}
