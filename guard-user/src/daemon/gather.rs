//! The gather step, one path for the tick and `explain` (docs/architecture.md): a snapshot of
//! the account, the state file when the policy's memory has not read it yet, then the command
//! line of every process that could be ended and its verdict ([`super::verdicts`], whose rules
//! are `policy::cmdline`), read through one [`CmdlineReader`]. The tick gathers from the pump and
//! the sandboxed matcher it keeps; `explain` from one `/proc` scan and a matcher of its own, and
//! never signals.
use std::{
    collections::{HashMap, HashSet},
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use super::{
    cmdlines::CmdlineReader,
    effects::{Classifier, Clock, ProcessReader},
    keeper::LineageMode,
    pump::{PumpHandle, Snapshot},
    verdicts::{verdicts, Ask, VerdictCache, Work},
};
use crate::{
    budget::{Budget, Pool},
    config::Config,
    domain::State,
    escape::ShownCmdline,
    event::{ProcId, ProcState},
    log::Line,
    policy::{AccountView, CmdVerdict, Memory, Now},
    procfs::CmdRead,
    state::StateError,
};

/// Where the account's processes come from.
pub trait Snapshots {
    /// The account's view (members of names with at least `min_count` processes); `None` when
    /// the source is gone.
    fn snapshot(&mut self, min_count: u32, lineage: LineageMode) -> Option<Snapshot>;
}

/// The daemon's: a drained snapshot from the pump, which owns the table.
impl Snapshots for PumpHandle {
    fn snapshot(&mut self, min_count: u32, lineage: LineageMode) -> Option<Snapshot> {
        self.snapshot_blocking(min_count, lineage)
    }
}

/// What gather reads through.
pub struct Sources<'a> {
    pub snapshots: &'a mut dyn Snapshots,
    /// Reads the state file (the daemon moves a rejected one aside; `explain` only reads).
    pub state: &'a mut dyn FnMut(&Path) -> Result<State, StateError>,
    pub procs: &'a mut dyn ProcessReader,
    pub classifier: &'a mut dyn Classifier,
    pub cache: &'a mut VerdictCache,
    /// Where command lines waiting for the matcher are held (the tick's one pool).
    pub pool: Pool,
    pub clock: &'a dyn Clock,
}

/// What to gather.
pub struct Request<'a> {
    pub config: &'a Config,
    pub lineage: LineageMode,
    /// Processes to match beside the members of names at the threshold, given the snapshot and
    /// the time the round starts (the tick: a session's leftovers due for a step; `explain`: the
    /// processes of the name it explains).
    pub extra: &'a mut dyn FnMut(&Snapshot, Now) -> Vec<ProcState>,
    /// The matcher holds `config`'s list (see `policy::cmdline::route`).
    pub matcher_up: bool,
    /// The matching round's budget from when it starts, and the latest it may end.
    pub budget: Duration,
    pub ends_by: Instant,
    /// Keep what output shows of the command lines read (`explain`).
    pub keep_cmdlines: bool,
}

/// What a tick decides on, besides the config and the policy's memory.
pub struct Gathered {
    pub snapshot: Snapshot,
    /// How long the source took to answer the snapshot.
    pub pump_lag: f64,
    /// The state file's `ERROR`, when it could not be used.
    pub lines: Vec<Line>,
    /// The time the matching round started (what [`Request::extra`] was given).
    pub round_now: Now,
    pub verdicts: HashMap<ProcId, CmdVerdict>,
    /// What output shows of the command lines read, by pid (only with
    /// [`Request::keep_cmdlines`]): at most 4 KiB each, one copy per distinct text.
    pub cmdlines: HashMap<u32, Arc<ShownCmdline>>,
    pub work: Work,
}

/// Gathers (see the module doc); `None` when the snapshot source is gone.
pub fn gather(src: Sources, memory: &mut Memory, req: Request) -> Option<Gathered> {
    let asked = Instant::now();
    let snapshot = src.snapshots.snapshot(req.config.threshold, req.lineage)?;
    let pump_lag = asked.elapsed().as_secs_f64();
    let mut lines = Vec::new();
    if memory.needs_state() {
        let now = src.clock.now();
        lines.extend(memory.load((src.state)(&req.config.state_file).map_err(|e| e.notice()), now));
    }
    let round_ends = (Instant::now() + req.budget).min(req.ends_by);
    let round_now = src.clock.now();
    let view = with_members(&snapshot.view, (req.extra)(&snapshot, round_now));
    let mut keeping = Keeping { inner: src.procs, texts: req.keep_cmdlines.then(Shown::default) };
    let mut reader = CmdlineReader::for_phase(&mut keeping, src.pool, Instant::now(), round_ends);
    let ask = Ask {
        view: &view,
        config: req.config,
        clocks: memory.clocks(),
        matcher_ok: req.matcher_up,
        deadline: round_ends,
    };
    let (verdicts, work) = verdicts(src.cache, &mut reader, src.classifier, ask);
    drop(reader);
    let cmdlines = keeping.texts.map(|t| t.by_pid).unwrap_or_default();
    Some(Gathered { snapshot, pump_lag, lines, round_now, verdicts, cmdlines, work })
}

/// `view` with `extra` processes added to its members (each once), for one matching round.
fn with_members(view: &AccountView, extra: Vec<ProcState>) -> std::borrow::Cow<'_, AccountView> {
    if extra.is_empty() {
        return std::borrow::Cow::Borrowed(view);
    }
    let mut v = view.clone();
    for p in extra {
        let list = v.members.entry(p.comm).or_default();
        if !list.iter().any(|q| q.id == p.id) {
            list.push(p);
        }
    }
    std::borrow::Cow::Owned(v)
}

/// What output shows of the command lines read, one copy per distinct shown text (forks share
/// their argv).
#[derive(Default)]
struct Shown {
    by_pid: HashMap<u32, Arc<ShownCmdline>>,
    distinct: HashSet<Arc<ShownCmdline>>,
}

/// A reader that keeps what output shows of what it read, so what `explain` shows is the text
/// that was judged.
struct Keeping<'a> {
    inner: &'a mut dyn ProcessReader,
    texts: Option<Shown>,
}

impl ProcessReader for Keeping<'_> {
    fn cmdline(&mut self, pid: u32, max: usize, budget: &mut Budget, buf: &mut Vec<u8>) -> CmdRead {
        let read = self.inner.cmdline(pid, max, budget, buf);
        if let (Some(t), CmdRead::Text) = (self.texts.as_mut(), read) {
            let shown = ShownCmdline::of(buf);
            let shared = match t.distinct.get(&shown) {
                Some(s) => Arc::clone(s),
                None => {
                    let s = Arc::new(shown);
                    t.distinct.insert(Arc::clone(&s));
                    s
                }
            };
            t.by_pid.insert(pid, shared);
        }
        read
    }

    fn exists(&mut self, pid: u32) -> bool {
        self.inner.exists(pid)
    }

    fn machine_processes(&mut self) -> Option<u64> {
        self.inner.machine_processes()
    }

    fn boot_unix(&mut self) -> f64 {
        self.inner.boot_unix()
    }
}
