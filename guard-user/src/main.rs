//! `guard-user`: the daemon and its operator commands (docs/operations.md). See the library crate's docs.
use std::process::ExitCode;

fn main() -> ExitCode {
    guard::main()
}
