//! Helpers shared by the integration tests: RAII guards for temp homes, probe processes and
//! daemons (Drop kills and reaps what a test spawned). The tests run under guard-test's harness
//! (`#[guard_test(needs = [root, …])]`): a test that needs root is ignored with the reason
//! without it, never passed.
use std::{
    fs,
    io::{BufRead, BufReader},
    os::unix::{fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

pub mod bounds;

pub use guard_test::{guard_test, serial::Serial, wait::poll, Need};

pub const TEST_USER: &str = "guardtest1";
pub const TEST_UID: u32 = 4201;
pub const OTHER_USER: &str = "guardtest2";
pub const OTHER_UID: u32 = 4202;

/// Set-up for a kernel test (declared `needs = [root]`): the [`Serial`] guard, held for the
/// whole test, and the test accounts.
pub fn setup() -> Serial {
    // SAFETY: geteuid cannot fail.
    assert_eq!(unsafe { libc::geteuid() }, 0, "a test that calls setup() declares needs = [root]");
    let serial = guard_test::serial::serial();
    ensure_account(TEST_USER, TEST_UID);
    ensure_account(OTHER_USER, OTHER_UID);
    serial
}

/// The backends a test that runs both can run here: both, or procfs alone where the ebpf
/// backend cannot load (a kernel without BTF, a build without the BPF object), said on stderr;
/// a run that requires `ebpf` fails instead.
pub fn backends() -> Vec<&'static str> {
    match guard_test::adapt(Need::Ebpf) {
        None => vec!["ebpf", "procfs"],
        Some(why) => {
            eprintln!("the procfs backend only: {why}");
            vec!["procfs"]
        }
    }
}

/// Creates a test account when missing (the VM image ships them in /etc/passwd).
pub fn ensure_account(name: &str, uid: u32) {
    if guard::account::Account::by_name(name).is_ok() {
        return;
    }
    let status = Command::new("useradd")
        .args(["--uid", &uid.to_string(), "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", name])
        .status()
        .expect("useradd");
    assert!(status.success() || guard::account::Account::by_name(name).is_ok(), "cannot create test account {name}");
}

fn target_dir_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test> → target/<profile>/<name>
    exe.parent().and_then(|d| d.parent()).map(|d| d.join(name)).unwrap()
}

/// guard-user of this build, where the test accounts can run it too (a copy when the clone is
/// out of their reach: [`guard_test::child::runnable_by_accounts`]).
pub fn guard_bin() -> PathBuf {
    let bin = std::env::var_os("GUARD_USER_BIN").map(PathBuf::from).unwrap_or_else(|| target_dir_bin("guard-user"));
    guard_test::child::runnable_by_accounts(&bin)
}

/// guard-probe of this build, where the test accounts can run it too (as [`guard_bin`]).
pub fn probe_bin() -> PathBuf {
    let bin = std::env::var_os("GUARD_PROBE_BIN").map(PathBuf::from).unwrap_or_else(|| target_dir_bin("guard-probe"));
    guard_test::child::runnable_by_accounts(&bin)
}

/// A temp home owned by the test account, with a copy of the probe named `name`.
pub struct Home {
    pub dir: tempfile::TempDir,
}

impl Home {
    pub fn new() -> Home {
        let dir = tempfile::Builder::new().prefix("guard-test-").tempdir_in("/tmp").unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(dir.path(), Some(TEST_UID), Some(TEST_UID)).unwrap();
        Home { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn write_config(&self, json: &str) {
        fs::write(self.path().join("guard-config.json"), json).unwrap();
    }

    /// A copy of the probe binary called `name` (its comm), world-executable.
    pub fn probe_named(&self, name: &str) -> PathBuf {
        let bindir = self.path().join("bin");
        fs::create_dir_all(&bindir).unwrap();
        fs::set_permissions(&bindir, fs::Permissions::from_mode(0o755)).unwrap();
        let p = bindir.join(name);
        if !p.exists() {
            fs::copy(probe_bin(), &p).unwrap_or_else(|e| panic!("copy {}: {e}", probe_bin().display()));
            fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        }
        p
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.path().join("guard-daemon.log")).unwrap_or_default()
    }

    pub fn state(&self) -> Option<serde_json::Value> {
        fs::read(self.path().join("guard-daemon-state.json")).ok().and_then(|b| serde_json::from_slice(&b).ok())
    }

    /// Polls the log until `pred` holds or `timeout` passes; returns the log.
    pub fn wait_log(&self, timeout: Duration, pred: impl Fn(&str) -> bool) -> String {
        poll(timeout, || {
            let log = self.log();
            (pred(&log), log)
        })
    }

    /// Polls the status file until `pred` holds or `timeout` passes; returns the last status read.
    /// The daemon writes the status at the end of a tick, after that tick's log lines, so a test
    /// that saw a line in the log waits here for the tick that wrote it to finish.
    pub fn wait_status(
        &self,
        timeout: Duration,
        pred: impl Fn(&guard::status::Status) -> bool,
    ) -> Option<guard::status::Status> {
        let path = self.path().join("guard-status.json");
        poll(timeout, || {
            let st = guard::status::read(&path, guard::safefs::FsIdentity::current()).ok();
            (st.as_ref().is_some_and(&pred), st)
        })
    }
}

impl Default for Home {
    fn default() -> Self {
        Home::new()
    }
}

/// A probe process; killed and reaped on drop.
pub struct Probe {
    pub child: Child,
}

impl Probe {
    /// Starts `exe args…` as `uid` and waits until it printed `ready`.
    pub fn spawn(exe: &Path, args: &[&str], uid: u32) -> Probe {
        let mut child = Command::new(exe)
            .args(args)
            .uid(uid)
            .gid(uid)
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", exe.display()));
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "probe did not start");
        Probe { child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Reaps the probe if it has exited.
    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits up to `timeout` for the probe to exit.
    pub fn wait_dead(&mut self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if !self.is_alive() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        // The whole process group: forked children too.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// A running guard-user; SIGTERM then reaped on drop.
pub struct Daemon {
    pub child: Child,
}

impl Daemon {
    pub fn start(home: &Home, extra: &[&str]) -> Daemon {
        Daemon::start_with(home, extra, &[])
    }

    /// With extra environment variables (e.g. `GUARD_FAULT`, `NOTIFY_SOCKET`). Without a
    /// `--backend` in `extra` the daemon picks one: where the ebpf backend cannot load, that is
    /// procfs, which is said (and fails a run that requires `ebpf`).
    pub fn start_with(home: &Home, extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        if !extra.contains(&"--backend") {
            if let Some(why) = guard_test::adapt(Need::Ebpf) {
                eprintln!("the daemon will run the procfs backend: {why}");
            }
        }
        let mut cmd = Command::new(guard_bin());
        cmd.envs(env.iter().copied());
        cmd.arg("run").args(["--user", TEST_USER, "--home"]).arg(home.path()).args(["--interval", "1s"]).args(extra);
        cmd.stdout(Stdio::null()).stderr(Stdio::inherit());
        Daemon { child: cmd.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", guard_bin().display())) }
    }

    pub fn stop(mut self) -> std::process::ExitStatus {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        unsafe { libc::kill(self.child.id() as i32, libc::SIGCONT) };
        let st = self.child.wait().unwrap();
        std::mem::forget(self);
        st
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SIGCONT too: a test may have stopped it (SIGSTOP) before it panicked.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        unsafe { libc::kill(self.child.id() as i32, libc::SIGCONT) };
        let _ = self.child.wait();
    }
}

/// Lines of `log` whose event is `event`.
pub fn lines<'a>(log: &'a str, event: &str) -> Vec<&'a str> {
    log.lines().filter(|l| l.split(' ').nth(2) == Some(event)).collect()
}

/// `workers` processes of `uid` each fork `per_worker` children that exit at once, in batches
/// of 64 (so the kernel sees thousands of fork and exit events within a second or two).
pub fn fork_storm(workers: usize, per_worker: usize, uid: u32) {
    let mut kids = Vec::new();
    for _ in 0..workers {
        // SAFETY: the child only makes raw syscalls (setresgid/setresuid, fork, _exit, waitpid)
        // — async-signal-safe — and never returns into Rust code of the test harness.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            unsafe {
                libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>());
                libc::syscall(libc::SYS_setresgid, uid, uid, uid);
                libc::syscall(libc::SYS_setresuid, uid, uid, uid);
                let mut left = per_worker;
                while left > 0 {
                    let batch = left.min(64);
                    for _ in 0..batch {
                        if libc::fork() == 0 {
                            libc::_exit(0);
                        }
                    }
                    for _ in 0..batch {
                        libc::waitpid(-1, std::ptr::null_mut(), 0);
                    }
                    left -= batch;
                }
                libc::_exit(0);
            }
        }
        assert!(pid > 0, "fork failed");
        kids.push(pid);
    }
    for k in kids {
        unsafe { libc::waitpid(k, std::ptr::null_mut(), 0) };
    }
}

/// Every thread of `pid` with its name, state, kernel wait channel and current syscall, for a
/// failure message about a daemon that stopped making progress.
pub fn thread_dump(pid: u32) -> String {
    let mut out = format!("threads of {pid}:\n");
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) else { return out + "  (gone)\n" };
    for t in dir.flatten() {
        let tid = t.file_name().to_string_lossy().into_owned();
        let read = |leaf: &str| fs::read_to_string(t.path().join(leaf)).unwrap_or_default().trim().to_string();
        let stat = read("stat");
        let state = stat.rfind(')').and_then(|i| stat.get(i + 2..i + 3)).unwrap_or("?").to_string();
        let stack: Vec<String> =
            read("stack").lines().take(6).map(|l| l.split_whitespace().nth(1).unwrap_or("").to_string()).collect();
        out += &format!(
            "  {tid} {:<16} {state} wchan={} syscall={} stack={}\n",
            read("comm"),
            read("wchan"),
            read("syscall").split(' ').next().unwrap_or(""),
            stack.join("<")
        );
    }
    out
}

/// Restores `kernel.pid_max` on drop.
pub struct PidMax(String);

impl PidMax {
    /// Lowers `kernel.pid_max` (only in a throwaway guest kernel: it exhausts the pid space).
    pub fn lower_to(max: u32) -> PidMax {
        let old = fs::read_to_string("/proc/sys/kernel/pid_max").unwrap();
        fs::write("/proc/sys/kernel/pid_max", max.to_string()).expect("lower kernel.pid_max");
        PidMax(old.trim().to_string())
    }
}

impl Drop for PidMax {
    fn drop(&mut self) {
        let _ = fs::write("/proc/sys/kernel/pid_max", &self.0);
    }
}
