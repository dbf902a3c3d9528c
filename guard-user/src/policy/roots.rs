//! Recognising session roots: the pure rules (docs/configuration.md `sessions`). The tick hands
//! each pending exec ([`Candidate`], round-robin from where its last reading stopped) to these
//! rules with what reading its command line gave, within the tick's reading time and the bytes it
//! holds for matchers (the tick's command-line budget, shared with `excludeCommands`); the matcher's
//! round over the texts [`read_candidates`] asked about settles the rest.
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

/// What reading one candidate's command line gave (the reading, its time and the bytes held
/// for the matcher are the tick's: `daemon::sessions`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Got<T> {
    /// The process is gone.
    Gone,
    /// Not read this tick (its reading time ran out, or the bytes held for matchers are full):
    /// read first next tick.
    Later,
    /// Longer than the matcher takes.
    TooLong,
    /// Its command line, held for the matcher (possibly empty).
    Text(T),
}

/// How the rules read candidates' command lines.
pub trait CandidateReader {
    type Held: std::ops::Deref<Target = [u8]>;
    /// The command line of `pid`.
    fn read(&mut self, pid: u32) -> Got<Self::Held>;
    /// Whether `pid`'s command line reads exactly `text` (a parent's, for an adopted candidate).
    fn reads_as(&mut self, pid: u32, text: &[u8]) -> bool;
}

/// One tick's reading of the candidates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reading<T> {
    /// Verdicts reached without the patterns.
    pub decided: Vec<(SessionId, RootVerdict)>,
    /// Texts for the roots' round (held until it is over).
    pub asked: Vec<(SessionId, T)>,
    /// The last candidate read: the next reading starts after it.
    pub read_after: Option<SessionId>,
    /// The tick's reading time or held bytes left candidates for the next tick.
    pub capped: bool,
}

/// Reads the candidates in the order handed (round-robin) until one cannot be read this tick
/// (it is then first in line next tick), and applies the rules of the module doc to each.
pub fn read_candidates<R: CandidateReader>(candidates: &[Candidate], reader: &mut R) -> Reading<R::Held> {
    let mut out = Reading { decided: Vec::new(), asked: Vec::new(), read_after: None, capped: false };
    for c in candidates {
        let verdict = match reader.read(c.process.id.pid) {
            Got::Later => {
                out.capped = true;
                break;
            }
            Got::Gone | Got::TooLong => RootVerdict::Other,
            Got::Text(t) if t.is_empty() => {
                if c.waited_empty {
                    RootVerdict::Other
                } else {
                    RootVerdict::WaitEmpty
                }
            }
            Got::Text(t) if c.parent.is_some_and(|pp| reader.reads_as(pp, &t)) => RootVerdict::Other,
            Got::Text(t) => {
                out.read_after = Some(c.session);
                out.asked.push((c.session, t));
                continue;
            }
        };
        out.read_after = Some(c.session);
        out.decided.push((c.session, verdict));
    }
    out
}

/// The verdicts of a reading, once the roots' round answered `progress` for its `asked` texts
/// (which are dropped here). Unsettled ones have none: asked again when their turn comes back.
pub fn verdicts<T: std::ops::Deref<Target = [u8]>>(
    reading: Reading<T>,
    progress: &[Progress],
) -> Vec<(SessionId, RootVerdict)> {
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

    #[test]
    fn the_rounds_answer_decides_and_only_a_root_keeps_its_command_cut() {
        let long = vec![b'a'; 1000];
        let matched = Progress::Settled(MatchOutcome::Matched(0));
        assert_eq!(after_match(&long, &matched), Some(RootVerdict::Root { command: vec![b'a'; MAX_ROOT_COMMAND] }));
        assert_eq!(after_match(b"x", &Progress::Settled(MatchOutcome::NoMatch)), Some(RootVerdict::Other));
        assert_eq!(after_match(b"x", &Progress::Settled(MatchOutcome::Budget)), Some(RootVerdict::Other));
        assert_eq!(after_match(b"x", &Progress::Unsettled(Resume::default())), None);
    }

    fn cand(session: SessionId, pid: u32) -> Candidate {
        Candidate {
            session,
            process: ProcState { id: ProcId { pid, start_ticks: 1 }, ..c(None, false).process },
            ..c(None, false)
        }
    }

    /// Texts by pid; `later` from that pid on nothing is read.
    struct Fake {
        texts: std::collections::HashMap<u32, Vec<u8>>,
        later_from: Option<u32>,
        reads: Vec<u32>,
    }

    impl CandidateReader for Fake {
        type Held = Vec<u8>;
        fn read(&mut self, pid: u32) -> Got<Vec<u8>> {
            self.reads.push(pid);
            if self.later_from.is_some_and(|l| pid >= l) {
                return Got::Later;
            }
            match self.texts.get(&pid) {
                Some(t) if t.len() > 100 => Got::TooLong,
                Some(t) => Got::Text(t.clone()),
                None => Got::Gone,
            }
        }
        fn reads_as(&mut self, pid: u32, text: &[u8]) -> bool {
            self.texts.get(&pid).is_some_and(|t| t == text)
        }
    }

    #[test]
    fn a_reading_stops_at_the_first_it_cannot_do_and_resumes_after_the_last_it_did() {
        let cands: Vec<Candidate> = (0..4).map(|i| cand(10 + i, 100 + i as u32)).collect();
        let texts = (100..104).map(|p| (p, b"agent --x".to_vec())).collect();
        let mut r = Fake { texts, later_from: Some(102), reads: Vec::new() };
        let reading = read_candidates(&cands, &mut r);
        assert_eq!(r.reads, [100, 101, 102], "nothing read after the one left for later");
        assert_eq!(reading.asked.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [10, 11]);
        assert_eq!((reading.read_after, reading.capped), (Some(11), true));
        let v =
            verdicts(reading, &[Progress::Settled(MatchOutcome::Matched(0)), Progress::Unsettled(Resume::default())]);
        assert_eq!(v, [(10, RootVerdict::Root { command: b"agent --x".to_vec() })]);
    }

    #[test]
    fn gone_too_long_empty_or_its_parents_text_is_decided_without_the_patterns() {
        let mut adopted = cand(4, 104);
        adopted.parent = Some(105);
        let cands = [cand(1, 101), cand(2, 102), cand(3, 103), adopted];
        let texts = [(102, vec![b'a'; 101]), (103, Vec::new()), (104, b"agent".to_vec()), (105, b"agent".to_vec())];
        let mut r = Fake { texts: texts.into_iter().collect(), later_from: None, reads: Vec::new() };
        let reading = read_candidates(&cands, &mut r);
        assert_eq!(
            reading.decided,
            [(1, RootVerdict::Other), (2, RootVerdict::Other), (3, RootVerdict::WaitEmpty), (4, RootVerdict::Other)]
        );
        assert!(reading.asked.is_empty() && !reading.capped);
        assert_eq!(reading.read_after, Some(4));
    }

    #[test]
    fn four_thousand_empty_execs_cost_one_wait_each_and_never_hold_the_reading() {
        let mut cands: Vec<Candidate> = (0..4100).map(|i| cand(i, 1000 + i as u32)).collect();
        cands.push(cand(9999, 77));
        let mut texts: std::collections::HashMap<u32, Vec<u8>> = (1000..5100).map(|p| (p, Vec::new())).collect();
        texts.insert(77, b"agent-wrapper --x".to_vec());
        let mut r = Fake { texts, later_from: None, reads: Vec::new() };
        let first = read_candidates(&cands, &mut r);
        assert_eq!(first.decided.len(), 4100);
        assert!(first.decided.iter().all(|(_, v)| *v == RootVerdict::WaitEmpty));
        assert_eq!(first.asked.len(), 1, "the real root is asked about at the first reading");
        for c in &mut cands {
            c.waited_empty = true;
        }
        let second = read_candidates(&cands, &mut r);
        assert!(second.decided.iter().all(|(_, v)| *v == RootVerdict::Other));
    }
}
