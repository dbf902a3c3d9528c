//! The bounded matcher against every hostile case of issue 15 item 5, with real worker
//! processes (the built `guard-user` binary re-executed as `__pattern-worker`).
//!
//! Timing assertions are sanity bounds (several times what the bound allows), never tight: the
//! machine is shared. What each test pins is the outcome (`Budget`, `TooCostly`, recovery).
use guard_test::guard_test;
use std::time::{Duration, Instant};

use guard::pattern::{CostReason, Limits, MatchOutcome, Matcher, PatternSetError};
use MatchOutcome::{Budget, Matched, NoMatch};

fn exe() -> std::path::PathBuf {
    env!("CARGO_BIN_EXE_guard-user").into()
}

fn list(patterns: &[&str]) -> Vec<String> {
    patterns.iter().map(|p| p.to_string()).collect()
}

fn shipped() -> Vec<String> {
    list(guard::config::DEFAULT_EXCLUDE_COMMANDS)
}

fn in_secs(s: u64) -> Instant {
    Instant::now() + Duration::from_secs(s)
}

/// Takes seconds on 300 bytes of `a` in ~5 MB, so it reaches the time bound rather than the
/// memory bound; instant on short texts (`aac` matches).
const SLOW: &str = "(a|aa)*\\1c";

fn slow_text() -> Vec<u8> {
    vec![b'a'; 300]
}
/// Takes gigabytes on a few hundred bytes: reaches the memory bound first.
const HUNGRY: &str = "(a*)*\\1";
/// Recurses without end inside glibc: overflows any stack.
const OVERFLOW: &str = "()(\\1\\1)+";

#[guard_test]
fn shipped_patterns_give_the_first_matching_index() {
    let mut m = Matcher::new(exe(), Limits::default());
    m.set_patterns(&shipped()).unwrap();
    let texts: [&[u8]; 6] = [
        b"/usr/bin/agentihooks swarm tick --once",
        b"python3 -m scripts.swarm.scheduled_tick",
        b"node /x/agentihooks select-profile foo",
        b"agentihooks swarm prober",
        b"sleep 3600",
        b"agentihooks swarm ticker",
    ];
    let out = m.classify(&texts, in_secs(10));
    assert_eq!(out, vec![Matched(0), Matched(1), Matched(2), Matched(3), NoMatch, NoMatch]);
    assert_eq!(m.stats().budget, 0);
}

#[guard_test]
fn back_reference_blowup_on_100k_texts_is_budget_within_the_bound_and_the_next_call_works() {
    let mut m = Matcher::new(exe(), Limits::default());
    m.set_patterns(&list(&[HUNGRY])).unwrap();
    let long = vec![b'a'; 100 << 10];
    let texts: Vec<&[u8]> = vec![&long; 8];
    let started = Instant::now();
    let out = m.classify(&texts, in_secs(60));
    let took = started.elapsed();
    println!("{HUNGRY} on 8 × 100 KiB: {took:?}, {:?}", m.stats());
    assert_eq!(out, vec![Budget; 8]);
    // Three strikes, each at most per_match (+ a quarter) plus a respawn, then the rest is
    // skipped: a sanity bound, several times that.
    assert!(took < Duration::from_secs(10), "{took:?}");

    // The same matcher answers right away afterwards, for the same list in a new round…
    let out = m.classify(&[b"xyz", b""], in_secs(10));
    assert_eq!(out, vec![Matched(0), Matched(0)], "(a*)*\\1 matches the empty string anywhere");
    // …and for another list.
    m.set_patterns(&shipped()).unwrap();
    assert_eq!(m.classify(&[b"agentihooks swarm tick", b"sleep 1"], in_secs(10)), vec![Matched(0), NoMatch]);
}

#[guard_test]
fn a_regexec_past_per_match_is_killed_and_the_text_is_budget() {
    let limits = Limits::default();
    let mut m = Matcher::new(exe(), limits);
    m.set_patterns(&list(&[SLOW])).unwrap();
    let slow = slow_text();
    let started = Instant::now();
    let out = m.classify(&[&slow, b"aac", &slow], in_secs(30));
    let took = started.elapsed();
    println!("{SLOW} on 300 bytes: {took:?}, {:?}", m.stats());
    assert_eq!(out, vec![Budget, Matched(0), Budget]);
    assert_eq!(m.stats().kills, 2, "{:?}", m.stats());
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[guard_test]
fn a_stack_overflowing_back_reference_is_budget_and_only_the_worker_dies() {
    let mut m = Matcher::new(exe(), Limits::default());
    m.set_patterns(&list(&[OVERFLOW])).unwrap();
    let out = m.classify(&[b"aaaa", b"b"], in_secs(20));
    assert_eq!(out, vec![Budget, Budget]);
    assert!(m.stats().deaths >= 2, "{:?}", m.stats());
    let failure = m.last_failure().unwrap_or_default().to_string();
    assert!(failure.contains("SIGSEGV"), "{failure}");
    // This test process is alive and the matcher still works.
    m.set_patterns(&list(&["b$"])).unwrap();
    assert_eq!(m.classify(&[b"aaaa", b"b"], in_secs(10)), vec![NoMatch, Matched(0)]);
}

#[guard_test]
fn nested_repeat_counts_are_too_costly_before_anything_compiles() {
    let mut m = Matcher::new(exe(), Limits::default());
    let started = Instant::now();
    let e = m.set_patterns(&list(&["ok", "((a{1,255}){1,255}){1,255}"])).unwrap_err();
    let took = started.elapsed();
    let PatternSetError::TooCostly { index: 1, why: CostReason::Expansion { nodes, .. }, .. } = &e else {
        panic!("{e:?}")
    };
    assert!(*nodes > 16_000_000, "{nodes}");
    assert!(e.to_string().contains("write a{1,255} once"), "{e}");
    assert_eq!((m.stats().spawns, m.stats().compiles), (0, 0), "refused without a worker");
    assert!(took < Duration::from_secs(1), "{took:?}");
}

#[guard_test]
fn compile_cost_the_static_estimate_lets_through_is_bounded_in_the_worker() {
    // 2001 nodes, under the static limit, but glibc needs ~33 MB for it: the worker's heap
    // limit refuses it.
    let mut m = Matcher::new(exe(), Limits::default());
    let e = m.set_patterns(&list(&["a", "a{1,2000}"])).unwrap_err();
    assert!(matches!(e, PatternSetError::TooCostly { index: 1, why: CostReason::CompileMemory { .. }, .. }), "{e:?}");
    assert!(e.to_string().contains("MiB"), "{e}");

    // Takes seconds to compile in little memory: the compile deadline refuses it, and blames it.
    let limits = Limits { compile: Duration::from_millis(200), ..Limits::default() };
    let mut m = Matcher::new(exe(), limits);
    let started = Instant::now();
    let e = m.set_patterns(&list(&["a", "((a|)*){1,250}"])).unwrap_err();
    assert!(matches!(e, PatternSetError::TooCostly { index: 1, why: CostReason::CompileTime { .. }, .. }), "{e:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(m.stats().kills, 1);
    // The matcher recovers for the next list.
    m.set_patterns(&shipped()).unwrap();
    assert_eq!(m.classify(&[b"agentihooks swarm prober"], in_secs(10)), vec![Matched(3)]);
}

#[guard_test]
fn ten_thousand_patterns_a_megabyte_pattern_and_a_nul_are_refused_without_a_worker() {
    let mut m = Matcher::new(exe(), Limits::default());
    let many: Vec<String> = (0..10_000).map(|i| format!("pattern{i}")).collect();
    assert_eq!(m.set_patterns(&many).unwrap_err(), PatternSetError::TooMany { count: 10_000, max: 256 });
    let huge = vec!["x".repeat(1 << 20)];
    let e = m.set_patterns(&huge).unwrap_err();
    assert!(matches!(e, PatternSetError::TooLong { index: 0, len: 1_048_576, max: 1024, .. }), "{e:?}");
    assert!(e.pattern().unwrap().len() < 100, "the log gets a prefix, not a megabyte");
    let e = m.set_patterns(&list(&["a\0b"])).unwrap_err();
    assert!(matches!(e, PatternSetError::Nul { index: 0, .. }), "{e:?}");
    assert_eq!(m.stats().spawns, 0);
}

#[guard_test]
fn an_invalid_pattern_reports_regerror_and_is_not_recompiled_until_the_list_changes() {
    let mut m = Matcher::new(exe(), Limits::default());
    let bad = list(&["fine", "(unclosed"]);
    let e = m.set_patterns(&bad).unwrap_err();
    assert_eq!(
        e,
        PatternSetError::Invalid { index: 1, pattern: "(unclosed".into(), reason: "Unmatched ( or \\(".into() }
    );
    assert!(e.to_string().contains("guard-user match --pattern"), "{e}");
    assert_eq!(m.set_patterns(&bad).unwrap_err(), e);
    assert_eq!(m.stats().compiles, 1, "the same failing list is not compiled again");
    // A failed list protects rather than guesses, should a caller classify anyway.
    assert_eq!(m.classify(&[b"fine"], in_secs(5)), vec![Budget]);
}

#[guard_test]
fn the_same_list_twice_is_compiled_once_in_the_same_worker() {
    let mut m = Matcher::new(exe(), Limits::default());
    m.set_patterns(&shipped()).unwrap();
    let pid = m.worker_pid().expect("a worker holds the list");
    for _ in 0..5 {
        m.set_patterns(&shipped()).unwrap();
        m.classify(&[b"sleep 1"], in_secs(5));
    }
    assert_eq!((m.stats().compiles, m.stats().spawns, m.worker_pid()), (1, 1, Some(pid)));
    // A changed list is compiled once more, still in the same worker.
    m.set_patterns(&list(&["sleep"])).unwrap();
    m.set_patterns(&list(&["sleep"])).unwrap();
    assert_eq!((m.stats().compiles, m.worker_pid()), (2, Some(pid)));
    assert_eq!(m.classify(&[b"sleep 1"], in_secs(5)), vec![Matched(0)]);
}

#[guard_test]
fn a_worker_killed_mid_call_costs_that_text_only_and_the_call_goes_on() {
    let limits = Limits { per_match: Duration::from_secs(30), ..Limits::default() };
    let mut m = Matcher::new(exe(), limits);
    m.set_patterns(&list(&[SLOW, "b$"])).unwrap();
    let pid = m.worker_pid().unwrap();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: signalling the worker this test started.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    });
    let slow = slow_text();
    let started = Instant::now();
    let out = m.classify(&[&slow, b"xb", b"x"], in_secs(60));
    killer.join().unwrap();
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    // The slow text resumed at pattern 1 (`b$`, no match): undecided, so Budget.
    assert_eq!(out, vec![Budget, Matched(1), NoMatch]);
    assert_eq!(m.stats().deaths, 1);
    assert_ne!(m.worker_pid(), Some(pid), "a new worker");
}

#[guard_test]
fn a_worker_killed_between_calls_is_replaced_without_a_budget() {
    let mut m = Matcher::new(exe(), Limits::default());
    m.set_patterns(&shipped()).unwrap();
    let pid = m.worker_pid().unwrap();
    // SAFETY: signalling the worker this test started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    // Until it is a zombie: killed "between calls" means gone before the next one starts.
    let dead = Instant::now() + Duration::from_secs(5);
    while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z ")) {
        assert!(Instant::now() < dead, "the worker outlived SIGKILL");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(m.classify(&[b"agentihooks swarm tick", b"vim"], in_secs(10)), vec![Matched(0), NoMatch]);
    assert_eq!((m.stats().budget, m.stats().spawns, m.stats().compiles), (0, 2, 2));
}

#[guard_test]
fn an_undecidable_pattern_does_not_hide_a_later_match() {
    let limits = Limits::default();
    let mut m = Matcher::new(exe(), limits);
    m.set_patterns(&list(&[SLOW, "^a+$", "^x"])).unwrap();
    let slow = slow_text();
    let mut with_x = b"x".to_vec();
    with_x.extend_from_slice(&slow);
    let out = m.classify(&[&slow, &with_x], in_secs(30));
    // SLOW overruns on both; `^a+$` matches the first, `^x` the second.
    assert_eq!(out, vec![Matched(1), Matched(2)]);
    assert_eq!(m.stats().kills, 2);
}

#[guard_test]
fn three_strikes_stop_a_pattern_for_the_rest_of_the_round_only() {
    let limits = Limits::default();
    let mut m = Matcher::new(exe(), limits);
    m.set_patterns(&list(&[SLOW])).unwrap();
    let slow = slow_text();
    let texts: Vec<&[u8]> = vec![&slow; 10];
    let mut round = m.round(in_secs(60));
    assert_eq!(round.classify(&texts), vec![Budget; 10]);
    assert_eq!(round.undecidable(), vec![0]);
    // Struck out: even a cheap text is Budget for the rest of this round…
    assert_eq!(round.classify(&[b"aac"]), vec![Budget]);
    drop(round);
    assert_eq!(m.stats().kills, 3, "three overruns, then no more");
    // …and decided again in the next round.
    assert_eq!(m.classify(&[b"aac"], in_secs(10)), vec![Matched(0)]);
}

#[guard_test]
fn the_round_deadline_bounds_the_whole_call() {
    let limits = Limits { per_match: Duration::from_secs(30), strikes: 1000, ..Limits::default() };
    let mut m = Matcher::new(exe(), limits);
    m.set_patterns(&list(&[SLOW])).unwrap();
    let slow = slow_text();
    let texts: Vec<&[u8]> = vec![&slow; 5];
    let started = Instant::now();
    let out = m.classify(&texts, Instant::now() + Duration::from_millis(500));
    let took = started.elapsed();
    assert_eq!(out, vec![Budget; 5]);
    assert!(took < Duration::from_secs(3), "{took:?}");
    // The busy worker was killed, not left running.
    assert_eq!(m.worker_pid(), None);
    assert_eq!(m.classify(&[b"aac"], in_secs(10)), vec![Matched(0)]);
}

#[guard_test]
fn texts_over_the_size_limit_are_budget_without_reaching_the_worker() {
    let limits = Limits { max_text_bytes: 1000, ..Limits::default() };
    let mut m = Matcher::new(exe(), limits);
    m.set_patterns(&list(&["x"])).unwrap();
    let at_limit = vec![b'x'; 1000];
    let over = vec![b'x'; 1001];
    assert_eq!(m.classify(&[&at_limit, &over], in_secs(10)), vec![Matched(0), Budget]);
}

#[guard_test]
fn an_empty_list_matches_nothing_and_starts_no_worker() {
    let mut m = Matcher::new(exe(), Limits::default());
    m.set_patterns(&[]).unwrap();
    assert_eq!(m.classify(&[b"anything", b""], in_secs(5)), vec![NoMatch, NoMatch]);
    assert_eq!(m.stats().spawns, 0);
}

#[guard_test]
fn many_texts_in_one_call_keep_their_order() {
    let mut m = Matcher::new(exe(), Limits::default());
    m.set_patterns(&list(&["7$", "^1"])).unwrap();
    let texts: Vec<Vec<u8>> = (0..5000).map(|i| format!("{i}").into_bytes()).collect();
    let refs: Vec<&[u8]> = texts.iter().map(Vec::as_slice).collect();
    let out = m.classify(&refs, in_secs(60));
    for (i, o) in out.iter().enumerate() {
        let s = i.to_string();
        let want = if s.ends_with('7') {
            Matched(0)
        } else if s.starts_with('1') {
            Matched(1)
        } else {
            NoMatch
        };
        assert_eq!(*o, want, "text {s}");
    }
}

#[guard_test]
fn a_broken_worker_binary_is_a_worker_error_and_texts_are_protected() {
    let mut m = Matcher::new("/bin/true".into(), Limits::default());
    let e = m.set_patterns(&shipped()).unwrap_err();
    assert!(matches!(e, PatternSetError::Worker(_)) && !e.is_config_error(), "{e:?}");
    assert_eq!(m.classify(&[b"sleep 1"], in_secs(5)), vec![Budget]);
}

#[guard_test]
fn a_worker_that_used_half_its_cpu_backstop_is_replaced_between_calls_without_a_budget() {
    // A one-second backstop: half of it is 0 whole seconds, so every worker is "worn" at the next
    // round, while it still has a second of CPU to serve this one.
    let mut m = Matcher::new(exe(), Limits { cpu_seconds: 1, ..Limits::default() });
    m.set_patterns(&shipped()).unwrap();
    let first = m.worker_pid().unwrap();
    assert_eq!(m.classify(&[b"agentihooks swarm tick"], in_secs(10)), vec![Matched(0)]);
    let second = m.worker_pid().unwrap();
    assert_ne!(first, second, "replaced at the start of the round");
    assert_eq!(m.classify(&[b"sleep 1"], in_secs(10)), vec![NoMatch]);
    assert_eq!((m.stats().budget, m.stats().compiles), (0, 3));
    // The old workers are reaped, not left as zombies.
    assert!(std::fs::read_to_string(format!("/proc/{first}/stat")).is_err());
}

#[guard_test]
fn a_matcher_moves_into_a_blocking_tick_thread() {
    fn assert_send<T: Send>() {}
    assert_send::<Matcher>();
    let mut m = Matcher::new(exe(), Limits::default());
    m.set_patterns(&shipped()).unwrap();
    let m = std::thread::spawn(move || {
        assert_eq!(m.classify(&[b"agentihooks swarm waker"], in_secs(10)), vec![Matched(3)]);
        m
    })
    .join()
    .unwrap();
    // Still usable back on this thread: the worker outlives the thread that started it.
    let mut m = m;
    assert_eq!(m.classify(&[b"agentihooks swarm tick"], in_secs(10)), vec![Matched(0)]);
    assert_eq!(m.stats().spawns, 1);
}

guard_test::main!();
