//! What the daemon writes, as data: one variant per kind of log line (docs/log.md), with its
//! fields typed. The text ([`Line::body`]), the journal priority ([`Line::priority`]) and the
//! Redis stream event ([`Line::stream`]) are all worked out from the variant, never from text.
//!
//! Adding a line: a variant here (its body, priority and stream name below), its call site, and
//! its row in docs/log.md.
use std::fmt::Write as _;

pub use super::notice::{FieldValue, Notice};
use crate::comm::Comm;

/// One log line before it is timestamped.
#[derive(Clone, Debug, PartialEq)]
pub enum Line {
    /// `FLAGGED name= count= first_flagged=now|<m>m_ago`.
    Flagged {
        name: Comm,
        count: u32,
        /// `None` on the incident's first tick (`now`), else whole minutes since it was flagged.
        minutes_ago: Option<u64>,
    },
    /// `UNFLAGGED name= count= flagged_for=<m>m reason=`.
    Unflagged { name: Comm, count: u32, flagged_for_mins: u64, reason: UnflagReason },
    /// `WARNING name= count= due_in=<m>m ends= skips=`.
    Warning {
        name: Comm,
        count: u32,
        /// Whole seconds, rounded up (the log shows whole minutes, rounded up).
        due_in_secs: u64,
        ends: u32,
        skips: u32,
    },
    /// `KILLED pid= name= reason=ghost_detected count= elapsed=<h>h`.
    Killed(Ended),
    /// `DRY_RUN pid= name= reason=ghost_detected count= elapsed=<h>h`: where a dry run would
    /// have ended a process of a flagged name.
    DryRun(Ended),
    /// `DRY_RUN pid= name= reason=leftover root=`: where a dry run would have ended a leftover.
    DryRunLeftover { pid: u32, name: Comm, root: u32 },
    /// `SKIPPED pid= name= reason=`.
    Skipped {
        pid: u32,
        name: Comm,
        /// The daemon's own word for why (`excluded_command`, `identity_changed`, …).
        reason: &'static str,
    },
    /// `REPEAT name= enforcements_24h= kills_24h=`.
    Repeat { name: Comm, enforcements_24h: u32, kills_24h: u32 },
    /// `PEGGED pid= name= cpu=<x.xx> for=<n>s`.
    Pegged { pid: u32, name: Comm, cpu: f64, for_secs: u64 },
    /// `RECOVERED pid= name= after=<n>s`.
    Recovered { pid: u32, name: Comm, after_secs: u64 },
    /// `LEFTOVER pid= name= root= age=<n>s`.
    Leftover { pid: u32, name: Comm, root: u32, age_secs: u64 },
    /// `REAPED root= name= count= survivors=`.
    Reaped { root: u32, name: Comm, count: u64, survivors: u64 },
    /// `SLOT_WAIT slot= pid= name= position= mode=<queue|report>`: a command found its slot full
    /// (docs/configuration.md `slots`); with `mode=report` it runs all the same.
    SlotWait { slot: String, pid: u32, name: Comm, position: u32, mode: &'static str },
    /// `SLOT_START slot= pid= waited=<s>s reason=`: a tree holds the slot; `reason` says why it
    /// starts now (`free`: at its exec; `turn`: a holder ended; `signal`: a signal is waiting for
    /// it; `config`: the slot was turned off or reconfigured; `stop`: the daemon stops).
    SlotStart { slot: String, pid: u32, waited_secs: u64, reason: &'static str },
    /// `SLOT_TIMEOUT slot= pid= waited=<s>s`: `maxWait` let a waiting command go.
    SlotTimeout { slot: String, pid: u32, waited_secs: u64 },
    /// `STARTED version= backend= user= dry_run=<0|1> pid=`.
    Started { version: &'static str, backend: &'static str, user: String, dry_run: bool, pid: u32 },
    /// `STOPPED reason=`.
    Stopped(StopReason),
    /// `RELOAD reason=sighup`.
    Reload,
    /// `RESYNC reason= lost=`.
    Resync { reason: ResyncReason, lost: u64 },
    /// `TICK_COMPLETE flagged= kills= errors=`.
    TickComplete { flagged: usize, kills: u64, errors: u32 },
    /// `WARN <what> key=value …`: degraded but guarding.
    Warn(Notice),
    /// `ERROR <what> key=value …`.
    Error(Notice),
}

/// Declares [`Kind`] from one list, so its words and [`Kind::ALL`] cannot disagree.
macro_rules! kinds {
    ($($variant:ident => $word:literal,)*) => {
        /// The kind of a [`Line`], without its fields: what totals count and tests match on.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Kind {
            $($variant,)*
        }

        impl Kind {
            /// Every kind, in docs/log.md's order (the docs checks walk it).
            #[cfg(any(test, feature = "testing"))]
            pub const ALL: &'static [Kind] = &[$(Kind::$variant),*];

            /// The line's first word.
            pub fn word(self) -> &'static str {
                match self {
                    $(Kind::$variant => $word,)*
                }
            }
        }
    };
}

kinds! {
    Flagged => "FLAGGED",
    Unflagged => "UNFLAGGED",
    Warning => "WARNING",
    Killed => "KILLED",
    DryRun => "DRY_RUN",
    Skipped => "SKIPPED",
    Repeat => "REPEAT",
    Pegged => "PEGGED",
    Recovered => "RECOVERED",
    Leftover => "LEFTOVER",
    Reaped => "REAPED",
    SlotWait => "SLOT_WAIT",
    SlotStart => "SLOT_START",
    SlotTimeout => "SLOT_TIMEOUT",
    Started => "STARTED",
    Stopped => "STOPPED",
    Reload => "RELOAD",
    Resync => "RESYNC",
    TickComplete => "TICK_COMPLETE",
    Warn => "WARN",
    Error => "ERROR",
}

/// A process of a flagged name ended (or, in a dry run, found ready to be).
#[derive(Clone, Debug, PartialEq)]
pub struct Ended {
    pub pid: u32,
    pub name: Comm,
    /// The name's live processes this tick.
    pub count: u32,
    /// Seconds since the name was flagged (the log shows hours, one decimal).
    pub elapsed_secs: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnflagReason {
    BelowThreshold,
    Excluded,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    Signal,
    Error,
    Hang,
}

impl StopReason {
    pub fn token(self) -> &'static str {
        match self {
            StopReason::Signal => "signal",
            StopReason::Error => "error",
            StopReason::Hang => "hang",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResyncReason {
    Startup,
    LostEvents,
    Drift,
}

impl ResyncReason {
    pub fn token(self) -> &'static str {
        match self {
            ResyncReason::Startup => "startup",
            ResyncReason::LostEvents => "lost_events",
            ResyncReason::Drift => "drift",
        }
    }
}

impl Line {
    pub fn kind(&self) -> Kind {
        match self {
            Line::Flagged { .. } => Kind::Flagged,
            Line::Unflagged { .. } => Kind::Unflagged,
            Line::Warning { .. } => Kind::Warning,
            Line::Killed(_) => Kind::Killed,
            Line::DryRun(_) | Line::DryRunLeftover { .. } => Kind::DryRun,
            Line::Skipped { .. } => Kind::Skipped,
            Line::Repeat { .. } => Kind::Repeat,
            Line::Pegged { .. } => Kind::Pegged,
            Line::Recovered { .. } => Kind::Recovered,
            Line::Leftover { .. } => Kind::Leftover,
            Line::Reaped { .. } => Kind::Reaped,
            Line::SlotWait { .. } => Kind::SlotWait,
            Line::SlotStart { .. } => Kind::SlotStart,
            Line::SlotTimeout { .. } => Kind::SlotTimeout,
            Line::Started { .. } => Kind::Started,
            Line::Stopped(_) => Kind::Stopped,
            Line::Reload => Kind::Reload,
            Line::Resync { .. } => Kind::Resync,
            Line::TickComplete { .. } => Kind::TickComplete,
            Line::Warn(_) => Kind::Warn,
            Line::Error(_) => Kind::Error,
        }
    }

    /// The syslog priority, for the `<N>` prefix journald reads on stdout (sd-daemon(3)), so
    /// `journalctl -p warning` shows the WARN and ERROR lines:
    ///
    /// | priority | lines |
    /// |---|---|
    /// | `<3>` err | `ERROR`, `STOPPED reason=hang`, `STOPPED reason=error` |
    /// | `<4>` warning | `WARN`, `WARNING`, `SLOT_TIMEOUT` |
    /// | `<5>` notice | `KILLED`, `DRY_RUN`, `REPEAT`, `PEGGED`, `RECOVERED`, `LEFTOVER`, `REAPED`, `SLOT_WAIT`, `STARTED`, `STOPPED` (other reasons), `RELOAD`, `RESYNC` (but `reason=startup`) |
    /// | `<6>` info | `FLAGGED`, `UNFLAGGED`, `SKIPPED`, `SLOT_START`, `TICK_COMPLETE`, `RESYNC reason=startup` |
    pub fn priority(&self) -> u8 {
        match self {
            Line::Error(_) | Line::Stopped(StopReason::Hang | StopReason::Error) => 3,
            Line::Warn(_) | Line::Warning { .. } | Line::SlotTimeout { .. } => 4,
            Line::Resync { reason: ResyncReason::Startup, .. } => 6,
            Line::Killed(_)
            | Line::DryRun(_)
            | Line::DryRunLeftover { .. }
            | Line::Repeat { .. }
            | Line::Pegged { .. }
            | Line::Recovered { .. }
            | Line::Leftover { .. }
            | Line::Reaped { .. }
            | Line::SlotWait { .. }
            | Line::Started { .. }
            | Line::Stopped(_)
            | Line::Reload
            | Line::Resync { .. } => 5,
            Line::Flagged { .. }
            | Line::Unflagged { .. }
            | Line::Skipped { .. }
            | Line::SlotStart { .. }
            | Line::TickComplete { .. } => 6,
        }
    }

    /// The `event` of the Redis stream entry this line becomes, if it becomes one (docs/log.md,
    /// "The Redis stream"): FLAGGED on an incident's first tick only, each ending, skip and
    /// foresight line; never the daemon's own life (`STARTED`, `TICK_COMPLETE`, …).
    pub fn stream(&self) -> Option<&'static str> {
        match self {
            Line::Flagged { minutes_ago: None, .. } => Some("FLAGGED"),
            Line::Killed(_) => Some("KILLED"),
            Line::DryRun(_) | Line::DryRunLeftover { .. } => Some("DRY_RUN"),
            Line::Skipped { .. } => Some("SKIPPED"),
            Line::Warning { .. } => Some("warning"),
            Line::Repeat { .. } => Some("repeat"),
            Line::Pegged { .. } => Some("pegged"),
            Line::Recovered { .. } => Some("recovered"),
            Line::Leftover { .. } => Some("leftover"),
            Line::Reaped { .. } => Some("reaped"),
            Line::SlotWait { .. } => Some("slot_wait"),
            Line::SlotStart { .. } => Some("slot_start"),
            Line::SlotTimeout { .. } => Some("slot_timeout"),
            Line::Flagged { .. }
            | Line::Unflagged { .. }
            | Line::Started { .. }
            | Line::Stopped(_)
            | Line::Reload
            | Line::Resync { .. }
            | Line::TickComplete { .. }
            | Line::Warn(_)
            | Line::Error(_) => None,
        }
    }

    /// `EVENT k=v k=v`: what the log writer writes after the timestamp, every value escaped
    /// (docs/log.md: a value can never start a new line or pass for another key).
    pub fn body(&self) -> String {
        let mut b = Body(String::from(self.kind().word()));
        match self {
            Line::Flagged { name, count, minutes_ago } => {
                b.comm("name", name).num("count", count);
                match minutes_ago {
                    None => b.text("first_flagged", "now"),
                    Some(m) => b.text("first_flagged", &format!("{m}m_ago")),
                };
            }
            Line::Unflagged { name, count, flagged_for_mins, reason } => {
                let reason = match reason {
                    UnflagReason::BelowThreshold => "below_threshold",
                    UnflagReason::Excluded => "excluded",
                };
                b.comm("name", name)
                    .num("count", count)
                    .text("flagged_for", &format!("{flagged_for_mins}m"))
                    .text("reason", reason);
            }
            Line::Warning { name, count, due_in_secs, ends, skips } => {
                b.comm("name", name)
                    .num("count", count)
                    .text("due_in", &format!("{}m", due_in_secs.div_ceil(60)))
                    .num("ends", ends)
                    .num("skips", skips);
            }
            Line::Killed(e) | Line::DryRun(e) => {
                b.num("pid", e.pid)
                    .comm("name", &e.name)
                    .text("reason", "ghost_detected")
                    .num("count", e.count)
                    .text("elapsed", &format!("{}h", hours_one_decimal(e.elapsed_secs)));
            }
            Line::DryRunLeftover { pid, name, root } => {
                b.num("pid", pid).comm("name", name).text("reason", "leftover").num("root", root);
            }
            Line::Skipped { pid, name, reason } => {
                b.num("pid", pid).comm("name", name).text("reason", reason);
            }
            Line::Repeat { name, enforcements_24h, kills_24h } => {
                b.comm("name", name).num("enforcements_24h", enforcements_24h).num("kills_24h", kills_24h);
            }
            Line::Pegged { pid, name, cpu, for_secs } => {
                b.num("pid", pid)
                    .comm("name", name)
                    .text("cpu", &format!("{cpu:.2}"))
                    .text("for", &format!("{for_secs}s"));
            }
            Line::Recovered { pid, name, after_secs } => {
                b.num("pid", pid).comm("name", name).text("after", &format!("{after_secs}s"));
            }
            Line::Leftover { pid, name, root, age_secs } => {
                b.num("pid", pid).comm("name", name).num("root", root).text("age", &format!("{age_secs}s"));
            }
            Line::Reaped { root, name, count, survivors } => {
                b.num("root", root).comm("name", name).num("count", count).num("survivors", survivors);
            }
            Line::SlotWait { slot, pid, name, position, mode } => {
                b.text("slot", slot).num("pid", pid).comm("name", name).num("position", position).text("mode", mode);
            }
            Line::SlotStart { slot, pid, waited_secs, reason } => {
                b.text("slot", slot).num("pid", pid).text("waited", &format!("{waited_secs}s")).text("reason", reason);
            }
            Line::SlotTimeout { slot, pid, waited_secs } => {
                b.text("slot", slot).num("pid", pid).text("waited", &format!("{waited_secs}s"));
            }
            Line::Started { version, backend, user, dry_run, pid } => {
                b.text("version", version)
                    .text("backend", backend)
                    .text("user", user)
                    .num("dry_run", u8::from(*dry_run))
                    .num("pid", pid);
            }
            Line::Stopped(reason) => {
                b.text("reason", reason.token());
            }
            Line::Reload => {
                b.text("reason", "sighup");
            }
            Line::Resync { reason, lost } => {
                b.text("reason", reason.token()).num("lost", lost);
            }
            Line::TickComplete { flagged, kills, errors } => {
                b.num("flagged", flagged).num("kills", kills).num("errors", errors);
            }
            Line::Warn(n) | Line::Error(n) => {
                b.0.push(' ');
                b.0.push_str(&crate::escape::printable(n.head()));
                for (k, v) in &n.fields {
                    b.bytes(k, v);
                }
            }
        }
        b.0
    }
}

/// `elapsed=<h>h`: hours with one decimal.
pub fn hours_one_decimal(elapsed_secs: f64) -> String {
    format!("{:.1}", elapsed_secs / 3600.0)
}

/// A body being written: ` key=value` pairs, each value escaped as docs/log.md says.
struct Body(String);

impl Body {
    fn bytes(&mut self, key: &str, v: &[u8]) -> &mut Body {
        let _ = write!(self.0, " {key}={}", crate::escape::log_value(v));
        self
    }

    fn text(&mut self, key: &str, v: &str) -> &mut Body {
        self.bytes(key, v.as_bytes())
    }

    fn comm(&mut self, key: &str, v: &Comm) -> &mut Body {
        self.bytes(key, v.as_bytes())
    }

    fn num(&mut self, key: &str, v: impl std::fmt::Display) -> &mut Body {
        let _ = write!(self.0, " {key}={v}");
        self
    }
}
