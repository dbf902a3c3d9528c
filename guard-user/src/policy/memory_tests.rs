//! The rules about the policy's memory: each test fails if its rule is dropped.
use std::{collections::BTreeMap, path::Path};

use super::*;
use crate::{comm::Comm, config::parse};

fn cfg(json: &str) -> Config {
    parse(json.as_bytes(), Path::new("/h")).unwrap()
}

fn pile(n: u32) -> (AccountView, HashMap<ProcId, CmdVerdict>) {
    let name = Comm::new(b"pile");
    let procs: Vec<ProcState> =
        (0..n).map(|i| ProcState { id: ProcId { pid: 100 + i, start_ticks: 1 }, euid: 1000, comm: name }).collect();
    let verdicts = procs.iter().map(|p| (p.id, CmdVerdict::End)).collect();
    (AccountView { counts: vec![(name, n)], members: BTreeMap::from([(name, procs)]) }, verdicts)
}

/// One tick of `memory` on `n` processes named `pile`, every signal `outcome`.
fn tick(memory: &mut Memory, config: &Config, n: u32, now: Now, outcome: Outcome) -> Finished {
    let (view, verdicts) = pile(n);
    let plan = memory.begin(Input { view: &view, config, now, verdicts: &verdicts, dry_run: false });
    let outcomes = vec![outcome; plan.targets().len()];
    plan.finish(&outcomes)
}

#[test]
fn a_matcher_outage_is_said_once_and_again_after_it_recovers() {
    let mut m = Memory::default();
    assert_eq!(m.matcher(true), None);
    let line = m.matcher(false).expect("the outage is said when it starts");
    assert_eq!(line.body(), "WARN pattern_matcher_down reason=worker");
    assert_eq!(m.matcher(false), None, "not again while it lasts");
    assert_eq!(m.matcher(true), None);
    assert!(m.matcher(false).is_some(), "a new outage is said again");
}

#[test]
fn a_key_written_twice_is_warned_once_per_run_with_its_lines() {
    let mut m = Memory::default();
    let config = cfg("{\"threshold\": 5,\n\"threshold\": 50}");
    assert_eq!(config.threshold, 50, "the last one is used");
    let lines = m.repeated_keys(&config, b"/h/c.json");
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0].body(), "WARN config_repeated_key key=threshold count=2 lines=1,2 path=/h/c.json");
    assert!(m.repeated_keys(&config, b"/h/c.json").is_empty(), "the next tick says nothing");
}

#[test]
fn an_unknown_key_is_warned_once_per_run_not_every_tick() {
    let mut m = Memory::default();
    let config = cfg(r#"{"colour": 1}"#);
    let lines = m.unknown_keys(&config, b"/h/c.json");
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0].body(), "WARN config_unknown_key key=colour path=/h/c.json");
    assert!(m.unknown_keys(&config, b"/h/c.json").is_empty(), "the next tick says nothing");
    let more = cfg(r#"{"colour": 1, "size": 2}"#);
    let lines = m.unknown_keys(&more, b"/h/c.json");
    assert_eq!(lines.len(), 1, "a key added later is said once too");
    assert_eq!(lines[0].body(), "WARN config_unknown_key key=size path=/h/c.json");
}

#[test]
fn past_the_unknown_keys_cap_one_line_says_the_rest_go_unreported() {
    let mut m = Memory::default();
    let mut config = cfg("{}");
    config.unknown_keys = (0..config::MAX_UNKNOWN_KEYS + 5).map(|i| format!("k{i}")).collect();
    let lines = m.unknown_keys(&config, b"/c");
    assert_eq!(lines.len(), config::MAX_UNKNOWN_KEYS + 1);
    let last = lines.last().unwrap().body();
    assert_eq!(last, format!("WARN config_unknown_keys_unreported limit={} path=/c", config::MAX_UNKNOWN_KEYS));
    config.unknown_keys = vec!["another".into()];
    assert!(m.unknown_keys(&config, b"/c").is_empty(), "the set stops growing and the cap is said once");
}

#[test]
fn the_state_is_saved_when_it_changed_moved_or_the_wall_clock_stepped_and_not_otherwise() {
    let config = cfg(r#"{"threshold": 3, "timeout": "1h"}"#);
    let mut m = Memory::default();
    assert!(m.load(Ok(State::default()), Now::same(1000.0)).is_none());
    // Flagged now: the clocks changed.
    let done = tick(&mut m, &config, 3, Now::same(1000.0), Outcome::Verified);
    let save = done.save.expect("a new clock is saved");
    assert_eq!(save.path, config.state_file);
    assert_eq!(save.file.clocks.get(&Comm::new(b"pile")), Some(&1000.0), "wall times in the file");
    assert!(m.saved(&save, true).is_none());
    // Nothing changed, same file, same clocks: nothing to write.
    assert_eq!(tick(&mut m, &config, 3, Now::same(1060.0), Outcome::Verified).save, None);
    // The pile dipped below the threshold: its clock is dropped, and that is written.
    let save = tick(&mut m, &config, 2, Now::same(1070.0), Outcome::Verified).save.expect("a dropped clock is saved");
    assert!(save.file.clocks.is_empty());
    assert!(m.saved(&save, true).is_none());
    // Back at the threshold: flagged again, written again.
    let save = tick(&mut m, &config, 3, Now::same(1080.0), Outcome::Verified).save.expect("a new clock is saved");
    assert!(m.saved(&save, true).is_none());
    // The wall clock stepped 2 s (the monotonic one did not): the file's times would be off.
    let stepped = Now { wall: 1122.0, mono: 1120.0 };
    let save = tick(&mut m, &config, 3, stepped, Outcome::Verified).save.expect("a wall step re-dates the file");
    assert!(m.saved(&save, true).is_none());
    // Another stateFile: it does not hold the clocks yet.
    let moved = cfg(r#"{"threshold": 3, "timeout": "1h", "stateFile": "/h/other.json"}"#);
    let later = Now { wall: 1182.0, mono: 1180.0 };
    let save = tick(&mut m, &moved, 3, later, Outcome::Verified).save.expect("a new stateFile is written");
    // The write failed: said, counted, and tried again next tick.
    let line = m.saved(&save, false).expect("a failed write is said");
    assert_eq!(line.body(), "ERROR state_unwritable path=/h/other.json");
    let again = Now { wall: 1242.0, mono: 1240.0 };
    assert!(tick(&mut m, &moved, 3, again, Outcome::Verified).save.is_some(), "tried again");
    assert!(matches!(m.complete(Counts::default()), Line::TickComplete { errors: 1, .. }));
}

#[test]
fn an_unreadable_state_file_is_treated_as_empty_said_and_counted_once() {
    let mut m = Memory::default();
    assert!(m.needs_state());
    let bad = Notice::new(What::StateMalformed).with("path", "/h/.guard-state.json");
    let line = m.load(Err(bad), Now::same(5.0)).expect("said");
    assert_eq!(line.body(), "ERROR state_malformed path=/h/.guard-state.json");
    assert!(!m.needs_state(), "read once per run, not every tick");
    assert!(m.clocks().is_empty());
    let complete = m.complete(Counts { flagged: 2, kills: 1 });
    assert_eq!(complete.body(), "TICK_COMPLETE flagged=2 kills=1 errors=1");
    assert!(matches!(m.complete(Counts::default()), Line::TickComplete { errors: 0, .. }), "counted in one tick only");
}

#[test]
fn a_state_file_read_keeps_each_clock_s_age_on_the_monotonic_clock() {
    let mut m = Memory::default();
    let file = State { clocks: FlagClocks::from([(Comm::new(b"pile"), 1_000.0)]), ..Default::default() };
    m.load(Ok(file), Now { wall: 1_600.0, mono: 50.0 });
    assert_eq!(m.clocks().get(&Comm::new(b"pile")), Some(&-550.0));
}

#[test]
fn finishing_counts_the_kills_and_keeps_the_clocks_and_enforcements_it_decided() {
    let config = cfg(r#"{"threshold": 3, "timeout": "0s", "repeatAfter": 2}"#);
    let mut m = Memory::default();
    m.load(Ok(State::default()), Now::same(0.0));
    let done = tick(&mut m, &config, 3, Now::same(10.0), Outcome::Ended { needed_sigkill: false });
    assert_eq!(done.counts, Counts { flagged: 1, kills: 3 });
    assert_eq!(done.lines.iter().filter(|l| l.kind() == crate::log::Kind::Killed).count(), 3);
    assert_eq!(m.clocks().get(&Comm::new(b"pile")), Some(&10.0), "the memory holds this tick's clocks");
    // The second enforcement within 24 h is a repeat: the first was remembered.
    let done = tick(&mut m, &config, 3, Now::same(20.0), Outcome::Ended { needed_sigkill: true });
    assert!(done.lines.iter().any(|l| l.kind() == crate::log::Kind::Repeat), "{:?}", done.lines);
    assert_eq!(done.offenders.len(), 1);
}

#[test]
fn a_config_error_tick_says_why_ends_nothing_and_keeps_the_clocks() {
    let config = cfg(r#"{"threshold": 3, "timeout": "1h"}"#);
    let mut m = Memory::default();
    m.load(Ok(State::default()), Now::same(0.0));
    tick(&mut m, &config, 3, Now::same(10.0), Outcome::Verified);
    let [error, complete] = m.config_error(What::ConfigMalformed, "config_malformed threshold value=0".into());
    assert_eq!(error.body(), "ERROR config_malformed threshold value=0");
    assert_eq!(complete.body(), "TICK_COMPLETE flagged=0 kills=0 errors=1");
    assert_eq!(m.clocks().get(&Comm::new(b"pile")), Some(&10.0));
}

#[test]
fn command_lines_left_unread_are_said_once_per_run_whatever_follows() {
    let mut memory = Memory::default();
    assert!(memory.cmdlines_unread(0, 0).is_none(), "nothing unread, nothing said");
    let line = memory.cmdlines_unread(3, 1).expect("the first tick that leaves one unread says so");
    assert_eq!(line.body(), "WARN cmdline_read_budget unread=3 slow=1");
    // Later ticks (none unread, or more) say nothing again: the count is in the status.
    assert!(memory.cmdlines_unread(0, 0).is_none());
    assert!(memory.cmdlines_unread(7, 7).is_none());
}
