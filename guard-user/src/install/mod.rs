//! docs/operations.md: what `install` puts on a host, what `uninstall` takes away, and the drift `check`
//! reports. The CLI edges (`cmd/install.rs`, `cmd/check.rs`) print; this module decides.
//!
//! - [`escape`]: the values a unit file may carry, and systemd's quoting for each directive.
//! - [`unit`]: the template `guard-user@.service` and the per-account drop-in (pure text).
//! - [`home`]: which directory may become the instance's home.
//! - [`hidden`]: the trees the unit hides from the service, read from the unit's directives;
//!   a config source, `--config` or `--home` inside one is refused.
//! - [`record`]: the config source install linked, recorded root-only beside the drop-in.
//! - [`layout`]: the operator's request validated into a [`Layout`]; packaged or source host;
//!   the default config source.
//! - [`apply`]: `install` and `uninstall` (the only writers).
//! - [`check`]: `check` (reads only).
//! - [`defaults`]: `/etc/default/guard-user`, the flags the unit adds to `run` (`GUARD_ARGS`).
//! - [`leaked`]: `guard-user run` processes outside the unit.
//! - [`systemctl`]: talking to systemd.
//!
//! # Choices the documentation leaves to the code
//! - **Nothing from the account reaches a unit file.** The drop-in
//!   `guard-user@<account>.service.d/home.conf` is built only from what root gave `install`:
//!   the account name (from passwd, held to `[A-Za-z_][A-Za-z0-9_.-]{0,31}`), the home
//!   (`--home` or passwd, validated by [`home::validate_home`]) and `--config` when given. It
//!   resets `ExecStart=` to `<bin> run --user <name> --home <home> [--config <path>]` and adds
//!   `ReadWritePaths=<home>`, escaped per directive ([`escape`]). The account's config is never
//!   read to build it: a `stateFile` outside the home stays read-only under the unit and the
//!   daemon logs `ERROR state_unwritable` for it, while its in-memory clocks stay the authority
//!   and keep enforcing.
//! - **check verifies the drop-in, not a recomputation.** It parses the installed drop-in (our
//!   own format only), learns the home and config install was told (unless `--home`/`--config`
//!   are given), and requires the file to be byte-identical to what install would write for
//!   those values today, with the values still valid. A hand edit, a planted or foreign
//!   drop-in, or a home that is no longer safe is `<path> is missing or differs from this
//!   build`; the reason goes to stderr.
//! - **Packaged host.** When the running binary is `/usr/bin/guard-user` (the same file) and
//!   `/lib/systemd/system/guard-user@.service` (or `/usr/lib/…`) exists, the package provides
//!   the binary and the template: install copies no binary and writes no template, only the
//!   drop-in under the unit directory; a template in the unit directory would shadow the
//!   packaged one, so install removes one it wrote itself (first line [`unit::HEADER`]) and
//!   refuses to touch anyone else's, and check reports it. check requires the packaged template
//!   to equal what this build writes for `/usr/bin`. `GUARD_PACKAGED_ROOT=DIR` moves the
//!   packaged paths under DIR (tests).
//! - **Default config source**: the source the last install recorded ([`record`]; one that
//!   cannot be trusted stops install), else the packaged
//!   `/usr/share/guard-user/guard-config.json`, else the `config/guard-config.json` of the
//!   checkout the running binary was built in, else of the checkout it was compiled from; else
//!   an error asking for `--config-source`. check compares against the record (or
//!   `--config-source`), never a default.
//! - **The record is a file of its own**, `config-source` beside `home.conf`, not a comment in
//!   the drop-in: the canonical source may hold names the account made, and those never go into
//!   a file systemd parses (the first choice above).
//! - **Hidden trees** are read from the unit's directives ([`hidden`]), plus `/run/user`, which
//!   no directive of ours hides but which logind empties at the account's last logout.
//! - **Writes into the account's home happen as the account** (the config link, retiring the
//!   legacy files): with its file-system identity ([`crate::safefs::FsIdentity`]), so a link
//!   the account planted (`.config` → `/etc/…`) leads only where it could write itself. Unit
//!   files and the binary are written as root with [`crate::safefs::atomic_write_mode`].
//! - systemd "is running" when `/run/systemd/system` exists (what `sd_booted(3)` tests).
//!   `GUARD_SYSTEMD_RUNNING=1|0` overrides that answer (tests run without systemd, with a fake
//!   `systemctl` first in `PATH`; `systemctl` is always looked up in `PATH`).
//! - A leaked daemon is a process whose argv, parsed with guard-user's own command line
//!   ([`guard_cli::Cli`]), is `guard-user run …` (or bare `guard-user [--flags]`) with
//!   `--user <name|uid>` naming the account, or with no `--user` and the account's euid; any
//!   other subcommand, and an argv the command line refuses, is not a daemon ([`leaked`]). We do
//!   not chase `$SUDO_USER` in another process's environment.
//! - **Every path printed is escaped** ([`shown`], [`quoted`]: guard's one escaped form,
//!   [`crate::escape`]): a home, a source or a link target can hold names the account made,
//!   and none of them may drive root's terminal or forge a line of `check`'s output.
//! - A missing status file is not drift by itself (the first status is written after the first
//!   tick); `is not active` already covers a guard that never started.
use std::{
    io,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
};

pub mod apply;
pub mod check;
pub mod defaults;
pub mod escape;
pub mod hidden;
pub mod home;
pub mod layout;
pub mod leaked;
pub mod record;
pub mod systemctl;
pub mod unit;

#[cfg(test)]
mod tests;

pub use apply::{install, links_to, uninstall, Outcome};
pub use check::check;
pub use layout::{installed_accounts, Layout, Request};
pub use systemctl::Systemctl;
pub use unit::{instance_name, unit_text};
#[cfg(any(test, feature = "testing"))]
pub use {apply::relink, unit::DropIn};

use crate::config::{self, Config, ConfigError};

/// A path as install, check and uninstall print it: guard's one escaped form
/// ([`crate::escape::text`]), on one line, with nothing a terminal would act on.
pub fn shown(p: &Path) -> crate::escape::Escaped<'_> {
    crate::escape::Escaped(p.as_os_str().as_bytes())
}

/// [`shown`] in double quotes (a `"` inside written `\"`): a path inside an error's sentence.
pub fn quoted(p: &Path) -> String {
    format!("\"{}\"", shown(p).to_string().replace('"', "\\\""))
}

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("{}: {source}", shown(path))]
    Io { path: PathBuf, source: io::Error },
    #[error("the config source {} is invalid: {}; fix it or pass --config-source FILE", quoted(path), reason.log_reason())]
    InvalidSource { path: PathBuf, reason: Box<ConfigError> },
    #[error("the config source {} does not exist ({source}); pass --config-source FILE", quoted(path))]
    NoSource { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Hidden(#[from] Box<hidden::HiddenError>),
    #[error(
        "{} records the config source of the last install, but {why}; pass --config-source FILE with the source \
         you mean (install then writes a new record)",
        shown(path)
    )]
    UntrustedRecord { path: PathBuf, why: record::RecordError },
    #[error(
        "no default config source: not a packaged host and no source checkout beside this binary (looked for \
         {tried}); pass --config-source FILE"
    )]
    NoDefaultSource { tried: String },
    #[error("`systemctl {args}` failed: {detail}")]
    Systemctl { args: String, detail: String },
    #[error(transparent)]
    Account(#[from] crate::account::AccountError),
    #[error(transparent)]
    Unit(#[from] escape::UnitValueError),
    #[error(transparent)]
    Home(#[from] home::HomeError),
    #[error(
        "{} shadows the packaged unit and was not written by guard-user; move it away (systemd prefers it to \
         the package's) and run install again",
        shown(path)
    )]
    ForeignUnit { path: PathBuf },
}

/// Every read of a config by install and check goes through here (the source, the account's
/// link, the stateFile that locates the status file), so the account's file can be read the
/// safe way (as the account, non-blocking, size-capped) by changing this one function.
pub fn read_config(
    path: &std::path::Path,
    home: &std::path::Path,
    who: crate::safefs::FsIdentity,
) -> Result<Config, ConfigError> {
    config::load(path, home, who)
}
