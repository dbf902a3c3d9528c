//! What a tick reports once it is done: the status file, the Redis heartbeat, the metrics file,
//! and the daemon's vitals — all derived from one [`TickFigures`], so they cannot disagree.
use std::time::{Duration, Instant};

use super::pump::PumpStats;
use crate::{
    config::Config,
    metrics::{FlaggedName, MetricsInput},
    mirror::{Heartbeat, StreamEvent},
    policy::AccountView,
    status::{NameStatus, Status, Vitals},
};

/// Totals since the daemon started.
#[derive(Clone, Copy, Debug, Default)]
pub struct Totals {
    pub ticks: u64,
    pub kills: u64,
    pub dry_runs: u64,
    pub skipped: u64,
    pub config_errors: u64,
}

/// Everything one tick reports.
pub struct TickFigures<'a> {
    pub user: &'a str,
    pub uid: u32,
    pub home: &'a str,
    pub backend: &'a str,
    pub dry_run: bool,
    pub started_at: f64,
    pub now: f64,
    pub interval: Duration,
    pub view: &'a AccountView,
    /// Every process of the machine as `ps -e` counts them (`crate::machine`), if known.
    pub machine: Option<u64>,
    pub stats: PumpStats,
    pub totals: Totals,
    pub names: Vec<NameStatus>,
    /// Processes in a stall-watch incident.
    pub pegged: Vec<crate::status::PeggedProcess>,
    /// Names warned about (WARNING) and not yet enforced.
    pub warnings: Vec<String>,
    /// Names enforced `repeatAfter` times within 24 h.
    pub offenders: Vec<crate::status::RepeatOffender>,
    /// The config in force; `None` when this tick's config was invalid.
    pub config: Option<&'a Config>,
    pub config_error: Option<String>,
    pub vitals: Vitals,
    pub tick_secs: f64,
    pub mirror_dropped: u64,
    /// Sessions, while they are on.
    pub sessions: Option<crate::status::SessionsStatus>,
}

impl TickFigures<'_> {
    pub fn status(&self) -> Status {
        Status {
            version: crate::VERSION.into(),
            user: self.user.into(),
            uid: self.uid,
            pid: std::process::id(),
            backend: self.backend.into(),
            dry_run: self.dry_run,
            started_at: self.started_at,
            last_tick: self.now,
            interval_secs: self.interval.as_secs_f64(),
            ticks: self.totals.ticks,
            events: self.stats.events,
            lost_events: self.stats.lost,
            resyncs: self.stats.resyncs,
            kills: self.totals.kills,
            tracked_processes: self.view.tracked_account(),
            machine_processes: self.machine,
            config_error: self.config_error.clone(),
            names: self.names.clone(),
            warnings: self.warnings.clone(),
            pegged: self.pegged.clone(),
            repeat_offenders: self.offenders.clone(),
            vitals: Some(self.vitals.clone()),
            sessions: self.sessions.clone(),
        }
    }

    pub fn heartbeat(&self, host: String) -> Heartbeat {
        Heartbeat {
            host,
            user: self.user.into(),
            home: self.home.into(),
            pid: std::process::id(),
            version: crate::VERSION.into(),
            backend: self.backend.into(),
            dry_run: self.dry_run,
            last_tick: self.now as u64,
            flagged: self.names.iter().filter(|n| n.flagged_since.is_some()).map(|n| n.name.clone()).collect(),
            kills: self.totals.kills,
            lost_events: self.stats.lost,
            resyncs: self.stats.resyncs,
            interval_secs: self.interval.as_secs().max(1),
            config_error: self.config_error.clone(),
            sessions: self.sessions.as_ref().map(|s| crate::mirror::SessionCounts {
                live: s.live,
                ended: s.ended,
                pending_leftovers: s.pending_leftovers,
                leftovers: s.leftovers_total,
                reaped: s.reaped_total,
                stopped: s.stopped_total,
            }),
        }
    }

    pub fn metrics(&self) -> MetricsInput {
        let flagged = self
            .view
            .counts
            .iter()
            .filter_map(|(name, _)| {
                let row = self.names.iter().find(|n| n.flagged_since.is_some() && n.name == name.to_string())?;
                Some(FlaggedName {
                    name: *name,
                    age_secs: (self.now - row.flagged_since?).max(0.0),
                    time_left_secs: row.time_left_secs.unwrap_or(0.0),
                })
            })
            .collect();
        MetricsInput {
            user: self.user.into(),
            version: crate::VERSION.into(),
            backend: self.backend.into(),
            dry_run: self.dry_run,
            started_at: self.started_at,
            last_tick: self.now,
            tick_duration_secs: self.tick_secs,
            interval_secs: self.interval.as_secs_f64(),
            tracked_processes: self.view.tracked_account(),
            machine_processes: self.machine,
            names: self.view.counts.clone(),
            flagged,
            threshold: self.config.map(|c| c.threshold),
            timeout_secs: self.config.map(|c| c.timeout.as_secs_f64()),
            config_error: self.config_error.is_some(),
            ticks: self.totals.ticks,
            kills: self.totals.kills,
            dry_runs: self.totals.dry_runs,
            skipped: self.totals.skipped,
            lost_events: self.stats.lost,
            resyncs: self.stats.resyncs,
            events: self.stats.events,
            config_errors: self.totals.config_errors,
            mirror_dropped: self.mirror_dropped,
            warned_names: self.warnings.len() as u64,
            repeat_offenders: self.offenders.len() as u64,
            pegged_processes: self.pegged.len() as u64,
            sessions: self.sessions.clone(),
        }
    }
}

/// Whether the config was invalid at the last tick, so that the stream hears of an outage once:
/// a `config_error` event (with the `ERROR` line's reason) at the first tick that meets an
/// invalid config, a `config_ok` event at the first tick that reads a valid one again. Never
/// every tick: a config broken for a day makes two events, not 1,440. An account that breaks
/// and mends its config at every tick makes at most one a tick, as its own piles could with
/// `FLAGGED`. The heartbeat, the status file and the metrics say it at every tick.
#[derive(Debug, Default)]
pub struct ConfigOutage {
    /// When the outage began (unix seconds); `None` while the config is valid.
    since: Option<f64>,
}

impl ConfigOutage {
    /// The stream event this tick's config makes, if any; `error` is this tick's config error
    /// (the `ERROR` line's reason), `None` when the config was valid.
    pub fn observe(&mut self, error: Option<&str>, now: f64) -> Option<StreamEvent> {
        let event = |kind: &str, field: &str, value: String| StreamEvent {
            event: kind.into(),
            ts: now as i64,
            extra: vec![(field.into(), value)],
            ..Default::default()
        };
        match (self.since, error) {
            (None, Some(reason)) => {
                self.since = Some(now);
                Some(event("config_error", "error", reason.into()))
            }
            (Some(since), None) => {
                self.since = None;
                Some(event("config_ok", "after_secs", ((now - since).max(0.0) as u64).to_string()))
            }
            _ => None,
        }
    }
}

/// The daemon's own vitals between two ticks: CPU, memory, tick durations, pump lag, event rate.
pub struct VitalsSampler {
    last: Option<(Instant, f64, u64)>,
    max_tick: f64,
}

impl Default for VitalsSampler {
    fn default() -> Self {
        VitalsSampler { last: None, max_tick: 0.0 }
    }
}

/// CPU seconds this process used (all threads).
fn process_cpu_secs() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// Resident memory from /proc/self/statm (field 2, pages).
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    Some(pages * page)
}

impl VitalsSampler {
    /// `tick_secs`: this tick; `pump_lag`: how long the pump took to answer its snapshot.
    pub fn sample(&mut self, tick_secs: f64, pump_lag: Option<f64>, events: u64) -> Vitals {
        let now = Instant::now();
        let cpu = process_cpu_secs();
        self.max_tick = self.max_tick.max(tick_secs);
        let (cpu_percent, events_per_sec) = match self.last {
            Some((at, last_cpu, last_events)) => {
                let wall = now.duration_since(at).as_secs_f64().max(1e-9);
                (Some((cpu - last_cpu) / wall * 100.0), Some(events.saturating_sub(last_events) as f64 / wall))
            }
            None => (None, None),
        };
        self.last = Some((now, cpu, events));
        Vitals {
            cpu_percent,
            rss_bytes: rss_bytes(),
            tick_duration_last_secs: Some(tick_secs),
            tick_duration_max_secs: Some(self.max_tick),
            pump_lag_secs: pump_lag,
            events_per_sec,
        }
    }
}
