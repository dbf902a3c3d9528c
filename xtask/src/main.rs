//! `cargo xtask <command>`: guard's build, run, test, VM and benchmark driver.
//!
//! One module per subcommand, each with its own `Options` (the aya layout).
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod arch;
mod bench;
mod build;
mod build_ebpf;
mod dist;
mod lint;
mod run;
mod test;
mod vm;

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what is missing (rust-src, bpf-linker) and build the BPF object.
    BuildEbpf(build_ebpf::Options),
    /// Build the BPF object, then guard-user embedding it.
    Build(build::Options),
    /// Build, then run guard-user with the given arguments (as root).
    Run(run::Options),
    /// Build, then run every test (unit and integration, as root).
    Test(test::Options),
    /// Run the integration tests inside VMs on several kernels (and under systemd).
    Vm(vm::Options),
    /// Benchmarks: guard against the ps-rescan pass and the machine's limits.
    Bench(bench::Options),
    /// The lint gate: rustfmt and clippy -D warnings, host workspace and BPF crate.
    Lint(lint::Options),
    /// Build the Debian package (release build, man pages, completions, unit); prints its path last.
    Dist(dist::Options),
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::BuildEbpf(o) => build_ebpf::run(o),
        Command::Build(o) => build::run(o),
        Command::Run(o) => run::run(o),
        Command::Test(o) => test::run(o),
        Command::Vm(o) => vm::run(o),
        Command::Bench(o) => bench::run(o),
        Command::Lint(o) => lint::run(o),
        Command::Dist(o) => dist::run(o),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: {err:#}");
            ExitCode::FAILURE
        }
    }
}
