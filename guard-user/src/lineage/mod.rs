//! Session lineage (docs/configuration.md `sessions`, docs/architecture.md): for each process of
//! the account, the session it was forked into, kept from the kernel's fork events so that
//! nothing the process does afterwards (`setsid`, a double fork, reparenting to init or a
//! subreaper, exec, a rename) takes it out. Pure: the pump feeds it events and scans, the tick
//! reads a [`SessionsView`] and answers with [`LineageCmd`]s.
//!
//! # How membership is kept
//! Membership is stamped at fork: a child joins the session its parent opened, or else the one
//! its parent is in. Nothing walks parent links later, so no dead process is ever kept for the
//! sake of its descendants (the bound the issue asks for, "a dead intermediate is kept only while
//! it has live descendants", is met with zero).
//!
//! Whether a process is a root depends on its command line, which only the tick may read (a read
//! of `/proc/PID/cmdline` can block; the pump must not). So every exec of the account opens a
//! *pending* session at once, and what the process forks from then on is stamped into it. The
//! tick reads the command line, and [`LineageCmd::Classified`] either makes the session a root's
//! or dissolves it: its members go back to the session the process itself is in. A pending
//! session whose process exits or execs again before the tick is dissolved the same way (its
//! command line is gone, so it is not a root: fail safe). The root of a session stays its root
//! whatever it execs afterwards; a root that exits ends its session, which the tick settles
//! ([`LineageCmd::Settle`]) once it has dealt with the leftovers: what survives goes back to the
//! session the root was in (a nested root's leftovers belong to the outer session again).
//!
//! # Processes older than the lineage
//! When lineage starts (the first tick with `sessions`), after a rebuild and on every scan of the
//! `procfs` backend, a live process the lineage does not know is *adopted*: it opens a pending
//! session (its command line is classified like an exec's) and its session comes from its parent
//! link as `/proc` shows it then ([`Lineage::attach_parents`]), which reparenting may already
//! have erased. That is the documented limit for processes the daemon did not see forked.
//!
//! # Bounds
//! Everything here is filled by the account's forks and execs, so every structure has a cap
//! ([`Caps`]). At a cap the lineage fails safe: a process that cannot be given a node has no
//! session, and a process whose lineage is unknown is never reaped. Each cap reached is counted.
use std::collections::{HashMap, HashSet};

use crate::{
    event::{Event, ProcId, ProcState, StateKind},
    table::ProcessTable,
};

pub mod parents;
#[cfg(test)]
mod tests;

/// A session's number, unique for the life of the daemon (never reused, so a command about a
/// session that is gone cannot hit a newer one).
pub type SessionId = u64;

/// The caps on what the account can make the lineage hold (docs/architecture.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Processes with a node (members of a session, and processes whose exec is pending).
    pub nodes: usize,
    /// Pending sessions: execs whose command line the tick has not classified yet.
    pub pending: usize,
    /// Root sessions, live and ended-but-not-settled.
    pub sessions: usize,
    /// Members of one session.
    pub members: usize,
}

impl Caps {
    /// The daemon's caps: 65,536 nodes (~100 bytes each with their share of the sets, measured by
    /// `examples/lineage_cost.rs`) hold six times the bench's 10,000 tracked processes in
    /// ~6.5 MiB at most; 16,384 pending execs (~240 bytes each) ~4 MiB; one session's members are
    /// capped at a quarter of the nodes so one fork bomb leaves room for the other sessions.
    pub const DAEMON: Caps = Caps { nodes: 65_536, pending: 16_384, sessions: 1_024, members: 16_384 };
}

/// What the tick tells the lineage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineageCmd {
    /// The pending session's process matched `sessions.roots` (`true`) or not.
    Classified { session: SessionId, root: bool },
    /// The ended session was dealt with: its surviving members go back to the session its root
    /// was in.
    Settle(SessionId),
}

/// Counts for status and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LineageCounts {
    /// Processes with a node.
    pub nodes: u64,
    /// Pending sessions (execs awaiting classification).
    pub pending: u64,
    /// Root sessions whose root is alive.
    pub live: u64,
    /// Root sessions whose root ended, not yet settled.
    pub ended: u64,
    /// Processes left without lineage because a cap was reached (never reaped), since start.
    pub untracked_total: u64,
    /// Execs not classified because the pending cap was reached, since start.
    pub unclassified_total: u64,
    /// Processes matching `sessions.roots` refused because the session cap was reached.
    pub roots_refused_total: u64,
}

/// A pending session for the tick to classify.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub session: SessionId,
    /// The process whose exec opened it (its state as the table has it now).
    pub process: ProcState,
    /// For a process adopted from a scan (its exec unseen): its parent's pid. A child that only
    /// forked (no exec) carries its parent's command line, so the tick takes a command line equal
    /// to the parent's for a fork, not an exec: not a root.
    pub parent: Option<u32>,
}

/// One root session as the tick sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionRow {
    pub id: SessionId,
    pub root: ProcId,
    /// The root's state while it lives (`None` once it ended).
    pub root_state: Option<ProcState>,
    /// The root exited; the session waits for the tick to settle it.
    pub ended: bool,
    /// Its live members, sorted by pid (a nested root is a member of the outer session).
    pub members: Vec<ProcState>,
}

/// The lineage as one tick sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionsView {
    /// Pending sessions, oldest first, at most the number the tick asked for.
    pub candidates: Vec<Candidate>,
    /// Root sessions, live and ended, in the order they were opened.
    pub sessions: Vec<SessionRow>,
    pub counts: LineageCounts,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Node {
    start: u64,
    /// The session this process is a member of.
    session: Option<SessionId>,
    /// The session this process opened by its exec (pending or a root's).
    opens: Option<SessionId>,
    /// Adopted from a scan: its parent link is still to come.
    awaiting_parent: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Pending,
    Rooted,
    /// The root exited; `enclosing` is the session it was in then.
    Ended {
        enclosing: Option<SessionId>,
    },
}

#[derive(Clone, Debug)]
struct Session {
    opener: ProcId,
    /// The opener's parent, when it was adopted with its parent link (see [`Candidate::parent`]).
    adopted_parent: Option<u32>,
    state: State,
    /// Pids of the members (each one's node holds its start time).
    members: HashSet<u32>,
}

/// See the module doc.
#[derive(Clone, Debug)]
pub struct Lineage {
    uid: u32,
    ignore_pid: Option<u32>,
    caps: Caps,
    nodes: HashMap<u32, Node>,
    sessions: HashMap<SessionId, Session>,
    next_id: SessionId,
    pending: usize,
    rooted: usize,
    counts: LineageCounts,
    /// A root session ended since the last [`Lineage::take_news`].
    news: bool,
}

impl Lineage {
    /// The lineage of account `uid` (`ignore_pid`: the daemon itself, never tracked).
    pub fn new(uid: u32, ignore_pid: Option<u32>, caps: Caps) -> Lineage {
        Lineage {
            uid,
            ignore_pid,
            caps,
            nodes: HashMap::new(),
            sessions: HashMap::new(),
            next_id: 1,
            pending: 0,
            rooted: 0,
            counts: LineageCounts::default(),
            news: false,
        }
    }

    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// Whether a root session ended since the last call (the pump then wakes the tick, so the
    /// grace is counted from the exit, not from the next interval).
    pub fn take_news(&mut self) -> bool {
        std::mem::take(&mut self.news)
    }

    fn mine(&self, s: &ProcState) -> bool {
        s.euid == self.uid && Some(s.id.pid) != self.ignore_pid
    }

    fn node(&self, id: ProcId) -> Option<&Node> {
        self.nodes.get(&id.pid).filter(|n| n.start == id.start_ticks)
    }

    /// One kernel event (after the table applied it).
    pub fn apply(&mut self, event: &Event) {
        match *event {
            Event::Fork { child, parent_pid } => self.fork(child, parent_pid),
            Event::State { kind: StateKind::Exec, state } => self.exec(state),
            // A state of another account: the process left this one (setuid, or a rename seen
            // after a setuid the audit has not caught up with); it is no longer ours to reap.
            Event::State { kind: StateKind::Setuid | StateKind::Rename, state: s } => {
                self.drop_stale(s.id);
                if !self.mine(&s) {
                    self.gone(s.id, false);
                }
            }
            Event::Exit(id) => self.gone(id, true),
        }
    }

    /// A node that holds `id`'s pid with another start time belongs to a process whose exit was
    /// never seen (lost): it is gone.
    fn drop_stale(&mut self, id: ProcId) {
        if let Some(old) = self.nodes.get(&id.pid).filter(|n| n.start != id.start_ticks) {
            let old = ProcId { pid: id.pid, start_ticks: old.start };
            self.gone(old, true);
        }
    }

    fn fork(&mut self, child: ProcState, parent_pid: u32) {
        self.drop_stale(child.id);
        if !self.mine(&child) {
            return;
        }
        let Some(parent) = self.nodes.get(&parent_pid) else { return };
        if let Some(sid) = parent.opens.or(parent.session) {
            let node = Node { start: child.id.start_ticks, session: None, opens: None, awaiting_parent: false };
            self.insert_member(child.id.pid, node, sid);
        }
    }

    /// Inserts `node` for `pid` as a member of `sid`; at a cap the process stays without lineage.
    fn insert_member(&mut self, pid: u32, mut node: Node, sid: SessionId) -> bool {
        let room = self.nodes.len() < self.caps.nodes || self.nodes.contains_key(&pid);
        match self.sessions.get_mut(&sid) {
            Some(s) if room && s.members.len() < self.caps.members => {
                s.members.insert(pid);
                node.session = Some(sid);
                self.nodes.insert(pid, node);
                true
            }
            _ => {
                self.counts.untracked_total += 1;
                false
            }
        }
    }

    fn exec(&mut self, s: ProcState) {
        self.drop_stale(s.id);
        if !self.mine(&s) {
            // An exec into another account (a set-user-ID program): it left this one.
            self.gone(s.id, false);
            return;
        }
        let opened = self.nodes.get(&s.id.pid).and_then(|n| n.opens);
        match opened.map(|sid| self.sessions[&sid].state) {
            // A root stays the root of its session whatever it runs next.
            Some(State::Rooted) => return,
            Some(State::Pending) => self.dissolve(opened.expect("matched Some"), None),
            Some(State::Ended { .. }) | None => {}
        }
        self.open_pending(s.id, false);
    }

    /// Opens a pending session for `id` (creating its node if needed); at a cap it is simply not
    /// classified (a root there is missed: fail safe).
    fn open_pending(&mut self, id: ProcId, awaiting_parent: bool) {
        let exists = self.nodes.contains_key(&id.pid);
        if self.pending >= self.caps.pending || (!exists && self.nodes.len() >= self.caps.nodes) {
            self.counts.unclassified_total += 1;
            return;
        }
        let sid = self.next_id;
        self.next_id += 1;
        self.sessions
            .insert(sid, Session { opener: id, adopted_parent: None, state: State::Pending, members: HashSet::new() });
        self.pending += 1;
        let node = self.nodes.entry(id.pid).or_insert(Node {
            start: id.start_ticks,
            session: None,
            opens: None,
            awaiting_parent,
        });
        node.opens = Some(sid);
    }

    /// The process `id` exited (`exited`) or left the account.
    fn gone(&mut self, id: ProcId, exited: bool) {
        let Some(node) = self.node(id).copied() else { return };
        self.nodes.remove(&id.pid);
        if let Some(sid) = node.session {
            if let Some(s) = self.sessions.get_mut(&sid) {
                s.members.remove(&id.pid);
            }
        }
        let Some(sid) = node.opens else { return };
        match self.sessions[&sid].state {
            State::Rooted if exited => {
                self.sessions.get_mut(&sid).expect("present").state = State::Ended { enclosing: node.session };
                self.news = true;
            }
            State::Ended { .. } => {}
            // A pending session whose command line was never read, or a root that became
            // another account's process: not a session of this account.
            State::Pending | State::Rooted => self.dissolve(sid, Some(node.session)),
        }
    }

    /// Ends session `sid` without it being a root's: its members go to `into` (given when the
    /// opener is gone, else the session the opener is in).
    fn dissolve(&mut self, sid: SessionId, into: Option<Option<SessionId>>) {
        let Some(s) = self.sessions.remove(&sid) else { return };
        match s.state {
            State::Pending => self.pending -= 1,
            State::Rooted | State::Ended { .. } => self.rooted -= 1,
        }
        let into = match into {
            Some(into) => into,
            None => self.node(s.opener).and_then(|n| n.session),
        };
        if let Some(opener) = self.nodes.get_mut(&s.opener.pid).filter(|n| n.start == s.opener.start_ticks) {
            opener.opens = None;
            if opener.session.is_none() && !opener.awaiting_parent {
                self.nodes.remove(&s.opener.pid);
            }
        }
        self.move_members(s.members, into);
    }

    fn move_members(&mut self, members: HashSet<u32>, into: Option<SessionId>) {
        let into = into.filter(|sid| self.sessions.contains_key(sid));
        for pid in members {
            let Some(node) = self.nodes.get_mut(&pid) else { continue };
            node.session = None;
            let node = *node;
            let kept = match into {
                Some(sid) => self.insert_member(pid, node, sid),
                None => false,
            };
            if !kept && node.opens.is_none() && !node.awaiting_parent {
                self.nodes.remove(&pid);
            }
        }
    }

    /// The tick's answers.
    pub fn command(&mut self, cmd: LineageCmd) {
        match cmd {
            LineageCmd::Classified { session, root } => {
                let Some(s) = self.sessions.get_mut(&session) else { return };
                if s.state != State::Pending {
                    return;
                }
                if !root {
                    return self.dissolve(session, None);
                }
                if self.rooted >= self.caps.sessions {
                    self.counts.roots_refused_total += 1;
                    return self.dissolve(session, None);
                }
                s.state = State::Rooted;
                self.pending -= 1;
                self.rooted += 1;
            }
            LineageCmd::Settle(session) => {
                let Some(s) = self.sessions.get(&session) else { return };
                let State::Ended { enclosing } = s.state else { return };
                self.dissolve(session, Some(enclosing));
            }
        }
    }

    /// A scan rebuilt the table from `before` to `table`: nodes of processes no longer live are
    /// gone (their exit was lost), and the account's processes that `before` did not hold (the
    /// lineage never saw them forked) are adopted, each opening a pending session, with their
    /// parent link to come. `before` is `None` when the lineage starts: it adopts every process.
    /// Returns the adopted processes (oldest first), whose parents to read.
    pub fn reconcile(&mut self, before: Option<&ProcessTable>, table: &ProcessTable) -> Vec<ProcId> {
        let live: Vec<ProcState> = table.processes().into_iter().filter(|p| self.mine(p)).collect();
        let ids: HashSet<ProcId> = live.iter().map(|p| p.id).collect();
        let dead: Vec<ProcId> = self
            .nodes
            .iter()
            .map(|(&pid, n)| ProcId { pid, start_ticks: n.start })
            .filter(|id| !ids.contains(id))
            .collect();
        for id in dead {
            self.gone(id, true);
        }
        let seen = |id: &ProcId| before.is_some_and(|t| t.get(id.pid).is_some_and(|p| p.id == *id));
        let mut adopted: Vec<ProcId> =
            live.iter().map(|p| p.id).filter(|id| self.node(*id).is_none() && !seen(id)).collect();
        adopted.sort_by_key(|id| (id.start_ticks, id.pid));
        for id in &adopted {
            self.open_pending(*id, true);
        }
        adopted.retain(|id| self.node(*id).is_some());
        adopted
    }

    /// Parent links read for adopted processes: `(process, parent pid)`. Each joins the session
    /// its parent opened or is in, in start-time order (a parent starts before its children, so
    /// its own session is settled first). An adopted process whose parent did not come back
    /// (gone meanwhile) stays outside every session.
    pub fn attach_parents(&mut self, adopted: &[ProcId], parents: &[(ProcId, u32)]) {
        let mut links: Vec<(ProcId, u32)> = parents.to_vec();
        links.sort_by_key(|(id, _)| (id.start_ticks, id.pid));
        for (id, ppid) in links {
            let Some(node) = self.node(id).copied().filter(|n| n.awaiting_parent) else { continue };
            self.nodes.get_mut(&id.pid).expect("present").awaiting_parent = false;
            if let Some(s) = node.opens.and_then(|sid| self.sessions.get_mut(&sid)) {
                s.adopted_parent = Some(ppid);
            }
            // A parent starts before its child: a node that does not is a pid reused since.
            let parent = self.nodes.get(&ppid).filter(|p| ppid != id.pid && p.start <= id.start_ticks);
            if let Some(sid) = parent.and_then(|p| p.opens.or(p.session)) {
                self.insert_member(id.pid, Node { awaiting_parent: false, ..node }, sid);
            }
        }
        for id in adopted {
            if let Some(n) = self.nodes.get_mut(&id.pid).filter(|n| n.start == id.start_ticks) {
                n.awaiting_parent = false;
                if n.session.is_none() && n.opens.is_none() {
                    self.nodes.remove(&id.pid);
                }
            }
        }
    }

    /// The view for a tick: up to `max_candidates` pending sessions (oldest first) and every
    /// root session with its live members, states taken from `table`.
    pub fn view(&self, table: &ProcessTable, max_candidates: usize) -> SessionsView {
        let state = |id: ProcId| table.get(id.pid).filter(|p| p.id == id && self.mine(p));
        let mut ids: Vec<SessionId> = self.sessions.keys().copied().collect();
        ids.sort_unstable();
        let mut view = SessionsView { counts: self.counts(), ..Default::default() };
        for sid in ids {
            let s = &self.sessions[&sid];
            match s.state {
                State::Pending => {
                    if view.candidates.len() < max_candidates {
                        if let Some(process) = state(s.opener) {
                            view.candidates.push(Candidate { session: sid, process, parent: s.adopted_parent });
                        }
                    }
                }
                State::Rooted | State::Ended { .. } => {
                    let mut members: Vec<ProcState> = s
                        .members
                        .iter()
                        .filter_map(|&pid| state(ProcId { pid, start_ticks: self.nodes.get(&pid)?.start }))
                        .collect();
                    members.sort_by_key(|p| p.id.pid);
                    let ended = matches!(s.state, State::Ended { .. });
                    let root_state = if ended { None } else { state(s.opener) };
                    view.sessions.push(SessionRow { id: sid, root: s.opener, root_state, ended, members });
                }
            }
        }
        view
    }

    pub fn counts(&self) -> LineageCounts {
        let ended = self.sessions.values().filter(|s| matches!(s.state, State::Ended { .. })).count();
        LineageCounts {
            nodes: self.nodes.len() as u64,
            pending: self.pending as u64,
            live: (self.rooted - ended) as u64,
            ended: ended as u64,
            ..self.counts
        }
    }

    /// The session `pid` is a member of, if the lineage knows it.
    #[cfg(test)]
    fn session_of(&self, id: ProcId) -> Option<SessionId> {
        self.node(id).and_then(|n| n.session)
    }

    /// The internal invariants: every member's node names its session, every node is in the
    /// session it names, the counters match, nothing holds a node for no reason.
    #[cfg(test)]
    fn is_consistent(&self) -> bool {
        let members_ok = self
            .sessions
            .iter()
            .all(|(sid, s)| s.members.iter().all(|pid| self.nodes.get(pid).is_some_and(|n| n.session == Some(*sid))));
        let nodes_ok = self.nodes.iter().all(|(pid, n)| {
            n.session.is_none_or(|sid| self.sessions.get(&sid).is_some_and(|s| s.members.contains(pid)))
                && n.opens.is_none_or(|sid| self.sessions.get(&sid).is_some_and(|s| s.opener.pid == *pid))
                && (n.session.is_some() || n.opens.is_some() || n.awaiting_parent)
        });
        let pending = self.sessions.values().filter(|s| s.state == State::Pending).count();
        members_ok && nodes_ok && pending == self.pending && self.sessions.len() - pending == self.rooted
    }
}
