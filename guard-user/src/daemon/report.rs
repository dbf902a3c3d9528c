//! What a tick reports once it is done: the status file, the Redis heartbeat, the metrics file,
//! and the daemon's vitals. [`TickFigures`] becomes one [`Status`]; the heartbeat and the metrics
//! are rendered from that status (the metrics with the few figures the status leaves out), so a
//! fact is stated once and the three cannot disagree.
use std::time::{Duration, Instant};

use super::pump::PumpStats;
use crate::{
    config::Config,
    domain::NameStatus,
    metrics::MetricsInput,
    mirror::wire::{HEARTBEAT_ERROR_BYTES, HEARTBEAT_FLAGGED},
    mirror::{Heartbeat, StreamEvent},
    policy::AccountView,
    status::{Status, Vitals},
};

/// Totals since the daemon started.
#[derive(Clone, Copy, Debug, Default)]
pub struct Totals {
    pub ticks: u64,
    /// Processes ended, by reason.
    pub kills: crate::status::KillsByReason,
    pub dry_runs: u64,
    pub skipped: u64,
    pub config_errors: u64,
    /// Command lines not read in time (`Status::cmdlines_unread_total`).
    pub cmdlines_unread: u64,
}

/// What one tick gathered for its reports.
pub struct TickFigures<'a> {
    pub user: &'a str,
    pub uid: u32,
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
    pub pegged: Vec<crate::domain::PeggedProcess>,
    /// Names enforced `repeatAfter` times within 24 h.
    pub offenders: Vec<crate::domain::RepeatOffender>,
    /// The config in force; `None` when this tick's config was invalid.
    pub config: Option<&'a Config>,
    pub config_error: Option<String>,
    /// Includes the tick's duration (`tick_duration_last_secs`).
    pub vitals: Vitals,
    pub mirror_dropped: u64,
    /// Sessions, while they are on.
    pub sessions: Option<crate::domain::SessionsStatus>,
    /// Slots, while any is configured.
    pub slots: Option<crate::status::SlotsStatus>,
    /// Command lines this tick could not read in time.
    pub cmdlines_unread: u64,
}

impl TickFigures<'_> {
    /// The status, and what the metrics file adds to it.
    pub fn into_report(self) -> (Status, MetricsInput) {
        let metrics = MetricsInput {
            names: self.view.counts.clone(),
            threshold: self.config.map(|c| c.threshold),
            timeout_secs: self.config.map(|c| c.timeout.as_secs_f64()),
            dry_runs: self.totals.dry_runs,
            skipped: self.totals.skipped,
            config_errors: self.totals.config_errors,
            mirror_dropped: self.mirror_dropped,
        };
        let status = Status {
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
            kills: self.totals.kills.total(),
            kills_by_reason: self.totals.kills,
            tracked_processes: self.view.tracked_account(),
            machine_processes: self.machine,
            config_error: self.config_error,
            names: self.names,
            pegged: self.pegged,
            repeat_offenders: self.offenders,
            vitals: Some(self.vitals),
            sessions: self.sessions,
            slots: self.slots,
            cmdlines_unread: self.cmdlines_unread,
            cmdlines_unread_total: self.totals.cmdlines_unread,
        };
        (status, metrics)
    }
}

/// The heartbeat (docs/operations.md) of a status: its figures, plus the host and the home the
/// status file does not carry.
pub fn heartbeat(s: &Status, host: String, home: String) -> Heartbeat {
    let flagged: Vec<_> = s.names.iter().filter(|n| n.flagged_since.is_some()).collect();
    Heartbeat {
        host,
        user: s.user.clone(),
        home,
        pid: s.pid,
        version: s.version.clone(),
        backend: s.backend.clone(),
        dry_run: s.dry_run,
        last_tick: s.last_tick as u64,
        flagged: flagged.iter().take(HEARTBEAT_FLAGGED).map(|n| n.name.clone()).collect(),
        flagged_omitted: flagged.len().saturating_sub(HEARTBEAT_FLAGGED) as u64,
        kills: s.kills,
        kills_by_reason: s.kills_by_reason,
        lost_events: s.lost_events,
        resyncs: s.resyncs,
        // Whole seconds, at least one, as before the status carried it.
        interval_secs: (s.interval_secs as u64).max(1),
        config_error: s.config_error.as_deref().map(|e| cut(e, HEARTBEAT_ERROR_BYTES)),
        sessions: s.sessions.as_ref().map(|s| crate::mirror::SessionCounts {
            live: s.live,
            ended: s.ended,
            pending_leftovers: s.pending_leftovers,
            leftovers: s.leftovers_total,
            reaped: s.reaped_total,
            stopped: s.stopped_total,
        }),
        slots: s.slots.as_ref().map(|s| crate::mirror::SlotCounts {
            holding: s.slots.iter().map(|x| x.holders_count).sum(),
            waiting: s.slots.iter().map(|x| x.waiting_count).sum(),
            waits: s.waits_total,
            timeouts: s.timeouts_total,
            unavailable: s.unavailable.clone(),
        }),
    }
}

/// `text` cut to at most `max` bytes at a character boundary, `…` appended when cut.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every heartbeat a guard writes can be read back within a Redis reply's budget: the
    /// largest one (thousands of flagged names, each 15 bytes that escape to 60, the longest
    /// config error, a long home) is far under it.
    #[test]
    fn the_largest_heartbeat_fits_a_replys_budget() {
        let name = crate::comm::Comm::new(&[0xff; 15]).to_string();
        assert_eq!(name.len(), 60);
        let status = Status {
            names: (0..5000)
                .map(|i| NameStatus { name: name.clone(), flagged_since: Some(f64::from(i)), ..Default::default() })
                .collect(),
            config_error: Some("\\x01\"".repeat(10_000)),
            user: "u".repeat(32),
            ..Default::default()
        };
        let hb = heartbeat(&status, "h".repeat(64), "/home/".to_string() + &"\\x1b".repeat(1000));
        assert_eq!((hb.flagged.len(), hb.flagged_omitted), (HEARTBEAT_FLAGGED, 5000 - HEARTBEAT_FLAGGED as u64));
        let json = serde_json::to_string(&hb).unwrap();
        assert!(json.len() <= crate::mirror::resp::REPLY_BYTES / 2, "{} bytes", json.len());
        assert!(hb.config_error.unwrap().len() <= HEARTBEAT_ERROR_BYTES);
    }
}
