//! One tick, IO only: gather ([`super::gather`]: config, a drained snapshot from the pump, the
//! state file once, the command-line verdicts), [`Memory::begin`] (the policy decides, on the
//! clocks and incidents it holds), signal the plan's targets, [`Plan::finish`] with their
//! outcomes, write (lines, state file, status, heartbeat, metrics). Every rule is the policy's.
//! Blocking: the supervisor runs it on a blocking thread and watches its deadline.
//!
//! [`Plan::finish`]: crate::policy::memory::Plan::finish
use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use super::{
    effects::Effects,
    gather::{gather, Request, Sources},
    keeper::LineageMode,
    pump::{PumpHandle, PumpStats},
    report::{self, ConfigOutage, TickFigures, Totals, VitalsSampler},
    sessions::{self, SessionsTick},
    verdicts::{round_budget, VerdictCache},
    DaemonOptions,
};
use crate::{
    budget::{Pool, HELD_CMDLINE_BYTES},
    config::{self, Config, ConfigError},
    domain::NameStatus,
    log::{Kind, Line, Notice, What},
    policy::{memory::Input, AccountView, Memory, Now},
    safefs::FsIdentity,
    status,
};

/// What a tick tells the supervisor.
#[derive(Clone, Copy, Debug, Default)]
pub struct TickReport {
    /// The earliest enforcement deadline still ahead (on the monotonic clock, `Clock::now_mono`),
    /// for the deadline timer.
    pub next_deadline: Option<f64>,
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
    /// What the policy remembers: flag clocks, incidents, the stall watch, what was said once.
    memory: Memory,
    /// The state file of the last valid config (a config error keeps its status beside it).
    state_path: PathBuf,
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
    /// Command-line bytes held for a matcher at one time, by the verdicts and the session roots
    /// alike (docs/architecture.md, "Bounds").
    pool: Pool,
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
            memory: Memory::default(),
            state_path,
            deadline: tick_deadline(opts_interval),
            config_outage: ConfigOutage::default(),
            verdicts: VerdictCache::for_daemon(),
            match_all: Default::default(),
            sessions: SessionsTick::default(),
            pool: Pool::new(HELD_CMDLINE_BYTES),
        }
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
            self.fx.log.write(&Line::Warn(Notice::new(What::PatternMatchesAll).with("index", index)));
        }
        // Compiled once per change of the list, in the sandbox; a list it refuses is a config
        // error (nothing is ended); what a matcher that cannot run means is the policy's.
        let down = match self.fx.classifier.set_patterns(&config.exclude_commands) {
            Ok(()) => None,
            Err(e) if e.is_config_error() => {
                tracing::warn!("excludeCommands refused: {e}");
                return self.config_error(&config::refused_patterns(&config.exclude_commands, &e), began);
            }
            Err(e) => Some(e),
        };
        let matcher_up = down.is_none();
        if let Some(line) = self.memory.matcher(matcher_up) {
            // Said once per outage, in the log and the diagnostics alike.
            if let Some(e) = &down {
                tracing::error!("{e}");
            }
            self.fx.log.write(&line);
        }
        if let Err(e) = self.sessions.set_roots(&mut self.fx, &config, began + self.deadline / 4) {
            return self.config_error(&e, began);
        }
        // The slots live in the pump (a matching exec is held at its event, not at a tick):
        // the config goes there, the slots come back for the status.
        let slots = self.pump.slots_blocking(Some(super::slots::SlotsConfig::of(&config)));
        // A slot's pattern the slots' matcher refused (invalid, too costly, or matching every
        // command line) makes the config invalid, as one of `excludeCommands` does; the slots
        // hold nothing until the list changes.
        if let Some(reason) = slots.as_ref().and_then(|r| r.refused.clone()) {
            // A refused pattern of `slots` (`config::refused_patterns_of`'s reason).
            return self.config_error_reason(What::ConfigMalformed, reason, began);
        }
        self.fx.log.set_max_bytes(config.log_max_bytes);
        let path = self.opts.config_path.as_os_str().as_encoded_bytes();
        let mut notes = self.memory.unknown_keys(&config, path);
        notes.extend(self.memory.repeated_keys(&config, path));
        for line in notes {
            self.fx.log.write(&line);
        }
        let fx = &mut self.fx;
        let sessions_book = &self.sessions;
        let src = Sources {
            snapshots: &mut self.pump,
            state: &mut |path| fx.state.load(path),
            procs: &mut *fx.procs,
            classifier: &mut *fx.classifier,
            cache: &mut self.verdicts,
            pool: self.pool.clone(),
            clock: &*fx.clock,
        };
        let req = Request {
            config: &config,
            lineage: sessions::mode(&config, self.opts.account.uid),
            // A session's leftovers due for a step this tick are matched in the same round.
            extra: &mut |snap, now| sessions_book.due(snap.sessions.as_ref(), &config, now),
            matcher_up,
            budget: round_budget(self.opts.interval, self.deadline),
            ends_by: began + self.deadline / 2,
            keep_cmdlines: false,
        };
        let Some(gathered) = gather(src, &mut self.memory, req) else {
            tracing::error!("the event pump is gone; this tick cannot see the table");
            return TickReport::default();
        };
        tracing::debug!(work = ?gathered.work, cached = self.verdicts.len(), "command-line verdicts");
        for line in &gathered.lines {
            self.fx.log.write(line);
        }
        let unread = gathered.work.deferred;
        self.totals.cmdlines_unread += unread as u64;
        if let Some(line) = self.memory.cmdlines_unread(unread, gathered.work.slow) {
            self.fx.log.write(&line);
        }
        let snap = &gathered.snapshot;
        let now = self.fx.clock.now();
        // Decide.
        let input =
            Input { view: &snap.view, config: &config, now, verdicts: &gathered.verdicts, dry_run: self.opts.dry_run };
        let plan = self.memory.begin(input);
        // Apply.
        for line in &plan.decided().lines {
            self.fx.emit(line, now.wall);
        }
        self.totals.skipped += count(&plan.decided().lines, Kind::Skipped);
        let outcomes = self.fx.signals.send(plan.signal(), &plan.targets());
        let done = plan.finish(&outcomes);
        let lines = &done.lines;
        for line in lines {
            self.fx.emit(line, now.wall);
        }
        self.totals.kills.ghost_detected += done.counts.kills;
        self.totals.dry_runs += count(lines, Kind::DryRun);
        self.totals.skipped += count(lines, Kind::Skipped);
        if let Some(save) = &done.save {
            let result = self.fx.state.save(&save.path, &self.opts.account.name, &save.file);
            if let Err(e) = &result {
                tracing::warn!("{e}");
            }
            if let Some(line) = self.memory.saved(save, result.is_ok()) {
                self.fx.log.write(&line);
            }
        }
        self.state_path = config.state_file.clone();
        let sessions = self.sessions.run(sessions::Ctx {
            fx: &mut self.fx,
            pump: &self.pump,
            view: snap.sessions.as_ref(),
            config: &config,
            verdicts: &gathered.verdicts,
            cache: &self.verdicts,
            now: gathered.round_now,
            dry_run: self.opts.dry_run,
            deadline: self.deadline,
            roots_by: began + self.deadline * 3 / 4,
            pool: &self.pool,
        });
        self.totals.skipped += sessions.skipped;
        self.totals.dry_runs += sessions.dry_runs;
        self.totals.kills.leftover += sessions.ended;
        self.watch_stalls(&config, now);
        // Every process ended at this tick counts: KILLED lines and leftovers REAPED counted.
        let counts = crate::policy::memory::Counts { kills: done.counts.kills + sessions.ended, ..done.counts };
        let complete = self.memory.complete(counts);
        self.fx.log.write(&complete);
        let took = began.elapsed().as_secs_f64();
        self.report(Done {
            view: &snap.view,
            stats: snap.stats,
            names: done.status,
            pegged: self.memory.pegged(),
            offenders: done.offenders,
            config: Some(&config),
            config_error: None,
            now: now.wall,
            tick_secs: took,
            pump_lag: Some(gathered.pump_lag),
            sessions: sessions.status,
            slots: slots.map(|r| super::slots::status_of(&r, now)),
            cmdlines_unread: unread as u64,
        });
        let next_deadline = match (done.next_deadline, sessions.next_deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let next_deadline = next_deadline.filter(|_| self.opts.deadline_timer);
        let flagged = done.counts.flagged;
        TickReport { next_deadline, tracked: snap.view.tracked_account(), flagged }
    }

    /// The stall watch: one CPU sample of the account's processes, its lines (report only). Its
    /// windows are on the monotonic clock.
    fn watch_stalls(&mut self, config: &Config, now: Now) {
        let Some(cfg) = config.stall_watch.as_ref() else {
            self.memory.stall_off();
            self.fx.cpu.pause();
            return;
        };
        match self.fx.cpu.sample(self.opts.account.uid) {
            Ok(samples) => {
                for line in self.memory.observe_stall(&samples, cfg, now.mono) {
                    self.fx.emit(&line, now.wall);
                }
            }
            Err(e) => tracing::warn!("the stall watch could not sample CPU times: {e}"),
        }
    }

    fn config_error(&mut self, e: &ConfigError, began: Instant) -> TickReport {
        self.config_error_reason(e.what(), e.log_reason(), began)
    }

    /// [`Ticker::config_error`] from the `ERROR` line's reason.
    fn config_error_reason(&mut self, what: What, reason: String, began: Instant) -> TickReport {
        let now = self.fx.clock.now_unix();
        for line in self.memory.config_error(what, reason.clone()) {
            self.fx.log.write(&line);
        }
        // The lineage is kept as it is: a broken config must not forget the sessions (nor the
        // slots: what waits keeps its place, and maxWait still runs).
        let snap = self.pump.snapshot_blocking(u32::MAX, LineageMode::Keep);
        let slots = self.pump.slots_blocking(None);
        let both = self.fx.clock.now();
        self.totals.config_errors += 1;
        let (view, stats) = snap.map(|s| (s.view, s.stats)).unwrap_or_default();
        let took = began.elapsed().as_secs_f64();
        self.report(Done {
            view: &view,
            stats,
            names: Vec::new(),
            pegged: Vec::new(),
            offenders: Vec::new(),
            config: None,
            config_error: Some(reason),
            now,
            tick_secs: took,
            pump_lag: None,
            sessions: None,
            slots: slots.map(|r| super::slots::status_of(&r, both)),
            cmdlines_unread: 0,
        });
        TickReport { tracked: view.tracked_account(), ..Default::default() }
    }

    /// Status file, heartbeat and metrics from one set of figures.
    fn report(&mut self, done: Done) {
        let Done {
            view,
            stats,
            names,
            pegged,
            offenders,
            config,
            config_error,
            now,
            tick_secs,
            pump_lag,
            sessions,
            slots,
            cmdlines_unread,
        } = done;
        if let Some(ev) = self.config_outage.observe(config_error.as_deref(), now) {
            self.fx.mirror.event(ev);
        }
        let vitals = self.vitals.sample(tick_secs, pump_lag, stats.events);
        let figures = TickFigures {
            user: &self.opts.account.name,
            uid: self.opts.account.uid,
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
            offenders,
            config,
            config_error,
            vitals,
            mirror_dropped: self.fx.mirror.dropped(),
            sessions,
            slots,
            cmdlines_unread,
        };
        let (status, metrics) = figures.into_report();
        let home = self.opts.home.display().to_string();
        self.fx.mirror.heartbeat(report::heartbeat(&status, crate::daemon::hostname(), home), self.opts.interval * 3);
        self.fx.status.write(&status::path_beside(&self.state_path), &status);
        if let Some(m) = self.fx.metrics.as_mut() {
            m.write(&crate::metrics::render(&status, &metrics));
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
    pegged: Vec<crate::domain::PeggedProcess>,
    offenders: Vec<crate::domain::RepeatOffender>,
    /// `None` when the config was invalid.
    config: Option<&'a Config>,
    config_error: Option<String>,
    now: f64,
    tick_secs: f64,
    /// How long the pump took to answer the snapshot.
    pump_lag: Option<f64>,
    /// Sessions, while they are on.
    sessions: Option<crate::domain::SessionsStatus>,
    /// Slots, while any is configured.
    slots: Option<crate::status::SlotsStatus>,
    /// Command lines this tick could not read in time.
    cmdlines_unread: u64,
}

/// Every tick's deadline: the interval, at most 30 s (docs/operations.md).
pub fn tick_deadline(interval: Duration) -> Duration {
    interval.min(Duration::from_secs(30))
}

/// How many of `lines` are of `kind` (the totals of `status` and the metrics).
fn count(lines: &[Line], kind: Kind) -> u64 {
    lines.iter().filter(|l| l.kind() == kind).count() as u64
}
