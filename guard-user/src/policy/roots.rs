//! Recognising session roots: the pure rules (docs/configuration.md `sessions`). The tick hands
//! each pending exec ([`Candidate`], round-robin from where its last reading stopped) to these
//! rules with what reading its command line gave, within a byte budget per tick; the matcher's
//! round over the texts [`before_match`] asked about settles the rest.
//!
//! - Gone, or longer than the matcher takes: not a root (fail safe: a session that is not one
//!   reaps nothing).
//! - Empty: an exec's arguments are in place before its first instruction runs, so a command line
//!   still empty at the second tick that reads it is an exec with an empty argv (or a process that
//!   blanked its own), not one being set up: not a root. The first time it waits.
//! - Adopted from a scan with its parent's command line: a fork that never exec'd, not a root (a
//!   root is recognised at its exec; its forks are its session).
//! - Otherwise the roots' patterns decide; one the round could not settle is asked again when
//!   the round-robin comes back to it.
use crate::{
    lineage::{Candidate, SessionId},
    pattern::{MatchOutcome, Progress},
};

/// Bytes of a root's command line kept for `tree` (escaped when shown).
pub const MAX_ROOT_COMMAND: usize = 256;

/// The classification of one pending session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RootVerdict {
    /// Matches `sessions.roots`; its command line, cut to [`MAX_ROOT_COMMAND`] bytes.
    Root { command: Vec<u8> },
    /// Matches none, could not be decided within the matcher's bounds, or is gone: not a root.
    Other,
    /// Read empty for the first time: asked again at the next reading.
    WaitEmpty,
}

/// What the rules say before any pattern is tried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Before {
    Decided(RootVerdict),
    /// The patterns decide on this text.
    Ask,
}

/// The rules before matching (see the module doc). `text` is the candidate's command line as
/// read (`None`: gone), at most `max_text + 1` bytes (longer means too long); `parent_text`
/// reads the command line of the candidate's parent, asked only for an adopted candidate.
pub fn before_match(
    c: &Candidate,
    text: Option<&[u8]>,
    max_text: usize,
    parent_text: impl FnOnce(u32) -> Option<Vec<u8>>,
) -> Before {
    let verdict = match text {
        None => RootVerdict::Other,
        Some([]) if c.waited_empty => RootVerdict::Other,
        Some([]) => RootVerdict::WaitEmpty,
        Some(t) if t.len() > max_text => RootVerdict::Other,
        Some(t) if c.parent.and_then(parent_text).as_deref() == Some(t) => RootVerdict::Other,
        Some(_) => return Before::Ask,
    };
    Before::Decided(verdict)
}

/// The verdict of the roots' round on `text`; `None` when the round did not settle it.
pub fn after_match(text: &[u8], progress: &Progress) -> Option<RootVerdict> {
    match progress {
        Progress::Settled(MatchOutcome::Matched(_)) => {
            Some(RootVerdict::Root { command: text[..text.len().min(MAX_ROOT_COMMAND)].to_vec() })
        }
        Progress::Settled(MatchOutcome::NoMatch | MatchOutcome::Budget) => Some(RootVerdict::Other),
        Progress::Unsettled(_) => None,
    }
}

/// The bytes of candidates' command lines a tick may hold at once (they are held until the
/// matcher's round is over, then dropped). A reading that does not fit waits for the next tick,
/// first in line: nothing is judged on a cut-off text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmdlineBudget {
    left: usize,
    /// A candidate had to wait for the next tick.
    pub exhausted: bool,
}

/// What [`CmdlineBudget::take`] made of one reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    /// Read whole (or known too long, or gone): judge it.
    Judge,
    /// It did not fit in what was left: stop reading; it is first in line next tick.
    Later,
}

impl CmdlineBudget {
    /// A budget of `bytes`; at least one whole command line always fits in a fresh one.
    pub fn new(bytes: usize, max_text: usize) -> CmdlineBudget {
        CmdlineBudget { left: bytes.max(max_text + 1), exhausted: false }
    }

    /// How many bytes to read of the next command line (the reader gives one more than this
    /// when it is longer); `None` when nothing more fits this tick.
    pub fn limit(&self, max_text: usize) -> Option<usize> {
        (!self.exhausted && self.left > 0).then(|| max_text.min(self.left - 1))
    }

    /// Accounts for a reading made with [`CmdlineBudget::limit`]'s `limit`.
    pub fn take(&mut self, read: Option<usize>, limit: usize, max_text: usize) -> Taken {
        let Some(len) = read else { return Taken::Judge };
        if len > limit && limit < max_text {
            self.exhausted = true;
            return Taken::Later;
        }
        self.left = self.left.saturating_sub(len);
        Taken::Judge
    }
}

/// One tick's reading of the candidates.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reading {
    /// Verdicts reached without the patterns.
    pub decided: Vec<(SessionId, RootVerdict)>,
    /// Texts for the roots' round (held until it is over, within the budget).
    pub asked: Vec<(SessionId, Vec<u8>)>,
    /// The last candidate read: the next reading starts after it.
    pub read_after: Option<SessionId>,
    /// The byte budget left candidates for the next tick.
    pub capped: bool,
}

/// Reads the candidates in the order handed (round-robin) through `read(pid, limit)` (the
/// process's command line, at most `limit + 1` bytes; `None` when gone) until the budget of
/// `budget_bytes` is spent, and applies [`before_match`] to each.
pub fn read_candidates(
    candidates: &[Candidate],
    read: &mut dyn FnMut(u32, usize) -> Option<Vec<u8>>,
    max_text: usize,
    budget_bytes: usize,
) -> Reading {
    let mut budget = CmdlineBudget::new(budget_bytes, max_text);
    let mut out = Reading::default();
    for c in candidates {
        let Some(limit) = budget.limit(max_text) else { break };
        let text = read(c.process.id.pid, limit);
        if budget.take(text.as_ref().map(Vec::len), limit, max_text) == Taken::Later {
            break;
        }
        out.read_after = Some(c.session);
        // The parent's text only matters when it equals the child's: read no more than that.
        let len = text.as_ref().map_or(0, Vec::len);
        match before_match(c, text.as_deref(), max_text, |pp| read(pp, len)) {
            Before::Decided(v) => out.decided.push((c.session, v)),
            Before::Ask => out.asked.push((c.session, text.expect("asked about a text"))),
        }
    }
    out.capped = budget.exhausted;
    out
}

/// The verdicts of a reading, once the roots' round answered `progress` for its `asked` texts
/// (which are dropped here). Unsettled ones have none: asked again when their turn comes back.
pub fn verdicts(reading: Reading, progress: &[Progress]) -> Vec<(SessionId, RootVerdict)> {
    let mut out = reading.decided;
    for ((session, text), p) in reading.asked.into_iter().zip(progress) {
        if let Some(v) = after_match(&text, p) {
            out.push((session, v));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        comm::Comm,
        event::{ProcId, ProcState},
        pattern::Resume,
    };

    fn c(parent: Option<u32>, waited_empty: bool) -> Candidate {
        let process = ProcState { id: ProcId { pid: 7, start_ticks: 1 }, euid: 1, comm: Comm::new(b"x") };
        Candidate { session: 3, process, parent, waited_empty }
    }

    fn decided(v: RootVerdict) -> Before {
        Before::Decided(v)
    }

    #[test]
    fn an_empty_command_line_waits_once_then_is_no_root() {
        assert_eq!(before_match(&c(None, false), Some(b""), 10, |_| None), decided(RootVerdict::WaitEmpty));
        assert_eq!(before_match(&c(None, true), Some(b""), 10, |_| None), decided(RootVerdict::Other));
        // A text that came in meanwhile is asked about.
        assert_eq!(before_match(&c(None, true), Some(b"agent"), 10, |_| None), Before::Ask);
    }

    #[test]
    fn gone_too_long_or_a_fork_that_never_execd_is_no_root() {
        assert_eq!(before_match(&c(None, false), None, 10, |_| None), decided(RootVerdict::Other));
        assert_eq!(before_match(&c(None, false), Some(&[b'a'; 11]), 10, |_| None), decided(RootVerdict::Other));
        assert_eq!(before_match(&c(None, false), Some(&[b'a'; 10]), 10, |_| None), Before::Ask);
        let same = |pp: u32| (pp == 6).then(|| b"agent --x".to_vec());
        assert_eq!(before_match(&c(Some(6), false), Some(b"agent --x"), 10, same), decided(RootVerdict::Other));
        assert_eq!(before_match(&c(Some(6), false), Some(b"agent --y"), 10, same), Before::Ask);
        // The parent is read only for an adopted candidate.
        let never = |_: u32| -> Option<Vec<u8>> { panic!("read the parent of an exec") };
        assert_eq!(before_match(&c(None, false), Some(b"agent --x"), 10, never), Before::Ask);
    }

    #[test]
    fn the_rounds_answer_decides_and_only_a_root_keeps_its_command_cut() {
        let long = vec![b'a'; 1000];
        let matched = Progress::Settled(MatchOutcome::Matched(0));
        assert_eq!(after_match(&long, &matched), Some(RootVerdict::Root { command: vec![b'a'; MAX_ROOT_COMMAND] }));
        assert_eq!(after_match(b"x", &Progress::Settled(MatchOutcome::NoMatch)), Some(RootVerdict::Other));
        assert_eq!(after_match(b"x", &Progress::Settled(MatchOutcome::Budget)), Some(RootVerdict::Other));
        assert_eq!(after_match(b"x", &Progress::Unsettled(Resume::default())), None);
    }

    #[test]
    fn the_byte_budget_holds_what_fits_and_leaves_the_rest_for_the_next_tick() {
        let max = 100;
        let mut b = CmdlineBudget::new(250, max);
        // Two whole texts of 100 fit; the third is read up to what is left (49) and waits.
        for _ in 0..2 {
            let limit = b.limit(max).unwrap();
            assert_eq!(limit, max);
            assert_eq!(b.take(Some(100), limit, max), Taken::Judge);
        }
        let limit = b.limit(max).unwrap();
        assert_eq!(limit, 49);
        assert_eq!(b.take(Some(50), limit, max), Taken::Later);
        assert!(b.exhausted && b.limit(max).is_none());
        // A text longer than the matcher takes is judged (too long) in a fresh budget.
        let mut b = CmdlineBudget::new(10, max);
        let limit = b.limit(max).unwrap();
        assert_eq!(limit, max, "a fresh budget always fits one whole text");
        assert_eq!(b.take(Some(101), limit, max), Taken::Judge);
        // Gone costs nothing.
        assert_eq!(b.take(None, 5, max), Taken::Judge);
    }

    fn cand(session: SessionId, pid: u32) -> Candidate {
        Candidate {
            session,
            process: ProcState { id: ProcId { pid, start_ticks: 1 }, ..c(None, false).process },
            ..c(None, false)
        }
    }

    #[test]
    fn a_reading_stops_at_the_budget_and_resumes_after_the_last_text_it_read() {
        // Four texts of 60 bytes, a budget of 150 and texts of at most 100: two are read.
        let cands: Vec<Candidate> = (0..4).map(|i| cand(10 + i, 100 + i as u32)).collect();
        let mut reads = Vec::new();
        let mut read = |pid: u32, limit: usize| {
            reads.push((pid, limit));
            Some(vec![b'a'; 60.min(limit + 1)])
        };
        let r = read_candidates(&cands, &mut read, 100, 150);
        assert_eq!(reads, [(100, 100), (101, 89), (102, 29)]);
        assert_eq!(r.asked.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [10, 11]);
        assert_eq!((r.read_after, r.capped), (Some(11), true));
        let v = verdicts(r, &[Progress::Settled(MatchOutcome::Matched(0)), Progress::Unsettled(Resume::default())]);
        assert_eq!(v, [(10, RootVerdict::Root { command: vec![b'a'; 60] })]);
    }

    #[test]
    fn four_thousand_empty_execs_cost_one_wait_each_and_never_hold_the_reading() {
        let mut cands: Vec<Candidate> = (0..4100).map(|i| cand(i, 1000 + i as u32)).collect();
        cands.push(cand(9999, 77));
        let mut read = |pid: u32, _| Some(if pid == 77 { b"agent-wrapper --x".to_vec() } else { Vec::new() });
        let first = read_candidates(&cands, &mut read, 1 << 20, 1 << 20);
        assert_eq!(first.decided.len(), 4100);
        assert!(first.decided.iter().all(|(_, v)| *v == RootVerdict::WaitEmpty));
        assert_eq!(first.asked.len(), 1, "the real root is asked about at the first reading");
        for c in &mut cands {
            c.waited_empty = true;
        }
        let second = read_candidates(&cands, &mut read, 1 << 20, 1 << 20);
        assert!(second.decided.iter().all(|(_, v)| *v == RootVerdict::Other));
    }
}
