//! Sessions and leftovers on the real kernel (docs/configuration.md `sessions`): a root that
//! starts a setsid child, a double-forked grandchild, an excluded process, a process that renames
//! itself and another account's process, then exits; its leftovers are reported or stopped, and
//! nothing outside the session is touched. Hostile: a fork bomb under a root, a root that
//! re-execs itself, and (in a throwaway guest kernel) pids reused between the root's exit and
//! the grace. Run as root (`cargo xtask test`).
use std::{
    collections::BTreeMap,
    fs,
    io::{BufRead, BufReader, Write},
    os::unix::{fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    time::Duration,
};

use integration_tests::*;

const WAIT: Duration = Duration::from_secs(40);
const ROOTS: &str = r#"["(^|/)agent-wrapper (session|bomb) "]"#;

/// A session root (guard-probe's `session`/`bomb` modes) and everything it announced; all of it
/// killed on drop, the setsid child included (it left the root's process group).
struct Root {
    child: Child,
    stdin: Option<ChildStdin>,
    dir: PathBuf,
}

impl Root {
    /// Starts `DIR/agent-wrapper args…` as the test account, in a process group of its own;
    /// with `real_root` its real uid stays 0 (effective uid the account's: it is the account's
    /// process), so a child of it can become another account's process through setuid.
    fn spawn(dir: &Path, args: &[&str], real_root: bool) -> Root {
        Root::spawn_in(dir, args, real_root, true)
    }

    /// [`Root::spawn`]; without `own_group` the root stays in the test's process group, so its
    /// pid is free for reuse once it is reaped (a group's id is not reused while the group lives).
    fn spawn_in(dir: &Path, args: &[&str], real_root: bool, own_group: bool) -> Root {
        let mut cmd = Command::new(dir.join("agent-wrapper"));
        cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped());
        if own_group {
            cmd.process_group(0);
        }
        // SAFETY: only async-signal-safe syscalls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let ruid = if real_root { 0 } else { TEST_UID };
                let ok = libc::setgroups(0, std::ptr::null()) == 0
                    && libc::setresgid(TEST_UID, TEST_UID, TEST_UID) == 0
                    && libc::setresuid(ruid, TEST_UID, 0) == 0;
                if ok {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        let mut child = cmd.spawn().expect("spawn the root");
        let mut root = Root { stdin: child.stdin.take(), child, dir: dir.to_path_buf() };
        root.expect_line("ready");
        root
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn expect_line(&mut self, want: &str) {
        let mut line = String::new();
        let out = self.child.stdout.as_mut().expect("stdout");
        BufReader::new(out).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), want);
    }

    /// One line on its stdin: it exits (or re-execs).
    fn poke(&mut self) {
        let _ = self.stdin.as_mut().unwrap().write_all(b"go\n");
    }

    /// Role → pid, from `DIR/pids`.
    fn roles(&self) -> BTreeMap<String, u32> {
        fs::read_to_string(self.dir.join("pids"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| Some((l.split(' ').next()?.to_string(), l.split(' ').nth(1)?.parse().ok()?)))
            .collect()
    }

    fn wait_exit(&mut self) {
        let _ = self.child.wait();
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        for pid in self.roles().values() {
            // Only what still runs one of this test's binaries (a pid reused since is left alone).
            let exe = fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
            if exe.starts_with(&self.dir) {
                unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
            }
        }
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// A home with the probe copies a root uses, and a config with `sessions`.
fn home_for(leftovers: &str, grace: &str) -> (Home, PathBuf) {
    let home = Home::new();
    for name in ["agent-wrapper", "watcher", "daemonish", "claude"] {
        home.probe_named(name);
    }
    let dir = home.path().join("bin");
    // The root and its children write pids and signals here as the test account.
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    home.write_config(&format!(
        r#"{{"threshold": 100000, "excludes": ["claude"],
            "sessions": {{"roots": {ROOTS}, "leftovers": "{leftovers}", "grace": "{grace}"}}}}"#
    ));
    (home, dir)
}

fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

fn signals(dir: &Path) -> String {
    fs::read_to_string(dir.join("signals")).unwrap_or_default()
}

/// Waits until the status lists a live session of `root` with at least `members` processes.
fn wait_recognised(home: &Home, root: u32, members: usize) {
    let st = home.wait_status(WAIT, |s| {
        s.sessions.as_ref().is_some_and(|x| {
            x.sessions.iter().any(|r| r.root_pid == root && r.stage == "live" && r.processes.len() >= members)
        })
    });
    assert!(
        st.as_ref().and_then(|s| s.sessions.as_ref()).is_some_and(|x| x.sessions.iter().any(|r| r.root_pid == root)),
        "the root {root} was never recognised: {st:#?}\n{}",
        home.log()
    );
}

#[guard_test(needs = [root, ebpf])]
fn a_roots_leftovers_are_stopped_and_nothing_outside_its_session_is_touched() {
    let _g = setup();
    let (home, dir) = home_for("stop", "2s");
    // A watcher outside the session, with the same name as a leftover.
    let outside_rec = dir.join("outside-signals");
    let mut outside = Probe::spawn(&dir.join("watcher"), &["record", outside_rec.to_str().unwrap()], TEST_UID);
    let daemon = Daemon::start(&home, &[]);
    home.wait_log(WAIT, |l| !lines(l, "TICK_COMPLETE").is_empty());
    let mut root = Root::spawn(&dir, &["session", dir.to_str().unwrap(), &OTHER_UID.to_string()], true);
    let roles = root.roles();
    let (setsid, double, excluded, renamed, other) =
        (roles["setsid"], roles["double"], roles["excluded"], roles["renamed"], roles["other"]);
    wait_recognised(&home, root.pid(), 4);
    // `tree` lists the session: the root and its four processes of the account, not the others.
    let tree = Command::new(guard_bin())
        .args(["tree", "--json", "--user", TEST_USER, "--home"])
        .arg(home.path())
        .output()
        .unwrap();
    let tree: serde_json::Value = serde_json::from_slice(&tree.stdout).unwrap();
    let session = &tree["sessions"][0];
    assert_eq!(session["root_pid"], root.pid(), "{tree:#}");
    let mut listed: Vec<u64> =
        session["processes"].as_array().unwrap().iter().map(|p| p["pid"].as_u64().unwrap()).collect();
    listed.sort_unstable();
    let mut want: Vec<u64> = [setsid, double, excluded, renamed].map(u64::from).to_vec();
    want.sort_unstable();
    assert_eq!(listed, want, "{tree:#}");

    root.poke();
    root.wait_exit();
    home.wait_log(WAIT, |l| !lines(l, "REAPED").is_empty());
    daemon.stop();
    let log = home.log();
    let session_lines: Vec<&str> = log
        .lines()
        .filter(|l| ["LEFTOVER", "SKIPPED", "REAPED", "DRY_RUN"].iter().any(|e| l.split(' ').nth(2) == Some(e)))
        .collect();
    eprintln!("the session's lines:\n{}", session_lines.join("\n"));
    for (pid, name) in [(setsid, "watcher"), (double, "daemonish"), (excluded, "claude"), (renamed, "renamed")] {
        let want = format!(" LEFTOVER pid={pid} name={name} root={} age=", root.pid());
        assert!(log.contains(&want), "no{want}\n{log}");
    }
    assert!(log.contains(&format!("SKIPPED pid={excluded} name=claude reason=excluded_name")), "{log}");
    let reaped = lines(&log, "REAPED");
    assert_eq!(reaped.len(), 1, "{log}");
    assert!(
        reaped[0].ends_with(&format!("REAPED root={} name=agent-wrapper count=3 survivors=1", root.pid())),
        "{log}"
    );
    for pid in [setsid, double, renamed] {
        assert!(!alive(pid), "leftover {pid} survived\n{log}");
    }
    // The renamed one ignored SIGTERM (recorded) and needed the SIGKILL.
    assert!(signals(&dir).contains(&format!("{renamed} 15")), "{}", signals(&dir));
    assert!(alive(excluded), "the excluded leftover was ended\n{log}");
    assert!(alive(other), "another account's process was ended\n{log}");
    assert!(!signals(&dir).contains(&format!("{other} ")), "another account's process was signalled");
    assert!(outside.is_alive(), "the same-named watcher outside the session was ended\n{log}");
    assert_eq!(fs::read_to_string(&outside_rec).unwrap_or_default(), "", "the watcher outside was signalled");
    assert!(!log.contains(&format!("pid={} ", outside.pid())), "{log}");
    assert!(!log.contains(&format!("pid={other} ")), "{log}");
}

/// The `procfs` backend has no fork events: its lineage is what each tick's scan shows (parent
/// links), so a process reparented before a scan saw it (the double-forked grandchild here) is no
/// one's leftover, while the others are stopped as with events (docs/configuration.md).
#[guard_test(needs = [root])]
fn under_the_procfs_backend_the_lineage_is_what_each_scan_shows() {
    let _g = setup();
    let (home, dir) = home_for("stop", "1s");
    // No excludeCommands: a procfs tick in a TCG guest spends its round's time on the scan, and
    // an undecided leftover is never ended (that bound has its own tests).
    home.write_config(&format!(
        r#"{{"threshold": 100000, "excludes": ["claude"], "excludeCommands": [],
            "sessions": {{"roots": {ROOTS}, "leftovers": "stop", "grace": "1s"}}}}"#
    ));
    let daemon = Daemon::start(&home, &["--backend", "procfs"]);
    home.wait_log(WAIT, |l| !lines(l, "TICK_COMPLETE").is_empty());
    let mut root = Root::spawn(&dir, &["session", dir.to_str().unwrap(), "0"], false);
    let roles = root.roles();
    wait_recognised(&home, root.pid(), 3);
    root.poke();
    root.wait_exit();
    let log = home.wait_log(WAIT, |l| !lines(l, "REAPED").is_empty());
    daemon.stop();
    for role in ["setsid", "excluded", "renamed"] {
        assert!(log.contains(&format!("LEFTOVER pid={} ", roles[role])), "{role}\n{log}");
    }
    assert!(!log.contains(&format!("pid={} ", roles["double"])), "the reparented grandchild\n{log}");
    assert!(alive(roles["double"]), "the grandchild no scan saw in the session was ended\n{log}");
    let reaped = lines(&log, "REAPED");
    assert!(
        reaped[0].ends_with(&format!("REAPED root={} name=agent-wrapper count=2 survivors=1", root.pid())),
        "{log}"
    );
}

#[guard_test(needs = [root, ebpf])]
fn report_logs_each_leftover_once_and_ends_nothing() {
    let _g = setup();
    let (home, dir) = home_for("report", "1s");
    let daemon = Daemon::start(&home, &[]);
    home.wait_log(WAIT, |l| !lines(l, "TICK_COMPLETE").is_empty());
    let mut root = Root::spawn(&dir, &["session", dir.to_str().unwrap(), "0"], false);
    let roles = root.roles();
    wait_recognised(&home, root.pid(), 4);
    root.poke();
    root.wait_exit();
    home.wait_log(WAIT, |l| lines(l, "LEFTOVER").len() >= 4);
    // A few more ticks: nothing more is logged about it.
    let ticks = lines(&home.log(), "TICK_COMPLETE").len();
    let log = home.wait_log(WAIT, |l| lines(l, "TICK_COMPLETE").len() >= ticks + 3);
    daemon.stop();
    assert_eq!(lines(&log, "LEFTOVER").len(), 4, "{log}");
    assert!(lines(&log, "REAPED").is_empty() && lines(&log, "SKIPPED").is_empty(), "{log}");
    for pid in roles.values() {
        assert!(alive(*pid), "{pid} was ended in report mode\n{log}");
    }
    assert_eq!(signals(&dir), "", "report mode signalled something");
}

#[guard_test(needs = [root, ebpf])]
fn a_fork_bomb_under_a_root_is_reaped_in_one_line_with_bounded_memory() {
    let _g = setup();
    // 2,000 processes on the host; 500 in a TCG guest, where every one costs tens of times more.
    let forks: usize = if std::env::var_os("GUARD_IN_VM").is_some() { 250 } else { 1000 };
    let (_, rss_kib, tracked) = bomb_reaped(forks, &[]);
    assert!(rss_kib > 0 && rss_kib < 64 * 1024, "the daemon's RSS is {rss_kib} KiB (the unit's MemoryMax is 64 MiB)");
    eprintln!(
        "fork bomb: {} leftovers reaped in one line; daemon RSS {rss_kib} KiB; lineage holds {tracked} now",
        2 * forks
    );
}

/// The kernel drops events its ring buffer has no room for (a TCG guest's 500-process bomb lost
/// 8): a lost fork must not leave its child, or what that child forks, out of the session. The
/// debug build's fault hook drops every 7th fork event and counts it lost, as the kernel does.
#[guard_test(needs = [root, ebpf])]
fn forks_the_kernel_could_not_deliver_leave_no_leftover_outside_its_session() {
    let _g = setup();
    let (log, _, _) = bomb_reaped(60, &[("GUARD_FAULT", "lose_forks:7")]);
    let resyncs: Vec<&str> = log.lines().filter(|l| l.contains(" RESYNC reason=lost_events ")).collect();
    assert!(!resyncs.is_empty(), "no fork was lost, the test proved nothing\n{log}");
    eprintln!("lost forks: {} rebuilds for lost events; all 120 leftovers found", resyncs.len());
}

/// A root (`agent-wrapper bomb`) forks `forks` children that each fork once, the status lists all
/// 2 × `forks` in its session, the root exits: one `REAPED` line ends them all. Returns the log,
/// the daemon's RSS (KiB) then, and what the lineage held after.
fn bomb_reaped(forks: usize, env: &[(&str, &str)]) -> (String, u64, u64) {
    let (home, dir) = home_for("stop", "1s");
    // No excludeCommands: under TCG, 2,000 command lines through the sandboxed matcher overrun
    // a 1 s tick's round, and an undecided leftover is never ended (that bound has its own tests).
    home.write_config(&format!(
        r#"{{"threshold": 100000, "excludeCommands": [],
            "sessions": {{"roots": {ROOTS}, "leftovers": "stop", "grace": "1s"}}}}"#
    ));
    let daemon = Daemon::start_with(&home, &[], env);
    home.wait_log(WAIT, |l| !lines(l, "TICK_COMPLETE").is_empty());
    let mut root = Root::spawn(&dir, &["bomb", dir.to_str().unwrap(), &forks.to_string()], false);
    // Every member, before the root exits (a member missing now would be missing at the grace).
    let listed = |s: &guard::status::Status| {
        let rows = s.sessions.as_ref().map(|x| x.sessions.as_slice()).unwrap_or_default();
        let row = rows.iter().find(|r| r.root_pid == root.pid() && r.stage == "live");
        row.map_or(0, |r| r.processes.len() as u64 + r.processes_omitted)
    };
    let st = home.wait_status(WAIT, |s| listed(s) >= 2 * forks as u64);
    let got = st.as_ref().map_or(0, listed);
    assert_eq!(got, 2 * forks as u64, "the session lists {got} of {} members\n{}", 2 * forks, home.log());
    root.poke();
    root.wait_exit();
    let log = home.wait_log(Duration::from_secs(90), |l| !lines(l, "REAPED").is_empty());
    let rss_kib = fs::read_to_string(format!("/proc/{}/status", daemon.child.id()))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix(" kB")?.parse::<u64>().ok())
        .unwrap_or(0);
    let status = home.wait_status(WAIT, |_| true).unwrap();
    daemon.stop();
    let reaped = lines(&log, "REAPED");
    let others: Vec<&str> = log.lines().filter(|l| !l.contains(" LEFTOVER ")).collect();
    assert_eq!(reaped.len(), 1, "{}", others.join("\n"));
    let want = format!("REAPED root={} name=agent-wrapper count={} survivors=0", root.pid(), 2 * forks);
    assert!(reaped[0].ends_with(&want), "{}", others.join("\n"));
    assert_eq!(lines(&log, "LEFTOVER").len(), 2 * forks);
    (log, rss_kib, status.sessions.unwrap().tracked)
}

#[guard_test(needs = [root, ebpf])]
fn a_root_that_re_execs_itself_stays_one_session() {
    let _g = setup();
    let (home, dir) = home_for("stop", "1s");
    let daemon = Daemon::start(&home, &[]);
    home.wait_log(WAIT, |l| !lines(l, "TICK_COMPLETE").is_empty());
    let mut root = Root::spawn(&dir, &["session", dir.to_str().unwrap(), "0", "reexec"], false);
    wait_recognised(&home, root.pid(), 4);
    root.poke(); // re-execs, forks `late`
    root.expect_line("ready");
    let late = root.roles()["late"];
    wait_recognised(&home, root.pid(), 5);
    let before = home.log();
    assert!(lines(&before, "LEFTOVER").is_empty(), "a re-exec is not an end\n{before}");
    root.poke();
    root.wait_exit();
    let log = home.wait_log(WAIT, |l| !lines(l, "REAPED").is_empty());
    daemon.stop();
    assert!(log.contains(&format!("LEFTOVER pid={late} name=watcher root={}", root.pid())), "{log}");
    let reaped = lines(&log, "REAPED");
    assert_eq!(reaped.len(), 1, "{log}");
    assert!(
        reaped[0].ends_with(&format!("REAPED root={} name=agent-wrapper count=4 survivors=1", root.pid())),
        "{log}"
    );
    assert!(!alive(late), "the leftover forked after the re-exec survived\n{log}");
}

/// Pids reused between the root's exit and the grace, in a throwaway guest kernel only (it lowers
/// `kernel.pid_max` and exhausts the pid space): the root exits, a leftover is killed during the
/// grace, and a same-account churner outside the session takes every free pid at once, theirs
/// included. At the grace only the real leftovers are reported and stopped; no bystander is
/// signalled.
#[guard_test(needs = [root, ebpf, guest])]
fn pids_reused_between_the_roots_exit_and_the_grace_are_never_taken_for_leftovers() {
    let _g = setup();
    let (home, dir) = home_for("stop", "5s");
    let bystander = home.probe_named("bystander");
    // probe_named left the directory 0755: the root's processes write there too.
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    let (list, by_rec) = (dir.join("bystander-pids"), dir.join("bystander-signals"));
    let daemon = Daemon::start(&home, &[]);
    home.wait_log(WAIT, |l| lines(l, "TICK_COMPLETE").len() >= 2);
    // The root's orphans come to this process (a subreaper, as systemd --user is), so the
    // leftover killed below is reaped here and its pid freed at once.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) };
    let pid_max = PidMax::lower_to(1024);
    let mut root = Root::spawn_in(&dir, &["session", dir.to_str().unwrap(), "0"], false, false);
    let roles = root.roles();
    let (root_pid, killed) = (root.pid(), roles["setsid"]);
    assert!(root_pid < 1024 && killed < 1024, "pids {root_pid} {killed} not under the lowered pid_max");
    wait_recognised(&home, root_pid, 4);
    root.poke();
    root.wait_exit();
    unsafe { libc::kill(killed as i32, libc::SIGKILL) };
    unsafe { libc::waitpid(killed as i32, std::ptr::null_mut(), 0) };
    let mut churner = Command::new(&bystander)
        .args(["churn", list.to_str().unwrap(), by_rec.to_str().unwrap()])
        .uid(TEST_UID)
        .gid(TEST_UID)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("churner");
    let mut line = String::new();
    BufReader::new(churner.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "full", "the churner never exhausted the pid space");
    let churner = Probe { child: churner };
    let log = home.wait_log(WAIT, |l| !lines(l, "REAPED").is_empty());
    let pids: Vec<u32> = fs::read_to_string(&list).unwrap().lines().map(|l| l.parse().unwrap()).collect();
    let signalled = fs::read_to_string(&by_rec).unwrap_or_default();
    drop(churner);
    drop(pid_max);
    daemon.stop();
    let reused: Vec<u32> = [root_pid, killed].into_iter().filter(|p| pids.contains(p)).collect();
    assert!(!reused.is_empty(), "neither the root's pid nor the killed leftover's was reused; the test proved nothing");
    assert_eq!(signalled, "", "a bystander received a signal\n{log}");
    assert!(!log.contains(&format!("LEFTOVER pid={killed} ")), "a reused pid was taken for a leftover\n{log}");
    let reaped = lines(&log, "REAPED");
    assert_eq!(reaped.len(), 1, "{log}");
    assert!(reaped[0].ends_with(&format!("REAPED root={root_pid} name=agent-wrapper count=2 survivors=1")), "{log}");
    eprintln!(
        "session pid reuse: {} of the root's and a leftover's pids reused by bystanders, none signalled",
        reused.len()
    );
}

guard_test::main!();
