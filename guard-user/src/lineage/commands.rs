//! The tick's answers to the lineage ([`LineageCmd`]): classifications, where the reading of
//! pending execs goes on, doomed members, settled sessions.
use std::collections::{HashMap, HashSet};

use super::{Lineage, LineageCmd, SessionId, State};
use crate::event::ProcId;

impl Lineage {
    /// The ended session `sid` was dealt with: its members go back to `enclosing`, and those
    /// alive stay listed under it (reported) until they exit; at the cap on reported sessions,
    /// they are not listed.
    fn settle(&mut self, sid: SessionId, enclosing: Option<SessionId>) {
        let members: Vec<u32> = self.sessions[&sid].members.iter().copied().collect();
        if members.is_empty() || self.reported >= self.caps.reported {
            if !members.is_empty() {
                self.counts.caps.reported += 1;
            }
            return self.dissolve(sid, Some(enclosing));
        }
        let s = self.sessions.get_mut(&sid).expect("present");
        s.state = State::Reported;
        let opener = s.opener;
        self.rooted -= 1;
        self.reported += 1;
        if let Some(n) = self.node_mut(opener).filter(|n| n.opens == Some(sid)) {
            n.opens = None;
            if n.idle() {
                self.nodes.remove(&opener.pid);
            }
        }
        // Listed first, so a member the enclosing session has no room for keeps its node.
        for &pid in &members {
            let node = self.nodes.get_mut(&pid).expect("a member has a node");
            if let Some(old) = node.reported.replace(sid).filter(|old| *old != sid) {
                self.unwatch(old, pid);
            }
        }
        self.move_members(members.into_iter().collect(), enclosing);
    }

    /// The tick's answers, in order (the dooms of a batch are applied together: one pass over the
    /// nodes, however many).
    pub fn commands(&mut self, cmds: &[LineageCmd]) {
        let mut doomed = Vec::new();
        for c in cmds {
            match *c {
                LineageCmd::Doom(id) => doomed.push(id),
                other => {
                    self.doom(&std::mem::take(&mut doomed));
                    self.command(other);
                }
            }
        }
        self.doom(&doomed);
    }

    /// Dooms `ids` (those still alive) and what they forked, directly or through forks, that has
    /// not exec'd since: forked before the doom came, it runs what was judged all the same.
    fn doom(&mut self, ids: &[ProcId]) {
        if ids.is_empty() {
            return;
        }
        let mut children: HashMap<ProcId, Vec<u32>> = HashMap::new();
        for (&pid, n) in &self.nodes {
            if let Some(parent) = n.forked_from {
                children.entry(parent).or_default().push(pid);
            }
        }
        let mut work: Vec<ProcId> = ids.to_vec();
        let mut seen: HashSet<ProcId> = HashSet::new();
        while let Some(id) = work.pop() {
            if !seen.insert(id) {
                continue;
            }
            if let Some(n) = self.node_mut(id) {
                n.doomed = true;
            }
            for &pid in children.get(&id).into_iter().flatten() {
                let start = self.nodes[&pid].start;
                work.push(ProcId { pid, start_ticks: start });
            }
        }
    }

    /// One answer of the tick.
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
                    self.counts.caps.sessions += 1;
                    return self.dissolve(session, None);
                }
                s.state = State::Rooted;
                self.pending -= 1;
                self.rooted += 1;
            }
            LineageCmd::WaitedEmpty(session) => {
                if let Some(s) = self.sessions.get_mut(&session).filter(|s| s.state == State::Pending) {
                    s.waited_empty = true;
                }
            }
            LineageCmd::ReadAfter(session) => self.cursor = session,
            LineageCmd::Doom(id) => self.doom(&[id]),
            LineageCmd::Settle(session) => {
                let Some(s) = self.sessions.get(&session) else { return };
                let State::Ended { enclosing } = s.state else { return };
                self.settle(session, enclosing);
            }
        }
    }
}
