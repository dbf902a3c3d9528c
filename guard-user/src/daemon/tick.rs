//! One tick, as three steps: gather (config, a drained snapshot from the pump, the flag clocks,
//! the command-line verdicts), [`decide`] (pure), apply (the effects). Blocking: the supervisor
//! runs it on a blocking thread and watches its deadline.
use std::{
    collections::BTreeSet,
    path::PathBuf,
    time::{Duration, Instant},
};

use super::{
    effects::Effects,
    keeper::LineageMode,
    pump::{PumpHandle, PumpStats},
    report::{ConfigOutage, TickFigures, Totals, VitalsSampler},
    sessions::{self, SessionsTick},
    verdicts::{round_budget, verdicts, Ask, VerdictCache},
    DaemonOptions,
};
use crate::{
    config::{self, Config, ConfigError},
    log::{Kind, Line, Notice},
    mirror::StreamEvent,
    policy::{
        self, after_signals, complete, decide, stall::StallState, time, AccountView, AfterSignals, FlagClocks,
        Incidents, Now, TickInput, TickPlan,
    },
    safefs::FsIdentity,
    state::State,
    state::StateError,
    status::{self, NameStatus},
};

/// What a tick tells the supervisor.
#[derive(Clone, Copy, Debug, Default)]
pub struct TickReport {
    /// The earliest enforcement deadline still ahead (on the monotonic clock, `Clock::now_mono`),
    /// for the deadline timer.
    pub next_deadline: Option<f64>,
    /// Wall time the tick took.
    pub took: Duration,
    /// The account's live processes, for `STATUS=`.
    pub tracked: u64,
    /// Names at/over the threshold.
    pub flagged: usize,
}

/// The tick's state between ticks.
pub struct Ticker {
    opts: DaemonOptions,
    backend: &'static str,
    fx: Effects,
    pump: PumpHandle,
    started_at: f64,
    totals: Totals,
    vitals: VitalsSampler,
    /// Unknown config keys already warned about (once per key per run, not every tick), at most
    /// [`config::MAX_UNKNOWN_KEYS`]: past it, one line says the rest are not reported.
    warned_keys: BTreeSet<String>,
    /// The line saying unknown keys are no longer reported one by one was written.
    unknown_keys_capped: bool,
    /// The flag clocks (the authority, docs/architecture.md) and the incidents, every time on
    /// the monotonic clock ([`time`]). Read from the state file once, at the first tick with a
    /// valid config; from then on the file only persists them.
    state: Option<State>,
    /// Where the clocks were last written successfully, and the wall clock's offset then
    /// ([`Now::offset`]); another `stateFile`, a failed write, or a step of the wall clock (the
    /// file's wall times would be off by it) makes the next tick write them again.
    persisted_at: Option<(PathBuf, f64)>,
    /// The state file of the last valid config (a config error keeps its status beside it).
    state_path: PathBuf,
    /// The stall watch's tracks (docs/configuration.md).
    stall: StallState,
    /// The sandboxed matcher could not run at the last tick (warned once per outage).
    matcher_down: bool,
    /// The tick deadline (docs/operations.md): the matching round gets at most half of it.
    deadline: Duration,
    /// Whether the config is invalid, for the stream's once-per-outage events.
    config_outage: ConfigOutage,
    /// Verdicts of unchanged processes, so they are matched once, not every tick.
    verdicts: VerdictCache,
    /// `excludeCommands` patterns that match every command line, warned once per list.
    match_all: super::match_all::MatchAllWatch,
    /// Session roots and their leftovers (docs/configuration.md `sessions`).
    sessions: SessionsTick,
}

impl Ticker {
    pub fn new(opts: DaemonOptions, backend: &'static str, fx: Effects, pump: PumpHandle) -> Ticker {
        let opts_interval = opts.interval;
        let state_path = config::expand_tilde(config::DEFAULT_STATE_FILE, &opts.home);
        let started_at = fx.clock.now_unix();
        Ticker {
            opts,
            backend,
            fx,
            pump,
            started_at,
            totals: Totals::default(),
            vitals: VitalsSampler::default(),
            warned_keys: BTreeSet::new(),
            unknown_keys_capped: false,
            state: None,
            persisted_at: None,
            state_path,
            stall: StallState::default(),
            matcher_down: false,
            deadline: super::supervise::tick_deadline(opts_interval),
            config_outage: ConfigOutage::default(),
            verdicts: VerdictCache::for_daemon(),
            match_all: Default::default(),
            sessions: SessionsTick::default(),
        }
    }

    /// Logs `line`, and streams it when docs/operations.md says so (`now`: unix time).
    fn emit(&self, line: &Line, now: f64) {
        emit(&self.fx, line, now);
    }

    /// One tick (docs/architecture.md).
    pub fn tick(&mut self) -> TickReport {
        let began = Instant::now();
        self.totals.ticks += 1;
        if self.totals.ticks == 1 {
            crate::startup_phase("first tick");
        }
        super::fault::hang_if("hang_tick", self.totals.ticks);
        // Gather.
        let who = FsIdentity::from(&self.opts.account);
        let config = match config::load(&self.opts.config_path, &self.opts.home, who) {
            Ok(c) => c,
            Err(e) => return self.config_error(&e, began),
        };
        let list = &config.exclude_commands;
        if let Some(index) = self.match_all.check(&mut *self.fx.classifier, list, began + self.deadline / 4) {
            self.fx.log.write(&Line::Warn(Notice::new("pattern_matches_all").with("index", index)));
        }
        // Compiled once per change of the list, in the sandbox; a list it refuses is a config
        // error (nothing is ended), a matcher that cannot run protects every process.
        let matcher_ok = match self.fx.classifier.set_patterns(&config.exclude_commands) {
            Ok(()) => {
                self.matcher_down = false;
                true
            }
            Err(e) if e.is_config_error() => {
                tracing::warn!("excludeCommands refused: {e}");
                return self.config_error(&config::refused_patterns(&config.exclude_commands, &e), began);
            }
            Err(e) => {
                if !self.matcher_down {
                    self.matcher_down = true;
                    tracing::error!("{e}");
                    self.fx.log.write(&Line::Warn(Notice::new("pattern_matcher_down").with("reason", "worker")));
                }
                false
            }
        };
        if let Err(e) = self.sessions.set_roots(&mut self.fx, &config) {
            return self.config_error(&e, began);
        }
        self.fx.log.set_max_bytes(config.log_max_bytes);
        self.warn_unknown_keys(&config);
        let asked = Instant::now();
        let lineage = sessions::mode(&config, self.opts.account.uid);
        let Some(snap) = self.pump.snapshot_blocking(config.threshold, lineage) else {
            tracing::error!("the event pump is gone; this tick cannot see the table");
            return TickReport { took: began.elapsed(), ..Default::default() };
        };
        let pump_lag = asked.elapsed().as_secs_f64();
        let mut errors = 0u32;
        if self.state.is_none() {
            let now = self.fx.clock.now();
            self.state = Some(match self.fx.state.load(&config.state_file) {
                Ok(st) => time::to_memory(&st, now),
                Err(e) => {
                    self.fx.log.write(&Line::Error(Notice::new(e.to_string())));
                    errors += 1;
                    State::default()
                }
            });
        }
        let round_ends =
            (Instant::now() + round_budget(self.opts.interval, self.deadline)).min(began + self.deadline / 2);
        let no_clocks = FlagClocks::new();
        // A session's leftovers due for a step this tick are matched in the same round.
        let sessions_now = self.fx.clock.now();
        let asked = with_members(&snap.view, self.sessions.due(snap.sessions.as_ref(), &config, sessions_now));
        let ask = Ask {
            view: &asked,
            config: &config,
            clocks: self.state.as_ref().map_or(&no_clocks, |s| &s.clocks),
            matcher_ok,
            deadline: round_ends,
        };
        let (verdicts, work) = verdicts(&mut self.verdicts, &mut *self.fx.procs, &mut *self.fx.classifier, ask);
        tracing::debug!(?work, cached = self.verdicts.len(), "command-line verdicts");
        let now = self.fx.clock.now();
        let held = self.state.take().unwrap_or_default();
        let incidents = Incidents { warned: held.warned.clone(), repeats: held.repeats.clone() };
        // Decide.
        let plan = decide(&TickInput {
            view: &snap.view,
            config: &config,
            clocks: &held.clocks,
            now,
            verdicts: &verdicts,
            incidents: &incidents,
        });
        // Apply.
        let (kills, incidents) = self.apply(&plan, &config, now);
        let state = State { clocks: plan.clocks.clone(), warned: incidents.warned.clone(), repeats: incidents.repeats };
        // A wall-clock step of more than a second re-dates the file (slewing drifts far slower).
        let current = self
            .persisted_at
            .as_ref()
            .is_some_and(|(path, offset)| path == &config.state_file && (now.offset() - offset).abs() <= 1.0);
        if state != held || !current {
            let file = time::to_file(&state, now);
            match self.fx.state.save(&config.state_file, &self.opts.account.name, &file) {
                Ok(()) => self.persisted_at = Some((config.state_file.clone(), now.offset())),
                Err(e) => {
                    self.persisted_at = None;
                    tracing::warn!("{e}");
                    if let StateError::Write(_) = e {
                        errors += 1;
                        let path = config.state_file.as_os_str().as_encoded_bytes();
                        self.fx.log.write(&Line::Error(Notice::new("state_unwritable").with("path", path)));
                    }
                }
            }
        }
        let offenders = policy::incidents::offenders(
            &Incidents { warned: state.warned.clone(), repeats: state.repeats.clone() },
            &config,
            now.mono,
        );
        self.state = Some(state);
        self.state_path = config.state_file.clone();
        let sessions = self.sessions.run(sessions::Ctx {
            fx: &mut self.fx,
            pump: &self.pump,
            view: snap.sessions.as_ref(),
            config: &config,
            verdicts: &verdicts,
            now: sessions_now,
            dry_run: self.opts.dry_run,
            deadline: self.deadline,
        });
        self.totals.skipped += sessions.skipped;
        self.totals.dry_runs += sessions.dry_runs;
        self.watch_stalls(&config, now);
        self.fx.log.write(&complete(plan.flagged, kills, errors));
        let took = began.elapsed().as_secs_f64();
        self.report(Done {
            view: &snap.view,
            stats: snap.stats,
            names: plan.status.clone(),
            pegged: self.stall.pegged(),
            warnings: plan.warnings.clone(),
            offenders,
            config: Some(&config),
            config_error: None,
            now: now.wall,
            tick_secs: took,
            pump_lag: Some(pump_lag),
            sessions: sessions.status,
        });
        let next_deadline = match (plan.next_deadline, sessions.next_deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let next_deadline = next_deadline.filter(|_| self.opts.deadline_timer);
        TickReport { next_deadline, took: began.elapsed(), tracked: snap.view.tracked_account(), flagged: plan.flagged }
    }

    /// The stall watch: one CPU sample of the account's processes, its lines (report only). Its
    /// windows are on the monotonic clock.
    fn watch_stalls(&mut self, config: &Config, now: Now) {
        let Some(cfg) = config.stall_watch.as_ref() else {
            self.stall = StallState::default();
            self.fx.cpu.pause();
            return;
        };
        match self.fx.cpu.sample(self.opts.account.uid) {
            Ok(samples) => {
                for line in self.stall.observe(&samples, cfg, now.mono) {
                    self.emit(&line, now.wall);
                }
            }
            Err(e) => tracing::warn!("the stall watch could not sample CPU times: {e}"),
        }
    }

    /// Logs the plan's lines, signals its targets together, logs the outcomes. Returns the kills
    /// and the incidents with this tick's enforcements counted.
    fn apply(&mut self, plan: &TickPlan, config: &Config, now: Now) -> (u64, Incidents) {
        for line in &plan.lines {
            self.emit(line, now.wall);
        }
        self.totals.skipped += count(&plan.lines, Kind::Skipped);
        let procs: Vec<_> = plan.targets.iter().map(|t| t.proc).collect();
        let outcomes = match (procs.is_empty(), self.opts.dry_run) {
            (true, _) => Vec::new(),
            (false, true) => self.fx.signals.verify_all(&procs),
            (false, false) => self.fx.signals.end_all(&procs),
        };
        let AfterSignals { lines, kills, incidents } = after_signals(plan, &outcomes, config, now.mono);
        for line in &lines {
            self.emit(line, now.wall);
        }
        self.totals.kills += kills;
        self.totals.dry_runs += count(&lines, Kind::DryRun);
        self.totals.skipped += count(&lines, Kind::Skipped);
        (kills, incidents)
    }

    /// `WARN config_unknown_key` once per key per run, for at most [`config::MAX_UNKNOWN_KEYS`]
    /// keys; then one `WARN config_unknown_keys_unreported`, and the set stops growing.
    fn warn_unknown_keys(&mut self, config: &Config) {
        let path = self.opts.config_path.as_os_str().as_encoded_bytes();
        let mut over = config.unknown_keys_unlisted > 0;
        for key in &config.unknown_keys {
            if self.warned_keys.contains(key) {
                continue;
            }
            if self.warned_keys.len() >= config::MAX_UNKNOWN_KEYS {
                over = true;
                break;
            }
            self.warned_keys.insert(key.clone());
            self.fx
                .log
                .write(&Line::Warn(Notice::new("config_unknown_key").with("key", key.as_str()).with("path", path)));
        }
        if over && !self.unknown_keys_capped {
            self.unknown_keys_capped = true;
            self.fx.log.write(&Line::Warn(
                Notice::new("config_unknown_keys_unreported")
                    .with("limit", config::MAX_UNKNOWN_KEYS)
                    .with("path", path),
            ));
        }
    }

    fn config_error(&mut self, e: &ConfigError, began: Instant) -> TickReport {
        let now = self.fx.clock.now_unix();
        let reason = e.log_reason();
        self.fx.log.write(&Line::Error(Notice::new(reason.clone())));
        self.fx.log.write(&complete(0, 0, 1));
        // The lineage is kept as it is: a broken config must not forget the sessions.
        let snap = self.pump.snapshot_blocking(u32::MAX, LineageMode::Keep);
        self.totals.config_errors += 1;
        let (view, stats) = snap.map(|s| (s.view, s.stats)).unwrap_or_default();
        let took = began.elapsed().as_secs_f64();
        self.report(Done {
            view: &view,
            stats,
            names: Vec::new(),
            pegged: Vec::new(),
            warnings: Vec::new(),
            offenders: Vec::new(),
            config: None,
            config_error: Some(reason),
            now,
            tick_secs: took,
            pump_lag: None,
            sessions: None,
        });
        TickReport { took: began.elapsed(), tracked: view.tracked_account(), ..Default::default() }
    }

    /// Status file, heartbeat and metrics from one set of figures.
    fn report(&mut self, done: Done) {
        let Done {
            view,
            stats,
            names,
            pegged,
            warnings,
            offenders,
            config,
            config_error,
            now,
            tick_secs,
            pump_lag,
            sessions,
        } = done;
        if let Some(ev) = self.config_outage.observe(config_error.as_deref(), now) {
            self.fx.mirror.event(ev);
        }
        let home = self.opts.home.display().to_string();
        let vitals = self.vitals.sample(tick_secs, pump_lag, stats.events);
        let figures = TickFigures {
            user: &self.opts.account.name,
            uid: self.opts.account.uid,
            home: &home,
            backend: self.backend,
            dry_run: self.opts.dry_run,
            started_at: self.started_at,
            now,
            interval: self.opts.interval,
            view,
            machine: self.fx.procs.machine_processes(),
            stats,
            totals: self.totals,
            names,
            pegged,
            warnings,
            offenders,
            config,
            config_error,
            vitals,
            tick_secs,
            mirror_dropped: self.fx.mirror.dropped(),
            sessions,
        };
        self.fx.mirror.heartbeat(figures.heartbeat(crate::daemon::hostname()), self.opts.interval * 3);
        self.fx.status.write(&status::path_beside(&self.state_path), &figures.status());
        if let Some(m) = self.fx.metrics.as_mut() {
            m.write(&crate::metrics::render(&figures.metrics()));
        }
        if self.totals.ticks == 1 {
            crate::startup_phase("first status written");
        }
    }
}

/// What a finished tick hands [`Ticker::report`].
struct Done<'a> {
    view: &'a AccountView,
    stats: PumpStats,
    names: Vec<NameStatus>,
    pegged: Vec<crate::status::PeggedProcess>,
    warnings: Vec<String>,
    offenders: Vec<crate::status::RepeatOffender>,
    /// `None` when the config was invalid.
    config: Option<&'a Config>,
    config_error: Option<String>,
    now: f64,
    tick_secs: f64,
    /// How long the pump took to answer the snapshot.
    pump_lag: Option<f64>,
    /// Sessions, while they are on.
    sessions: Option<crate::status::SessionsStatus>,
}

/// Logs `line`, and streams it when docs/operations.md says so (`now`: unix time).
pub(super) fn emit(fx: &Effects, line: &Line, now: f64) {
    fx.log.write(line);
    if let Some(ev) = StreamEvent::of(line, now) {
        fx.mirror.event(ev);
    }
}

/// How many of `lines` are of `kind` (the totals of `status` and the metrics).
fn count(lines: &[Line], kind: Kind) -> u64 {
    lines.iter().filter(|l| l.kind() == kind).count() as u64
}

/// `view` with `extra` processes added to its members (each once), for one matching round.
fn with_members(view: &AccountView, extra: Vec<crate::event::ProcState>) -> std::borrow::Cow<'_, AccountView> {
    if extra.is_empty() {
        return std::borrow::Cow::Borrowed(view);
    }
    let mut v = view.clone();
    for p in extra {
        let list = v.members.entry(p.comm).or_default();
        if !list.iter().any(|q| q.id == p.id) {
            list.push(p);
        }
    }
    std::borrow::Cow::Owned(v)
}
