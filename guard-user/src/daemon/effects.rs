//! The tick's effects behind small traits, so the daemon runs unchanged against the real world
//! (files in the account's home, pidfd signals, /proc, the Redis mirror) or against recordings
//! ([`super::recording`]) in unprivileged replay tests.
use std::{
    path::Path,
    sync::Arc,
    time::{Duration, SystemTime},
};

use crate::{
    account::Account,
    budget::Budget,
    domain::{Outcome, State},
    enforcer::Enforcer,
    event::ProcState,
    log::Line,
    log::Logger,
    mirror::{Heartbeat, Mirror, StreamEvent},
    pattern::{Limits, Matcher, PatternSetError, Progress, Resume},
    procfs::{self, CmdRead},
    safefs::{atomic_replace, FsIdentity},
    state::{self, StateError},
    status::Status,
};

/// The daemon's log (docs/log.md).
pub trait LogSink: Send + Sync {
    fn write(&self, line: &Line);
    /// SIGHUP: reopen (logrotate moved the file away).
    fn reopen(&self) {}
    /// The config's `logMaxSizeMB`, in bytes.
    fn set_max_bytes(&self, _bytes: u64) {}
}

/// The state file: the flag clocks' persistence.
pub trait StateStore: Send {
    fn load(&mut self, path: &Path) -> Result<State, StateError>;
    fn save(&mut self, path: &Path, user: &str, state: &State) -> Result<(), StateError>;
}

/// The status file `guard-user status` and `check` read.
pub trait StatusSink: Send {
    /// Replaces the status file at `path` (see [`status::path_beside`]).
    fn write(&mut self, path: &Path, status: &Status);
}

/// Ending processes (docs/architecture.md step 5).
pub trait Signaller: Send {
    /// SIGTERM to all, one grace period, SIGKILL to the survivors that are still themselves.
    fn end_all(&mut self, targets: &[ProcState]) -> Vec<Outcome>;
    /// Dry run: verify identities, send nothing.
    fn verify_all(&mut self, targets: &[ProcState]) -> Vec<Outcome>;
    /// A session's leftovers: SIGTERM to those still themselves, no wait.
    fn term_all(&mut self, targets: &[ProcState]) -> Vec<Outcome>;
    /// A session's leftovers, 10 s later: SIGKILL to those still themselves.
    fn kill_all(&mut self, targets: &[ProcState]) -> Vec<Outcome>;

    /// What a plan says to send (`crate::policy::Signal`), nothing when there is no target.
    fn send(&mut self, signal: crate::policy::Signal, targets: &[ProcState]) -> Vec<Outcome> {
        use crate::policy::Signal;
        if targets.is_empty() {
            return Vec::new();
        }
        match signal {
            Signal::End => self.end_all(targets),
            Signal::Term => self.term_all(targets),
            Signal::Kill => self.kill_all(targets),
            Signal::Verify => self.verify_all(targets),
        }
    }
}

/// The Prometheus text file (`--metrics-file`, docs/metrics.md).
pub trait MetricsSink: Send {
    fn write(&mut self, text: &str);
}

/// Reading the machine beyond the table: a live process's command line, the machine's count.
pub trait ProcessReader: Send {
    /// docs/configuration.md's command line into `buf`, read up to `max` bytes (a longer one
    /// comes back longer than `max`, cut) through `budget` ([`procfs::read_cmdline`]).
    fn cmdline(&mut self, pid: u32, max: usize, budget: &mut Budget, buf: &mut Vec<u8>) -> CmdRead;
    /// Whether the process is still there, without reading its command line (what a verdict
    /// that needs no command line asks).
    fn exists(&mut self, pid: u32) -> bool;
    /// Every process of the machine as `ps -e` counts them (`crate::machine`); `None` when
    /// unknown (replays).
    fn machine_processes(&mut self) -> Option<u64> {
        None
    }
    /// When the machine booted (unix seconds): a process's age is counted from its start time
    /// (clock ticks since boot).
    fn boot_unix(&mut self) -> f64;
}

/// `excludeCommands` matching (docs/configuration.md, docs/architecture.md): compiled once per change of the list, each match
/// bounded in time, memory and stack.
pub trait Classifier: Send {
    /// Compiles `patterns` unless they are the list already compiled.
    fn set_patterns(&mut self, patterns: &[String]) -> Result<(), PatternSetError>;
    /// One round by `deadline`: for each text, from where `from` says it stands, its settled
    /// verdict (the first matching pattern, `NoMatch`, or `Budget`) or, when the round could not
    /// finish it, where it stands now (protect it meanwhile). See [`crate::pattern::Round::classify_from`].
    fn classify_from(&mut self, texts: &[&[u8]], from: &[Resume], deadline: std::time::Instant) -> Vec<Progress>;
    /// Longer texts are `Budget` without being read whole.
    fn max_text_bytes(&self) -> usize;
}

impl Classifier for Matcher {
    fn set_patterns(&mut self, patterns: &[String]) -> Result<(), PatternSetError> {
        Matcher::set_patterns(self, patterns)
    }

    fn classify_from(&mut self, texts: &[&[u8]], from: &[Resume], deadline: std::time::Instant) -> Vec<Progress> {
        self.round(deadline).classify_from(texts, from)
    }

    fn max_text_bytes(&self) -> usize {
        self.limits().max_text_bytes
    }
}

/// The sandboxed matcher of this binary (`guard-user __pattern-worker`, see [`crate::pattern`]).
pub fn sandboxed_matcher() -> Matcher {
    Matcher::new(std::path::PathBuf::from("/proc/self/exe"), Limits::default())
}

/// The stall watch's sample (docs/configuration.md): the account's live processes with their group CPU time.
pub trait CpuSampler: Send {
    fn sample(&mut self, euid: u32) -> std::io::Result<Vec<(ProcState, u64)>>;
    /// The stall watch is off: stop whatever costs anything between samples.
    fn pause(&mut self) {}
}

/// One /proc pass per sample (the fallback; see [`procfs::cpu_sample`]).
pub struct ProcfsCpu;

impl CpuSampler for ProcfsCpu {
    fn sample(&mut self, euid: u32) -> std::io::Result<Vec<(ProcState, u64)>> {
        procfs::cpu_sample(euid)
    }
}

/// One pass of the BPF task iterator per sample: the account's processes with their group CPU
/// time (see `ebpf::task_iter`).
pub struct IterCpu(pub crate::ebpf::task_iter::TaskIter);

impl CpuSampler for IterCpu {
    fn sample(&mut self, euid: u32) -> std::io::Result<Vec<(ProcState, u64)>> {
        Ok(self.0.cpu_sample(euid)?.into_iter().map(|s| (s.state, s.cpu_ns)).collect())
    }
}

/// The scheduler's accounting through BPF (see `ebpf::cpu_runtime`): only the processes that
/// ran since the previous sample, so idle ones cost nothing.
pub struct RuntimeCpu(pub crate::ebpf::cpu_runtime::RuntimeCpu);

impl CpuSampler for RuntimeCpu {
    fn sample(&mut self, euid: u32) -> std::io::Result<Vec<(ProcState, u64)>> {
        self.0.sample(euid)
    }

    fn pause(&mut self) {
        self.0.pause()
    }
}

/// The swarm Redis mirror (docs/operations.md): fire-and-forget.
pub trait MirrorSink: Send + Sync {
    fn heartbeat(&self, hb: Heartbeat, ttl: Duration);
    fn event(&self, ev: StreamEvent);
    /// Stream events dropped so far (a full queue, a refusing server).
    fn dropped(&self) -> u64 {
        0
    }
}

/// "Now", in one place; replays inject theirs. Two clocks (see `policy::time`): elapsed time is
/// measured on the monotonic one, so a step of the wall clock never moves an enforcement.
pub trait Clock: Send + Sync {
    /// Unix time: the state file's times, what status shows, log and stream timestamps.
    fn now_unix(&self) -> f64;
    /// Seconds on a clock no one can set (any origin): flag clocks, deadlines, windows.
    fn now_mono(&self) -> f64;
    /// Both, read together.
    fn now(&self) -> crate::policy::Now {
        crate::policy::Now { wall: self.now_unix(), mono: self.now_mono() }
    }
}

/// Everything the tick does to the world.
pub struct Effects {
    pub log: Arc<dyn LogSink>,
    pub state: Box<dyn StateStore>,
    pub status: Box<dyn StatusSink>,
    pub signals: Box<dyn Signaller>,
    pub procs: Box<dyn ProcessReader>,
    pub classifier: Box<dyn Classifier>,
    /// `sessions.roots`, in a matcher of their own (each matcher holds one compiled list).
    pub roots: Box<dyn Classifier>,
    pub cpu: Box<dyn CpuSampler>,
    pub mirror: Arc<dyn MirrorSink>,
    pub clock: Arc<dyn Clock>,
    /// Only with `--metrics-file`.
    pub metrics: Option<Box<dyn MetricsSink>>,
}

impl Effects {
    /// Logs `line`, and streams it when docs/operations.md says so (`now`: unix time).
    pub fn emit(&self, line: &Line, now: f64) {
        self.log.write(line);
        if let Some(ev) = StreamEvent::of(line, now) {
            self.mirror.event(ev);
        }
    }
}

impl LogSink for Logger {
    fn write(&self, line: &Line) {
        Logger::write(self, line);
    }

    fn set_max_bytes(&self, bytes: u64) {
        Logger::set_max_bytes(self, bytes)
    }
}

/// The state file in the account's home, read and written as the account.
pub struct StateFile {
    pub who: FsIdentity,
}

impl StateStore for StateFile {
    /// A file over a bound is moved aside to `<path>.rejected` here (the error is the tick's
    /// `ERROR state_rejected` line); one that cannot be moved is replaced by the next save.
    fn load(&mut self, path: &Path) -> Result<State, StateError> {
        let loaded = state::load_state(path, self.who);
        if let Err(StateError::Rejected { .. }) = &loaded {
            match state::set_aside(path, self.who) {
                Ok(to) => tracing::warn!("the rejected state file was moved to {}", to.display()),
                Err(e) => tracing::warn!("the rejected state file could not be moved aside: {e}"),
            }
        }
        loaded
    }

    fn save(&mut self, path: &Path, user: &str, st: &State) -> Result<(), StateError> {
        state::save_state(path, user, st, self.who)
    }
}

/// The status file, written atomically as the account; a root daemon also keeps its own copy
/// where the account cannot write (`status::read_trusted`).
pub struct StatusFile {
    pub who: FsIdentity,
    /// The copy beside the instance lock (root only; see `instance::trusted_status`).
    pub copy: Option<std::path::PathBuf>,
}

impl StatusSink for StatusFile {
    fn write(&mut self, path: &Path, status: &Status) {
        let mut bytes = serde_json::to_vec_pretty(status).expect("a status serializes");
        bytes.push(b'\n');
        if let Err(e) = atomic_replace(path, &bytes, self.who) {
            tracing::warn!("cannot write the status file: {e}");
        }
        if let Some(copy) = &self.copy {
            if let Err(e) = atomic_replace(copy, &bytes, FsIdentity { uid: 0, gid: 0 }) {
                tracing::warn!("cannot write the status copy: {e}");
            }
        }
    }
}

impl Signaller for Enforcer {
    fn end_all(&mut self, targets: &[ProcState]) -> Vec<Outcome> {
        Enforcer::end_all(self, targets)
    }

    fn verify_all(&mut self, targets: &[ProcState]) -> Vec<Outcome> {
        Enforcer::verify_all(self, targets)
    }

    fn term_all(&mut self, targets: &[ProcState]) -> Vec<Outcome> {
        Enforcer::term_all(self, targets)
    }

    fn kill_all(&mut self, targets: &[ProcState]) -> Vec<Outcome> {
        Enforcer::kill_all(self, targets)
    }
}

/// The metrics file: a path root was given on its command line, replaced atomically (temp file,
/// rename) as node_exporter's textfile collector expects, mode 0644.
pub struct MetricsFile {
    pub path: std::path::PathBuf,
}

impl MetricsSink for MetricsFile {
    fn write(&mut self, text: &str) {
        let root = FsIdentity { uid: 0, gid: 0 };
        if let Err(e) = atomic_replace(&self.path, text.as_bytes(), root) {
            tracing::warn!("cannot write the metrics file: {e}");
        }
    }
}

/// /proc of the machine.
#[derive(Default)]
pub struct Procfs {
    machine: crate::machine::MachineCount,
}

impl ProcessReader for Procfs {
    fn cmdline(&mut self, pid: u32, max: usize, budget: &mut Budget, buf: &mut Vec<u8>) -> CmdRead {
        procfs::read_cmdline(pid, max, budget, buf)
    }

    fn exists(&mut self, pid: u32) -> bool {
        procfs::exists(pid)
    }

    fn machine_processes(&mut self) -> Option<u64> {
        self.machine.read()
    }

    fn boot_unix(&mut self) -> f64 {
        procfs::boot_unix()
    }
}

impl MirrorSink for Mirror {
    fn heartbeat(&self, hb: Heartbeat, ttl: Duration) {
        Mirror::heartbeat(self, hb, ttl)
    }

    fn event(&self, ev: StreamEvent) {
        Mirror::event(self, ev)
    }

    fn dropped(&self) -> u64 {
        Mirror::dropped(self)
    }
}

/// The system's clocks: the wall clock, and `CLOCK_BOOTTIME` as the monotonic one. BOOTTIME
/// rather than MONOTONIC: it keeps counting through a suspend, so "flagged for an hour" means an
/// hour of real time, as it did on the wall clock, while no one can step it.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_unix(&self) -> f64 {
        SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
    }

    fn now_mono(&self) -> f64 {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes one timespec we own.
        unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
    }
}

/// The real effects for `account`, logging to `log`.
pub fn real(account: &Account, log: Logger, mirror: Mirror, metrics_file: Option<std::path::PathBuf>) -> Effects {
    let who = FsIdentity { uid: account.uid, gid: account.gid };
    Effects {
        log: Arc::new(log),
        state: Box::new(StateFile { who }),
        status: Box::new(StatusFile { who, copy: None }),
        signals: Box::new(Enforcer::new(account.uid, std::process::id(), Duration::from_millis(500))),
        procs: Box::new(Procfs::default()),
        classifier: Box::new(sandboxed_matcher()),
        // Its worker starts only once a list of roots is set.
        roots: Box::new(Matcher::new(std::path::PathBuf::from("/proc/self/exe"), Limits::roots())),
        cpu: Box::new(ProcfsCpu),
        mirror: Arc::new(mirror),
        clock: Arc::new(SystemClock),
        metrics: metrics_file.map(|path| Box::new(MetricsFile { path }) as Box<dyn MetricsSink>),
    }
}
