//! docs/operations.md `check`: reads only, and reports drift.
use std::{
    fs, io,
    path::{Path, PathBuf},
    time::SystemTime,
};

use super::{
    layout::{Layout, Provider, LEGACY_SCRIPT},
    leaked::leaked_daemons,
    links_to, read_config,
    systemctl::Systemctl,
    unit::{unit_text, DropIn},
};
use crate::{config, status};

/// `check`'s findings: docs/operations.md drift lines, checks that could not run (and why), and notes
/// that explain a drift line (printed apart, so each drift stays one line).
#[derive(Debug, Default)]
pub struct Report {
    pub drift: Vec<String>,
    pub skipped: Vec<String>,
    pub notes: Vec<String>,
}

fn denied(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::PermissionDenied
}

fn differs(path: &Path) -> String {
    format!("{} is missing or differs from this build", path.display())
}

/// docs/operations.md `check`: reads only.
pub fn check(layout: &Layout, sc: &Systemctl, now: SystemTime) -> Report {
    let mut r = Report::default();
    config_link(layout, &mut r);
    for p in layout.legacy_paths() {
        match fs::symlink_metadata(&p) {
            Ok(_) if p.ends_with(LEGACY_SCRIPT) => {
                r.drift.push(format!("{} is still present, so the legacy guard can run beside guard-user", p.display()))
            }
            Ok(_) => r.drift.push(format!("{} still runs the legacy guard", p.display())),
            Err(e) if denied(&e) => r.skipped.push(format!("{}: {e} (run as root)", p.display())),
            Err(_) => {}
        }
    }
    units(layout, &mut r);
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
    leaked_daemons(layout, sc, &mut r);
    r
}

fn config_link(layout: &Layout, r: &mut Report) {
    let link = &layout.config_link;
    let d = link.display();
    match fs::symlink_metadata(link) {
        Err(e) if denied(&e) => r.skipped.push(format!("{d}: {e} (run as root)")),
        Err(_) => r.drift.push(format!("{d} is missing")),
        Ok(_) => {
            if !links_to(link, &layout.source) {
                r.drift.push(format!("{d} is not a link to {}", layout.source.display()));
            }
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

/// The template (ours or the packaged one), a template shadowing the packaged one, and the
/// drop-in, each against what this build writes.
fn units(layout: &Layout, r: &mut Report) {
    let unit = layout.unit_path();
    match layout.executable() {
        Ok(bin) if fs::read(&unit).ok().as_deref() == Some(unit_text(&bin).as_bytes()) => {}
        Ok(_) => r.drift.push(differs(&unit)),
        Err(e) => {
            r.drift.push(differs(&unit));
            r.notes.push(format!("{}: {e}", unit.display()));
        }
    }
    if let Some(shadow) = layout.shadowing_unit_path().filter(|p| fs::symlink_metadata(p).is_ok()) {
        r.drift.push(format!("{} shadows the packaged {}", shadow.display(), unit.display()));
    }
    let path = layout.dropin_path();
    if let Some(why) = dropin_problem(layout, &path) {
        r.drift.push(differs(&path));
        r.notes.push(format!("{}: {why}", path.display()));
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
    let show =
        |c: &Option<crate::install::escape::UnitPath>| c.as_ref().map_or("(none)".to_string(), |c| c.to_string());
    Some(if parsed.bin != expected.bin {
        format!("it runs {}, this build is {}", parsed.bin, expected.bin)
    } else if parsed.home != expected.home {
        format!("it was installed with --home {}, check looked at --home {}", parsed.home, expected.home)
    } else {
        format!(
            "it was installed with --config {}, check looked at --config {}",
            show(&parsed.config),
            show(&expected.config)
        )
    })
}

fn status_path(layout: &Layout) -> PathBuf {
    let state = read_config(&layout.config_link, &layout.home, (&layout.account).into())
        .map(|c| c.state_file)
        .unwrap_or_else(|_| config::expand_tilde(config::DEFAULT_STATE_FILE, &layout.home));
    status::path_beside(&state)
}

fn heartbeat(layout: &Layout, now: SystemTime, r: &mut Report) {
    let path = status_path(layout);
    let s = match status::read(&path, (&layout.account).into()) {
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
