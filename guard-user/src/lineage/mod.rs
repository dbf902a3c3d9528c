//! Session lineage (docs/configuration.md `sessions`, docs/architecture.md): for each process of
//! the account, the session it was forked into, kept from the kernel's fork events so that
//! nothing the process does afterwards (`setsid`, a double fork, reparenting to init or a
//! subreaper, exec, a rename, a visit outside the account) takes it out. Pure: the pump feeds it
//! events and scans, the tick reads a [`SessionsView`] and answers with [`LineageCmd`]s.
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
//! command line is gone, so it is not a root: fail safe). The tick is handed the pending sessions
//! round-robin from where its last reading stopped ([`LineageCmd::ReadAfter`]), so execs it
//! cannot settle never keep the others waiting.
//!
//! The root of a session stays its root whatever it execs afterwards; a root that exits, or
//! leaves the account, ends its session (one that leaves lives on as a member of the session it
//! ended: back in the account in the same pid, as after `exec newgrp`, it is one of its
//! leftovers), which the tick settles ([`LineageCmd::Settle`]) once it
//! has dealt with the leftovers: they go back to the session the root was in (a nested root's
//! leftovers belong to the outer session again), and those still alive stay listed under the
//! ended root (*reported*) until they exit, so the log is never the only list.
//!
//! # Leaving the account and coming back
//! A member whose effective uid stops being the account's (`sg`, `newgrp`, any set-user-ID
//! program) keeps its node, marked *away*: it is not the account's process meanwhile (never
//! listed, never signalled), what it forks joins its session, and when it (or what it forked)
//! comes back to the account's uid, it is a member as before. The kernel reports forks and exits
//! of processes whose real uid is the account's even while their effective uid is another, which
//! is what a set-user-ID program run by the account keeps.
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
//! session, and a process whose lineage is unknown is never reaped. Each cap reached is counted
//! ([`CapHits`]), and the tick says so once (`WARN sessions_cap`).
use std::collections::{HashMap, HashSet};

use crate::event::{Event, ProcId, ProcState, StateKind};

mod commands;
pub mod parents;
#[cfg(test)]
mod tests;
mod view;

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
    /// Settled sessions whose reported leftovers are still alive (listed until they exit).
    pub reported: usize,
}

impl Caps {
    /// The daemon's caps: 65,536 nodes (~100 bytes each with their share of the sets, measured by
    /// `examples/lineage_cost.rs`) hold six times the bench's 10,000 tracked processes in
    /// ~6.5 MiB at most; 16,384 pending execs (~240 bytes each) ~4 MiB; one session's members are
    /// capped at a quarter of the nodes so one fork bomb leaves room for the other sessions.
    pub const DAEMON: Caps = Caps { nodes: 65_536, pending: 16_384, sessions: 1_024, members: 16_384, reported: 1_024 };
}

/// What the tick tells the lineage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineageCmd {
    /// The pending session's process matched `sessions.roots` (`true`) or not.
    Classified { session: SessionId, root: bool },
    /// The pending session's command line was empty when the tick read it: the next time it is
    /// still empty, it is not a root (an exec's arguments are in place long before a tick).
    WaitedEmpty(SessionId),
    /// The tick read pending sessions up to this one: the next view starts after it.
    ReadAfter(SessionId),
    /// The tick signalled this member while stopping its session: what it forks from now on
    /// (until it execs) is stopped too, without waiting for the next round.
    Doom(ProcId),
    /// The ended session was dealt with: its surviving members go back to the session its root
    /// was in, and stay listed under it until they exit.
    Settle(SessionId),
}

/// How often each cap was reached, since the lineage started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CapHits {
    /// Processes matching `sessions.roots` refused at the cap on sessions.
    pub sessions: u64,
    /// Forks left without lineage at the cap on one session's members.
    pub members: u64,
    /// Forks and execs left without lineage at the cap on nodes.
    pub nodes: u64,
    /// Execs left unclassified at the cap on pending ones.
    pub pending_execs: u64,
    /// Settled sessions whose leftovers could not be listed at the cap on reported sessions.
    pub reported: u64,
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
    /// Settled sessions whose reported leftovers are still alive.
    pub reported: u64,
    /// Processes left without lineage because a cap was reached (never reaped), since start.
    pub untracked_total: u64,
    /// Execs not classified because the pending cap was reached, since start.
    pub unclassified_total: u64,
    /// Processes matching `sessions.roots` refused because the session cap was reached.
    pub roots_refused_total: u64,
    /// Each cap reached, since start.
    pub caps: CapHits,
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
    /// A tick already read its command line empty ([`LineageCmd::WaitedEmpty`]).
    pub waited_empty: bool,
}

/// One root session as the tick sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionRow {
    pub id: SessionId,
    pub root: ProcId,
    /// The root's state while it lives in the account (`None` once it ended).
    pub root_state: Option<ProcState>,
    /// The root exited or left the account; the session waits for the tick to settle it.
    pub ended: bool,
    /// Settled: `members` are the leftovers reported (or left alive by the stop) that still run.
    pub reported: bool,
    /// Its live members in the account, sorted by pid (a nested root is a member of the outer
    /// session).
    pub members: Vec<ProcState>,
    /// The members the tick doomed and those forked from them since (see [`LineageCmd::Doom`]).
    pub doomed: Vec<ProcId>,
}

/// The lineage as one tick sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionsView {
    /// Pending sessions, round-robin from the last [`LineageCmd::ReadAfter`], at most the number
    /// the tick asked for.
    pub candidates: Vec<Candidate>,
    /// Root sessions (live, ended and reported), in the order they were opened.
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
    /// Its effective uid is not the account's now (see the module doc).
    away: bool,
    /// See [`LineageCmd::Doom`].
    doomed: bool,
    /// The process it was forked from, while it has not exec'd since (a fork runs its parent's
    /// program: a doom of the parent reaches it, even when the parent is gone by then).
    forked_from: Option<ProcId>,
    /// The reported session that lists it.
    reported: Option<SessionId>,
}

impl Node {
    fn new(start: u64) -> Node {
        Node {
            start,
            session: None,
            opens: None,
            awaiting_parent: false,
            away: false,
            doomed: false,
            forked_from: None,
            reported: None,
        }
    }

    /// Whether nothing needs it any more.
    fn idle(&self) -> bool {
        self.session.is_none() && self.opens.is_none() && !self.awaiting_parent && self.reported.is_none()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Pending,
    Rooted,
    /// The root exited or left; `enclosing` is the session it was in then.
    Ended {
        enclosing: Option<SessionId>,
    },
    /// Settled; its members are the leftovers still listed (a watch, not a membership).
    Reported,
}

#[derive(Clone, Debug)]
struct Session {
    opener: ProcId,
    /// The opener's parent, when it was adopted with its parent link (see [`Candidate::parent`]).
    adopted_parent: Option<u32>,
    state: State,
    /// Pids of the members (each one's node holds its start time).
    members: HashSet<u32>,
    /// See [`Candidate::waited_empty`].
    waited_empty: bool,
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
    /// Rooted and ended sessions.
    rooted: usize,
    reported: usize,
    /// The last pending session the tick read ([`LineageCmd::ReadAfter`]).
    cursor: SessionId,
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
            reported: 0,
            cursor: 0,
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

    fn node_mut(&mut self, id: ProcId) -> Option<&mut Node> {
        self.nodes.get_mut(&id.pid).filter(|n| n.start == id.start_ticks)
    }

    /// One kernel event (after the table applied it).
    pub fn apply(&mut self, event: &Event) {
        match *event {
            Event::Fork { child, parent_pid } => self.fork(child, parent_pid),
            Event::State { kind: StateKind::Exec, state } => self.exec(state),
            // The effective uid as it is now: left the account, or back in it.
            Event::State { kind: StateKind::Setuid | StateKind::Rename, state: s } => {
                self.drop_stale(s.id);
                if self.mine(&s) {
                    if let Some(n) = self.node_mut(s.id) {
                        n.away = false;
                    }
                } else {
                    self.leave(s.id);
                }
            }
            Event::Exit(id) => self.gone(id),
        }
    }

    /// A node that holds `id`'s pid with another start time belongs to a process whose exit was
    /// never seen (lost): it is gone.
    fn drop_stale(&mut self, id: ProcId) {
        if let Some(old) = self.nodes.get(&id.pid).filter(|n| n.start != id.start_ticks) {
            let old = ProcId { pid: id.pid, start_ticks: old.start };
            self.gone(old);
        }
    }

    fn fork(&mut self, child: ProcState, parent_pid: u32) {
        self.drop_stale(child.id);
        if Some(child.id.pid) == self.ignore_pid {
            return;
        }
        // A parent starts before its child: a node that does not is a pid reused since.
        let Some(parent) = self.nodes.get(&parent_pid).filter(|p| p.start <= child.id.start_ticks) else { return };
        if let Some(sid) = parent.opens.or(parent.session) {
            let node = Node {
                away: child.euid != self.uid,
                doomed: parent.doomed,
                forked_from: Some(ProcId { pid: parent_pid, start_ticks: parent.start }),
                ..Node::new(child.id.start_ticks)
            };
            self.insert_member(child.id.pid, node, sid);
        }
    }

    /// Inserts `node` for `pid` as a member of `sid`; at a cap the process stays without lineage.
    fn insert_member(&mut self, pid: u32, mut node: Node, sid: SessionId) -> bool {
        let room = self.nodes.len() < self.caps.nodes || self.nodes.contains_key(&pid);
        let Some(s) = self.sessions.get_mut(&sid) else { return false };
        if !room {
            self.counts.caps.nodes += 1;
        } else if s.members.len() >= self.caps.members {
            self.counts.caps.members += 1;
        } else {
            s.members.insert(pid);
            node.session = Some(sid);
            self.nodes.insert(pid, node);
            return true;
        }
        self.counts.untracked_total += 1;
        false
    }

    fn exec(&mut self, s: ProcState) {
        self.drop_stale(s.id);
        if Some(s.id.pid) == self.ignore_pid {
            return;
        }
        if !self.mine(&s) {
            // An exec into another account (a set-user-ID program): it left this one.
            self.leave(s.id);
            return;
        }
        if let Some(n) = self.node_mut(s.id) {
            n.away = false;
            // A new program: it and what it forks are judged by its own command line.
            n.doomed = false;
            n.forked_from = None;
        }
        let opened = self.node(s.id).and_then(|n| n.opens);
        match opened.map(|sid| self.sessions[&sid].state) {
            // A root stays the root of its session whatever it runs next.
            Some(State::Rooted) => return,
            Some(State::Pending) => self.dissolve(opened.expect("matched Some"), None),
            Some(State::Ended { .. } | State::Reported) | None => {}
        }
        self.open_pending(s.id, false);
    }

    /// `id` is no longer the account's process (for now): it stays a member, away. A root ends
    /// its session; a pending session is not a root's (its command line is another account's).
    fn leave(&mut self, id: ProcId) {
        let Some(node) = self.node_mut(id) else { return };
        if std::mem::replace(&mut node.away, true) {
            return;
        }
        let (session, opens) = (node.session, node.opens);
        let Some(sid) = opens else { return };
        match self.sessions[&sid].state {
            State::Rooted => {
                self.end(sid, session);
                self.join_ended(id, sid);
            }
            State::Pending => self.dissolve(sid, None),
            State::Ended { .. } | State::Reported => {}
        }
    }

    /// The root `id` left the account, ending its session `sid`, but lives on: it becomes a
    /// member of that session, so that when it comes back in the same pid (`exec newgrp`, an `sg`
    /// that does not fork) it, what it runs and what it forks are that session's leftovers, not
    /// members of the session around it. At the cap on members it stays where it was.
    fn join_ended(&mut self, id: ProcId, sid: SessionId) {
        let Some(node) = self.node(id).copied() else { return };
        let Some(s) = self.sessions.get_mut(&sid) else { return };
        if s.members.len() >= self.caps.members {
            self.counts.caps.members += 1;
            return;
        }
        s.members.insert(id.pid);
        if let Some(old) = node.session.and_then(|o| self.sessions.get_mut(&o)) {
            old.members.remove(&id.pid);
        }
        if let Some(n) = self.node_mut(id) {
            n.session = Some(sid);
        }
    }

    fn end(&mut self, sid: SessionId, enclosing: Option<SessionId>) {
        self.sessions.get_mut(&sid).expect("present").state = State::Ended { enclosing };
        self.news = true;
    }

    /// Opens a pending session for `id` (creating its node if needed); at a cap it is simply not
    /// classified (a root there is missed: fail safe).
    fn open_pending(&mut self, id: ProcId, awaiting_parent: bool) {
        let exists = self.nodes.contains_key(&id.pid);
        if self.pending >= self.caps.pending || (!exists && self.nodes.len() >= self.caps.nodes) {
            if self.pending >= self.caps.pending {
                self.counts.caps.pending_execs += 1;
            } else {
                self.counts.caps.nodes += 1;
            }
            self.counts.unclassified_total += 1;
            return;
        }
        let sid = self.next_id;
        self.next_id += 1;
        let session = Session {
            opener: id,
            adopted_parent: None,
            state: State::Pending,
            members: HashSet::new(),
            waited_empty: false,
        };
        self.sessions.insert(sid, session);
        self.pending += 1;
        let node = self.nodes.entry(id.pid).or_insert(Node { awaiting_parent, ..Node::new(id.start_ticks) });
        node.opens = Some(sid);
    }

    /// The process `id` exited.
    fn gone(&mut self, id: ProcId) {
        let Some(node) = self.node(id).copied() else { return };
        self.nodes.remove(&id.pid);
        if let Some(s) = node.session.and_then(|sid| self.sessions.get_mut(&sid)) {
            s.members.remove(&id.pid);
        }
        if let Some(sid) = node.reported {
            self.unwatch(sid, id.pid);
        }
        let Some(sid) = node.opens else { return };
        match self.sessions[&sid].state {
            State::Rooted => self.end(sid, node.session),
            State::Ended { .. } | State::Reported => {}
            // A pending session whose command line was never read: not a root.
            State::Pending => self.dissolve(sid, Some(node.session)),
        }
    }

    /// `pid` is no longer listed by the reported session `sid`; the session goes with its last.
    fn unwatch(&mut self, sid: SessionId, pid: u32) {
        let Some(s) = self.sessions.get_mut(&sid) else { return };
        s.members.remove(&pid);
        if s.members.is_empty() {
            self.dissolve(sid, Some(None));
        }
    }

    /// Ends session `sid` without it being a root's: its members go to `into` (given when the
    /// opener is gone, else the session the opener is in). A reported session's members are a
    /// watch, not a membership: they stay where they are.
    fn dissolve(&mut self, sid: SessionId, into: Option<Option<SessionId>>) {
        let Some(s) = self.sessions.remove(&sid) else { return };
        match s.state {
            State::Pending => self.pending -= 1,
            State::Rooted | State::Ended { .. } => self.rooted -= 1,
            State::Reported => self.reported -= 1,
        }
        let into = match into {
            Some(into) => into,
            None => self.node(s.opener).and_then(|n| n.session),
        };
        if let Some(opener) = self.node_mut(s.opener).filter(|n| n.opens == Some(sid)) {
            opener.opens = None;
            if opener.idle() {
                self.nodes.remove(&s.opener.pid);
            }
        }
        if s.state == State::Reported {
            for pid in s.members {
                let Some(n) = self.nodes.get_mut(&pid).filter(|n| n.reported == Some(sid)) else { continue };
                n.reported = None;
                if n.idle() {
                    self.nodes.remove(&pid);
                }
            }
            return;
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
            if !kept && node.idle() {
                self.nodes.remove(&pid);
            }
        }
    }
}
