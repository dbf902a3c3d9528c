//! `guard-user pid <pid> is running outside guard-user@<user>.service`: a guard for the account
//! that systemd does not supervise.
use std::{fs, path::Path};

use clap::Parser as _;
use guard_cli::{Cli, Command};

use super::{layout::Layout, systemctl::Systemctl};
use crate::{account::Account, procfs};

/// Whether `argv` is a `guard-user run` for `account` (see the module doc of [`super`]).
///
/// The argv is parsed with the binary's own command line ([`Cli`]), so what counts as a daemon
/// is exactly what `guard-user` itself would run as one: `run`, or no subcommand at all. Every
/// other subcommand (`tree`, `holders`, `status`, a hidden one…) is not a daemon, and neither is
/// an argv the command line refuses (`--help`, a typo, a missing value, an unknown option): such
/// a `guard-user` exits at once with a usage error and never enforces. The one cost: a daemon of
/// an older build started with an option this build no longer has is not recognised.
pub fn is_guard_run_for(argv: &[String], euid: u32, account: &Account) -> bool {
    let Some(exe) = argv.first() else { return false };
    if Path::new(exe).file_name().and_then(|n| n.to_str()) != Some("guard-user") {
        return false;
    }
    let Ok(cli) = Cli::try_parse_from(argv) else { return false };
    let run = match cli.command {
        None => cli.run,
        Some(Command::Run(run)) => run,
        Some(_) => return false,
    };
    match run.account.user {
        Some(u) => u == account.name || u == account.uid.to_string(),
        None => euid == account.uid,
    }
}

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
        // Only a process named guard-user has its command line read, and only as much of it as
        // a daemon's can be: root reads nothing long or slow that an account wrote.
        let Some(p) = procfs::read_process(pid, &mut buf) else { continue };
        if p.comm.as_bytes() != b"guard-user" {
            continue;
        }
        let Some(raw) = read_argv(pid) else { continue };
        let argv: Vec<String> =
            raw.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
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

/// The most of a command line [`leaked_daemons`] reads: a daemon's (`run` with its flags and
/// paths) is far shorter; a longer one is no daemon this build started.
const MAX_ARGV: usize = 64 << 10;

/// `/proc/PID/cmdline` as NUL-separated bytes: whole and under [`MAX_ARGV`], read within 100 ms,
/// else `None`.
fn read_argv(pid: u32) -> Option<Vec<u8>> {
    let mut file = fs::File::open(format!("/proc/{pid}/cmdline")).ok()?;
    let mut budget = crate::budget::Budget::bytes(MAX_ARGV)
        .ending(std::time::Instant::now() + std::time::Duration::from_millis(100));
    let mut raw = Vec::new();
    let filled = budget.fill(&mut file, MAX_ARGV, &mut raw).ok()?;
    (filled == crate::budget::Fill::Whole).then_some(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_command_line_a_daemon_could_have_is_read() {
        let me = read_argv(std::process::id()).expect("this process's own");
        assert!(me.contains(&0), "NUL-separated as the kernel gives it");
        let long = "x".repeat(MAX_ARGV);
        let mut child = std::process::Command::new("sh").args(["-c", "sleep 30", "sh", &long]).spawn().unwrap();
        let pid = child.id();
        // Until the shell's own command line is there (right after the fork it is the test's).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut got = read_argv(pid);
        while got.as_ref().is_some_and(|a| !a.starts_with(b"sh\0")) && std::time::Instant::now() < deadline {
            std::thread::yield_now();
            got = read_argv(pid);
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(got, None, "a command line over {MAX_ARGV} bytes is not read");
    }

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

    /// Every subcommand of the command line, hidden ones too, with its required arguments
    /// filled in and `--user alice` where it takes one: a new subcommand is covered without
    /// editing a list.
    fn one_of_each_subcommand() -> Vec<(String, Vec<String>)> {
        use clap::CommandFactory as _;
        Cli::command()
            .get_subcommands()
            .map(|sub| {
                let mut argv = v(&["/usr/bin/guard-user", sub.get_name()]);
                if sub.get_arguments().any(|a| a.get_long() == Some("user")) {
                    argv.extend(v(&["--user", "alice"]));
                }
                for arg in sub.get_arguments().filter(|a| a.is_required_set()) {
                    if let Some(long) = arg.get_long() {
                        argv.push(format!("--{long}"));
                    }
                    argv.push("x".into());
                }
                (sub.get_name().to_string(), argv)
            })
            .collect()
    }

    #[test]
    fn only_the_run_subcommand_is_a_daemon() {
        let a = acct();
        let all = one_of_each_subcommand();
        for want in ["run", "tree", "holders", "explain", "status", "check", "__pattern-worker"] {
            assert!(all.iter().any(|(n, _)| n == want), "no `{want}` among {all:?}");
        }
        for (name, argv) in &all {
            // The argv is one the binary accepts, so the answer is about the subcommand.
            if let Err(e) = Cli::try_parse_from(argv) {
                panic!("{argv:?} does not parse: {e}");
            }
            for euid in [0, 1000] {
                assert_eq!(is_guard_run_for(argv, euid, &a), name == "run", "{argv:?} at euid {euid}");
            }
        }
        // What an operator types while the daemon runs, as the account (no --user) and as root.
        for argv in [
            &["guard-user", "tree"][..],
            &["guard-user", "tree", "--json"],
            &["guard-user", "holders", "/home/alice/src"],
            &["guard-user", "holders", "--stop", "/home/alice/run"],
            &["guard-user", "explain", "cc1plus"],
            &["guard-user", "status", "--fleet"],
        ] {
            assert!(!is_guard_run_for(&v(argv), 1000, &a), "{argv:?}");
            let mut as_root = v(argv);
            as_root.extend(v(&["--user", "alice"]));
            assert!(!is_guard_run_for(&as_root, 0, &a), "{as_root:?}");
        }
    }

    #[test]
    fn a_run_is_read_as_the_command_line_reads_it() {
        let a = acct();
        for (argv, euid) in [
            (&["guard-user", "run"][..], 1000),
            (&["guard-user", "run", "--user", "alice", "--interval", "1s"], 0),
            (&["guard-user", "run", "--user", "1000", "--backend", "procfs"], 0),
            (&["guard-user", "--user=alice", "--dry-run"], 0),
            // Option values that spell a subcommand's name are values.
            (&["guard-user", "--config", "run"], 1000),
            (&["guard-user", "--home", "status"], 1000),
            (&["guard-user", "run", "--config", "tree", "--user", "alice"], 0),
        ] {
            assert!(is_guard_run_for(&v(argv), euid, &a), "{argv:?} at euid {euid}");
        }
        for (argv, euid) in [
            (&["guard-user", "run"][..], 0),
            (&["guard-user", "run", "--user", "bob"], 1000),
            (&["guard-user", "--user", "1001"], 1000),
        ] {
            assert!(!is_guard_run_for(&v(argv), euid, &a), "{argv:?} at euid {euid}");
        }
    }

    /// A process the account renamed to `guard-user`, or a `guard-user` the command line
    /// refuses, is not a daemon: `guard-user` exits with a usage error on such an argv.
    #[test]
    fn an_argv_the_command_line_refuses_is_not_a_daemon() {
        let a = acct();
        for argv in [
            &["guard-user", "--json"][..],
            &["guard-user", "rnu"],
            &["guard-user", "run", "--user"],
            &["guard-user", "run", "--interval"],
            &["guard-user", "run", "--backend", "bogus"],
            &["guard-user", "run", "--", "--user", "alice"],
            &["guard-user", "run", "--user", "alice", "--user", "alice"],
            &["guard-user", "run", "--user", "alice", "extra"],
            &["guard-user", "--dry-run", "run", "--user", "alice"],
            &["guard-user", "--help"],
            &["guard-user", "run", "--help", "--user", "alice"],
            &["guard-user", "--version"],
            &["guard-user", "help", "run"],
            &["guard-user", "\u{1b}[2J", "--user", "alice"],
            &["guard-user", "run\n", "--user", "alice"],
        ] {
            for euid in [0, 1000] {
                assert!(!is_guard_run_for(&v(argv), euid, &a), "{argv:?} at euid {euid}");
            }
        }
    }
}
