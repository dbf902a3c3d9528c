//! The matcher's work across ticks (issue 25): a round says which verdicts are settled and where
//! an unfinished text stands, and the daemon's verdict cache (`daemon::verdicts`) makes an
//! unchanged process cost one match, not one per tick, even under a hostile pattern list. Real
//! worker processes; work is counted in texts sent to the worker, never in seconds.
use guard_test::guard_test;
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use guard::{
    budget::{Pool, HELD_CMDLINE_BYTES},
    comm::Comm,
    daemon::{
        cmdlines::CmdlineReader,
        recording::FakeProcs,
        verdicts::{verdicts, Ask, VerdictCache, Work},
    },
    event::{ProcId, ProcState},
    pattern::{Limits, MatchOutcome, Matcher, Progress, Resume},
    policy::{AccountView, CmdVerdict, FlagClocks},
};
use MatchOutcome::{Budget, Matched};

fn exe() -> std::path::PathBuf {
    env!("CARGO_BIN_EXE_guard-user").into()
}

/// The daemon's reader with time to read everything (what is measured here is the matcher).
fn reader(procs: &mut FakeProcs) -> CmdlineReader<'_> {
    CmdlineReader::new(procs, Pool::new(HELD_CMDLINE_BYTES), in_secs(60), Duration::from_secs(10))
}

fn in_secs(s: u64) -> Instant {
    Instant::now() + Duration::from_secs(s)
}

/// Seconds on 300 bytes of `a` (it reaches the time bound); instant on `aac`, which it matches.
const SLOW: &str = "(a|aa)*\\1c";

#[guard_test]
fn a_text_on_which_three_patterns_overran_is_budget_without_trying_the_rest() {
    let mut m = Matcher::new(exe(), Limits::default());
    // Five patterns that each overrun on the text, then one that matches it.
    let mut list: Vec<String> = (1..=5).map(|i| format!("{SLOW}{{1,{i}}}")).collect();
    list.push("^a".into());
    m.set_patterns(&list).unwrap();
    let text = vec![b'a'; 300];
    let out = m.classify(&[&text], in_secs(30));
    // Protected after three failures: the other two slow patterns (and the match) are not run.
    assert_eq!(out, vec![Budget]);
    assert_eq!((m.stats().kills, m.stats().texts), (3, 3), "{:?}", m.stats());
}

#[guard_test]
fn a_round_hands_back_where_an_unfinished_text_stands_and_a_later_round_goes_on_from_there() {
    // One strike: the first overrun strikes SLOW out for the round.
    let mut m = Matcher::new(exe(), Limits { strikes: 1, ..Limits::default() });
    m.set_patterns(&[SLOW.to_string(), "^a+$".to_string()]).unwrap();
    let slow = vec![b'a'; 300];
    let fresh = Resume::default();
    let out = m.round(in_secs(30)).classify_from(&[&slow, b"aac"], &[fresh, fresh]);
    // The slow text overran on this very text: settled (it would only overrun again). `aac`
    // never reached SLOW, struck out on the other text: unsettled, from where it stood.
    assert_eq!(out, vec![Progress::Settled(Budget), Progress::Unsettled(fresh)]);
    // The next round decides it.
    let out = m.round(in_secs(30)).classify_from(&[b"aac"], &[fresh]);
    assert_eq!(out, vec![Progress::Settled(Matched(0))]);
    // A text resumed past a pattern that overran on it goes on at the next one: no new overrun.
    let mut m = Matcher::new(exe(), Limits::default());
    m.set_patterns(&[SLOW.to_string(), "^a+$".to_string()]).unwrap();
    let kills = m.stats().kills;
    let past_slow = Resume { start: 1, failures: 1 };
    let out = m.round(in_secs(30)).classify_from(&[&slow, b"b"], &[past_slow, past_slow]);
    assert_eq!(out, vec![Progress::Settled(Matched(1)), Progress::Settled(Budget)]);
    assert_eq!(m.stats().kills, kills);
    // One with nothing left to try is settled without reaching the worker.
    let texts = m.stats().texts;
    let done = Resume { start: 2, failures: 1 };
    assert_eq!(m.round(in_secs(30)).classify_from(&[&slow], &[done]), vec![Progress::Settled(Budget)]);
    assert_eq!(m.stats().texts, texts);
}

/// The list from issue 25's report: 128 valid patterns that each run into the time bound on a
/// long run of `a` (`(a*)*\1` backtracks without end; the `x` never comes).
fn hostile_list() -> Vec<String> {
    (0..128).map(|i| format!("(a*)*\\1b{{0,{i}}}x")).collect()
}

/// Six processes of one name with 3,000 `a`s in their arguments, as the account would run them.
fn hostile_world() -> (AccountView, FakeProcs) {
    let comm = Comm::new(b"gbmatch");
    let procs = FakeProcs::default();
    let mut members = Vec::new();
    for i in 0..6u32 {
        let id = ProcId { pid: 5000 + i, start_ticks: 77 };
        members.push(ProcState { id, euid: 4201, comm });
        let mut cmd = format!("gbmatch {i} ").into_bytes();
        cmd.extend(std::iter::repeat_n(b'a', 3000));
        procs.0.lock().unwrap().insert(id.pid, cmd);
    }
    let view = AccountView { counts: vec![(comm, 6)], members: BTreeMap::from([(comm, members)]) };
    (view, procs)
}

#[guard_test]
fn a_hostile_pattern_list_is_matched_in_the_first_tick_and_never_again_while_nothing_changes() {
    let list = hostile_list();
    let config = guard::config::parse(
        serde_json::json!({"threshold": 6, "timeout": "8760h", "excludes": [], "excludeCommands": list})
            .to_string()
            .as_bytes(),
        std::path::Path::new("/home/x"),
    )
    .unwrap();
    let (view, mut procs) = hostile_world();
    // Flagged, a year from due: nothing is ever ended, yet status and WARNING need verdicts.
    let clocks = FlagClocks::from([(Comm::new(b"gbmatch"), 1.0)]);
    let mut matcher = Matcher::new(exe(), Limits::default());
    let compiling = Instant::now();
    matcher.set_patterns(&config.exclude_commands).unwrap();
    println!("the hostile list compiles in {:?}", compiling.elapsed());
    let mut cache = VerdictCache::default();
    let cmdlines = procs.0.clone();
    let mut tick = |cache: &mut VerdictCache, matcher: &mut Matcher, budget: Duration| {
        let ask =
            Ask { view: &view, config: &config, clocks: &clocks, matcher_ok: true, deadline: Instant::now() + budget };
        verdicts(cache, &mut reader(&mut procs), matcher, ask)
    };
    let started = Instant::now();
    let (first, work) = tick(&mut cache, &mut matcher, Duration::from_secs(60));
    let after_first = matcher.stats();
    println!("first tick: {:?}, {work:?}, {after_first:?}", started.elapsed());
    assert!(first.values().all(|v| *v == CmdVerdict::Budget), "every process protected: {first:?}");
    assert_eq!((work.cached, work.asked, work.unsettled), (0, 6, 0), "all six settled in the first tick");
    // Three failures (overrun or out of memory) per text at most, not 128.
    assert!(after_first.kills <= 18 && after_first.texts <= 6 * 3 + 6 * after_first.kills, "{after_first:?}");
    for n in 2..=6 {
        let (v, work) = tick(&mut cache, &mut matcher, Duration::from_secs(60));
        assert_eq!(v, first, "tick {n}: the same verdicts");
        assert_eq!(work, Work { cached: 6, ..Work::default() }, "tick {n}");
    }
    let s = matcher.stats();
    assert_eq!((s.texts, s.kills, s.spawns), (after_first.texts, after_first.kills, after_first.spawns), "{s:?}");

    // One process rewrites its argv: it alone is matched again.
    cmdlines.lock().unwrap().get_mut(&5000).unwrap().push(b'a');
    let (_, work) = tick(&mut cache, &mut matcher, Duration::from_secs(60));
    assert_eq!((work.cached, work.asked, work.unsettled), (5, 1, 0));

    // Without the cache (main before issue 25), every tick pays again for all six.
    let mut none = VerdictCache::with_cap(0);
    for _ in 0..2 {
        let before = matcher.stats().texts;
        let (_, work) = tick(&mut none, &mut matcher, Duration::from_secs(1));
        assert_eq!(work.asked, 6);
        assert!(matcher.stats().texts > before);
    }
}

#[guard_test]
fn under_the_daemons_round_budget_a_hostile_list_settles_in_a_few_ticks_then_costs_nothing() {
    let list = hostile_list();
    let config = guard::config::parse(
        serde_json::json!({"threshold": 6, "timeout": "8760h", "excludes": [], "excludeCommands": list})
            .to_string()
            .as_bytes(),
        std::path::Path::new("/home/x"),
    )
    .unwrap();
    let (view, mut procs) = hostile_world();
    let clocks = FlagClocks::from([(Comm::new(b"gbmatch"), 1.0)]);
    let mut matcher = Matcher::new(exe(), Limits::default());
    matcher.set_patterns(&config.exclude_commands).unwrap();
    let mut cache = VerdictCache::default();
    // The budget of a 4 s tick (issue 25's report): each round settles what it can, the next
    // goes on from there, so the work ends; without resuming, every round would start over.
    let budget = guard::daemon::verdicts::round_budget(Duration::from_secs(4), Duration::from_secs(4));
    let mut settled_after = None;
    for n in 1..=20 {
        let ask =
            Ask { view: &view, config: &config, clocks: &clocks, matcher_ok: true, deadline: Instant::now() + budget };
        let (v, work) = verdicts(&mut cache, &mut reader(&mut procs), &mut matcher, ask);
        assert!(v.values().all(|v| *v == CmdVerdict::Budget), "tick {n}: every process protected throughout");
        println!("tick {n}: {work:?} {:?}", matcher.stats());
        if work.unsettled == 0 {
            settled_after = Some(n);
            break;
        }
    }
    let settled_after = settled_after.expect("the verdicts settle");
    let before = matcher.stats();
    for _ in 0..5 {
        let ask =
            Ask { view: &view, config: &config, clocks: &clocks, matcher_ok: true, deadline: Instant::now() + budget };
        assert_eq!(
            verdicts(&mut cache, &mut reader(&mut procs), &mut matcher, ask).1,
            Work { cached: 6, ..Work::default() }
        );
    }
    assert_eq!(matcher.stats(), before, "settled after {settled_after} ticks: no work since");
}

guard_test::main!();
