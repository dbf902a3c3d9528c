//! The parent's handle on one worker process: starting it, frame I/O bounded by deadlines
//! (non-blocking pipes and `poll`, so a worker stuck in `regexec` can never block the caller,
//! not even on a full pipe), killing and reaping it, and describing how it ended.
use std::{
    io::{self, Read, Write},
    os::{
        fd::{AsRawFd, RawFd},
        unix::process::{CommandExt, ExitStatusExt},
    },
    path::Path,
    process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use super::{
    limits::Limits,
    page::SharedPage,
    protocol::{self, Init, Ready, Request, Response},
    sandbox::EXIT_BLOCKED_SYSCALL,
    worker,
};

/// Why talking to the worker stopped.
#[derive(Debug)]
pub(crate) enum Fault {
    /// The deadline passed first.
    Timeout,
    /// End of file or a broken pipe: the worker is gone (or going).
    Gone,
    /// It sent something that is not a frame we know.
    Protocol(String),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Timeout => f.write_str("no answer in time"),
            Fault::Gone => f.write_str("the pipe closed"),
            Fault::Protocol(what) => write!(f, "protocol violation: {what}"),
        }
    }
}

/// A running worker.
pub(crate) struct WorkerProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: ChildStdout,
    /// Bytes read from the worker and not yet parsed into frames.
    inbuf: Vec<u8>,
    /// What the worker reported once hardened.
    pub ready: Ready,
    /// The sequence number of the next text sent.
    pub next_seq: u32,
    /// Whether it holds the matcher's current list, compiled.
    pub compiled: bool,
    /// The skip set it was last sent.
    pub skips: Vec<u32>,
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own, integer arguments only.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `poll` on up to two descriptors until `deadline`; `revents` per entry.
pub(crate) fn poll_until(fds: &mut [libc::pollfd], deadline: Instant) -> io::Result<usize> {
    let left = deadline.saturating_duration_since(Instant::now());
    // Round up so we never spin on a sub-millisecond remainder.
    let ms = left.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32;
    loop {
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd entries.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// `now + d`, or far in the future when that does not fit in an `Instant`.
pub(crate) fn after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d).unwrap_or_else(|| now + Duration::from_secs(86_400 * 365))
}

impl WorkerProcess {
    /// Starts `exe __pattern-worker` with the page on fd 3, sends `Init` and waits for `Ready`.
    pub(crate) fn spawn(exe: &Path, limits: &Limits, page: &SharedPage, deadline: Instant) -> Result<Self, String> {
        page.reset();
        let page_fd = page.fd().as_raw_fd();
        let mut command = Command::new(exe);
        command
            .arg(worker::SUBCOMMAND)
            .env_clear()
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // Nothing the worker could print belongs in the daemon's journal; a panic is
            // reported through the progress page instead.
            .stderr(Stdio::null())
            // Its own process group: a Ctrl-C meant for `cargo xtask run` is not for it.
            .process_group(0);
        // SAFETY: between fork and exec only async-signal-safe calls (dup2, fcntl) on a
        // descriptor that stays valid (the page outlives the spawn).
        unsafe {
            command.pre_exec(move || {
                let ok = if page_fd == worker::PAGE_FD {
                    libc::fcntl(page_fd, libc::F_SETFD, 0) == 0
                } else {
                    libc::dup2(page_fd, worker::PAGE_FD) == worker::PAGE_FD
                };
                if ok {
                    Ok(())
                } else {
                    Err(io::Error::last_os_error())
                }
            })
        };
        let mut child =
            command.spawn().map_err(|e| format!("cannot start {} {}: {e}", exe.display(), worker::SUBCOMMAND))?;
        let (stdin, stdout) = (child.stdin.take().expect("piped"), child.stdout.take().expect("piped"));
        let placeholder =
            Ready { pid: child.id(), uid: 0, gid: 0, identity_dropped: false, seccomp: false, oom_score_adj: false };
        let mut worker = WorkerProcess {
            child,
            stdin,
            stdout,
            inbuf: Vec::new(),
            ready: placeholder,
            next_seq: 0,
            compiled: false,
            skips: Vec::new(),
        };
        for fd in [worker.stdin.as_raw_fd(), worker.stdout.as_raw_fd()] {
            set_nonblocking(fd).map_err(|e| format!("cannot make the worker's pipes non-blocking: {e}"))?;
        }
        let init = Init {
            memory_bytes: limits.memory_bytes,
            stack_bytes: limits.stack_bytes,
            cpu_seconds: limits.cpu_seconds.max(1),
            max_frame: max_frame(limits) as u64,
            run_as: limits.run_as,
            seccomp: limits.seccomp,
        };
        let mut bytes = Vec::new();
        protocol::encode_request(&Request::Init(init), &mut bytes);
        let answer = worker.send(&bytes, deadline).and_then(|()| worker.recv(deadline));
        match answer {
            Ok(Response::Ready(ready)) => {
                worker.ready = ready;
                Ok(worker)
            }
            Ok(Response::SetupFailed(reason)) => {
                let _ = worker.kill();
                Err(format!("the worker could not harden itself: {reason}"))
            }
            Ok(other) => {
                let _ = worker.kill();
                Err(format!("the worker answered {other:?} to Init"))
            }
            Err(fault) => {
                let status = worker.kill();
                Err(format!("the worker did not start ({fault}): {}", describe_end(status, page)))
            }
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn stdin_fd(&self) -> RawFd {
        self.stdin.as_raw_fd()
    }

    pub(crate) fn stdout_fd(&self) -> RawFd {
        self.stdout.as_raw_fd()
    }

    /// Writes as much of `bytes` as the pipe takes now; how many.
    pub(crate) fn write_some(&mut self, bytes: &[u8]) -> Result<usize, Fault> {
        match self.stdin.write(bytes) {
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => Ok(0),
            Err(_) => Err(Fault::Gone),
        }
    }

    /// Reads what the worker has written so far into the buffer (at most 256 KiB per call, so a
    /// worker that floods the pipe cannot grow it without bound before the frames are checked).
    /// `Err(Gone)` at end of file.
    pub(crate) fn read_some(&mut self) -> Result<(), Fault> {
        let mut chunk = [0u8; 16 << 10];
        for _ in 0..16 {
            match self.stdout.read(&mut chunk) {
                Ok(0) => return Err(Fault::Gone),
                Ok(n) => {
                    self.inbuf.extend_from_slice(&chunk[..n]);
                    if n < chunk.len() {
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Err(Fault::Gone),
            }
        }
        Ok(())
    }

    /// The next complete response already read, if any.
    pub(crate) fn parse_next(&mut self) -> Result<Option<Response>, Fault> {
        // Responses are small; anything claiming more is not our worker talking.
        let Some((range, len)) =
            protocol::complete_frame(&self.inbuf, 64 << 10).map_err(|e| Fault::Protocol(e.to_string()))?
        else {
            return Ok(None);
        };
        let response = protocol::decode_response(&self.inbuf[range]).map_err(|e| Fault::Protocol(e.to_string()));
        self.inbuf.drain(..len);
        response.map(Some)
    }

    /// Sends a whole frame by `deadline`.
    pub(crate) fn send(&mut self, mut bytes: &[u8], deadline: Instant) -> Result<(), Fault> {
        while !bytes.is_empty() {
            let n = self.write_some(bytes)?;
            bytes = &bytes[n..];
            if n == 0 {
                let mut fds = [libc::pollfd { fd: self.stdin_fd(), events: libc::POLLOUT, revents: 0 }];
                if Instant::now() >= deadline {
                    return Err(Fault::Timeout);
                }
                poll_until(&mut fds, deadline).map_err(|_| Fault::Gone)?;
                if fds[0].revents & (libc::POLLERR | libc::POLLNVAL) != 0 {
                    return Err(Fault::Gone);
                }
            }
        }
        Ok(())
    }

    /// Waits for the next response by `deadline`.
    pub(crate) fn recv(&mut self, deadline: Instant) -> Result<Response, Fault> {
        loop {
            if let Some(response) = self.parse_next()? {
                return Ok(response);
            }
            if Instant::now() >= deadline {
                return Err(Fault::Timeout);
            }
            let mut fds = [libc::pollfd { fd: self.stdout_fd(), events: libc::POLLIN, revents: 0 }];
            poll_until(&mut fds, deadline).map_err(|_| Fault::Gone)?;
            if fds[0].revents != 0 {
                self.read_some()?;
            }
        }
    }

    /// Whether it has exited (reaping it if so).
    pub(crate) fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL, reap, and read whatever it wrote before dying (left in the buffer for
    /// `parse_next`). Returns how it ended.
    pub(crate) fn kill(&mut self) -> Option<ExitStatus> {
        let _ = self.child.kill();
        let status = self.child.wait().ok();
        // The write end died with the worker: this reads the rest (up to the per-call cap),
        // then end of file.
        while self.read_some().is_ok() && self.inbuf.len() < (1 << 20) {}
        status
    }

    /// CPU time used so far (user + system), from /proc/PID/stat.
    pub(crate) fn cpu_time(&self) -> Option<Duration> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).ok()?;
        // Fields after the `(comm)`: state is field 3, utime 14, stime 15.
        let rest = &stat[stat.rfind(')')? + 2..];
        let fields: Vec<&str> = rest.split(' ').collect();
        let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        Some(Duration::from_millis(ticks * 1000 / hz))
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        // Never leave a worker running (or a zombie) behind a dropped handle.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The largest frame the parent sends: a full list or the longest text, plus headers.
pub(crate) fn max_frame(limits: &Limits) -> usize {
    let list = limits.max_patterns.saturating_mul(limits.max_pattern_bytes.saturating_add(4));
    list.max(limits.max_text_bytes).saturating_add(64)
}

/// How a worker ended, in words: the exit status, plus what it left in the page.
pub(crate) fn describe_end(status: Option<ExitStatus>, page: &SharedPage) -> String {
    let mut text = match status {
        None => "its status is unknown".to_string(),
        Some(s) => match (s.code(), s.signal()) {
            (Some(EXIT_BLOCKED_SYSCALL), _) => "it was stopped by its sandbox".to_string(),
            (Some(code), _) => format!("it exited with status {code}"),
            (None, Some(signal)) => format!("it was killed by signal {signal} ({})", signal_name(signal)),
            (None, None) => "it ended".to_string(),
        },
    };
    if let Some(signal) = page.crash_signal() {
        text.push_str(&format!(" (it crashed with signal {signal}, {})", signal_name(signal)));
    }
    if let Some(nr) = page.blocked_syscall() {
        text.push_str(&format!(" (seccomp stopped syscall {nr})"));
    }
    if let Some(message) = page.message() {
        let message: String = message.chars().map(|c| if c.is_control() { ' ' } else { c }).take(200).collect();
        text.push_str(&format!(" (panic: {message})"));
    }
    text
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGSYS => "SIGSYS",
        libc::SIGTERM => "SIGTERM",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        _ => "other",
    }
}
