//! A child process running a helper mode of the test binary itself (or any command), talking
//! to the test one line at a time; killed and reaped on drop.
//!
//! The helper side is a function the test binary hands to [`crate::main!`]
//! (`guard_test::main!(helpers = helper_main)`), called with the mode instead of the tests when
//! [`HELPER_ENV`] is set. It says lines with [`say`] and waits with [`wait_for_eof`] or
//! [`next_line`]. Every read on the test side is bounded: a child that says nothing within
//! [`Child::within`] is killed and the test fails naming it.
use std::{
    io::{BufRead as _, BufReader, Write as _},
    os::unix::process::CommandExt as _,
    process::{ChildStdout, Command, Stdio},
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
        Child::spawn(Child::helper_command(mode).uid(uid).gid(uid))
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
