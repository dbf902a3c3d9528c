//! The worker process: `guard-user __pattern-worker`, started by [`Matcher`](super::Matcher)
//! only, with its stdin/stdout as the frame pipes and the progress page as fd 3 (see
//! `protocol`). It reads `Init`, hardens itself (`sandbox`), answers `Ready`, then serves
//! `Compile`, `Skip`, `Text` and `Probe` until stdin closes. It holds the compiled set, so the
//! daemon never runs `regcomp`/`regexec` itself.
//!
//! The worker writes answers into a buffer and flushes it whenever it is about to wait for
//! input, so a batch of short texts costs one `write` per batch, not per text. It never
//! allocates per answer beyond that buffer.
use std::{
    fs::File,
    io::{BufReader, BufWriter, Read, Write},
    os::fd::{FromRawFd, OwnedFd},
    process::ExitCode,
};

use super::{
    page::{SharedPage, STATE_COMPILING, STATE_IDLE, STATE_MATCHING, STATE_PROBING},
    protocol::{self, CompileFailure, Init, Ready, Request, Response, NONE},
    sandbox, Pattern, PatternError,
};

/// The hidden subcommand that runs [`main`].
pub const SUBCOMMAND: &str = "__pattern-worker";

/// The descriptor the progress page arrives on.
pub(crate) const PAGE_FD: i32 = 3;

/// The worker's buffered ends of the two pipes.
struct Pipes {
    input: BufReader<File>,
    output: BufWriter<File>,
    /// The payload of the last frame read.
    frame: Vec<u8>,
}

impl Pipes {
    fn stdio() -> Pipes {
        // SAFETY: fds 0 and 1 are the pipes the parent set up, owned from here on by these
        // files alone (nothing else in the worker uses stdin/stdout).
        let (input, output) = unsafe { (File::from_raw_fd(0), File::from_raw_fd(1)) };
        Pipes {
            input: BufReader::with_capacity(64 << 10, input),
            output: BufWriter::with_capacity(16 << 10, output),
            frame: Vec::new(),
        }
    }

    /// Reads the next frame's payload into `self.frame`; `Ok(false)` at end of input. Flushes
    /// pending answers first whenever the frame is not already buffered (we are about to wait).
    fn next(&mut self, max: usize) -> std::io::Result<bool> {
        let mut head = [0u8; 4];
        if self.input.buffer().len() < 4 {
            self.output.flush()?;
        }
        match self.input.read_exact(&mut head) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(false),
            Err(e) => return Err(e),
        }
        let len = u32::from_le_bytes(head) as usize;
        if len > max {
            return Err(std::io::Error::other("frame over the size limit"));
        }
        if self.input.buffer().len() < len {
            self.output.flush()?;
        }
        self.frame.resize(len, 0);
        self.input.read_exact(&mut self.frame)?;
        Ok(true)
    }

    fn send(&mut self, response: &Response) -> std::io::Result<()> {
        let mut bytes = Vec::with_capacity(32);
        protocol::encode_response(response, &mut bytes);
        self.output.write_all(&bytes)
    }
}

/// Notes progress in the page with a counter that changes on every call.
struct Progress {
    page: &'static SharedPage,
    counter: u32,
}

impl Progress {
    fn note(&mut self, state: u32, seq: u32, pattern: usize) {
        self.counter = self.counter.wrapping_add(1);
        self.page.note(self.counter, state, seq, pattern as u32);
    }
}

/// The worker's entry point (exit status: 0 when the parent closed stdin, 1 on a broken pipe
/// or a malformed frame, 2 when hardening failed).
pub fn main() -> ExitCode {
    // Before the sandbox, which does not allow getpid.
    let pid = std::process::id();
    let mut pipes = Pipes::stdio();
    let init = match pipes.next(protocol::INIT_MAX_FRAME).map(|_| protocol::decode_request(&pipes.frame)) {
        Ok(Ok(Request::Init(init))) => init,
        _ => return ExitCode::from(1),
    };
    // SAFETY: the parent put the page's memfd on fd 3 for us alone. The page is leaked: it is
    // mapped for the worker's whole life (the sandbox then closes fd 3; the mapping stays).
    let page = match SharedPage::map(unsafe { OwnedFd::from_raw_fd(PAGE_FD) }) {
        Ok(page) => &*Box::leak(Box::new(page)),
        Err(e) => return setup_failed(&mut pipes, format!("map the progress page: {e}")),
    };
    std::panic::set_hook(Box::new(move |info| page.set_message(info.to_string().as_bytes())));
    let applied = match sandbox::enter(&init, page) {
        Ok(applied) => applied,
        Err(reason) => return setup_failed(&mut pipes, reason),
    };
    let ready = Ready {
        pid,
        uid: applied.uid,
        gid: applied.gid,
        identity_dropped: applied.identity_dropped,
        seccomp: applied.seccomp,
        oom_score_adj: applied.oom_score_adj,
    };
    if pipes.send(&Response::Ready(ready)).is_err() {
        return ExitCode::from(1);
    }
    match serve(&mut pipes, &init, Progress { page, counter: 0 }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::from(1),
    }
}

fn setup_failed(pipes: &mut Pipes, reason: String) -> ExitCode {
    let _ = pipes.send(&Response::SetupFailed(reason)).and_then(|()| pipes.output.flush());
    ExitCode::from(2)
}

fn serve(pipes: &mut Pipes, init: &Init, mut progress: Progress) -> std::io::Result<()> {
    let max_frame = usize::try_from(init.max_frame).unwrap_or(usize::MAX);
    let mut set: Vec<Pattern> = Vec::new();
    let mut skip: Vec<bool> = Vec::new();
    while pipes.next(max_frame)? {
        let request = protocol::decode_request(&pipes.frame).map_err(std::io::Error::other)?;
        let response = match request {
            Request::Compile(list) => {
                // Free the old set before compiling the new one: the heap limit is for one set.
                set.clear();
                skip.clear();
                let mut failed = None;
                for (j, source) in list.iter().enumerate() {
                    progress.note(STATE_COMPILING, 0, j);
                    match Pattern::new(source) {
                        Ok(p) => set.push(p),
                        Err(e) => {
                            failed = Some((j, e));
                            break;
                        }
                    }
                }
                progress.note(STATE_IDLE, 0, 0);
                match failed {
                    None => {
                        skip = vec![false; set.len()];
                        Response::Compiled { count: set.len() as u32 }
                    }
                    Some((index, e)) => {
                        set.clear();
                        let (failure, reason) = match e {
                            PatternError::Invalid { reason, .. } => (CompileFailure::Invalid, reason),
                            PatternError::Nul { .. } => (CompileFailure::Nul, String::new()),
                            PatternError::OutOfMemory { .. } => (CompileFailure::OutOfMemory, String::new()),
                        };
                        Response::CompileFailed { index: index as u32, failure, reason }
                    }
                }
            }
            Request::Skip(list) => {
                skip.fill(false);
                for j in list {
                    if let Some(s) = skip.get_mut(j as usize) {
                        *s = true;
                    }
                }
                continue;
            }
            Request::Text { seq, start, text } => {
                let (mut matched, mut skipped, mut out_of_memory) = (NONE, false, NONE);
                for j in (start as usize)..set.len() {
                    if skip[j] {
                        skipped = true;
                        continue;
                    }
                    progress.note(STATE_MATCHING, seq, j);
                    match set[j].try_match(text) {
                        Ok(true) => {
                            matched = j as u32;
                            break;
                        }
                        Ok(false) => {}
                        // Answer now: the parent counts the failure, and resumes the text
                        // after this pattern (or settles it, at its failure cap).
                        Err(_) => {
                            out_of_memory = j as u32;
                            break;
                        }
                    }
                }
                progress.note(STATE_IDLE, seq, 0);
                Response::Answer { seq, matched, skipped, out_of_memory }
            }
            Request::Probe(path) => {
                progress.note(STATE_PROBING, 0, 0);
                let errno = probe_open(path);
                progress.note(STATE_IDLE, 0, 0);
                Response::ProbeResult { errno }
            }
            Request::Init(_) => return Err(std::io::Error::other("a second Init")),
        };
        pipes.send(&response)?;
    }
    Ok(())
}

/// Tries to open `path` read-only: 0 when it opened (and is closed again), else the errno.
fn probe_open(path: &[u8]) -> i32 {
    let Ok(c_path) = std::ffi::CString::new(path) else { return libc::EINVAL };
    // SAFETY: `c_path` is NUL-terminated; a returned descriptor is closed at once.
    let fd = unsafe { libc::open(c_path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
    }
    // SAFETY: closing the descriptor we just opened.
    unsafe { libc::close(fd) };
    0
}
