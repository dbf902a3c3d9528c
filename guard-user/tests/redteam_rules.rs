//! Issue 25's red-team pass, the rules half (no kernel, no root): what the daemon concludes about
//! command lines the account padded past the matcher's cap, about an empty pattern list, about a
//! flag clock a dip drops, and about piles under excluded names. The same cases against the real
//! daemon and real processes are in tests/tests/redteam.rs.
use guard_test::guard_test;
use std::{
    collections::{BTreeMap, HashMap},
    path::Path,
    time::{Duration, Instant},
};

use guard::{
    budget::{Pool, HELD_CMDLINE_BYTES},
    comm::Comm,
    config::{self, Config},
    daemon::{
        cmdlines::CmdlineReader,
        effects::Classifier,
        recording::{FakeProcs, InProcessClassifier},
        verdicts::{verdicts, Ask, VerdictCache},
    },
    event::{ProcId, ProcState},
    pattern::Limits,
    policy::{decide, AccountView, CmdVerdict, FlagClocks, Incidents, Now, TickInput},
};

const MAX: usize = 1 << 20;

fn cfg(json: &str) -> Config {
    config::parse(json.as_bytes(), Path::new("/home/x")).expect("a valid config")
}

/// Two processes named `pile`: pid 10 with a command line of `long` bytes, pid 11 with `short`.
fn pile(long: usize, short: &str) -> (AccountView, FakeProcs) {
    let comm = Comm::new(b"pile");
    let procs = FakeProcs::default();
    procs.0.lock().unwrap().insert(10, vec![b'p'; long]);
    procs.0.lock().unwrap().insert(11, short.as_bytes().to_vec());
    let members = [10, 11].map(|pid| ProcState { id: ProcId { pid, start_ticks: 1 }, euid: 1000, comm }).to_vec();
    let view = AccountView { counts: vec![(comm, 2)], members: BTreeMap::from([(comm, members)]) };
    (view, procs)
}

fn verdicts_of(config: &Config, view: &AccountView, procs: &mut FakeProcs, matcher_ok: bool) -> Vec<CmdVerdict> {
    let mut classifier = InProcessClassifier::default();
    classifier.set_patterns(&config.exclude_commands).unwrap();
    let clocks = FlagClocks::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    let ask = Ask { view, config, clocks: &clocks, matcher_ok, deadline };
    let mut reader = CmdlineReader::new(procs, Pool::new(HELD_CMDLINE_BYTES), deadline, Duration::from_secs(5));
    let (v, _) = verdicts(&mut VerdictCache::default(), &mut reader, &mut classifier, ask);
    [10, 11].map(|pid| v[&ProcId { pid, start_ticks: 1 }]).to_vec()
}

#[guard_test]
fn with_no_pattern_nothing_is_protected_whatever_the_length_or_the_matchers_health() {
    let config = cfg(r#"{"excludeCommands": []}"#);
    let (view, mut procs) = pile(MAX + 1, "pile --x");
    assert_eq!(verdicts_of(&config, &view, &mut procs, true), [CmdVerdict::End, CmdVerdict::End]);
    // A worker that cannot run protects what a pattern might have matched: here, nothing.
    assert_eq!(verdicts_of(&config, &view, &mut procs, false), [CmdVerdict::End, CmdVerdict::End]);
}

#[guard_test]
fn with_patterns_a_command_line_over_the_cap_is_protected_as_too_long_not_as_a_slow_match() {
    let config = cfg("{}");
    let (view, mut procs) = pile(MAX + 1, "pile --x");
    assert_eq!(verdicts_of(&config, &view, &mut procs, true), [CmdVerdict::TooLong, CmdVerdict::End]);
    // At the cap exactly it is matched like any other.
    let (view, mut procs) = pile(MAX, "pile --x");
    assert_eq!(verdicts_of(&config, &view, &mut procs, true), [CmdVerdict::End, CmdVerdict::End]);
    assert_eq!(Limits::default().max_text_bytes, MAX);
}

#[guard_test]
fn a_too_long_command_line_is_skipped_with_its_own_reason_and_counted_as_a_skip() {
    let config = cfg(r#"{"threshold": 2, "timeout": "0s", "excludes": []}"#);
    let (view, _) = pile(0, "");
    let verdicts: HashMap<ProcId, CmdVerdict> = HashMap::from([
        (ProcId { pid: 10, start_ticks: 1 }, CmdVerdict::TooLong),
        (ProcId { pid: 11, start_ticks: 1 }, CmdVerdict::End),
    ]);
    let plan = decide(&TickInput {
        view: &view,
        config: &config,
        clocks: &FlagClocks::new(),
        now: Now::same(1000.0),
        verdicts: &verdicts,
        incidents: &Incidents::default(),
        dry_run: false,
    });
    let bodies: Vec<String> = plan.lines.iter().map(|l| l.body()).collect();
    assert!(bodies.contains(&"SKIPPED pid=10 name=pile reason=cmdline_too_long".to_string()), "{bodies:#?}");
    assert_eq!(plan.targets.iter().map(|t| t.proc.id.pid).collect::<Vec<_>>(), [11]);
    assert_eq!((plan.status[0].would_skip, plan.status[0].would_end), (Some(1), Some(1)));
}

/// A flag clock dropped by a dip under the threshold (or a name excluded now) restarts the
/// name's `timeout`: an account that times a dip at a tick starts it over at will. The drop is a
/// line of its own, with how long the clock had run, so it is never silent.
#[guard_test]
fn a_dropped_flag_clock_is_logged_with_how_long_it_had_run() {
    let config = cfg(r#"{"threshold": 3, "timeout": "1h", "excludes": ["gone"]}"#);
    let (pile, gone, away) = (Comm::new(b"pile"), Comm::new(b"gone"), Comm::new(b"away"));
    let view = AccountView { counts: vec![(pile, 2), (gone, 5)], ..Default::default() };
    let clocks = FlagClocks::from([(pile, 0.0), (gone, 600.0), (away, 3000.0)]);
    let plan = decide(&TickInput {
        view: &view,
        config: &config,
        clocks: &clocks,
        now: Now::same(59.0 * 60.0 + 30.0),
        verdicts: &HashMap::new(),
        incidents: &Incidents::default(),
        dry_run: false,
    });
    let bodies: Vec<String> = plan.lines.iter().map(|l| l.body()).collect();
    assert_eq!(
        bodies,
        [
            "UNFLAGGED name=away count=0 flagged_for=9m reason=below_threshold",
            "UNFLAGGED name=gone count=5 flagged_for=49m reason=excluded",
            "UNFLAGGED name=pile count=2 flagged_for=59m reason=below_threshold",
        ]
    );
    assert!(plan.clocks.is_empty());
    // A name that stays flagged has no such line.
    let view = AccountView { counts: vec![(pile, 3)], ..Default::default() };
    let clocks = FlagClocks::from([(pile, 0.0)]);
    let plan = decide(&TickInput {
        view: &view,
        config: &config,
        clocks: &clocks,
        now: Now::same(600.0),
        verdicts: &HashMap::new(),
        incidents: &Incidents::default(),
        dry_run: false,
    });
    assert!(plan.lines.iter().all(|l| l.kind() != guard::log::Kind::Unflagged), "{:?}", plan.lines);
}

/// A pile renamed to an excluded name (`BASH`: excludes ignore case, as docs/configuration.md
/// says) is never flagged or ended, by design; its status row says so, so it is not invisible.
#[guard_test]
fn a_pile_under_an_excluded_name_is_shown_in_status_as_excluded_not_hidden() {
    let config = cfg(r#"{"threshold": 3}"#);
    let (shout, quiet, work) = (Comm::new(b"BASH"), Comm::new(b"sh"), Comm::new(b"work"));
    let view = AccountView { counts: vec![(shout, 40), (quiet, 2), (work, 2)], ..Default::default() };
    let plan = decide(&TickInput {
        view: &view,
        config: &config,
        clocks: &FlagClocks::new(),
        now: Now::same(1000.0),
        verdicts: &HashMap::new(),
        incidents: &Incidents::default(),
        dry_run: false,
    });
    assert!(plan.lines.is_empty() && plan.targets.is_empty() && plan.flagged == 0, "{:?}", plan.lines);
    let rows: Vec<(&str, u32, bool, bool)> =
        plan.status.iter().map(|n| (n.name.as_str(), n.count, n.excluded, n.flagged_since.is_some())).collect();
    // `sh` is excluded but under the threshold: no row; `work` is on its way (half or more).
    assert_eq!(rows, [("BASH", 40, true, false), ("work", 2, false, false)]);
}

guard_test::main!();
