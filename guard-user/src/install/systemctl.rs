//! `systemctl`, looked up in `PATH` (tests put a fake first), and whether systemd runs at all.
use std::{path::Path, process::Command};

use super::InstallError;

/// Whether systemd is the running init: `/run/systemd/system` exists (what `sd_booted(3)`
/// tests). `GUARD_SYSTEMD_RUNNING=1|0` overrides the answer (tests run without systemd).
pub fn systemd_running() -> bool {
    match std::env::var("GUARD_SYSTEMD_RUNNING").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => Path::new("/run/systemd/system").is_dir(),
    }
}

#[derive(Clone, Debug, Default)]
pub struct Systemctl;

pub struct Answer {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Systemctl {
    pub fn query(&self, args: &[&str]) -> Answer {
        match Command::new("systemctl").args(args).stdin(std::process::Stdio::null()).output() {
            Ok(o) => Answer {
                ok: o.status.success(),
                stdout: String::from_utf8_lossy(&o.stdout).trim().to_string(),
                stderr: String::from_utf8_lossy(&o.stderr).trim().to_string(),
            },
            Err(e) => Answer { ok: false, stdout: String::new(), stderr: format!("cannot run systemctl: {e}") },
        }
    }

    pub fn run(&self, args: &[&str]) -> Result<(), InstallError> {
        let a = self.query(args);
        if a.ok {
            Ok(())
        } else {
            Err(InstallError::Systemctl {
                args: args.join(" "),
                detail: if a.stderr.is_empty() { a.stdout } else { a.stderr },
            })
        }
    }

    pub fn is_enabled(&self, unit: &str) -> bool {
        let a = self.query(&["is-enabled", unit]);
        a.ok && a.stdout.starts_with("enabled")
    }

    pub fn is_active(&self, unit: &str) -> bool {
        self.query(&["is-active", unit]).stdout == "active"
    }

    /// Whether `user`'s systemd user manager answers (`--user -M user@`).
    pub fn user_manager_answers(&self, user: &str) -> bool {
        let m = format!("{user}@");
        let a = self.query(&["--user", "-M", &m, "is-system-running"]);
        matches!(a.stdout.as_str(), "running" | "degraded" | "starting" | "initializing" | "maintenance")
    }

    /// The unit's main pid (0 when it has none).
    pub fn main_pid(&self, unit: &str) -> u32 {
        self.query(&["show", "-p", "MainPID", "--value", unit]).stdout.parse().unwrap_or(0)
    }
}
