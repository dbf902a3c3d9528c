//! The `sessions` key (docs/configuration.md): `{"roots": [ERE…], "leftovers": "report"|"stop",
//! "grace": "10s"}`, or `false` (off, as when absent). `roots` are checked exactly like
//! `excludeCommands` (the same static bounds here, the same sandboxed matcher in the daemon).
use serde_json::{Map, Value};

use super::{duration, kind, prefix, shown, Checker, ConfigError, Problem};
use crate::{
    config::{Leftovers, PatternList, Sessions, DEFAULT_GRACE, MAX_GRACE},
    escape,
};

const FIX_SESSIONS: &str = r#"write false to turn it off, or an object like {"roots": ["(^|/)agent-wrapper( |$)"], "leftovers": "report", "grace": "10s"}"#;
const FIX_ROOTS: &str = r#"name the session roots' command lines, e.g. "roots": ["(^|/)agent-wrapper( |$)"]"#;
const FIX_LEFTOVERS: &str = r#"write "report" (LEFTOVER lines only) or "stop" (end them: SIGTERM, 10 s, SIGKILL)"#;
const FIX_GRACE: &str = r#"write a duration from 0s to 24h, e.g. "10s""#;
const KEYS: &[&str] = &["roots", "leftovers", "grace"];
const FIX_BROAD_ROOT: &str = "match only the command lines of the programs that start sessions, e.g. \
                              (^|/)agent-wrapper( |$) (try it with guard-user match --pattern); sessions stay off \
                              until it is fixed";

impl Checker {
    /// `Some(setting)` when valid (`Some(None)` = off), `None` after reporting a problem.
    pub(super) fn sessions(&mut self, v: &Value) -> Option<Option<Sessions>> {
        let map: &Map<String, Value> = match v {
            Value::Bool(false) => return Some(None),
            Value::Object(m) => m,
            other => {
                self.bad("sessions", None, format!("{} is {}", shown(other), kind(other)), FIX_SESSIONS, v);
                return None;
            }
        };
        let before = self.problems.len();
        let mut s = Sessions { roots: Vec::new(), leftovers: Leftovers::Report, grace: DEFAULT_GRACE };
        match map.get("roots") {
            Some(roots) => {
                if let Some(list) = self.patterns(PatternList::SessionsRoots, roots) {
                    s.roots = list;
                }
            }
            None => self.bad("sessions.roots", None, "is missing".into(), FIX_ROOTS, v),
        }
        if let Some(mode) = map.get("leftovers") {
            match mode.as_str() {
                Some("report") => s.leftovers = Leftovers::Report,
                Some("stop") => s.leftovers = Leftovers::Stop,
                _ => {
                    let what = match mode {
                        Value::String(_) => format!("{} is neither \"report\" nor \"stop\"", shown(mode)),
                        other => format!("{} is {}", shown(other), kind(other)),
                    };
                    self.bad("sessions.leftovers", None, what, FIX_LEFTOVERS, mode);
                }
            }
        }
        if let Some(grace) = map.get("grace") {
            match duration(grace, self.written.raw("sessions.grace"), MAX_GRACE) {
                Ok(d) => s.grace = d,
                Err(what) => self.bad("sessions.grace", None, what, FIX_GRACE, grace),
            }
        }
        for key in map.keys().filter(|k| !KEYS.contains(&k.as_str())) {
            let fix = match super::closest(key, KEYS) {
                Some(k) => format!("did you mean \"{k}\"? (an unknown key is ignored)"),
                None => "remove it; sessions holds roots, leftovers and grace".to_string(),
            };
            self.warn(
                format!("sessions.{}", super::shown_key(key)),
                "is not a key guard knows, so it is ignored".into(),
                fix,
            );
        }
        (self.problems.len() == before).then_some(Some(s))
    }
}

/// A `sessions.roots` pattern (or, with `index` `None`, the whole list) that matches the empty
/// command line or every ordinary one (`pattern::match_all::too_broad_for_roots`): every process
/// would be a root, and every orphan a leftover, so the config is refused (docs/configuration.md).
pub fn too_broad_root(index: Option<usize>, pattern: &str) -> Problem {
    let list = PatternList::SessionsRoots;
    let key = index.map_or_else(|| list.key().to_string(), |i| format!("{}[{i}]", list.key()));
    let what = match index {
        Some(_) => format!(
            "\"{}\" matches every ordinary command line (or the empty one), so nearly every process would be a \
             session root and every orphan a leftover",
            escape::text_capped(pattern.as_bytes(), 60)
        ),
        None => "together these patterns match every ordinary command line, so nearly every process would be a \
                 session root and every orphan a leftover"
            .to_string(),
    };
    let error = ConfigError::Pattern { list, pattern: prefix(pattern), index, why: what.clone(), fix: FIX_BROAD_ROOT };
    Problem { key, what, fix: FIX_BROAD_ROOT.into(), warning: false, error: Some(error) }
}

#[cfg(test)]
mod tests {
    use std::{path::Path, time::Duration};

    use crate::config::{parse, problems, Leftovers, Sessions};

    fn sessions(json: &str) -> Option<Sessions> {
        parse(json.as_bytes(), Path::new("/home/u")).unwrap().sessions
    }

    fn err(json: &str) -> String {
        parse(json.as_bytes(), Path::new("/home/u")).unwrap_err().log_reason()
    }

    #[test]
    fn sessions_are_off_unless_configured_and_take_report_and_ten_seconds_by_default() {
        assert_eq!(sessions("{}"), None);
        assert_eq!(sessions(r#"{"sessions": false}"#), None);
        let s = sessions(r#"{"sessions": {"roots": ["(^|/)wrapper( |$)"]}}"#).unwrap();
        assert_eq!(
            s,
            Sessions {
                roots: vec!["(^|/)wrapper( |$)".into()],
                leftovers: Leftovers::Report,
                grace: Duration::from_secs(10)
            }
        );
        let s = sessions(r#"{"sessions": {"roots": [], "leftovers": "stop", "grace": 0}}"#).unwrap();
        assert_eq!((s.leftovers, s.grace), (Leftovers::Stop, Duration::ZERO));
        assert_eq!(sessions(r#"{"sessions": {"roots": [], "grace": "2m"}}"#).unwrap().grace, Duration::from_secs(120));
    }

    #[test]
    fn a_wrong_sessions_value_names_the_key_the_value_and_the_fix() {
        assert!(err(r#"{"sessions": true}"#)
            .starts_with("config_malformed sessions value=true reason=\"true is a boolean\""));
        assert!(err(r#"{"sessions": {"leftovers": "stop"}}"#).starts_with("config_malformed sessions.roots value="));
        assert!(err(r#"{"sessions": {"roots": [], "leftovers": "kill"}}"#)
            .starts_with(r#"config_malformed sessions.leftovers value=kill reason="\"kill\" is neither"#));
        assert!(err(r#"{"sessions": {"roots": [], "grace": "25h"}}"#)
            .starts_with("config_malformed sessions.grace value=25h"));
        assert!(err(r#"{"sessions": {"roots": [3]}}"#).starts_with("config_malformed sessions.roots value=[3] index=0"));
    }

    #[test]
    fn roots_have_the_bounds_of_exclude_commands() {
        let many: Vec<String> = (0..257).map(|_| "\"x\"".to_string()).collect();
        assert!(err(&format!(r#"{{"sessions": {{"roots": [{}]}}}}"#, many.join(",")))
            .starts_with("config_malformed sessions.roots value="));
        let e = err(r#"{"sessions": {"roots": ["a\u0000b"]}}"#);
        assert!(e.starts_with(r"config_malformed sessions.roots pattern=a\x00b index=0"), "{e}");
        let costly = r#"{"sessions": {"roots": ["((a{1,255}){1,255}){1,255}"]}}"#;
        assert!(err(costly).contains("too costly"), "{}", err(costly));
    }

    #[test]
    fn an_unknown_key_inside_sessions_is_a_warning_naming_the_one_it_resembles() {
        let listed: Vec<String> = problems(br#"{"sessions": {"roots": [], "grce": "1s"}}"#, Path::new("/h"))
            .iter()
            .map(|p| p.to_string())
            .collect();
        assert_eq!(
            listed,
            [
                r#"sessions.grce: is not a key guard knows, so it is ignored; did you mean "grace"? (an unknown key is ignored)"#
            ]
        );
    }
}
