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

/// Where a text stands between rounds: what a round that could not settle it learnt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resume {
    /// The first pattern still to try: every pattern before it answered "no match" on this
    /// text or overran on it.
    pub start: u32,
    /// Patterns before `start` that overran (or crashed the worker) on this very text. One is
    /// enough to protect the text whatever the rest say; `strikes` of them settle it as `Budget`.
    pub overruns: u32,
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
    /// Patterns before `start` that overran on this text: with one, the text is `Budget`
    /// without a later match; at `strikes`, it is `Budget` without trying the rest.
    overruns: u32,
}

impl Job {
    fn resume(&self) -> Resume {
        Resume { start: self.start, overruns: self.overruns }
    }

    /// What the text is once no pattern is left to try.
    fn exhausted(&self) -> Progress {
        Progress::Settled(if self.overruns > 0 { MatchOutcome::Budget } else { MatchOutcome::NoMatch })
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
                let job = Job { index, start: at.start, overruns: at.overruns };
                if n == 0 {
                    // Nothing can match, whatever the text's length.
                    out[index] = Some(Progress::Settled(MatchOutcome::NoMatch));
                } else if text.len() > max_text || job.overruns >= text_strikes {
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
        while !(queue.is_empty() && inflight.is_empty()) {
            if Instant::now() >= self.deadline || self.unexplained_deaths >= UNEXPLAINED_DEATHS {
                break;
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

            // 1. Fill: the skip set first when it changed, else texts up to the window.
            if written == pending.len() {
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
                        out[job.index] = Some(self.decide(job, matched, skipped, out_of_memory));
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
                let wake = if inflight.is_empty() { self.deadline } else { self.deadline.min(Instant::now() + sample) };
                let _ = poll_until(&mut fds[..count], wake);
            }
        }
        // Out of time (or of workers): a worker with texts in flight or half a frame is busy
        // with something nobody waits for any more.
        if !inflight.is_empty() || written < pending.len() {
            if let Some(mut w) = self.matcher.worker.take() {
                w.kill();
                self.matcher.stats.kills += 1;
            }
        }
        // What was not finished stands where it was sent from: a text cut off mid-run loses only
        // that run (an earlier pattern may have run out of memory on it, which only its answer
        // would have said).
        for (_, job) in inflight.drain(..) {
            out[job.index] = Some(Progress::Unsettled(job.resume()));
        }
        for job in queue.drain(..) {
            out[job.index] = Some(Progress::Unsettled(job.resume()));
        }
    }

    /// The outcome of an answer for `job`.
    fn decide(&mut self, job: Job, matched: u32, skipped: bool, out_of_memory: u32) -> Progress {
        let n = self.matcher.list.len();
        if out_of_memory != NONE && (out_of_memory as usize) < n {
            self.strike(out_of_memory as usize);
        }
        // A compromised worker could claim anything; an index it could not have tried is no
        // answer at all.
        if matched != NONE && (matched as usize) < n && matched >= job.start {
            Progress::Settled(MatchOutcome::Matched(matched as usize))
        } else if matched != NONE {
            Progress::Unsettled(job.resume())
        } else if job.overruns > 0 || out_of_memory != NONE {
            // A pattern could not decide on this very text: protected, whatever the skipped
            // patterns would say.
            Progress::Settled(MatchOutcome::Budget)
        } else if skipped {
            // Only patterns struck out on other texts stood between it and a verdict.
            Progress::Unsettled(job.resume())
        } else {
            Progress::Settled(MatchOutcome::NoMatch)
        }
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
                    out[job.index] = Some(self.decide(job, matched, skipped, out_of_memory));
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
        self.matcher.last_failure = Some(format!("the worker died ({fault}): {}", describe_end(status, page)));
        let mut unanswered: Vec<Job> = inflight.drain(..).map(|(_, job)| job).collect();
        match blamed {
            Some(at) => {
                self.strike(pattern as usize);
                let job = &mut unanswered[at];
                job.start = pattern + 1;
                job.overruns += 1;
                if job.overruns >= self.matcher.limits.strikes.max(1) {
                    let job = unanswered.remove(at);
                    out[job.index] = Some(Progress::Settled(MatchOutcome::Budget));
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
