//! Which directory may become the instance's `--home` and `ReadWritePaths=`: the one place a
//! path reaches a unit file, so it must be the account's own directory and stay that
//! directory after install returns.
//!
//! The rules, in order (each refusal names the fix):
//! 1. expressible in a unit file ([`UnitPath`]);
//! 2. not inside a tree the unit hides from the service ([`super::hidden`]: `/tmp` and
//!    `/var/tmp` are private to it, `/dev` too, `/run/user` comes and goes with logins);
//! 3. canonical: absolute, normalized and free of symbolic links (`realpath` gives it back
//!    unchanged), so what systemd bind-mounts read-write is what was checked; not `/`, not a
//!    system directory, not inside a tree the system owns (`/proc`, `/sys`, `/etc`, `/usr`,
//!    `/boot`, `/root`…);
//! 4. a directory owned by the account, which is not root;
//! 5. no one but root can rename the home or a directory above it: every directory above it
//!    belongs to root, and one writable by group or others is sticky (1777, like `/tmp`, or a
//!    VM's tmpfs `/`) and holds only root's entry on the way. Otherwise someone who can write
//!    there (the account itself, in a 1777 directory where it owns its home, or a directory it
//!    owns) could rename the home away and put a link to `/etc` in its place, and the next start
//!    would make `/etc` writable to the service.
use std::{
    fs,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
};

use super::{
    escape::{UnitPath, UnitValueError},
    hidden::service_hidden_trees,
    quoted,
};
use crate::account::Account;

/// Directories that are never a home, whatever their owner.
const SYSTEM_DIRS: &[&str] = &[
    "/",
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/home",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/media",
    "/mnt",
    "/opt",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/snap",
    "/srv",
    "/sys",
    "/tmp",
    "/usr",
    "/var",
    "/var/lib",
    "/var/log",
    "/var/cache",
    "/var/spool",
    "/var/mail",
    "/var/opt",
    "/var/local",
    "/var/backups",
    "/run/user",
];
/// Trees no home may be inside of.
const SYSTEM_TREES: &[&str] = &[
    "/proc", "/sys", "/dev", "/boot", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/root",
];

/// Why a directory cannot be the guarded home.
#[derive(Debug, thiserror::Error)]
pub enum HomeError {
    #[error(transparent)]
    Unit(#[from] UnitValueError),
    #[error("--home {shown}: {source}; create it, owned by {user}, or pass --home DIR")]
    Missing { shown: String, user: String, source: std::io::Error },
    #[error("--home {shown} is not canonical: it resolves to {c}; pass --home {c}", c = quoted(canonical))]
    NotCanonical { shown: String, canonical: PathBuf },
    #[error("--home {shown} is a system directory; pass the account's own home with --home DIR")]
    System { shown: String },
    #[error(
        "--home {shown} is inside {tree}, {why}, so the guard could not see it; use the account's own home \
         (e.g. under /home)"
    )]
    Private { shown: String, tree: String, why: String },
    #[error("--home {shown} is not a directory")]
    NotDir { shown: String },
    #[error(
        "--home {shown} belongs to uid {owner}, not to {user} (uid {uid}); the guard's files live in the account's \
         own home: chown it to {user} or pass --home DIR"
    )]
    NotOwned { shown: String, owner: u32, user: String, uid: u32 },
    #[error("{user} is root; guard-user guards an unprivileged account (pass --user NAME)")]
    Root { user: String },
    #[error(
        "--home {shown}: {} {why}, so the home could be replaced by a link elsewhere after install; \
         use a home whose parent directories only root can change (e.g. under /home)",
        quoted(ancestor)
    )]
    UnsafeParent { shown: String, ancestor: PathBuf, why: String },
}

const FIX: &str = "pass --home DIR";

/// Validates `home` as `account`'s guarded home (the module's rules).
pub fn validate_home(account: &Account, home: &Path) -> Result<UnitPath, HomeError> {
    let path = UnitPath::new("--home", home, FIX)?;
    let shown = quoted(home);
    if account.uid == 0 {
        return Err(HomeError::Root { user: account.name.clone() });
    }
    // Before the file system is asked: a home there is refused whether or not it exists now.
    // (Canonical, checked next, so the path itself is its only lookup step.)
    if let Some(tree) = service_hidden_trees().into_iter().find(|t| t.contains(path.as_path())) {
        return Err(HomeError::Private { shown, tree: tree.path, why: tree.why });
    }
    let canonical = fs::canonicalize(home).map_err(|source| HomeError::Missing {
        shown: shown.clone(),
        user: account.name.clone(),
        source,
    })?;
    if canonical.as_os_str() != std::ffi::OsStr::new(path.as_str()) {
        return Err(HomeError::NotCanonical { shown, canonical });
    }
    let s = path.as_str();
    let inside = |tree: &str| s == tree || s.strip_prefix(tree).is_some_and(|r| r.starts_with('/'));
    if SYSTEM_DIRS.contains(&s) || SYSTEM_TREES.iter().any(|t| inside(t)) {
        return Err(HomeError::System { shown });
    }
    let meta = fs::symlink_metadata(home).map_err(|source| HomeError::Missing {
        shown: shown.clone(),
        user: account.name.clone(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(HomeError::NotDir { shown });
    }
    if meta.uid() != account.uid {
        return Err(HomeError::NotOwned { shown, owner: meta.uid(), user: account.name.clone(), uid: account.uid });
    }
    // Each (directory, entry in it) pair from the home up: who could rename the entry?
    let mut entry_owner = meta.uid();
    let mut entry = home;
    for ancestor in home.ancestors().skip(1) {
        let m = fs::symlink_metadata(ancestor).map_err(|source| HomeError::Missing {
            shown: shown.clone(),
            user: account.name.clone(),
            source,
        })?;
        let mode = m.permissions().mode();
        let why = if m.uid() != 0 {
            Some(format!("belongs to uid {}, not root", m.uid()))
        } else if mode & 0o022 != 0 && mode & 0o1000 == 0 {
            Some(format!("is writable by group or others (mode {:o})", mode & 0o7777))
        } else if mode & 0o022 != 0 && entry_owner != 0 {
            // Sticky: only an entry's owner may rename it, so root's entries are safe here.
            Some(format!(
                "is writable by others (mode {:o}) and {} in it belongs to uid {entry_owner}, who may rename it",
                mode & 0o7777,
                quoted(entry)
            ))
        } else {
            None
        };
        if let Some(why) = why {
            return Err(HomeError::UnsafeParent { shown, ancestor: ancestor.to_path_buf(), why });
        }
        entry_owner = m.uid();
        entry = ancestor;
    }
    Ok(path)
}

/// Validates `--config` for the drop-in: expressible and absolute. It is only read by the
/// daemon (as the account), so it may be a link (usually into a checkout).
pub fn validate_config_path(config: &Path) -> Result<UnitPath, UnitValueError> {
    UnitPath::new("--config", config, "pass an absolute --config FILE without `.` or `..`")
}
