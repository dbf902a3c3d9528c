//! The metrics file (docs/metrics.md): Prometheus text exposition format (version 0.0.4), as
//! node_exporter's textfile collector reads it. [`render`] is pure: it renders the tick's status
//! (the one the status file gets) and the few figures the status leaves out ([`MetricsInput`]);
//! the daemon calls it after every tick and writes the result atomically to `--metrics-file PATH`.
//!
//! # What is in it
//! Every family has `# HELP` and `# TYPE`, its name starts with `guard_`, and every sample carries
//! `user="<account>"`: one guard runs per account, and the textfile collector merges all files of
//! its directory into one scrape, where two guards' samples without it would collide (and the
//! collector rejects duplicate series). See [`render`] for the families.
//!
//! # Names the account controls
//! A process name (`comm`) is up to 15 arbitrary bytes, and a label value must be UTF-8. A name is
//! first made text by [`escape_for_terminal`] (`\xNN` for bytes that are not UTF-8 and for control
//! characters, `\\` for a backslash; one to one, so two different names never become one series)
//! and that text is then escaped as the format requires for label values (`\\`, `\"`, `\n`). A
//! parser therefore reads back the same text `status` shows.
//!
//! There is no `guard_up`: a file left behind by a dead guard would keep saying 1. Alert on
//! `time() - guard_last_tick_timestamp_seconds > 2 * guard_tick_interval_seconds` instead (the
//! stale rule of `status`), or on node_exporter's `node_textfile_mtime_seconds`.
use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::comm::Comm;
use crate::status::{escape_for_terminal, Status};

/// Names with the most live processes get a `guard_name_processes` sample; the rest only count in
/// `guard_tracked_processes` and `guard_names`, so a pile of distinct names cannot blow up the
/// number of series.
pub const TOP_NAMES: usize = 100;

/// What the metrics file carries beyond the status ([`Status`], which gives every other
/// figure: who, when, the totals, the flagged names, the sessions), so each fact has one source.
/// Counters are totals since the daemon started.
#[derive(Clone, Debug, Default)]
pub struct MetricsInput {
    /// Live processes of the account per name, every name, in any order (the status lists only
    /// the names at or over half the threshold).
    pub names: Vec<(Comm, u32)>,
    /// From the config in force; `None` while it is invalid.
    pub threshold: Option<u32>,
    pub timeout_secs: Option<f64>,
    /// `DRY_RUN` lines.
    pub dry_runs: u64,
    /// `SKIPPED` lines.
    pub skipped: u64,
    /// Ticks whose config was invalid.
    pub config_errors: u64,
    /// Stream events the Redis mirror dropped (`Mirror::dropped`).
    pub mirror_dropped: u64,
}

/// A flagged name as its two families show it: times, not ages (Prometheus' own advice for
/// "when did it happen": the reader subtracts `time()`, and a sample that stops being updated
/// never looks like a clock that stopped).
struct FlaggedName {
    /// When the name was flagged, unix seconds.
    since: f64,
    /// When its processes are due to be ended, unix seconds (the last tick's time when due).
    due: f64,
}

#[derive(Clone, Copy)]
enum Kind {
    Gauge,
    Counter,
}

/// Builds the text one family at a time; every sample gets the `user` label first.
struct Writer {
    out: String,
    user: String,
}

impl Writer {
    fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let kind = match kind {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
        };
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = write!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        let _ = write!(self.out, "{name}{{user=\"{}\"", self.user);
        for (k, v) in labels {
            let _ = write!(self.out, ",{k}=\"{}\"", label_value(v));
        }
        let _ = writeln!(self.out, "}} {}", number(value));
    }

    fn one(&mut self, name: &str, kind: Kind, help: &str, value: f64) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }
}

/// A label value as the format requires: backslash, double quote and newline escaped.
pub fn label_value(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A sample value: Go's float syntax, which the format uses (`NaN`, `+Inf`, `-Inf`).
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        v.to_string()
    }
}

fn bool01(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// The metrics file for one tick. Families, in this order:
/// `guard_build_info{version}`, `guard_backend_info{backend}`, `guard_dry_run`,
/// `guard_start_time_seconds`, `guard_last_tick_timestamp_seconds`, `guard_tick_duration_seconds`,
/// `guard_tick_interval_seconds`, `guard_ticks_total`, `guard_config_error`,
/// `guard_config_errors_total`, `guard_threshold`, `guard_timeout_seconds`,
/// `guard_tracked_processes`, `guard_machine_processes`, `guard_names`,
/// `guard_name_processes{name}` (the [`TOP_NAMES`] largest, most first), `guard_flagged_names`,
/// `guard_warned_names`, `guard_repeat_offenders`, `guard_pegged_processes`,
/// `guard_flagged_since_timestamp_seconds{name}`, `guard_flagged_due_timestamp_seconds{name}`,
/// `guard_kills_total{reason}`, `guard_dry_runs_total`, `guard_skipped_total`, `guard_events_total`,
/// `guard_lost_events_total`, `guard_resyncs_total`, `guard_cmdlines_unread_total`,
/// `guard_mirror_dropped_total`; while sessions are on, `guard_sessions{stage}`,
/// `guard_session_leftovers`, `guard_session_reported_leftovers`, `guard_lineage_processes`,
/// `guard_leftovers_total`, `guard_reaped_total`, `guard_leftovers_stopped_total`,
/// `guard_lineage_untracked_total`, `guard_sessions_cap_reached_total{what}`.
pub fn render(s: &Status, m: &MetricsInput) -> String {
    use Kind::{Counter, Gauge};
    let mut w = Writer { out: String::new(), user: label_value(&escape_for_terminal(s.user.as_bytes())) };
    let text = |s: &str| escape_for_terminal(s.as_bytes());

    w.family("guard_build_info", Gauge, "Always 1; the version of the running guard-user.");
    w.sample("guard_build_info", &[("version", &text(&s.version))], 1.0);
    w.family("guard_backend_info", Gauge, "Always 1; the event source in use (ebpf or procfs).");
    w.sample("guard_backend_info", &[("backend", &text(&s.backend))], 1.0);
    w.one("guard_dry_run", Gauge, "1 when the guard only logs DRY_RUN instead of ending processes.", bool01(s.dry_run));
    w.one("guard_start_time_seconds", Gauge, "When the daemon started, unix seconds.", s.started_at);
    w.one("guard_last_tick_timestamp_seconds", Gauge, "When the last tick completed, unix seconds.", s.last_tick);
    let tick_secs = s.vitals.as_ref().and_then(|v| v.tick_duration_last_secs).unwrap_or(0.0);
    w.one("guard_tick_duration_seconds", Gauge, "How long the last tick took.", tick_secs);
    w.one("guard_tick_interval_seconds", Gauge, "Time between ticks.", s.interval_secs);
    w.one("guard_ticks_total", Counter, "Ticks completed since the daemon started.", s.ticks as f64);
    w.one(
        "guard_config_error",
        Gauge,
        "1 when the last tick's config was invalid, so that tick ended nothing.",
        bool01(s.config_error.is_some()),
    );
    w.one("guard_config_errors_total", Counter, "Ticks whose config was invalid.", m.config_errors as f64);
    w.family("guard_threshold", Gauge, "Live processes of one name that flag the name (config threshold).");
    if let Some(t) = m.threshold {
        w.sample("guard_threshold", &[], t.into());
    }
    w.family("guard_timeout_seconds", Gauge, "How long a flagged name may stay before it is ended (config timeout).");
    if let Some(t) = m.timeout_secs {
        w.sample("guard_timeout_seconds", &[], t);
    }
    w.one("guard_tracked_processes", Gauge, "Live processes of the guarded account.", s.tracked_processes as f64);
    // Every guard of a host reports the same count. Its `user` label stays (node_exporter's
    // textfile collector fails a whole scrape on two files with one series): aggregating across
    // guards takes max by (instance), never sum (docs/metrics.md).
    w.family(
        "guard_machine_processes",
        Gauge,
        "Processes on the machine as ps -e counts them: every user's, kernel threads and zombies included; every guard of a host writes the same value, so aggregate with max by (instance), never sum.",
    );
    if let Some(n) = s.machine_processes {
        w.sample("guard_machine_processes", &[], n as f64);
    }

    let mut names: BTreeMap<&[u8], u64> = BTreeMap::new();
    for (name, count) in &m.names {
        *names.entry(name.as_bytes()).or_default() += u64::from(*count);
    }
    w.one("guard_names", Gauge, "Distinct names among the guarded account's live processes.", names.len() as f64);
    let mut top: Vec<(&[u8], u64)> = names.into_iter().collect();
    // Most processes first; equal counts by name, so the cut at TOP_NAMES is stable.
    top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    top.truncate(TOP_NAMES);
    w.family(
        "guard_name_processes",
        Gauge,
        "Live processes of the guarded account per name (the 100 names with the most).",
    );
    for (name, count) in &top {
        w.sample("guard_name_processes", &[("name", &escape_for_terminal(name))], *count as f64);
    }

    // The status row of each live name that is flagged, keyed by the name's bytes (the status
    // has them as text), so the order is the bytes' as everywhere in this file.
    let mut flagged: BTreeMap<&[u8], FlaggedName> = BTreeMap::new();
    for (name, _) in &m.names {
        let text = name.to_string();
        let Some((row, since)) =
            s.names.iter().find_map(|n| Some((n, n.flagged_since?)).filter(|(n, _)| n.name == text))
        else {
            continue;
        };
        let f = FlaggedName { since, due: s.last_tick + row.time_left_secs.unwrap_or(0.0).max(0.0) };
        flagged.entry(name.as_bytes()).or_insert(f);
    }
    w.one("guard_flagged_names", Gauge, "Names at or over the threshold.", flagged.len() as f64);
    w.one(
        "guard_warned_names",
        Gauge,
        "Flagged names warned about (WARNING) whose enforcement is still ahead.",
        s.names.iter().filter(|n| n.warned).count() as f64,
    );
    w.one(
        "guard_repeat_offenders",
        Gauge,
        "Names enforced repeatAfter times within 24 h (REPEAT): a respawn loop killing will not fix.",
        s.repeat_offenders.len() as f64,
    );
    w.one(
        "guard_pegged_processes",
        Gauge,
        "Processes of the account pegged at peggedCpu for peggedFor (PEGGED; report only).",
        s.pegged.len() as f64,
    );
    w.family("guard_flagged_since_timestamp_seconds", Gauge, "When the name was flagged, unix seconds.");
    for (name, f) in &flagged {
        w.sample("guard_flagged_since_timestamp_seconds", &[("name", &escape_for_terminal(name))], f.since);
    }
    w.family(
        "guard_flagged_due_timestamp_seconds",
        Gauge,
        "When the flagged name's processes are due to be ended, unix seconds.",
    );
    for (name, f) in &flagged {
        w.sample("guard_flagged_due_timestamp_seconds", &[("name", &escape_for_terminal(name))], f.due);
    }

    w.family(
        "guard_kills_total",
        Counter,
        "Processes ended, by reason: ghost_detected (KILLED lines), leftover (leftovers of ended sessions).",
    );
    for (reason, n) in s.kills_by_reason.each() {
        w.sample("guard_kills_total", &[("reason", reason)], n as f64);
    }
    w.one("guard_dry_runs_total", Counter, "Processes a dry run would have ended (DRY_RUN lines).", m.dry_runs as f64);
    w.one("guard_skipped_total", Counter, "Processes left alone at enforcement (SKIPPED lines).", m.skipped as f64);
    w.one("guard_events_total", Counter, "Process events applied to the live table.", s.events as f64);
    w.one(
        "guard_lost_events_total",
        Counter,
        "Process events the kernel dropped (ring buffer full) or skipped (a program busy on that CPU).",
        s.lost_events as f64,
    );
    w.one("guard_resyncs_total", Counter, "Rebuilds of the live table from /proc (RESYNC lines).", s.resyncs as f64);
    w.one(
        "guard_cmdlines_unread_total",
        Counter,
        "Command lines a tick could not read within its reading time (each protected for that tick, read again).",
        s.cmdlines_unread_total as f64,
    );
    w.one(
        "guard_mirror_dropped_total",
        Counter,
        "Events the swarm Redis mirror dropped (queue full while Redis was away, or rejected).",
        m.mirror_dropped as f64,
    );
    if let Some(x) = &s.sessions {
        sessions(&mut w, x);
    }
    if let Some(x) = &s.slots {
        slots(&mut w, x);
    }
    w.out
}

/// Heavy-command slots (docs/configuration.md `slots`), while any is configured.
fn slots(w: &mut Writer, s: &crate::status::SlotsStatus) {
    use Kind::{Counter, Gauge};
    type Figure = fn(&crate::status::SlotStatus) -> f64;
    let families: [(&str, &str, Figure); 3] = [
        ("guard_slot_holders", "Process trees holding the slot.", |x| x.holders_count as f64),
        ("guard_slot_waiting", "Process trees waiting for the slot (frozen).", |x| x.waiting_count as f64),
        ("guard_slot_max", "The slot's max: trees that may hold it at once.", |x| f64::from(x.max)),
    ];
    for (name, help, value) in families {
        w.family(name, Gauge, help);
        for slot in &s.slots {
            w.sample(name, &[("slot", &slot.name)], value(slot));
        }
    }
    w.one(
        "guard_slots_available",
        Gauge,
        "1 when slots can hold commands here, 0 when they only report (WARN slots_unavailable).",
        bool01(s.unavailable.is_none()),
    );
    w.one("guard_slot_waits_total", Counter, "Trees that waited for a slot (SLOT_WAIT lines).", s.waits_total as f64);
    w.one(
        "guard_slot_wait_seconds_total",
        Counter,
        "Seconds trees spent waiting for a slot, all of them.",
        s.wait_seconds_total,
    );
    w.one("guard_slot_timeouts_total", Counter, "Trees maxWait let go (SLOT_TIMEOUT lines).", s.timeouts_total as f64);
    w.one(
        "guard_slot_not_held_total",
        Counter,
        "Trees that should have waited but could not be held, and ran (WARN slot_not_held, the waiting cap).",
        (s.not_held_total + s.over_cap_total) as f64,
    );
}

fn sessions(w: &mut Writer, s: &crate::domain::SessionsStatus) {
    use Kind::{Counter, Gauge};
    w.family("guard_sessions", Gauge, "Session roots: live, or ended with their leftovers still to deal with.");
    w.sample("guard_sessions", &[("stage", "live")], s.live as f64);
    w.sample("guard_sessions", &[("stage", "ended")], s.ended as f64);
    w.sample("guard_sessions", &[("stage", "reported")], s.reported as f64);
    w.one(
        "guard_session_leftovers",
        Gauge,
        "Live processes of ended sessions (leftovers in their grace or being stopped).",
        s.pending_leftovers as f64,
    );
    w.one(
        "guard_session_reported_leftovers",
        Gauge,
        "Leftovers of settled sessions that were reported (LEFTOVER) or left alive by the stop, still running.",
        s.reported_leftovers as f64,
    );
    w.one(
        "guard_lineage_processes",
        Gauge,
        "Processes the session lineage holds (members, and execs awaiting classification).",
        s.tracked as f64,
    );
    w.one("guard_leftovers_total", Counter, "Leftovers of ended sessions (LEFTOVER lines).", s.leftovers_total as f64);
    w.one(
        "guard_reaped_total",
        Counter,
        "Ended sessions whose leftovers were stopped (REAPED lines).",
        s.reaped_total as f64,
    );
    w.one(
        "guard_leftovers_stopped_total",
        Counter,
        "Leftovers ended (the sum of REAPED count=).",
        s.stopped_total as f64,
    );
    w.one(
        "guard_lineage_untracked_total",
        Counter,
        "Processes left without lineage at a cap (never reaped), and execs left unclassified at a cap.",
        (s.untracked_total + s.unclassified_total) as f64,
    );
    w.family(
        "guard_sessions_cap_reached_total",
        Counter,
        "Times each cap of the sessions was reached (WARN sessions_cap says each once); what it refused is never reaped.",
    );
    for (what, n) in s.caps.each() {
        w.sample("guard_sessions_cap_reached_total", &[("what", what)], n as f64);
    }
}
