//! What the service cannot see. The unit runs the daemon in its own mount namespace: with
//! `PrivateTmp=yes` its `/tmp` and `/var/tmp` are empty directories of its own, so a config
//! source that root (outside that namespace) reads fine under `/tmp` is `config_missing` to the
//! guard, every tick. `install` refuses such a source, `--config` and `--home` before it writes
//! anything, and `check` reports a config link that leads into such a tree.
//!
//! The trees come from the unit's own text ([`hidden_trees`] reads the directives of
//! [`super::unit_text`]), so the rule follows the unit: turning `ProtectHome=` from `read-only`
//! to `yes` adds `/home`, `/root` and `/run/user`. Directives that only make a tree read-only
//! (`ProtectSystem=strict`, `ProtectHome=read-only`, …) hide nothing from a reader.
//! `tests::every_directive_of_the_unit_is_classified` fails when the unit gains a directive
//! this module does not know, so a new one is a decision, not an oversight.
//!
//! One tree is not a directive: `/run/user` holds the login runtime directories that
//! systemd-logind mounts at the account's first login and removes at its last logout (the
//! service sees them come and go), so a config there disappears with the session.
//!
//! A path is judged by every place its lookup passes through ([`lookup_steps`]): each symbolic
//! link met on the way and the file it ends at. A link chain that ends under `/tmp` is under
//! `/tmp`; so is a link that sits in `/tmp`, because the daemon follows the same chain inside
//! its own namespace, where that link does not exist.
use std::{
    collections::VecDeque,
    ffi::OsString,
    fs, io,
    os::unix::ffi::OsStrExt,
    path::{Component, Path, PathBuf},
};

use super::{escape::Executable, quoted, unit::unit_text};

/// A tree the service cannot rely on, and why (a clause that follows its path in a sentence).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HiddenTree {
    pub path: String,
    pub why: String,
}

impl HiddenTree {
    fn new(path: &str, why: impl Into<String>) -> HiddenTree {
        HiddenTree { path: path.to_string(), why: why.into() }
    }

    /// Whether `p` is this tree or inside it (whole components: `/tmpfoo` is not in `/tmp`).
    pub fn contains(&self, p: &Path) -> bool {
        let (p, t) = (p.as_os_str().as_bytes(), self.path.as_bytes());
        p == t || (p.starts_with(t) && (t == b"/" || p.get(t.len()) == Some(&b'/')))
    }
}

/// `[Service]` directives of the unit that hide nothing from a reader (they restrict writes,
/// privileges, the kernel or resources). A directive in neither this list nor [`hidden_trees`]'
/// match fails `tests::every_directive_of_the_unit_is_classified` (the only reader).
#[cfg(test)]
pub(super) const HIDES_NOTHING: &[&str] = &[
    "Type",
    "NotifyAccess",
    "WatchdogSec",
    "EnvironmentFile",
    "ExecStart",
    "ExecStartPre",
    "ExecStopPost",
    "ExecReload",
    "Restart",
    "RestartSec",
    "TimeoutStopSec",
    "RuntimeDirectory",
    "RuntimeDirectoryMode",
    "RuntimeDirectoryPreserve",
    "CapabilityBoundingSet",
    "AmbientCapabilities",
    "NoNewPrivileges",
    "LimitMEMLOCK",
    // Read-only, not hidden: the service still reads /usr, /etc, /home, /root.
    "ProtectSystem",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectControlGroups",
    "ProtectClock",
    "ProtectHostname",
    "RestrictNamespaces",
    "RestrictRealtime",
    "RestrictSUIDSGID",
    "LockPersonality",
    "MemoryDenyWriteExecute",
    "SystemCallArchitectures",
    // Syscalls, not trees: a denied one fails with EPERM.
    "SystemCallFilter",
    "SystemCallErrorNumber",
    "RestrictAddressFamilies",
    "MemoryMax",
    "TasksMax",
    "OOMScoreAdjust",
    "ReadWritePaths",
];

/// The directives [`hidden_trees`] reads (checked by the same test).
#[cfg(test)]
pub(super) const HIDING: &[&str] =
    &["PrivateTmp", "ProtectHome", "PrivateDevices", "InaccessiblePaths", "TemporaryFileSystem"];

/// systemd's `parse_boolean` for true.
fn truthy(v: &str) -> bool {
    matches!(v.to_ascii_lowercase().as_str(), "1" | "yes" | "y" | "true" | "t" | "on")
}

/// The trees a unit's `[Service]` directives hide from the service, in the order they appear.
pub fn hidden_trees(unit: &str) -> Vec<HiddenTree> {
    let mut out: Vec<HiddenTree> = Vec::new();
    let mut push = |t: HiddenTree| {
        if !out.iter().any(|o| o.path == t.path) {
            out.push(t);
        }
    };
    let mut section = "";
    for line in unit.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
            continue;
        }
        if section != "[Service]" || line.starts_with(['#', ';']) {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else { continue };
        let (key, value) = (key.trim(), value.trim());
        match key {
            // `disconnected` (systemd 256) is private too.
            "PrivateTmp" if truthy(value) || value == "disconnected" => {
                let why =
                    format!("which the unit replaces with an empty directory of the service's own ({key}={value})");
                push(HiddenTree::new("/tmp", why.clone()));
                push(HiddenTree::new("/var/tmp", why));
            }
            "ProtectHome" if truthy(value) || value == "tmpfs" => {
                let how = if value == "tmpfs" { "covers with an empty tmpfs" } else { "makes inaccessible" };
                for t in ["/home", "/root", "/run/user"] {
                    push(HiddenTree::new(t, format!("which the unit {how} ({key}={value})")));
                }
            }
            "PrivateDevices" if truthy(value) => push(HiddenTree::new(
                "/dev",
                format!("which the unit replaces with a minimal /dev of the service's own ({key}={value})"),
            )),
            "InaccessiblePaths" | "TemporaryFileSystem" => {
                let how = if key == "InaccessiblePaths" { "makes inaccessible" } else { "covers with an empty tmpfs" };
                for word in value.split_whitespace() {
                    // `-` (ignore if missing) and `+` (relative to RootDirectory=) prefixes;
                    // TemporaryFileSystem= takes `:options` after the path.
                    let path = word.trim_matches('"').trim_start_matches(['-', '+']);
                    let path = if key == "TemporaryFileSystem" { path.split(':').next().unwrap_or("") } else { path };
                    if path.starts_with('/') {
                        push(HiddenTree::new(path, format!("which the unit {how} ({key}={path})")));
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// `/run/user`: not a directive (see the module doc).
fn login_runtime() -> HiddenTree {
    HiddenTree::new(
        "/run/user",
        "which holds login sessions' runtime directories: systemd-logind removes the account's at its last logout",
    )
}

/// Every tree the installed service cannot rely on: [`hidden_trees`] of the unit this build
/// writes, then `/run/user`. The unit's directives do not depend on the binary's path.
pub fn service_hidden_trees() -> Vec<HiddenTree> {
    let bin = Executable::new(Path::new("/usr/bin/guard-user")).expect("a plain path");
    let mut trees = hidden_trees(&unit_text(&bin));
    if !trees.iter().any(|t| t.path == "/run/user") {
        trees.push(login_runtime());
    }
    trees
}

/// The most symbolic links one lookup follows (the kernel's MAXSYMLINKS).
const MAX_LINKS: usize = 40;

/// Every place a lookup of `path` passes through, in order: the location of each symbolic link
/// it follows (canonical up to that link), then the canonical file it ends at (last). Follows
/// links as `realpath(3)` does; the errors are the lookup's (missing, not a directory, too
/// many links). A relative `path` is taken against the current directory.
pub fn lookup_steps(path: &Path) -> io::Result<Vec<PathBuf>> {
    let absolute = std::path::absolute(path)?;
    let mut pending: VecDeque<OsString> = absolute.components().filter_map(normal).collect();
    let mut resolved = PathBuf::from("/");
    let mut steps = Vec::new();
    let mut links = 0;
    while let Some(c) = pending.pop_front() {
        if c == ".." {
            resolved.pop();
            continue;
        }
        let next = resolved.join(&c);
        if !fs::symlink_metadata(&next)?.file_type().is_symlink() {
            resolved = next;
            continue;
        }
        links += 1;
        if links > MAX_LINKS {
            return Err(io::Error::from_raw_os_error(libc::ELOOP));
        }
        let target = fs::read_link(&next)?;
        steps.push(next);
        if target.is_absolute() {
            resolved = PathBuf::from("/");
        }
        let names: Vec<OsString> = target.components().filter_map(normal).collect();
        for n in names.into_iter().rev() {
            pending.push_front(n);
        }
    }
    steps.push(resolved);
    Ok(steps)
}

/// A path component as a name, `..` kept, `/` and `.` dropped.
fn normal(c: Component<'_>) -> Option<OsString> {
    match c {
        Component::Normal(n) => Some(n.to_os_string()),
        Component::ParentDir => Some("..".into()),
        Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
    }
}

/// The first step of `steps` inside one of `trees`, and that tree.
pub fn first_hidden<'a>(steps: &[PathBuf], trees: &'a [HiddenTree]) -> Option<(PathBuf, &'a HiddenTree)> {
    steps.iter().find_map(|s| trees.iter().find(|t| t.contains(s)).map(|t| (s.clone(), t)))
}

/// The fix every refusal of a config path names.
pub const FIX: &str = "put it under the account's home or /etc/guard-user and pass --config-source FILE";

/// A config path (the source, `--config`) the service could not read.
#[derive(Debug, thiserror::Error)]
#[error("{what} {} {} {}, {}, so the guard could not read it; {fix}", quoted(given), lead(given, step), tree.path, tree.why)]
pub struct HiddenError {
    /// `the config source` or `--config`.
    pub what: &'static str,
    pub given: PathBuf,
    /// Where the lookup met the tree: `given` itself, a link on the way, or the file it ends at.
    pub step: PathBuf,
    pub tree: HiddenTree,
    pub fix: String,
}

fn lead(given: &Path, step: &Path) -> String {
    if std::path::absolute(given).is_ok_and(|g| g == step) {
        "is inside".to_string()
    } else {
        format!("leads to {}, inside", quoted(step))
    }
}

/// Which lookup of a path matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judge {
    /// A file the daemon reads (the config source): the whole lookup, links at the end too.
    File,
    /// Where install writes the link (`--config`): its directory's lookup, then the name.
    /// Whatever is there now is replaced, so it is not followed (an account's link there into
    /// /tmp must not stop install).
    LinkPlace,
}

/// The steps that matter of `path` ([`Judge`]). `None` when the lookup fails.
fn steps_of(path: &Path, judge: Judge) -> Option<Vec<PathBuf>> {
    if judge == Judge::File {
        return lookup_steps(path).ok();
    }
    let absolute = std::path::absolute(path).ok()?;
    let (dir, name) = (absolute.parent()?, absolute.file_name()?);
    let mut steps = lookup_steps(dir).ok()?;
    let last = steps.pop()?.join(name);
    steps.push(last);
    Some(steps)
}

/// Refuses `given` (named `what` in the error) when the lookup that matters ([`Judge`]) passes
/// through a tree the service cannot see (see the module doc). A lookup that fails (a missing
/// file or directory) is not this rule's business: the caller reports that.
pub fn refuse_hidden(what: &'static str, given: &Path, judge: Judge, fix: &str) -> Result<(), Box<HiddenError>> {
    let Some(steps) = steps_of(given, judge) else { return Ok(()) };
    match first_hidden(&steps, &service_hidden_trees()) {
        Some((step, tree)) => Err(Box::new(HiddenError {
            what,
            given: given.to_path_buf(),
            step,
            tree: tree.clone(),
            fix: fix.to_string(),
        })),
        None => Ok(()),
    }
}
