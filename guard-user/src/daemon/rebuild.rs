//! The rebuild bookkeeping: when the pump rebuilds its table from a full scan, and how the
//! result is made exact. Pure: the pump feeds it events, losses, audit ticks and scan results,
//! and does what it answers (start a scan, swap the table, log a line).
//!
//! A rebuild scans on a blocking thread while the pump keeps applying events *and recording*
//! them here. When the scan ends, the recorded events are replayed over the snapshot in order;
//! because every event carries a full process state keyed by pid + start time (see
//! [`crate::table`]), the result is exact: nothing born during the scan is missed or counted
//! twice. The pump first applies what the source already holds, then tells the rebuilder the
//! scan starts ([`Rebuilder::scan_starting`]): what happened before it is what the scan reads, so
//! of the events recorded until then only the exits are kept for the replay (a process can still
//! show in /proc a moment after its exit was reported). Replaying a fork from before the scan
//! would bring back a child the scan rightly left out, when the child's exit was lost: a ghost,
//! counted until the next audit. Causes: start-up, events the kernel could not deliver, and the
//! periodic audit (which only logs when the table had drifted).
//!
//! A loss also costs the lineage what the lost events said: a fork the kernel could not deliver
//! leaves its child, and every process that child forks, outside its session, though the table
//! holds them (their later events did arrive). So the rebuilder keeps the *loss window*: the
//! start time from which a lost event's process can date, namely the newest start any event had
//! when the loss counter was last read unchanged, less [`LOSS_MARGIN_SECS`] (a process's start
//! time is set a moment before its fork is reported). The scan that repairs the loss hands it on
//! ([`Finished::adopt_since`]): the lineage then asks again about every process of the window.
use std::io;

use crate::{
    event::{Event, ProcState},
    log::Line,
    table::{ProcessTable, Scope},
};

/// Why a rebuild runs; `RESYNC reason=…`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    Startup,
    LostEvents,
    Audit,
}

impl Reason {
    /// The `RESYNC` line's reason.
    pub fn line_reason(self) -> crate::log::line::ResyncReason {
        use crate::log::line::ResyncReason;
        match self {
            Reason::Startup => ResyncReason::Startup,
            Reason::LostEvents => ResyncReason::LostEvents,
            Reason::Audit => ResyncReason::Drift,
        }
    }
}

/// What the pump must do after telling the rebuilder something.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Start a scan now, abandoning any scan in flight.
    Scan,
    Nothing,
}

/// Recorded events beyond this during one scan: the scan restarts (memory stays bounded).
pub const MAX_RECORDED: usize = 1 << 20;

/// How far before the newest start seen at the last clean read of the loss counter a process
/// whose event was lost can have started (see the module doc).
pub const LOSS_MARGIN_SECS: u64 = 10;

#[derive(Debug)]
struct Active {
    reason: Reason,
    lost: u64,
    recorded: Vec<Event>,
}

/// See the module doc.
#[derive(Debug, Default)]
pub struct Rebuilder {
    active: Option<Active>,
    /// Losses seen while a scan ran: that scan missed them too, so another follows it.
    pending_lost: u64,
    /// The start-up table is complete: ticks may run (a half-built table would show names below
    /// their threshold and drop their flag clocks).
    ready: bool,
    /// The cap on recorded events (tests lower it).
    max_recorded: usize,
    /// The newest start time (clock ticks) any event carried.
    newest_start: u64,
    /// `newest_start` when the loss counter was last read unchanged.
    clean_mark: u64,
    /// The loss window not yet handed to the lineage: processes started from then on.
    loss_since: Option<u64>,
    /// [`LOSS_MARGIN_SECS`] in clock ticks.
    margin_ticks: u64,
}

/// The end of a scan.
#[derive(Debug)]
pub struct Finished {
    /// The rebuilt table, to replace the live one.
    pub table: Option<ProcessTable>,
    /// `RESYNC reason=… lost=…`, when the rebuild is worth a line (an audit that found no drift
    /// is not).
    pub resync: Option<Line>,
    /// Whether another scan must start.
    pub next: Step,
    /// Why the scan failed, if it did.
    pub failed: Option<io::Error>,
    /// Events were lost: the lineage asks again about the processes started from this time on
    /// (clock ticks), though the table held them before (see the module doc).
    pub adopt_since: Option<u64>,
}

impl Rebuilder {
    pub fn new() -> Rebuilder {
        Rebuilder::with_max_recorded(MAX_RECORDED)
    }

    fn with_max_recorded(max_recorded: usize) -> Rebuilder {
        let margin_ticks = LOSS_MARGIN_SECS * crate::event::clock_ticks_per_sec();
        Rebuilder { max_recorded, margin_ticks, ..Default::default() }
    }

    /// The start-up rebuild.
    pub fn start_up(&mut self) -> Step {
        self.begin(Reason::Startup, 0)
    }

    fn begin(&mut self, reason: Reason, lost: u64) -> Step {
        self.active = Some(Active { reason, lost, recorded: Vec::new() });
        Step::Scan
    }

    pub fn ready(&self) -> bool {
        self.ready
    }

    #[cfg(test)]
    fn scanning(&self) -> bool {
        self.active.is_some()
    }

    /// Events the pump just applied to the live table.
    pub fn on_events(&mut self, events: &[Event]) -> Step {
        for e in events {
            if let Event::Fork { child: s, .. } | Event::State { state: s, .. } = e {
                self.newest_start = self.newest_start.max(s.id.start_ticks);
            }
        }
        let Some(a) = self.active.as_mut() else { return Step::Nothing };
        a.recorded.extend_from_slice(events);
        if a.recorded.len() > self.max_recorded {
            let (reason, lost) = (a.reason, a.lost);
            return self.begin(reason, lost);
        }
        Step::Nothing
    }

    /// The loss counter was read after the events applied so far: `delta` more lost events
    /// (0: none since the last read).
    pub fn on_lost(&mut self, delta: u64) -> Step {
        if delta == 0 {
            self.clean_mark = self.newest_start;
            return Step::Nothing;
        }
        let since = self.clean_mark.saturating_sub(self.margin_ticks);
        self.loss_since = Some(self.loss_since.map_or(since, |s| s.min(since)));
        if self.active.is_some() {
            self.pending_lost += delta;
            return Step::Nothing;
        }
        self.begin(Reason::LostEvents, delta)
    }

    /// The scan is starting now (the pump applied what its source held first): of the events
    /// recorded so far only exits are replayed over it (see the module doc).
    pub fn scan_starting(&mut self) {
        if let Some(a) = self.active.as_mut() {
            a.recorded.retain(|e| matches!(e, Event::Exit(_)));
        }
    }

    /// The periodic audit is due.
    pub fn on_audit(&mut self) -> Step {
        if self.active.is_some() {
            return Step::Nothing;
        }
        self.begin(Reason::Audit, 0)
    }

    /// The scan finished (every process it read; the table keeps those of `scope`). `current`
    /// is the live table (to tell whether an audit found drift).
    pub fn on_scan(&mut self, current: &ProcessTable, scan: io::Result<Vec<ProcState>>, scope: Scope) -> Finished {
        let Some(a) = self.active.take() else {
            return Finished { table: None, resync: None, next: Step::Nothing, failed: None, adopt_since: None };
        };
        let mut out = match scan {
            Ok(procs) => {
                let mut fresh = ProcessTable::from_snapshot(procs, scope);
                for e in &a.recorded {
                    fresh.apply(e);
                }
                let worth_a_line = a.reason != Reason::Audit || current.difference(&fresh) > 0;
                self.ready = true;
                Finished {
                    table: Some(fresh),
                    resync: worth_a_line.then(|| Line::Resync { reason: a.reason.line_reason(), lost: a.lost }),
                    next: Step::Nothing,
                    failed: None,
                    adopt_since: None,
                }
            }
            Err(e) => Finished { table: None, resync: None, next: Step::Nothing, failed: Some(e), adopt_since: None },
        };
        if self.pending_lost > 0 {
            let lost = std::mem::take(&mut self.pending_lost);
            out.next = self.begin(Reason::LostEvents, lost);
        } else if !self.ready {
            out.next = self.begin(Reason::Startup, 0);
        }
        // The window goes with the table that no further scan for a loss follows (a window
        // handed on earlier would miss what the next scan repairs).
        if out.table.is_some() && out.next == Step::Nothing {
            out.adopt_since = self.loss_since.take();
        }
        out
    }
}

#[cfg(test)]
#[path = "rebuild_tests.rs"]
mod tests;
