//! The policy: a pure function of (counts, config, flag clocks, now) → what this tick does.
//!
//! No kernel, no files, no clock: the daemon passes everything in, tests call it directly.
//! SPEC §4 steps 3–6 live here; step 5's per-process half is [`classify`], which the enforcer
//! applies to each command line it reads.
use std::collections::BTreeMap;

use crate::{comm::Comm, config::Config};

/// Flag clocks: name → when it first reached the threshold (unix seconds, ms precision).
/// This is what the state file holds.
pub type FlagClocks = BTreeMap<String, f64>;

/// What the tick does about one name at/over the threshold.
#[derive(Clone, Debug, PartialEq)]
pub struct NameVerdict {
    pub name: Comm,
    pub count: u32,
    /// Unix seconds when the name was first flagged.
    pub first_flagged: f64,
    /// First tick at/over the threshold: logged `first_flagged=now`.
    pub newly_flagged: bool,
    /// Flagged for at least `timeout`: end its processes (but the excluded ones).
    pub enforce: bool,
}

impl NameVerdict {
    /// Seconds since the name was flagged (never negative, even if the clock stepped back).
    pub fn elapsed_secs(&self, now: f64) -> f64 {
        (now - self.first_flagged).max(0.0)
    }

    /// When enforcement is due (unix seconds).
    pub fn deadline(&self, config: &Config) -> f64 {
        self.first_flagged + config.timeout.as_secs_f64()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Every non-excluded name at/over the threshold, sorted by name.
    pub names: Vec<NameVerdict>,
    /// The flag clocks to store: exactly the names in `names` (dropped and excluded names are
    /// gone, so their clock restarts when they come back).
    pub clocks: FlagClocks,
}

impl Plan {
    /// The earliest enforcement deadline among names not enforced this tick (for the deadline timer).
    pub fn next_deadline(&self, config: &Config) -> Option<f64> {
        self.names.iter().filter(|v| !v.enforce).map(|v| v.deadline(config)).reduce(f64::min)
    }
}

/// State keys are names as text; a non-UTF-8 comm is stored lossily (documented in DEVELOPERS.md).
pub fn clock_key(name: &Comm) -> String {
    name.display().into_owned()
}

/// SPEC §4 steps 3–6.
pub fn plan(counts: &[(Comm, u32)], config: &Config, clocks: &FlagClocks, now: f64) -> Plan {
    let mut names: Vec<NameVerdict> = counts
        .iter()
        .filter(|(name, count)| *count >= config.threshold && !config.is_excluded(name))
        .map(|&(name, count)| {
            let key = clock_key(&name);
            let (first_flagged, newly_flagged) = match clocks.get(&key) {
                // A clock in the future (the wall clock stepped back) counts from now.
                Some(&t) if t.is_finite() && t <= now => (t, false),
                Some(_) => (now, false),
                None => (now, true),
            };
            let enforce = now - first_flagged >= config.timeout.as_secs_f64();
            NameVerdict { name, count, first_flagged, newly_flagged, enforce }
        })
        .collect();
    names.sort_by(|a, b| a.name.cmp(&b.name));
    let clocks = names.iter().map(|v| (clock_key(&v.name), v.first_flagged)).collect();
    Plan { names, clocks }
}

/// What happens to one live process of an enforced name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProcessVerdict {
    /// Its command line matches this `excludeCommands` pattern: logged SKIPPED, left alone.
    Skip { pattern: String },
    /// SIGTERM, then SIGKILL if still alive.
    End,
}

pub fn classify(cmdline: &[u8], config: &Config) -> ProcessVerdict {
    match config.excluding_pattern(cmdline) {
        Some(p) => ProcessVerdict::Skip { pattern: p.as_str().to_string() },
        None => ProcessVerdict::End,
    }
}

/// `first_flagged=<m>m_ago`: whole minutes, rounded down.
pub fn minutes_ago(elapsed_secs: f64) -> u64 {
    (elapsed_secs / 60.0).floor() as u64
}

/// `elapsed=<h>h`: hours with one decimal.
pub fn hours_one_decimal(elapsed_secs: f64) -> String {
    format!("{:.1}", elapsed_secs / 3600.0)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::parse;

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
        assert_eq!(p.clocks.get("agentihooks"), Some(&1000.0));
        assert_eq!(p.next_deadline(&config), Some(1600.0));
        let later = plan(&[(c("agentihooks"), 4)], &config, &p.clocks, 1599.0);
        assert!(!later.names[0].newly_flagged && !later.names[0].enforce);
        let due = plan(&[(c("agentihooks"), 4)], &config, &p.clocks, 1600.0);
        assert!(due.names[0].enforce);
        assert_eq!(due.clocks.get("agentihooks"), Some(&1000.0), "the clock is kept while enforcing");
    }

    #[test]
    fn a_name_dropping_below_the_threshold_loses_its_clock() {
        let config = cfg(r#"{"threshold": 3}"#);
        let clocks = FlagClocks::from([("agentihooks".to_string(), 10.0)]);
        let p = plan(&[(c("agentihooks"), 2)], &config, &clocks, 100.0);
        assert!(p.names.is_empty() && p.clocks.is_empty());
        let back = plan(&[(c("agentihooks"), 3)], &config, &p.clocks, 200.0);
        assert!(back.names[0].newly_flagged);
        assert_eq!(back.names[0].first_flagged, 200.0);
    }

    #[test]
    fn excluded_names_are_never_flagged_and_lose_their_clock() {
        let config = cfg(r#"{"threshold": 1, "excludes": ["BASH", "sleep"]}"#);
        let clocks = FlagClocks::from([("sleep".to_string(), 10.0)]);
        let p = plan(&[(c("bash"), 50), (c("sleep"), 50)], &config, &clocks, 100.0);
        assert!(p.names.is_empty() && p.clocks.is_empty());
    }

    #[test]
    fn a_clock_in_the_future_restarts_from_now_instead_of_never_enforcing() {
        let config = cfg(r#"{"threshold": 1, "timeout": "0s"}"#);
        let clocks = FlagClocks::from([("x".to_string(), 1e12)]);
        let p = plan(&[(c("x"), 1)], &config, &clocks, 100.0);
        assert_eq!(p.names[0].first_flagged, 100.0);
        assert!(p.names[0].enforce, "timeout 0 enforces on the flagging tick");
    }

    #[test]
    fn wrapper_with_select_profile_is_never_killed() {
        let config = cfg("{}");
        assert_eq!(
            classify(b"/usr/bin/agentihooks select-profile coder", &config),
            ProcessVerdict::Skip { pattern: "(^|[ /])agentihooks select-profile( |$)".into() }
        );
        assert_eq!(classify(b"python3 -m scripts.swarm.scheduled_tick", &config), ProcessVerdict::Skip {
            pattern: " -m scripts[.]swarm[.]scheduled_tick( |$)".into()
        });
        assert_eq!(classify(b"agentihooks watch", &config), ProcessVerdict::End);
    }

    #[test]
    fn log_figures_round_as_the_spec_says() {
        assert_eq!(minutes_ago(119.9), 1);
        assert_eq!(hours_one_decimal(5400.0), "1.5");
        assert_eq!(hours_one_decimal(0.0), "0.0");
    }
}
