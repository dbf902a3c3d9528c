//! Recording effects: what replay tests (and anyone driving the daemon without a kernel or
//! root) plug into [`super::Effects`]. Each keeps what the daemon did, shared through `Arc`s
//! so the test can read it while or after the daemon runs.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use super::effects::{
    Classifier, Clock, CpuSampler, Effects, LogSink, MetricsSink, MirrorSink, ProcessReader, Signaller, StateStore,
    StatusSink,
};
use crate::{
    budget::{Budget, Fill},
    domain::{Outcome, State},
    event::ProcState,
    log::Line,
    mirror::{Heartbeat, StreamEvent},
    pattern::{check_static, Limits, MatchOutcome, Pattern, PatternSetError, Progress, Resume},
    procfs::CmdRead,
    safefs::SafeFsError,
    state::StateError,
    status::Status,
};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Every line, in order.
#[derive(Clone, Default)]
pub struct RecordingLog(pub Arc<Mutex<Vec<Line>>>);

impl RecordingLog {
    /// The rendered bodies (`EVENT k=v …`), in order.
    pub fn bodies(&self) -> Vec<String> {
        lock(&self.0).iter().map(Line::body).collect()
    }
}

impl LogSink for RecordingLog {
    fn write(&self, line: &Line) {
        lock(&self.0).push(line.clone());
    }
}

/// State files in memory; `unwritable` paths refuse writes as a read-only file system would.
#[derive(Clone, Default)]
pub struct RecordingState {
    pub files: Arc<Mutex<BTreeMap<PathBuf, State>>>,
    pub unwritable: Arc<Mutex<HashSet<PathBuf>>>,
    pub writes: Arc<Mutex<u64>>,
}

impl StateStore for RecordingState {
    fn load(&mut self, path: &Path) -> Result<State, StateError> {
        Ok(lock(&self.files).get(path).cloned().unwrap_or_default())
    }

    fn save(&mut self, path: &Path, _user: &str, state: &State) -> Result<(), StateError> {
        if lock(&self.unwritable).contains(path) {
            let source = std::io::Error::from_raw_os_error(libc::EROFS);
            return Err(StateError::Write(SafeFsError::Io { path: path.into(), source }));
        }
        *lock(&self.writes) += 1;
        lock(&self.files).insert(path.into(), state.clone());
        Ok(())
    }
}

/// Every metrics text written.
#[derive(Clone, Default)]
pub struct RecordingMetrics(pub Arc<Mutex<Vec<String>>>);

impl MetricsSink for RecordingMetrics {
    fn write(&mut self, text: &str) {
        lock(&self.0).push(text.into());
    }
}

/// Every status written.
#[derive(Clone, Default)]
pub struct RecordingStatus(pub Arc<Mutex<Vec<Status>>>);

impl StatusSink for RecordingStatus {
    fn write(&mut self, _path: &Path, status: &Status) {
        lock(&self.0).push(status.clone());
    }
}

/// One `end_all` (false) or `verify_all` (true) call and its pids, in order.
pub type SignalCall = (bool, Vec<u32>);

/// Signals recorded instead of sent. A target is ended unless its pid is in `survivors`
/// (SIGTERM delivered, then it changed identity) or `vanished` (gone before the signal).
#[derive(Clone, Default)]
pub struct RecordingSignals {
    /// Each `end_all`/`verify_all` call: (dry run, the pids in order).
    pub calls: Arc<Mutex<Vec<SignalCall>>>,
    pub survivors: Arc<Mutex<HashSet<u32>>>,
    pub vanished: Arc<Mutex<HashSet<u32>>>,
    /// Each `term_all` call's pids (a session's leftovers), in order.
    pub terms: Arc<Mutex<Vec<Vec<u32>>>>,
    /// Each `kill_all` call's pids, in order.
    pub kills: Arc<Mutex<Vec<Vec<u32>>>>,
}

impl RecordingSignals {
    fn outcome(&self, pid: u32, dry: bool) -> Outcome {
        if lock(&self.vanished).contains(&pid) {
            Outcome::Refused(crate::domain::Refusal::IdentityChanged)
        } else if dry {
            Outcome::Verified
        } else if lock(&self.survivors).contains(&pid) {
            Outcome::Survived
        } else {
            Outcome::Ended { needed_sigkill: false }
        }
    }

    fn record(&mut self, targets: &[ProcState], dry: bool) -> Vec<Outcome> {
        lock(&self.calls).push((dry, targets.iter().map(|t| t.id.pid).collect()));
        targets.iter().map(|t| self.outcome(t.id.pid, dry)).collect()
    }
}

impl Signaller for RecordingSignals {
    fn end_all(&mut self, targets: &[ProcState]) -> Vec<Outcome> {
        self.record(targets, false)
    }

    fn verify_all(&mut self, targets: &[ProcState]) -> Vec<Outcome> {
        self.record(targets, true)
    }

    fn term_all(&mut self, targets: &[ProcState]) -> Vec<Outcome> {
        lock(&self.terms).push(targets.iter().map(|t| t.id.pid).collect());
        let gone = lock(&self.vanished);
        targets
            .iter()
            .map(|t| {
                if gone.contains(&t.id.pid) {
                    Outcome::Refused(crate::domain::Refusal::IdentityChanged)
                } else {
                    Outcome::Termed
                }
            })
            .collect()
    }

    fn kill_all(&mut self, targets: &[ProcState]) -> Vec<Outcome> {
        lock(&self.kills).push(targets.iter().map(|t| t.id.pid).collect());
        targets.iter().map(|t| self.outcome(t.id.pid, false)).collect()
    }
}

/// Command lines by pid; a pid without one is gone.
#[derive(Clone, Default)]
pub struct FakeProcs(pub Arc<Mutex<HashMap<u32, Vec<u8>>>>);

/// The boot time replays run with (unix seconds): the base of [`Recorder::effects`]' clock in
/// the replay tests, so a process started at tick `t` is `now - base - t/100` seconds old.
pub const REPLAY_BOOT_UNIX: f64 = 1_800_000_000.0;

impl ProcessReader for FakeProcs {
    fn cmdline(&mut self, pid: u32, max: usize, budget: &mut Budget, buf: &mut Vec<u8>) -> CmdRead {
        let texts = lock(&self.0);
        let Some(text) = texts.get(&pid) else { return CmdRead::Gone };
        match budget.fill(&mut text.as_slice(), max.saturating_add(1), buf) {
            Ok(Fill::Stopped(stop)) => CmdRead::Stopped(stop),
            _ => CmdRead::Text,
        }
    }

    fn exists(&mut self, pid: u32) -> bool {
        lock(&self.0).contains_key(&pid)
    }

    fn boot_unix(&mut self) -> f64 {
        REPLAY_BOOT_UNIX
    }
}

/// `excludeCommands` matched in this process with glibc (no sandbox): replays use benign
/// patterns, and the sandbox has its own tests (guard-user/tests/matcher*.rs).
#[derive(Default)]
pub struct InProcessClassifier {
    source: Vec<String>,
    compiled: Vec<Pattern>,
    /// Texts classified so far (the matching work a replay can count).
    pub classified: Arc<Mutex<u64>>,
}

impl Classifier for InProcessClassifier {
    fn set_patterns(&mut self, patterns: &[String]) -> Result<(), PatternSetError> {
        if self.source == patterns && self.compiled.len() == patterns.len() {
            return Ok(());
        }
        check_static(patterns, &Limits::default())?;
        self.compiled = patterns
            .iter()
            .enumerate()
            .map(|(index, p)| {
                Pattern::new(p).map_err(|e| PatternSetError::Invalid {
                    index,
                    pattern: p.clone(),
                    reason: e.to_string(),
                })
            })
            .collect::<Result<_, _>>()?;
        self.source = patterns.to_vec();
        Ok(())
    }

    fn classify_from(&mut self, texts: &[&[u8]], from: &[Resume], _deadline: std::time::Instant) -> Vec<Progress> {
        *lock(&self.classified) += texts.len() as u64;
        texts
            .iter()
            .zip(from)
            .map(|(t, at)| {
                let first = self.compiled.iter().skip(at.start as usize).position(|p| p.is_match(t));
                Progress::Settled(match first {
                    Some(i) => MatchOutcome::Matched(at.start as usize + i),
                    None if at.failures > 0 => MatchOutcome::Budget,
                    None => MatchOutcome::NoMatch,
                })
            })
            .collect()
    }

    fn max_text_bytes(&self) -> usize {
        Limits::default().max_text_bytes
    }
}

/// CPU times by pid (ns), set by the test; every pid in it is a live process of the account
/// named `name`.
#[derive(Clone, Default)]
pub struct FakeCpu(pub Arc<Mutex<BTreeMap<u32, (crate::comm::Comm, u64)>>>);

impl CpuSampler for FakeCpu {
    fn sample(&mut self, euid: u32) -> std::io::Result<Vec<(ProcState, u64)>> {
        Ok(lock(&self.0)
            .iter()
            .map(|(&pid, &(comm, ns))| (ProcState { id: crate::event::ProcId { pid, start_ticks: 1 }, euid, comm }, ns))
            .collect())
    }
}

/// Heartbeats and stream events.
#[derive(Clone, Default)]
pub struct RecordingMirror {
    pub heartbeats: Arc<Mutex<Vec<Heartbeat>>>,
    pub events: Arc<Mutex<Vec<StreamEvent>>>,
}

impl MirrorSink for RecordingMirror {
    fn heartbeat(&self, hb: Heartbeat, _ttl: Duration) {
        lock(&self.heartbeats).push(hb);
    }

    fn event(&self, ev: StreamEvent) {
        lock(&self.events).push(ev);
    }
}

/// Time that follows tokio's clock: with a paused runtime (`tokio::time::pause`), a replay of a
/// day takes milliseconds and is deterministic. The monotonic clock is the seconds since the
/// start; unix time is `base_unix` plus those, plus `wall_step`, which a test sets to step the
/// wall clock as NTP or `date` would.
pub struct TokioClock {
    pub base_unix: f64,
    pub start: tokio::time::Instant,
    /// Seconds added to the wall clock (shared with the test).
    pub wall_step: Arc<Mutex<f64>>,
}

impl TokioClock {
    pub fn new(base_unix: f64) -> TokioClock {
        TokioClock { base_unix, start: tokio::time::Instant::now(), wall_step: Arc::default() }
    }
}

impl Clock for TokioClock {
    fn now_unix(&self) -> f64 {
        self.base_unix + self.start.elapsed().as_secs_f64() + *lock(&self.wall_step)
    }

    fn now_mono(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
}

/// A full set of recording effects and the handles to read them.
#[derive(Clone, Default)]
pub struct Recorder {
    pub log: RecordingLog,
    pub state: RecordingState,
    pub status: RecordingStatus,
    pub signals: RecordingSignals,
    pub procs: FakeProcs,
    pub mirror: RecordingMirror,
    pub metrics: RecordingMetrics,
    pub cpu: FakeCpu,
    /// Seconds the replay's wall clock is stepped by (see [`TokioClock`]).
    pub wall_step: Arc<Mutex<f64>>,
    /// Texts the classifier was asked about, over the whole run.
    pub classified: Arc<Mutex<u64>>,
}

impl Recorder {
    /// Effects that record into `self`, with unix time following tokio's clock from `base_unix`.
    pub fn effects(&self, base_unix: f64) -> Effects {
        Effects {
            log: Arc::new(self.log.clone()),
            state: Box::new(self.state.clone()),
            status: Box::new(self.status.clone()),
            signals: Box::new(self.signals.clone()),
            procs: Box::new(self.procs.clone()),
            classifier: Box::new(InProcessClassifier { classified: self.classified.clone(), ..Default::default() }),
            roots: Box::new(InProcessClassifier::default()),
            cpu: Box::new(self.cpu.clone()),
            mirror: Arc::new(self.mirror.clone()),
            clock: Arc::new(TokioClock { wall_step: self.wall_step.clone(), ..TokioClock::new(base_unix) }),
            metrics: Some(Box::new(self.metrics.clone())),
        }
    }
}

/// sd_notify messages, in order (`READY=1`, `WATCHDOG=1`, `STATUS=…`, …).
#[derive(Clone, Default)]
pub struct RecordingNotifier {
    pub sent: Arc<Mutex<Vec<String>>>,
    /// Ping period to report as the watchdog's, if any.
    pub watchdog: Option<Duration>,
}

impl super::Notifier for RecordingNotifier {
    fn ready(&mut self) {
        lock(&self.sent).push("READY=1".into());
    }
    fn reloading(&mut self) {
        lock(&self.sent).push("RELOADING=1".into());
    }
    fn stopping(&mut self) {
        lock(&self.sent).push("STOPPING=1".into());
    }
    fn watchdog(&mut self) {
        lock(&self.sent).push("WATCHDOG=1".into());
    }
    fn status(&mut self, text: &str) {
        lock(&self.sent).push(format!("STATUS={text}"));
    }
    fn watchdog_period(&self) -> Option<Duration> {
        self.watchdog
    }
}
