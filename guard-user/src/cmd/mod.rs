//! One module per subcommand. clap parses (the command line itself is the `guard-cli` crate,
//! which xtask also renders the man pages and completions from); each module validates its
//! arguments into library types, calls the library and returns the exit code. These are the
//! edges where `anyhow` lives.
//!
//! What a subcommand prints goes through [`print!`]/[`println!`]/[`eprintln!`] as redefined
//! here, before the submodules, so they all use them without an import: std's versions panic
//! when the stream is gone (`guard-user explain X | head`, a closed stderr), and a reader that
//! stopped reading must end a command quietly ([`stdout_gone`]), never with a panic.
pub use guard_cli::*;

/// std's `print!`, ending the command quietly when stdout is a pipe nobody reads any more.
macro_rules! print {
    ($($arg:tt)*) => { $crate::cmd::write_stdout(format_args!($($arg)*)) };
}

/// std's `println!`, ending the command quietly when stdout is a pipe nobody reads any more.
macro_rules! println {
    () => { $crate::cmd::write_stdout(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::cmd::write_stdout(format_args!("{}\n", format_args!($($arg)*))) };
}

/// std's `eprintln!`, ignoring a stderr that cannot be written (nothing better can be done).
macro_rules! eprintln {
    ($($arg:tt)*) => { $crate::cmd::say(&format!($($arg)*)) };
}

use std::process::ExitCode;

use clap::Parser;

use crate::account::{Account, Chosen, Purpose};

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

/// `guard-user`'s whole program: parse the command line, run the subcommand, and turn its
/// error into the exit status (2, or 141 when stdout's reader went away).
pub fn main() -> ExitCode {
    crate::diag::init();
    crate::startup_phase("main");
    let cli = Cli::parse();
    let result = match cli.command.unwrap_or(Command::Run(cli.run)) {
        Command::Run(args) => run::main(args),
        Command::Match(args) => matches::main(args),
        Command::Explain(args) => explain::main(args),
        Command::Status(args) => status::main(args),
        Command::Tree(args) => tree::main(args),
        Command::Holders(args) => holders::main(args),
        Command::Check(args) => check::main(args),
        Command::Install(args) => install::main(args),
        Command::Uninstall(args) => install::uninstall(args),
        Command::Record(args) => record::main(args),
        Command::Validate(args) => validate::main(args),
        Command::Unit(args) => unit::main(args),
        Command::PatternWorker => return crate::pattern::worker::main(),
        Command::SlotsRelease(args) => slots_release::main(args),
    };
    match result {
        Ok(code) => code,
        // `explain X | head`: the reader went away, which is not an error of ours.
        Err(err) if is_stdout_gone(&err) => ExitCode::from(STDOUT_GONE),
        Err(err) => {
            say(&format!("guard-user: {err:#}"));
            ExitCode::from(2)
        }
    }
}

/// The account `command` names (`--user`, else `$SUDO_USER` as root, else the invoking user:
/// [`Account::resolve`]), held to what `purpose` allows ([`Resolved::for_purpose`]: an implicit
/// root is refused where the command acts or shows command lines), with its home (`--home`,
/// else passwd's) and its config path (`--config`, else `<home>/guard-config.json`). A reading
/// command that fell through to root says so first, on stderr, so stdout stays its output.
pub fn account(
    args: &AccountArgs,
    command: &'static str,
    purpose: Purpose,
) -> anyhow::Result<(Account, std::path::PathBuf, std::path::PathBuf)> {
    let resolved = Account::resolve(args.user.as_deref())?;
    let (chosen, notice) = (resolved.chosen, resolved.notice(command));
    let account = resolved.for_purpose(command, purpose)?;
    if let Some(notice) = notice {
        say(&notice);
    }
    if chosen != Chosen::Named && purpose == Purpose::Acts {
        // Said once, on the terminal that started it: whom an unnamed account is, and why.
        let from = if chosen == Chosen::SudoUser { "$SUDO_USER, who ran sudo" } else { "the invoking user" };
        tracing::info!(
            "{command}: {} (uid {}, from {from}); --user NAME names another account",
            account.name,
            account.uid
        );
    }
    let home = args.home.clone().unwrap_or_else(|| account.home.clone());
    let config = args.config.clone().unwrap_or_else(|| home.join("guard-config.json"));
    Ok((account, home, config))
}

/// One line on stderr that never panics: a closed stderr (a pipe whose reader went away) must
/// not end a subcommand, let alone the daemon, with a panic.
pub fn say(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// The exit status of a command whose reader went away: what a C tool killed by SIGPIPE ends
/// with in the shell (128 + 13), so a pipeline neither sees a panic nor mistakes a cut-short
/// output for a complete one.
pub const STDOUT_GONE: u8 = 141;

/// Ends the process quietly with [`STDOUT_GONE`]: the one answer to a closed stdout.
pub fn stdout_gone() -> ! {
    std::process::exit(STDOUT_GONE.into())
}

/// Whether an error (anywhere in its chain) is a write to a pipe nobody reads.
pub fn is_stdout_gone(err: &anyhow::Error) -> bool {
    err.chain().any(|e| e.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe))
}

/// What [`print!`] and [`println!`] do.
pub fn write_stdout(args: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            stdout_gone();
        }
        // Any other failure (a full disk under a redirect) is the shell's to see: said once.
        say(&format!("guard-user: cannot write the output: {e}"));
        std::process::exit(2);
    }
}
