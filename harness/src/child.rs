//! A child process running a helper mode of the test binary itself (or any command), talking
//! to the test one line at a time; killed and reaped on drop.
//!
//! The helper side is a function the test binary hands to [`crate::main!`]
//! (`guard_test::main!(helpers = helper_main)`), called with the mode instead of the tests when
//! [`HELPER_ENV`] is set. It says lines with [`say`] and waits with [`wait_for_eof`] or
//! [`next_line`]. Every read on the test side is bounded: a child that says nothing within
//! [`Child::within`] is killed and the test fails naming it.
//!
//! A program a test runs as one of the test accounts must be one the account can reach:
//! [`runnable_by_accounts`] gives its path, or a copy's where the clone is not (a clone under
//! `/root` or a 0700 home).
use std::{
    collections::HashMap,
    fs,
    hash::{Hash as _, Hasher as _},
    io::{BufRead as _, BufReader, Write as _},
    os::unix::{
        ffi::OsStrExt as _,
        fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _},
        process::CommandExt as _,
    },
    path::{Path, PathBuf},
    process::{ChildStdout, Command, Stdio},
    sync::Mutex,
    time::Duration,
};

/// The environment variable naming the helper mode a child of the test binary runs.
pub const HELPER_ENV: &str = "GUARD_TEST_HELPER";

/// How long a child may take to say a line or to end, unless [`Child::within`] says otherwise.
pub const DEFAULT_BOUND: Duration = Duration::from_secs(10);

/// A spawned child with a pipe to its stdin and from its stdout.
pub struct Child {
    inner: std::process::Child,
    stdout: Option<BufReader<ChildStdout>>,
    bound: Duration,
}

impl Child {
    /// Starts `cmd` with piped stdin and stdout.
    pub fn spawn(cmd: &mut Command) -> Child {
        let mut inner = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {:?}: {e}", cmd.get_program()));
        let stdout = inner.stdout.take().map(BufReader::new);
        Child { inner, stdout, bound: DEFAULT_BOUND }
    }

    /// This test binary again, as the helper `mode` (see [`HELPER_ENV`]).
    pub fn helper(mode: &str) -> Child {
        Child::spawn(&mut Child::helper_command(mode))
    }

    /// [`Child::helper`] with the real and effective uid and gid `uid` (needs root).
    pub fn helper_as(mode: &str, uid: u32) -> Child {
        Child::spawn(&mut Child::helper_command_as(mode, uid))
    }

    /// The command [`Child::helper_as`] runs: this test binary where `uid` can run it
    /// ([`runnable_by_accounts`]), with its uid and gid.
    pub fn helper_command_as(mode: &str, uid: u32) -> Command {
        let mut cmd = Command::new(runnable_by_accounts(&std::env::current_exe().expect("the test binary's path")));
        cmd.env(HELPER_ENV, mode).uid(uid).gid(uid);
        cmd
    }

    /// The command [`Child::helper`] runs, to adjust before [`Child::spawn`].
    pub fn helper_command(mode: &str) -> Command {
        let mut cmd = Command::new(std::env::current_exe().expect("the test binary's path"));
        cmd.env(HELPER_ENV, mode);
        cmd
    }

    /// The bound of each read and of [`Child::wait`] (default [`DEFAULT_BOUND`]).
    pub fn within(mut self, bound: Duration) -> Child {
        self.bound = bound;
        self
    }

    pub fn pid(&self) -> u32 {
        self.inner.id()
    }

    /// The next line the child says, without its newline; the child is killed (and the test
    /// fails) when none comes within the bound.
    pub fn read_line(&mut self) -> String {
        let pid = self.pid() as i32;
        let bound = self.bound;
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let watchdog = std::thread::spawn(move || {
            if rx.recv_timeout(bound).is_err() {
                // SAFETY: signals our own child, not yet reaped (so the pid is still ours).
                unsafe { libc::kill(pid, libc::SIGKILL) };
                return true;
            }
            false
        });
        let mut line = String::new();
        let read = self.stdout.as_mut().expect("the child's stdout").read_line(&mut line);
        let _ = tx.send(());
        let killed = watchdog.join().unwrap_or(false);
        assert!(!killed, "child {pid} said nothing within {bound:?} (killed); it had said {line:?}");
        read.unwrap_or_else(|e| panic!("reading child {pid}'s stdout: {e}"));
        line.truncate(line.trim_end_matches('\n').len());
        line
    }

    /// Reads one line and checks it is `want`.
    pub fn expect_line(&mut self, want: &str) {
        let line = self.read_line();
        assert_eq!(line, want, "child {} said {line:?}", self.pid());
    }

    /// Tells the child to go on ([`next_line`] on its side).
    pub fn send_line(&mut self) {
        self.inner.stdin.as_mut().expect("the child's stdin").write_all(b"go\n").expect("writing to the child");
    }

    /// Closes the child's stdin ([`wait_for_eof`] on its side returns).
    pub fn close_stdin(&mut self) {
        self.inner.stdin.take();
    }

    /// Waits for the child to end, within the bound.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        let (pid, bound) = (self.pid(), self.bound);
        crate::wait::until(bound, &format!("child {pid} to end"), || self.inner.try_wait().expect("waitpid"))
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.inner.kill();
        let _ = self.inner.wait();
    }
}

/// Where every account can run `program` from (a test running a binary of the build as a test
/// account): `program` itself when every directory above it is searchable by others and the file
/// executable by others; else a root-owned copy under [`COPIES`], made once per process and
/// reused across runs while the source keeps its size and modification time. A clone under
/// `/root` (0700) or a 0700 home otherwise fails every such test with EACCES. Without root no
/// other account can be run as: `program` itself.
pub fn runnable_by_accounts(program: &Path) -> PathBuf {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return program.to_path_buf();
    }
    static MADE: Mutex<Option<HashMap<PathBuf, PathBuf>>> = Mutex::new(None);
    let mut made = MADE.lock().unwrap_or_else(|p| p.into_inner());
    let made = made.get_or_insert_with(HashMap::new);
    if let Some(copy) = made.get(program) {
        return copy.clone();
    }
    let real = fs::canonicalize(program).unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    let runnable = match reachable_by_others(&real) {
        true => program.to_path_buf(),
        false => copy_for_accounts(&real),
    };
    made.insert(program.to_path_buf(), runnable.clone());
    runnable
}

/// The directory [`runnable_by_accounts`] copies into: root's (the caller's euid), mode 0755.
pub const COPIES: &str = "/tmp/guard-test-programs";

/// Whether others may execute the file at `real` (a canonical path) and search every
/// directory above it.
fn reachable_by_others(real: &Path) -> bool {
    let others_x = |p: &Path| fs::metadata(p).is_ok_and(|m| m.mode() & 0o001 != 0);
    real.ancestors().all(others_x)
}

/// A copy of `real` in [`COPIES`]`/<hash of its path>/<its file name>` (the name kept: a
/// process's name is its program's), owned by the caller, mode 0755.
fn copy_for_accounts(real: &Path) -> PathBuf {
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    let top = PathBuf::from(format!("{COPIES}-{euid}"));
    // In /tmp anyone may have made that name first: it is used only when it is a directory
    // (not a link) of ours that nobody else may write to.
    if fs::DirBuilder::new().mode(0o755).create(&top).is_ok() {
        fs::set_permissions(&top, fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("chmod {}: {e}", top.display()));
    }
    let meta = fs::symlink_metadata(&top).unwrap_or_else(|e| panic!("{}: {e}", top.display()));
    assert!(
        meta.is_dir() && meta.uid() == euid && meta.mode() & 0o7777 == 0o755,
        "{} is not a directory of uid {euid} with mode 0755 (it is {:?}, uid {}, mode {:o}): remove it",
        top.display(),
        meta.file_type(),
        meta.uid(),
        meta.mode() & 0o7777
    );
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    real.as_os_str().as_bytes().hash(&mut hasher);
    let dir = top.join(format!("{:016x}", hasher.finish()));
    if let Err(e) = fs::DirBuilder::new().mode(0o755).create(&dir) {
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "mkdir {}: {e}", dir.display());
    }
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", dir.display()));
    let name = real.file_name().expect("a program's path names a file");
    let copy = dir.join(name);
    let source = fs::metadata(real).unwrap_or_else(|e| panic!("{}: {e}", real.display()));
    let same = |m: &fs::Metadata| {
        m.is_file()
            && m.uid() == euid
            && m.mode() & 0o7777 == 0o755
            && m.len() == source.len()
            && (m.mtime(), m.mtime_nsec()) == (source.mtime(), source.mtime_nsec())
    };
    if fs::symlink_metadata(&copy).is_ok_and(|m| same(&m)) {
        return copy;
    }
    // cp writes it, not this process: a writable descriptor of ours that a thread's fork
    // inherited would make the exec fail with ETXTBSY until that child execs.
    let partial = dir.join(format!(".{}.{}", name.to_string_lossy(), std::process::id()));
    let cp = Command::new("cp")
        .arg("--preserve=timestamps")
        .arg(real)
        .arg(&partial)
        .status()
        .unwrap_or_else(|e| panic!("cp: {e}"));
    assert!(cp.success(), "cp {} {}: {cp}", real.display(), partial.display());
    fs::set_permissions(&partial, fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", partial.display()));
    fs::rename(&partial, &copy).unwrap_or_else(|e| panic!("rename to {}: {e}", copy.display()));
    copy
}

/// The helper side: one line to the test, flushed.
pub fn say(line: &str) {
    let mut out = std::io::stdout();
    writeln!(out, "{line}").expect("writing to the test");
    out.flush().expect("flushing to the test");
}

/// The helper side: blocks until the test closes our stdin (or drops its [`Child`]).
pub fn wait_for_eof() {
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
}

/// The helper side: blocks until the test sends a line ([`Child::send_line`]).
pub fn next_line() {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("reading from the test");
}
