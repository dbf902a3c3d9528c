//! `guard-user pid <pid> is running outside guard-user@<user>.service`: a guard for the account
//! that systemd does not supervise.
use std::{fs, path::Path};

use super::{layout::Layout, systemctl::Systemctl};
use crate::{account::Account, procfs};

/// Whether `argv` is a `guard-user run` for `account` (see the module doc of [`super`]).
pub fn is_guard_run_for(argv: &[String], euid: u32, account: &Account) -> bool {
    let Some(exe) = argv.first() else { return false };
    if Path::new(exe).file_name().and_then(|n| n.to_str()) != Some("guard-user") {
        return false;
    }
    // `run`, or no subcommand at all (bare `guard-user [--flags]` runs the daemon).
    let is_run =
        argv.get(1).is_some_and(|a| a == "run") || !argv[1..].iter().any(|a| SUBCOMMANDS.contains(&a.as_str()));
    if !is_run {
        return false;
    }
    let mut user = None;
    let mut it = argv[1..].iter();
    while let Some(a) = it.next() {
        if a == "--user" {
            user = it.next().cloned();
        } else if let Some(v) = a.strip_prefix("--user=") {
            user = Some(v.to_string());
        }
    }
    match user {
        Some(u) => u == account.name || u == account.uid.to_string(),
        None => euid == account.uid,
    }
}

/// Every subcommand but `run` (hidden ones too: a pattern worker or a generator run is not a daemon).
const SUBCOMMANDS: &[&str] = &[
    "run",
    "match",
    "status",
    "check",
    "install",
    "uninstall",
    "validate",
    "explain",
    "record",
    "help",
    "__pattern-worker",
    "__unit",
    // An older build's generator (`cargo xtask dist` renders the man pages itself now).
    "__generate",
];

/// One drift line per guard daemon of the account running outside its unit; `Err` says why
/// the processes could not be looked at.
pub(super) fn leaked_daemons(layout: &Layout, sc: &Systemctl) -> Result<Vec<String>, String> {
    let instance = layout.instance();
    let mut buf = Vec::new();
    // The unit's process, identified by pid and start time read right after asking systemd.
    let main_pid = sc.main_pid(&instance);
    let main = (main_pid != 0).then(|| procfs::read_process(main_pid, &mut buf).map(|p| p.id)).flatten();
    let Ok(dir) = fs::read_dir("/proc") else {
        return Err("leaked daemons: /proc is not readable".into());
    };
    let me = std::process::id();
    let mut leaked = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid == me {
            continue;
        }
        let Ok(raw) = fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let argv: Vec<String> =
            raw.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        let Some(p) = procfs::read_process(pid, &mut buf) else { continue };
        if !is_guard_run_for(&argv, p.euid, &layout.account) {
            continue;
        }
        if main == Some(p.id) {
            continue;
        }
        leaked.push(pid);
    }
    leaked.sort_unstable();
    Ok(leaked.into_iter().map(|pid| format!("guard-user pid {pid} is running outside {instance}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acct() -> Account {
        Account { name: "alice".into(), uid: 1000, gid: 1000, home: "/home/alice".into() }
    }

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn a_run_for_the_account_is_recognised_by_name_uid_or_euid() {
        let a = acct();
        assert!(is_guard_run_for(&v(&["/usr/local/bin/guard-user", "run", "--user", "alice"]), 0, &a));
        assert!(is_guard_run_for(&v(&["guard-user", "run", "--user=1000"]), 0, &a));
        assert!(is_guard_run_for(&v(&["guard-user", "--dry-run"]), 1000, &a));
        assert!(is_guard_run_for(&v(&["guard-user"]), 1000, &a));
        assert!(!is_guard_run_for(&v(&["guard-user", "run", "--user", "bob"]), 1000, &a));
        assert!(!is_guard_run_for(&v(&["guard-user", "check", "--user", "alice"]), 0, &a));
        assert!(!is_guard_run_for(&v(&["guard-user", "--home", "/x", "status"]), 1000, &a));
        assert!(!is_guard_run_for(&v(&["vim", "run", "--user", "alice"]), 1000, &a));
    }
}
