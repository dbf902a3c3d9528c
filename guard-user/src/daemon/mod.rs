//! The daemon: an event pump that owns the live table, and a supervised tick loop that asks it
//! for drained snapshots (docs/architecture.md, docs/operations.md).
//!
//! # Layout
//! - [`source`]: where events come from ([`EventSource`]: the BPF ring, the `procfs` backend's
//!   nothing, a recorded trace).
//! - [`pump`]: the one owner of the [`crate::table::ProcessTable`]; answers snapshot requests.
//! - [`keeper`]: the pump's side of the session lineage (events, adoption, parent reads).
//! - [`sessions`]: the tick's side of sessions: classify roots, gather, apply the plan.
//! - [`rebuild`]: the pure bookkeeping of start-up, lost-event and audit rebuilds.
//! - [`tick`]: one tick, IO only — gather, [`crate::policy::Memory::begin`], signal, finish, write.
//! - [`gather`]: the gather step the tick and `explain` share (snapshot, state, verdicts).
//! - [`verdicts`]: the command-line verdicts a tick gathers, and their cache; [`cmdlines`]: the
//!   one reader of command lines, with its deadline and the pool of bytes held for the matcher.
//! - [`effects`]: the tick's effects behind small traits; `recording`: recording ones, for the
//!   replay tests (with the `testing` feature and in unit tests only).
//! - [`supervise`]: the tick loop, deadlines, hang detection, watchdog, SIGHUP, stop.
//! - [`trim`]: memory given back after start-up and rebuilds.
//! - [`instance`]: one daemon per (account, home).
//!
//! [`run`] wires the real world; [`run_with`] takes any source and effects (replay tests).
use std::{path::PathBuf, sync::Arc, time::Duration};

use tokio::sync::mpsc;

use crate::{
    account::Account,
    ebpf::{EbpfOptions, EbpfSource},
    log::Logger,
    log::{line::StopReason, Line, Notice, What},
    mirror::{Endpoint, Mirror},
    safefs::FsIdentity,
};

pub mod cmdlines;
pub mod effects;
pub mod fault;
pub mod flags;
pub mod gather;
pub mod instance;
pub mod keeper;
pub mod match_all;
pub mod pump;
pub mod rebuild;
#[cfg(any(test, feature = "testing"))]
pub mod recording;
pub mod report;
pub mod sessions;
pub mod slots;
pub mod slots_io;
mod slots_releaser;
mod slots_lines;
pub mod source;
pub mod supervise;
pub mod tick;
pub mod trim;
pub mod verdicts;

pub use effects::Effects;
pub use source::{EventSource, ProcfsSource};
pub use supervise::{Control, Notifier, Stopped};

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
    /// `--metrics-file`: where the Prometheus text goes after every tick.
    pub metrics_file: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot load the BPF programs ({reason}): {detail}")]
    Ebpf { reason: &'static str, detail: String },
}

/// `WARN setuid_untracked reason=<why the hook failed> fallback=<what tracks instead>` (one
/// line, docs/log.md) and the details on stderr, when the credential hook did not attach.
fn cred_warning(creds: &crate::ebpf::CredTracking) -> Option<Line> {
    use crate::ebpf::CredTracking;
    let (fallback, hook) = creds.fallback()?;
    match creds {
        CredTracking::Audit { syscalls, .. } => tracing::warn!(
            "uid changes without exec reach the table through the audit only (--audit-interval): the \
             commit_creds hook did not load ({hook}), nor did the setuid tracepoints ({syscalls})"
        ),
        _ => tracing::info!(
            "uid changes without exec are reported by the setuid tracepoints, as the commit_creds hook did not \
             load ({hook}); only a set-user-ID exec by a process whose real uid is not the account's waits for \
             the audit"
        ),
    }
    Some(Line::Warn(Notice::new(What::SetuidUntracked).with("reason", hook.reason()).with("fallback", fallback)))
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

/// SIGTERM/SIGINT → stop, SIGHUP → reload, as [`Control`] messages.
fn forward_signals(tx: mpsc::Sender<Control>) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        loop {
            let c = tokio::select! {
                _ = term.recv() => Control::Stop,
                _ = int.recv() => Control::Stop,
                _ = hup.recv() => Control::Reload,
            };
            if tx.send(c).await.is_err() {
                return;
            }
        }
    });
    Ok(())
}

/// The real daemon: loads the backend, runs until SIGTERM/SIGINT or a hang. Returns why it stopped.
pub async fn run(opts: DaemonOptions) -> Result<Stopped, DaemonError> {
    crate::startup_phase("daemon::run (arguments parsed, runtime up)");
    let who = FsIdentity { uid: opts.account.uid, gid: opts.account.gid };
    let initial = crate::config::load(&opts.config_path, &opts.home, who).ok();
    let log_bytes = initial.as_ref().map(|c| c.log_max_bytes).unwrap_or(10 << 20);
    let logger = Logger::new(opts.home.join("guard-daemon.log"), who, log_bytes, true);
    let loaded = match opts.backend {
        Backend::Procfs => None,
        Backend::Ebpf | Backend::Auto if !crate::ebpf::holds_bpf_capabilities() => Some(Err((
            "permission_denied",
            "loading BPF programs needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN): run guard-user as root".to_string(),
        ))),
        Backend::Ebpf | Backend::Auto => Some(
            EbpfSource::load(&EbpfOptions {
                account: Some(opts.account.uid),
                ring_bytes: opts.ring_bytes,
                ..Default::default()
            })
            .map_err(|e| (e.reason(), e.to_string())),
        ),
    };
    let mut source = match loaded {
        None => None,
        Some(Ok(s)) => Some(s),
        Some(Err((reason, detail))) if opts.backend == Backend::Auto => {
            tracing::warn!("BPF unavailable, using the procfs backend: {detail}");
            logger.write(&Line::Warn(Notice::new(What::BackendFallback).with("reason", reason)));
            None
        }
        Some(Err((reason, detail))) => {
            logger.write(&Line::Stopped(StopReason::Error));
            return Err(DaemonError::Ebpf { reason, detail });
        }
    };
    // Parsing the kernel's BTF (twice: ours for offsets, aya's for tp_btf) leaves megabytes of
    // freed small allocations in the heap; give them back (measured: see docs/BENCH.md).
    trim::heap();
    if let Some(problem) = source.as_ref().and_then(|s| s.task_iter_problem()) {
        tracing::warn!("start-up, resyncs and CPU samples read /proc instead of the task iterator: {problem}");
        logger.write(&Line::Warn(Notice::new(What::TaskIterFallback).with("reason", problem.reason())));
    }
    if let Some(src) = source.as_ref() {
        if let Some(line) = cred_warning(src.cred_tracking()) {
            logger.write(&line);
        }
    }
    // What a daemon that died left frozen goes back before anything else (this instance's,
    // and any other whose daemon is gone).
    slots::release_leftovers(opts.account.uid, &opts.home, &logger);
    let warn_log = logger.clone();
    let mirror = Mirror::spawn(
        Endpoint::from_env(),
        hostname(),
        opts.account.name.clone(),
        Some(opts.account.uid),
        Arc::new(move |n: Notice| warn_log.write(&Line::Warn(n))),
    );
    let mut fx = effects::real(&opts.account, logger, mirror, opts.metrics_file.clone());
    // Root keeps a copy of the status the account cannot rewrite, for `status` and `check`.
    if let Some(copy) = instance::trusted_status(opts.account.uid, &opts.home) {
        fx.status = Box::new(effects::StatusFile { who, copy: Some(copy.status) });
    }
    // CPU samples: the scheduler's accounting (cost follows the busy processes), else one pass
    // of the task iterator, else /proc (the fallbacks visit every process).
    let forced_procfs = crate::ebpf::task_iter::forced_procfs();
    match source.as_mut().and_then(|s| s.take_cpu_runtime()) {
        Some(Ok(mut rt)) if !forced_procfs => {
            rt.set_min_age(crate::config::MIN_PEGGED_FOR);
            fx.cpu = Box::new(effects::RuntimeCpu(rt))
        }
        other => {
            if let Some(Err(e)) = other {
                tracing::warn!("the stall watch samples with a pass over every process instead: {e}");
            }
            if let Some(it) = source.as_ref().and_then(|s| s.task_iter()).filter(|_| !forced_procfs) {
                fx.cpu = Box::new(effects::IterCpu(it.clone()));
            }
        }
    }
    let (tx, mut control) = mpsc::channel(8);
    if let Err(e) = forward_signals(tx) {
        tracing::error!("cannot handle signals: {e}");
        return Ok(Stopped::Error);
    }
    let mut notifier = supervise::SystemdNotifier::from_env();
    Ok(match source {
        Some(src) => run_with(opts, src, fx, &mut notifier, &mut control).await,
        None => run_with(opts, ProcfsSource, fx, &mut notifier, &mut control).await,
    })
}

/// The daemon on any event source and effects: logs `STARTED`, runs the pump and the supervised
/// tick loop until [`Control::Stop`] or a hang, logs `STOPPED`.
pub async fn run_with<S: EventSource>(
    opts: DaemonOptions,
    source: S,
    fx: Effects,
    notifier: &mut dyn Notifier,
    control: &mut mpsc::Receiver<Control>,
) -> Stopped {
    let backend = source.backend();
    let log = fx.log.clone();
    let clock = fx.clock.clone();
    log.write(&Line::Started {
        version: crate::VERSION,
        backend,
        user: opts.account.name.clone(),
        dry_run: opts.dry_run,
        pid: std::process::id(),
    });
    let slots = Some(slots::SlotsSetup {
        uid: opts.account.uid,
        instance: instance::instance_name(opts.account.uid, &opts.home),
        dry_run: opts.dry_run,
        // Slots move processes between cgroups: root only.
        // SAFETY: geteuid cannot fail.
        privileged: unsafe { libc::geteuid() } == 0,
        log: fx.log.clone(),
        mirror: fx.mirror.clone(),
        clock: fx.clock.clone(),
    });
    let (pump, pump_task) = pump::spawn(source, log.clone(), opts.audit_interval, opts.account.uid, slots);
    let settings = supervise::LoopSettings { interval: opts.interval, deadline: tick::tick_deadline(opts.interval) };
    let ticker = tick::Ticker::new(opts, backend, fx, pump.clone());
    let stopping = pump.clone();
    let stopped =
        supervise::tick_loop(ticker, settings, pump, log.clone(), notifier, control, move || clock.now_mono()).await;
    // Nothing waits after the daemon: every held command goes back before STOPPED (its
    // releaser process does the same should this not finish, or not run at all).
    stopping.slots_stop(std::time::Duration::from_secs(2)).await;
    pump_task.abort();
    log.write(&Line::Stopped(stopped.reason()));
    stopped
}
