//! The live process table: every process on the machine, and per-(euid, name) counts kept
//! incrementally as events arrive, so a tick never rescans /proc.
//!
//! Every event carries a process's full state, keyed by its identity (pid + start time): an
//! upsert replaces whatever held the pid before (a recycled pid), an exit removes the entry only
//! if the start time matches. So replaying, in order, every event recorded since a /proc scan
//! began over that scan's snapshot gives the true table (the bootstrap and resync argument,
//! see `daemon::Rebuild`).
use std::collections::{BTreeMap, HashMap};

use crate::{
    comm::Comm,
    event::{Event, ProcId, ProcState},
    policy::AccountView,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    start_ticks: u64,
    euid: u32,
    comm: Comm,
}

#[derive(Clone, Debug, Default)]
pub struct ProcessTable {
    procs: HashMap<u32, Entry>,
    /// euid → name → live processes. Entries reaching zero are removed.
    counts: HashMap<u32, HashMap<Comm, u32>>,
    /// The daemon's own pid: never counted (docs/architecture.md).
    ignore_pid: Option<u32>,
    /// Events applied since creation (for status).
    pub applied: u64,
}

impl PartialEq for ProcessTable {
    fn eq(&self, other: &Self) -> bool {
        self.procs == other.procs
    }
}

impl ProcessTable {
    pub fn new(ignore_pid: Option<u32>) -> ProcessTable {
        ProcessTable { ignore_pid, ..Default::default() }
    }

    /// A table holding exactly `procs`.
    pub fn from_snapshot(procs: impl IntoIterator<Item = ProcState>, ignore_pid: Option<u32>) -> ProcessTable {
        let mut t = ProcessTable::new(ignore_pid);
        for p in procs {
            t.upsert(p);
        }
        t.applied = 0;
        t
    }

    pub fn apply(&mut self, event: &Event) {
        self.applied += 1;
        match *event {
            Event::Fork { child, .. } => self.upsert(child),
            Event::Exec(s) | Event::Rename(s) | Event::Setuid(s) => self.upsert(s),
            Event::Exit(id) => self.remove(id),
        }
    }

    pub fn upsert(&mut self, s: ProcState) {
        if Some(s.id.pid) == self.ignore_pid {
            return;
        }
        let new = Entry { start_ticks: s.id.start_ticks, euid: s.euid, comm: s.comm };
        if let Some(old) = self.procs.insert(s.id.pid, new) {
            if old == new {
                return;
            }
            self.uncount(old.euid, old.comm);
        }
        *self.counts.entry(s.euid).or_default().entry(s.comm).or_insert(0) += 1;
    }

    pub fn remove(&mut self, id: ProcId) {
        if let Some(old) = self.procs.get(&id.pid).copied() {
            if old.start_ticks == id.start_ticks {
                self.procs.remove(&id.pid);
                self.uncount(old.euid, old.comm);
            }
        }
    }

    fn uncount(&mut self, euid: u32, comm: Comm) {
        if let Some(names) = self.counts.get_mut(&euid) {
            if let Some(n) = names.get_mut(&comm) {
                *n -= 1;
                if *n == 0 {
                    names.remove(&comm);
                }
            }
            if names.is_empty() {
                self.counts.remove(&euid);
            }
        }
    }

    /// Live processes per name for one account.
    pub fn counts_for(&self, euid: u32) -> Vec<(Comm, u32)> {
        self.counts.get(&euid).map(|m| m.iter().map(|(c, n)| (*c, *n)).collect()).unwrap_or_default()
    }

    pub fn count(&self, euid: u32, name: &Comm) -> u32 {
        self.counts.get(&euid).and_then(|m| m.get(name)).copied().unwrap_or(0)
    }

    /// The account's view for a tick: its counts, and the processes of its names with at least
    /// `min_count` live processes (one pass over the table), each list sorted by pid.
    pub fn view(&self, euid: u32, min_count: u32) -> AccountView {
        let counts = self.counts_for(euid);
        let mut members: BTreeMap<Comm, Vec<ProcState>> = BTreeMap::new();
        if let Some(names) = self.counts.get(&euid) {
            for (&pid, e) in &self.procs {
                if e.euid == euid && names.get(&e.comm).is_some_and(|&n| n >= min_count) {
                    let p = ProcState { id: ProcId { pid, start_ticks: e.start_ticks }, euid, comm: e.comm };
                    members.entry(e.comm).or_default().push(p);
                }
            }
        }
        for list in members.values_mut() {
            list.sort_by_key(|p| p.id.pid);
        }
        AccountView { counts, members, tracked_total: self.procs.len() as u64 }
    }

    /// The live process holding `pid`, if any.
    pub fn get(&self, pid: u32) -> Option<ProcState> {
        let e = self.procs.get(&pid)?;
        Some(ProcState { id: ProcId { pid, start_ticks: e.start_ticks }, euid: e.euid, comm: e.comm })
    }

    /// The processes of one (account, name), sorted by pid.
    pub fn processes_of(&self, euid: u32, name: &Comm) -> Vec<ProcState> {
        let mut v: Vec<ProcState> = self
            .procs
            .iter()
            .filter(|(_, e)| e.euid == euid && e.comm == *name)
            .map(|(&pid, e)| ProcState { id: ProcId { pid, start_ticks: e.start_ticks }, euid: e.euid, comm: e.comm })
            .collect();
        v.sort_by_key(|p| p.id.pid);
        v
    }

    /// Every process, sorted by pid.
    pub fn processes(&self) -> Vec<ProcState> {
        let mut v: Vec<ProcState> = self
            .procs
            .iter()
            .map(|(&pid, e)| ProcState { id: ProcId { pid, start_ticks: e.start_ticks }, euid: e.euid, comm: e.comm })
            .collect();
        v.sort_by_key(|p| p.id.pid);
        v
    }

    pub fn len(&self) -> usize {
        self.procs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    /// How many processes differ from `other` (missing on either side, or a different state).
    pub fn difference(&self, other: &ProcessTable) -> usize {
        let missing = other.procs.keys().filter(|k| !self.procs.contains_key(k)).count();
        let differ = self.procs.iter().filter(|(k, e)| other.procs.get(k) != Some(e)).count();
        missing + differ
    }

    /// The internal invariant: counts equal a recount of the processes. For tests.
    pub fn counts_are_consistent(&self) -> bool {
        let recount = ProcessTable::from_snapshot(
            self.procs.iter().map(|(&pid, e)| ProcState {
                id: ProcId { pid, start_ticks: e.start_ticks },
                euid: e.euid,
                comm: e.comm,
            }),
            self.ignore_pid,
        );
        recount.counts == self.counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(pid: u32, start: u64, euid: u32, name: &str) -> ProcState {
        ProcState { id: ProcId { pid, start_ticks: start }, euid, comm: Comm::new(name.as_bytes()) }
    }

    fn n(name: &str) -> Comm {
        Comm::new(name.as_bytes())
    }

    #[test]
    fn fork_without_exec_keeps_the_parents_name_and_exec_renames() {
        let mut t = ProcessTable::new(None);
        t.apply(&Event::Exec(st(10, 1, 1000, "agentihooks")));
        t.apply(&Event::Fork { child: st(11, 2, 1000, "agentihooks"), parent_pid: 10 });
        assert_eq!(t.count(1000, &n("agentihooks")), 2);
        t.apply(&Event::Exec(st(11, 2, 1000, "sleep")));
        assert_eq!(t.count(1000, &n("agentihooks")), 1);
        assert_eq!(t.count(1000, &n("sleep")), 1);
        assert!(t.counts_are_consistent());
    }

    #[test]
    fn an_exit_for_a_recycled_pid_does_not_remove_the_new_process() {
        let mut t = ProcessTable::new(None);
        t.apply(&Event::Fork { child: st(10, 1, 1000, "a"), parent_pid: 1 });
        t.apply(&Event::Fork { child: st(10, 5, 1000, "b"), parent_pid: 1 }); // pid 10 reused
        t.apply(&Event::Exit(ProcId { pid: 10, start_ticks: 1 }));
        assert_eq!(t.count(1000, &n("a")), 0);
        assert_eq!(t.count(1000, &n("b")), 1);
        assert!(t.counts_are_consistent());
    }

    #[test]
    fn setuid_moves_a_process_between_accounts() {
        let mut t = ProcessTable::new(None);
        t.apply(&Event::Exec(st(10, 1, 0, "worker")));
        t.apply(&Event::Setuid(st(10, 1, 1000, "worker")));
        assert_eq!(t.count(0, &n("worker")), 0);
        assert_eq!(t.count(1000, &n("worker")), 1);
        assert!(t.counts_for(0).is_empty());
    }

    #[test]
    fn the_view_lists_the_members_of_names_at_the_count_only_for_the_account() {
        let mut t = ProcessTable::new(None);
        for (pid, name, uid) in [(12, "pile", 1000), (11, "pile", 1000), (13, "lone", 1000), (14, "pile", 1001)] {
            t.apply(&Event::Exec(st(pid, 1, uid, name)));
        }
        let v = t.view(1000, 2);
        assert_eq!(v.tracked_total, 4);
        assert_eq!(v.tracked_account(), 3);
        assert_eq!(v.members.keys().collect::<Vec<_>>(), vec![&n("pile")]);
        assert_eq!(v.members[&n("pile")].iter().map(|p| p.id.pid).collect::<Vec<_>>(), vec![11, 12]);
    }

    #[test]
    fn the_daemon_itself_is_never_counted() {
        let mut t = ProcessTable::new(Some(77));
        t.apply(&Event::Exec(st(77, 1, 1000, "guard-user")));
        assert!(t.is_empty());
    }

    #[test]
    fn replaying_events_since_the_scan_over_the_snapshot_converges() {
        // Truth after the events: 10 renamed to c, 11 exited, 12 born, pid 13 recycled.
        let snapshot = vec![st(10, 1, 1000, "c"), st(13, 9, 1000, "new")];
        let events = vec![
            Event::Rename(st(10, 1, 1000, "b")),
            Event::Rename(st(10, 1, 1000, "c")),
            Event::Fork { child: st(11, 3, 1000, "x"), parent_pid: 10 },
            Event::Exit(ProcId { pid: 11, start_ticks: 3 }),
            Event::Fork { child: st(12, 4, 1000, "y"), parent_pid: 10 },
            Event::Exec(st(13, 2, 1000, "old")),
            Event::Exit(ProcId { pid: 13, start_ticks: 2 }),
            Event::Fork { child: st(13, 9, 1000, "new"), parent_pid: 10 },
        ];
        let mut t = ProcessTable::from_snapshot(snapshot, None);
        for e in &events {
            t.apply(e);
        }
        let truth =
            ProcessTable::from_snapshot(vec![st(10, 1, 1000, "c"), st(12, 4, 1000, "y"), st(13, 9, 1000, "new")], None);
        assert_eq!(t, truth);
        assert_eq!(t.difference(&truth), 0);
        assert!(t.counts_are_consistent());
    }
}
