//! The pump's side of the session lineage ([`crate::lineage`]): it applies every event the pump
//! applies to its table, adopts what a scan finds that it does not know, reads those processes'
//! parent links on a blocking thread (never on the pump's loop), and wakes the tick loop when a
//! root session ends, so the grace is counted from the exit rather than from the next interval.
//!
//! The tick switches it on and off ([`LineageMode`], carried by every snapshot request): the
//! lineage exists only while the config has `sessions` with at least one root, so a guard
//! without sessions pays nothing for it.
use std::sync::Arc;

use tokio::{sync::Notify, task::JoinHandle};

use super::source::ParentReader;
use crate::{
    event::{Event, ProcId},
    lineage::{Caps, Lineage, LineageCmd, SessionsView},
    table::ProcessTable,
};

/// Pending sessions a tick is handed at most; the rest wait for the next tick (oldest first).
pub const MAX_CANDIDATES_PER_TICK: usize = 4096;

/// What a snapshot request says about the lineage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineageMode {
    /// Leave it as it is (a tick whose config is invalid must not forget the sessions).
    Keep,
    /// No `sessions` (or no roots): forget everything.
    Off,
    /// Keep the lineage of account `uid`.
    On { uid: u32 },
}

type Read = (Vec<ProcId>, Vec<(ProcId, u32)>);

/// See the module doc.
pub struct LineageKeeper {
    lineage: Option<Lineage>,
    parents: ParentReader,
    ignore_pid: Option<u32>,
    caps: Caps,
    /// The parent read in flight: the processes it is for, and its answer.
    reading: Option<JoinHandle<Read>>,
    /// Processes adopted while a read was in flight: read next.
    queued: Vec<ProcId>,
    wake: Arc<Notify>,
}

impl LineageKeeper {
    pub fn new(parents: ParentReader, ignore_pid: Option<u32>, wake: Arc<Notify>) -> LineageKeeper {
        LineageKeeper {
            lineage: None,
            parents,
            ignore_pid,
            caps: Caps::DAEMON,
            reading: None,
            queued: Vec::new(),
            wake,
        }
    }

    /// Events the pump just applied to `table`.
    pub fn on_events(&mut self, events: &[Event]) {
        let Some(l) = self.lineage.as_mut() else { return };
        for e in events {
            l.apply(e);
        }
        self.tell_news();
    }

    fn tell_news(&mut self) {
        if self.lineage.as_mut().is_some_and(Lineage::take_news) {
            self.wake.notify_one();
        }
    }

    /// The tick's wish; `table` is the live table (a lineage switched on adopts all of it).
    pub fn configure(&mut self, mode: LineageMode, table: &ProcessTable) {
        match mode {
            LineageMode::Keep => {}
            LineageMode::Off => {
                self.lineage = None;
                if let Some(r) = self.reading.take() {
                    r.abort();
                }
                self.queued.clear();
            }
            LineageMode::On { uid } if self.lineage.as_ref().is_some_and(|l| l.uid() == uid) => {}
            LineageMode::On { uid } => {
                self.configure(LineageMode::Off, table);
                self.lineage = Some(Lineage::new(uid, self.ignore_pid, self.caps));
                self.on_table(None, table, None);
            }
        }
    }

    /// A scan rebuilt the table (`before` → `table`): processes the lineage never saw forked are
    /// adopted (their parents read next), and so is every process started from `adopt_since`
    /// on (events were lost then); nodes of processes gone unseen are dropped.
    pub fn on_table(&mut self, before: Option<&ProcessTable>, table: &ProcessTable, adopt_since: Option<u64>) {
        let Some(l) = self.lineage.as_mut() else { return };
        let adopted = l.reconcile(before, table, adopt_since);
        self.tell_news();
        if adopted.is_empty() {
            return;
        }
        if self.reading.is_some() {
            self.queued.extend(adopted);
            return;
        }
        let reader = self.parents.clone();
        self.reading = Some(tokio::task::spawn_blocking(move || {
            let parents = reader(&adopted);
            (adopted, parents)
        }));
    }

    /// Whether a parent read is in flight: snapshots wait for it, so a tick never decides on
    /// processes whose session is still to come.
    pub fn busy(&self) -> bool {
        self.reading.is_some()
    }

    /// Resolves when the parent read in flight is done (never when there is none).
    pub async fn read_done(&mut self) -> Read {
        match self.reading.as_mut() {
            Some(h) => h.await.unwrap_or_default(),
            None => std::future::pending().await,
        }
    }

    /// The read's answer (from [`LineageKeeper::read_done`]).
    pub fn finish_read(&mut self, (adopted, parents): Read) {
        self.reading = None;
        if let Some(l) = self.lineage.as_mut() {
            l.attach_parents(&adopted, &parents);
        }
        let queued = std::mem::take(&mut self.queued);
        if !queued.is_empty() {
            let reader = self.parents.clone();
            self.reading = Some(tokio::task::spawn_blocking(move || {
                let parents = reader(&queued);
                (queued, parents)
            }));
        }
    }

    pub fn command(&mut self, cmds: &[LineageCmd]) {
        if let Some(l) = self.lineage.as_mut() {
            l.commands(cmds);
        }
        self.tell_news();
    }

    pub fn view(&self, table: &ProcessTable) -> Option<SessionsView> {
        self.lineage.as_ref().map(|l| l.view(table, MAX_CANDIDATES_PER_TICK))
    }
}
