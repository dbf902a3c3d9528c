//! The pump: the one owner of the live [`ProcessTable`]. It drains the event source into the
//! table, runs the rebuilds ([`super::rebuild`]) and answers requests over a channel: a tick asks
//! for a drained snapshot of its account and gets a reply; the watchdog pings it. Nothing else
//! touches the table, so there is no lock, no shared flag and no polling.
use std::{io, sync::Arc, time::Duration};

use tokio::{
    sync::{mpsc, oneshot, Notify},
    task::JoinHandle,
};

use super::{
    effects::LogSink,
    keeper::{LineageKeeper, LineageMode},
    rebuild::{Rebuilder, Step},
    slots::{SlotKeeper, SlotsConfig, SlotsReport, SlotsSetup},
    source::{EventSource, Scanner},
};
use crate::{
    event::{Event, ProcState},
    lineage::{LineageCmd, SessionsView},
    log::Line,
    policy::AccountView,
    table::{ProcessTable, Scope},
};

/// The pump's counters, as of its reply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PumpStats {
    /// Events applied since start.
    pub events: u64,
    /// Events the source could not deliver since start.
    pub lost: u64,
    /// `RESYNC` lines logged.
    pub resyncs: u64,
}

/// A drained view for one tick.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub view: AccountView,
    pub stats: PumpStats,
    /// The session lineage, while it is on.
    pub sessions: Option<SessionsView>,
}

pub enum Request {
    /// Drain the source, then reply with the account's view (members of names with at least
    /// `min_count` processes). Queued until the start-up table is complete.
    Snapshot { min_count: u32, lineage: LineageMode, reply: oneshot::Sender<Snapshot> },
    /// The tick's answers about sessions (classified, settled); the reply is the lineage after
    /// them (for the status).
    Lineage { cmds: Vec<LineageCmd>, reply: oneshot::Sender<Option<SessionsView>> },
    /// Liveness: answered when the pump's loop turns.
    Ping { reply: oneshot::Sender<PumpStats> },
    /// Answered once the start-up table is complete.
    WhenReady { reply: oneshot::Sender<()> },
    /// The tick's slots config (`None`: invalid, keep); the reply is the slots for the status.
    Slots { config: Option<SlotsConfig>, reply: oneshot::Sender<Option<SlotsReport>> },
    /// The daemon stops: every waiting command goes back to running first.
    SlotsStop { reply: oneshot::Sender<()> },
}

/// How the tick and the watchdog talk to the pump.
#[derive(Clone)]
pub struct PumpHandle {
    tx: mpsc::Sender<Request>,
    /// Notified when a root session ended: the tick loop runs a tick at once.
    wake: Arc<Notify>,
}

impl PumpHandle {
    /// From a blocking thread (the tick). `None` when the pump is gone. It blocks as long as the
    /// pump does not answer: a wedged pump makes the tick overrun, which the supervisor turns into
    /// `STOPPED reason=hang`.
    pub fn snapshot_blocking(&self, min_count: u32, lineage: LineageMode) -> Option<Snapshot> {
        let (reply, rx) = oneshot::channel();
        self.tx.blocking_send(Request::Snapshot { min_count, lineage, reply }).ok()?;
        rx.blocking_recv().ok()
    }

    /// From a blocking thread (the tick): the lineage's answers; returns the lineage's view
    /// after them (`None` when the pump is gone or the lineage off).
    pub fn lineage_blocking(&self, cmds: Vec<LineageCmd>) -> Option<SessionsView> {
        let (reply, rx) = oneshot::channel();
        self.tx.blocking_send(Request::Lineage { cmds, reply }).ok()?;
        rx.blocking_recv().ok().flatten()
    }

    /// From a blocking thread (the tick): the slots' config; returns the slots for the status.
    pub fn slots_blocking(&self, config: Option<SlotsConfig>) -> Option<SlotsReport> {
        let (reply, rx) = oneshot::channel();
        self.tx.blocking_send(Request::Slots { config, reply }).ok()?;
        rx.blocking_recv().ok().flatten()
    }

    /// The daemon stops: waits (at most `within`) until nothing of the account is held.
    pub async fn slots_stop(&self, within: Duration) {
        let (reply, rx) = oneshot::channel();
        let _ = tokio::time::timeout(within, async {
            self.tx.send(Request::SlotsStop { reply }).await.ok()?;
            rx.await.ok()
        })
        .await;
    }

    /// Resolves when a root session ended (see [`super::keeper`]).
    pub async fn woken(&self) {
        self.wake.notified().await
    }

    /// Waits until the start-up table is complete; false when the pump is gone.
    pub async fn ready(&self) -> bool {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Request::WhenReady { reply }).await.is_ok() && rx.await.is_ok()
    }

    /// From async code; `None` when the pump is gone or did not answer within `timeout`.
    pub async fn ping(&self, timeout: Duration) -> Option<PumpStats> {
        let (reply, rx) = oneshot::channel();
        tokio::time::timeout(timeout, async {
            self.tx.send(Request::Ping { reply }).await.ok()?;
            rx.await.ok()
        })
        .await
        .ok()
        .flatten()
    }
}

/// Records popped per drain round.
const BATCH: usize = 4096;
/// Drain rounds for one snapshot: a storm that refills the ring as fast as it drains cannot keep
/// a tick waiting (the ring is at most a few MiB: a handful of rounds empties it).
const MAX_ROUNDS: usize = 64;

struct Pump<S: EventSource> {
    src: S,
    log: Arc<dyn LogSink>,
    table: ProcessTable,
    rebuild: Rebuilder,
    scanner: Scanner,
    scan: Option<JoinHandle<io::Result<Vec<ProcState>>>>,
    stats: PumpStats,
    last_lost: u64,
    batch: Vec<Event>,
    /// The account the table holds, and the daemon's own pid.
    scope: Scope,
    /// The session lineage beside the table.
    keeper: LineageKeeper,
    /// Snapshot requests waiting for the lineage's parent read.
    held: Vec<Request>,
    /// Heavy-command slots beside the table.
    slots: SlotKeeper,
    /// Which events the kernel wakes the pump for now.
    wake: crate::event::Wake,
    /// The start-up table's phase was traced.
    announced: bool,
    /// Snapshot requests answered (for the test-only fault hook).
    snapshots: u64,
    /// Events the test-only fault hook dropped (0 in release builds).
    lost_on_purpose: u64,
    /// Applying what the source holds before a rebuild's scan ([`Pump::settle_then_scan`]); a
    /// scan asked for meanwhile is the one about to start.
    settling: bool,
}

/// Starts the pump for the table of `account`; it ends when every [`PumpHandle`] is dropped or
/// the source fails.
pub fn spawn<S: EventSource>(
    src: S,
    log: Arc<dyn LogSink>,
    audit_every: Duration,
    account: u32,
    slots: Option<SlotsSetup>,
) -> (PumpHandle, JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(16);
    let scope = Scope { account, ignore_pid: Some(std::process::id()) };
    let last_lost = src.lost();
    let wake = Arc::new(Notify::new());
    let pump = Pump {
        keeper: LineageKeeper::new(src.parents(), scope.ignore_pid, wake.clone()),
        held: Vec::new(),
        slots: SlotKeeper::new(slots, src.rescans_every_tick(), scope.ignore_pid),
        wake: crate::event::Wake::Timer,
        scanner: src.scanner(),
        src,
        log,
        table: ProcessTable::new(scope),
        rebuild: Rebuilder::new(),
        scan: None,
        stats: PumpStats { lost: last_lost, ..Default::default() },
        last_lost,
        batch: Vec::with_capacity(BATCH),
        scope,
        announced: false,
        snapshots: 0,
        lost_on_purpose: 0,
        settling: false,
    };
    (PumpHandle { tx, wake }, tokio::spawn(pump.run(rx, audit_every)))
}

impl<S: EventSource> Pump<S> {
    async fn run(mut self, mut rx: mpsc::Receiver<Request>, audit_every: Duration) {
        let rescans = self.src.rescans_every_tick();
        if !rescans && self.rebuild.start_up() == Step::Scan {
            self.start_scan();
        }
        let mut audit = tokio::time::interval_at(tokio::time::Instant::now() + audit_every, audit_every);
        let mut waiting: Vec<Request> = Vec::new();
        loop {
            let scan_done = async {
                match self.scan.as_mut() {
                    Some(h) => h.await.unwrap_or_else(|e| Err(io::Error::other(e))),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                req = rx.recv() => {
                    let Some(req) = req else { return };
                    match req {
                        Request::Ping { reply } => { let _ = reply.send(self.stats); }
                        Request::WhenReady { reply } if rescans || self.rebuild.ready() => { let _ = reply.send(()); }
                        // The procfs backend: a fresh scan per snapshot, answered when it lands
                        // (the loop keeps serving pings meanwhile).
                        req @ Request::Snapshot { .. } if rescans => {
                            self.count_snapshot();
                            waiting.push(req);
                            if self.scan.is_none() {
                                self.start_scan();
                            }
                        }
                        Request::Lineage { cmds, reply } => {
                            // What happened up to now counts: a stop's chase looks at forks
                            // made since its signals.
                            if !rescans {
                                self.drain_all();
                            }
                            self.keeper.command(&cmds);
                            let _ = reply.send(self.keeper.view(&self.table));
                        }
                        Request::Slots { config, reply } => {
                            let _ = reply.send(self.configure_slots(config));
                        }
                        Request::SlotsStop { reply } => {
                            self.slots.stop(Duration::from_secs(2));
                            let _ = reply.send(());
                        }
                        req if !self.rebuild.ready() => waiting.push(req),
                        req @ Request::Snapshot { .. } => {
                            self.count_snapshot();
                            self.drain_all();
                            self.answer(req);
                        }
                        Request::WhenReady { reply } => { let _ = reply.send(()); }
                    }
                }
                r = self.src.wait(), if !rescans => {
                    if let Err(e) = r {
                        tracing::error!("the event source failed: {e}");
                        return;
                    }
                    self.drain_once();
                }
                scan = scan_done => {
                    self.scan = None;
                    if rescans {
                        match scan {
                            Ok(procs) => {
                                let fresh = ProcessTable::from_snapshot(procs, self.scope);
                                let before = std::mem::replace(&mut self.table, fresh);
                                self.keeper.on_table(Some(&before), &self.table, None);
                                self.slots.on_table(&self.table);
                            }
                            Err(e) => tracing::warn!("cannot read /proc: {e}"),
                        }
                        for req in waiting.drain(..) {
                            self.answer(req);
                        }
                        continue;
                    }
                    self.finish_scan(scan);
                    if self.rebuild.ready() {
                        for req in waiting.drain(..) {
                            match req {
                                req @ Request::Snapshot { .. } => {
                                    self.drain_all();
                                    self.answer(req);
                                }
                                Request::WhenReady { reply } => { let _ = reply.send(()); }
                                Request::Ping { reply } => { let _ = reply.send(self.stats); }
                                Request::Lineage { cmds, reply } => {
                                    self.keeper.command(&cmds);
                                    let _ = reply.send(self.keeper.view(&self.table));
                                }
                                Request::Slots { config, reply } => {
                                    let _ = reply.send(self.configure_slots(config));
                                }
                                Request::SlotsStop { reply } => {
                                    self.slots.stop(Duration::from_secs(2));
                                    let _ = reply.send(());
                                }
                            }
                        }
                    }
                }
                answer = self.slots.next() => {
                    self.slots.handle(answer);
                    self.wake_for_slots();
                }
                read = self.keeper.read_done() => {
                    self.keeper.finish_read(read);
                    if !self.keeper.busy() {
                        for req in std::mem::take(&mut self.held) {
                            self.drain_all();
                            self.answer(req);
                        }
                    }
                }
                _ = audit.tick(), if !rescans => {
                    if self.rebuild.on_audit() == Step::Scan { self.start_scan(); }
                }
            }
        }
    }

    /// The tick's slots config.
    fn configure_slots(&mut self, config: Option<SlotsConfig>) -> Option<SlotsReport> {
        self.slots.configure(config);
        self.wake_for_slots();
        self.slots.report()
    }

    /// The kernel wakes the pump as soon as an event comes while a slot is on.
    fn wake_for_slots(&mut self) {
        let wake = self.slots.wake();
        if wake != self.wake {
            self.wake = wake;
            self.src.wake_for(wake);
        }
    }

    /// Answers a snapshot request, or holds it while the lineage reads parent links (a tick
    /// must not decide on processes whose session is still to come).
    fn answer(&mut self, req: Request) {
        let Request::Snapshot { min_count, lineage, reply } = req else { return };
        self.keeper.configure(lineage, &self.table);
        if self.keeper.busy() {
            self.held.push(Request::Snapshot { min_count, lineage: LineageMode::Keep, reply });
            return;
        }
        let sessions = self.keeper.view(&self.table);
        let _ = reply.send(Snapshot { view: self.table.view(min_count), stats: self.stats, sessions });
    }

    fn start_scan(&mut self) {
        if let Some(old) = self.scan.take() {
            old.abort();
        }
        self.rebuild.scan_starting();
        let scanner = self.scanner.clone();
        self.scan = Some(tokio::task::spawn_blocking(move || scanner()));
    }

    /// One round: pops what is waiting (up to a batch). Returns how many records it popped.
    fn drain_once(&mut self) -> usize {
        self.batch.clear();
        let n = self.src.drain(BATCH, &mut self.batch);
        self.lost_on_purpose += super::fault::lose_forks(&mut self.batch);
        for e in &self.batch {
            self.table.apply(e);
        }
        self.keeper.on_events(&self.batch);
        self.slots.on_events(&self.batch);
        self.wake_for_slots();
        self.stats.events += self.batch.len() as u64;
        let mut step = self.rebuild.on_events(&self.batch);
        let lost = self.src.lost() + self.lost_on_purpose;
        if self.rebuild.on_lost(lost.saturating_sub(self.last_lost)) == Step::Scan {
            step = Step::Scan;
        }
        if lost > self.last_lost {
            self.stats.lost = lost;
            self.last_lost = lost;
        }
        if step == Step::Scan && !self.settling {
            self.settle_then_scan();
        }
        n
    }

    /// Starts a rebuild's scan once what the source already holds is applied: all of it
    /// happened before the scan starts, so the scan reads what it did, and a fork queued there
    /// whose exit was lost is not replayed over the scan as a ghost (`daemon::rebuild`).
    /// Bounded: [`MAX_ROUNDS`] batches, then the scan starts whatever still comes.
    fn settle_then_scan(&mut self) {
        self.settling = true;
        for _ in 0..MAX_ROUNDS {
            if self.drain_once() < BATCH {
                break;
            }
        }
        self.settling = false;
        self.start_scan();
    }

    /// Counts a snapshot being answered; the test-only fault hook may hang the pump here.
    fn count_snapshot(&mut self) {
        self.snapshots += 1;
        super::fault::hang_if("hang_pump", self.snapshots);
    }

    /// Until the source is empty (bounded: see [`MAX_ROUNDS`]).
    fn drain_all(&mut self) {
        for _ in 0..MAX_ROUNDS {
            if self.drain_once() < BATCH {
                return;
            }
        }
    }

    fn finish_scan(&mut self, scan: io::Result<Vec<ProcState>>) {
        let done = self.rebuild.on_scan(&self.table, scan, self.scope);
        if let Some(e) = &done.failed {
            tracing::warn!("/proc scan failed: {e}");
        }
        if let Some(t) = done.table {
            if !self.announced {
                self.announced = true;
                crate::startup_phase("table consistent (/proc scan + replay)");
            }
            let before = std::mem::replace(&mut self.table, t);
            self.keeper.on_table(Some(&before), &self.table, done.adopt_since);
            self.slots.on_table(&self.table);
            // The scan's and the replay's buffers are freed; give their pages back.
            super::trim::heap();
        }
        if let Some(line) = done.resync {
            self.stats.resyncs += 1;
            self.log(&line);
        }
        if done.next == Step::Scan {
            self.start_scan();
        }
    }

    fn log(&self, line: &Line) {
        self.log.write(line);
    }
}
