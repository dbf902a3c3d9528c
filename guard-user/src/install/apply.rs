//! `install` and `uninstall`: the only code that writes. Unit files and the binary are root's
//! (written as root, atomically, only when their bytes change); everything in the account's
//! home is written with the account's file-system identity.
use std::{
    fs, io,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
};

use super::{
    layout::{Layout, Provider, LEGACY_SCRIPT, LEGACY_UNITS, LEGACY_UNIT_DIR},
    read_config, record, shown,
    systemctl::{systemd_running, Systemctl},
    unit::{unit_text, HEADER},
    InstallError,
};
use crate::safefs::{self, FsIdentity};

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> InstallError + '_ {
    move |source| InstallError::Io { path: path.to_path_buf(), source }
}

/// What one install did, in order; empty when nothing changed.
pub type Changes = Vec<String>;

/// How install ended: scheduled under systemd, or only linked (systemd not running).
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Scheduled,
    NotScheduled,
}

fn identity(layout: &Layout) -> FsIdentity {
    FsIdentity { uid: layout.account.uid, gid: layout.account.gid }
}

/// Temp name beside `path` (same directory, so the rename is atomic).
fn temp_beside(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp.{}", std::process::id()))
}

/// Whether `link` is a symlink to `source` (resolving a relative target against its directory,
/// and comparing canonical paths, so `../x` and `/abs/x` to the same file agree).
pub fn links_to(link: &Path, source: &Path) -> bool {
    let Ok(target) = fs::read_link(link) else { return false };
    let target = if target.is_absolute() { target } else { link.parent().unwrap_or(Path::new("/")).join(target) };
    target == source || fs::canonicalize(&target).ok().as_deref() == Some(source)
}

/// Points `link` at `source` in one step, as `who`: a symlink written beside it under a temp
/// name (so it belongs to `who`), renamed over whatever is there (a hand copy, a link to
/// another checkout). A reader sees the old entry or the new one, never none. As `who`, a
/// directory the account cannot write refuses the link instead of root writing through it.
/// Returns whether anything changed.
pub fn relink(link: &Path, source: &Path, who: FsIdentity) -> Result<bool, InstallError> {
    let _scope = who.scope();
    if links_to(link, source) {
        let meta = fs::symlink_metadata(link).map_err(io_err(link))?;
        if meta.uid() == who.uid {
            return Ok(false);
        }
    }
    let tmp = temp_beside(link);
    // A leftover (or planted) temp entry: unlink removes the entry, never a link's target.
    let _ = fs::remove_file(&tmp);
    let result = (|| {
        std::os::unix::fs::symlink(source, &tmp).map_err(io_err(&tmp))?;
        fs::rename(&tmp, link).map_err(io_err(link))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map(|()| true)
}

/// Writes `bytes` to the root-owned `path` unless it already holds exactly them with `mode`.
/// Returns whether it wrote.
pub fn write_if_different(path: &Path, bytes: &[u8], mode: u32) -> Result<bool, InstallError> {
    if let Ok(meta) = fs::symlink_metadata(path) {
        if meta.file_type().is_file()
            && meta.permissions().mode() & 0o7777 == mode
            && fs::read(path).ok().as_deref() == Some(bytes)
        {
            return Ok(false);
        }
    }
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
    }
    safefs::atomic_write_mode(path, bytes, mode, FsIdentity::ROOT).map_err(|e| match e {
        safefs::SafeFsError::Io { path, source } => InstallError::Io { path, source },
        other => InstallError::Io { path: path.to_path_buf(), source: io::Error::other(other.to_string()) },
    })?;
    Ok(true)
}

fn remove_if_present(path: &Path) -> Result<bool, InstallError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(InstallError::Io { path: path.into(), source: e }),
    }
}

/// docs/operations.md step 2: disables the legacy user units where the account's user manager answers,
/// then removes them (and their `.wants` links) and the legacy script, as the account.
pub fn retire_legacy(layout: &Layout, sc: &Systemctl, changes: &mut Changes) -> Result<(), InstallError> {
    let who = identity(layout);
    let unit_dir = layout.home.join(LEGACY_UNIT_DIR);
    let present: Vec<&str> = {
        let _scope = who.scope();
        LEGACY_UNITS.iter().copied().filter(|u| fs::symlink_metadata(unit_dir.join(u)).is_ok()).collect()
    };
    let manager = format!("{}@", layout.user);
    // systemctl runs outside the scope: a child would inherit the account's fs identity.
    let answering = !present.is_empty() && sc.user_manager_answers(layout.user.as_str());
    if answering {
        for u in &present {
            // A unit that is already disabled or not loaded is not a failure here.
            let _ = sc.query(&["--user", "-M", &manager, "disable", "--now", u]);
            changes.push(format!("disabled the legacy user unit {u}"));
        }
    }
    {
        let _scope = who.scope();
        // What the account itself cannot remove is not its legacy guard (e.g. `.config` is a
        // link into root's files): it stays, is said here, and check keeps reporting it.
        let mut remove = |path: PathBuf, say: bool| match remove_if_present(&path) {
            Ok(true) if say => changes.push(format!("removed {}", shown(&path))),
            Ok(_) => {}
            Err(InstallError::Io { source, .. }) if source.kind() == io::ErrorKind::PermissionDenied => {
                changes.push(format!("left {}: {} cannot remove it ({source})", shown(&path), layout.user))
            }
            Err(e) => changes.push(format!("left {}: {e}", shown(&path))),
        };
        for u in LEGACY_UNITS {
            for wants in ["timers.target.wants", "default.target.wants"] {
                remove(unit_dir.join(wants).join(u), false);
            }
            remove(unit_dir.join(u), true);
        }
        remove(layout.home.join(LEGACY_SCRIPT), true);
    }
    if answering {
        let _ = sc.query(&["--user", "-M", &manager, "daemon-reload"]);
    }
    Ok(())
}

/// docs/operations.md `install`, steps 1–3.
pub fn install(layout: &Layout, sc: &Systemctl) -> Result<(Outcome, Changes), InstallError> {
    // Every value the unit files carry is validated before anything is written.
    let dropin = layout.dropin()?;
    let source = layout.source.as_deref().expect("Layout::for_install sets the source");
    read_config(source, &layout.home, (&layout.account).into())
        .map_err(|reason| InstallError::InvalidSource { path: source.to_path_buf(), reason: Box::new(reason) })?;
    let mut changes = Changes::new();
    // The record first: should the link fail, check still names the source asked for (and
    // suggests linking it), never the one this install was replacing.
    let record = layout.record_path();
    if write_if_different(&record, record::text(&layout.user, source).as_bytes(), 0o644)? {
        changes.push(format!("recorded the config source in {}", shown(&record)));
    }
    if relink(&layout.config_link, source, identity(layout))? {
        changes.push(format!("linked {} to {}", shown(&layout.config_link), shown(source)));
    }
    retire_legacy(layout, sc, &mut changes)?;

    let mut bin_changed = false;
    let mut unit_changed = false;
    match &layout.provider {
        Provider::Source { .. } => {
            let bin = fs::read(&layout.exe).map_err(io_err(&layout.exe))?;
            bin_changed = write_if_different(&layout.bin_path(), &bin, 0o755)?;
            if bin_changed {
                changes.push(format!("installed {}", shown(&layout.bin_path())));
            }
            let unit = unit_text(&dropin.bin);
            if write_if_different(&layout.unit_path(), unit.as_bytes(), 0o644)? {
                unit_changed = true;
                changes.push(format!("wrote {}", shown(&layout.unit_path())));
            }
        }
        Provider::Packaged { .. } => {
            if let Some(shadow) = layout.shadowing_unit_path() {
                if remove_own_unit(&shadow)? {
                    unit_changed = true;
                    changes.push(format!("removed {} (it shadowed the packaged unit)", shown(&shadow)));
                }
            }
        }
    }
    if write_if_different(&layout.dropin_path(), dropin.text().as_bytes(), 0o644)? {
        unit_changed = true;
        changes.push(format!("wrote {}", shown(&layout.dropin_path())));
    }

    if !systemd_running() {
        return Ok((Outcome::NotScheduled, changes));
    }
    let instance = layout.instance();
    if unit_changed {
        sc.run(&["daemon-reload"])?;
        changes.push("reloaded systemd".into());
    }
    let was_active = sc.is_active(&instance);
    if !sc.is_enabled(&instance) || !was_active {
        sc.run(&["enable", "--now", &instance])?;
        changes.push(format!("enabled and started {instance}"));
    } else if unit_changed || bin_changed {
        // enable --now leaves a running instance on the old build or command line.
        sc.run(&["restart", &instance])?;
        changes.push(format!("restarted {instance}"));
    }
    Ok((Outcome::Scheduled, changes))
}

/// Removes a template at `path` that guard-user wrote (its first line is [`HEADER`]);
/// refuses anyone else's. Returns whether one was removed.
fn remove_own_unit(path: &Path) -> Result<bool, InstallError> {
    match fs::read_to_string(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Ok(text) if text.starts_with(HEADER) => remove_if_present(path),
        _ => Err(InstallError::ForeignUnit { path: path.to_path_buf() }),
    }
}

/// Other accounts' enabled instances (links in `<unit-dir>/*.wants/`).
fn other_instances(layout: &Layout) -> Vec<String> {
    let mine = layout.instance();
    let mut out = Vec::new();
    let Ok(dir) = fs::read_dir(&layout.unit_dir) else { return out };
    for wants in dir.flatten().filter(|e| e.file_name().to_string_lossy().ends_with(".wants")) {
        for e in fs::read_dir(wants.path()).into_iter().flatten().flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with("guard-user@") && n.ends_with(".service") && n != mine && !out.contains(&n) {
                out.push(n);
            }
        }
    }
    out
}

/// `uninstall`: stops and disables the instance, removes its drop-in, and (from source) the
/// unit and the binary unless another account's instance still uses them; a packaged unit and
/// binary belong to the package. Keeps the config link and the log.
/// Returns the changes and the other instances that kept the shared files.
pub fn uninstall(layout: &Layout, sc: &Systemctl) -> Result<(Changes, Vec<String>), InstallError> {
    let mut changes = Changes::new();
    let instance = layout.instance();
    let running = systemd_running();
    if running && (sc.is_enabled(&instance) || sc.is_active(&instance)) {
        sc.run(&["disable", "--now", &instance])?;
        changes.push(format!("stopped and disabled {instance}"));
    }
    for path in [layout.dropin_path(), layout.record_path()] {
        if remove_if_present(&path)? {
            changes.push(format!("removed {}", shown(&path)));
        }
    }
    let dropin = layout.dropin_path();
    if let Some(d) = dropin.parent() {
        let _ = fs::remove_dir(d); // only when empty: an operator's own drop-ins stay
    }
    let others = other_instances(layout);
    if others.is_empty() && matches!(layout.provider, Provider::Source { .. }) {
        for p in [layout.unit_path(), layout.bin_path()] {
            if remove_if_present(&p)? {
                changes.push(format!("removed {}", shown(&p)));
            }
        }
    }
    if running && !changes.is_empty() {
        sc.run(&["daemon-reload"])?;
    }
    Ok((changes, others))
}
