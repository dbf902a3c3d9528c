//! The rebuild bookkeeping: when the pump rebuilds its table from a full scan, and how the
//! result is made exact. Pure: the pump feeds it events, losses, audit ticks and scan results,
//! and does what it answers (start a scan, swap the table, log a line).
//!
//! A rebuild scans on a blocking thread while the pump keeps applying events *and recording*
//! them here. When the scan ends, the recorded events are replayed over the snapshot in order;
//! because every event carries a full process state keyed by pid + start time (see
//! [`crate::table`]), the result is exact: nothing born during the scan is missed or counted
//! twice. Causes: start-up, events the kernel could not deliver, and the periodic audit (which
//! only logs when the table had drifted).
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
}

impl Rebuilder {
    pub fn new() -> Rebuilder {
        Rebuilder { max_recorded: MAX_RECORDED, ..Default::default() }
    }

    #[cfg(test)]
    fn with_max_recorded(max: usize) -> Rebuilder {
        Rebuilder { max_recorded: max, ..Default::default() }
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
        let Some(a) = self.active.as_mut() else { return Step::Nothing };
        a.recorded.extend_from_slice(events);
        if a.recorded.len() > self.max_recorded {
            let (reason, lost) = (a.reason, a.lost);
            return self.begin(reason, lost);
        }
        Step::Nothing
    }

    /// The source reports `delta` more lost events.
    pub fn on_lost(&mut self, delta: u64) -> Step {
        if delta == 0 {
            return Step::Nothing;
        }
        if self.active.is_some() {
            self.pending_lost += delta;
            return Step::Nothing;
        }
        self.begin(Reason::LostEvents, delta)
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
            return Finished { table: None, resync: None, next: Step::Nothing, failed: None };
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
                }
            }
            Err(e) => Finished { table: None, resync: None, next: Step::Nothing, failed: Some(e) },
        };
        if self.pending_lost > 0 {
            let lost = std::mem::take(&mut self.pending_lost);
            out.next = self.begin(Reason::LostEvents, lost);
        } else if !self.ready {
            out.next = self.begin(Reason::Startup, 0);
        }
        out
    }
}

#[cfg(test)]
#[path = "rebuild_tests.rs"]
mod tests;
