//! `guard-user __generate --out-dir DIR` (hidden): the files a package ships that are derived from
//! this binary — the man pages (clap_mangen), the bash/zsh/fish completions (clap_complete) and
//! the systemd unit template ([`crate::install::unit_text`]) — written under DIR with flat names.
//! `cargo xtask dist` runs it on the very binary it packages, so the man page documents exactly
//! the options that binary accepts and the unit is byte for byte the one its `check` compares
//! with. Where each file goes on a host is the packager's business, not this module's.
//!
//! Hidden subcommands and options (internal workers, test knobs, this command itself) stay out:
//! clap_mangen skips them on its own, clap_complete does not, so the completions are generated
//! from a copy of the command tree without them ([`visible_tree`]).
use std::{
    fs, io,
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::Context as _;
use clap::{Args, Command, CommandFactory as _};
use clap_complete::Shell;

use super::Cli;
use crate::install;

/// The binary's name, as installed and as the shells complete it.
const BIN: &str = "guard-user";
/// What the man pages describe beyond `about`; written for operators (clap's `about` is one line).
const DESCRIPTION: &str = "\
guard-user guards one account on a workstation. It keeps a live table of the account's processes \
from kernel events (BPF programs on the fork, exec, exit and rename tracepoints, with /proc as a \
fallback), counts them per process name on every tick, and when one name stays at or over the \
configured threshold for the configured timeout it ends that name's processes: SIGTERM, then \
SIGKILL half a second later. Names listed in excludes, and processes whose command line matches \
an excludeCommands pattern (a bash extended regular expression), are never ended.

Without a subcommand guard-user runs the daemon (guard-user run). One instance guards one account; \
under systemd it runs as guard-user@ACCOUNT.service, set up by guard-user install.";

#[derive(Args, Debug, Clone)]
pub struct GenerateArgs {
    /// Directory to write into (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out_dir: PathBuf,
    /// Directory the packaged binary is installed in (the unit's ExecStart).
    #[arg(long, value_name = "DIR", default_value = "/usr/bin")]
    pub bin_dir: PathBuf,
    /// The man pages' date, YYYY-MM-DD (the package's build date).
    #[arg(long, value_name = "DATE", default_value = "")]
    pub date: String,
}

/// One generated file: its name under `--out-dir` and its bytes.
pub struct Generated {
    pub name: String,
    pub bytes: Vec<u8>,
}

pub fn main(args: GenerateArgs) -> anyhow::Result<ExitCode> {
    fs::create_dir_all(&args.out_dir).with_context(|| format!("creating {}", args.out_dir.display()))?;
    for file in generate(&args.bin_dir, &args.date).context("rendering the man pages")? {
        let path = args.out_dir.join(&file.name);
        fs::write(&path, &file.bytes).with_context(|| format!("writing {}", path.display()))?;
        println!("{}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Every file, in a stable order: the man pages (`guard-user.8`, `guard-user-<sub>.8`), the
/// completions (`guard-user.bash`, `_guard-user`, `guard-user.fish`) and `guard-user@.service`.
pub fn generate(bin_dir: &Path, date: &str) -> io::Result<Vec<Generated>> {
    let mut files = man_pages(date)?;
    for (shell, name) in
        [(Shell::Bash, "guard-user.bash"), (Shell::Zsh, "_guard-user"), (Shell::Fish, "guard-user.fish")]
    {
        files.push(Generated { name: name.into(), bytes: completion(shell) });
    }
    let exe = install::escape::Executable::new(&bin_dir.join("guard-user"))
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    files.push(Generated { name: install::UNIT_NAME.into(), bytes: install::unit_text(&exe).into_bytes() });
    Ok(files)
}

/// guard-user(8) and one page per visible subcommand, guard-user-<sub>(8), which the main page's
/// SUBCOMMANDS section names (clap_mangen's cross-reference convention, as git and cargo do).
pub fn man_pages(date: &str) -> io::Result<Vec<Generated>> {
    let mut root = Cli::command().long_about(DESCRIPTION).disable_help_subcommand(true);
    root.build();
    let source = format!("{BIN} {}", crate::VERSION);
    let page = |cmd: Command| {
        clap_mangen::Man::new(cmd).section("8").date(date).source(&source).manual("System Administration")
    };
    let mut pages = Vec::new();
    for sub in root.get_subcommands().filter(|s| !s.is_hide_set()) {
        let man = page(sub.clone());
        let mut bytes = Vec::new();
        man.render(&mut bytes)?;
        pages.push(Generated { name: man.get_filename(), bytes });
    }
    let man = page(root.clone());
    let mut bytes = Vec::new();
    man.render_title(&mut bytes)?;
    man.render_name_section(&mut bytes)?;
    man.render_synopsis_section(&mut bytes)?;
    man.render_description_section(&mut bytes)?;
    man.render_options_section(&mut bytes)?;
    man.render_subcommands_section(&mut bytes)?;
    bytes.extend_from_slice(FILES_AND_SEE_ALSO.as_bytes());
    man.render_version_section(&mut bytes)?;
    pages.insert(0, Generated { name: man.get_filename(), bytes });
    Ok(pages)
}

/// The main page's FILES and SEE ALSO (roff). The paths are the daemon's defaults (relative to the
/// account's home) and the package's; the options above say how to move them.
const FILES_AND_SEE_ALSO: &str = r#".SH FILES
.TP
\fI~/guard\-config.json\fR
The account's configuration, read on every tick; guard\-user install makes it a link to the config source.
.TP
\fI~/guard\-daemon.log\fR
The log: one line per decision (FLAGGED, KILLED, SKIPPED, TICK_COMPLETE, ...), rotated to \fI.log.1\fR.
.TP
\fI~/guard\-daemon\-state.json\fR, \fI~/guard\-status.json\fR
Flag times (config key stateFile), and the status guard\-user status reads.
.TP
\fI/usr/share/guard\-user/guard\-config.json\fR
The default configuration shipped by the package.
.TP
\fIguard\-user@.service\fR
The systemd unit template; one instance per guarded account.
.SH "SEE ALSO"
\fBsystemctl\fR(1), \fBjournalctl\fR(1), and the documentation in \fI/usr/share/doc/guard\-user/\fR.
"#;

/// The completion script for `shell`, without hidden subcommands or options.
pub fn completion(shell: Shell) -> Vec<u8> {
    let mut cmd = visible_tree(&Cli::command());
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, BIN, &mut out);
    out
}

/// A copy of `cmd` (recursively) without hidden arguments and subcommands. clap has no way to
/// remove them in place; argument groups are left out (they only tie the derive's fields
/// together and would name the removed arguments).
pub fn visible_tree(cmd: &Command) -> Command {
    let mut out = Command::new(cmd.get_name().to_string())
        .args(cmd.get_arguments().filter(|a| !a.is_hide_set()).cloned())
        .subcommands(cmd.get_subcommands().filter(|s| !s.is_hide_set()).map(visible_tree))
        .args_conflicts_with_subcommands(cmd.is_args_conflicts_with_subcommands_set());
    if let Some(about) = cmd.get_about() {
        out = out.about(about.clone());
    }
    if let Some(version) = cmd.get_version() {
        out = out.version(version.to_string());
    }
    out
}

#[cfg(test)]
#[path = "generate_tests.rs"]
mod tests;
