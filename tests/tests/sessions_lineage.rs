//! Sessions on the real kernel where the account works against the lineage (docs/configuration.md
//! `sessions`, docs/architecture.md "What the lineage sees"): members that visit another uid
//! through a real set-user-ID program and come back, a root that leaves the account, a leftover
//! that keeps forking to new pids, 4,100 execs with an empty argv ahead of a real root, 1,024 fake
//! roots, and `tree` listing reported leftovers from root's copy of the status while the account
//! rewrites the one in its home. Run as root (`cargo xtask test`); each takes the host-wide lock.
use std::{
    collections::BTreeMap,
    fs,
    io::{BufRead, BufReader, Write},
    os::unix::{fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    time::{Duration, Instant},
};

use guard_test::guard_test;
use integration_tests::*;

const WAIT: Duration = Duration::from_secs(40);
const ROOTS: &str = r#"["(^|/)agent-wrapper (session|visitor|leaver|hopper) "]"#;

/// A session root run as the test account (real, effective and saved uid), in a process group
/// of its own; it and everything it announced are killed on drop.
struct Root {
    child: Child,
    stdin: Option<ChildStdin>,
    dir: PathBuf,
}

impl Root {
    fn spawn(dir: &Path, args: &[&str]) -> Root {
        let mut cmd = Command::new(dir.join("agent-wrapper"));
        cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).process_group(0);
        // SAFETY: only async-signal-safe syscalls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                let ok = libc::setgroups(0, std::ptr::null()) == 0
                    && libc::setresgid(TEST_UID, TEST_UID, TEST_UID) == 0
                    && libc::setresuid(TEST_UID, TEST_UID, TEST_UID) == 0;
                if ok {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        let mut child = cmd.spawn().expect("spawn the root");
        // A root that fails before `ready` may leave a child holding its stdout: its whole group
        // is killed if no line comes, so the read ends.
        let group = child.id() as i32;
        let (said, watch) = std::sync::mpsc::channel::<()>();
        let watchdog = std::thread::spawn(move || {
            if watch.recv_timeout(WAIT).is_err() {
                unsafe { libc::kill(-group, libc::SIGKILL) };
            }
        });
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        let _ = said.send(());
        watchdog.join().unwrap();
        assert_eq!(line.trim(), "ready", "the root {:?} did not start", args);
        Root { stdin: child.stdin.take(), child, dir: dir.to_path_buf() }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// One line on its stdin: it exits (or, `leaver`, leaves the account).
    fn poke(&mut self) {
        let _ = self.stdin.as_mut().unwrap().write_all(b"go\n");
    }

    fn roles(&self) -> BTreeMap<String, u32> {
        roles(&self.dir)
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        for pid in self.roles().values() {
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

/// Role → pid, from `DIR/pids`.
fn roles(dir: &Path) -> BTreeMap<String, u32> {
    fs::read_to_string(dir.join("pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| Some((l.split(' ').next()?.to_string(), l.split(' ').nth(1)?.parse().ok()?)))
        .collect()
}

/// A home with the probe copies the roots use (`sgish` set-user-ID root, as `sg` is), and a
/// config with `sessions`.
fn home_for(leftovers: &str, grace: &str, roots: &str) -> (Home, PathBuf) {
    let home = Home::new();
    for name in ["agent-wrapper", "watcher", "daemonish", "claude", "hopper", "sgish", "spawner"] {
        home.probe_named(name);
    }
    let dir = home.path().join("bin");
    // Small programs for the crowds (thousands of probes would cost gigabytes): `cat` waits on
    // its stdin whatever its argv, `sleep` with a count.
    for (name, from) in [("idler", "/bin/cat"), ("sleeper", "/bin/sleep")] {
        fs::copy(from, dir.join(name)).unwrap();
        fs::set_permissions(dir.join(name), fs::Permissions::from_mode(0o755)).unwrap();
    }
    fs::set_permissions(dir.join("sgish"), fs::Permissions::from_mode(0o4755)).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    home.write_config(&format!(
        r#"{{"threshold": 100000, "excludes": ["claude", "idler"], "excludeCommands": [],
            "sessions": {{"roots": {roots}, "leftovers": "{leftovers}", "grace": "{grace}"}}}}"#
    ));
    (home, dir)
}

fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

/// Live processes of the test account named `name`.
fn named(name: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else { continue };
        let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let uid = status.lines().find(|l| l.starts_with("Uid:")).and_then(|l| l.split_whitespace().nth(2));
        if comm.trim_end() == name && uid == Some(&TEST_UID.to_string()) && alive(pid) {
            out.push(pid);
        }
    }
    out
}

/// Waits until the status lists a live session of `root`.
fn wait_recognised(home: &Home, root: u32, timeout: Duration) -> bool {
    home.wait_status(timeout, |s| {
        s.sessions.as_ref().is_some_and(|x| x.sessions.iter().any(|r| r.root_pid == root && r.stage == "live"))
    })
    .is_some_and(|s| s.sessions.is_some_and(|x| x.sessions.iter().any(|r| r.root_pid == root)))
}

fn tree(home: &Home, json: bool) -> std::process::Output {
    let mut cmd = Command::new(guard_bin());
    cmd.args(["tree", "--user", TEST_USER, "--home"]).arg(home.path());
    if json {
        cmd.arg("--json");
    }
    cmd.output().unwrap()
}

fn leftover_pids(log: &str, root: u32) -> Vec<u32> {
    let mut pids: Vec<u32> = lines(log, "LEFTOVER")
        .iter()
        .filter(|l| l.contains(&format!(" root={root} ")))
        .filter_map(|l| l.split(" pid=").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids
}

#[guard_test(needs = [root, ebpf])]
fn tree_lists_reported_leftovers_from_roots_copy_until_they_exit() {
    let _g = setup();
    let (home, dir) = home_for("report", "1s", ROOTS);
    let daemon = Daemon::start(&home, &[]);
    home.wait_log(WAIT, |l| !lines(l, "TICK_COMPLETE").is_empty());
    let mut root = Root::spawn(&dir, &["session", dir.to_str().unwrap(), "0"]);
    let kids = root.roles();
    assert!(wait_recognised(&home, root.pid(), WAIT), "{}", home.log());
    root.poke();
    let _ = root.child.wait();
    home.wait_log(WAIT, |l| lines(l, "LEFTOVER").len() >= 4);
    // The tick after the LEFTOVER lines wrote its status: the leftovers are listed, reported.
    let reported = |s: &guard::status::Status| {
        s.sessions.as_ref().is_some_and(|x| x.sessions.iter().any(|r| r.stage == "reported" && r.processes.len() == 4))
    };
    assert!(home.wait_status(WAIT, reported).is_some_and(|s| reported(&s)), "{}", home.log());
    // The account rewrites the status file in its home to list nothing (the daemon held still
    // meanwhile, so its next tick does not rewrite it first): root's tree never reads it.
    unsafe { libc::kill(daemon.child.id() as i32, libc::SIGSTOP) };
    let forged = home.path().join("guard-status.json");
    let mut fake: serde_json::Value = serde_json::from_slice(&fs::read(&forged).unwrap()).unwrap();
    fake["sessions"]["sessions"] = serde_json::json!([]);
    fake["sessions"]["reported"] = 0.into();
    let _ = fs::remove_file(&forged);
    fs::write(&forged, serde_json::to_vec(&fake).unwrap()).unwrap();
    std::os::unix::fs::chown(&forged, Some(TEST_UID), Some(TEST_UID)).unwrap();
    let out = tree(&home, false);
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("guard-user tree after the LEFTOVER lines:\n{text}");
    assert!(text.contains("1 with reported leftovers still running"), "{text}");
    assert!(
        text.contains(&format!("root {} agent-wrapper  ended, these leftovers were reported", root.pid())),
        "{text}"
    );
    for role in ["setsid", "double", "excluded", "renamed"] {
        assert!(text.contains(&format!(" {} ", kids[role])), "{role} {} not listed:\n{text}", kids[role]);
    }
    let status =
        Command::new(guard_bin()).args(["status", "--user", TEST_USER, "--home"]).arg(home.path()).output().unwrap();
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.contains("4 reported leftovers still running") && status.contains("guard-user tree lists them"),
        "{status}"
    );
    unsafe { libc::kill(daemon.child.id() as i32, libc::SIGCONT) };
    // One exits: the next tick lists the other three.
    unsafe { libc::kill(kids["setsid"] as i32, libc::SIGKILL) };
    let three = |s: &guard::status::Status| {
        s.sessions.as_ref().is_some_and(|x| x.sessions.iter().any(|r| r.stage == "reported" && r.processes.len() == 3))
    };
    home.wait_status(WAIT, three);
    let json: serde_json::Value = serde_json::from_slice(&tree(&home, true).stdout).unwrap();
    let listed: Vec<u64> =
        json["sessions"][0]["processes"].as_array().unwrap().iter().map(|p| p["pid"].as_u64().unwrap()).collect();
    assert_eq!(listed.len(), 3, "{json:#}");
    assert_eq!(json["sessions"][0]["stage"], "reported", "{json:#}");
    assert!(!listed.contains(&u64::from(kids["setsid"])), "{json:#}");
    daemon.stop();
}

#[guard_test(needs = [root, ebpf])]
fn members_that_visit_another_uid_through_a_set_user_id_program_stay_in_their_session() {
    let _g = setup();
    let (home, dir) = home_for("stop", "1s", ROOTS);
    let daemon = Daemon::start(&home, &[]);
    home.wait_log(WAIT, |l| !lines(l, "TICK_COMPLETE").is_empty());
    let mut root = Root::spawn(&dir, &["visitor", dir.to_str().unwrap()]);
    let r = root.roles();
    let role = |k: &str| {
        *r.get(k).unwrap_or_else(|| panic!("{k} was not announced: {r:?} {:?}", fs::read_to_string(dir.join("pids"))))
    };
    let (sgish, visited, back) = (role("sgish"), role("visited"), role("back"));
    assert!(wait_recognised(&home, root.pid(), WAIT), "{}", home.log());
    root.poke();
    let _ = root.child.wait();
    let log = home.wait_log(WAIT, |l| !lines(l, "REAPED").is_empty());
    daemon.stop();
    let mut want = vec![sgish, visited, back];
    want.sort_unstable();
    assert_eq!(leftover_pids(&log, root.pid()), want, "sg's child, newgrp's child and the program itself\n{log}");
    assert!(
        lines(&log, "REAPED")[0]
            .ends_with(&format!("REAPED root={} name=agent-wrapper count=3 survivors=0", root.pid())),
        "{log}"
    );
    for pid in want {
        assert!(!alive(pid), "{pid} survived\n{log}");
    }
}

#[guard_test(needs = [root, ebpf])]
fn a_root_that_leaves_the_account_has_ended_and_what_it_starts_is_its_leftover() {
    let _g = setup();
    let (home, dir) = home_for("report", "1s", ROOTS);
    let daemon = Daemon::start(&home, &[]);
    home.wait_log(WAIT, |l| !lines(l, "TICK_COMPLETE").is_empty());
    let mut root = Root::spawn(&dir, &["leaver", dir.to_str().unwrap()]);
    assert!(wait_recognised(&home, root.pid(), WAIT), "{}", home.log());
    root.poke(); // `exec sgish …`: set-user-ID root, then back
    let log = home.wait_log(WAIT, |l| lines(l, "LEFTOVER").len() >= 3);
    daemon.stop();
    let r = root.roles();
    assert!(alive(root.pid()), "the root's process runs on, as sgish (reported, not stopped)");
    // What it started, and the root's own pid once it came back to the account: it left its
    // session when it left the account, and what runs there now is that session's leftover.
    let mut want = vec![root.pid(), r["visited"], r["back"]];
    want.sort_unstable();
    assert_eq!(leftover_pids(&log, root.pid()), want, "{log}");
}

/// Generations the hopper made so far (each appends its pid to `DIR/hops`).
fn hops(dir: &Path) -> usize {
    fs::read_to_string(dir.join("hops")).unwrap_or_default().lines().count()
}

/// Whether the hopper stopped making generations: none in half a second, checked for up to `within`.
fn hopper_stopped(dir: &Path, within: Duration) -> bool {
    let end = Instant::now() + within;
    loop {
        let before = hops(dir);
        std::thread::sleep(Duration::from_millis(500));
        if hops(dir) == before {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
    }
}

#[guard_test(needs = [root, ebpf])]
fn a_leftover_that_keeps_forking_to_new_pids_cannot_outrun_the_stop() {
    let _g = setup();
    let (home, dir) = home_for("stop", "1s", ROOTS);
    let daemon = Daemon::start(&home, &[]);
    home.wait_log(WAIT, |l| !lines(l, "TICK_COMPLETE").is_empty());
    // A new pid every millisecond (each process lives about 1 ms), SIGTERM ignored; it stays in
    // the root's process group, which the root's drop kills as a whole whatever happens. Not as
    // fast as fork goes: that overflows the ring buffer on a loaded host (`RESYNC
    // reason=lost_events`), and a member born then whose parent is gone leaves the lineage
    // (docs/architecture.md, what the lineage cannot see), a limit of its own.
    let mut root = Root::spawn(&dir, &["hopper", dir.to_str().unwrap(), "1"]);
    assert!(wait_recognised(&home, root.pid(), WAIT), "{}", home.log());
    poll(WAIT, || (hops(&dir) > 10, ()));
    assert!(hops(&dir) > 10, "the hopper never ran");
    root.poke();
    let _ = root.child.wait();
    let log = home.wait_log(Duration::from_secs(90), |l| !lines(l, "REAPED").is_empty());
    let stopped = hopper_stopped(&dir, Duration::from_secs(10));
    daemon.stop();
    let reaped = lines(&log, "REAPED");
    eprintln!("hopper: {} generations; {reaped:?}; {} LEFTOVER lines", hops(&dir), lines(&log, "LEFTOVER").len());
    assert!(stopped, "the hopper outran the stop: still making new pids after {reaped:?}\n{log}");
    assert!(reaped.first().is_some_and(|r| r.ends_with("survivors=0")), "{log}");
}

/// Spawns `many N EXE ARGV…` as the test account and waits until its N children run.
fn many(dir: &Path, n: usize, exe: &str, argv: &[&str]) -> Probe {
    let exe = dir.join(exe);
    let mut args = vec!["many".to_string(), n.to_string(), exe.to_str().unwrap().to_string()];
    args.extend(argv.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let p = Probe::spawn(&dir.join("spawner"), &args, TEST_UID);
    let name = exe.file_name().unwrap().to_str().unwrap().to_string();
    poll(WAIT, || (named(&name).len() >= n, ()));
    p
}

#[guard_test(needs = [root, ebpf])]
fn four_thousand_empty_argv_execs_do_not_stall_the_recognition_of_a_real_root() {
    let _g = setup();
    let (home, dir) = home_for("report", "1s", ROOTS);
    let daemon = Daemon::start(&home, &[]);
    home.wait_log(WAIT, |l| !lines(l, "TICK_COMPLETE").is_empty());
    // Named like an excluded program (uncounted), exec'd with an empty argv.
    let n = 4100;
    let _empties = many(&dir, n, "idler", &[]);
    let ticks = lines(&home.log(), "TICK_COMPLETE").len();
    home.wait_log(WAIT, |l| lines(l, "TICK_COMPLETE").len() >= ticks + 2);
    let root = Root::spawn(&dir, &["session", dir.to_str().unwrap(), "0"]);
    let t = Instant::now();
    let recognised = wait_recognised(&home, root.pid(), WAIT);
    let took = t.elapsed();
    let log = home.log();
    daemon.stop();
    eprintln!("4,100 empty argvs: the real root recognised after {took:.1?} (1 s ticks): {recognised}");
    assert!(recognised, "the root was never recognised behind {n} empty execs\n{}", lines(&log, "WARN").join("\n"));
}

#[guard_test(needs = [root, ebpf])]
fn fake_roots_that_fill_the_cap_on_sessions_are_said_and_counted() {
    let _g = setup();
    let (home, dir) = home_for("report", "1s", r#"["(^|/)agent-wrapper( |$)"]"#);
    let daemon = Daemon::start(&home, &[]);
    home.wait_log(WAIT, |l| !lines(l, "TICK_COMPLETE").is_empty());
    // `exec -a agent-wrapper sleep`: 1,024 processes whose command line names a root.
    let t = Instant::now();
    let _fakes = many(&dir, 1024, "sleeper", &["agent-wrapper", "1000000"]);
    let full = home.wait_status(WAIT, |s| s.sessions.as_ref().is_some_and(|x| x.live >= 1024));
    let filled = t.elapsed();
    let live = full.as_ref().and_then(|f| f.sessions.as_ref()).map_or(0, |x| x.live);
    assert_eq!(
        live,
        1024,
        "the fake roots fill the cap: {:#?}",
        full.map(|f| f.sessions.map(|x| (x.live, x.pending_execs, x.caps)))
    );
    let root = Root::spawn(&dir, &["session", dir.to_str().unwrap(), "0"]);
    let log = home.wait_log(WAIT, |l| l.contains(" WARN sessions_cap what=sessions limit=1024"));
    let st = home.wait_status(WAIT, |s| s.sessions.as_ref().is_some_and(|x| x.caps.sessions >= 1));
    let rss = fs::read_to_string(format!("/proc/{}/status", daemon.child.id())).unwrap_or_default();
    let rss = rss.lines().find(|l| l.starts_with("VmRSS:")).unwrap_or("").to_string();
    daemon.stop();
    let s = st.and_then(|s| s.sessions).expect("sessions in the status");
    eprintln!(
        "1,024 fake roots: live {live} after {filled:.1?}; the real root {} refused, caps.sessions {}; daemon {rss}",
        root.pid(),
        s.caps.sessions
    );
    assert_eq!(lines(&log, "WARN").iter().filter(|l| l.contains("sessions_cap what=sessions")).count(), 1, "{log}");
    assert!(s.caps.sessions >= 1 && s.roots_refused_total >= 1, "{s:#?}");
}

guard_test::main!();
