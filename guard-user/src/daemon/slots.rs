//! The pump's side of heavy-command slots (docs/configuration.md `slots`): it feeds the pure rules
//! ([`crate::policy::slots`]) every event it applies to its table, the moment it applies it, and
//! carries out what they decide through the slots' threads ([`super::slots_io`]): a matching exec
//! is held within milliseconds of the event (the BPF programs wake the pump at every exec of the
//! account while slots are on), not at the next tick, and nothing here blocks the pump: reading
//! a command line, matching it and moving processes between cgroups all happen on those threads.
//!
//! The tick hands it the config (`Request::Slots`) and gets the slots' view for the status; the
//! `maxWait` timer runs here, in the pump's loop. A guard without slots starts none of this.
use std::{
    sync::{
        mpsc::{Sender, SyncSender, TrySendError},
        Arc,
    },
    time::Duration,
};

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::{
    effects::{Clock, LogSink, MirrorSink},
    slots_io::{spawn_classifier, spawn_holder, Answer, ClassifyJob, IoJob, Lines},
};
use crate::{
    config::{Config, Slot},
    event::Event,
    log::{Line, Notice, What},
    policy::slots::{Action, Caps, SlotBook, SlotsView, Verdict},
    table::ProcessTable,
};

/// What the daemon gives the slots at start.
#[derive(Clone)]
pub struct SlotsSetup {
    pub uid: u32,
    /// The daemon's instance (its lock's name): the frozen cgroup's and the journal's name.
    pub instance: String,
    pub dry_run: bool,
    /// Root: only root can move processes between cgroups (and read every exec's command line).
    pub privileged: bool,
    pub log: Arc<dyn LogSink>,
    pub mirror: Arc<dyn MirrorSink>,
    pub clock: Arc<dyn Clock>,
}

/// What a valid config says about slots.
#[derive(Clone, Debug, PartialEq)]
pub struct SlotsConfig {
    pub slots: Vec<Slot>,
    pub excludes: Vec<String>,
    pub exclude_commands: Vec<String>,
}

impl SlotsConfig {
    pub fn of(config: &Config) -> SlotsConfig {
        SlotsConfig {
            slots: config.slots.clone(),
            excludes: config.excludes.clone(),
            exclude_commands: config.exclude_commands.clone(),
        }
    }
}

/// The slots as `status` shows them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SlotsReport {
    pub view: SlotsView,
    /// Why nothing is held here (`WARN slots_unavailable reason=`), if so.
    pub unavailable: Option<&'static str>,
    /// Trees that could not be held and ran at once.
    pub not_held: u64,
    /// The `ERROR` line's reason when the slots' patterns cannot be used (a config error).
    pub refused: Option<String>,
}

struct Links {
    classify: SyncSender<ClassifyJob>,
    io: Sender<IoJob>,
    answers: UnboundedReceiver<Answer>,
    lines: Lines,
}

/// See the module doc.
pub struct SlotKeeper {
    setup: Option<SlotsSetup>,
    /// The `procfs` backend: no exec events, so no slots.
    rescans: bool,
    book: SlotBook,
    links: Option<Links>,
    /// The last config applied (its lists are sent to the classifier once per change).
    config: Option<SlotsConfig>,
    /// What the holder said about this host (`None` until it said).
    unavailable: Option<&'static str>,
    /// Why the slots' patterns cannot be used, until they change (the `ERROR` line's reason).
    refused: Option<String>,
    not_held: u64,
    said: Vec<&'static str>,
}

impl SlotKeeper {
    /// `setup` is `None` where slots cannot run at all.
    pub fn new(setup: Option<SlotsSetup>, rescans: bool, ignore_pid: Option<u32>) -> SlotKeeper {
        let uid = setup.as_ref().map_or(u32::MAX, |s| s.uid);
        SlotKeeper {
            setup,
            rescans,
            book: SlotBook::new(uid, ignore_pid, Caps::DAEMON),
            links: None,
            config: None,
            unavailable: None,
            refused: None,
            not_held: 0,
            said: Vec::new(),
        }
    }

    /// When the kernel should wake the pump: as soon as an event comes while a slot is on.
    pub fn wake(&self) -> crate::event::Wake {
        if self.book.is_on() {
            crate::event::Wake::Adaptive
        } else {
            crate::event::Wake::Timer
        }
    }

    fn now(&self) -> f64 {
        self.setup.as_ref().map_or(0.0, |s| s.clock.now_mono())
    }

    /// A tick's config (`None`: the config is invalid, keep everything as it is).
    pub fn configure(&mut self, config: Option<SlotsConfig>) {
        let Some(config) = config else { return };
        let Some(setup) = self.setup.clone() else { return };
        if !config.slots.is_empty() && (self.rescans || !setup.privileged) {
            self.say_unavailable(&setup, if setup.privileged { "procfs_backend" } else { "not_root" });
            // Nothing is classified here: `status` says why, and lists no slot.
            self.config = Some(config);
            return;
        }
        if self.config.as_ref() == Some(&config) {
            return;
        }
        if setup.uid == 0 && !config.slots.is_empty() {
            self.say_unavailable(&setup, "root_account");
        }
        if config.slots.is_empty() && self.links.is_none() {
            self.config = Some(config);
            return;
        }
        let links = self.links.get_or_insert_with(|| {
            let (tx, rx) = unbounded_channel();
            let lines = Lines::spawn(setup.log.clone(), setup.mirror.clone(), setup.clock.clone());
            Links {
                classify: spawn_classifier(tx.clone()),
                io: spawn_holder(setup.uid, setup.instance.clone(), tx, lines.clone()),
                answers: rx,
                lines,
            }
        });
        let lists_changed = self.config.as_ref().is_none_or(|c| {
            c.slots.iter().map(|s| &s.commands).ne(config.slots.iter().map(|s| &s.commands))
                || c.exclude_commands != config.exclude_commands
                || c.slots.iter().map(|s| &s.name).ne(config.slots.iter().map(|s| &s.name))
        });
        if lists_changed {
            self.refused = None;
            let job =
                ClassifyJob::Lists { exclude_commands: config.exclude_commands.clone(), slots: config.slots.clone() };
            // The lists go first whatever the queue holds: a full queue waits for room here.
            let _ = links.classify.send(job);
        }
        self.config = Some(config);
        self.apply_config();
    }

    fn say_unavailable(&mut self, setup: &SlotsSetup, reason: &'static str) {
        self.unavailable = Some(reason);
        if !self.said.contains(&reason) {
            self.said.push(reason);
            setup.log.write(&Line::Warn(Notice::new(What::SlotsUnavailable).with("reason", reason)));
        }
    }

    /// The book takes the config as it stands: report only where nothing can be held.
    fn apply_config(&mut self) {
        let Some(setup) = self.setup.as_ref() else { return };
        let Some(config) = self.config.clone() else { return };
        let report_only = setup.dry_run || self.unavailable.is_some() || setup.uid == 0;
        let slots: &[Slot] = if self.refused.is_some() { &[] } else { &config.slots };
        let now = self.now();
        let actions = self.book.configure(slots, &config.excludes, report_only, now);
        self.act(actions);
    }

    /// Events the pump just applied to its table.
    pub fn on_events(&mut self, events: &[Event]) {
        if !self.book.is_on() {
            return;
        }
        let now = self.now();
        for e in events {
            let actions = self.book.on_event(e, now);
            self.act(actions);
        }
    }

    /// A rebuild replaced the table: trees lose the processes whose exit was lost.
    pub fn on_table(&mut self, table: &ProcessTable) {
        if !self.book.is_on() {
            return;
        }
        let now = self.now();
        let actions = self.book.reconcile(&|id| table.get(id.pid).is_some_and(|p| p.id == id), now);
        self.act(actions);
    }

    fn act(&mut self, actions: Vec<Action>) {
        let mut queue = std::collections::VecDeque::from(actions);
        while let Some(a) = queue.pop_front() {
            let Some(links) = self.links.as_ref() else { return };
            let job = match a {
                Action::Classify { tree, seq, process } => {
                    match links.classify.try_send(ClassifyJob::Exec { tree, seq, process }) {
                        Ok(()) => continue,
                        // A classifier that cannot keep up: this exec is no slot's (it never waits).
                        Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                            let now = self.now();
                            queue.extend(self.book.verdict(tree, seq, process.comm, &Verdict::Other, now));
                            continue;
                        }
                    }
                }
                Action::Hold { tree, procs, line } => IoJob::Hold { tree, procs, line },
                Action::HoldMore { tree, procs } => IoJob::HoldMore { tree, procs },
                Action::Release { tree, line } => IoJob::Release { tree, line },
                Action::Log(line) => {
                    links.lines.write(line);
                    continue;
                }
            };
            let _ = links.io.send(job);
        }
    }

    /// Resolves with the threads' next answer, or when the next `maxWait` falls due (`None`).
    /// Never, while there is neither.
    pub async fn next(&mut self) -> Option<Answer> {
        let deadline = self.book.next_deadline();
        let now = self.now();
        let Some(links) = self.links.as_mut() else { return std::future::pending().await };
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep(Duration::from_secs_f64((d - now).clamp(0.0, 86_400.0))).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            a = links.answers.recv() => match a {
                Some(a) => Some(a),
                None => std::future::pending().await,
            },
            () = sleep => None,
        }
    }

    /// What [`SlotKeeper::next`] resolved with.
    pub fn handle(&mut self, answer: Option<Answer>) {
        let now = self.now();
        let actions = match answer {
            None => self.book.on_time(now),
            Some(Answer::Verdicts(all)) => all
                .into_iter()
                .flat_map(|(tree, seq, comm, verdict)| self.book.verdict(tree, seq, comm, &verdict, now))
                .collect(),
            Some(Answer::NotHeld { tree }) => {
                self.not_held += 1;
                self.book.not_held(tree, now)
            }
            Some(Answer::Signalled { tree }) => self.book.signalled(tree, now),
            Some(Answer::PatternsRefused(reason)) => {
                self.refused = Some(reason);
                self.apply_config();
                Vec::new()
            }
            Some(Answer::Available(r)) => {
                if let Err(e) = r {
                    // The holder said it once in the log.
                    let token = e.token();
                    self.unavailable = Some(token);
                    self.said.push(token);
                    self.apply_config();
                }
                Vec::new()
            }
        };
        self.act(actions);
    }

    /// The slots for the status (`None` while no slot is configured).
    pub fn report(&self) -> Option<SlotsReport> {
        let configured = self.config.as_ref().is_some_and(|c| !c.slots.is_empty());
        configured.then(|| SlotsReport {
            view: self.book.view(),
            unavailable: self.unavailable,
            not_held: self.not_held,
            refused: self.refused.clone(),
        })
    }

    /// The daemon stops: every waiting tree is let go (`SLOT_START reason=stop`), the holder
    /// puts back anything still held before it answers, and the lines it wrote are in the log
    /// before the daemon's `STOPPED` (at most `within` in all).
    pub fn stop(&mut self, within: Duration) {
        let end = std::time::Instant::now() + within;
        let now = self.now();
        let actions = self.book.release_all(now, "stop");
        self.act(actions);
        if let Some(links) = self.links.as_ref() {
            let (tx, rx) = std::sync::mpsc::channel();
            if links.io.send(IoJob::Stop(tx)).is_ok() {
                let _ = rx.recv_timeout(within);
            }
            links.lines.flush(end.saturating_duration_since(std::time::Instant::now()));
        }
    }
}

/// At start (root only): puts back what a dead daemon of this instance, or of any instance no
/// daemon holds, left in a frozen cgroup, and says so (`WARN slots_leftovers released=<n>`).
pub fn release_leftovers(uid: u32, home: &std::path::Path, log: &dyn LogSink) {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    let Ok(hierarchy) = crate::cgroup::Hierarchy::find() else { return };
    let lock_dir = super::instance::lock_dir();
    let own = crate::cgroup::Instance::new(hierarchy.clone(), super::instance::instance_name(uid, home));
    let mut released = crate::cgroup::sweep::release_instance(&own, &lock_dir);
    released += crate::cgroup::sweep::sweep(&hierarchy, &lock_dir).iter().map(|(_, n)| n).sum::<usize>();
    if released > 0 {
        log.write(&Line::Warn(Notice::new(What::SlotsLeftovers).with("released", released)));
    }
}

/// Rows listed per slot and list in the status (the rest counted).
const STATUS_ROWS: usize = 64;

/// The status of the slots (`now`: both clocks; a tree's `since` is on the monotonic one).
pub fn status_of(report: &SlotsReport, now: crate::policy::Now) -> crate::status::SlotsStatus {
    use crate::status::{SlotStatus, SlotTree, SlotsStatus};
    let tree = |t: &crate::policy::slots::TreeRow| SlotTree {
        pid: t.head.id.pid,
        start_ticks: t.head.id.start_ticks,
        name: t.head.comm.to_string(),
        since_unix: now.wall - (now.mono - t.since).max(0.0),
        processes: t.processes as u64,
    };
    let v = &report.view;
    SlotsStatus {
        unavailable: report.unavailable.map(str::to_string),
        slots: v
            .slots
            .iter()
            .map(|s| SlotStatus {
                name: s.name.clone(),
                max: s.max,
                max_wait_secs: s.max_wait_secs,
                mode: s.mode.to_string(),
                holders: s.holders.iter().take(STATUS_ROWS).map(tree).collect(),
                holders_count: s.holders.len() as u64,
                waiting: s.waiting.iter().take(STATUS_ROWS).map(tree).collect(),
                waiting_count: s.waiting.len() as u64,
            })
            .collect(),
        pending_execs: v.pending as u64,
        tracked: v.nodes as u64,
        waits_total: v.totals.waits,
        timeouts_total: v.totals.timeouts,
        wait_seconds_total: v.totals.wait_secs,
        not_held_total: report.not_held,
        unclassified_total: v.totals.unclassified,
        untracked_total: v.totals.untracked,
        over_cap_total: v.totals.over_cap,
    }
}
