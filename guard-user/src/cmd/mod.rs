//! One module per subcommand. clap parses (the command line itself is the `guard-cli` crate,
//! which xtask also renders the man pages and completions from); each module validates its
//! arguments into library types, calls the library and returns the exit code. These are the
//! edges where `anyhow` lives.
pub use guard_cli::*;

pub mod check;
pub mod explain;
pub mod fleet;
pub mod holders;
pub mod install;
pub mod matches;
pub mod record;
pub mod run;
pub mod slots_release;
pub mod slots_view;
pub mod status;
pub mod tree;
pub mod unit;
pub mod validate;
