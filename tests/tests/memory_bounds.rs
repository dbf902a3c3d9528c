//! The account cannot starve the daemon of memory (docs/architecture.md, "Bounds"): run inside a
//! real memory cgroup limited like the shipped unit (`MemoryMax=64M`), with a planted state file
//! of hundreds of thousands of entries (every time in the future) and a config rewritten before
//! every tick with tens of thousands of new unknown keys, the real daemon is never OOM-killed,
//! moves the state file aside with `ERROR state_rejected`, stops reporting unknown keys one by
//! one, and still ends a pile of probe processes.
//!
//! The cgroup is cgroup v2's (`/sys/fs/cgroup`, the VM guests) or v1's memory hierarchy
//! (`/sys/fs/cgroup/memory`, this project's CI host); without either the test is ignored with
//! the reason (`needs = [memory_cgroup]`).
use std::{
    fmt::Write as _,
    fs,
    os::unix::{fs::MetadataExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use integration_tests::*;

/// The shipped unit's `MemoryMax=`.
const LIMIT: u64 = 64 << 20;

/// A memory cgroup made for one test; removed on drop (once its processes are gone).
struct MemoryCgroup {
    dir: PathBuf,
    v2: bool,
}

impl MemoryCgroup {
    /// A new cgroup limited to `limit` bytes (no swap), or why there can be none here.
    fn new(limit: u64) -> Result<MemoryCgroup, String> {
        let name = format!("guard-test-{}", std::process::id());
        let v2_root = Path::new("/sys/fs/cgroup");
        let controllers = fs::read_to_string(v2_root.join("cgroup.controllers")).unwrap_or_default();
        let (dir, v2) = if controllers.split_whitespace().any(|c| c == "memory") {
            // The children of the root get the memory controller only once it is delegated.
            let _ = fs::write(v2_root.join("cgroup.subtree_control"), "+memory");
            (v2_root.join(&name), true)
        } else if Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() {
            (Path::new("/sys/fs/cgroup/memory").join(&name), false)
        } else {
            return Err(
                "no cgroup v2 memory controller at /sys/fs/cgroup and no v1 hierarchy at /sys/fs/cgroup/memory".into(),
            );
        };
        fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let cg = MemoryCgroup { dir, v2 };
        let set = |file: &str, value: &str| {
            fs::write(cg.dir.join(file), value).map_err(|e| format!("cannot write {file}: {e}"))
        };
        if v2 {
            set("memory.max", &limit.to_string())?;
            if cg.dir.join("memory.swap.max").exists() {
                set("memory.swap.max", "0")?;
            }
        } else {
            set("memory.limit_in_bytes", &limit.to_string())?;
            if cg.dir.join("memory.memsw.limit_in_bytes").exists() {
                set("memory.memsw.limit_in_bytes", &limit.to_string())?;
            }
        }
        Ok(cg)
    }

    /// Processes the kernel's OOM killer ended in this cgroup (`oom_kill` of `memory.events`
    /// in v2, of `memory.oom_control` in v1).
    fn oom_kills(&self) -> u64 {
        let file = if self.v2 { "memory.events" } else { "memory.oom_control" };
        let text = fs::read_to_string(self.dir.join(file)).unwrap_or_default();
        text.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
    }

    /// The most memory the cgroup used, where the kernel tells (v2's `memory.peak` needs 5.19).
    fn peak(&self) -> Option<u64> {
        let file = if self.v2 { "memory.peak" } else { "memory.max_usage_in_bytes" };
        fs::read_to_string(self.dir.join(file)).ok()?.trim().parse().ok()
    }

    /// Starts the daemon on `home` inside this cgroup: the child joins it before it execs, so
    /// every byte the daemon ever allocates is charged here.
    fn start_daemon(&self, home: &Home) -> Daemon {
        let procs =
            std::ffi::CString::new(self.dir.join("cgroup.procs").into_os_string().into_encoded_bytes()).unwrap();
        let mut cmd = Command::new(guard_bin());
        cmd.arg("run").args(["--user", TEST_USER, "--home"]).arg(home.path()).args(["--interval", "1s"]);
        cmd.stdout(Stdio::null()).stderr(Stdio::inherit());
        // SAFETY: between fork and exec only open/write/close (async-signal-safe), on a path
        // built before the fork. "0" is the writing process itself.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
                let err = std::io::Error::last_os_error();
                libc::close(fd);
                if ok {
                    Ok(())
                } else {
                    Err(err)
                }
            });
        }
        Daemon { child: cmd.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", guard_bin().display())) }
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // Empty once the daemon and its matcher worker are reaped; retried while they exit.
        for _ in 0..50 {
            if fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove the test cgroup {}", self.dir.display());
    }
}

/// A state file just under the 4 MiB cap: ~330,000 valid flag clocks of distinct names, every
/// one 300 years in the future. Before the bounds, loading it needed more than 64 MiB.
fn hostile_state() -> Vec<u8> {
    let mut s = String::from(r#"{"version": 2, "user": "guardtest1", "flagged": {"#);
    let mut i = 0u64;
    while s.len() < (4 << 20) - 64 {
        let _ = write!(s, "{}\"{i:x}\":1e10", if i == 0 { "" } else { "," });
        i += 1;
    }
    (s + "}}").into_bytes()
}

/// A valid config for the pile plus `keys` unknown keys no earlier config had.
fn config_with_unknown_keys(generation: u64, keys: usize) -> String {
    // No excludeCommands: the matcher is a process of its own with its own limits, and under a
    // TCG guest its first round does not fit a 1 s tick's budget (every process `match_budget`),
    // which is not what this test is about.
    let mut s =
        String::from(r#"{"threshold": 5, "timeout": "2s", "excludes": [], "excludeCommands": [], "warnBefore": 0"#);
    for i in 0..keys {
        let _ = write!(s, r#", "g{generation}k{i}": 1"#);
    }
    s + "}"
}

#[guard_test(needs = [root, memory_cgroup])]
fn a_daemon_fed_a_huge_state_and_ever_new_unknown_keys_stays_within_64m_and_keeps_guarding() {
    let _g = setup();
    let cg = MemoryCgroup::new(LIMIT).unwrap_or_else(|why| panic!("a memory cgroup: {why}"));
    let home = Home::new();
    let state_path = home.path().join("guard-daemon-state.json");
    let state = hostile_state();
    assert!(state.len() as u64 <= guard::state::MAX_STATE_BYTES, "{}", state.len());
    fs::write(&state_path, &state).unwrap();
    std::os::unix::fs::chown(&state_path, Some(TEST_UID), Some(TEST_UID)).unwrap();
    home.write_config(&config_with_unknown_keys(0, 40_000));
    assert!(fs::metadata(home.path().join("guard-config.json")).unwrap().len() < 1 << 20);

    // Before every tick (1 s), a config with 40,000 keys the daemon has not seen, swapped in
    // whole (a rename), so each tick reads a valid config.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, dir) = (stop.clone(), home.path().to_path_buf());
        std::thread::spawn(move || {
            let mut generation = 1;
            while !stop.load(Ordering::Relaxed) {
                let tmp = dir.join("guard-config.json.new");
                fs::write(&tmp, config_with_unknown_keys(generation, 40_000)).unwrap();
                fs::rename(&tmp, dir.join("guard-config.json")).unwrap();
                generation += 1;
                std::thread::sleep(Duration::from_millis(700));
            }
            generation
        })
    };

    let exe = home.probe_named("mempile");
    let mut pile: Vec<Probe> = (0..6).map(|_| Probe::spawn(&exe, &[], TEST_UID)).collect();
    let mut d = cg.start_daemon(&home);
    let log = home
        .wait_log(Duration::from_secs(180), |l| lines(l, "KILLED").len() >= 6 && lines(l, "TICK_COMPLETE").len() >= 10);
    stop.store(true, Ordering::Relaxed);
    let generations = writer.join().unwrap();
    let alive = matches!(d.child.try_wait(), Ok(None));
    let oom_kills = cg.oom_kills();
    match cg.peak() {
        Some(peak) => eprintln!("memory bounds: cgroup peak {:.1} MiB of {} MiB", peak as f64 / 1048576.0, LIMIT >> 20),
        None => eprintln!("memory bounds: this kernel does not report the cgroup's peak"),
    }
    assert!(alive && oom_kills == 0, "the daemon died (OOM kills in its cgroup: {oom_kills}):\n{log}");
    let errors = lines(&log, "ERROR");
    let want = format!("ERROR state_rejected path={} reason=too_many_flagged limit=4096", state_path.display());
    assert!(errors.len() == 1 && errors[0].ends_with(&want), "{log}");
    let rejected = home.path().join("guard-daemon-state.json.rejected");
    assert_eq!(fs::read(&rejected).unwrap(), state, "the rejected file is kept as it was");
    assert_eq!(fs::metadata(&rejected).unwrap().uid(), TEST_UID);
    let fresh = fs::metadata(&state_path).map(|m| m.len()).unwrap_or(0);
    assert!(fresh < 4096, "the daemon started clean and wrote a small state ({fresh} bytes)");
    let warned = log.lines().filter(|l| l.contains(" WARN config_unknown_key ")).count();
    assert_eq!(warned, guard::config::MAX_UNKNOWN_KEYS, "{generations} configs written");
    assert_eq!(log.matches(" WARN config_unknown_keys_unreported limit=256 path=").count(), 1, "{log}");
    assert_eq!(lines(&log, "KILLED").len(), 6, "{log}");
    assert!(pile.iter_mut().all(|p| p.wait_dead(Duration::from_secs(5))), "the pile was ended");
    let st = d.stop();
    assert_eq!(st.code(), Some(0), "{st:?}");
    assert_eq!(cg.oom_kills(), 0);
}

guard_test::main!();
