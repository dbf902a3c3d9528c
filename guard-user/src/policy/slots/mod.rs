//! Heavy-command slots, the pure rules (docs/configuration.md `slots`, docs/architecture.md): which
//! process trees hold a slot, which wait, in what order, and when each one starts. No kernel, no
//! file, no clock: the pump feeds it the account's events and the classifier's verdicts, with
//! the monotonic time, and carries out the [`Action`]s it returns (`daemon::slots`).
//!
//! # Trees
//! A *tree* is the process tree of one exec, stamped at fork like the session lineage: a child
//! joins the tree its parent is in, whatever it does afterwards (`setsid`, reparenting, exec, a
//! rename). Every exec of the account outside a slot's tree opens a *pending* tree at once (what
//! it forks before its command line is classified is already its own), and is classified off
//! the pump: its command line against every slot's `commands` (and `excludeCommands`, which
//! never wait). A tree whose exec matches a slot is a *slot tree*: it holds the slot, or waits
//! for it (`queue`), until its last process exits. Anything else dissolves into the tree it was
//! forked in. An exec inside a slot tree never opens one (a holder's own `make -j` or `cargo`
//! never waits for a slot its parent holds: no deadlock), and neither does one whose name is in
//! `excludes`.
//!
//! # Order
//! Waiting trees start first come, first served, per slot, when a holder ends. A waiting tree is
//! let go early when `maxWait` passed (`SLOT_TIMEOUT`), when a signal waits for one of its
//! processes (its parent wants it gone: it must be free to act on it), when its slot is turned
//! off, or when the daemon stops. A tree let go early holds the slot like any other (it runs),
//! so the slot may hold more than `max` for a while; nothing waits for ever.
//!
//! # Bounds
//! Everything here is filled by the account's forks and execs: [`Caps`]. At a cap the rules fail
//! open: a process without a node is in no tree (it never waits), an exec that cannot be
//! classified is no slot tree, and a slot tree over the waiting cap runs at once.
use std::collections::{HashMap, HashSet, VecDeque};

use crate::{
    comm::Comm,
    config::{Slot, SlotMode},
    event::{Event, ProcId, ProcState, StateKind},
    log::Line,
};

mod queue;

/// A tree's number, unique for the life of the book (never reused).
pub type TreeId = u64;

/// The caps (docs/architecture.md, Bounds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Processes with a node (members of a tree).
    pub nodes: usize,
    /// Trees waiting for their classification.
    pub pending: usize,
    /// Trees waiting for a slot, all slots together.
    pub waiting: usize,
}

impl Caps {
    /// 8,192 nodes: only the members of slot trees and of trees not yet classified have one,
    /// and at most one tree each, ~140 bytes a node with its tree (a heavy command's tree is a
    /// few hundred processes); 2,048 execs in flight to the classifier (its queue); 256 waiting
    /// trees, each a few frozen processes. At most 1.2 MiB in all (docs/architecture.md, Bounds).
    pub const DAEMON: Caps = Caps { nodes: 8_192, pending: 2_048, waiting: 256 };
}

/// What the classifier said about one exec's command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It matches the `commands` of the slot of this name (in the config the classifier had)
    /// and no `excludeCommands` pattern.
    Slot(String),
    /// No slot's pattern, an `excludeCommands` pattern, a command line gone, too long or not
    /// decided within the matcher's bounds: not a slot tree (it never waits).
    Other,
}

/// What the daemon does for the rules.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Read this exec's command line and answer [`SlotBook::verdict`] with `seq`.
    Classify { tree: TreeId, seq: u32, process: ProcState },
    /// Freeze these processes: the tree waits. `line` (`SLOT_WAIT`) once they are held.
    Hold { tree: TreeId, procs: Vec<ProcId>, line: Line },
    /// Freeze these too: they joined a waiting tree.
    HoldMore { tree: TreeId, procs: Vec<ProcId> },
    /// Thaw the tree: it starts (`line`: `SLOT_START` or `SLOT_TIMEOUT`), or, without a line,
    /// it is gone and what was held for it is forgotten.
    Release { tree: TreeId, line: Option<Line> },
    /// A line and nothing else (`SLOT_START reason=free`, `SLOT_WAIT mode=report`, a cap).
    Log(Line),
}

/// One slot's rules, as the book uses them.
#[derive(Clone, Debug, PartialEq)]
struct Rule {
    name: String,
    max: u32,
    max_wait: f64,
    queue: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Stage {
    Pending,
    Holding { slot: usize, since: f64 },
    Waiting { slot: usize, since: f64 },
}

#[derive(Clone, Debug)]
struct Tree {
    head: ProcState,
    stage: Stage,
    /// The tree it was forked in (a pending one dissolves into it).
    parent: Option<TreeId>,
    /// The head's latest exec: a verdict about an older one is stale unless it names a slot.
    seq: u32,
    members: HashSet<u32>,
}

/// Counts since the daemon started, for status and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SlotTotals {
    /// Trees that waited (queue mode) or would have (report mode).
    pub waits: u64,
    /// Trees `maxWait` let go.
    pub timeouts: u64,
    /// Seconds trees spent waiting, all of them.
    pub wait_secs: f64,
    /// Execs not classified (the pending cap), processes without a node, slot trees run at once
    /// because the waiting cap was reached.
    pub unclassified: u64,
    pub untracked: u64,
    pub over_cap: u64,
}

/// One tree as `status` shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct TreeRow {
    pub head: ProcState,
    /// On the monotonic clock: since it holds, or since it waits.
    pub since: f64,
    pub processes: usize,
}

/// One slot as `status` shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct SlotRow {
    pub name: String,
    pub max: u32,
    pub max_wait_secs: f64,
    pub mode: &'static str,
    pub holders: Vec<TreeRow>,
    /// First in line first.
    pub waiting: Vec<TreeRow>,
}

/// The book as the tick's status sees it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SlotsView {
    pub slots: Vec<SlotRow>,
    pub pending: usize,
    pub nodes: usize,
    pub totals: SlotTotals,
}

/// See the module doc.
#[derive(Clone, Debug)]
pub struct SlotBook {
    uid: u32,
    ignore_pid: Option<u32>,
    caps: Caps,
    rules: Vec<Rule>,
    excludes: Vec<String>,
    /// pid → (start time, tree).
    nodes: HashMap<u32, (u64, TreeId)>,
    trees: HashMap<TreeId, Tree>,
    queues: Vec<VecDeque<TreeId>>,
    holders: Vec<usize>,
    next_id: TreeId,
    pending: usize,
    waiting: usize,
    totals: SlotTotals,
    /// `WARN slots_cap` said once per cap.
    capped: HashSet<&'static str>,
}

impl SlotBook {
    /// The book of account `uid` (`ignore_pid`: the daemon itself), with no slot yet.
    pub fn new(uid: u32, ignore_pid: Option<u32>, caps: Caps) -> SlotBook {
        SlotBook {
            uid,
            ignore_pid,
            caps,
            rules: Vec::new(),
            excludes: Vec::new(),
            nodes: HashMap::new(),
            trees: HashMap::new(),
            queues: Vec::new(),
            holders: Vec::new(),
            next_id: 1,
            pending: 0,
            waiting: 0,
            totals: SlotTotals::default(),
            capped: HashSet::new(),
        }
    }

    /// Whether any slot is configured (off: the book holds nothing and costs nothing).
    pub fn is_on(&self) -> bool {
        !self.rules.is_empty()
    }

    fn mine(&self, s: &ProcState) -> bool {
        s.euid == self.uid && Some(s.id.pid) != self.ignore_pid
    }

    /// A config's slots (`dry_run`: every slot reports only) and `excludes`. A slot that is gone,
    /// or that now only reports, lets its waiting trees go (`reason=config`); a larger `max`
    /// starts the next in line. With no slot at all, everything is forgotten.
    pub fn configure(&mut self, slots: &[Slot], excludes: &[String], dry_run: bool, now: f64) -> Vec<Action> {
        let rules: Vec<Rule> = slots
            .iter()
            .map(|s| Rule {
                name: s.name.clone(),
                max: s.max,
                max_wait: s.max_wait.as_secs_f64(),
                queue: s.mode == SlotMode::Queue && !dry_run,
            })
            .collect();
        self.excludes = excludes.to_vec();
        if rules == self.rules {
            return Vec::new();
        }
        let mut out = Vec::new();
        let index: HashMap<&str, usize> = rules.iter().enumerate().map(|(i, r)| (r.name.as_str(), i)).collect();
        let mut queues = vec![VecDeque::new(); rules.len()];
        let mut holders = vec![0; rules.len()];
        // Waiting trees keep their order in their slot (queues are walked in order).
        let old_order: Vec<TreeId> = self.queues.iter().flatten().copied().collect();
        let ids: Vec<TreeId> = self.trees.keys().copied().collect();
        for id in ids {
            let stage = self.trees[&id].stage;
            let (old, waiting) = match stage {
                Stage::Pending => continue,
                Stage::Holding { slot, .. } => (slot, false),
                Stage::Waiting { slot, .. } => (slot, true),
            };
            let new = index.get(self.rules[old].name.as_str()).copied();
            match (new, waiting) {
                (Some(n), false) => {
                    holders[n] += 1;
                    self.set_slot(id, n);
                }
                (Some(n), true) if rules[n].queue => self.set_slot(id, n),
                (_, true) => {
                    self.waiting -= 1;
                    out.push(self.start(id, old, now, "config"));
                    match new {
                        Some(n) => {
                            holders[n] += 1;
                            self.trees.get_mut(&id).expect("present").stage = Stage::Holding { slot: n, since: now };
                        }
                        None => self.forget(id),
                    }
                }
                (None, false) => self.forget(id),
            }
        }
        for id in old_order {
            if let Some(Stage::Waiting { slot, .. }) = self.trees.get(&id).map(|t| t.stage) {
                queues[slot].push_back(id);
            }
        }
        self.rules = rules;
        self.queues = queues;
        self.holders = holders;
        if self.rules.is_empty() {
            let keep = self.totals;
            *self = SlotBook { totals: keep, ..SlotBook::new(self.uid, self.ignore_pid, self.caps) };
            return out;
        }
        for slot in 0..self.rules.len() {
            out.extend(self.start_next(slot, now));
        }
        out
    }

    fn set_slot(&mut self, id: TreeId, slot: usize) {
        let t = self.trees.get_mut(&id).expect("present");
        t.stage = match t.stage {
            Stage::Holding { since, .. } => Stage::Holding { slot, since },
            Stage::Waiting { since, .. } => Stage::Waiting { slot, since },
            Stage::Pending => Stage::Pending,
        };
    }

    /// A tree leaves the book with its nodes (its slot is gone).
    fn forget(&mut self, id: TreeId) {
        if let Some(t) = self.trees.remove(&id) {
            for pid in t.members {
                self.nodes.remove(&pid);
            }
        }
    }

    /// One kernel event (after the table applied it).
    pub fn on_event(&mut self, event: &Event, now: f64) -> Vec<Action> {
        if !self.is_on() {
            return Vec::new();
        }
        match *event {
            Event::Fork { child, parent_pid } => self.fork(child, parent_pid, now),
            Event::State { kind: StateKind::Exec, state } => self.exec(state, now),
            Event::State { state, .. } => {
                self.drop_stale(state.id, now).into_iter().chain(self.left(state, now)).collect()
            }
            Event::Exit(id) => self.gone(id, now),
        }
    }

    /// A state of another account: the process left this one (it is in no tree of it any more).
    fn left(&mut self, s: ProcState, now: f64) -> Vec<Action> {
        if self.mine(&s) {
            Vec::new()
        } else {
            self.gone(s.id, now)
        }
    }

    /// A node holding `id`'s pid with another start time is a process whose exit was lost.
    fn drop_stale(&mut self, id: ProcId, now: f64) -> Vec<Action> {
        match self.nodes.get(&id.pid) {
            Some(&(start, _)) if start != id.start_ticks => self.gone(ProcId { pid: id.pid, start_ticks: start }, now),
            _ => Vec::new(),
        }
    }

    fn fork(&mut self, child: ProcState, parent_pid: u32, now: f64) -> Vec<Action> {
        let mut out = self.drop_stale(child.id, now);
        if !self.mine(&child) {
            return out;
        }
        let Some(&(_, tree)) = self.nodes.get(&parent_pid) else { return out };
        if self.join(child.id, tree) {
            if let Some(Stage::Waiting { .. }) = self.trees.get(&tree).map(|t| t.stage) {
                out.push(Action::HoldMore { tree, procs: vec![child.id] });
            }
        }
        out
    }

    /// Makes `id` a member of `tree`; at the node cap it stays in no tree (it never waits).
    fn join(&mut self, id: ProcId, tree: TreeId) -> bool {
        if self.nodes.len() >= self.caps.nodes && !self.nodes.contains_key(&id.pid) {
            self.totals.untracked += 1;
            return false;
        }
        let Some(t) = self.trees.get_mut(&tree) else { return false };
        t.members.insert(id.pid);
        self.nodes.insert(id.pid, (id.start_ticks, tree));
        true
    }

    fn exec(&mut self, s: ProcState, now: f64) -> Vec<Action> {
        let mut out = self.drop_stale(s.id, now);
        if !self.mine(&s) {
            out.extend(self.gone(s.id, now));
            return out;
        }
        let inside = self.nodes.get(&s.id.pid).map(|&(_, t)| t);
        if let Some(id) = inside {
            let t = self.trees.get_mut(&id).expect("a node's tree exists");
            match t.stage {
                // Inside a slot tree: part of it, never a new one.
                Stage::Holding { .. } | Stage::Waiting { .. } => return out,
                // The head runs another program before its verdict: ask again. A verdict that
                // names a slot still counts for the tree (`sh -c 'exec cargo build'` and
                // `npm` through `env node` both match at one of their execs).
                Stage::Pending if t.head.id == s.id => {
                    t.seq += 1;
                    t.head = s;
                    out.push(Action::Classify { tree: id, seq: t.seq, process: s });
                    return out;
                }
                Stage::Pending => {
                    t.members.remove(&s.id.pid);
                    self.nodes.remove(&s.id.pid);
                }
            }
        }
        if self.pending >= self.caps.pending {
            self.totals.unclassified += 1;
            out.extend(self.cap("pending", self.caps.pending));
            // It stays where it was forked (a member of a pending tree goes on as one).
            if let Some(parent) = inside {
                self.join(s.id, parent);
            }
            return out;
        }
        let id = self.next_id;
        self.next_id += 1;
        let tree = Tree { head: s, stage: Stage::Pending, parent: inside, seq: 0, members: HashSet::new() };
        self.trees.insert(id, tree);
        self.pending += 1;
        if self.join(s.id, id) {
            out.push(Action::Classify { tree: id, seq: 0, process: s });
        } else {
            self.trees.remove(&id);
            self.pending -= 1;
        }
        out
    }

    /// The process `id` exited or left the account.
    fn gone(&mut self, id: ProcId, now: f64) -> Vec<Action> {
        match self.nodes.get(&id.pid) {
            Some(&(start, tree)) if start == id.start_ticks => {
                self.nodes.remove(&id.pid);
                let Some(t) = self.trees.get_mut(&tree) else { return Vec::new() };
                t.members.remove(&id.pid);
                if t.members.is_empty() {
                    return self.ended(tree, now);
                }
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    /// The last process of `id` is gone.
    fn ended(&mut self, id: TreeId, now: f64) -> Vec<Action> {
        let Some(t) = self.trees.remove(&id) else { return Vec::new() };
        match t.stage {
            Stage::Pending => {
                self.pending -= 1;
                Vec::new()
            }
            Stage::Holding { slot, .. } => {
                self.holders[slot] -= 1;
                self.start_next(slot, now)
            }
            Stage::Waiting { slot, since } => {
                self.queues[slot].retain(|&w| w != id);
                self.waiting -= 1;
                self.totals.wait_secs += (now - since).max(0.0);
                vec![Action::Release { tree: id, line: None }]
            }
        }
    }
}
