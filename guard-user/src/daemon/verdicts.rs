//! The verdict on the command line of every process a tick may end, and the cache that makes an
//! unchanged process cost one match, not one per tick (docs/architecture.md, docs/configuration.md).
//!
//! A name at or over the threshold needs verdicts on every tick, due or not: `status` shows
//! how many of its processes would be skipped or ended, and `WARNING` counts them. Matching is
//! the costly part (the account writes the patterns; a hostile list can make every match run
//! into its bound), and nothing about a verdict changes while the pattern list, the process and
//! its command line stay the same. So each tick, in the order `policy::cmdline::reading_order`
//! gives:
//!
//! 1. reads each command line again (a process may rewrite its argv at any time), into one
//!    buffer, within the tick's reading time ([`Ask::reads_until`]) and each read within its
//!    share of it ([`Ask::per_read`]): a command line not read in time protects its process for
//!    this tick (`SKIPPED … reason=read_budget`) and is read first next tick, one whose own read
//!    overran its share is read last next tick ([`Deferred`]);
//! 2. serves a settled verdict from the [`VerdictCache`] when the list, the process identity
//!    (pid and start time) and the command line are those it was reached on, and drops the text;
//! 3. keeps the rest for the matcher, each distinct text once (forks share their argv: 300
//!    processes with one 1 MiB command line are one text), in a [`Pool`] of
//!    [`HELD_CMDLINE_BYTES`]: when the next text does not fit, the texts kept so far are matched
//!    in one round and dropped, so more command lines cost more rounds, never more memory;
//! 4. keeps what the rounds settled, and where they left what they could not finish (that
//!    process is protected this tick, `match_budget`, and goes on from there next tick);
//! 5. forgets every process it did not see this tick (before keeping new verdicts, so a
//!    process that replaces one gets its room at once).
//!
//! # What the cache holds, and its cap
//! Per process (pid + start time): the command line's length and a 128-bit keyed hash of it
//! (two SipHash keys drawn from the OS at start, never shown anywhere), and the round's
//! [`Progress`]. The hash stands in for the bytes so an entry costs the same whatever the
//! account puts in its argv (up to 1 MiB each); the account cannot aim a changed command line at
//! an old verdict without knowing the keys, and a chance collision is 2⁻¹²⁸ per change. The
//! same key tells two processes' identical texts apart from different ones within a tick. At
//! most [`MAX_ENTRIES`] entries (about 1 MiB); past the cap a new process's verdict is not kept,
//! so it is matched again each tick, within the budget, as every process was before the cache.
//! Beside them, whether each process's command line was longer than `CHEAP_BYTES` when last
//! read (at most [`MAX_ENTRIES`], about 32 bytes each): long ones are read after short ones.
//!
//! # Without patterns, and past the matcher's cap
//! An empty `excludeCommands` list protects nothing, so every live process is `End` without
//! reading its command line or asking the matcher: neither a command line over its cap, nor a
//! slow one, nor a worker that cannot run may protect what no pattern could. With patterns, a
//! command line over the cap (1 MiB) is never matched on a cut-off prefix (`$` would change
//! meaning) and is protected as `TooLong`, logged `SKIPPED … reason=cmdline_too_long`: a reason
//! of its own, since padding its arguments is a way for the account to be protected that no
//! pattern shows.
//!
//! # What is never cached into an end
//! Only `NoMatch` leads to an end, and it is only ever settled after every pattern answered "no
//! match" on exactly this text. A settled `Budget` (patterns overran or ran out of memory on
//! this very text) is kept: trying again would overrun again, and the process is protected
//! either way. An unsettled text (the round's budget ran out, a pattern it needed was struck out
//! on other texts, the worker was down) is protected for this tick only and tried again.
use std::{
    collections::{HashMap, HashSet},
    hash::{BuildHasher, Hasher, RandomState},
    time::{Duration, Instant},
};

use super::{
    cmdlines::{CmdlineReader, Read},
    effects::Classifier,
};
use crate::{
    budget::Held,
    config::Config,
    event::ProcId,
    pattern::{MatchOutcome, Progress, Resume},
    policy::{
        cmdline::{needs_reading, reading_order, route, Cost, Deferred, Route, Waiting, CHEAP_BYTES},
        AccountView, CmdVerdict, FlagClocks,
    },
};

/// Most processes whose verdicts are kept (about 64 bytes each).
pub const MAX_ENTRIES: usize = 16_384;

/// The matching round's share of a tick: a twentieth of the interval (3 s of a 60 s tick, so a
/// list that overruns on every command line costs at most 5 % of a core), at least 2 s (a fresh
/// worker, the list compiled in it and one overrun fit even on a loaded host, so every round
/// makes progress), and never more than half the tick's deadline.
pub fn round_budget(interval: Duration, deadline: Duration) -> Duration {
    (interval / 20).max(Duration::from_secs(2)).min(deadline / 2)
}

/// A command line as the cache remembers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TextKey {
    len: usize,
    hash: [u64; 2],
}

/// One process's verdict, and the command line it was reached on.
#[derive(Clone, Copy, Debug)]
struct Entry {
    text: TextKey,
    progress: Progress,
}

/// Settled verdicts, and unsettled texts' progress, of one pattern list. See the module doc.
pub struct VerdictCache {
    /// The pattern list every entry was reached with; another list empties the cache.
    list: Option<Vec<String>>,
    entries: HashMap<ProcId, Entry>,
    /// The processes whose command lines the last tick did not read, why, and since when (where
    /// they stand in this tick's reading order). At most one per process of a name at the
    /// threshold, and [`MAX_ENTRIES`].
    deferred: HashMap<ProcId, Waiting>,
    /// Whether each process's command line was longer than [`CHEAP_BYTES`] when last read (a
    /// long one is read after the short ones, `policy::cmdline::reading_order`), at most
    /// [`MAX_ENTRIES`] processes.
    long: HashMap<ProcId, bool>,
    /// Calls of [`verdicts`] so far: the clock of [`Waiting::since`].
    ticks: u64,
    keys: [RandomState; 2],
    cap: usize,
}

impl Default for VerdictCache {
    fn default() -> VerdictCache {
        VerdictCache::with_cap(MAX_ENTRIES)
    }
}

impl VerdictCache {
    /// A cache of at most `cap` entries (0: nothing is kept, every tick matches everything).
    pub fn with_cap(cap: usize) -> VerdictCache {
        VerdictCache {
            list: None,
            entries: HashMap::new(),
            deferred: HashMap::new(),
            long: HashMap::new(),
            ticks: 0,
            keys: [RandomState::new(), RandomState::new()],
            cap,
        }
    }

    /// The daemon's cache: [`MAX_ENTRIES`], or none with `GUARD_MATCH_CACHE=off` (to measure what
    /// it saves: `cargo xtask bench --only matcher`).
    pub fn for_daemon() -> VerdictCache {
        let off = std::env::var_os("GUARD_MATCH_CACHE").is_some_and(|v| v == "off");
        VerdictCache::with_cap(if off { 0 } else { MAX_ENTRIES })
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(any(test, feature = "testing"))]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The list this tick matches with: a list other than the last one empties the cache.
    pub fn use_list(&mut self, list: &[String]) {
        if self.list.as_deref() != Some(list) {
            self.entries.clear();
            self.list = Some(list.to_vec());
        }
    }

    /// `text`'s key (see the module doc).
    pub fn key(&self, text: &[u8]) -> TextKey {
        let hash = self.keys.each_ref().map(|k| {
            let mut h = k.build_hasher();
            h.write(text);
            h.finish()
        });
        TextKey { len: text.len(), hash }
    }

    /// What is known of process `id` with the command line `text`: nothing when either changed.
    pub fn lookup(&self, id: ProcId, text: TextKey) -> Option<Progress> {
        self.entries.get(&id).filter(|e| e.text == text).map(|e| e.progress)
    }

    /// Keeps `progress` for `id` and `text`, replacing what was there. False when the cache is
    /// full and `id` has no entry (it is then matched again next tick).
    pub fn store(&mut self, id: ProcId, text: TextKey, progress: Progress) -> bool {
        if let Some(e) = self.entries.get_mut(&id) {
            *e = Entry { text, progress };
            return true;
        }
        if self.entries.len() >= self.cap {
            return false;
        }
        self.entries.insert(id, Entry { text, progress });
        true
    }

    /// The command lines settled `End` (every pattern of the list answered "no match" on them),
    /// whichever process they were read from: the verdict is the list's on the text alone, so a
    /// fork that kept one of them as its command line has that verdict too (a stop's chase,
    /// `daemon::sessions`).
    pub fn end_texts(&self) -> HashSet<TextKey> {
        let end = |e: &&Entry| matches!(e.progress, Progress::Settled(MatchOutcome::NoMatch));
        self.entries.values().filter(end).map(|e| e.text).collect()
    }

    /// What is known of the cost of process `id`'s command line: costly when it was longer than
    /// [`CHEAP_BYTES`] when last read, or is a text a pattern overran on and that is not settled
    /// yet (`policy::cmdline::reading_order` reads it after every cheap one).
    pub fn cost(&self, id: ProcId) -> Cost {
        let overran = || self.entries.get(&id).is_some_and(|e| matches!(e.progress, Progress::Unsettled(r) if r.failures > 0));
        match self.long.get(&id) {
            None => Cost::Unknown,
            Some(true) => Cost::Costly,
            Some(false) if overran() => Cost::Costly,
            Some(false) => Cost::Cheap,
        }
    }

    /// Remembers how long the command line just read for process `id` was.
    fn note_length(&mut self, id: ProcId, len: usize) {
        let long = len > CHEAP_BYTES;
        if let Some(l) = self.long.get_mut(&id) {
            *l = long;
        } else if self.long.len() < MAX_ENTRIES {
            self.long.insert(id, long);
        }
    }

    /// Forgets one process (it is gone).
    pub fn forget(&mut self, id: ProcId) {
        self.entries.remove(&id);
        self.deferred.remove(&id);
        self.long.remove(&id);
    }

    /// Forgets every process not in `seen`.
    pub fn keep_only(&mut self, seen: &HashSet<ProcId>) {
        self.entries.retain(|id, _| seen.contains(id));
        self.deferred.retain(|id, _| seen.contains(id));
        self.long.retain(|id, _| seen.contains(id));
    }
}

/// What a tick has gathered when it asks for verdicts.
#[derive(Clone, Copy)]
pub struct Ask<'a> {
    pub view: &'a AccountView,
    pub config: &'a Config,
    /// The flag clocks: the name flagged longest is read and matched first.
    pub clocks: &'a FlagClocks,
    /// The matcher holds `config`'s list; when it does not (a broken worker), only cached
    /// verdicts are used and everything else is protected.
    pub matcher_ok: bool,
    /// When the matching rounds must end.
    pub deadline: Instant,
}

/// What one call of [`verdicts`] did (for `GUARD_LOG=debug`, the status and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Work {
    /// Verdicts served from the cache.
    pub cached: usize,
    /// Distinct command lines sent to the matcher.
    pub asked: usize,
    /// Of those, left unsettled (protected this tick, tried again).
    pub unsettled: usize,
    /// Processes whose command line was the same text as another's sent this tick (matched
    /// once for all of them).
    pub shared: usize,
    /// Processes whose command line was not read in time (protected this tick, `read_budget`):
    /// the tick's reading time ran out before them, or their own read overran its share.
    pub deferred: usize,
    /// Of those, the ones whose own read overran its share.
    pub slow: usize,
    /// Matching rounds (more than one when the texts to match did not fit the pool at once).
    pub rounds: usize,
    /// The most command-line bytes held at one time for the matcher.
    pub held_peak: usize,
}

/// Texts waiting for the matcher: each distinct one once, the processes that share it.
struct Batch {
    texts: Vec<Pending>,
    /// Position in `texts` by text key.
    index: HashMap<TextKey, usize>,
    /// Texts this tick already settled or left unsettled, for processes read after their round.
    known: HashMap<TextKey, Progress>,
}

struct Pending {
    text: Held,
    key: TextKey,
    from: Resume,
    ids: Vec<ProcId>,
}

impl Batch {
    /// Sends every waiting text to the matcher in one round, keeps the answers, drops the texts.
    fn flush(
        &mut self,
        cache: &mut VerdictCache,
        classifier: &mut dyn Classifier,
        deadline: Instant,
        out: &mut HashMap<ProcId, CmdVerdict>,
        work: &mut Work,
    ) {
        if self.texts.is_empty() {
            return;
        }
        let texts: Vec<&[u8]> = self.texts.iter().map(|w| &*w.text).collect();
        let from: Vec<Resume> = self.texts.iter().map(|w| w.from).collect();
        let progress = classifier.classify_from(&texts, &from, deadline);
        drop(texts);
        work.rounds += 1;
        work.asked += self.texts.len();
        for (w, p) in self.texts.drain(..).zip(progress) {
            if matches!(p, Progress::Unsettled(_)) {
                work.unsettled += 1;
            }
            for id in &w.ids {
                cache.store(*id, w.key, p);
                out.insert(*id, verdict(p.outcome()));
            }
            self.known.insert(w.key, p);
        }
        self.index.clear();
    }
}

/// The verdict on the command line of every process `policy::cmdline::reading_order` names (see
/// the module doc).
pub fn verdicts(
    cache: &mut VerdictCache,
    reader: &mut CmdlineReader,
    classifier: &mut dyn Classifier,
    ask: Ask,
) -> (HashMap<ProcId, CmdVerdict>, Work) {
    let Ask { view, config, clocks, matcher_ok, deadline } = ask;
    cache.use_list(&config.exclude_commands);
    cache.ticks += 1;
    let has_patterns = !config.exclude_commands.is_empty();
    let max = classifier.max_text_bytes();
    let order = reading_order(view, config, clocks, &cache.deferred, |id| cache.cost(id));
    // Forget the processes not seen before keeping new verdicts, so they make room at once.
    let seen: HashSet<ProcId> = order.iter().map(|p| p.id).collect();
    cache.keep_only(&seen);
    let mut out = HashMap::with_capacity(order.len());
    let mut deferred = HashMap::new();
    let mut work = Work::default();
    let mut batch = Batch { texts: Vec::new(), index: HashMap::new(), known: HashMap::new() };
    for p in order {
        if !needs_reading(has_patterns) {
            out.insert(p.id, if reader.exists(p.id.pid) { CmdVerdict::End } else { CmdVerdict::Gone });
            continue;
        }
        work.held_peak = work.held_peak.max(reader.held());
        // The reader's one buffer: a text is copied out of it only when it waits for the matcher.
        match reader.read(p.id.pid, max) {
            Read::Gone => {
                cache.forget(p.id);
                out.insert(p.id, CmdVerdict::Gone);
            }
            Read::Deferred(why) => {
                work.deferred += 1;
                work.slow += usize::from(why == Deferred::Slow);
                // A read that overran its share, or was cut after more than a cheap command
                // line, is costly however long the text turns out to be.
                if why == Deferred::Slow || reader.text().len() > CHEAP_BYTES {
                    cache.note_length(p.id, usize::MAX);
                }
                // One left unread again keeps its place in the queue.
                let since = match cache.deferred.get(&p.id) {
                    Some(w) if w.why == why => w.since,
                    _ => cache.ticks,
                };
                if deferred.len() < MAX_ENTRIES {
                    deferred.insert(p.id, Waiting { why, since });
                }
                out.insert(p.id, CmdVerdict::Deferred);
            }
            Read::Text => {
                let cmd = reader.text();
                cache.note_length(p.id, cmd.len());
                // The rules (no pattern, past the cap, a settled verdict, a matcher that is
                // down) are the policy's; this reads, looks up and asks.
                let mut known = None;
                let settled = || {
                    let key = cache.key(cmd);
                    known = Some((key, cache.lookup(p.id, key)));
                    match known {
                        Some((_, Some(Progress::Settled(o)))) => Some(verdict(o)),
                        _ => None,
                    }
                };
                match route(has_patterns, cmd.len(), max, matcher_ok, settled) {
                    Route::Decided(v) => {
                        out.insert(p.id, v);
                    }
                    Route::Cached(v) => {
                        work.cached += 1;
                        out.insert(p.id, v);
                    }
                    Route::Ask => {
                        let (key, progress) = known.expect("asked only after the cache was looked up");
                        if let Some(p2) = batch.known.get(&key).copied() {
                            work.shared += 1;
                            cache.store(p.id, key, p2);
                            out.insert(p.id, verdict(p2.outcome()));
                        } else if let Some(&i) = batch.index.get(&key) {
                            work.shared += 1;
                            batch.texts[i].ids.push(p.id);
                        } else {
                            if !reader.fits(cmd.len()) {
                                batch.flush(cache, classifier, deadline, &mut out, &mut work);
                            }
                            let text = reader.hold(cmd).expect("a text of at most 1 MiB fits an empty pool");
                            let from = match progress {
                                Some(Progress::Unsettled(at)) => at,
                                _ => Resume::default(),
                            };
                            batch.index.insert(key, batch.texts.len());
                            batch.texts.push(Pending { text, key, from, ids: vec![p.id] });
                        }
                    }
                }
            }
        }
    }
    work.held_peak = work.held_peak.max(reader.held());
    cache.deferred = deferred;
    batch.flush(cache, classifier, deadline, &mut out, &mut work);
    (out, work)
}

fn verdict(o: MatchOutcome) -> CmdVerdict {
    match o {
        MatchOutcome::Matched(index) => CmdVerdict::Excluded { index },
        MatchOutcome::NoMatch => CmdVerdict::End,
        MatchOutcome::Budget => CmdVerdict::Budget,
    }
}

#[cfg(test)]
#[path = "verdicts_tests.rs"]
mod tests;
