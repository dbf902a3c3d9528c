//! `guard-user`: the daemon and its operator commands (docs/operations.md). See the library crate's docs.
use std::process::ExitCode;

use clap::Parser;
use guard::cmd::{self, Cli, Command};

fn main() -> ExitCode {
    guard::diag::init();
    guard::startup_phase("main");
    let cli = Cli::parse();
    let result = match cli.command.unwrap_or(Command::Run(cli.run)) {
        Command::Run(args) => cmd::run::main(args),
        Command::Match(args) => cmd::matches::main(args),
        Command::Explain(args) => cmd::explain::main(args),
        Command::Status(args) => cmd::status::main(args),
        Command::Tree(args) => cmd::tree::main(args),
        Command::Holders(args) => cmd::holders::main(args),
        Command::Check(args) => cmd::check::main(args),
        Command::Install(args) => cmd::install::main(args),
        Command::Uninstall(args) => cmd::install::uninstall(args),
        Command::Record(args) => cmd::record::main(args),
        Command::Validate(args) => cmd::validate::main(args),
        Command::Unit(args) => cmd::unit::main(args),
        Command::PatternWorker => return guard::pattern::worker::main(),
        Command::SlotsRelease(args) => cmd::slots_release::main(args),
    };
    match result {
        Ok(code) => code,
        // `explain X | head`: the reader went away, which is not an error of ours.
        Err(err) if cmd::is_stdout_gone(&err) => ExitCode::from(cmd::STDOUT_GONE),
        Err(err) => {
            cmd::say(&format!("guard-user: {err:#}"));
            ExitCode::from(2)
        }
    }
}
