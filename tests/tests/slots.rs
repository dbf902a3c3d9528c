//! Heavy-command slots on the real kernel (docs/configuration.md `slots`): commands of a kind over
//! `max` wait, frozen in guard's own cgroup, and start first come, first served; nothing is ever
//! left waiting. Run as root (`cargo xtask test`); needs the ebpf backend and cgroup v2 with its
//! freezer (Linux 5.2), which the VM guests mount at /sys/fs/cgroup and hybrid hosts at
//! /sys/fs/cgroup/unified.
//!
//! The heavy command is guard-probe's `slot-job` (copied as `heavyjob`): it waits 300 ms, then
//! writes `start`, works, writes `end`. A slot holds it within milliseconds of its exec, so a
//! held job writes nothing until its turn; "at most N at once" is read from those lines.
use std::{
    fs,
    io::{BufRead, BufReader, Write},
    os::unix::{fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use integration_tests::*;

const WAIT: Duration = Duration::from_secs(60);
const JOB: &str = "heavyjob";

/// Jobs started as one account; killed and reaped on drop.
struct Jobs {
    children: Vec<Child>,
}

impl Jobs {
    /// `n` jobs of `exe` as `uid`, started at once, each working `work_ms`.
    fn start(exe: &Path, file: &Path, n: usize, work_ms: u64, uid: u32, extra: &[&str]) -> Jobs {
        let children = (0..n)
            .map(|_| {
                Command::new(exe)
                    .args(["slot-job", file.to_str().unwrap(), &work_ms.to_string()])
                    .args(extra)
                    .uid(uid)
                    .gid(uid)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .process_group(0)
                    .spawn()
                    .expect("spawn a job")
            })
            .collect();
        Jobs { children }
    }

    fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    /// Waits for every job to exit (at most `within`); their exit codes, `None` for one still running.
    fn wait_all(&mut self, within: Duration) -> Vec<Option<i32>> {
        let end = Instant::now() + within;
        let mut codes = vec![None; self.children.len()];
        loop {
            for (i, c) in self.children.iter_mut().enumerate() {
                if codes[i].is_none() {
                    if let Ok(Some(st)) = c.try_wait() {
                        codes[i] = Some(st.code().unwrap_or(-1));
                    }
                }
            }
            if codes.iter().all(Option::is_some) || Instant::now() > end {
                return codes;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Jobs {
    fn drop(&mut self) {
        for c in &mut self.children {
            unsafe { libc::kill(-(c.id() as i32), libc::SIGKILL) };
            let _ = c.wait();
        }
    }
}

/// A home with `heavyjob`, a jobs file everyone may write, and a config with one slot.
fn home_with(slot: &str) -> (Home, PathBuf, PathBuf) {
    let home = Home::new();
    let exe = home.probe_named(JOB);
    let file = home.path().join("jobs.txt");
    fs::write(&file, "").unwrap();
    fs::set_permissions(&file, fs::Permissions::from_mode(0o666)).unwrap();
    home.write_config(&format!(r#"{{"threshold": 100000, "excludes": ["bash"], "slots": {{"build": {slot}}}}}"#));
    (home, exe, file)
}

fn queue(max: u32) -> String {
    format!(r#"{{"commands": ["(^|/){JOB} slot-job "], "max": {max}, "mode": "queue"}}"#)
}

/// Starts the daemon and waits until its status shows the slots on (and able to hold).
fn daemon(home: &Home) -> Daemon {
    let d = Daemon::start(home, &[]);
    let st = home.wait_status(WAIT, |s| s.slots.as_ref().is_some_and(|x| !x.slots.is_empty()));
    let slots = st.and_then(|s| s.slots).expect("the status shows the slots");
    assert_eq!(slots.unavailable, None, "slots cannot hold here: {}", home.log());
    d
}

/// `(kind, pid, ns)` lines of the jobs file.
fn events(file: &Path) -> Vec<(String, u32, u128)> {
    fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Some((f.first()?.to_string(), f.get(1)?.parse().ok()?, f.get(2)?.parse().ok()?))
        })
        .collect()
}

/// The most jobs between their `start` and `end` at one time.
fn most_at_once(file: &Path) -> usize {
    let mut ev: Vec<(u128, i32)> = events(file)
        .into_iter()
        .filter_map(|(k, _, t)| match k.as_str() {
            "start" => Some((t, 1)),
            "end" => Some((t, -1)),
            _ => None,
        })
        .collect();
    // An end and a start at the same instant: the end first.
    ev.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in ev {
        now += d;
        most = most.max(now);
    }
    most as usize
}

fn finished(file: &Path) -> usize {
    events(file).iter().filter(|(k, _, _)| k == "end").count()
}

/// The processes in guard's frozen cgroups now (every instance).
fn frozen() -> Vec<u32> {
    let Ok(h) = guard::cgroup::Hierarchy::find() else { return Vec::new() };
    let Ok(dir) = fs::read_dir(h.mount.join(guard::cgroup::TOP)) else { return Vec::new() };
    dir.flatten()
        .flat_map(|e| {
            fs::read_to_string(e.path().join("wait/cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .filter_map(|l| l.parse().ok())
        .collect()
}

fn state_of(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 2..].chars().next()
}

/// Waits until `n` of `pids` are in the frozen cgroup.
fn wait_frozen(pids: &[u32], n: usize) -> Vec<u32> {
    poll(WAIT, || {
        let f: Vec<u32> = frozen().into_iter().filter(|p| pids.contains(p)).collect();
        (f.len() >= n, f)
    })
}

#[guard_test(needs = [root, ebpf, freezer])]
fn max_two_of_six_started_at_once_runs_at_most_two_at_a_time_and_all_six_finish() {
    let _serial = setup();
    let (home, exe, file) = home_with(&queue(2));
    let _d = daemon(&home);
    let mut jobs = Jobs::start(&exe, &file, 6, 1500, TEST_UID, &[]);
    let held = wait_frozen(&jobs.pids(), 4);
    assert_eq!(held.len(), 4, "four wait: {}", home.log());
    // Frozen, not stopped: a parent waiting with WUNTRACED sees nothing.
    for pid in &held {
        assert_ne!(state_of(*pid), Some('T'), "pid {pid} is stopped");
    }
    let codes = jobs.wait_all(WAIT);
    assert!(codes.iter().all(|c| *c == Some(0)), "every job finishes: {codes:?}\n{}", home.log());
    assert_eq!(finished(&file), 6);
    assert!(most_at_once(&file) <= 2, "at most two at once: {}", fs::read_to_string(&file).unwrap());
    let log = home.log();
    assert_eq!(lines(&log, "SLOT_WAIT").len(), 4, "{log}");
    assert_eq!(lines(&log, "SLOT_START").len(), 6, "{log}");
    assert!(frozen().is_empty());
}

#[guard_test(needs = [root, ebpf, freezer])]
fn report_mode_holds_nothing_and_says_what_would_have_waited() {
    let _serial = setup();
    let (home, exe, file) =
        home_with(&format!(r#"{{"commands": ["(^|/){JOB} slot-job "], "max": 2, "mode": "report"}}"#));
    let _d = daemon(&home);
    let mut jobs = Jobs::start(&exe, &file, 6, 1500, TEST_UID, &[]);
    let codes = jobs.wait_all(WAIT);
    assert!(codes.iter().all(|c| *c == Some(0)), "{codes:?}");
    assert!(most_at_once(&file) > 2, "all ran at once: {}", fs::read_to_string(&file).unwrap());
    let log = home.wait_log(WAIT, |l| lines(l, "SLOT_WAIT").len() >= 4);
    let waits = lines(&log, "SLOT_WAIT");
    assert_eq!(waits.len(), 4, "{log}");
    assert!(waits.iter().all(|l| l.ends_with(" mode=report")), "{log}");
}

#[guard_test(needs = [root, ebpf, freezer])]
fn another_accounts_commands_are_never_held() {
    let _serial = setup();
    let (home, exe, file) = home_with(&queue(1));
    let _d = daemon(&home);
    let mut jobs = Jobs::start(&exe, &file, 4, 1500, OTHER_UID, &[]);
    let codes = jobs.wait_all(WAIT);
    assert!(codes.iter().all(|c| *c == Some(0)), "{codes:?}");
    assert_eq!(most_at_once(&file), 4, "{}", fs::read_to_string(&file).unwrap());
    assert!(!home.log().contains("SLOT_"), "{}", home.log());
}

#[guard_test(needs = [root, ebpf, freezer])]
fn sigkill_of_the_daemon_releases_every_waiting_command() {
    let _serial = setup();
    let (home, exe, file) = home_with(&queue(1));
    let mut d = daemon(&home);
    let mut jobs = Jobs::start(&exe, &file, 4, 1000, TEST_UID, &[]);
    assert_eq!(wait_frozen(&jobs.pids(), 3).len(), 3, "{}", home.log());
    unsafe { libc::kill(d.child.id() as i32, libc::SIGKILL) };
    let _ = d.child.wait();
    let codes = jobs.wait_all(WAIT);
    assert!(codes.iter().all(|c| *c == Some(0)), "every job finishes after the daemon died: {codes:?}");
    assert_eq!(finished(&file), 4);
    assert!(frozen().is_empty());
}

#[guard_test(needs = [root, ebpf, freezer])]
fn a_daemon_killed_with_its_releaser_leaves_nothing_waiting_after_the_next_start() {
    let _serial = setup();
    let (home, exe, file) = home_with(&queue(1));
    let mut d = daemon(&home);
    let mut jobs = Jobs::start(&exe, &file, 3, 800, TEST_UID, &[]);
    assert_eq!(wait_frozen(&jobs.pids(), 2).len(), 2);
    // The daemon and its releaser at once (`systemctl kill -s KILL`): nothing is left to thaw.
    // The daemon stopped first: killed first, its releaser could see the pipe close and thaw
    // before its own SIGKILL (a guest under TCG did), and killed second, a running daemon could
    // start a new releaser in between.
    let releaser = children_of(d.child.id()).into_iter().find(|p| cmdline(*p).contains("__slots-release"));
    assert!(releaser.is_some(), "the daemon runs a releaser while it holds commands");
    unsafe { libc::kill(d.child.id() as i32, libc::SIGSTOP) };
    if let Some(r) = releaser {
        unsafe { libc::kill(r as i32, libc::SIGKILL) };
    }
    unsafe { libc::kill(d.child.id() as i32, libc::SIGKILL) };
    let _ = d.child.wait();
    assert_eq!(frozen().len(), 2, "still frozen until a guard starts again");
    let _d = Daemon::start(&home, &[]);
    let codes = jobs.wait_all(WAIT);
    assert!(codes.iter().all(|c| *c == Some(0)), "{codes:?}");
    assert!(home.log().contains("WARN slots_leftovers released=2"), "{}", home.log());
}

#[guard_test(needs = [root, ebpf, freezer])]
fn a_stopped_daemon_or_slots_turned_off_release_every_waiting_command() {
    let _serial = setup();
    let (home, exe, file) = home_with(&queue(1));
    let d = daemon(&home);
    let mut jobs = Jobs::start(&exe, &file, 3, 60_000, TEST_UID, &[]);
    assert_eq!(wait_frozen(&jobs.pids(), 2).len(), 2);
    // The config turns slots off: the two waiting start at the next tick.
    home.write_config(r#"{"threshold": 100000}"#);
    let log = home.wait_log(WAIT, |l| l.matches("reason=config").count() >= 2);
    assert_eq!(log.matches("SLOT_START slot=build").count(), 3, "{log}");
    assert!(
        poll(WAIT, || {
            let f = frozen().is_empty();
            (f, f)
        }),
        "nothing frozen once slots are off"
    );
    drop(jobs);
    home.wait_status(WAIT, |s| s.slots.is_none()).expect("the status says slots are off");
    // And a stop (SIGTERM) lets go of what waits before STOPPED.
    home.write_config(&format!(r#"{{"threshold": 100000, "slots": {{"build": {}}}}}"#, queue(1)));
    home.wait_status(WAIT, |s| s.slots.is_some()).expect("slots on again");
    fs::write(&file, "").unwrap();
    jobs = Jobs::start(&exe, &file, 3, 500, TEST_UID, &[]);
    assert_eq!(wait_frozen(&jobs.pids(), 2).len(), 2);
    assert!(d.stop().success());
    assert!(frozen().is_empty(), "released before the daemon exited");
    // Both waiting commands' SLOT_START lines are in the log, before the daemon's STOPPED.
    let log = home.log();
    let stopped = log.find("STOPPED").unwrap_or_else(|| panic!("no STOPPED: {log}"));
    assert_eq!(log.matches("reason=stop").count(), 2, "{log}");
    assert!(log.rfind("reason=stop").is_some_and(|i| i < stopped), "reason=stop lines after STOPPED: {log}");
    let codes = jobs.wait_all(WAIT);
    assert!(codes.iter().all(|c| *c == Some(0)), "{codes:?}");
}

#[guard_test(needs = [root, ebpf, freezer])]
fn max_wait_lets_a_waiting_command_go_and_excluded_names_never_wait() {
    let _serial = setup();
    let (home, exe, file) =
        home_with(r#"{"commands": ["(^|/)(heavyjob|bash) slot-job "], "max": 1, "mode": "queue", "maxWait": "2s"}"#);
    let _d = daemon(&home);
    let holder = Jobs::start(&exe, &file, 1, 60_000, TEST_UID, &[]);
    home.wait_log(WAIT, |l| l.contains("SLOT_START slot=build"));
    let mut waiter = Jobs::start(&exe, &file, 1, 100, TEST_UID, &[]);
    // `bash` is in excludes: a copy of the job under that name never waits.
    let excluded = home.probe_named("bash");
    let mut free = Jobs::start(&excluded, &file, 1, 100, TEST_UID, &[]);
    assert_eq!(free.wait_all(WAIT), [Some(0)]);
    assert_eq!(waiter.wait_all(WAIT), [Some(0)], "maxWait let it go");
    let log = home.log();
    assert_eq!(lines(&log, "SLOT_TIMEOUT").len(), 1, "{log}");
    assert!(lines(&log, "SLOT_TIMEOUT")[0].contains(&format!("pid={}", waiter.pids()[0])), "{log}");
    assert!(!log.contains(&format!("pid={} ", free.pids()[0])), "{log}");
    drop(holder);
}

#[guard_test(needs = [root, ebpf, freezer])]
fn a_waiting_command_its_parent_kills_goes_away_cleanly() {
    let _serial = setup();
    let (home, exe, file) = home_with(&queue(1));
    let _d = daemon(&home);
    let _holder = Jobs::start(&exe, &file, 1, 60_000, TEST_UID, &[]);
    home.wait_log(WAIT, |l| l.contains("SLOT_START slot=build"));
    // One with SIGTERM and SIGINT handlers (a frozen one holds the signal until it thaws), one
    // without (SIGTERM ends it even frozen).
    let mut handler = Jobs::start(&exe, &file, 1, 60_000, TEST_UID, &["handler"]);
    let mut plain = Jobs::start(&exe, &file, 1, 60_000, TEST_UID, &[]);
    let pids = [handler.pids()[0], plain.pids()[0]];
    assert_eq!(wait_frozen(&pids, 2).len(), 2);
    for p in pids {
        unsafe { libc::kill(p as i32, libc::SIGTERM) };
    }
    let handled = handler.wait_all(WAIT);
    assert_eq!(plain.wait_all(WAIT), [Some(-1)], "ended by SIGTERM while frozen");
    let seen = events(&file);
    let said = |what: &str| seen.iter().any(|(k, p, _)| k == what && *p == pids[0]);
    if said("armed") || said("signal15") {
        // Its handler was in place: the guard let it go to act on its signal.
        assert_eq!(handled, [Some(3)], "let go to act on its signal");
        assert!(said("signal15"));
        let log = home.wait_log(WAIT, |l| l.contains("reason=signal"));
        assert!(log.contains(&format!("SLOT_START slot=build pid={} ", pids[0])), "{log}");
    } else {
        // Held before it got to install its handler (a slow guest: the hold lands within
        // milliseconds of the exec): SIGTERM's default action ended it, frozen, as the plain one.
        eprintln!("note: the handler job was frozen before its handlers were in place");
        assert_eq!(handled, [Some(-1)], "ended by SIGTERM while frozen, with no handler yet");
    }
    assert!(frozen().is_empty());
    // The queue is clean: the status lists no waiting command.
    let st = home.wait_status(WAIT, |s| s.slots.as_ref().is_some_and(|x| x.slots[0].waiting_count == 0));
    assert!(st.is_some());
}

#[guard_test(needs = [root, ebpf, freezer])]
fn the_account_can_neither_thaw_nor_move_a_waiting_command() {
    let _serial = setup();
    let (home, exe, file) = home_with(&queue(1));
    let _d = daemon(&home);
    let _holder = Jobs::start(&exe, &file, 1, 60_000, TEST_UID, &[]);
    home.wait_log(WAIT, |l| l.contains("SLOT_START slot=build"));
    let mut waiter = Jobs::start(&exe, &file, 1, 100, TEST_UID, &[]);
    let pid = waiter.pids()[0];
    assert_eq!(wait_frozen(&[pid], 1), [pid]);
    let h = guard::cgroup::Hierarchy::find().unwrap();
    let wait_dir =
        fs::read_dir(h.mount.join(guard::cgroup::TOP)).unwrap().flatten().next().unwrap().path().join("wait");
    // As the account: out of the queue to the top, thawing it, or into it another process.
    let attempts = [
        (h.mount.join("cgroup.procs"), pid.to_string()),
        (wait_dir.join("cgroup.freeze"), "0".to_string()),
        (wait_dir.join("cgroup.procs"), std::process::id().to_string()),
    ];
    for (path, value) in attempts {
        let out = Command::new("/bin/sh")
            .args(["-c", &format!("echo {value} > '{}'", path.display())])
            .uid(TEST_UID)
            .gid(TEST_UID)
            .output()
            .unwrap();
        assert!(!out.status.success(), "the account wrote {} to {}", value, path.display());
    }
    assert_eq!(frozen(), [pid], "still waiting");
    assert_eq!(waiter.wait_all(Duration::from_millis(500)), [None]);
}

#[guard_test(needs = [root, ebpf, freezer])]
fn an_interactive_shell_sees_no_stopped_job() {
    let _serial = setup();
    // util-linux's script(1) makes the pty (the guests copy it in from the host).
    assert!(which("script").is_some(), "needs script(1) (util-linux) on PATH");
    let (home, exe, file) = home_with(&queue(1));
    let _d = daemon(&home);
    let _holder = Jobs::start(&exe, &file, 1, 3000, TEST_UID, &[]);
    home.wait_log(WAIT, |l| l.contains("SLOT_START slot=build"));
    // bash -i under a pty: job control on. A background job that waits, `jobs -l` while it
    // does, then a foreground one; the transcript must say Running, never Stopped.
    let script = format!(
        "{exe} slot-job {file} 100 &\nsleep 1\njobs -l\n{exe} slot-job {file} 100; echo fg=$?\nwait; echo bg=$?\nexit\n",
        exe = exe.display(),
        file = file.display()
    );
    let mut shell = Command::new("script")
        .args(["-qfec", "bash --norc --noprofile -i", "/dev/null"])
        .uid(TEST_UID)
        .gid(TEST_UID)
        .env("HOME", home.path())
        .env("PS1", "$ ")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let mut stdin = shell.stdin.take().unwrap();
    stdin.write_all(script.as_bytes()).unwrap();
    let out = shell.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let end = Instant::now() + WAIT;
    while shell.try_wait().unwrap().is_none() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    unsafe { libc::kill(-(shell.id() as i32), libc::SIGKILL) };
    let _ = shell.wait();
    drop(stdin);
    let text = reader.join().unwrap();
    let log = home.log();
    assert!(lines(&log, "SLOT_WAIT").len() >= 2, "both of the shell's jobs waited: {log}\n{text}");
    assert!(text.contains("Running"), "jobs -l shows the waiting job running: {text}");
    assert!(!text.contains("Stopped"), "no stopped job: {text}");
    assert!(text.contains("fg=0") && text.contains("bg=0"), "{text}");
}

#[guard_test(needs = [root, ebpf, freezer])]
fn a_slot_pattern_that_matches_everything_or_that_bash_refuses_is_a_config_error_and_holds_nothing() {
    let _serial = setup();
    for (pattern, why) in [(".", "matches every command line"), ("(unclosed", "not a valid bash extended regex")] {
        let (home, exe, file) =
            home_with(&format!(r#"{{"commands": [{pattern:?}], "max": 1, "mode": "queue", "maxWait": "1h"}}"#));
        let _d = Daemon::start(&home, &[]);
        // The slots' matcher refuses the pattern off the tick: the tick after it counts the error.
        let log = home.wait_log(WAIT, |l| {
            l.contains("ERROR config_malformed slots.commands")
                && l.contains("TICK_COMPLETE flagged=0 kills=0 errors=1")
        });
        let error = lines(&log, "ERROR").into_iter().next().unwrap_or_else(|| panic!("{pattern}: {log}")).to_string();
        assert!(error.contains(why) && error.contains("index=0"), "{pattern}: {error}");
        assert!(log.contains("TICK_COMPLETE flagged=0 kills=0 errors=1"), "{pattern}: {log}");
        // Every command of the account would have matched `.`: none waits.
        let mut jobs = Jobs::start(&exe, &file, 3, 500, TEST_UID, &[]);
        assert!(jobs.wait_all(WAIT).iter().all(|c| *c == Some(0)));
        assert_eq!(most_at_once(&file), 3, "{pattern}");
        assert!(!home.log().contains("SLOT_WAIT"), "{pattern}: {}", home.log());
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(name)).find(|p| p.is_file())
}

/// Processes whose parent is `pid` (any of its threads may have started them).
fn children_of(pid: u32) -> Vec<u32> {
    fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            let stat = fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            stat.rfind(')').and_then(|i| stat[i + 2..].split(' ').nth(1)?.parse::<u32>().ok()) == Some(pid)
        })
        .collect()
}

fn cmdline(pid: u32) -> String {
    fs::read(format!("/proc/{pid}/cmdline")).map(|b| String::from_utf8_lossy(&b).replace('\0', " ")).unwrap_or_default()
}

guard_test::main!();

/// The slots' matcher is the smallest (docs/architecture.md, Bounds): a list it cannot compile,
/// alone or with `excludeCommands` (each of which the tick's larger matcher takes), is the
/// slots' config error; nothing waits, the daemon ticks on.
#[guard_test(needs = [root, ebpf, freezer])]
fn a_slot_list_too_costly_for_the_slots_matcher_is_a_config_error_and_holds_nothing() {
    let _serial = setup();
    for (exclude, pattern) in
        [("z", "(^|/)heavyjob slot-job y{0,700}"), ("q y{0,500}", "(^|/)heavyjob slot-job w{0,500}")]
    {
        let (home, exe, file) = home_with(&format!(r#"{{"commands": [{pattern:?}], "max": 1, "mode": "queue"}}"#));
        let config = fs::read_to_string(home.path().join("guard-config.json")).unwrap();
        home.write_config(&config.replacen('{', &format!(r#"{{"excludeCommands": [{exclude:?}], "#), 1));
        let _d = Daemon::start(&home, &[]);
        let log = home.wait_log(WAIT, |l| {
            l.contains("ERROR config_malformed slots.commands")
                && l.contains("TICK_COMPLETE flagged=0 kills=0 errors=1")
        });
        let error = lines(&log, "ERROR").into_iter().next().unwrap_or_else(|| panic!("{pattern}: {log}")).to_string();
        assert!(error.contains("costly"), "{pattern}: {error}");
        let mut jobs = Jobs::start(&exe, &file, 3, 500, TEST_UID, &[]);
        assert!(jobs.wait_all(WAIT).iter().all(|c| *c == Some(0)));
        assert_eq!(most_at_once(&file), 3, "{pattern}");
        let log = home.wait_log(WAIT, |l| l.matches("TICK_COMPLETE").count() >= 3);
        assert!(!log.contains("SLOT_WAIT") && !log.contains("PANIC"), "{pattern}: {log}");
    }
}

/// `explain` run by root shows a command's place in its slot from root's own copy of the
/// status, as `status` and `tree` do: a status the account rewrites in its home is not read.
#[guard_test(needs = [root, ebpf, freezer])]
fn explain_shows_the_slot_place_from_roots_copy_not_from_a_status_the_account_forged() {
    let _serial = setup();
    let (home, exe, file) = home_with(&queue(1));
    let d = daemon(&home);
    let jobs = Jobs::start(&exe, &file, 2, 60_000, TEST_UID, &[]);
    let held = wait_frozen(&jobs.pids(), 1);
    assert_eq!(held.len(), 1, "{}", home.log());
    let waits = |s: &guard::status::Status| {
        s.slots.as_ref().is_some_and(|x| x.slots.iter().any(|r| r.waiting.iter().any(|t| t.pid == held[0])))
    };
    assert!(home.wait_status(WAIT, waits).is_some_and(|s| waits(&s)), "{}", home.log());
    // The daemon holds still (its next tick does not rewrite the file first) while the account
    // rewrites the status in its home to show no slot at all.
    unsafe { libc::kill(d.child.id() as i32, libc::SIGSTOP) };
    let forged = home.path().join("guard-status.json");
    let mut fake: serde_json::Value = serde_json::from_slice(&fs::read(&forged).unwrap()).unwrap();
    let real = fake["slots"].clone();
    fake["slots"]["slots"] = serde_json::json!([]);
    let _ = fs::remove_file(&forged);
    fs::write(&forged, serde_json::to_vec(&fake).unwrap()).unwrap();
    std::os::unix::fs::chown(&forged, Some(TEST_UID), Some(TEST_UID)).unwrap();
    let out = Command::new(guard_bin())
        .args(["explain", JOB, "--user", TEST_USER, "--home"])
        .arg(home.path())
        .output()
        .unwrap();
    unsafe { libc::kill(d.child.id() as i32, libc::SIGCONT) };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("slot build: waiting, 1st in line"), "{text}\nroot's copy said: {real}");
    assert!(text.contains("slot build: holding it"), "{text}");
    drop(jobs);
}

/// A command `excludeCommands` matches never waits, even when it matches a slot that is full.
#[guard_test(needs = [root, ebpf, freezer])]
fn a_command_matching_exclude_commands_never_waits_for_a_full_slot() {
    let _serial = setup();
    let (home, exe, file) = home_with(&queue(1));
    let config = fs::read_to_string(home.path().join("guard-config.json")).unwrap();
    home.write_config(&config.replacen('{', r#"{"excludeCommands": ["slot-job .* protected$"], "#, 1));
    let _d = daemon(&home);
    let holder = Jobs::start(&exe, &file, 1, 60_000, TEST_UID, &[]);
    home.wait_log(WAIT, |l| l.contains("SLOT_START slot=build"));
    // The slot is full: a plain job waits, a protected one runs.
    let waiter = Jobs::start(&exe, &file, 1, 100, TEST_UID, &[]);
    assert_eq!(wait_frozen(&waiter.pids(), 1).len(), 1, "{}", home.log());
    let mut free = Jobs::start(&exe, &file, 1, 100, TEST_UID, &["protected"]);
    assert_eq!(free.wait_all(WAIT), [Some(0)], "{}", home.log());
    let log = home.log();
    assert!(!log.contains(&format!("pid={} ", free.pids()[0])), "{log}");
    assert_eq!(lines(&log, "SLOT_WAIT").len(), 1, "only the plain job waited: {log}");
    drop((holder, waiter));
}
