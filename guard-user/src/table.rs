//! The live process table: the processes of one account, and their counts per name kept
//! incrementally as events arrive, so a tick never rescans /proc.
//!
//! Every event carries a process's full state, keyed by its identity (pid + start time): an
//! upsert replaces whatever held the pid before (a recycled pid), an exit removes the entry only
//! if the start time matches. So replaying, in order, every event recorded since a scan began
//! over that scan's snapshot gives the true table (the bootstrap and resync argument, see
//! `daemon::Rebuild`).
//!
//! The table holds its account only ([`Scope`]): the kernel reports only that account's
//! processes and those entering or leaving it, and a state of another account is the news that
//! the pid left (whatever held it is no longer the account's). Another account's processes,
//! however many, cost the table nothing.
use std::collections::{BTreeMap, HashMap};

use crate::{
    comm::Comm,
    event::{Event, ProcId, ProcState},
};

/// The account's slice of the live table, as the pump hands it to a tick.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AccountView {
    /// Live processes of the account per name.
    pub counts: Vec<(Comm, u32)>,
    /// The processes of every name whose count reached the pump's `min_count`, sorted by pid:
    /// the ones a tick may classify and end.
    pub members: BTreeMap<Comm, Vec<ProcState>>,
}

impl AccountView {
    /// The account's live processes.
    pub fn tracked_account(&self) -> u64 {
        self.counts.iter().map(|(_, n)| u64::from(*n)).sum()
    }
}

/// Which processes a table holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scope {
    /// The account (effective uid) whose processes the table holds.
    pub account: u32,
    /// The daemon's own pid: never counted (docs/architecture.md).
    pub ignore_pid: Option<u32>,
}

impl Scope {
    /// The account's processes, the daemon's own included (tools, tests).
    #[cfg(any(test, feature = "testing"))]
    pub fn account(account: u32) -> Scope {
        Scope { account, ignore_pid: None }
    }
}

/// One tracked process: 24 bytes beside its pid key (what one more process costs the daemon:
/// docs/BENCH.md). Its euid is the table's account.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    start_ticks: u64,
    comm: Comm,
}

#[derive(Clone, Debug)]
pub struct ProcessTable {
    scope: Scope,
    procs: HashMap<u32, Entry>,
    /// name → live processes. Entries reaching zero are removed.
    counts: HashMap<Comm, u32>,
}

impl PartialEq for ProcessTable {
    fn eq(&self, other: &Self) -> bool {
        self.scope.account == other.scope.account && self.procs == other.procs
    }
}

impl ProcessTable {
    pub fn new(scope: Scope) -> ProcessTable {
        ProcessTable { scope, procs: HashMap::new(), counts: HashMap::new() }
    }

    /// A table holding the processes of `procs` that are in its scope.
    pub fn from_snapshot(procs: impl IntoIterator<Item = ProcState>, scope: Scope) -> ProcessTable {
        let mut t = ProcessTable::new(scope);
        for p in procs {
            t.upsert(p);
        }
        t
    }

    #[cfg(any(test, feature = "testing"))]
    pub fn scope(&self) -> Scope {
        self.scope
    }

    pub fn apply(&mut self, event: &Event) {
        match *event {
            Event::Fork { child, .. } => self.upsert(child),
            Event::State { state, .. } => self.upsert(state),
            Event::Exit(id) => self.remove(id),
        }
    }

    /// `s` is the current state of its pid: the account's process takes the pid's entry; a
    /// process of another account means whatever held the pid is not the account's any more.
    pub fn upsert(&mut self, s: ProcState) {
        if Some(s.id.pid) == self.scope.ignore_pid {
            return;
        }
        if s.euid != self.scope.account {
            if let Some(old) = self.procs.remove(&s.id.pid) {
                self.uncount(old.comm);
            }
            return;
        }
        let new = Entry { start_ticks: s.id.start_ticks, comm: s.comm };
        if let Some(old) = self.procs.insert(s.id.pid, new) {
            if old == new {
                return;
            }
            self.uncount(old.comm);
        }
        *self.counts.entry(s.comm).or_insert(0) += 1;
    }

    pub fn remove(&mut self, id: ProcId) {
        if let Some(old) = self.procs.get(&id.pid).copied() {
            if old.start_ticks == id.start_ticks {
                self.procs.remove(&id.pid);
                self.uncount(old.comm);
            }
        }
    }

    fn uncount(&mut self, comm: Comm) {
        if let Some(n) = self.counts.get_mut(&comm) {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(&comm);
            }
        }
    }

    fn state(&self, pid: u32, e: &Entry) -> ProcState {
        ProcState { id: ProcId { pid, start_ticks: e.start_ticks }, euid: self.scope.account, comm: e.comm }
    }

    /// Live processes per name.
    pub fn counts(&self) -> Vec<(Comm, u32)> {
        self.counts.iter().map(|(c, n)| (*c, *n)).collect()
    }

    pub fn count(&self, name: &Comm) -> u32 {
        self.counts.get(name).copied().unwrap_or(0)
    }

    /// The account's view for a tick: its counts, and the processes of its names with at least
    /// `min_count` live processes (one pass over the table), each list sorted by pid.
    pub fn view(&self, min_count: u32) -> AccountView {
        let mut members: BTreeMap<Comm, Vec<ProcState>> = BTreeMap::new();
        if self.counts.values().any(|&n| n >= min_count) {
            for (&pid, e) in &self.procs {
                if self.count(&e.comm) >= min_count {
                    members.entry(e.comm).or_default().push(self.state(pid, e));
                }
            }
        }
        for list in members.values_mut() {
            list.sort_by_key(|p| p.id.pid);
        }
        AccountView { counts: self.counts(), members }
    }

    /// The live process holding `pid`, if any.
    pub fn get(&self, pid: u32) -> Option<ProcState> {
        self.procs.get(&pid).map(|e| self.state(pid, e))
    }

    /// Every process, sorted by pid.
    pub fn processes(&self) -> Vec<ProcState> {
        let mut v: Vec<ProcState> = self.procs.iter().map(|(&pid, e)| self.state(pid, e)).collect();
        v.sort_by_key(|p| p.id.pid);
        v
    }

    #[cfg(any(test, feature = "testing"))]
    pub fn len(&self) -> usize {
        self.procs.len()
    }

    #[cfg(any(test, feature = "testing"))]
    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    /// How many processes differ from `other` (missing on either side, or a different state).
    pub fn difference(&self, other: &ProcessTable) -> usize {
        let missing = other.procs.keys().filter(|k| !self.procs.contains_key(k)).count();
        let differ = self.procs.iter().filter(|(k, e)| other.procs.get(k) != Some(e)).count();
        missing + differ
    }

    /// The internal invariant: counts equal a recount of the processes.
    #[cfg(test)]
    fn counts_are_consistent(&self) -> bool {
        let recount = ProcessTable::from_snapshot(self.processes(), self.scope);
        recount.counts == self.counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::StateKind;

    const UID: u32 = 1000;

    fn st(pid: u32, start: u64, euid: u32, name: &str) -> ProcState {
        ProcState { id: ProcId { pid, start_ticks: start }, euid, comm: Comm::new(name.as_bytes()) }
    }

    fn n(name: &str) -> Comm {
        Comm::new(name.as_bytes())
    }

    fn table() -> ProcessTable {
        ProcessTable::new(Scope::account(UID))
    }

    #[test]
    fn fork_without_exec_keeps_the_parents_name_and_exec_renames() {
        let mut t = table();
        t.apply(&Event::State { kind: StateKind::Exec, state: st(10, 1, UID, "agentihooks") });
        t.apply(&Event::Fork { child: st(11, 2, UID, "agentihooks"), parent_pid: 10 });
        assert_eq!(t.count(&n("agentihooks")), 2);
        t.apply(&Event::State { kind: StateKind::Exec, state: st(11, 2, UID, "sleep") });
        assert_eq!(t.count(&n("agentihooks")), 1);
        assert_eq!(t.count(&n("sleep")), 1);
        assert!(t.counts_are_consistent());
    }

    #[test]
    fn an_exit_for_a_recycled_pid_does_not_remove_the_new_process() {
        let mut t = table();
        t.apply(&Event::Fork { child: st(10, 1, UID, "a"), parent_pid: 1 });
        t.apply(&Event::Fork { child: st(10, 5, UID, "b"), parent_pid: 1 }); // pid 10 reused
        t.apply(&Event::Exit(ProcId { pid: 10, start_ticks: 1 }));
        assert_eq!(t.count(&n("a")), 0);
        assert_eq!(t.count(&n("b")), 1);
        assert!(t.counts_are_consistent());
    }

    #[test]
    fn setuid_moves_a_process_into_and_out_of_the_account() {
        let mut t = table();
        t.apply(&Event::State { kind: StateKind::Exec, state: st(10, 1, 0, "worker") });
        assert!(t.is_empty(), "root's process is not the account's");
        t.apply(&Event::State { kind: StateKind::Setuid, state: st(10, 1, UID, "worker") });
        assert_eq!(t.count(&n("worker")), 1);
        t.apply(&Event::State { kind: StateKind::Setuid, state: st(10, 1, 0, "worker") });
        assert!(t.is_empty() && t.counts().is_empty(), "{t:?}");
    }

    #[test]
    fn a_state_of_another_account_drops_whatever_held_the_pid() {
        // An exec of a set-user-ID binary reported with the new euid, and a recycled pid now
        // held by another account's process: either way the entry is not the account's any more.
        let mut t = table();
        t.apply(&Event::State { kind: StateKind::Exec, state: st(10, 1, UID, "a") });
        t.apply(&Event::State { kind: StateKind::Exec, state: st(11, 1, UID, "b") });
        t.apply(&Event::State { kind: StateKind::Exec, state: st(10, 1, 0, "sudo") });
        t.apply(&Event::Fork { child: st(11, 9, 4242, "other"), parent_pid: 1 });
        assert!(t.is_empty(), "{t:?}");
        assert!(t.counts_are_consistent());
    }

    #[test]
    fn the_view_lists_the_members_of_names_at_the_count() {
        let mut t = table();
        for (pid, name, uid) in [(12, "pile", UID), (11, "pile", UID), (13, "lone", UID), (14, "pile", 1001)] {
            t.apply(&Event::State { kind: StateKind::Exec, state: st(pid, 1, uid, name) });
        }
        let v = t.view(2);
        assert_eq!(v.tracked_account(), 3);
        assert_eq!(v.members.keys().collect::<Vec<_>>(), vec![&n("pile")]);
        assert_eq!(v.members[&n("pile")].iter().map(|p| p.id.pid).collect::<Vec<_>>(), vec![11, 12]);
        assert!(v.members[&n("pile")].iter().all(|p| p.euid == UID));
    }

    #[test]
    fn the_daemon_itself_is_never_counted() {
        let mut t = ProcessTable::new(Scope { account: UID, ignore_pid: Some(77) });
        t.apply(&Event::State { kind: StateKind::Exec, state: st(77, 1, UID, "guard-user") });
        assert!(t.is_empty());
    }

    #[test]
    fn replaying_events_since_the_scan_over_the_snapshot_converges() {
        // Truth after the events: 10 renamed to c, 11 exited, 12 born, pid 13 recycled, 14
        // left the account, 15 entered it.
        let snapshot = vec![st(10, 1, UID, "c"), st(13, 9, UID, "new"), st(14, 2, 0, "su"), st(15, 3, UID, "in")];
        let events = vec![
            Event::State { kind: StateKind::Rename, state: st(10, 1, UID, "b") },
            Event::State { kind: StateKind::Rename, state: st(10, 1, UID, "c") },
            Event::Fork { child: st(11, 3, UID, "x"), parent_pid: 10 },
            Event::Exit(ProcId { pid: 11, start_ticks: 3 }),
            Event::Fork { child: st(12, 4, UID, "y"), parent_pid: 10 },
            Event::State { kind: StateKind::Exec, state: st(13, 2, UID, "old") },
            Event::Exit(ProcId { pid: 13, start_ticks: 2 }),
            Event::Fork { child: st(13, 9, UID, "new"), parent_pid: 10 },
            Event::State { kind: StateKind::Exec, state: st(14, 2, UID, "su") },
            Event::State { kind: StateKind::Setuid, state: st(14, 2, 0, "su") },
            Event::State { kind: StateKind::Setuid, state: st(15, 3, UID, "in") },
        ];
        let mut t = ProcessTable::from_snapshot(snapshot, Scope::account(UID));
        for e in &events {
            t.apply(e);
        }
        let truth = ProcessTable::from_snapshot(
            vec![st(10, 1, UID, "c"), st(12, 4, UID, "y"), st(13, 9, UID, "new"), st(15, 3, UID, "in")],
            Scope::account(UID),
        );
        assert_eq!(t, truth);
        assert_eq!(t.difference(&truth), 0);
        assert!(t.counts_are_consistent());
    }
}
