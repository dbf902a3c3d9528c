//! The processes a benchmark spawns, each behind a guard whose `Drop` ends and reaps them.
//!
//! Sleepers and storm workers are forked straight from xtask (no exec): xtask is
//! single-threaded when it forks, and a forked child only makes raw syscalls (prctl, setuid,
//! pause, fork/execv, _exit) before it dies, so nothing in it can deadlock on a lock held by
//! a thread that was not copied. Forking without exec costs a page-table copy per process,
//! which is what lets 10,000 of them start in about a second.
use std::{
    ffi::CString,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::Context;

/// The account whose processes a benchmark spawns.
#[derive(Clone, Copy, Debug)]
pub struct Account {
    pub uid: u32,
    pub gid: u32,
}

/// N idle processes of the account, all named `name`, all children of xtask.
pub struct Sleepers {
    pids: Vec<libc::pid_t>,
}

impl Sleepers {
    pub fn spawn(n: usize, name: &str, who: Account) -> anyhow::Result<Self> {
        Self::spawn_with(n, name, who, false)
    }

    /// Sleepers that ignore SIGTERM, so only the guard's SIGKILL ends them (the deadline figure
    /// times that signal).
    pub fn spawn_stubborn(n: usize, name: &str, who: Account) -> anyhow::Result<Self> {
        Self::spawn_with(n, name, who, true)
    }

    fn spawn_with(n: usize, name: &str, who: Account, ignore_term: bool) -> anyhow::Result<Self> {
        let comm = CString::new(name)?;
        let mut s = Sleepers { pids: Vec::with_capacity(n) };
        for _ in 0..n {
            // SAFETY: single-threaded parent; the child makes only raw syscalls and never returns.
            let pid = unsafe { libc::fork() };
            if pid < 0 {
                anyhow::bail!("fork failed after {} sleepers: {}", s.pids.len(), std::io::Error::last_os_error());
            }
            if pid == 0 {
                unsafe { become_account(&comm, who) };
                if ignore_term {
                    unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
                }
                loop {
                    unsafe { libc::pause() };
                }
            }
            s.pids.push(pid);
        }
        Ok(s)
    }

    pub fn len(&self) -> usize {
        self.pids.len()
    }

    /// Reaps the sleepers that have died; true once none is left.
    pub fn reap_dead(&mut self) -> bool {
        self.pids.retain(|&pid| {
            let mut status = 0;
            // SAFETY: plain syscall on our own child.
            unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) == 0 }
        });
        self.pids.is_empty()
    }
}

impl Drop for Sleepers {
    fn drop(&mut self) {
        for &pid in &self.pids {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        for &pid in &self.pids {
            let mut status = 0;
            unsafe { libc::waitpid(pid, &mut status, 0) };
        }
    }
}

/// The account `name`, created (`useradd`, no home, no login shell, uid `uid` when free) if it
/// does not exist: the figures that need accounts of their own (guarded or not) make them.
pub fn ensure_account(name: &str, uid: u32) -> anyhow::Result<Account> {
    if let Some(a) = lookup(name) {
        return Ok(a);
    }
    let uid_taken = lookup_uid(uid);
    let mut cmd = Command::new("useradd");
    cmd.args(["-M", "-s", "/usr/sbin/nologin"]);
    if !uid_taken {
        cmd.args(["-u", &uid.to_string()]);
    }
    let st = cmd.arg(name).stdout(Stdio::null()).status().context("running useradd")?;
    anyhow::ensure!(st.success(), "useradd {name} failed: {st}");
    println!("bench: created account {name}");
    lookup(name).with_context(|| format!("useradd made no account {name}"))
}

fn lookup(name: &str) -> Option<Account> {
    let c = CString::new(name).ok()?;
    // SAFETY: getpwnam's static result is read before any other passwd call.
    let pw = unsafe { libc::getpwnam(c.as_ptr()) };
    (!pw.is_null()).then(|| unsafe { Account { uid: (*pw).pw_uid, gid: (*pw).pw_gid } })
}

fn lookup_uid(uid: u32) -> bool {
    // SAFETY: only tests the result for NULL.
    !unsafe { libc::getpwuid(uid) }.is_null()
}

/// In a freshly forked child: take the name, drop root for the account; `_exit` on failure.
pub(super) unsafe fn become_account(comm: &CString, who: Account) {
    libc::prctl(libc::PR_SET_NAME, comm.as_ptr() as libc::c_ulong, 0, 0, 0);
    if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(who.gid) != 0 || libc::setuid(who.uid) != 0 {
        libc::_exit(111);
    }
}

/// What the fork+exec storm did.
pub struct StormResult {
    pub spawned: u64,
    pub seconds: f64,
    /// user+system CPU of the workers and every /bin/true they ran.
    pub cpu_secs: f64,
}

/// One worker per core, each running fork + exec(/bin/true) + wait as fast as it can, as the
/// account, for `duration`. Returns once all have been reaped.
pub fn storm(workers: usize, duration: Duration, who: Account) -> anyhow::Result<StormResult> {
    storm_with(workers, duration, who, false)
}

/// [`storm`] whose children also rename themselves (prctl) before the exec: every event a
/// daemon's programs see, once per process (the BPF cost figure).
pub fn storm_renaming(workers: usize, duration: Duration, who: Account) -> anyhow::Result<StormResult> {
    storm_with(workers, duration, who, true)
}

fn storm_with(workers: usize, duration: Duration, who: Account, rename: bool) -> anyhow::Result<StormResult> {
    let prog = CString::new("/bin/true")?;
    let child_name = CString::new("gbrenamed")?;
    let argv = [prog.as_ptr(), std::ptr::null()];
    let comm = CString::new("gbstorm")?;
    let before = children_cpu_secs();
    let start = Instant::now();
    let mut running = Vec::new();
    let reap = ReapOnDrop(&mut running);
    for _ in 0..workers {
        let mut fds = [0; 2];
        anyhow::ensure!(unsafe { libc::pipe(fds.as_mut_ptr()) } == 0, "pipe: {}", std::io::Error::last_os_error());
        let pid = unsafe { libc::fork() };
        anyhow::ensure!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            unsafe {
                libc::close(fds[0]);
                become_account(&comm, who);
                let mut count: u64 = 0;
                let deadline = monotonic_ns() + duration.as_nanos() as u64;
                while monotonic_ns() < deadline {
                    let c = libc::fork();
                    if c == 0 {
                        if rename {
                            libc::prctl(libc::PR_SET_NAME, child_name.as_ptr() as libc::c_ulong, 0, 0, 0);
                        }
                        libc::execv(prog.as_ptr(), argv.as_ptr());
                        libc::_exit(127);
                    }
                    if c > 0 {
                        let mut st = 0;
                        libc::waitpid(c, &mut st, 0);
                        count += 1;
                    }
                }
                libc::write(fds[1], &count as *const u64 as *const libc::c_void, 8);
                libc::_exit(0);
            }
        }
        unsafe { libc::close(fds[1]) };
        reap.0.push((pid, fds[0]));
    }
    let mut spawned = 0u64;
    for (pid, fd) in reap.0.drain(..) {
        let mut count = 0u64;
        let n = unsafe { libc::read(fd, &mut count as *mut u64 as *mut libc::c_void, 8) };
        unsafe { libc::close(fd) };
        let mut st = 0;
        unsafe { libc::waitpid(pid, &mut st, 0) };
        anyhow::ensure!(n == 8, "a storm worker died without reporting (status {st})");
        spawned += count;
    }
    Ok(StormResult { spawned, seconds: start.elapsed().as_secs_f64(), cpu_secs: children_cpu_secs() - before })
}

struct ReapOnDrop<'a>(&'a mut Vec<(libc::pid_t, libc::c_int)>);

impl Drop for ReapOnDrop<'_> {
    fn drop(&mut self) {
        for &(pid, fd) in self.0.iter() {
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                let mut st = 0;
                libc::waitpid(pid, &mut st, 0);
                libc::close(fd);
            }
        }
    }
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// user+system CPU of every reaped child of xtask so far (getrusage RUSAGE_CHILDREN).
pub fn children_cpu_secs() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// A running guard-user daemon; `Drop` sends SIGTERM, then SIGKILL if it lingers.
pub struct Daemon {
    child: Child,
    pub home: PathBuf,
    pub spawned_at: Instant,
}

impl Daemon {
    pub fn start(binary: &Path, user: &str, home: &Path, backend: &str, dry_run: bool) -> anyhow::Result<Self> {
        Self::start_with(binary, user, home, backend, dry_run, "1s", &[])
    }

    /// [`Daemon::start`] with another tick interval and extra `run` arguments.
    pub fn start_with(
        binary: &Path,
        user: &str,
        home: &Path,
        backend: &str,
        dry_run: bool,
        interval: &str,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start_env(binary, user, home, backend, dry_run, interval, extra, &[])
    }

    /// [`Daemon::start_with`] with extra environment variables (e.g. `GUARD_SNAPSHOT`).
    #[allow(clippy::too_many_arguments)]
    pub fn start_env(
        binary: &Path,
        user: &str,
        home: &Path,
        backend: &str,
        dry_run: bool,
        interval: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let stderr = fs::File::create(home.with_extension("stderr"))?;
        let mut cmd = Command::new(binary);
        cmd.args(["run", "--user", user, "--home"])
            .arg(home)
            .args(["--interval", interval, "--backend", backend])
            .args(extra)
            .envs(env.iter().copied());
        if dry_run {
            cmd.arg("--dry-run");
        }
        let spawned_at = Instant::now();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        Ok(Daemon { child, home: home.to_path_buf(), spawned_at })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn status_path(&self) -> PathBuf {
        self.home.join("guard-status.json")
    }

    /// The status file, once it parses.
    pub fn status(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&fs::read(self.status_path()).ok()?).ok()
    }

    pub fn field(&self, key: &str) -> Option<u64> {
        self.status()?.get(key)?.as_u64()
    }

    /// Waits until the status file reports at least `ticks` ticks; returns the status.
    pub fn wait_ticks(&mut self, ticks: u64, timeout: Duration) -> anyhow::Result<serde_json::Value> {
        let until = Instant::now() + timeout;
        loop {
            if let Some(s) = self.status() {
                if s.get("ticks").and_then(|t| t.as_u64()).unwrap_or(0) >= ticks {
                    return Ok(s);
                }
            }
            if let Some(code) = self.child.try_wait()? {
                anyhow::bail!("guard-user exited ({code}): {}", self.stderr_tail());
            }
            anyhow::ensure!(Instant::now() < until, "guard-user did not reach tick {ticks}: {}", self.stderr_tail());
            thread::sleep(Duration::from_millis(2));
        }
    }

    fn stderr_tail(&self) -> String {
        let text = fs::read_to_string(self.home.with_extension("stderr")).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(5).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU time of a live process, in seconds: (sum of its live threads' `schedstat` run time,
/// utime+stime from `stat`). The first has nanosecond resolution, the second USER_HZ ticks
/// but also counts threads that have exited.
pub fn cpu_secs(pid: u32) -> anyhow::Result<(f64, f64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat.rsplit_once(") ").context("malformed stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let stat_secs = (f[11].parse::<u64>()? + f[12].parse::<u64>()?) as f64 / hz;
    let mut ns = 0u64;
    for task in fs::read_dir(format!("/proc/{pid}/task"))? {
        let path = task?.path().join("schedstat");
        if let Ok(s) = fs::read_to_string(path) {
            ns += s.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0);
        }
    }
    Ok((ns as f64 / 1e9, stat_secs))
}

/// VmRSS of a live process, in KiB.
pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).context("no VmRSS")?;
    Ok(line.split_whitespace().nth(1).context("VmRSS value")?.parse()?)
}

/// One `ps -e -o pid=,comm=` pass over every process (what the start-up figure is a ratio to).
/// Returns (children's CPU seconds, wall seconds).
pub fn ps_pass() -> anyhow::Result<(f64, f64)> {
    let before = children_cpu_secs();
    let start = Instant::now();
    let status = Command::new("ps").args(["-e", "-o", "pid=,comm="]).stdout(Stdio::null()).status()?;
    let wall = start.elapsed().as_secs_f64();
    anyhow::ensure!(status.success(), "ps -e failed: {status}");
    Ok((children_cpu_secs() - before, wall))
}

/// The legacy cost model: `ps -u USER -o comm= | sort | uniq -c`, then the command line of
/// every process of the most common name. Returns (children's CPU seconds, wall seconds).
pub fn ps_rescan(user: &str) -> anyhow::Result<(f64, f64)> {
    let script = r#"
top=$(ps -u "$1" -o comm= | sort | uniq -c | sort -rn | head -n1 | awk '{print $2}')
n=0
ps -u "$1" -o pid=,comm= | while read -r pid comm; do
  if [ "$comm" = "$top" ]; then IFS= read -r -d '' c < "/proc/$pid/cmdline" || true; n=$((n+1)); fi
done
"#;
    let before = children_cpu_secs();
    let start = Instant::now();
    let status = Command::new("bash").args(["-c", script, "ps-rescan", user]).stdout(Stdio::null()).status()?;
    let wall = start.elapsed().as_secs_f64();
    anyhow::ensure!(status.success(), "the ps-rescan pass failed: {status}");
    Ok((children_cpu_secs() - before, wall))
}
