//! The `slots` key (docs/configuration.md `slots`): `{"<name>": {"commands": [ERE…], "max": <n>,
//! "maxWait": "30m", "mode": "report"|"queue"}, …}`, or `false` (off, as when absent). Each
//! slot's `commands` are checked exactly like `excludeCommands` (the same static bounds here,
//! the same sandboxed matcher in the daemon); every bound below is what the account's config
//! can make the daemon hold.
use serde_json::{Map, Value};

use super::{duration, kind, shown, Checker};
use crate::config::{
    check_patterns_static, ConfigError, PatternList, Slot, SlotMode, DEFAULT_MAX_WAIT, MAX_MAX_WAIT, MAX_SLOTS,
    MAX_SLOT_HOLDERS, MAX_SLOT_NAME, MAX_SLOT_PATTERNS, MIN_MAX_WAIT,
};

const FIX_SLOTS: &str = r#"write false to turn slots off, or an object of named slots like {"build": {"commands": ["(^|/)cargo (build|test)( |$)"], "max": 2, "mode": "queue"}}"#;
const FIX_NAME: &str = "name each slot with 1 to 32 letters, digits, '_', '-' or '.', e.g. \"build\"";
const FIX_SLOT: &str = r#"write an object like {"commands": ["(^|/)cargo (build|test)( |$)"], "max": 2}"#;
const FIX_COMMANDS: &str =
    r#"name the heavy commands' command lines, e.g. "commands": ["(^|/)cargo (build|test)( |$)"]"#;
const FIX_COMMAND: &str =
    "write each pattern as a string of at most 1024 bytes without NUL, at most 64 in all the slots (try one with guard-user match)";
const FIX_COSTLY: &str = "avoid nesting repeat counts (a{1,255} inside another {m,n}) and large counts; match a \
     distinctive word of the command line instead (try it with guard-user match)";
const FIX_MAX: &str = "write how many may run at once, a whole number from 1 to 1024, e.g. 2";
const FIX_MAX_WAIT: &str = r#"write a duration from 1s to 24h, e.g. "30m""#;
const FIX_MODE: &str =
    r#"write "report" (SLOT_WAIT lines only, nothing waits) or "queue" (commands over max wait their turn)"#;
const KEYS: &[&str] = &["commands", "max", "maxWait", "mode"];

/// Whether `name` can name a slot: it is written raw in log lines, metric labels and status
/// rows, so it is kept to a set of characters none of them has to escape.
fn valid_slot_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_SLOT_NAME
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

impl Checker {
    /// `Some(slots)` when valid (empty = off), `None` after reporting a problem.
    pub(super) fn slots(&mut self, v: &Value) -> Option<Vec<Slot>> {
        let map: &Map<String, Value> = match v {
            Value::Bool(false) => return Some(Vec::new()),
            Value::Object(m) => m,
            other => {
                self.bad("slots", None, format!("{} is {}", shown(other), kind(other)), FIX_SLOTS, v);
                return None;
            }
        };
        let before = self.problems.len();
        if map.len() > MAX_SLOTS {
            self.bad("slots", None, format!("{} slots, more than {MAX_SLOTS}", map.len()), FIX_SLOTS, v);
            return None;
        }
        let mut slots = Vec::with_capacity(map.len());
        let mut patterns = 0usize;
        // serde_json's map is sorted by key: slots are tried in the order of their names.
        for (name, spec) in map {
            if !valid_slot_name(name) {
                let what = format!("\"{}\" is not a slot name", crate::escape::text_capped(name.as_bytes(), 60));
                self.value_problem(
                    format!("slots.{}", crate::escape::text_capped(name.as_bytes(), 60)),
                    "slots",
                    what,
                    FIX_NAME,
                    v,
                );
                continue;
            }
            if let Some(slot) = self.slot(name, spec, patterns) {
                patterns += slot.commands.len();
                slots.push(slot);
            }
        }
        (self.problems.len() == before).then_some(slots)
    }

    /// One slot; `earlier`: patterns of the slots before it (all the slots' patterns share one
    /// compiled list in the daemon, so the bound is on their sum).
    fn slot(&mut self, name: &str, spec: &Value, earlier: usize) -> Option<Slot> {
        let Value::Object(map) = spec else {
            let what = format!("{} is {}", shown(spec), kind(spec));
            self.value_problem(format!("slots.{name}"), "slots", what, FIX_SLOT, spec);
            return None;
        };
        let before = self.problems.len();
        let mut slot = Slot {
            name: name.to_string(),
            commands: Vec::new(),
            max: 1,
            max_wait: DEFAULT_MAX_WAIT,
            mode: SlotMode::Report,
        };
        match map.get("commands") {
            Some(list) => {
                if let Some(c) = self.slot_commands(name, list, earlier) {
                    slot.commands = c;
                }
            }
            None => {
                let key = format!("slots.{name}.commands");
                self.value_problem(key, "slots.commands", "is missing".into(), FIX_COMMANDS, spec)
            }
        }
        match map.get("max") {
            Some(max) => match super::whole(max, None, 1, MAX_SLOT_HOLDERS as u64, "") {
                Ok(n) => slot.max = n as u32,
                Err(what) => self.value_problem(format!("slots.{name}.max"), "slots.max", what, FIX_MAX, max),
            },
            None => {
                let what = "is missing".to_string();
                self.value_problem(format!("slots.{name}.max"), "slots.max", what, FIX_MAX, spec)
            }
        }
        if let Some(wait) = map.get("maxWait") {
            match duration(wait, None, MAX_MAX_WAIT) {
                Ok(d) if d >= MIN_MAX_WAIT => slot.max_wait = d,
                Ok(_) => {
                    let what = format!("{} is shorter than 1s", shown(wait));
                    self.value_problem(format!("slots.{name}.maxWait"), "slots.maxWait", what, FIX_MAX_WAIT, wait);
                }
                Err(what) => {
                    self.value_problem(format!("slots.{name}.maxWait"), "slots.maxWait", what, FIX_MAX_WAIT, wait)
                }
            }
        }
        if let Some(mode) = map.get("mode") {
            match mode.as_str() {
                Some("report") => slot.mode = SlotMode::Report,
                Some("queue") => slot.mode = SlotMode::Queue,
                _ => {
                    let what = match mode {
                        Value::String(_) => format!("{} is neither \"report\" nor \"queue\"", shown(mode)),
                        other => format!("{} is {}", shown(other), kind(other)),
                    };
                    self.value_problem(format!("slots.{name}.mode"), "slots.mode", what, FIX_MODE, mode);
                }
            }
        }
        for key in map.keys().filter(|k| !KEYS.contains(&k.as_str())) {
            let fix = match super::closest(key, KEYS) {
                Some(k) => format!("did you mean \"{k}\"? (an unknown key is ignored)"),
                None => "remove it; a slot holds commands, max, maxWait and mode".to_string(),
            };
            self.warn(
                format!("slots.{name}.{}", super::shown_key(key)),
                "is not a key guard knows, so it is ignored".into(),
                fix,
            );
        }
        (self.problems.len() == before).then_some(slot)
    }

    fn slot_commands(&mut self, name: &str, v: &Value, earlier: usize) -> Option<Vec<String>> {
        let key = format!("slots.{name}.commands");
        let Value::Array(items) = v else {
            self.value_problem(key, "slots.commands", format!("{} is {}", shown(v), kind(v)), FIX_COMMANDS, v);
            return None;
        };
        let before = self.problems.len();
        if items.is_empty() {
            self.value_problem(key.clone(), "slots.commands", "is empty".into(), FIX_COMMANDS, v);
        }
        if earlier + items.len() > MAX_SLOT_PATTERNS {
            let what = format!("{} patterns in all the slots, more than {MAX_SLOT_PATTERNS}", earlier + items.len());
            self.value_problem(key.clone(), "slots.commands", what, FIX_COMMAND, v);
            return None;
        }
        let mut patterns = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            match item {
                Value::String(s) => patterns.push(s.clone()),
                other => {
                    let what = format!("{} is {}", shown(other), kind(other));
                    self.value_problem(format!("{key}[{i}]"), "slots.commands", what, FIX_COMMAND, v);
                }
            }
        }
        if self.problems.len() > before {
            return None;
        }
        for issue in check_patterns_static(&patterns) {
            let i = issue.index.unwrap_or(0);
            let fix = if issue.what.starts_with("is too costly") { FIX_COSTLY } else { FIX_COMMAND };
            let error = ConfigError::Pattern {
                list: PatternList::SlotCommands,
                pattern: super::prefix(&patterns[i]),
                index: Some(earlier + i),
                why: format!("{key}[{i}] {}", issue.what),
                fix,
            };
            self.error(format!("{key}[{i}]"), issue.what, fix, error);
        }
        (self.problems.len() == before).then_some(patterns)
    }

    /// A problem with a value inside `slots`: `key` names it for `validate` (`slots.build.max`),
    /// `log_key` for the ERROR line (`config_malformed slots.max value=0 reason="build: …"`).
    fn value_problem(&mut self, key: String, log_key: &'static str, what: String, fix: &'static str, v: &Value) {
        let takes_string = matches!(log_key, "slots.maxWait" | "slots.mode");
        // A string where the key takes none: its text, quoted (`value="2"`, never the number 2).
        let string = matches!(v, Value::String(_)) && !takes_string;
        let value = match v {
            Value::String(t) if string => t.as_bytes()[..t.len().min(super::MAX_SHOWN_VALUE + 1)].to_vec(),
            _ => super::shown_value(v, takes_string),
        };
        let why = if what.starts_with(&key) { what.clone() } else { format!("{key}: {what}") };
        let error = ConfigError::Value { key: log_key, value, string, index: None, why, fix };
        self.error(key, what, fix, error);
    }
}

/// The slot a combined list's pattern index belongs to (the daemon compiles every slot's
/// `commands` into one list, in the slots' order).
pub fn slot_of_pattern(slots: &[Slot], mut index: usize) -> Option<usize> {
    for (i, s) in slots.iter().enumerate() {
        if index < s.commands.len() {
            return Some(i);
        }
        index -= s.commands.len();
    }
    None
}

/// Every slot's `commands`, in the slots' order (what the daemon compiles).
pub fn all_patterns(slots: &[Slot]) -> Vec<String> {
    slots.iter().flat_map(|s| s.commands.iter().cloned()).collect()
}

#[cfg(test)]
mod tests {
    use std::{path::Path, time::Duration};

    use super::slot_of_pattern;
    use crate::config::{parse, problems, Slot, SlotMode};

    fn slots(json: &str) -> Vec<Slot> {
        parse(json.as_bytes(), Path::new("/home/u")).unwrap().slots
    }

    fn err(json: &str) -> String {
        parse(json.as_bytes(), Path::new("/home/u")).unwrap_err().log_reason()
    }

    fn listed(json: &str) -> Vec<String> {
        problems(json.as_bytes(), Path::new("/h")).iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn slots_are_off_unless_configured_and_report_with_thirty_minutes_by_default() {
        assert!(slots("{}").is_empty());
        assert!(slots(r#"{"slots": false}"#).is_empty());
        assert!(slots(r#"{"slots": {}}"#).is_empty());
        let s = slots(r#"{"slots": {"build": {"commands": ["(^|/)cargo build"], "max": 2}}}"#);
        assert_eq!(
            s,
            vec![Slot {
                name: "build".into(),
                commands: vec!["(^|/)cargo build".into()],
                max: 2,
                max_wait: Duration::from_secs(1800),
                mode: SlotMode::Report,
            }]
        );
        let s = slots(
            r#"{"slots": {"zz": {"commands": ["z"], "max": 1, "mode": "queue", "maxWait": 5},
                          "aa": {"commands": ["a", "b"], "max": 3, "maxWait": "2m"}}}"#,
        );
        // Tried in the order of their names.
        assert_eq!(s.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["aa", "zz"]);
        assert_eq!(
            (s[1].mode, s[1].max_wait, s[0].max_wait),
            (SlotMode::Queue, Duration::from_secs(5), Duration::from_secs(120))
        );
        assert_eq!(
            [slot_of_pattern(&s, 0), slot_of_pattern(&s, 1), slot_of_pattern(&s, 2), slot_of_pattern(&s, 3)],
            [Some(0), Some(0), Some(1), None]
        );
    }

    #[test]
    fn a_wrong_slots_value_names_the_slot_the_key_and_the_fix() {
        assert!(
            err(r#"{"slots": true}"#).starts_with(r#"config_malformed slots value=true reason="true is a boolean""#)
        );
        let e = err(r#"{"slots": {"build": {"commands": ["x"], "max": 0}}}"#);
        assert!(e.starts_with(r#"config_malformed slots.max value=0 reason="slots.build.max: 0 is below 1""#), "{e}");
        let e = err(r#"{"slots": {"build": {"commands": ["x"]}}}"#);
        assert!(e.starts_with("config_malformed slots.max value="), "{e}");
        let e = err(r#"{"slots": {"build": {"commands": ["x"], "max": 1, "mode": "freeze"}}}"#);
        assert!(
            e.starts_with(
                r#"config_malformed slots.mode value=freeze reason="slots.build.mode: \"freeze\" is neither"#
            ),
            "{e}"
        );
        let e = err(r#"{"slots": {"build": {"commands": ["x"], "max": 1, "maxWait": "25h"}}}"#);
        assert!(e.starts_with("config_malformed slots.maxWait value=25h"), "{e}");
        let e = err(r#"{"slots": {"build": {"commands": ["x"], "max": 1, "maxWait": 0}}}"#);
        assert!(e.contains("is shorter than 1s"), "{e}");
        let e = err(r#"{"slots": {"build": {"commands": [], "max": 1}}}"#);
        assert!(e.starts_with("config_malformed slots.commands value=[]"), "{e}");
        let e = err(r#"{"slots": {"bad name\nKILLED": {"commands": ["x"], "max": 1}}}"#);
        assert!(e.starts_with("config_malformed slots value=") && e.contains("is not a slot name"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        let e = err(r#"{"slots": {"build": {"commands": ["a\u0000b"], "max": 1}}}"#);
        assert!(e.starts_with(r"config_malformed slots.commands pattern=a\x00b index=0"), "{e}");
        let costly = r#"{"slots": {"build": {"commands": ["((a{1,255}){1,255}){1,255}"], "max": 1}}}"#;
        assert!(err(costly).contains("too costly"), "{}", err(costly));
    }

    #[test]
    fn the_slots_bounds_hold_whatever_the_config_says() {
        let many: Vec<String> = (0..17).map(|i| format!(r#""s{i}": {{"commands": ["x"], "max": 1}}"#)).collect();
        assert!(err(&format!(r#"{{"slots": {{{}}}}}"#, many.join(","))).contains("17 slots, more than 16"));
        let pats: Vec<String> = (0..40).map(|_| "\"x\"".to_string()).collect();
        let two = format!(
            r#"{{"slots": {{"a": {{"commands": [{p}], "max": 1}}, "b": {{"commands": [{p}], "max": 1}}}}}}"#,
            p = pats.join(",")
        );
        assert!(err(&two).contains("80 patterns in all the slots, more than 64"), "{}", err(&two));
        let e = err(r#"{"slots": {"build": {"commands": ["x"], "max": 1025}}}"#);
        assert!(e.contains("1025 is more than 1024"), "{e}");
        let long = "x".repeat(33);
        assert!(err(&format!(r#"{{"slots": {{"{long}": {{"commands": ["x"], "max": 1}}}}}}"#))
            .contains("is not a slot name"));
    }

    #[test]
    fn validate_lists_every_slot_problem_under_its_own_key() {
        assert_eq!(
            listed(r#"{"slots": {"build": {"commands": ["x"], "max": 0, "mxWait": "1m"}, "test": {"max": 2}}}"#),
            [
                "slots.build.max: 0 is below 1; write how many may run at once, a whole number from 1 to 1024, e.g. 2",
                r#"slots.build.mxWait: is not a key guard knows, so it is ignored; did you mean "maxWait"? (an unknown key is ignored)"#,
                r#"slots.test.commands: is missing; name the heavy commands' command lines, e.g. "commands": ["(^|/)cargo (build|test)( |$)"]"#,
            ]
        );
    }
}
