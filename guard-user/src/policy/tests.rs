//! The name rules of docs/architecture.md (see decide_tests for whole ticks).
use std::path::Path;

use super::*;
use crate::{config::parse, log::line::hours_one_decimal};

fn cfg(json: &str) -> Config {
    parse(json.as_bytes(), Path::new("/h")).unwrap()
}

fn c(name: &str) -> Comm {
    Comm::new(name.as_bytes())
}

#[test]
fn a_name_reaching_the_threshold_is_flagged_now_and_not_enforced_before_the_timeout() {
    let config = cfg(r#"{"threshold": 3, "timeout": "10m"}"#);
    let p = plan(&[(c("agentihooks"), 3), (c("vim"), 2)], &config, &FlagClocks::new(), 1000.0);
    assert_eq!(p.names.len(), 1);
    assert!(p.names[0].newly_flagged && !p.names[0].enforce);
    assert_eq!(p.clocks.get(&c("agentihooks")), Some(&1000.0));
    assert_eq!(p.next_deadline(&config), Some(1600.0));
    let later = plan(&[(c("agentihooks"), 4)], &config, &p.clocks, 1599.0);
    assert!(!later.names[0].newly_flagged && !later.names[0].enforce);
    let due = plan(&[(c("agentihooks"), 4)], &config, &p.clocks, 1600.0);
    assert!(due.names[0].enforce);
    assert_eq!(due.clocks.get(&c("agentihooks")), Some(&1000.0), "the clock is kept while enforcing");
}

#[test]
fn a_name_dropping_below_the_threshold_loses_its_clock() {
    let config = cfg(r#"{"threshold": 3}"#);
    let clocks = FlagClocks::from([(c("agentihooks"), 10.0)]);
    let p = plan(&[(c("agentihooks"), 2)], &config, &clocks, 100.0);
    assert!(p.names.is_empty() && p.clocks.is_empty());
    let back = plan(&[(c("agentihooks"), 3)], &config, &p.clocks, 200.0);
    assert!(back.names[0].newly_flagged);
    assert_eq!(back.names[0].first_flagged, 200.0);
}

#[test]
fn excluded_names_are_never_flagged_and_lose_their_clock() {
    let config = cfg(r#"{"threshold": 1, "excludes": ["BASH", "sleep"]}"#);
    let clocks = FlagClocks::from([(c("sleep"), 10.0)]);
    let p = plan(&[(c("bash"), 50), (c("sleep"), 50)], &config, &clocks, 100.0);
    assert!(p.names.is_empty() && p.clocks.is_empty());
}

#[test]
fn a_clock_in_the_future_restarts_from_now_instead_of_never_enforcing() {
    let config = cfg(r#"{"threshold": 1, "timeout": "0s"}"#);
    let clocks = FlagClocks::from([(c("x"), 1e12)]);
    let p = plan(&[(c("x"), 1)], &config, &clocks, 100.0);
    assert_eq!(p.names[0].first_flagged, 100.0);
    assert!(p.names[0].enforce, "timeout 0 enforces on the flagging tick");
}

#[test]
fn wrapper_with_select_profile_is_never_killed() {
    let patterns = cfg("{}").compile_exclude_commands().unwrap();
    assert_eq!(classify(b"/usr/bin/agentihooks select-profile coder", &patterns), CmdVerdict::Excluded { index: 2 });
    assert_eq!(classify(b"python3 -m scripts.swarm.scheduled_tick", &patterns), CmdVerdict::Excluded { index: 1 });
    assert_eq!(classify(b"agentihooks watch", &patterns), CmdVerdict::End);
}

#[test]
fn log_figures_round_as_the_spec_says() {
    assert_eq!(minutes_ago(119.9), 1);
    assert_eq!(hours_one_decimal(5400.0), "1.5");
    assert_eq!(hours_one_decimal(0.0), "0.0");
}

#[test]
fn pruning_170000_repeat_histories_reported_in_the_future_is_fast_and_bounded() {
    use crate::domain::RepeatHistory;
    // What a planted state file held: a quadratic prune took 261 s on it, past the start timeout.
    let repeats = (0..170_000u32)
        .map(|i| (Comm::new(format!("r{i}").as_bytes()), RepeatHistory { enforcements: vec![], reported: Some(9e12) }))
        .collect();
    let mut inc = Incidents { repeats, ..Default::default() };
    let began = std::time::Instant::now();
    incidents::prune(&mut inc, &FlagClocks::new(), 1000.0);
    eprintln!("prune of 170,000 names: {:?}", began.elapsed());
    assert_eq!(inc.repeats.len(), crate::domain::MAX_REPEAT_NAMES);
    assert!(inc.repeats.values().all(|h| h.reported == Some(1000.0)), "a report in the future counts from now");
    // A day later they are gone, as any report is.
    incidents::prune(&mut inc, &FlagClocks::new(), 1000.0 + incidents::DAY);
    assert!(inc.repeats.is_empty());
}
