//! The slots' work off the pump (docs/architecture.md, "Slots"), on two threads of their own so
//! the pump never blocks on it:
//! - the classifier reads each exec's command line and matches it, in a sandboxed matcher of its
//!   own, against `excludeCommands` followed by every slot's `commands` (one compiled list): a
//!   read of `/proc/PID/cmdline` can block on a hostile process, and a match takes up to its
//!   bound. A classifier stuck that way holds nothing new; it never delays a release.
//! - the holder moves processes into the frozen cgroup and back ([`crate::cgroup`]), keeps the
//!   journal of where each came from, watches held processes for a signal waiting for them, and
//!   keeps the releaser process alive: a child (`guard-user __slots-release --instance …`) that
//!   waits for its stdin to close, which happens however the daemon ends (SIGKILL included), and
//!   then puts back everything the daemon held.
//!
//! Lines go through a writer thread of their own ([`Lines`]): a log in a home that stops answering must not
//! stop a release.
use std::{
    collections::HashMap,
    process::{Child, ChildStdin},
    sync::{
        mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender},
    },
    time::{Duration, Instant},
};

use tokio::sync::mpsc::UnboundedSender;

pub use super::slots_lines::Lines;
pub use super::slots_releaser::releaser_main;
use super::slots_releaser::spawn_releaser;
use crate::{
    budget::Budget,
    cgroup::{self, journal, sweep, Hierarchy, Instance, NotHeld, Unavailable},
    comm::Comm,
    config::Slot,
    event::{ProcId, ProcState},
    log::{Line, Notice, What},
    pattern::{match_all, MatchOutcome, Matcher, PatternSetError},
    policy::slots::{TreeId, Verdict},
};

/// What the holder is asked to do.
pub enum IoJob {
    Hold {
        tree: TreeId,
        procs: Vec<ProcId>,
        line: Line,
    },
    HoldMore {
        tree: TreeId,
        procs: Vec<ProcId>,
    },
    Release {
        tree: TreeId,
        line: Option<Line>,
    },
    /// Put back everything still held, then answer.
    Stop(std::sync::mpsc::Sender<()>),
}

/// What the classifier is asked.
pub enum ClassifyJob {
    /// The config's lists (sent before the jobs they apply to).
    Lists {
        exclude_commands: Vec<String>,
        slots: Vec<Slot>,
    },
    Exec {
        tree: TreeId,
        seq: u32,
        process: ProcState,
    },
}

/// What the threads tell the pump.
#[derive(Debug)]
pub enum Answer {
    /// One classifying round's verdicts (one wake-up of the pump per round, not per exec).
    Verdicts(Vec<(TreeId, u32, Comm, Verdict)>),
    /// The slots' patterns cannot be used (refused, or one matches every command line): no
    /// exec is a slot's until the list changes. The `ERROR` line's reason (a config error).
    PatternsRefused(String),
    /// The holder's start: whether it can hold anything here.
    Available(Result<(), Unavailable>),
    NotHeld {
        tree: TreeId,
    },
    Signalled {
        tree: TreeId,
    },
}

/// Most execs waiting for the classifier; past it an exec is not classified (it never waits).
pub const CLASSIFY_QUEUE: usize = 2048;
/// Most processes held at once (the journal's size, the signal watch's round): 256 waiting trees
/// of a few processes each; a part of the daemon's memory bound (docs/architecture.md, Bounds).
pub const MAX_HELD: usize = 1024;
/// How often held processes are looked at for a signal waiting for them.
const SIGNAL_WATCH: Duration = Duration::from_millis(200);
/// Bytes of command lines one classifying round holds at most (a command line the slots match
/// is at most 64 KiB, `Limits::slots`): a part of the daemon's memory bound
/// (docs/architecture.md, "Bounds").
const ROUND_BYTES: usize = 512 << 10;
/// How long one round may read command lines: one slow to read (a hostile process can make its
/// own memory slow to read) costs this much and one chunk past it, is no slot's, and the next
/// exec starts a new round.
const ROUND_READ: Duration = Duration::from_millis(250);

/// Starts the classifier; its answers go to `answers`.
pub fn spawn_classifier(answers: UnboundedSender<Answer>) -> SyncSender<ClassifyJob> {
    let (tx, rx) = mpsc::sync_channel(CLASSIFY_QUEUE);
    std::thread::Builder::new()
        .name("guard-slot-match".into())
        .spawn(move || classifier(rx, answers))
        .expect("spawn the slots' classifier");
    tx
}

fn classifier(rx: Receiver<ClassifyJob>, answers: UnboundedSender<Answer>) {
    let mut matcher = Matcher::new(std::path::PathBuf::from("/proc/self/exe"), crate::pattern::Limits::slots());
    let mut excl = 0usize;
    let mut slots: Vec<Slot> = Vec::new();
    let mut usable = false;
    while let Ok(first) = rx.recv() {
        // Everything queued now, in one matching round (lists first, in order).
        let mut batch = vec![first];
        while batch.len() < 256 {
            match rx.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) => break,
            }
        }
        let mut execs: Vec<(TreeId, u32, ProcState, Vec<u8>)> = Vec::new();
        // Gone, blank or not to be matched: no slot's, answered with the round.
        let mut others = Vec::new();
        let mut budget = read_budget();
        for job in batch {
            match job {
                ClassifyJob::Lists { exclude_commands, slots: s } => {
                    classify_round(&mut matcher, &mut execs, excl, &slots, usable, &answers);
                    budget = read_budget();
                    excl = exclude_commands.len();
                    slots = s;
                    let mine = crate::config::all_slot_patterns(&slots);
                    match set_lists(&mut matcher, &exclude_commands, &mine) {
                        Ok(ok) => usable = ok,
                        Err(reason) => {
                            usable = false;
                            let _ = answers.send(Answer::PatternsRefused(reason));
                        }
                    }
                }
                ClassifyJob::Exec { tree, seq, process } => {
                    let max = matcher.limits().max_text_bytes;
                    // Read into its own buffer, kept as it is: a round holds each text once.
                    let mut buf = Vec::new();
                    if usable && read_cmdline(&process, max, &mut budget, &mut buf) {
                        execs.push((tree, seq, process, buf));
                    } else {
                        others.push((tree, seq, process.comm, Verdict::Other));
                    }
                    if budget.left() == 0 || budget.in_time().is_err() {
                        classify_round(&mut matcher, &mut execs, excl, &slots, usable, &answers);
                        budget = read_budget();
                    }
                }
            }
        }
        classify_round(&mut matcher, &mut execs, excl, &slots, usable, &answers);
        if !others.is_empty() {
            let _ = answers.send(Answer::Verdicts(others));
        }
    }
}

/// Compiles `excludeCommands` then the slots' patterns as one list: `Ok(false)` when the
/// matcher cannot run now, `Err` (the `ERROR` line's reason) when the slots' patterns cannot be
/// used: the matcher refuses one, or one matches every command line (every command of the
/// account would take a slot).
fn set_lists(matcher: &mut Matcher, exclude: &[String], mine: &[String]) -> Result<bool, String> {
    use crate::config::{refused_patterns_of, ConfigError, PatternList};
    match matcher.set_patterns(mine) {
        Err(e) if e.is_config_error() => {
            return Err(refused_patterns_of(PatternList::SlotCommands, mine, &e).log_reason())
        }
        Err(e) => {
            tracing::warn!("the slots' matcher cannot run: {e}");
            return Ok(false);
        }
        Ok(()) => {}
    }
    // One by one: a pattern that takes every command an exec can run (`.` too: no exec has an
    // empty command line). At most 64, once per change of the list.
    let until = Instant::now() + Duration::from_secs(2);
    let takes_all = (0..mine.len()).find(|&i| {
        matcher.set_patterns(std::slice::from_ref(&mine[i])).is_ok()
            && match_all::matches_every_command(&matcher.classify(match_all::command_probes(), until))
    });
    if let Some(i) = takes_all {
        let e = ConfigError::Pattern {
            list: PatternList::SlotCommands,
            pattern: mine[i].chars().take(crate::config::MAX_SHOWN_VALUE + 1).collect(),
            index: Some(i),
            why: "matches every command line, so every command of the account would take a slot".into(),
            fix:
                "match the heavy commands' own words, e.g. (^|/)cargo (build|test)( |$) (try it with guard-user match)",
        };
        return Err(e.log_reason());
    }
    let mut all = exclude.to_vec();
    all.extend_from_slice(mine);
    match matcher.set_patterns(&all) {
        Ok(()) => Ok(true),
        // Each list compiles on its own worker, but not both in the slots' smaller one: said as
        // a config error (no command waits), not left to match nothing in silence.
        Err(e) if e.is_config_error() => Err(together_refused(&all, exclude.len(), matcher.limits(), &e)),
        Err(e) => {
            tracing::warn!("the slots' matcher cannot run: {e}");
            Ok(false)
        }
    }
}

/// `excludeCommands` and the slots' patterns, together, are more than the slots' matcher takes
/// (each may compile on its own): the slots' error, at the pattern where it ran out.
fn together_refused(all: &[String], excl: usize, limits: &crate::pattern::Limits, e: &PatternSetError) -> String {
    use crate::config::{ConfigError, PatternList};
    let i = e.index().unwrap_or(excl);
    ConfigError::Pattern {
        list: PatternList::SlotCommands,
        pattern: all.get(i).map_or("", String::as_str).chars().take(crate::config::MAX_SHOWN_VALUE + 1).collect(),
        index: i.checked_sub(excl),
        why: format!(
            "excludeCommands and every slot's commands, compiled together by the slots' matcher ({} MiB of heap, \
             {} s), are too costly at this pattern",
            limits.memory_bytes >> 20,
            limits.compile.as_secs()
        ),
        fix: "use fewer or smaller repeats ({m,n} with a large n is the usual cause) in excludeCommands or the slots' \
              commands, or fewer patterns (guard-user validate checks them)",
    }
    .log_reason()
}

/// What one round may read: [`ROUND_BYTES`] of command lines within [`ROUND_READ`] (a command
/// line is the account's to make 1 MiB long, and to make slow to read).
fn read_budget() -> Budget {
    Budget::bytes(ROUND_BYTES).ending(Instant::now() + ROUND_READ)
}

/// Reads the command line of `p` as its exec left it into `buf`; `false` when the process is
/// gone or another one now (its start time changed), when the line is blank, or when the
/// budget stopped the read (then it is no slot's: it never waits).
fn read_cmdline(p: &ProcState, max: usize, budget: &mut Budget, buf: &mut Vec<u8>) -> bool {
    crate::procfs::read_cmdline(p.id.pid, max, budget, buf) == crate::procfs::CmdRead::Text
        && !buf.is_empty()
        && cgroup::start_of(p.id.pid) == Some(p.id.start_ticks)
}

fn classify_round(
    matcher: &mut Matcher,
    execs: &mut Vec<(TreeId, u32, ProcState, Vec<u8>)>,
    excl: usize,
    slots: &[Slot],
    usable: bool,
    answers: &UnboundedSender<Answer>,
) {
    if execs.is_empty() {
        return;
    }
    let texts: Vec<&[u8]> = execs.iter().map(|e| e.3.as_slice()).collect();
    let (outcomes, shaky) = if usable {
        let mut round = matcher.round(Instant::now() + Duration::from_secs(2));
        let o = round.classify(&texts);
        // An `excludeCommands` pattern struck out this round: no text is sure not to match it.
        let shaky = round.undecidable().iter().any(|&i| i < excl);
        (o, shaky)
    } else {
        (vec![MatchOutcome::NoMatch; texts.len()], true)
    };
    let mut verdicts = Vec::with_capacity(execs.len());
    for ((tree, seq, process, _), o) in execs.drain(..).zip(outcomes) {
        let verdict = match o {
            MatchOutcome::Matched(i) if i >= excl && !shaky => crate::config::slot_of_pattern(slots, i - excl)
                .map_or(Verdict::Other, |s| Verdict::Slot(slots[s].name.clone())),
            _ => Verdict::Other,
        };
        verdicts.push((tree, seq, process.comm, verdict));
    }
    let _ = answers.send(Answer::Verdicts(verdicts));
}

/// Starts the holder for account `uid` and daemon instance `name`.
pub fn spawn_holder(uid: u32, name: String, answers: UnboundedSender<Answer>, lines: Lines) -> Sender<IoJob> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("guard-slot-hold".into())
        .spawn(move || {
            let mut h = Holder::new(uid, name, answers, lines);
            h.run(rx);
        })
        .expect("spawn the slots' holder");
    tx
}

struct Holder {
    uid: u32,
    name: String,
    answers: UnboundedSender<Answer>,
    lines: Lines,
    instance: Option<Instance>,
    lock_dir: std::path::PathBuf,
    /// tree → its held processes (pid, start).
    trees: HashMap<TreeId, Vec<(u32, u64)>>,
    /// pid → (start, where it came from).
    origins: HashMap<u32, (u64, String)>,
    releaser: Option<(Child, ChildStdin)>,
    /// `WARN slot_not_held reason=` said once per reason.
    said: Vec<&'static str>,
}

impl Holder {
    fn new(uid: u32, name: String, answers: UnboundedSender<Answer>, lines: Lines) -> Holder {
        Holder {
            uid,
            name,
            answers,
            lines,
            instance: None,
            lock_dir: super::instance::lock_dir(),
            trees: HashMap::new(),
            origins: HashMap::new(),
            releaser: None,
            said: Vec::new(),
        }
    }

    fn run(&mut self, rx: Receiver<IoJob>) {
        let available = self.start();
        if let Err(e) = &available {
            tracing::warn!("slots cannot hold anything here, they report only: {e}");
            let mut n = Notice::new(What::SlotsUnavailable).with("reason", e.token());
            if let Unavailable::NotWritable { path, .. } = e {
                n = n.with("path", path.as_str());
            }
            self.lines.write(Line::Warn(n));
        }
        let _ = self.answers.send(Answer::Available(available));
        let mut watch_at = 0usize;
        let mut watched = Instant::now();
        loop {
            match rx.recv_timeout(SIGNAL_WATCH) {
                Ok(IoJob::Stop(done)) => {
                    self.release_everything();
                    if let Some(instance) = &self.instance {
                        instance.remove();
                    }
                    let _ = done.send(());
                    return;
                }
                Ok(job) => self.job(job),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.release_everything();
                    return;
                }
            }
            // At most five rounds a second, however many jobs come in.
            if watched.elapsed() >= SIGNAL_WATCH {
                watched = Instant::now();
                watch_at = self.watch_signals(watch_at);
            }
        }
    }

    /// Finds the hierarchy, puts back what a dead daemon of this instance left, freezes the
    /// waiting cgroup, starts the releaser.
    fn start(&mut self) -> Result<(), Unavailable> {
        let hierarchy = Hierarchy::find()?;
        let instance = Instance::new(hierarchy, self.name.clone());
        sweep::release_instance(&instance, &self.lock_dir);
        instance.prepare()?;
        self.releaser = Some(spawn_releaser(&self.name).map_err(|e| Unavailable::Releaser(e.to_string()))?);
        self.instance = Some(instance);
        Ok(())
    }

    fn job(&mut self, job: IoJob) {
        match job {
            IoJob::Hold { tree, procs, line } => {
                if self.hold(tree, &procs) {
                    self.lines.write(line);
                } else {
                    self.fail(tree);
                }
            }
            IoJob::HoldMore { tree, procs } => {
                if self.trees.contains_key(&tree) && !self.hold(tree, &procs) {
                    self.fail(tree);
                }
            }
            IoJob::Release { tree, line } => {
                self.release(tree);
                if let Some(l) = line {
                    self.lines.write(l);
                }
            }
            IoJob::Stop(_) => unreachable!("handled by run"),
        }
    }

    /// Holds `procs` for `tree`; `false` when the tree cannot wait (it is put back whole).
    fn hold(&mut self, tree: TreeId, procs: &[ProcId]) -> bool {
        let Some(instance) = self.instance.clone() else { return self.refuse("unavailable") };
        if !self.releaser_alive() {
            return self.refuse("releaser");
        }
        self.trees.entry(tree).or_default();
        for p in procs {
            if self.origins.len() >= MAX_HELD {
                return self.refuse("held_cap");
            }
            let origin = match instance.check(p.pid, p.start_ticks, self.uid) {
                Ok(o) => o,
                Err(NotHeld::Gone) => continue,
                Err(e) => return self.refuse(e.token()),
            };
            if origin != instance.wait_cgroup() {
                self.origins.insert(p.pid, (p.start_ticks, origin));
            }
            self.write_journal();
            match instance.hold(p.pid, p.start_ticks, self.uid) {
                Ok(()) => self.trees.get_mut(&tree).expect("entry").push((p.pid, p.start_ticks)),
                Err(NotHeld::Gone) => {
                    self.origins.remove(&p.pid);
                }
                Err(NotHeld::Io) => {
                    self.origins.remove(&p.pid);
                    // The cgroup may have been removed under us: made again for the next one.
                    let _ = instance.prepare();
                    return self.refuse(NotHeld::Io.token());
                }
                Err(e) => {
                    self.origins.remove(&p.pid);
                    return self.refuse(e.token());
                }
            }
        }
        true
    }

    /// `WARN slot_not_held reason=` (once per reason); always `false`.
    fn refuse(&mut self, reason: &'static str) -> bool {
        if !self.said.contains(&reason) {
            self.said.push(reason);
            self.lines.write(Line::Warn(Notice::new(What::SlotNotHeld).with("reason", reason)));
        }
        false
    }

    /// A tree that cannot wait: what was held of it goes back, and it runs.
    fn fail(&mut self, tree: TreeId) {
        self.release(tree);
        let _ = self.answers.send(Answer::NotHeld { tree });
    }

    fn release(&mut self, tree: TreeId) {
        let Some(procs) = self.trees.remove(&tree) else { return };
        let Some(instance) = self.instance.as_ref() else { return };
        for (pid, start) in procs {
            let origin = self.origins.remove(&pid).filter(|(s, _)| *s == start).map(|(_, o)| o);
            if cgroup::start_of(pid) == Some(start) {
                match instance.hierarchy.put_back(pid, origin.as_deref()) {
                    Err(e) if e.raw_os_error() != Some(libc::ESRCH) => tracing::warn!("cannot put back pid {pid}: {e}"),
                    // Gone meanwhile: nothing to put back.
                    _ => {}
                }
            }
        }
        self.write_journal();
    }

    fn release_everything(&mut self) {
        let trees: Vec<TreeId> = self.trees.keys().copied().collect();
        for t in trees {
            self.release(t);
        }
        if let Some(instance) = &self.instance {
            sweep::release_instance(instance, &self.lock_dir);
        }
    }

    fn write_journal(&self) {
        let entries: Vec<journal::Entry> = self
            .origins
            .iter()
            .map(|(&pid, (start, origin))| journal::Entry { pid, start: *start, origin: origin.clone() })
            .collect();
        if let Err(e) = journal::write(&journal::path(&self.lock_dir, &self.name), &entries) {
            tracing::warn!("cannot write the slots' journal: {e}");
        }
    }

    /// The releaser is alive; when it is not, everything goes back (nothing may stay frozen
    /// without someone to thaw it should the daemon die) and a new one is started.
    fn releaser_alive(&mut self) -> bool {
        let dead = match self.releaser.as_mut() {
            Some((child, _)) => !matches!(child.try_wait(), Ok(None)),
            None => true,
        };
        if !dead {
            return true;
        }
        self.releaser = None;
        let waiting: Vec<TreeId> = self.trees.keys().copied().collect();
        for t in waiting {
            self.fail(t);
        }
        match spawn_releaser(&self.name) {
            Ok(r) => {
                self.releaser = Some(r);
                true
            }
            Err(e) => {
                tracing::warn!("cannot restart the slots' releaser: {e}");
                false
            }
        }
    }

    /// Looks at up to 256 held processes (round robin from `at`) for a signal waiting for
    /// them; their trees are let go. Returns where to go on from.
    fn watch_signals(&mut self, at: usize) -> usize {
        if self.trees.is_empty() {
            return 0;
        }
        let all: Vec<(TreeId, u32)> =
            self.trees.iter().flat_map(|(&t, ps)| ps.iter().map(move |&(pid, _)| (t, pid))).collect();
        let from = at % all.len().max(1);
        let mut seen = Vec::new();
        for &(tree, pid) in all.iter().cycle().skip(from).take(all.len().min(256)) {
            if !seen.contains(&tree) && cgroup::wants_to_act(pid) {
                seen.push(tree);
                let _ = self.answers.send(Answer::Signalled { tree });
            }
        }
        from + all.len().min(256)
    }
}
