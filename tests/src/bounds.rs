//! The shipped unit's limits for a daemon under test, and the account's bombs.
//!
//! [`UnitCgroup`] runs the daemon in a cgroup limited as `guard-user@.service` is
//! (`MemoryMax=64M`, `TasksMax=32`): cgroup v2's at `/sys/fs/cgroup` (the VM guests; `+memory`
//! and `+pids` are written to the root's `cgroup.subtree_control`), or v1's memory and pids
//! hierarchies at `/sys/fs/cgroup/memory` and `/sys/fs/cgroup/pids` (this project's CI host).
//! [`hostile_state`] and [`config_with_unknown_keys`] are the state and config bombs.
use std::{
    fmt::Write as _,
    fs,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use crate::{guard_bin, Daemon, Home, TEST_USER};

/// The shipped unit's `MemoryMax=`.
pub const MEMORY_MAX: u64 = 64 << 20;
/// The shipped unit's `TasksMax=`.
pub const TASKS_MAX: u32 = 32;

/// Cgroups made for one test, limited like the unit; removed on drop (once their processes are
/// gone).
pub struct UnitCgroup {
    /// The memory cgroup (v2: the one cgroup, which holds both limits).
    memory: PathBuf,
    /// v1's pids cgroup, when there is one apart from the memory one.
    pids: Option<PathBuf>,
    v2: bool,
}

impl UnitCgroup {
    /// A cgroup limited to `memory` bytes (no swap) and, when `tasks` is given, that many tasks
    /// (threads included, as systemd's `TasksMax=`); or why there can be none here.
    pub fn new(memory: u64, tasks: Option<u32>) -> Result<UnitCgroup, String> {
        let name = format!("guard-test-{}", std::process::id());
        let v2_root = Path::new("/sys/fs/cgroup");
        let controllers = fs::read_to_string(v2_root.join("cgroup.controllers")).unwrap_or_default();
        let has = |c: &str| controllers.split_whitespace().any(|x| x == c);
        let (dir, v2) = if has("memory") {
            // The children of the root get a controller only once it is delegated.
            let _ = fs::write(v2_root.join("cgroup.subtree_control"), "+memory");
            if tasks.is_some() {
                let _ = fs::write(v2_root.join("cgroup.subtree_control"), "+pids");
            }
            (v2_root.join(&name), true)
        } else if Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() {
            (Path::new("/sys/fs/cgroup/memory").join(&name), false)
        } else {
            return Err(
                "no cgroup v2 memory controller at /sys/fs/cgroup and no v1 hierarchy at /sys/fs/cgroup/memory".into(),
            );
        };
        fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let mut cg = UnitCgroup { memory: dir, pids: None, v2 };
        let set = |dir: &Path, file: &str, value: &str| {
            fs::write(dir.join(file), value).map_err(|e| format!("cannot write {}: {e}", dir.join(file).display()))
        };
        if v2 {
            set(&cg.memory, "memory.max", &memory.to_string())?;
            if cg.memory.join("memory.swap.max").exists() {
                set(&cg.memory, "memory.swap.max", "0")?;
            }
            if let Some(n) = tasks {
                set(&cg.memory, "pids.max", &n.to_string())?;
            }
        } else {
            set(&cg.memory, "memory.limit_in_bytes", &memory.to_string())?;
            if cg.memory.join("memory.memsw.limit_in_bytes").exists() {
                set(&cg.memory, "memory.memsw.limit_in_bytes", &memory.to_string())?;
            }
            if let Some(n) = tasks {
                let pids = Path::new("/sys/fs/cgroup/pids").join(&name);
                fs::create_dir(&pids)
                    .map_err(|e| format!("cannot create {}: {e} (no v1 pids hierarchy?)", pids.display()))?;
                cg.pids = Some(pids.clone());
                set(&pids, "pids.max", &n.to_string())?;
            }
        }
        Ok(cg)
    }

    /// Processes the kernel's OOM killer ended in this cgroup (`oom_kill` of `memory.events`
    /// in v2, of `memory.oom_control` in v1).
    pub fn oom_kills(&self) -> u64 {
        let file = if self.v2 { "memory.events" } else { "memory.oom_control" };
        let text = fs::read_to_string(self.memory.join(file)).unwrap_or_default();
        text.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
    }

    /// The most memory the cgroup used, where the kernel tells (v2's `memory.peak` needs 5.19).
    pub fn peak(&self) -> Option<u64> {
        let file = if self.v2 { "memory.peak" } else { "memory.max_usage_in_bytes" };
        fs::read_to_string(self.memory.join(file)).ok()?.trim().parse().ok()
    }

    /// Times a fork or clone was refused at the task limit (`pids.events`' `max`), if known.
    pub fn tasks_refused(&self) -> Option<u64> {
        let dir = self.pids.as_deref().unwrap_or(&self.memory);
        let text = fs::read_to_string(dir.join("pids.events")).ok()?;
        text.lines().find_map(|l| l.strip_prefix("max ")).and_then(|n| n.trim().parse().ok())
    }

    /// The most tasks the cgroup held at once, where the kernel tells (`pids.peak`, 6.1 and later).
    pub fn tasks_peak(&self) -> Option<u64> {
        let dir = self.pids.as_deref().unwrap_or(&self.memory);
        fs::read_to_string(dir.join("pids.peak")).ok()?.trim().parse().ok()
    }

    /// Starts the daemon on `home` inside these cgroups, ticking every `interval` (e.g. `1s`),
    /// with `env`: the child joins them before it execs, so every byte and task the daemon ever
    /// takes is charged here.
    pub fn start_daemon(&self, home: &Home, interval: &str, env: &[(&str, &str)]) -> Daemon {
        let procs: Vec<std::ffi::CString> = [Some(&self.memory), self.pids.as_ref()]
            .into_iter()
            .flatten()
            .map(|d| std::ffi::CString::new(d.join("cgroup.procs").into_os_string().into_encoded_bytes()).unwrap())
            .collect();
        let mut cmd = Command::new(guard_bin());
        cmd.envs(env.iter().copied());
        cmd.arg("run").args(["--user", TEST_USER, "--home"]).arg(home.path()).args(["--interval", interval]);
        cmd.stdout(Stdio::null()).stderr(Stdio::inherit());
        // SAFETY: between fork and exec only open/write/close (async-signal-safe), on paths
        // built before the fork. "0" is the writing process itself.
        unsafe {
            cmd.pre_exec(move || {
                for path in &procs {
                    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
                    let err = std::io::Error::last_os_error();
                    libc::close(fd);
                    if !ok {
                        return Err(err);
                    }
                }
                Ok(())
            });
        }
        Daemon { child: cmd.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", guard_bin().display())) }
    }
}

impl Drop for UnitCgroup {
    fn drop(&mut self) {
        // Empty once the daemon and its matcher workers are reaped; retried while they exit.
        for dir in [Some(&self.memory), self.pids.as_ref()].into_iter().flatten() {
            let removed = (0..50).any(|_| {
                let gone = fs::remove_dir(dir).is_ok();
                if !gone {
                    std::thread::sleep(Duration::from_millis(100));
                }
                gone
            });
            if !removed {
                eprintln!("could not remove the test cgroup {}", dir.display());
            }
        }
    }
}

/// A state file just under the 4 MiB cap: ~330,000 valid flag clocks of distinct names, every
/// one 300 years in the future. Before the bounds, loading it needed more than 64 MiB.
pub fn hostile_state() -> Vec<u8> {
    let mut s = String::from(r#"{"version": 2, "user": "guardtest1", "flagged": {"#);
    let mut i = 0u64;
    while s.len() < (4 << 20) - 64 {
        let _ = write!(s, "{}\"{i:x}\":1e10", if i == 0 { "" } else { "," });
        i += 1;
    }
    (s + "}}").into_bytes()
}

/// The config `valid` (a JSON object's text) with `keys` unknown keys no earlier generation had.
pub fn config_with_unknown_keys(valid: &str, generation: u64, keys: usize) -> String {
    let body = valid.trim().strip_suffix('}').expect("a JSON object");
    let mut s = String::from(body);
    for i in 0..keys {
        let _ = write!(s, r#", "g{generation}k{i}": 1"#);
    }
    s + "}"
}
