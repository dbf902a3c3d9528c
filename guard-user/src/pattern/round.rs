//! [`Round`]: classify calls sharing one deadline and one set of strikes (the module doc of
//! [`matcher`](super::matcher) describes the bounds).
//!
//! The loop pipelines: up to [`WINDOW`] texts are in flight, written in batches of up to
//! [`BATCH_BYTES`] while answers stream back, all through non-blocking pipes. Between answers it
//! wakes every quarter of `per_match` to look at the progress page; the same progress word,
//! in the matching state, for `per_match` means the current regexec overran.
//!
//! [`Round::classify_from`] tells a settled verdict (the same list on the same text would give
//! it again) from one the round could not finish, and hands back where such a text stands
//! ([`Resume`]), so a caller that keeps it (the daemon's verdict cache) goes on from there in a
//! later round instead of paying again for the patterns that already overran on it.
use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

use super::{
    child::{describe_end, poll_until, Fault},
    matcher::{MatchOutcome, Matcher},
    page::{SharedPage, STATE_MATCHING},
    protocol::{self, Request, Response, NONE},
};

/// Texts sent and not yet answered, at most. Enough to keep the worker busy while answers
/// travel; small enough that a death re-sends little.
const WINDOW: usize = 64;
/// Bytes of text frames written in one go (a longer text goes alone).
const BATCH_BYTES: usize = 64 << 10;
/// Deaths in one round that no pattern explains, after which the round gives up (a broken
/// worker binary, a sandbox that stops every worker): the rest is `Budget`.
const UNEXPLAINED_DEATHS: u32 = 3;
/// Longest the regexec running at a round's deadline may go on past it (see `Round::run`).
const GRACE: Duration = Duration::from_millis(500);

/// Where a text stands between rounds: what a round that could not settle it learnt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resume {
    /// The first pattern still to try: every pattern before it answered "no match" on this
    /// text or overran on it.
    pub start: u32,
    /// Patterns before `start` that overran, crashed the worker or ran out of memory on this
    /// very text. One is enough to protect the text whatever the rest say; `strikes` of them
    /// settle it as `Budget`.
    pub failures: u32,
}

/// What a round made of one text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Decided. The same list on the same text gives this again: `Matched` and `NoMatch` are
    /// the patterns' answers, and `Budget` here means patterns overran or ran out of memory on
    /// this very text (so trying again would only overrun again), or the text is over
    /// `max_text_bytes`.
    Settled(MatchOutcome),
    /// Not decided in this round: its deadline came first, a pattern it still needed was struck
    /// out on other texts, or the worker could not run. Protect the text now (`Budget`) and go
    /// on from here in a later round.
    Unsettled(Resume),
}

impl Progress {
    /// The verdict for this round: an unsettled text is `Budget` (protected).
    pub fn outcome(self) -> MatchOutcome {
        match self {
            Progress::Settled(o) => o,
            Progress::Unsettled(_) => MatchOutcome::Budget,
        }
    }
}

/// One text's way through the worker.
#[derive(Clone, Copy, Debug)]
struct Job {
    /// Its position in the caller's slice.
    index: usize,
    /// The first pattern still to try (after a pattern that overran, the next one).
    start: u32,
    /// Patterns before `start` that failed on this text (overran, crashed the worker, ran out
    /// of memory): with one, the text is `Budget` without a later match; at `strikes`, it is
    /// `Budget` without trying the rest.
    failures: u32,
}

/// What an answer makes of a text.
enum Answered {
    Done(Progress),
    /// A pattern ran out of memory on it: go on after that pattern.
    Again(Job),
}

impl Job {
    fn resume(&self) -> Resume {
        Resume { start: self.start, failures: self.failures }
    }

    /// After a pattern failed on it: on from the next one, or settled at the failure cap.
    fn failed_at(mut self, pattern: u32, cap: u32) -> Answered {
        self.start = pattern + 1;
        self.failures += 1;
        if self.failures >= cap {
            Answered::Done(Progress::Settled(MatchOutcome::Budget))
        } else {
            Answered::Again(self)
        }
    }

    /// What the text is once no pattern is left to try.
    fn exhausted(&self) -> Progress {
        Progress::Settled(if self.failures > 0 { MatchOutcome::Budget } else { MatchOutcome::NoMatch })
    }
}

/// Classify calls that share a deadline and strikes. Made by [`Matcher::round`].
pub struct Round<'m> {
    matcher: &'m mut Matcher,
    deadline: Instant,
    /// Per pattern: how often it overran, crashed the worker or ran out of memory this round.
    strikes: Vec<u32>,
    /// Per pattern: struck out, no longer run this round.
    undecidable: Vec<bool>,
    unexplained_deaths: u32,
}

impl<'m> Round<'m> {
    pub(crate) fn new(matcher: &'m mut Matcher, deadline: Instant) -> Round<'m> {
        let n = matcher.list.len();
        Round { matcher, deadline, strikes: vec![0; n], undecidable: vec![false; n], unexplained_deaths: 0 }
    }

    #[cfg(any(test, feature = "testing"))]
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Patterns struck out this round (for a `WARN` naming them).
    pub fn undecidable(&self) -> Vec<usize> {
        (0..self.undecidable.len()).filter(|&j| self.undecidable[j]).collect()
    }

    /// The verdict for each text, in order (see [`MatchOutcome`]). Returns by the round's
    /// deadline; never blocks on the worker beyond it.
    pub fn classify(&mut self, texts: &[&[u8]]) -> Vec<MatchOutcome> {
        let fresh = vec![Resume::default(); texts.len()];
        self.classify_from(texts, &fresh).into_iter().map(Progress::outcome).collect()
    }

    /// [`Round::classify`] for texts that may have been started in an earlier round with the
    /// same list: `from[i]` is where text `i` stands ([`Resume::default`] for a new one). A text
    /// on which `strikes` patterns overran is settled as `Budget` without trying the rest: it is
    /// protected whatever they say, and each of them could cost another `per_match`.
    pub fn classify_from(&mut self, texts: &[&[u8]], from: &[Resume]) -> Vec<Progress> {
        assert_eq!(texts.len(), from.len(), "one resume point per text");
        let n = self.matcher.list.len();
        let compiled = matches!(self.matcher.verdict, Some(Ok(())));
        let mut out: Vec<Option<Progress>> = vec![None; texts.len()];
        if compiled {
            let max_text = self.matcher.limits.max_text_bytes;
            let text_strikes = self.matcher.limits.strikes.max(1);
            let mut queue: VecDeque<Job> = VecDeque::new();
            for (index, (text, at)) in texts.iter().zip(from).enumerate() {
                let job = Job { index, start: at.start, failures: at.failures };
                if n == 0 {
                    // Nothing can match, whatever the text's length.
                    out[index] = Some(Progress::Settled(MatchOutcome::NoMatch));
                } else if text.len() > max_text || job.failures >= text_strikes {
                    out[index] = Some(Progress::Settled(MatchOutcome::Budget));
                } else if job.start as usize >= n {
                    out[index] = Some(job.exhausted());
                } else {
                    queue.push_back(job);
                }
            }
            self.run(texts, queue, &mut out);
        }
        let progress: Vec<Progress> =
            out.into_iter().zip(from).map(|(o, at)| o.unwrap_or(Progress::Unsettled(*at))).collect();
        self.matcher.stats.budget += progress.iter().filter(|p| p.outcome() == MatchOutcome::Budget).count() as u64;
        progress
    }

    /// The pipelined loop. Texts it cannot finish are left `Unsettled` where they stand.
    fn run(&mut self, texts: &[&[u8]], mut queue: VecDeque<Job>, out: &mut [Option<Progress>]) {
        let n = self.matcher.list.len();
        let per_match = self.matcher.limits.per_match;
        let sample = (per_match / 4).max(Duration::from_millis(1));
        let mut inflight: VecDeque<(u32, Job)> = VecDeque::new();
        let mut pending: Vec<u8> = Vec::new();
        let mut written = 0;
        // The progress word last seen, and since when.
        let mut watch: Option<(u32, Instant)> = None;
        // The regexec running when the deadline came (its progress word): it may go on until it
        // ends or reaches its own per-match bound (at most `GRACE` past the deadline), so a round
        // that started a pattern on a text learns something that lasts (an answer, or an overrun
        // to resume past) instead of losing it to the deadline.
        let mut grace: Option<u32> = None;
        let grace_ends = self.deadline + (per_match + sample).min(GRACE);
        while !(queue.is_empty() && inflight.is_empty()) {
            if self.unexplained_deaths >= UNEXPLAINED_DEATHS {
                break;
            }
            let now = Instant::now();
            let past = now >= self.deadline;
            if now >= grace_ends {
                break;
            }
            if past {
                let matching = self.matcher.worker.as_ref().is_some_and(|w| w.compiled) && !inflight.is_empty();
                let word = self.matcher.page.as_ref().map(SharedPage::progress);
                match word {
                    Some(w)
                        if matching && SharedPage::state_of(w) == STATE_MATCHING && grace.is_none_or(|g| g == w) =>
                    {
                        grace = Some(w)
                    }
                    _ => break,
                }
            }
            let needs_worker = self.matcher.worker.as_ref().is_none_or(|w| !w.compiled);
            if needs_worker {
                if self.matcher.ensure_worker(self.deadline).is_err() {
                    break;
                }
                (written, watch) = (0, None);
                pending.clear();
            }
            let worker = self.matcher.worker.as_mut().expect("ensured above");

            // 1. Fill (not past the deadline): the skip set first when it changed, else texts up
            //    to the window.
            if written == pending.len() && !past {
                pending.clear();
                written = 0;
                let wanted: Vec<u32> = (0..n).filter(|&j| self.undecidable[j]).map(|j| j as u32).collect();
                if worker.skips != wanted {
                    protocol::encode_request(&Request::Skip(wanted.clone()), &mut pending);
                    worker.skips = wanted;
                }
                while inflight.len() < WINDOW && pending.len() < BATCH_BYTES {
                    let Some(job) = queue.pop_front() else { break };
                    if job.start as usize >= n {
                        out[job.index] = Some(job.exhausted());
                        continue;
                    }
                    let seq = worker.next_seq;
                    worker.next_seq = seq.wrapping_add(1);
                    let text = texts[job.index];
                    protocol::encode_request(&Request::Text { seq, start: job.start, text }, &mut pending);
                    self.matcher.stats.texts += 1;
                    inflight.push_back((seq, job));
                }
            }

            // 2. Write what the pipe takes, read and settle what came back.
            let mut fault = None;
            let mut progressed = false;
            if written < pending.len() {
                match worker.write_some(&pending[written..]) {
                    Ok(k) => {
                        written += k;
                        progressed |= k > 0;
                    }
                    Err(f) => fault = Some(f),
                }
            }
            if fault.is_none() {
                if let Err(f) = worker.read_some() {
                    fault = Some(f);
                }
            }
            let mut answers = Vec::new();
            loop {
                match worker.parse_next() {
                    Ok(Some(Response::Answer { seq, matched, skipped, out_of_memory })) => {
                        answers.push((seq, matched, skipped, out_of_memory));
                    }
                    Ok(Some(other)) => {
                        fault = Some(Fault::Protocol(format!("unexpected {other:?}")));
                        break;
                    }
                    Ok(None) => break,
                    Err(f) => {
                        fault = Some(f);
                        break;
                    }
                }
            }
            let (stdout_fd, stdin_fd) = (worker.stdout_fd(), worker.stdin_fd());
            for (seq, matched, skipped, out_of_memory) in answers {
                match inflight.front() {
                    Some(&(s, job)) if s == seq => {
                        inflight.pop_front();
                        match self.decide(job, matched, skipped, out_of_memory) {
                            Answered::Done(p) => out[job.index] = Some(p),
                            Answered::Again(job) => queue.push_back(job),
                        }
                        progressed = true;
                    }
                    _ => {
                        fault = Some(Fault::Protocol(format!("answer for text {seq} out of order")));
                        break;
                    }
                }
            }

            // 3. The watchdog: the same progress word in the matching state for `per_match`.
            if fault.is_none() && !inflight.is_empty() {
                let word = self.matcher.page.as_ref().expect("a worker has a page").progress();
                let now = Instant::now();
                match watch {
                    Some((seen, since)) if seen == word => {
                        if SharedPage::state_of(word) == STATE_MATCHING && now - since >= per_match {
                            fault = Some(Fault::Timeout);
                        }
                    }
                    _ => watch = Some((word, now)),
                }
            }
            if let Some(fault) = fault {
                self.bury(fault, &mut queue, &mut inflight, out);
                (written, watch) = (0, None);
                pending.clear();
                continue;
            }

            // 4. Nothing moved: wait for the pipes, the next sample, or the deadline.
            let idle = inflight.is_empty() && written == pending.len();
            if !progressed && !idle {
                let mut fds = [
                    libc::pollfd { fd: stdout_fd, events: libc::POLLIN, revents: 0 },
                    libc::pollfd { fd: stdin_fd, events: libc::POLLOUT, revents: 0 },
                ];
                let count = if written < pending.len() { 2 } else { 1 };
                let wake = match (past, inflight.is_empty()) {
                    (true, _) => grace_ends.min(Instant::now() + sample),
                    (false, true) => self.deadline,
                    (false, false) => self.deadline.min(Instant::now() + sample),
                };
                let _ = poll_until(&mut fds[..count], wake);
            }
        }
        // Out of time (or of workers): a worker with texts in flight or half a frame is busy
        // with something nobody waits for any more.
        if !inflight.is_empty() || written < pending.len() {
            if let Some(mut w) = self.matcher.worker.take() {
                w.kill();
                self.matcher.stats.kills += 1;
                self.note_where_cut(&mut inflight);
            }
        }
        for (_, job) in inflight.drain(..) {
            out[job.index] = Some(Progress::Unsettled(job.resume()));
        }
        for job in queue.drain(..) {
            out[job.index] = Some(Progress::Unsettled(job.resume()));
        }
    }

    /// The outcome of an answer for `job`.
    fn decide(&mut self, job: Job, matched: u32, skipped: bool, out_of_memory: u32) -> Answered {
        let n = self.matcher.list.len();
        // A compromised worker could claim anything; an index it could not have tried is no
        // answer at all.
        let tried = |j: u32| (j as usize) < n && j >= job.start;
        if matched != NONE && tried(matched) {
            Answered::Done(Progress::Settled(MatchOutcome::Matched(matched as usize)))
        } else if matched != NONE {
            Answered::Done(Progress::Unsettled(job.resume()))
        } else if out_of_memory != NONE && tried(out_of_memory) {
            self.strike(out_of_memory as usize);
            job.failed_at(out_of_memory, self.matcher.limits.strikes.max(1))
        } else if out_of_memory != NONE || job.failures > 0 {
            // A pattern could not decide on this very text: protected, whatever the skipped
            // patterns would say.
            Answered::Done(Progress::Settled(MatchOutcome::Budget))
        } else if skipped {
            // Only patterns struck out on other texts stood between it and a verdict.
            Answered::Done(Progress::Unsettled(job.resume()))
        } else {
            Answered::Done(Progress::Settled(MatchOutcome::NoMatch))
        }
    }

    /// The worker was killed at the round's end: the text it was matching goes on, next time,
    /// at the pattern it was running. Every pattern before that answered "no match" on it: a
    /// failure would have ended the run with an answer, and a match too. Patterns this round
    /// skipped were not run, so the text goes on no further than the first of them.
    fn note_where_cut(&self, inflight: &mut VecDeque<(u32, Job)>) {
        let Some(page) = self.matcher.page.as_ref() else { return };
        let (state, seq, pattern) = page.last_noted();
        if state != STATE_MATCHING {
            return;
        }
        let Some((_, job)) = inflight.iter_mut().find(|(s, _)| *s == seq) else { return };
        let first_skipped = (job.start..pattern).find(|&j| self.undecidable.get(j as usize).copied().unwrap_or(true));
        let reached = first_skipped.unwrap_or(pattern).min(self.matcher.list.len() as u32);
        job.start = job.start.max(reached);
    }

    fn strike(&mut self, pattern: usize) {
        self.strikes[pattern] += 1;
        if self.strikes[pattern] >= self.matcher.limits.strikes.max(1) {
            self.undecidable[pattern] = true;
        }
    }

    /// Kills and reaps the worker after `fault`, settles the answers it sent before dying,
    /// blames the pattern the progress page names (that text resumes after it) and re-queues
    /// the other unanswered texts in order.
    fn bury(
        &mut self,
        fault: Fault,
        queue: &mut VecDeque<Job>,
        inflight: &mut VecDeque<(u32, Job)>,
        out: &mut [Option<Progress>],
    ) {
        let n = self.matcher.list.len();
        let mut worker = self.matcher.worker.take().expect("a worker to bury");
        let status = worker.kill();
        while let Ok(Some(Response::Answer { seq, matched, skipped, out_of_memory })) = worker.parse_next() {
            match inflight.front() {
                Some(&(s, job)) if s == seq => {
                    inflight.pop_front();
                    match self.decide(job, matched, skipped, out_of_memory) {
                        Answered::Done(p) => out[job.index] = Some(p),
                        Answered::Again(job) => queue.push_back(job),
                    }
                }
                _ => break,
            }
        }
        drop(worker);
        match fault {
            Fault::Timeout => self.matcher.stats.kills += 1,
            _ => self.matcher.stats.deaths += 1,
        }
        let page = self.matcher.page.as_ref().expect("a worker has a page");
        let (state, seq, pattern) = page.last_noted();
        // Whatever killed it mid-regexec (its deadline, its memory, its stack, a syscall glibc
        // made on a failure path, an outside signal), that text and pattern were running.
        let blamed = (state == STATE_MATCHING && (pattern as usize) < n)
            .then(|| inflight.iter().position(|&(s, _)| s == seq))
            .flatten();
        let what = format!("the worker died ({fault}): {}", describe_end(status, page));
        self.matcher.failed(|| what);
        let mut unanswered: Vec<Job> = inflight.drain(..).map(|(_, job)| job).collect();
        match blamed {
            Some(at) => {
                self.strike(pattern as usize);
                let job = unanswered.remove(at);
                match job.failed_at(pattern, self.matcher.limits.strikes.max(1)) {
                    Answered::Done(p) => out[job.index] = Some(p),
                    Answered::Again(job) => unanswered.insert(at, job),
                }
            }
            None => {
                // Nothing to blame: the oldest text pays (for this round only), so a worker
                // that keeps dying still lets the round move on.
                self.unexplained_deaths += 1;
                if !unanswered.is_empty() {
                    let job = unanswered.remove(0);
                    out[job.index] = Some(Progress::Unsettled(job.resume()));
                }
            }
        }
        for job in unanswered.into_iter().rev() {
            queue.push_front(job);
        }
    }
}
