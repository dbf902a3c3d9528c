//! docs/operations.md `check`: reads only, and reports drift.
use std::{
    fs, io,
    path::{Path, PathBuf},
    time::SystemTime,
};

use super::{
    hidden::{first_hidden, lookup_steps, service_hidden_trees},
    layout::{Layout, Provider, LEGACY_SCRIPT},
    leaked::leaked_daemons,
    links_to, read_config, record, shown,
    systemctl::Systemctl,
    unit::{unit_text, DropIn},
};
use crate::status;

/// `check`'s findings: docs/operations.md drift lines, checks that could not run (and why), and notes
/// that explain a drift line (printed apart, so each drift stays one line).
#[derive(Debug, Default)]
pub struct Report {
    pub drift: Vec<String>,
    pub skipped: Vec<String>,
    pub notes: Vec<String>,
    /// The source the config link was compared against: `--config-source`, else the one install
    /// recorded. `None` when neither is known (then the record is drift).
    pub source: Option<PathBuf>,
    /// The flags `/etc/default/guard-user` adds to `run` (or the running daemon got), shown
    /// after the verdict: `flags: --interval 30s (GUARD_ARGS from /etc/default/guard-user)`.
    pub flags: Option<String>,
}

fn denied(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::PermissionDenied
}

fn differs(path: &Path) -> String {
    format!("{} is missing or differs from this build", shown(path))
}

/// docs/operations.md `check`: reads only.
pub fn check(layout: &Layout, sc: &Systemctl, now: SystemTime) -> Report {
    let mut r = Report::default();
    config_link(layout, &mut r);
    for p in layout.legacy_paths() {
        match fs::symlink_metadata(&p) {
            Ok(_) if p.ends_with(LEGACY_SCRIPT) => {
                r.drift.push(format!("{} is still present, so the legacy guard can run beside guard-user", shown(&p)))
            }
            Ok(_) => r.drift.push(format!("{} still runs the legacy guard", shown(&p))),
            Err(e) if denied(&e) => r.skipped.push(format!("{}: {e} (run as root)", shown(&p))),
            Err(_) => {}
        }
    }
    units(layout, &mut r);
    let defaults = super::defaults::check(layout, sc);
    r.drift.extend(defaults.drift);
    r.flags = defaults.flags;
    if let Provider::Source { .. } = layout.provider {
        // A packaged binary is the running one (that is how the host was recognised).
        let same_binary = match (fs::read(layout.bin_path()), fs::read(&layout.exe)) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        };
        if !same_binary {
            r.drift.push(differs(&layout.bin_path()));
        }
    }
    let instance = layout.instance();
    if !sc.is_enabled(&instance) {
        r.drift.push(format!("{instance} is not enabled"));
    }
    if !sc.is_active(&instance) {
        r.drift.push(format!("{instance} is not active"));
    }
    heartbeat(layout, now, &mut r);
    match leaked_daemons(layout, sc) {
        Ok(drift) => r.drift.extend(drift),
        Err(why) => r.skipped.push(why),
    }
    r
}

/// The source the link must point to: `--config-source` when given, else the one install
/// recorded. A record that is missing, cannot be trusted or names another source than the one
/// asked about is drift (a later `install` without `--config-source` would link what it says).
fn expected_source(layout: &Layout, r: &mut Report) -> Option<PathBuf> {
    let path = layout.record_path();
    let link = shown(&layout.config_link);
    match (record::read(&path, &layout.user), &layout.source) {
        (Ok(recorded), None) => Some(recorded),
        (Ok(recorded), Some(asked)) if &recorded == asked => Some(recorded),
        (Ok(recorded), Some(asked)) => {
            r.drift.push(differs(&path));
            r.notes.push(format!(
                "{}: it records {}, check looked at --config-source {}",
                shown(&path),
                shown(&recorded),
                shown(asked)
            ));
            Some(asked.clone())
        }
        // Not root, and root's directory is closed to us: not drift, a check we could not make.
        // SAFETY: geteuid cannot fail.
        (Err(record::RecordError::Io(e)), asked) if denied(&e) && unsafe { libc::geteuid() } != 0 => {
            r.skipped.push(format!("{}: {e} (run as root)", shown(&path)));
            asked.clone()
        }
        (Err(why), asked) => {
            r.drift.push(differs(&path));
            let now = match fs::read_link(&layout.config_link) {
                Ok(t) => format!(" (it links to {} now)", shown(&t)),
                Err(_) => String::new(),
            };
            r.notes.push(format!(
                "{}: {why}. Without it check cannot tell which config source {link} should link to{now}; run {}",
                shown(&path),
                layout.install_command(Path::new("FILE"))
            ));
            asked.clone()
        }
    }
}

fn config_link(layout: &Layout, r: &mut Report) {
    let expected = expected_source(layout, r);
    r.source = expected.clone();
    let link = &layout.config_link;
    let d = shown(link);
    // The fix for a link that is wrong: install again from the expected source, with the
    // --home and --config this instance has, so nothing the operator chose is discarded.
    let relink = expected.as_ref().map(|s| format!("; run {}", layout.install_command(s))).unwrap_or_default();
    match fs::symlink_metadata(link) {
        Err(e) if denied(&e) => r.skipped.push(format!("{d}: {e} (run as root)")),
        Err(_) => r.drift.push(format!("{d} is missing{relink}")),
        Ok(_) => {
            if let Some(source) = expected.as_deref().filter(|s| !links_to(link, s)) {
                r.drift.push(format!("{d} is not a link to {}{relink}", shown(source)));
                r.notes.push(match fs::read_link(link) {
                    Ok(t) => format!("{d} links to {}", shown(&t)),
                    Err(_) => format!("{d} is not a symbolic link"),
                });
            }
            hidden_link(layout, expected.as_deref(), r);
            match read_config(link, &layout.home, (&layout.account).into()) {
                // Not root and not the account: our own rights were not enough.
                // SAFETY: geteuid cannot fail.
                Err(e) if e.is_permission_denied() && unsafe { libc::geteuid() } != 0 => {
                    r.skipped.push(format!("{d}: {e} (run as root)"))
                }
                // The ERROR line's reason, with its fix: what the log, status and heartbeat say.
                Err(e) => r.drift.push(format!("{d} is invalid: {}", e.log_reason())),
                Ok(_) => {}
            }
        }
    }
}

/// The daemon follows the link inside the unit's mount namespace, where a tree the unit hides
/// is empty or gone: root reading it here would see a config the guard never does. The lookup
/// runs with the account's identity (the daemon reads the config as the account).
fn hidden_link(layout: &Layout, expected: Option<&Path>, r: &mut Report) {
    let trees = service_hidden_trees();
    let steps = {
        let _scope = crate::safefs::FsIdentity { uid: layout.account.uid, gid: layout.account.gid }.scope();
        lookup_steps(&layout.config_link)
    };
    // A lookup that fails is the config check's to report (config_missing, unreadable).
    let Ok(steps) = steps else { return };
    let Some((step, tree)) = first_hidden(&steps, &trees) else { return };
    // Linking the expected source again fixes it, unless that source is hidden itself.
    let fix = match expected.filter(|s| first_hidden(&[s.to_path_buf()], &trees).is_none()) {
        Some(source) => format!("run {}", layout.install_command(source)),
        None => format!(
            "put the source under the account's home or /etc/guard-user and run {}",
            layout.install_command(Path::new("FILE"))
        ),
    };
    r.drift.push(format!(
        "{} leads to {}, inside {}, {}, so the guard cannot read it; {fix}",
        shown(&layout.config_link),
        shown(&step),
        tree.path,
        tree.why
    ));
}

/// The template (ours or the packaged one), a template shadowing the packaged one, and the
/// drop-in, each against what this build writes.
fn units(layout: &Layout, r: &mut Report) {
    let unit = layout.unit_path();
    match layout.executable() {
        Ok(bin) if fs::read(&unit).ok().as_deref() == Some(unit_text(&bin).as_bytes()) => {}
        Ok(_) => r.drift.push(differs(&unit)),
        Err(e) => {
            r.drift.push(differs(&unit));
            r.notes.push(format!("{}: {e}", shown(&unit)));
        }
    }
    if let Some(shadow) = layout.shadowing_unit_path().filter(|p| fs::symlink_metadata(p).is_ok()) {
        r.drift.push(format!("{} shadows the packaged {}", shown(&shadow), shown(&unit)));
    }
    let path = layout.dropin_path();
    if let Some(why) = dropin_problem(layout, &path) {
        r.drift.push(differs(&path));
        r.notes.push(format!("{}: {why}", shown(&path)));
    }
}

/// Why the installed drop-in is not the one install would write for this layout, if it is not.
fn dropin_problem(layout: &Layout, path: &Path) -> Option<String> {
    let installed = match fs::read(path) {
        Ok(b) => b,
        Err(e) => return Some(e.to_string()),
    };
    let Ok(text) = String::from_utf8(installed) else {
        return Some("it is not in the format guard-user install writes".into());
    };
    let parsed = match DropIn::parse(&text) {
        Ok(d) => d,
        Err(e) => return Some(e.to_string()),
    };
    let expected = match layout.dropin() {
        Ok(d) => d,
        Err(e) => return Some(format!("its values are no longer valid: {e}")),
    };
    if parsed == expected {
        return None;
    }
    let show = |c: &Option<crate::install::escape::UnitPath>| {
        c.as_ref().map_or("(none)".to_string(), |c| shown(c.as_path()).to_string())
    };
    Some(if parsed.bin != expected.bin {
        format!("it runs {}, this build is {}", parsed.bin, expected.bin)
    } else if parsed.home != expected.home {
        format!(
            "it was installed with --home {}, check looked at --home {}",
            shown(parsed.home.as_path()),
            shown(expected.home.as_path())
        )
    } else {
        format!(
            "it was installed with --config {}, check looked at --config {}",
            show(&parsed.config),
            show(&expected.config)
        )
    })
}

fn heartbeat(layout: &Layout, now: SystemTime, r: &mut Report) {
    let path = status::locate(&layout.config_link, &layout.home, (&layout.account).into());
    let copy = crate::daemon::instance::trusted_status(layout.account.uid, &layout.home);
    let s = match status::read_trusted(&path, (&layout.account).into(), copy.as_ref()) {
        Ok(s) => s,
        Err(e) => {
            if !e.is_missing() {
                r.skipped.push(format!("heartbeat: {e}"));
            }
            return;
        }
    };
    // The one staleness rule (status and status --json use it too).
    let fresh = s.freshness(now);
    if fresh.stale {
        let at = crate::duration::saturating_from_secs_f64(s.last_tick.max(0.0));
        let last = crate::log::local_timestamp(SystemTime::UNIX_EPOCH + at);
        r.drift.push(format!("the guard has not completed a tick for {}s (last at {last})", fresh.age_secs as u64));
    }
}
