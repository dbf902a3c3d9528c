use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::{Duration, Instant},
};

use super::*;
use crate::{
    budget::{Budget, Pool, HELD_CMDLINE_BYTES},
    comm::Comm,
    daemon::{cmdlines::CmdlineReader, effects::ProcessReader, recording::FakeProcs},
    event::ProcState,
    pattern::{Limits, PatternSetError},
    procfs::CmdRead,
};

/// A classifier that answers from a table of texts and records what it was asked.
#[derive(Default)]
struct Scripted {
    /// The answer per text; a text not in it is `NoMatch`.
    answers: HashMap<Vec<u8>, Progress>,
    /// Every (text, resume point) asked, in order.
    asked: Vec<(Vec<u8>, Resume)>,
}

impl Classifier for Scripted {
    fn set_patterns(&mut self, _patterns: &[String]) -> Result<(), PatternSetError> {
        Ok(())
    }

    fn classify_from(&mut self, texts: &[&[u8]], from: &[Resume], _deadline: Instant) -> Vec<Progress> {
        texts
            .iter()
            .zip(from)
            .map(|(t, at)| {
                self.asked.push((t.to_vec(), *at));
                self.answers.get(*t).copied().unwrap_or(Progress::Settled(MatchOutcome::NoMatch))
            })
            .collect()
    }

    fn max_text_bytes(&self) -> usize {
        Limits::default().max_text_bytes
    }
}

fn id(pid: u32, start_ticks: u64) -> ProcId {
    ProcId { pid, start_ticks }
}

/// A view with one name, `name`, holding `ids`, and their command lines in `procs`.
fn world(name: &str, members: &[(ProcId, &str)]) -> (AccountView, FakeProcs) {
    let comm = Comm::new(name.as_bytes());
    let procs = FakeProcs::default();
    let mut states = Vec::new();
    for (id, cmd) in members {
        states.push(ProcState { id: *id, euid: 1000, comm });
        procs.0.lock().unwrap().insert(id.pid, cmd.as_bytes().to_vec());
    }
    let view = AccountView { counts: vec![(comm, members.len() as u32)], members: BTreeMap::from([(comm, states)]) };
    (view, procs)
}

fn config(patterns: &[&str]) -> Config {
    let text = serde_json::json!({ "excludeCommands": patterns, "excludes": [] }).to_string();
    crate::config::parse(text.as_bytes(), std::path::Path::new("/home/x")).expect("a valid config")
}

/// The daemon's reader with time to read everything: these tests are about what is read and
/// matched, not when.
fn reader(procs: &mut dyn ProcessReader) -> CmdlineReader<'_> {
    let hour = Duration::from_secs(3600);
    CmdlineReader::new(procs, Pool::new(HELD_CMDLINE_BYTES), Instant::now() + hour, hour)
}

fn run(
    cache: &mut VerdictCache,
    procs: &mut dyn ProcessReader,
    classifier: &mut Scripted,
    view: &AccountView,
    config: &Config,
) -> (HashMap<ProcId, CmdVerdict>, Work) {
    let clocks = FlagClocks::new();
    let ask =
        Ask { view, config, clocks: &clocks, matcher_ok: true, deadline: Instant::now() + Duration::from_secs(5) };
    verdicts(cache, &mut reader(procs), classifier, ask)
}

#[test]
fn an_unchanged_process_is_matched_once_over_many_ticks() {
    let (view, mut procs) = world("worker", &[(id(10, 1), "worker --a"), (id(11, 1), "worker --b")]);
    let cfg = config(&["--a"]);
    let mut cache = VerdictCache::default();
    let mut c = Scripted::default();
    c.answers.insert(b"worker --a".to_vec(), Progress::Settled(MatchOutcome::Matched(0)));
    for tick in 0..10 {
        let (v, work) = run(&mut cache, &mut procs, &mut c, &view, &cfg);
        assert_eq!(v[&id(10, 1)], CmdVerdict::Excluded { index: 0 });
        assert_eq!(v[&id(11, 1)], CmdVerdict::End);
        let expected = if tick == 0 {
            Work { cached: 0, asked: 2, rounds: 1, held_peak: 20, ..Work::default() }
        } else {
            Work { cached: 2, ..Work::default() }
        };
        assert_eq!(work, expected, "tick {tick}");
    }
    assert_eq!(c.asked.len(), 2);
}

#[test]
fn a_new_start_time_on_the_same_pid_is_a_new_process_and_is_matched_again() {
    let mut cache = VerdictCache::default();
    let mut c = Scripted::default();
    let cfg = config(&["x"]);
    let (view, mut procs) = world("worker", &[(id(10, 1), "worker")]);
    run(&mut cache, &mut procs, &mut c, &view, &cfg);
    // The pid was reused by another process with the same command line.
    let (view, mut procs) = world("worker", &[(id(10, 2), "worker")]);
    c.answers.insert(b"worker".to_vec(), Progress::Settled(MatchOutcome::Matched(0)));
    let (v, work) = run(&mut cache, &mut procs, &mut c, &view, &cfg);
    assert_eq!(v[&id(10, 2)], CmdVerdict::Excluded { index: 0 });
    assert_eq!(work.asked, 1);
    assert_eq!(c.asked.len(), 2);
    assert_eq!(cache.len(), 1, "the old identity is forgotten");
}

#[test]
fn a_rewritten_command_line_is_matched_again() {
    let mut cache = VerdictCache::default();
    let mut c = Scripted::default();
    let cfg = config(&["keep"]);
    let (view, mut procs) = world("worker", &[(id(10, 1), "worker keep")]);
    c.answers.insert(b"worker keep".to_vec(), Progress::Settled(MatchOutcome::Matched(0)));
    assert_eq!(run(&mut cache, &mut procs, &mut c, &view, &cfg).0[&id(10, 1)], CmdVerdict::Excluded { index: 0 });
    // Same process, argv rewritten in place (setproctitle): the old protection does not stick.
    procs.0.lock().unwrap().insert(10, b"worker kee".to_vec());
    let (v, work) = run(&mut cache, &mut procs, &mut c, &view, &cfg);
    assert_eq!(v[&id(10, 1)], CmdVerdict::End);
    assert_eq!((work.cached, work.asked, work.unsettled), (0, 1, 0));
    // And back: matched again, not served from an older entry.
    procs.0.lock().unwrap().insert(10, b"worker keep".to_vec());
    assert_eq!(run(&mut cache, &mut procs, &mut c, &view, &cfg).0[&id(10, 1)], CmdVerdict::Excluded { index: 0 });
    assert_eq!(c.asked.len(), 3);
}

#[test]
fn a_new_pattern_list_clears_every_verdict() {
    let mut cache = VerdictCache::default();
    let mut c = Scripted::default();
    let (view, mut procs) = world("worker", &[(id(10, 1), "worker"), (id(11, 1), "worker -v")]);
    run(&mut cache, &mut procs, &mut c, &view, &config(&["a"]));
    run(&mut cache, &mut procs, &mut c, &view, &config(&["a"]));
    assert_eq!(c.asked.len(), 2);
    c.answers.insert(b"worker".to_vec(), Progress::Settled(MatchOutcome::Matched(1)));
    let (v, work) = run(&mut cache, &mut procs, &mut c, &view, &config(&["a", "worker"]));
    assert_eq!(work.asked, 2, "every process is matched against the new list");
    assert_eq!(v[&id(10, 1)], CmdVerdict::Excluded { index: 1 });
    assert_eq!(c.asked.len(), 4);
}

#[test]
fn gone_processes_are_forgotten_and_the_cap_holds_new_ones_out() {
    let members: Vec<(ProcId, String)> = (0..10).map(|i| (id(100 + i, 1), format!("w {i}"))).collect();
    let refs: Vec<(ProcId, &str)> = members.iter().map(|(i, c)| (*i, c.as_str())).collect();
    let (view, mut procs) = world("w", &refs);
    let cfg = config(&["x"]);
    let mut cache = VerdictCache::with_cap(4);
    let mut c = Scripted::default();
    let (v, _) = run(&mut cache, &mut procs, &mut c, &view, &cfg);
    assert_eq!(cache.len(), 4, "at the cap, new processes are not kept");
    assert!(v.values().all(|v| *v == CmdVerdict::End), "but every one has its verdict");
    // Past the cap, the rest is matched again each tick (the budget bounds it), the kept ones are not.
    let (_, work) = run(&mut cache, &mut procs, &mut c, &view, &cfg);
    assert_eq!((work.cached, work.asked, work.unsettled), (4, 6, 0));
    // Six exit, the four kept among them: their room goes to the others in the same tick.
    let (view, mut procs) = world("w", &refs[6..]);
    let (_, work) = run(&mut cache, &mut procs, &mut c, &view, &cfg);
    assert_eq!((work.cached, work.asked, work.unsettled), (0, 4, 0));
    let (_, work) = run(&mut cache, &mut procs, &mut c, &view, &cfg);
    assert_eq!((work.cached, work.asked, work.unsettled), (4, 0, 0));
    // A process gone between the snapshot and the read has no verdict to keep.
    procs.0.lock().unwrap().remove(&106);
    let (v, _) = run(&mut cache, &mut procs, &mut c, &view, &cfg);
    assert_eq!(v[&id(106, 1)], CmdVerdict::Gone);
    assert_eq!(cache.len(), 3);
    let seen = HashSet::new();
    cache.keep_only(&seen);
    assert!(cache.is_empty());
}

#[test]
fn an_unsettled_text_is_protected_now_and_goes_on_from_where_it_stood() {
    let (view, mut procs) = world("w", &[(id(10, 1), "w aaaa")]);
    let cfg = config(&["(a*)*\\1x", "b", "c"]);
    let mut cache = VerdictCache::default();
    let mut c = Scripted::default();
    let stood = Resume { start: 1, failures: 1 };
    c.answers.insert(b"w aaaa".to_vec(), Progress::Unsettled(stood));
    let (v, work) = run(&mut cache, &mut procs, &mut c, &view, &cfg);
    assert_eq!(v[&id(10, 1)], CmdVerdict::Budget, "protected, never ended, while unsettled");
    assert_eq!(work.unsettled, 1);
    c.answers.insert(b"w aaaa".to_vec(), Progress::Settled(MatchOutcome::Budget));
    let (v, _) = run(&mut cache, &mut procs, &mut c, &view, &cfg);
    assert_eq!(v[&id(10, 1)], CmdVerdict::Budget);
    assert_eq!(c.asked[1], (b"w aaaa".to_vec(), stood), "the next tick resumes, it does not start over");
    // A settled Budget is kept: trying again would only overrun again.
    let (_, work) = run(&mut cache, &mut procs, &mut c, &view, &cfg);
    assert_eq!(work, Work { cached: 1, ..Work::default() });
}

#[test]
fn a_broken_matcher_protects_what_is_not_cached_and_keeps_what_is() {
    let (view, mut procs) = world("w", &[(id(10, 1), "w old")]);
    let cfg = config(&["x"]);
    let mut cache = VerdictCache::default();
    let mut c = Scripted::default();
    run(&mut cache, &mut procs, &mut c, &view, &cfg);
    let (view, mut procs) = world("w", &[(id(10, 1), "w old"), (id(11, 1), "w new")]);
    let clocks = FlagClocks::new();
    let ask = Ask { view: &view, config: &cfg, clocks: &clocks, matcher_ok: false, deadline: Instant::now() };
    let (v, work) = verdicts(&mut cache, &mut reader(&mut procs), &mut c, ask);
    assert_eq!(v[&id(10, 1)], CmdVerdict::End, "settled on this list and text before the outage");
    assert_eq!(v[&id(11, 1)], CmdVerdict::Budget);
    assert_eq!(work, Work { cached: 1, ..Work::default() });
}

#[test]
fn the_name_flagged_longest_is_matched_first() {
    let (a, b) = (Comm::new(b"alpha"), Comm::new(b"beta"));
    let procs = FakeProcs::default();
    procs.0.lock().unwrap().extend([(1, b"alpha".to_vec()), (2, b"beta".to_vec())]);
    let view = AccountView {
        counts: vec![(a, 1), (b, 1)],
        members: BTreeMap::from([
            (a, vec![ProcState { id: id(1, 1), euid: 1000, comm: a }]),
            (b, vec![ProcState { id: id(2, 1), euid: 1000, comm: b }]),
        ]),
    };
    let clocks = FlagClocks::from([(a, 2000.0), (b, 1000.0)]);
    let cfg = config(&["x"]);
    let mut c = Scripted::default();
    let ask = Ask { view: &view, config: &cfg, clocks: &clocks, matcher_ok: true, deadline: Instant::now() };
    verdicts(&mut VerdictCache::default(), &mut reader(&mut procs.clone()), &mut c, ask);
    let order: Vec<&[u8]> = c.asked.iter().map(|(t, _)| t.as_slice()).collect();
    assert_eq!(order, [&b"beta"[..], b"alpha"], "beta was flagged first, so it is due first");
}

#[test]
fn the_round_budget_is_a_twentieth_of_the_interval_between_two_seconds_and_half_the_deadline() {
    let s = Duration::from_secs;
    assert_eq!(round_budget(s(60), s(30)), s(3));
    assert_eq!(round_budget(s(10), s(10)), s(2));
    assert_eq!(round_budget(s(4), s(4)), s(2));
    assert_eq!(round_budget(s(1), s(1)), Duration::from_millis(500));
    assert_eq!(round_budget(s(3600), s(30)), s(15));
}

#[test]
fn an_entry_costs_at_most_64_bytes_whatever_the_command_line() {
    // The documented cap (about 1 MiB at MAX_ENTRIES) rests on this; hashbrown adds one control
    // byte per bucket.
    assert!(std::mem::size_of::<(ProcId, Entry)>() <= 64, "{}", std::mem::size_of::<(ProcId, Entry)>());
    let cache = VerdictCache::default();
    assert_eq!(cache.key(&vec![b'a'; 1 << 20]).len, 1 << 20);
}

/// Processes that share one command line (forks of one exec) cost one match between them.
#[test]
fn identical_command_lines_are_matched_once_per_tick() {
    let text = format!("pile {}", "x".repeat((256 << 10) - 5));
    let members: Vec<(ProcId, &str)> = (0..100).map(|i| (id(1000 + i, 7), text.as_str())).collect();
    let (view, mut procs) = world("pile", &members);
    let mut c = Scripted::default();
    let (v, work) = run(&mut VerdictCache::default(), &mut procs, &mut c, &view, &config(&["keep"]));
    assert_eq!(v.len(), 100);
    assert!(v.values().all(|v| *v == CmdVerdict::End));
    assert_eq!((work.asked, work.shared, c.asked.len()), (1, 99, 1));
    assert_eq!(work.held_peak, 256 << 10, "one copy held, not 100");
}

/// However many distinct command lines wait for the matcher, the bytes held at one time stay
/// within the pool: a full pool is matched and dropped, then reading goes on.
#[test]
fn the_command_lines_held_for_the_matcher_never_pass_the_pool() {
    let texts: Vec<String> = (0..20).map(|i| format!("{i:02} {}", "y".repeat(900 << 10))).collect();
    let members: Vec<(ProcId, &str)> =
        texts.iter().enumerate().map(|(i, t)| (id(2000 + i as u32, 1), t.as_str())).collect();
    let (view, mut procs) = world("big", &members);
    let mut c = Scripted::default();
    c.answers.insert(texts[13].as_bytes().to_vec(), Progress::Settled(MatchOutcome::Matched(0)));
    let (v, work) = run(&mut VerdictCache::default(), &mut procs, &mut c, &view, &config(&["keep"]));
    assert!(work.held_peak <= HELD_CMDLINE_BYTES, "{}", work.held_peak);
    assert!(work.rounds >= 5, "20 × 900 KiB in rounds of at most 4 MiB: {work:?}");
    assert_eq!((work.asked, c.asked.len()), (20, 20));
    assert_eq!(v[&id(2013, 1)], CmdVerdict::Excluded { index: 0 });
    assert_eq!(v.values().filter(|v| **v == CmdVerdict::End).count(), 19);
}

/// Reads whose time the test controls: `slow` pids take their whole share and stop there, a
/// command line longer than `CHEAP_BYTES` costs `per_long` (a loaded host), and every read is
/// counted.
struct Timed {
    texts: FakeProcs,
    slow: HashSet<u32>,
    per_long: Duration,
    reads: Vec<u32>,
}

impl ProcessReader for Timed {
    fn cmdline(&mut self, pid: u32, max: usize, budget: &mut Budget, buf: &mut Vec<u8>) -> CmdRead {
        self.reads.push(pid);
        if self.slow.contains(&pid) {
            std::thread::sleep(
                budget.ends().expect("every read has a deadline").saturating_duration_since(Instant::now()),
            );
            buf.clear();
            return budget.in_time().err().map_or(CmdRead::Text, CmdRead::Stopped);
        }
        let read = self.texts.cmdline(pid, max, budget, buf);
        if buf.len() > crate::policy::cmdline::CHEAP_BYTES {
            std::thread::sleep(self.per_long);
        }
        read
    }

    fn exists(&mut self, pid: u32) -> bool {
        self.texts.exists(pid)
    }

    fn boot_unix(&mut self) -> f64 {
        0.0
    }
}

/// A process whose command line takes longer to read than its share is protected this tick
/// (never ended on a guess) and read after everyone else next tick; the processes its slowness
/// left unread are protected too and read first next tick, so none waits more than a tick.
#[test]
fn a_command_line_not_read_in_time_protects_its_process_and_is_read_again_next_tick() {
    let members: Vec<(ProcId, &str)> = (1..=6).map(|i| (id(i, 1), "w")).collect();
    let (view, texts) = world("w", &members);
    let mut procs = Timed { texts, slow: HashSet::from([1, 2, 3]), per_long: Duration::ZERO, reads: Vec::new() };
    let cfg = config(&["keep"]);
    let mut cache = VerdictCache::default();
    let mut c = Scripted::default();
    let clocks = FlagClocks::new();
    let ask = |deadline| Ask { view: &view, config: &cfg, clocks: &clocks, matcher_ok: true, deadline };
    // Reading may take 2.5 s, each read 1 s: 1 and 2 take 1 s each, 3 the last half second and
    // is stopped by the end of reading, not by its share (the margins absorb a loaded host).
    let tick = |procs: &mut Timed, cache: &mut VerdictCache, c: &mut Scripted| {
        let now = Instant::now();
        let until = now + Duration::from_millis(2500);
        let mut r = CmdlineReader::new(procs, Pool::new(HELD_CMDLINE_BYTES), until, Duration::from_secs(1));
        verdicts(cache, &mut r, c, ask(now + Duration::from_secs(5)))
    };
    let (v, work) = tick(&mut procs, &mut cache, &mut c);
    assert!(v.values().all(|v| *v == CmdVerdict::Deferred), "{v:?}");
    assert_eq!((work.deferred, work.slow), (6, 2), "{work:?}");
    // A read that overran its share is costly from now on (read after every cheap one); one
    // never reached is still unknown.
    assert_eq!((cache.cost(id(1, 1)), cache.cost(id(4, 1))), (Cost::Costly, Cost::Unknown));
    let unread = [3, 4, 5, 6];
    // Next tick: the unread ones first, the slow ones last.
    procs.slow.clear();
    procs.reads.clear();
    let (v, work) = tick(&mut procs, &mut cache, &mut c);
    assert_eq!(work.deferred, 0);
    assert!(v.values().all(|v| *v == CmdVerdict::End));
    assert_eq!(procs.reads, [unread.as_slice(), &[1, 2]].concat());
}

/// The account's long command lines cannot delay the verdicts on another name's short ones:
/// once read, a long one is read after every short one, so a pile of ordinary command lines is
/// read and decided at every tick, however many long ones wait for their turn (here a tick
/// reads about five of 40 on this host, two in a TCG guest: the test counts turns, not time).
/// The long ones still take turns: every one is read within the queue's length in ticks.
#[test]
fn short_command_lines_are_read_and_decided_every_tick_however_many_long_ones_wait() {
    let long: Vec<String> = (0..40).map(|i| format!("{i:02} {}", "z".repeat(900 << 10))).collect();
    let (big, small) = (Comm::new(b"big"), Comm::new(b"small"));
    let texts = FakeProcs::default();
    let mut members = BTreeMap::new();
    for (i, t) in long.iter().enumerate() {
        let id = id(100 + i as u32, 1);
        texts.0.lock().unwrap().insert(id.pid, t.as_bytes().to_vec());
        members.entry(big).or_insert_with(Vec::new).push(ProcState { id, euid: 1000, comm: big });
    }
    for pid in 900..903 {
        texts.0.lock().unwrap().insert(pid, b"small --plain".to_vec());
        members.entry(small).or_insert_with(Vec::new).push(ProcState { id: id(pid, 1), euid: 1000, comm: small });
    }
    let view = AccountView { counts: vec![(big, 40), (small, 3)], members };
    // `big` was flagged first: before this change its 40 long reads came first every tick.
    let clocks = FlagClocks::from([(big, 1.0), (small, 2.0)]);
    let cfg = config(&["keep"]);
    let mut procs = Timed { texts, slow: HashSet::new(), per_long: Duration::from_millis(20), reads: Vec::new() };
    let mut cache = VerdictCache::default();
    let mut c = Scripted::default();
    let mut long_read = HashSet::new();
    let mut tick = 0;
    // At least one long read starts in each tick (the short ones take microseconds), so 40
    // turns come within 40 ticks after the first, however slow the reads.
    while long_read.len() < 40 && tick <= 41 {
        procs.reads.clear();
        let now = Instant::now();
        let until = now + Duration::from_millis(100);
        let mut r = CmdlineReader::new(&mut procs, Pool::new(HELD_CMDLINE_BYTES), until, Duration::from_millis(50));
        let ask = Ask { view: &view, config: &cfg, clocks: &clocks, matcher_ok: true, deadline: now + Duration::from_secs(5) };
        let (v, _) = verdicts(&mut cache, &mut r, &mut c, ask);
        long_read.extend(procs.reads.iter().copied().filter(|p| *p < 900));
        tick += 1;
        if tick == 1 {
            // Nothing was known yet: `big`, flagged first, went first and used the reading time.
            continue;
        }
        assert_eq!(&procs.reads[..3], [900, 901, 902], "tick {tick}: the short ones first: {:?}", procs.reads);
        for pid in 900..903 {
            assert_eq!(v[&id(pid, 1)], CmdVerdict::End, "tick {tick}");
        }
    }
    assert_eq!(long_read.len(), 40, "every long one had its turn within {tick} ticks: {long_read:?}");
    assert!(tick >= 3, "the short ones were checked over more than one tick");
}

/// With no pattern nothing can protect a process, so no command line is read at all: a slow or
/// huge one costs nothing and protects nothing.
#[test]
fn without_patterns_no_command_line_is_read() {
    let members: Vec<(ProcId, &str)> = (1..=3).map(|i| (id(i, 1), "w")).collect();
    let (view, texts) = world("w", &members);
    texts.0.lock().unwrap().remove(&3);
    let mut procs = Timed { texts, slow: HashSet::from([1, 2]), per_long: Duration::ZERO, reads: Vec::new() };
    let (v, work) = run(&mut VerdictCache::default(), &mut procs, &mut Scripted::default(), &view, &config(&[]));
    assert!(procs.reads.is_empty());
    assert_eq!((v[&id(1, 1)], v[&id(2, 1)], v[&id(3, 1)]), (CmdVerdict::End, CmdVerdict::End, CmdVerdict::Gone));
    assert_eq!(work, Work::default());
}
