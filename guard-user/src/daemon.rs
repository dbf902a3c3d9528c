//! The daemon: the event pump (ebpf backend) and the tick (SPEC §4), wired together.
//!
//! Two tasks share the [`ProcessTable`]: the pump drains the ring buffer and applies events,
//! rebuilding from /proc at start-up, after any lost event and when the periodic audit finds
//! drift; the tick loop runs the policy every interval (and at the earliest enforcement
//! deadline). All file and /proc work of a tick runs on a blocking thread, so neither task
//! stalls the other.
//!
//! # Rebuild
//! A rebuild scans /proc on a blocking thread while the pump keeps applying events *and*
//! recording them. When the scan ends, the recorded events are replayed over the snapshot in
//! order; because every event carries a full process state keyed by pid + start time (see
//! [`crate::table`]), the result is exact: nothing born during the scan is missed or counted
//! twice.
use std::{
    collections::BTreeSet,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, SystemTime},
};

use tokio::{sync::watch, task::JoinHandle};

use crate::{
    account::Account,
    config::{self, ConfigError},
    ebpf::{EbpfOptions, EbpfSource},
    enforcer::{Enforcer, Outcome},
    event::{Event, ProcState},
    log::Logger,
    policy::{self, classify, hours_one_decimal, minutes_ago, FlagClocks, ProcessVerdict},
    procfs,
    redis_mirror::{Endpoint, Heartbeat, Mirror, StreamEvent},
    safefs::{atomic_write, FsIdentity},
    state::{self, StateError},
    status::{self, NameStatus, Status},
    table::ProcessTable,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Auto,
    Ebpf,
    Procfs,
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Backend::Auto),
            "ebpf" => Ok(Backend::Ebpf),
            "procfs" => Ok(Backend::Procfs),
            other => Err(format!("--backend {other}: expected auto, ebpf or procfs")),
        }
    }
}

#[derive(Clone, Debug)]
pub struct DaemonOptions {
    pub account: Account,
    /// Where default files live (the account's home, or `--home`).
    pub home: PathBuf,
    pub config_path: PathBuf,
    pub dry_run: bool,
    pub interval: Duration,
    pub backend: Backend,
    pub audit_interval: Duration,
    pub ring_bytes: Option<u32>,
    /// Arm a timer for the earliest enforcement deadline (enforce at the timeout, not up to an
    /// interval later).
    pub deadline_timer: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot load the BPF programs ({reason}): {detail}")]
    Ebpf { reason: &'static str, detail: String },
    #[error("cannot read /proc: {0}")]
    Proc(std::io::Error),
}

/// Counters shared by the pump, the tick and the status file.
#[derive(Default)]
struct Counters {
    events: AtomicU64,
    lost: AtomicU64,
    resyncs: AtomicU64,
    kills: AtomicU64,
}

struct Shared {
    table: Mutex<ProcessTable>,
    counters: Counters,
    /// Set once the start-up rebuild finished: no tick runs on a half-built table (it would
    /// see names below the threshold and drop their flag clocks).
    ready: AtomicBool,
    /// The tick's request to empty the ring before it reads the table.
    drain: Drain,
}

/// A tick asks the pump to drain the ring and waits (bounded) until a drain that began after
/// its request has finished: the kernel batches wake-ups (see [`crate::ebpf::DRAIN_PERIOD`]),
/// so without this a tick could see a table up to one drain period old.
#[derive(Default)]
struct Drain {
    requested: tokio::sync::Notify,
    /// Requests made so far.
    seq: AtomicU64,
    /// The highest request a finished drain covered.
    done: Mutex<u64>,
    finished: std::sync::Condvar,
}

impl Drain {
    /// From the tick's (blocking) thread. False when the pump did not answer within `timeout`.
    fn sync(&self, timeout: Duration) -> bool {
        let want = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        self.requested.notify_one();
        let end = std::time::Instant::now() + timeout;
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        while *done < want {
            let left = end.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            done = self.finished.wait_timeout(done, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        true
    }

    /// From the pump, once the ring is empty: every request up to `seq` is answered.
    fn finish(&self, seq: u64) {
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        *done = (*done).max(seq);
        self.finished.notify_all();
    }
}

fn now_unix() -> f64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Whether this process holds the capabilities BPF loading and tp_btf attachment need
/// (`CapEff` in /proc/self/status): CAP_BPF (39) and CAP_PERFMON (38), or CAP_SYS_ADMIN (21).
fn may_load_bpf() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return true };
    let Some(hex) = status.lines().find_map(|l| l.strip_prefix("CapEff:")) else { return true };
    let Ok(caps) = u64::from_str_radix(hex.trim(), 16) else { return true };
    let has = |bit: u32| caps & (1u64 << bit) != 0;
    has(21) || (has(38) && has(39))
}

/// Runs until SIGTERM/SIGINT. Returns the `STOPPED` reason.
pub async fn run(opts: DaemonOptions) -> Result<&'static str, DaemonError> {
    crate::startup_phase("daemon::run (arguments parsed, runtime up)");
    let who = FsIdentity { uid: opts.account.uid, gid: opts.account.gid };
    let initial = config::load(&opts.config_path, &opts.home).ok();
    let log_bytes = initial.as_ref().map(|c| c.log_max_bytes).unwrap_or(10 << 20);
    let logger = Logger::new(opts.home.join("guard-daemon.log"), who, log_bytes, true);
    let self_pid = std::process::id();
    let shared = Arc::new(Shared {
        table: Mutex::new(ProcessTable::new(Some(self_pid))),
        counters: Counters::default(),
        ready: AtomicBool::new(false),
        drain: Drain::default(),
    });

    let loaded = match opts.backend {
        Backend::Procfs => None,
        Backend::Ebpf | Backend::Auto if !may_load_bpf() => Some(Err((
            "permission_denied",
            "loading BPF programs needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN): run guard-user as root".to_string(),
        ))),
        Backend::Ebpf | Backend::Auto => Some(
            EbpfSource::load(&EbpfOptions { ring_bytes: opts.ring_bytes }).map_err(|e| (e.reason(), e.to_string())),
        ),
    };
    let source = match loaded {
        None => None,
        Some(Ok(s)) => Some(s),
        Some(Err((reason, detail))) => match opts.backend {
            Backend::Auto => {
                eprintln!("guard-user: BPF unavailable, using the procfs backend: {detail}");
                logger.raw(&format!("WARN backend_fallback reason={reason}"));
                None
            }
            _ => {
                let err = DaemonError::Ebpf { reason, detail };
                logger.line("STOPPED", &[("reason", &"error")]);
                return Err(err);
            }
        },
    };
    // Parsing the kernel's BTF (twice: ours for offsets, aya's for tp_btf) leaves megabytes of
    // freed small allocations in the heap; give them back (measured: RSS 32 → see docs/BENCH.md).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap memory.
    unsafe {
        libc::malloc_trim(0);
    }
    if let Some(problem) = source.as_ref().and_then(|s| s.setuid_problem()) {
        eprintln!("guard-user: uid changes without exec are seen by the audit only: {problem}");
        logger.raw(&format!("WARN setuid_untracked reason={}", problem.reason()));
    }
    let backend = if source.is_some() { "ebpf" } else { "procfs" };
    logger.line(
        "STARTED",
        &[
            ("version", &crate::VERSION),
            ("backend", &backend),
            ("user", &opts.account.name),
            ("dry_run", &(opts.dry_run as u8)),
            ("pid", &self_pid),
        ],
    );

    let warn_log = logger.clone();
    let mirror = Mirror::spawn(
        Endpoint::resolve(|k| std::env::var(k).ok()),
        hostname(),
        opts.account.name.clone(),
        Arc::new(move |w: String| warn_log.raw(&format!("WARN {w}"))),
    );

    let (stop_tx, stop_rx) = watch::channel(false);
    let pump = match source {
        Some(src) => Some(tokio::spawn(pump(src, shared.clone(), logger.clone(), opts.audit_interval, stop_rx.clone()))),
        None => {
            shared.ready.store(true, Ordering::SeqCst);
            None
        }
    };

    let reason = tick_loop(&opts, backend, &shared, &logger, who, mirror, stop_rx.clone()).await;
    let _ = stop_tx.send(true);
    if let Some(p) = pump {
        let _ = p.await;
    }
    logger.line("STOPPED", &[("reason", &reason)]);
    Ok(reason)
}

async fn stop_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    let mut hup = signal(SignalKind::hangup()).expect("SIGHUP handler");
    tokio::select! {
        _ = term.recv() => "signal",
        _ = int.recv() => "signal",
        _ = hup.recv() => "signal",
    }
}

async fn tick_loop(
    opts: &DaemonOptions,
    backend: &'static str,
    shared: &Arc<Shared>,
    logger: &Logger,
    who: FsIdentity,
    mirror: Mirror,
    _stop: watch::Receiver<bool>,
) -> &'static str {
    let stop = stop_signal();
    tokio::pin!(stop);
    // Wait for the start-up table.
    while !shared.ready.load(Ordering::SeqCst) {
        tokio::select! {
            r = &mut stop => return r,
            _ = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
    }
    let mut ctx = TickContext {
        opts: opts.clone(),
        backend,
        shared: shared.clone(),
        logger: logger.clone(),
        who,
        started_at: now_unix(),
        ticks: 0,
        warned_keys: BTreeSet::new(),
        last_state_path: None,
        mirror,
    };
    let mut interval = tokio::time::interval(opts.interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        let deadline_sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = &mut stop => return r,
            _ = interval.tick() => {}
            _ = deadline_sleep => {}
        }
        let (returned, next) = {
            let handle = tokio::task::spawn_blocking(move || {
                let next = ctx.tick();
                (ctx, next)
            });
            match handle.await {
                Ok(v) => v,
                Err(e) => {
                    eprintln!("guard-user: tick failed: {e}");
                    return "error";
                }
            }
        };
        ctx = returned;
        deadline = next.filter(|_| opts.deadline_timer).map(|at| {
            let wait = (at - now_unix()).max(0.0);
            // A hair after the deadline, so the tick sees `elapsed >= timeout`.
            tokio::time::Instant::now() + Duration::from_secs_f64(wait) + Duration::from_millis(5)
        });
    }
}

struct TickContext {
    opts: DaemonOptions,
    backend: &'static str,
    shared: Arc<Shared>,
    logger: Logger,
    who: FsIdentity,
    started_at: f64,
    ticks: u64,
    /// Unknown config keys already warned about (once per key per run, not every tick).
    warned_keys: BTreeSet<String>,
    last_state_path: Option<PathBuf>,
    /// The swarm Redis mirror: fire-and-forget, never waited on.
    mirror: Mirror,
}

/// This host's name for the heartbeat key.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes.
    if unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) } != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

impl TickContext {
    fn stream(&self, event: &str, pid: Option<u32>, name: &crate::comm::Comm, reason: &str, count: Option<u32>, elapsed: Option<&str>) {
        self.mirror.event(StreamEvent {
            event: event.into(),
            pid,
            name: name.to_string(),
            reason: reason.into(),
            count: count.map(u64::from),
            elapsed: elapsed.map(str::to_string),
            ts: now_unix() as i64,
        });
    }

    /// One tick (SPEC §4). Blocking. Returns the next enforcement deadline (unix seconds).
    fn tick(&mut self) -> Option<f64> {
        self.ticks += 1;
        if self.ticks == 1 {
            crate::startup_phase("first tick");
        }
        let log = self.logger.clone();
        if self.backend == "ebpf" && !self.shared.drain.sync(Duration::from_millis(200)) {
            eprintln!("guard-user: the event pump did not drain the ring within 200 ms; this tick may miss the latest events");
        }
        if self.backend == "procfs" {
            match procfs::snapshot() {
                Ok(snap) => {
                    *self.shared.table.lock().unwrap() = ProcessTable::from_snapshot(snap, Some(std::process::id()));
                }
                Err(e) => eprintln!("guard-user: cannot read /proc: {e}"),
            }
        }
        let config = match config::load(&self.opts.config_path, &self.opts.home) {
            Ok(c) => c,
            Err(e) => {
                self.config_error(&e);
                return None;
            }
        };
        log.set_max_bytes(config.log_max_bytes);
        for key in &config.unknown_keys {
            if self.warned_keys.insert(key.clone()) {
                log.raw(&format!("WARN config_unknown_key key={key} path={}", self.opts.config_path.display()));
            }
        }
        let mut errors = 0u32;
        let clocks = match state::load(&config.state_file, self.who) {
            Ok(c) => c,
            Err(e) => {
                log.raw(&format!("ERROR {e}"));
                errors += 1;
                FlagClocks::new()
            }
        };
        let now = now_unix();
        let (counts, tracked) = {
            let t = self.shared.table.lock().unwrap();
            (t.counts_for(self.opts.account.uid), t.len())
        };
        let plan = policy::plan(&counts, &config, &clocks, now);
        if plan.clocks != clocks || self.last_state_path.as_ref() != Some(&config.state_file) {
            if let Err(e) = state::save(&config.state_file, &self.opts.account.name, &plan.clocks, self.who) {
                eprintln!("guard-user: {e}");
                if let StateError::Write(_) = e {
                    errors += 1;
                    log.raw(&format!("ERROR state_unwritable path={}", config.state_file.display()));
                }
            } else {
                self.last_state_path = Some(config.state_file.clone());
            }
        }
        let enforcer =
            Enforcer { account_uid: self.opts.account.uid, self_pid: std::process::id(), grace: Duration::from_millis(500) };
        let mut kills = 0u64;
        let mut name_status = Vec::new();
        for v in &plan.names {
            let elapsed = v.elapsed_secs(now);
            let ago = if v.newly_flagged { "now".to_string() } else { format!("{}m_ago", minutes_ago(elapsed)) };
            log.line("FLAGGED", &[("name", &v.name), ("count", &v.count), ("first_flagged", &ago)]);
            if v.newly_flagged {
                self.stream("FLAGGED", None, &v.name, "threshold", Some(v.count), None);
            }
            let procs = self.shared.table.lock().unwrap().processes_of(self.opts.account.uid, &v.name);
            let mut targets: Vec<ProcState> = Vec::new();
            let mut skip = 0u32;
            for p in procs {
                match procfs::cmdline(p.id.pid) {
                    None => {
                        if v.enforce {
                            log.line("SKIPPED", &[("pid", &p.id.pid), ("name", &v.name), ("reason", &"identity_changed")]);
                            self.stream("SKIPPED", Some(p.id.pid), &v.name, "identity_changed", None, None);
                        }
                    }
                    Some(cmd) => match classify(&cmd, &config) {
                        ProcessVerdict::Skip { .. } => {
                            skip += 1;
                            if v.enforce {
                                log.line("SKIPPED", &[("pid", &p.id.pid), ("name", &v.name), ("reason", &"excluded_command")]);
                                self.stream("SKIPPED", Some(p.id.pid), &v.name, "excluded_command", None, None);
                            }
                        }
                        ProcessVerdict::End => targets.push(p),
                    },
                }
            }
            let would_end = targets.len() as u32;
            if v.enforce {
                let hours = hours_one_decimal(elapsed);
                let hours = format!("{hours}h");
                let fields = |pid: &u32| -> Vec<(&str, String)> {
                    vec![
                        ("pid", pid.to_string()),
                        ("name", v.name.to_string()),
                        ("reason", "ghost_detected".into()),
                        ("count", v.count.to_string()),
                        ("elapsed", hours.clone()),
                    ]
                };
                let emit = |event: &str, pid: u32| {
                    let f = fields(&pid);
                    let refs: Vec<(&str, &dyn std::fmt::Display)> =
                        f.iter().map(|(k, v)| (*k, v as &dyn std::fmt::Display)).collect();
                    log.line(event, &refs);
                    self.stream(event, Some(pid), &v.name, "ghost_detected", Some(v.count), Some(&hours));
                };
                if self.opts.dry_run {
                    for t in &targets {
                        match enforcer.verify(t) {
                            Ok(()) => emit("DRY_RUN", t.id.pid),
                            Err(_) => {
                                log.line("SKIPPED", &[("pid", &t.id.pid), ("name", &v.name), ("reason", &"identity_changed")]);
                                self.stream("SKIPPED", Some(t.id.pid), &v.name, "identity_changed", None, None);
                            }
                        }
                    }
                } else {
                    for (t, outcome) in targets.iter().zip(enforcer.end_all(&targets)) {
                        match outcome {
                            Outcome::Ended { .. } => {
                                kills += 1;
                                emit("KILLED", t.id.pid);
                            }
                            Outcome::Refused(_) => {
                                log.line("SKIPPED", &[("pid", &t.id.pid), ("name", &v.name), ("reason", &"identity_changed")]);
                                self.stream("SKIPPED", Some(t.id.pid), &v.name, "identity_changed", None, None);
                            }
                        }
                    }
                }
            }
            name_status.push(NameStatus {
                name: v.name.to_string(),
                count: v.count,
                threshold: config.threshold,
                flagged_since: Some(v.first_flagged),
                time_left_secs: Some((v.deadline(&config) - now).max(0.0)),
                would_skip: Some(skip),
                would_end: Some(would_end),
            });
        }
        // Names at or over half the threshold that are not flagged, for `status`.
        let half = config.threshold.div_ceil(2);
        for (name, count) in &counts {
            if *count >= half && *count < config.threshold && !config.is_excluded(name) {
                name_status.push(NameStatus { name: name.to_string(), count: *count, threshold: config.threshold, ..Default::default() });
            }
        }
        name_status.sort_by(|a, b| b.count.cmp(&a.count).then(a.name.cmp(&b.name)));
        self.shared.counters.kills.fetch_add(kills, Ordering::Relaxed);
        log.line("TICK_COMPLETE", &[("flagged", &plan.names.len()), ("kills", &kills), ("errors", &errors)]);
        self.write_status(&config.state_file, name_status, tracked, None);
        if self.opts.deadline_timer {
            plan.next_deadline(&config)
        } else {
            None
        }
    }

    fn config_error(&mut self, e: &ConfigError) {
        let log = &self.logger;
        log.raw(&format!("ERROR {e}"));
        log.line("TICK_COMPLETE", &[("flagged", &0), ("kills", &0), ("errors", &1)]);
        let state_file =
            self.last_state_path.clone().unwrap_or_else(|| config::expand_tilde(config::DEFAULT_STATE_FILE, &self.opts.home));
        let tracked = self.shared.table.lock().unwrap().len();
        self.write_status(&state_file, Vec::new(), tracked, Some(e.to_string()));
    }

    fn write_status(&self, state_file: &std::path::Path, names: Vec<NameStatus>, tracked: usize, err: Option<String>) {
        let c = &self.shared.counters;
        let s = Status {
            version: crate::VERSION.into(),
            user: self.opts.account.name.clone(),
            uid: self.opts.account.uid,
            pid: std::process::id(),
            backend: self.backend.into(),
            dry_run: self.opts.dry_run,
            started_at: self.started_at,
            last_tick: now_unix(),
            interval_secs: self.opts.interval.as_secs_f64(),
            ticks: self.ticks,
            events: c.events.load(Ordering::Relaxed),
            lost_events: c.lost.load(Ordering::Relaxed),
            resyncs: c.resyncs.load(Ordering::Relaxed),
            kills: c.kills.load(Ordering::Relaxed),
            tracked_processes: tracked as u64,
            config_error: err,
            names,
        };
        self.mirror.heartbeat(
            Heartbeat {
                host: hostname(),
                user: s.user.clone(),
                home: self.opts.home.display().to_string(),
                pid: s.pid,
                version: s.version.clone(),
                backend: s.backend.clone(),
                dry_run: s.dry_run,
                last_tick: s.last_tick as u64,
                flagged: s.names.iter().filter(|n| n.flagged_since.is_some()).map(|n| n.name.clone()).collect(),
                kills: s.kills,
                lost_events: s.lost_events,
                resyncs: s.resyncs,
                interval_secs: self.opts.interval.as_secs().max(1),
            },
            self.opts.interval * 3,
        );
        let mut bytes = serde_json::to_vec_pretty(&s).unwrap();
        bytes.push(b'\n');
        if let Err(e) = atomic_write(&status::path_beside(state_file), &bytes, self.who) {
            eprintln!("guard-user: cannot write the status file: {e}");
        }
        if self.ticks == 1 {
            crate::startup_phase("first status written");
        }
    }
}

/// Why a rebuild runs; `RESYNC reason=…`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RebuildReason {
    Startup,
    LostEvents,
    Audit,
}

struct Rebuild {
    reason: RebuildReason,
    lost: u64,
    recorded: Vec<Event>,
    scan: JoinHandle<std::io::Result<Vec<ProcState>>>,
}

/// Recorded events beyond this during one scan: the scan restarts (memory stays bounded).
const MAX_RECORDED: usize = 1 << 20;

fn start_rebuild(reason: RebuildReason, lost: u64) -> Rebuild {
    Rebuild { reason, lost, recorded: Vec::new(), scan: tokio::task::spawn_blocking(procfs::snapshot) }
}

async fn pump(
    mut src: EbpfSource,
    shared: Arc<Shared>,
    logger: Logger,
    audit_every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let self_pid = Some(std::process::id());
    let mut rebuild = Some(start_rebuild(RebuildReason::Startup, 0));
    let mut pending_lost = 0u64;
    let mut last_lost = src.lost();
    let mut audit = tokio::time::interval_at(tokio::time::Instant::now() + audit_every, audit_every);
    let mut batch: Vec<Event> = Vec::with_capacity(4096);
    let mut raw: Vec<Result<Event, crate::event::DecodeError>> = Vec::with_capacity(4096);
    // A tick's drain request being served: the request number it covers.
    let mut drain_for: Option<u64> = None;
    loop {
        let scan_done = async {
            match rebuild.as_mut() {
                Some(r) => (&mut r.scan).await,
                None => std::future::pending().await,
            }
        };
        let now = drain_for.is_some();
        tokio::select! {
            _ = stop.changed() => return,
            () = shared.drain.requested.notified(), if !now => {
                drain_for = Some(shared.drain.seq.load(Ordering::SeqCst));
            }
            r = src.next_batch(&mut raw, 4096, now) => {
                let Ok(n) = r else { return };
                // A short batch emptied the ring: the tick waiting on it is answered once this
                // batch is in the table (at the end of this branch).
                let answered = if n < 4096 { drain_for.take() } else { None };
                batch.clear();
                for ev in raw.drain(..) {
                    match ev { Ok(e) => batch.push(e), Err(e) => eprintln!("guard-user: bad event record: {e}") }
                }
                if !batch.is_empty() {
                    let mut t = shared.table.lock().unwrap();
                    for e in &batch { t.apply(e); }
                    drop(t);
                    shared.counters.events.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    if let Some(r) = rebuild.as_mut() {
                        r.recorded.extend_from_slice(&batch);
                        if r.recorded.len() > MAX_RECORDED {
                            let (reason, lost) = (r.reason, r.lost);
                            r.scan.abort();
                            rebuild = Some(start_rebuild(reason, lost));
                        }
                    }
                }
                let lost = src.lost();
                if lost > last_lost {
                    let delta = lost - last_lost;
                    last_lost = lost;
                    shared.counters.lost.store(lost, Ordering::Relaxed);
                    match rebuild.as_mut() {
                        // A scan in progress has missed events too: run another one after it.
                        Some(_) => pending_lost += delta,
                        None => rebuild = Some(start_rebuild(RebuildReason::LostEvents, delta)),
                    }
                }
                if let Some(seq) = answered {
                    shared.drain.finish(seq);
                }
            }
            snap = scan_done => {
                let r = rebuild.take().unwrap();
                match snap {
                    Ok(Ok(procs)) => {
                        let mut fresh = ProcessTable::from_snapshot(procs, self_pid);
                        for e in &r.recorded { fresh.apply(e); }
                        let mut t = shared.table.lock().unwrap();
                        let log_it = match r.reason {
                            RebuildReason::Audit => t.difference(&fresh) > 0,
                            _ => true,
                        };
                        *t = fresh;
                        drop(t);
                        if matches!(r.reason, RebuildReason::Startup) {
                            crate::startup_phase("table consistent (/proc scan + replay)");
                        }
                        shared.ready.store(true, Ordering::SeqCst);
                        if log_it {
                            let reason = match r.reason { RebuildReason::Startup => "startup", RebuildReason::LostEvents => "lost_events", RebuildReason::Audit => "drift" };
                            shared.counters.resyncs.fetch_add(1, Ordering::Relaxed);
                            logger.line("RESYNC", &[("reason", &reason), ("lost", &r.lost)]);
                        }
                    }
                    Ok(Err(e)) => eprintln!("guard-user: /proc scan failed: {e}"),
                    Err(e) => eprintln!("guard-user: /proc scan task failed: {e}"),
                }
                if pending_lost > 0 {
                    rebuild = Some(start_rebuild(RebuildReason::LostEvents, pending_lost));
                    pending_lost = 0;
                } else if !shared.ready.load(Ordering::SeqCst) {
                    rebuild = Some(start_rebuild(RebuildReason::Startup, 0));
                }
            }
            _ = audit.tick() => {
                if rebuild.is_none() { rebuild = Some(start_rebuild(RebuildReason::Audit, 0)); }
            }
        }
    }
}
