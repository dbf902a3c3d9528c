//! [`Matcher`]: `excludeCommands` matching bounded in time, memory and stack, outside the daemon.
//!
//! glibc's `regexec` cannot be interrupted and its cost has no bound (`(a*)*\1` on a few
//! hundred bytes takes seconds and gigabytes; `()(\1\1)+` overflows any stack), so the patterns
//! live in a sandboxed worker process (`worker`, `sandbox`) that the matcher kills when it
//! overruns. What the caller sees:
//!
//! - [`Matcher::set_patterns`] checks the list statically ([`check_static`]) and compiles it in
//!   the worker under the `compile` deadline and the worker's memory limit — only when the list
//!   differs from the last one, so a daemon calling it every tick compiles once per config
//!   change. A list that failed keeps failing, with the same error, without recompiling.
//! - [`Round::classify`] answers, for each text, [`MatchOutcome::Matched`] (the first matching
//!   pattern), [`MatchOutcome::NoMatch`], or [`MatchOutcome::Budget`]: the bounds did not allow a
//!   decision, and the caller must then **protect** the process (`SKIPPED … reason=match_budget`),
//!   never end it.
//!
//! # Bounds while matching
//! - One pattern on one text may run `per_match` (killed between 1 and 1.25 × `per_match`: the
//!   parent samples the progress page every quarter of it). The worker is then killed and
//!   reaped, that pattern gets a strike, the text resumes at the *next* pattern in a fresh
//!   worker (which recompiles the list — ~1 ms for the shipped one), and texts behind it are
//!   re-sent. A later pattern that matches still gives `Matched` (protection is certain either
//!   way); if none does, the text is `Budget`.
//! - A worker that dies (stack overflow, out of memory, seccomp, an outside SIGKILL) is handled
//!   the same way, blamed on the pattern the progress page names; a death the page cannot
//!   explain makes the oldest unanswered text `Budget`, so every death makes progress.
//! - `regexec` running out of the worker's heap is a failure of that pattern on that text too
//!   (glibc sometimes answers "no match" then: see [`Pattern::try_match`](super::Pattern::try_match)):
//!   the worker answers at once and the text resumes at the next pattern, as after an overrun.
//! - After `strikes` strikes in one [`Round`], a pattern is no longer run in that round (texts
//!   it could have matched are `Budget`), so one hostile pattern costs a tick about
//!   `strikes × per_match`, not that much per process. Strikes are per round because a pattern
//!   slow on one hostile text may be fast on the next tick's texts.
//! - A text on which `strikes` patterns failed (overran, ran out of memory) is `Budget` without
//!   trying the rest: it is protected whatever they say, and each could cost another
//!   `per_match`. So one hostile text costs at most `strikes × per_match` too, however many
//!   hostile patterns the list holds.
//! - [`Round::classify_from`] says which verdicts are settled (the same list on the same text
//!   gives them again) and where an unsettled text stands ([`Resume`]), for a caller that
//!   caches verdicts across rounds (the daemon: `daemon::verdicts`).
//! - The round's deadline bounds everything: what is not answered by then is `Budget`. The
//!   regexec running at the deadline may go on to its own `per_match` bound (at most 0.5 s), so
//!   its overrun still counts; the text it belonged to resumes, in a later round, at the pattern
//!   it was running.
//! - A text longer than `max_text_bytes` is `Budget` without being sent.
//!
//! # Call pattern (a blocking tick thread)
//! ```no_run
//! # use guard::pattern::{Limits, MatchOutcome, Matcher};
//! # use std::time::{Duration, Instant};
//! # let config_patterns: Vec<String> = vec![];
//! # let cmdlines: Vec<Vec<u8>> = vec![];
//! let mut matcher = Matcher::new("/proc/self/exe".into(), Limits::default()); // once, at start-up
//! // Every tick, after reading the config (a no-op unless the list changed):
//! if let Err(e) = matcher.set_patterns(&config_patterns) {
//!     // e.is_config_error(): `ERROR config_malformed excludeCommands pattern=…`, end nothing.
//!     // otherwise the worker is broken: protect every process (match_budget) and say so.
//! }
//! let mut round = matcher.round(Instant::now() + Duration::from_secs(20)); // the tick's budget
//! // Texts capped at limits.max_text_bytes + 1 bytes when read; one call, or one per name.
//! let texts: Vec<&[u8]> = cmdlines.iter().map(|c| c.as_slice()).collect();
//! for (text, outcome) in texts.iter().zip(round.classify(&texts)) {
//!     match outcome {
//!         MatchOutcome::Matched(i) => { /* SKIPPED reason=excluded_command (pattern i) */ }
//!         MatchOutcome::Budget => { /* SKIPPED reason=match_budget */ }
//!         MatchOutcome::NoMatch => { /* end it */ }
//!     }
//! }
//! ```
//! `Matcher` is `Send` (move it into the tick thread) and needs `&mut`: one caller at a time.
//! It spawns children, so the daemon must not set SIGCHLD to SIG_IGN (children could not be
//! reaped, and `wait` would fail).
#[cfg(any(test, feature = "testing"))]
use std::path::Path;
use std::{path::PathBuf, time::Instant};

use super::{
    child::{after, describe_end, Fault, WorkerProcess},
    limits::{check_static, CostReason, Limits, PatternSetError},
    page::{SharedPage, STATE_COMPILING},
    protocol::{self, CompileFailure, Request, Response},
};

pub use super::round::{Progress, Resume, Round};

/// The verdict on one text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatchOutcome {
    /// This pattern matches, and no earlier one is known to (an earlier one may have been
    /// undecidable: the process is protected either way).
    Matched(usize),
    /// No pattern matches: the process may be ended.
    NoMatch,
    /// The bounds did not allow a decision: protect the process, never end it.
    Budget,
}

/// What the matcher did, for tests, `status` and the closing numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MatcherStats {
    /// Workers started.
    pub spawns: u64,
    /// Lists compiled, counting recompiles in a fresh worker.
    pub compiles: u64,
    /// Workers killed for overrunning a deadline.
    pub kills: u64,
    /// Workers found dead (crash, memory, seccomp, outside signal).
    pub deaths: u64,
    /// Texts answered `Budget`.
    pub budget: u64,
    /// Texts sent to a worker, counting a text sent again after a worker died: the matching
    /// work, in the unit a test can count.
    pub texts: u64,
}

/// How the current worker hardened itself (from its `Ready` frame).
#[cfg(any(test, feature = "testing"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SandboxState {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
    /// Started as root and switched to `Limits::run_as`.
    pub identity_dropped: bool,
    /// The seccomp filter is on.
    pub seccomp: bool,
    /// `oom_score_adj` is 1000.
    pub oom_score_adj: bool,
}

/// The worker's memory in bytes. `anon` is what it adds to the unit's memory: its file pages
/// are the daemon's binary, already in the page cache.
#[cfg(any(test, feature = "testing"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerMemory {
    /// `VmRSS`.
    pub rss: u64,
    /// `RssAnon`: heap, stack, private data.
    pub anon: u64,
    /// `VmHWM`: the peak resident size.
    pub peak: u64,
}

/// What happened when the worker tried to open a file ([`Matcher::probe_open`]).
#[cfg(any(test, feature = "testing"))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// The sandbox stopped the call: the worker is gone, replaced at the next use.
    Blocked { syscall: u32 },
    /// The call ran and failed with this errno (no seccomp, but the identity had no access).
    Refused { errno: i32 },
    /// The file opened: the worker is not sandboxed.
    Opened,
}

/// The parent side of the bounded matcher. See the module doc.
pub struct Matcher {
    exe: PathBuf,
    pub(crate) limits: Limits,
    pub(crate) page: Option<SharedPage>,
    pub(crate) worker: Option<WorkerProcess>,
    /// The list last given to `set_patterns`, and what it gave (`None` until the first call).
    pub(crate) list: Vec<String>,
    pub(crate) verdict: Option<Result<(), PatternSetError>>,
    pub(crate) stats: MatcherStats,
    /// The last thing that went wrong with a worker, in words (for the tests: the product
    /// reports a failure through the error or verdict it causes).
    #[cfg(any(test, feature = "testing"))]
    last_failure: Option<String>,
}

impl Matcher {
    /// A matcher whose worker is `exe __pattern-worker` (the daemon passes `/proc/self/exe`,
    /// tests the built binary). Nothing starts until the first list is set.
    pub fn new(exe: PathBuf, limits: Limits) -> Matcher {
        Matcher {
            exe,
            limits,
            page: None,
            worker: None,
            list: Vec::new(),
            verdict: None,
            stats: MatcherStats::default(),
            #[cfg(any(test, feature = "testing"))]
            last_failure: None,
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    #[cfg(any(test, feature = "testing"))]
    pub fn stats(&self) -> MatcherStats {
        self.stats
    }

    /// The worker's pid, if one runs.
    #[cfg(any(test, feature = "testing"))]
    pub fn worker_pid(&self) -> Option<u32> {
        self.worker.as_ref().map(WorkerProcess::pid)
    }

    /// How the running worker hardened itself.
    #[cfg(any(test, feature = "testing"))]
    pub fn sandbox(&self) -> Option<SandboxState> {
        self.worker.as_ref().map(|w| {
            let r = &w.ready;
            SandboxState {
                pid: r.pid,
                uid: r.uid,
                gid: r.gid,
                identity_dropped: r.identity_dropped,
                seccomp: r.seccomp,
                oom_score_adj: r.oom_score_adj,
            }
        })
    }

    /// The last worker failure in words (a start-up that failed, a crash).
    #[cfg(any(test, feature = "testing"))]
    pub fn last_failure(&self) -> Option<&str> {
        self.last_failure.as_deref()
    }

    /// Keeps `what` as [`Matcher::last_failure`] where tests can read it; nothing without them.
    pub(crate) fn failed(&mut self, what: impl FnOnce() -> String) {
        #[cfg(any(test, feature = "testing"))]
        {
            self.last_failure = Some(what());
        }
        #[cfg(not(any(test, feature = "testing")))]
        let _ = what;
    }

    /// Sets the list to match against (see the module doc). `Ok` means every pattern is valid
    /// and compiled in the worker (or the list is empty).
    pub fn set_patterns(&mut self, patterns: &[String]) -> Result<(), PatternSetError> {
        if self.verdict.is_some() && self.list == patterns {
            match &self.verdict {
                Some(Err(PatternSetError::Worker(_))) => {} // the worker's fault: try again
                Some(verdict) => return verdict.clone(),
                None => unreachable!("checked above"),
            }
        }
        self.list = patterns.to_vec();
        // No verdict while compiling, so `ensure_worker` starts a worker without compiling.
        self.verdict = None;
        if let Some(w) = &mut self.worker {
            w.compiled = false;
        }
        let verdict = check_static(patterns, &self.limits).and_then(|()| self.compile_list(None));
        self.verdict = Some(verdict.clone());
        verdict
    }

    /// The list last set (valid or not).
    #[cfg(any(test, feature = "testing"))]
    pub fn patterns(&self) -> &[String] {
        &self.list
    }

    /// Starts a round of [`Round::classify`] calls sharing `deadline` and the strikes.
    pub fn round(&mut self, deadline: Instant) -> Round<'_> {
        self.reap_if_dead();
        self.retire_if_worn();
        Round::new(self, deadline)
    }

    /// One round with one call: the verdict for each text.
    pub fn classify(&mut self, texts: &[&[u8]], deadline: Instant) -> Vec<MatchOutcome> {
        self.round(deadline).classify(texts)
    }

    /// Asks the worker to open `path`: the sandbox self-test (tests, and a daemon that wants to
    /// report its sandbox at start-up).
    #[cfg(any(test, feature = "testing"))]
    pub fn probe_open(&mut self, path: &Path) -> Result<ProbeOutcome, PatternSetError> {
        let deadline = after(self.limits.spawn);
        self.ensure_worker(deadline).map_err(PatternSetError::Worker)?;
        let worker = self.worker.as_mut().expect("ensured");
        let mut bytes = Vec::new();
        protocol::encode_request(&Request::Probe(path.as_os_str().as_encoded_bytes()), &mut bytes);
        match worker.send(&bytes, deadline).and_then(|()| worker.recv(deadline)) {
            Ok(Response::ProbeResult { errno: 0 }) => Ok(ProbeOutcome::Opened),
            Ok(Response::ProbeResult { errno }) => Ok(ProbeOutcome::Refused { errno }),
            Ok(other) => Err(self.bury_for_error(format!("it answered {other:?} to a probe"))),
            Err(fault) => {
                let page = self.page.as_ref().expect("a worker has a page");
                let status = self.worker.take().and_then(|mut w| w.kill());
                match page.blocked_syscall() {
                    Some(syscall) => {
                        self.stats.deaths += 1;
                        Ok(ProbeOutcome::Blocked { syscall })
                    }
                    None => Err(PatternSetError::Worker(format!("probe: {fault}: {}", describe_end(status, page)))),
                }
            }
        }
    }

    /// The worker's memory now, from /proc/PID/status, for measurements and tests.
    #[cfg(any(test, feature = "testing"))]
    pub fn worker_memory(&self) -> Option<WorkerMemory> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.worker_pid()?)).ok()?;
        let kib = |key: &str| -> Option<u64> {
            let v = status.lines().find_map(|l| l.strip_prefix(key))?;
            Some(v.trim().trim_end_matches("kB").trim().parse::<u64>().ok()? * 1024)
        };
        Some(WorkerMemory { rss: kib("VmRSS:")?, anon: kib("RssAnon:")?, peak: kib("VmHWM:")? })
    }

    /// A live worker, started (and given the current valid list) if needed.
    pub(crate) fn ensure_worker(&mut self, deadline: Instant) -> Result<(), String> {
        self.reap_if_dead();
        if self.worker.is_none() {
            if self.page.is_none() {
                self.page = Some(SharedPage::create().map_err(|e| format!("cannot create the progress page: {e}"))?);
            }
            let spawn_by = deadline.min(after(self.limits.spawn));
            let worker = WorkerProcess::spawn(&self.exe, &self.limits, self.page()?, spawn_by).inspect_err(|e| {
                self.failed(|| e.clone());
            })?;
            self.stats.spawns += 1;
            self.worker = Some(worker);
        }
        let holds_list = self.worker.as_ref().is_some_and(|w| w.compiled);
        if !holds_list && matches!(self.verdict, Some(Ok(()))) && !self.list.is_empty() {
            self.compile_list(Some(deadline)).map_err(|e| {
                let text = format!("recompiling the list in a new worker failed: {e}");
                self.failed(|| text.clone());
                text
            })?;
        }
        Ok(())
    }

    /// Forgets a worker that died since it was last used (an outside signal, the OOM killer),
    /// so the next use starts a fresh one instead of losing a text to it.
    fn reap_if_dead(&mut self) {
        if self.worker.as_mut().is_some_and(WorkerProcess::exited) {
            self.stats.deaths += 1;
            let status = self.worker.take().and_then(|mut w| w.kill());
            if let Some(page) = &self.page {
                let what = format!("the worker died between calls: {}", describe_end(status, page));
                self.failed(|| what);
            }
        }
    }

    fn page(&self) -> Result<&SharedPage, String> {
        self.page.as_ref().ok_or_else(|| "no progress page".to_string())
    }

    /// Compiles `self.list` in the worker (starting one if needed) within `compile`, and by
    /// `cap` when given (a round's deadline).
    fn compile_list(&mut self, cap: Option<Instant>) -> Result<(), PatternSetError> {
        if self.list.is_empty() {
            return Ok(());
        }
        if self.worker.is_none() {
            // The spawn gets its own budget (`compile` is for compiling).
            self.ensure_worker(after(self.limits.spawn)).map_err(PatternSetError::Worker)?;
        }
        let deadline = cap.map_or(after(self.limits.compile), |cap| cap.min(after(self.limits.compile)));
        let worker = self.worker.as_mut().expect("started above");
        self.stats.compiles += 1;
        let mut bytes = Vec::new();
        protocol::encode_request(&Request::Compile(self.list.iter().map(String::as_str).collect()), &mut bytes);
        let answer = worker.send(&bytes, deadline).and_then(|()| worker.recv(deadline));
        let pattern = |index: usize| self.list.get(index).cloned().unwrap_or_default();
        match answer {
            Ok(Response::Compiled { count }) if count as usize == self.list.len() => {
                worker.compiled = true;
                worker.skips.clear();
                Ok(())
            }
            Ok(Response::CompileFailed { index, failure, reason }) if (index as usize) < self.list.len() => {
                let index = index as usize;
                Err(match failure {
                    CompileFailure::Invalid => PatternSetError::Invalid { index, pattern: pattern(index), reason },
                    CompileFailure::Nul => PatternSetError::Nul { index, pattern: pattern(index) },
                    CompileFailure::OutOfMemory => PatternSetError::TooCostly {
                        index,
                        pattern: pattern(index),
                        why: CostReason::CompileMemory { limit: self.limits.memory_bytes },
                    },
                })
            }
            Ok(other) => Err(self.bury_for_error(format!("it answered {other:?} to Compile"))),
            Err(fault) => {
                let timed_out = matches!(fault, Fault::Timeout);
                let status = self.worker.take().and_then(|mut w| w.kill());
                let page = self.page.as_ref().expect("a worker has a page");
                let (state, _, at) = page.last_noted();
                let detail = describe_end(status, page);
                if timed_out {
                    self.stats.kills += 1;
                } else {
                    self.stats.deaths += 1;
                }
                let blamed = (state == STATE_COMPILING && (at as usize) < self.list.len()).then_some(at as usize);
                match blamed {
                    // A sandbox violation is our bug, not the pattern's.
                    Some(index) if page.blocked_syscall().is_none() => Err(PatternSetError::TooCostly {
                        index,
                        pattern: pattern(index),
                        why: if timed_out {
                            CostReason::CompileTime { limit: self.limits.compile }
                        } else {
                            CostReason::CompileCrash { detail }
                        },
                    }),
                    _ => {
                        self.failed(|| format!("compiling: {fault}: {detail}"));
                        Err(PatternSetError::Worker(format!("the worker failed while compiling: {detail}")))
                    }
                }
            }
        }
    }

    /// Kills the worker after a protocol violation; the error to return.
    fn bury_for_error(&mut self, what: String) -> PatternSetError {
        if let Some(mut w) = self.worker.take() {
            w.kill();
        }
        self.stats.kills += 1;
        self.failed(|| what.clone());
        PatternSetError::Worker(what)
    }

    /// Replaces a worker that used half its CPU backstop, so RLIMIT_CPU never fires mid-text
    /// after hours of legitimate matching. The replacement starts (and compiles) first and the
    /// old one is killed only then: if no process can be started now (an exhausted pid space),
    /// the old one keeps serving rather than leaving the matcher without a worker.
    fn retire_if_worn(&mut self) {
        let half = std::time::Duration::from_secs(self.limits.cpu_seconds / 2);
        let worn = self.worker.as_ref().is_some_and(|w| w.cpu_time().is_some_and(|used| used >= half));
        if !worn {
            return;
        }
        let old = self.worker.take();
        let page = self.page.take();
        match self.ensure_worker(after(self.limits.spawn)) {
            Ok(()) => {
                drop(old); // kills and reaps it
                drop(page);
            }
            Err(_) => {
                if let Some(mut new) = self.worker.take() {
                    new.kill();
                }
                self.worker = old;
                self.page = page;
            }
        }
    }
}
