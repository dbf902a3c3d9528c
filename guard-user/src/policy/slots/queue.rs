//! The queue half of [`SlotBook`]: verdicts make slot trees, which hold or wait; holders' ends,
//! `maxWait`, signals and a stop start the waiting ones; the view `status` shows.
use super::*;

impl SlotBook {
    /// The classifier's answer for `tree`'s exec number `seq`, whose name was `comm` (an exec
    /// under a name in `excludes` never waits).
    pub fn verdict(&mut self, tree: TreeId, seq: u32, comm: Comm, verdict: &Verdict, now: f64) -> Vec<Action> {
        let Some(t) = self.trees.get(&tree) else { return Vec::new() };
        if t.stage != Stage::Pending {
            return Vec::new();
        }
        let named = match verdict {
            Verdict::Slot(name) => self.rules.iter().position(|r| r.name == *name),
            Verdict::Other => None,
        };
        let slot = match named {
            Some(s) if !self.is_excluded(&comm) => Some(s),
            // A newer exec of the head is still to be answered: it decides.
            _ if seq != t.seq => return Vec::new(),
            _ => None,
        };
        self.pending -= 1;
        let parent = t.parent;
        let Some(slot) = slot else {
            // Its processes go back to the tree it was forked in: held too if that one waits.
            return self.dissolve(tree, parent);
        };
        // A matching exec inside a slot tree (through a pending one) is part of that tree.
        if let Some(outer) = self.slot_ancestor(parent) {
            return self.dissolve(tree, Some(outer));
        }
        self.decide(tree, slot, now)
    }

    pub(super) fn is_excluded(&self, name: &Comm) -> bool {
        self.excludes.iter().any(|e| name.eq_ignore_case(e))
    }

    /// The nearest slot tree among `from` and the trees it was forked in.
    pub(super) fn slot_ancestor(&self, mut from: Option<TreeId>) -> Option<TreeId> {
        while let Some(id) = from {
            let t = self.trees.get(&id)?;
            if t.stage != Stage::Pending {
                return Some(id);
            }
            from = t.parent;
        }
        None
    }

    /// `tree` is no slot tree: its members go to `into` (or to no tree).
    pub(super) fn dissolve(&mut self, tree: TreeId, into: Option<TreeId>) -> Vec<Action> {
        let Some(t) = self.trees.remove(&tree) else { return Vec::new() };
        let into = into.filter(|i| self.trees.contains_key(i));
        let mut moved = Vec::new();
        for pid in t.members {
            let Some(&(start, _)) = self.nodes.get(&pid) else { continue };
            self.nodes.remove(&pid);
            if let Some(i) = into {
                let id = ProcId { pid, start_ticks: start };
                if self.join(id, i) {
                    moved.push(id);
                }
            }
        }
        // Pending trees forked in this one now belong to where it went.
        for other in self.trees.values_mut() {
            if other.parent == Some(tree) {
                other.parent = into;
            }
        }
        match into.and_then(|i| self.trees.get(&i)).map(|t| t.stage) {
            Some(Stage::Waiting { .. }) if !moved.is_empty() => {
                vec![Action::HoldMore { tree: into.expect("some"), procs: moved }]
            }
            _ => Vec::new(),
        }
    }

    /// A fresh slot tree: it holds, reports that it would wait, or waits.
    pub(super) fn decide(&mut self, tree: TreeId, slot: usize, now: f64) -> Vec<Action> {
        let rule = self.rules[slot].clone();
        let head = self.trees[&tree].head;
        if (self.holders[slot] as u64) < u64::from(rule.max) {
            self.hold(tree, slot, now);
            return vec![Action::Log(start_line(&rule, head.id.pid, 0.0, "free"))];
        }
        self.totals.waits += 1;
        if !rule.queue {
            self.hold(tree, slot, now);
            let position = (self.holders[slot] as u64 - u64::from(rule.max)) as u32;
            let line =
                Line::SlotWait { slot: rule.name.clone(), pid: head.id.pid, name: head.comm, position, mode: "report" };
            return vec![Action::Log(line)];
        }
        if self.waiting >= self.caps.waiting {
            self.totals.over_cap += 1;
            self.hold(tree, slot, now);
            let mut out: Vec<Action> = self.cap("waiting", self.caps.waiting).into_iter().collect();
            out.push(Action::Log(start_line(&self.rules[slot], head.id.pid, 0.0, "cap")));
            return out;
        }
        let t = self.trees.get_mut(&tree).expect("present");
        t.stage = Stage::Waiting { slot, since: now };
        self.waiting += 1;
        self.queues[slot].push_back(tree);
        let position = self.queues[slot].len() as u32;
        let procs = self.members(tree);
        let line = Line::SlotWait {
            slot: self.rules[slot].name.clone(),
            pid: head.id.pid,
            name: head.comm,
            position,
            mode: "queue",
        };
        vec![Action::Hold { tree, procs, line }]
    }

    pub(super) fn hold(&mut self, tree: TreeId, slot: usize, now: f64) {
        self.trees.get_mut(&tree).expect("present").stage = Stage::Holding { slot, since: now };
        self.holders[slot] += 1;
    }

    pub(super) fn members(&self, tree: TreeId) -> Vec<ProcId> {
        let mut v: Vec<ProcId> = self.trees[&tree]
            .members
            .iter()
            .filter_map(|&pid| self.nodes.get(&pid).map(|&(start, _)| ProcId { pid, start_ticks: start }))
            .collect();
        v.sort();
        v
    }

    /// `WARN slots_cap what= limit=`, once per cap.
    pub(super) fn cap(&mut self, what: &'static str, limit: usize) -> Option<Action> {
        self.capped.insert(what).then(|| {
            Action::Log(Line::Warn(
                crate::log::Notice::new(crate::log::What::SlotsCap).with("what", what).with("limit", limit),
            ))
        })
    }

    /// While a slot has room, its first waiting tree starts (`reason=turn`).
    pub(super) fn start_next(&mut self, slot: usize, now: f64) -> Vec<Action> {
        let mut out = Vec::new();
        while (self.holders[slot] as u64) < u64::from(self.rules[slot].max) {
            let Some(id) = self.queues[slot].pop_front() else { break };
            self.waiting -= 1;
            out.push(self.start(id, slot, now, "turn"));
            self.hold(id, slot, now);
        }
        out
    }

    /// The release of waiting tree `id` (already out of its queue), with its line.
    pub(super) fn start(&mut self, id: TreeId, slot: usize, now: f64, reason: &'static str) -> Action {
        let t = &self.trees[&id];
        let since = match t.stage {
            Stage::Waiting { since, .. } => since,
            _ => now,
        };
        let pid = t.head.id.pid;
        let waited = (now - since).max(0.0);
        self.totals.wait_secs += waited;
        let line = if reason == "timeout" {
            self.totals.timeouts += 1;
            Line::SlotTimeout { slot: self.rules[slot].name.clone(), pid, waited_secs: waited as u64 }
        } else {
            start_line(&self.rules[slot], pid, waited, reason)
        };
        Action::Release { tree: id, line: Some(line) }
    }

    /// A waiting tree leaves its queue and holds the slot (it runs), for `reason`.
    pub(super) fn let_go(&mut self, id: TreeId, now: f64, reason: &'static str) -> Vec<Action> {
        let Some(Stage::Waiting { slot, .. }) = self.trees.get(&id).map(|t| t.stage) else { return Vec::new() };
        self.queues[slot].retain(|&w| w != id);
        self.waiting -= 1;
        let action = self.start(id, slot, now, reason);
        self.hold(id, slot, now);
        vec![action]
    }

    /// A signal waits for a process of waiting tree `id`: let it go, so it can act on it.
    pub fn signalled(&mut self, id: TreeId, now: f64) -> Vec<Action> {
        self.let_go(id, now, "signal")
    }

    /// The daemon could not hold waiting tree `id` (its line said why): it runs.
    pub fn not_held(&mut self, id: TreeId, now: f64) -> Vec<Action> {
        let Some(Stage::Waiting { slot, .. }) = self.trees.get(&id).map(|t| t.stage) else { return Vec::new() };
        self.queues[slot].retain(|&w| w != id);
        self.waiting -= 1;
        self.hold(id, slot, now);
        Vec::new()
    }

    /// `maxWait`: every waiting tree whose time is up is let go (`SLOT_TIMEOUT`).
    pub fn on_time(&mut self, now: f64) -> Vec<Action> {
        let due: Vec<TreeId> = self
            .queues
            .iter()
            .enumerate()
            .flat_map(|(slot, q)| q.iter().map(move |&id| (slot, id)))
            .filter(|&(slot, id)| match self.trees[&id].stage {
                Stage::Waiting { since, .. } => now >= since + self.rules[slot].max_wait,
                _ => false,
            })
            .map(|(_, id)| id)
            .collect();
        due.into_iter().flat_map(|id| self.let_go(id, now, "timeout")).collect()
    }

    /// When the next `maxWait` falls due (monotonic), if anything waits.
    pub fn next_deadline(&self) -> Option<f64> {
        self.queues
            .iter()
            .enumerate()
            .filter_map(|(slot, q)| {
                let since = match self.trees[q.front()?].stage {
                    Stage::Waiting { since, .. } => since,
                    _ => return None,
                };
                Some(since + self.rules[slot].max_wait)
            })
            .reduce(f64::min)
    }

    /// Every waiting tree, with the reason it goes (the daemon stops: `stop`).
    pub fn release_all(&mut self, now: f64, reason: &'static str) -> Vec<Action> {
        let ids: Vec<TreeId> = self.queues.iter().flatten().copied().collect();
        ids.into_iter().flat_map(|id| self.let_go(id, now, reason)).collect()
    }

    /// A rebuild: processes no longer live (their exit was lost) leave their trees.
    pub fn reconcile(&mut self, live: &dyn Fn(ProcId) -> bool, now: f64) -> Vec<Action> {
        let dead: Vec<ProcId> = self
            .nodes
            .iter()
            .map(|(&pid, &(start, _))| ProcId { pid, start_ticks: start })
            .filter(|id| !live(*id))
            .collect();
        dead.into_iter().flat_map(|id| self.gone(id, now)).collect()
    }

    /// The slots for `status`.
    pub fn view(&self) -> SlotsView {
        let row = |id: &TreeId| {
            let t = &self.trees[id];
            let since = match t.stage {
                Stage::Holding { since, .. } | Stage::Waiting { since, .. } => since,
                Stage::Pending => 0.0,
            };
            TreeRow { head: t.head, since, processes: t.members.len() }
        };
        let slots = self
            .rules
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut holders: Vec<TreeId> = self
                    .trees
                    .iter()
                    .filter(|(_, t)| matches!(t.stage, Stage::Holding { slot, .. } if slot == i))
                    .map(|(&id, _)| id)
                    .collect();
                holders.sort_unstable();
                SlotRow {
                    name: r.name.clone(),
                    max: r.max,
                    max_wait_secs: r.max_wait,
                    mode: if r.queue { "queue" } else { "report" },
                    holders: holders.iter().map(row).collect(),
                    waiting: self.queues[i].iter().map(row).collect(),
                }
            })
            .collect();
        SlotsView { slots, pending: self.pending, nodes: self.nodes.len(), totals: self.totals }
    }
}

fn start_line(rule: &Rule, pid: u32, waited: f64, reason: &'static str) -> Line {
    Line::SlotStart { slot: rule.name.clone(), pid, waited_secs: waited as u64, reason }
}
