//! The config source `install` linked, recorded where only root can write it:
//! `<unit-dir>/guard-user@<account>.service.d/config-source`, beside the drop-in. `check`
//! compares the account's config link against it (never against a default), and `install`
//! without `--config-source` keeps it, so repairing an installation never discards the
//! operator's choice.
//!
//! Why this file and not a line in the drop-in: the source's canonical path may hold names the
//! account made (its checkout, the links on the way), and nothing from the account goes into a
//! file systemd parses. systemd reads only `*.conf` in a drop-in directory, so this file is
//! never part of the unit, while it still lives and goes with the instance's drop-in
//! (`uninstall` removes both; so does purging the package).
//!
//! Why it can be trusted: [`read`] takes it only as a regular file owned by root and writable by
//! no one else, in a root-owned directory no one else can write, in exactly the format
//! [`text`] writes for this account (so another account's record moved here is not taken
//! either). Anything else is drift, and `check` then compares the link against nothing.
use std::{
    fs::{self, File},
    io::{self, Read},
    os::unix::{
        ffi::OsStrExt,
        fs::{MetadataExt, OpenOptionsExt},
    },
    path::{Path, PathBuf},
};

use super::{escape::AccountName, unit::HEADER};
use crate::escape;

/// The record's file name inside `guard-user@<account>.service.d/`.
pub const RECORD_NAME: &str = "config-source";

/// A record is a few comment lines and one escaped path (at most PATH_MAX bytes, four times
/// that escaped).
const MAX_RECORD_BYTES: u64 = 20 * 1024;

/// The record's bytes for `source`: comment lines, then the path in guard's escaped form
/// ([`crate::escape::text`]) on one line.
pub fn text(user: &AccountName, source: &Path) -> String {
    format!(
        "{HEADER} install for {user}: the config source it linked the account's config to, in guard's\n\
         # escaped form. systemd does not read this file; `guard-user check` compares the link against\n\
         # it. Run `guard-user install --config-source FILE` to change it.\n\
         {}\n",
        escape::text(source.as_os_str().as_bytes())
    )
}

/// Why a record cannot be trusted.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("it is missing (installed by an earlier guard-user, or never installed)")]
    Missing,
    #[error("{0}, so the account could have written it")]
    NotRoots(String),
    #[error("it is not in the format guard-user install writes for this account")]
    Edited,
    #[error("{0}")]
    Io(io::Error),
}

/// Who may change `meta`'s file: only root, or someone else (why).
fn only_root(what: &str, meta: &fs::Metadata) -> Result<(), RecordError> {
    let mode = meta.mode() & 0o7777;
    if meta.uid() != 0 {
        return Err(RecordError::NotRoots(format!("{what} belongs to uid {}, not root", meta.uid())));
    }
    if mode & 0o022 != 0 {
        return Err(RecordError::NotRoots(format!("{what} is writable by group or others (mode {mode:o})")));
    }
    Ok(())
}

/// The source recorded at `path` for `user`, if the record can be trusted (see the module doc).
pub fn read(path: &Path, user: &AccountName) -> Result<PathBuf, RecordError> {
    let not_found = |e: io::Error| match e.kind() {
        io::ErrorKind::NotFound => RecordError::Missing,
        _ => RecordError::Io(e),
    };
    let dir = path.parent().unwrap_or(Path::new("/"));
    let dir_meta = fs::symlink_metadata(dir).map_err(not_found)?;
    if !dir_meta.is_dir() {
        return Err(RecordError::NotRoots("its directory is not a directory".into()));
    }
    only_root("its directory", &dir_meta)?;
    // No link, no FIFO wait, no controlling tty: only a regular file is read.
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => RecordError::NotRoots("it is a symbolic link".into()),
            _ => not_found(e),
        })?;
    let meta = file.metadata().map_err(RecordError::Io)?;
    if !meta.is_file() {
        return Err(RecordError::NotRoots("it is not a regular file".into()));
    }
    only_root("it", &meta)?;
    let mut bytes = Vec::new();
    file.take(MAX_RECORD_BYTES + 1).read_to_end(&mut bytes).map_err(RecordError::Io)?;
    parse(&bytes, user)
}

/// The source a record's bytes name, if they are exactly what [`text`] writes for `user`.
pub fn parse(bytes: &[u8], user: &AccountName) -> Result<PathBuf, RecordError> {
    let text_read = std::str::from_utf8(bytes).map_err(|_| RecordError::Edited)?;
    let line = text_read.lines().last().ok_or(RecordError::Edited)?;
    let source = PathBuf::from(std::ffi::OsStr::from_bytes(&escape::unescape(line).map_err(|_| RecordError::Edited)?));
    if !source.is_absolute() || text(user, &source) != text_read {
        return Err(RecordError::Edited);
    }
    Ok(source)
}
