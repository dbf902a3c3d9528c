//! What the lineage shows a tick ([`Lineage::view`], [`Lineage::counts`]) and how it meets a
//! scan ([`Lineage::reconcile`], [`Lineage::attach_parents`]).
use std::collections::HashSet;

use super::{Candidate, Lineage, LineageCounts, Node, SessionId, SessionRow, SessionsView, State};
use crate::{
    event::{ProcId, ProcState},
    table::ProcessTable,
};

impl Lineage {
    /// A scan rebuilt the table from `before` to `table`: nodes of the account's processes no
    /// longer live are gone (their exit was lost), and the account's processes that `before` did
    /// not hold (the lineage never saw them forked) are adopted, each opening a pending session,
    /// with their parent link to come. `before` is `None` when the lineage starts: it adopts every
    /// process. Returns the processes whose `/proc` entry to read (oldest first): the adopted
    /// ones, for their parent, and the members away from the account (the table does not hold
    /// them), to learn whether they still live ([`Lineage::attach_parents`]).
    ///
    /// `adopt_since` (clock ticks) says events were lost, so what the lineage knows of the
    /// processes started from then on may lack their fork: each of them without a node is adopted
    /// though `before` held it, and each that opened a pending session by its exec, in no session
    /// itself, has its parent read too.
    pub fn reconcile(
        &mut self,
        before: Option<&ProcessTable>,
        table: &ProcessTable,
        adopt_since: Option<u64>,
    ) -> Vec<ProcId> {
        let live: Vec<ProcState> = table.processes().into_iter().filter(|p| self.mine(p)).collect();
        let ids: HashSet<ProcId> = live.iter().map(|p| p.id).collect();
        let dead: Vec<ProcId> = self
            .nodes
            .iter()
            .filter(|(_, n)| !n.away)
            .map(|(&pid, n)| ProcId { pid, start_ticks: n.start })
            .filter(|id| !ids.contains(id))
            .collect();
        for id in dead {
            self.gone(id);
        }
        let in_window = |id: &ProcId| adopt_since.is_some_and(|t| id.start_ticks >= t);
        let seen = |id: &ProcId| before.is_some_and(|t| t.get(id.pid).is_some_and(|p| p.id == *id));
        let mut adopted: Vec<ProcId> =
            live.iter().map(|p| p.id).filter(|id| self.node(*id).is_none() && (in_window(id) || !seen(id))).collect();
        adopted.sort_by_key(|id| (id.start_ticks, id.pid));
        for id in &adopted {
            self.open_pending(*id, true);
        }
        adopted.retain(|id| self.node(*id).is_some());
        let unplaced: Vec<ProcId> = live
            .iter()
            .map(|p| p.id)
            .filter(in_window)
            .filter(|id| {
                self.node(*id).is_some_and(|n| {
                    !n.away
                        && !n.awaiting_parent // the adopted
                        && n.session.is_none()
                        && n.opens.is_some_and(|sid| self.sessions[&sid].state == State::Pending)
                })
            })
            .collect();
        for id in &unplaced {
            self.node_mut(*id).expect("present").awaiting_parent = true;
        }
        adopted.extend(unplaced);
        adopted.sort_by_key(|id| (id.start_ticks, id.pid));
        let mut away: Vec<ProcId> =
            self.nodes.iter().filter(|(_, n)| n.away).map(|(&pid, n)| ProcId { pid, start_ticks: n.start }).collect();
        away.sort_by_key(|id| (id.start_ticks, id.pid));
        adopted.extend(away);
        adopted
    }

    /// Parent links read for what [`Lineage::reconcile`] asked about: `(process, parent pid)` for
    /// each that still lives. An adopted process joins the session its parent opened or is in, in
    /// start-time order (a parent starts before its children, so its own session is settled
    /// first); one whose parent did not come back (gone meanwhile) stays outside every session. A
    /// member away from the account that did not come back is gone.
    pub fn attach_parents(&mut self, asked: &[ProcId], parents: &[(ProcId, u32)]) {
        let mut links: Vec<(ProcId, u32)> = parents.to_vec();
        links.sort_by_key(|(id, _)| (id.start_ticks, id.pid));
        for &(id, ppid) in &links {
            let Some(node) = self.node(id).copied().filter(|n| n.awaiting_parent) else { continue };
            self.node_mut(id).expect("present").awaiting_parent = false;
            if let Some(s) = node.opens.and_then(|sid| self.sessions.get_mut(&sid)) {
                s.adopted_parent = Some(ppid);
            }
            // A parent starts before its child: a node that does not is a pid reused since.
            let parent = self.nodes.get(&ppid).filter(|p| ppid != id.pid && p.start <= id.start_ticks);
            if let Some(sid) = parent.and_then(|p| p.opens.or(p.session)) {
                self.insert_member(id.pid, Node { awaiting_parent: false, ..node }, sid);
            }
        }
        let answered: HashSet<ProcId> = links.iter().map(|(id, _)| *id).collect();
        for &id in asked {
            let Some(n) = self.node_mut(id) else { continue };
            if n.away {
                if !answered.contains(&id) {
                    self.gone(id);
                }
                continue;
            }
            n.awaiting_parent = false;
            let n = *n;
            if n.idle() {
                self.nodes.remove(&id.pid);
            }
        }
    }

    /// The view for a tick: up to `max_candidates` pending sessions, round-robin from the last
    /// [`super::LineageCmd::ReadAfter`], and every root session with its live members, states
    /// taken from `table`.
    pub fn view(&self, table: &ProcessTable, max_candidates: usize) -> SessionsView {
        let state = |id: ProcId| table.get(id.pid).filter(|p| p.id == id && self.mine(p));
        let mut ids: Vec<SessionId> = self.sessions.keys().copied().collect();
        ids.sort_unstable();
        let mut view = SessionsView { counts: self.counts(), ..Default::default() };
        let mut pending: Vec<SessionId> = Vec::new();
        for sid in ids {
            let s = &self.sessions[&sid];
            if s.state == State::Pending {
                pending.push(sid);
                continue;
            }
            let mut members: Vec<ProcState> = s
                .members
                .iter()
                .filter_map(|&pid| state(ProcId { pid, start_ticks: self.nodes.get(&pid)?.start }))
                .collect();
            members.sort_by_key(|p| p.id.pid);
            let doomed = members.iter().map(|p| p.id).filter(|id| self.node(*id).is_some_and(|n| n.doomed)).collect();
            let ended = !matches!(s.state, State::Rooted);
            let root_state = if ended { None } else { state(s.opener) };
            let reported = s.state == State::Reported;
            view.sessions.push(SessionRow { id: sid, root: s.opener, root_state, ended, reported, members, doomed });
        }
        let start = pending.partition_point(|&sid| sid <= self.cursor);
        for &sid in pending[start..].iter().chain(&pending[..start]) {
            if view.candidates.len() >= max_candidates {
                break;
            }
            let s = &self.sessions[&sid];
            if let Some(process) = state(s.opener) {
                let (parent, waited_empty) = (s.adopted_parent, s.waited_empty);
                view.candidates.push(Candidate { session: sid, process, parent, waited_empty });
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
            reported: self.reported as u64,
            ..self.counts
        }
    }

    /// The session `pid` is a member of, if the lineage knows it.
    #[cfg(test)]
    pub(super) fn session_of(&self, id: ProcId) -> Option<SessionId> {
        self.node(id).and_then(|n| n.session)
    }

    /// Whether the lineage holds `id` away from the account.
    #[cfg(test)]
    pub(super) fn is_away(&self, id: ProcId) -> bool {
        self.node(id).is_some_and(|n| n.away)
    }

    /// The internal invariants: every member's node names its session, every node is in the
    /// session it names, every listed leftover's node names its reported session, the counters
    /// match, nothing holds a node for no reason.
    #[cfg(test)]
    pub(super) fn is_consistent(&self) -> bool {
        let members_ok = self.sessions.iter().all(|(sid, s)| {
            s.members.iter().all(|pid| {
                self.nodes.get(pid).is_some_and(|n| match s.state {
                    State::Reported => n.reported == Some(*sid),
                    _ => n.session == Some(*sid),
                })
            })
        });
        let in_state = |sid: SessionId, pid: u32, reported: bool| {
            self.sessions
                .get(&sid)
                .is_some_and(|s| (s.state == State::Reported) == reported && s.members.contains(&pid))
        };
        let nodes_ok = self.nodes.iter().all(|(pid, n)| {
            n.session.is_none_or(|sid| in_state(sid, *pid, false))
                && n.reported.is_none_or(|sid| in_state(sid, *pid, true))
                && n.opens.is_none_or(|sid| self.sessions.get(&sid).is_some_and(|s| s.opener.pid == *pid))
                && !n.idle()
        });
        let count = |f: fn(&State) -> bool| self.sessions.values().filter(|s| f(&s.state)).count();
        let pending = count(|s| *s == State::Pending);
        let reported = count(|s| *s == State::Reported);
        let rooted = count(|s| matches!(s, State::Rooted | State::Ended { .. }));
        members_ok && nodes_ok && pending == self.pending && reported == self.reported && rooted == self.rooted
    }
}
