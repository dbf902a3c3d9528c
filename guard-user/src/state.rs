//! The state file: flag clocks that survive a restart (docs/operations.md, docs/architecture.md).
//!
//! Format: `{"version":2,"user":"<name>","flagged":{"<name>":<unix seconds>}}` where each key is
//! the name's escaped form ([`crate::escape`], `Comm`'s `Display`): an injective text for the
//! name's bytes, so `q\xff` and `q\xfe` are two keys with two clocks (version 1 wrote names
//! lossily, and both became `q\u{fffd}`).
//!
//! Older files are still read: version 1 and the legacy flat map `{"<name>": <unix seconds>}`
//! hold plain names, taken as their UTF-8 bytes. A plain key longer than a name can be (a lossy
//! one) is dropped: that name's clock restarts, which only ever delays enforcement.
//!
//! The file is read as the account, never through a link, regular files only, at most
//! [`MAX_STATE_BYTES`]; anything else is `ERROR state_malformed path=<p> reason=…` and an empty
//! state, never a wait.
use std::{
    collections::BTreeMap,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
};

use serde_json::{json, Map, Value};

use crate::{
    comm::Comm,
    escape,
    safefs::{atomic_write, read_account_file, Follow, FsIdentity, ReadError, SafeFsError},
};

/// Flag clocks: name → when it first reached the threshold (unix seconds, ms precision),
/// keyed by the name's bytes.
pub type FlagClocks = BTreeMap<Comm, f64>;

/// The format version this guard writes.
pub const STATE_VERSION: u64 = 2;

/// A state file is a few hundred bytes per flagged name; 4 MiB holds tens of thousands of names
/// and bounds what a planted file can make the daemon parse.
pub const MAX_STATE_BYTES: u64 = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Logged as `ERROR state_malformed path=<path>` (plus `reason=…` when it could not be
    /// read at all); the state is then treated as empty.
    #[error("state_malformed path={}{}", escape::log_value(path.as_os_str().as_bytes()), reason.as_deref().map(|r| format!(" {r}")).unwrap_or_default())]
    Malformed { path: PathBuf, reason: Option<String> },
    #[error("cannot write the state file: {0}")]
    Write(#[from] SafeFsError),
}

/// Reads the flag clocks as the account `who`. A missing file is an empty state, not an error.
pub fn load(path: &Path, who: FsIdentity) -> Result<FlagClocks, StateError> {
    let bytes = match read_account_file(path, who, MAX_STATE_BYTES, Follow::NoLinks) {
        Ok(b) => b,
        Err(ReadError::NotFound { .. }) => return Ok(FlagClocks::new()),
        Err(e) => return Err(StateError::Malformed { path: path.into(), reason: Some(e.log_fields()) }),
    };
    parse(&bytes).ok_or_else(|| StateError::Malformed { path: path.into(), reason: None })
}

/// The clocks of a state file's bytes, or `None` when they are not a state file.
pub fn parse(bytes: &[u8]) -> Option<FlagClocks> {
    let Value::Object(root) = serde_json::from_slice::<Value>(bytes).ok()? else { return None };
    let (flagged, escaped): (&Map<String, Value>, bool) = match (root.get("flagged"), root.get("version")) {
        (Some(Value::Object(m)), Some(v)) if v.as_u64() == Some(STATE_VERSION) => (m, true),
        (Some(Value::Object(m)), Some(v)) if v.as_u64() == Some(1) => (m, false),
        // A newer version, or a `flagged` that is not a map: not ours to guess at.
        (Some(_), _) => return None,
        (None, _) => (&root, false), // legacy flat map
    };
    let mut clocks = FlagClocks::new();
    for (key, v) in flagged {
        // A flat map's `version` key is not a name (it was never written beside flat names,
        // but a hand-edited file may hold one).
        if !root.contains_key("flagged") && key == "version" {
            continue;
        }
        let t = v.as_f64().filter(|t| t.is_finite() && *t >= 0.0)?;
        let name = if escaped {
            Comm::from_escaped(key)?
        } else if let Some(name) = Comm::exact(key.as_bytes()) {
            name
        } else {
            continue;
        };
        clocks.insert(name, t);
    }
    Some(clocks)
}

pub fn render(user: &str, clocks: &FlagClocks) -> Vec<u8> {
    render_state(user, &State { clocks: clocks.clone(), ..Default::default() })
}

pub fn save(path: &Path, user: &str, clocks: &FlagClocks, who: FsIdentity) -> Result<(), StateError> {
    Ok(atomic_write(path, &render(user, clocks), who)?)
}

/// Everything that survives a restart: the flag clocks, and the bookkeeping of warnings and
/// repeat offenders (issue-level features that must not repeat or forget across a restart).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    pub clocks: FlagClocks,
    /// Names warned about (`WARNING`), with the flag clock they were warned for: one warning
    /// per incident, an incident being one flag clock.
    pub warned: FlagClocks,
    /// Enforcements per name over the last 24 h, for `REPEAT`.
    pub repeats: BTreeMap<Comm, RepeatHistory>,
}

/// One name's enforcements within the last 24 h.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RepeatHistory {
    /// (unix seconds, processes killed) per enforcing tick that killed any.
    pub enforcements: Vec<(f64, u32)>,
    /// When `REPEAT` was last logged for the name.
    pub reported: Option<f64>,
}

fn ms(t: f64) -> Value {
    json!((t * 1000.0).round() / 1000.0)
}

/// The state file's bytes.
pub fn render_state(user: &str, state: &State) -> Vec<u8> {
    let map = |m: &FlagClocks| -> Map<String, Value> { m.iter().map(|(k, v)| (k.to_string(), ms(*v))).collect() };
    let mut root = json!({"version": STATE_VERSION, "user": user, "flagged": map(&state.clocks)});
    if !state.warned.is_empty() {
        root["warned"] = Value::Object(map(&state.warned));
    }
    if !state.repeats.is_empty() {
        let repeats: Map<String, Value> = state
            .repeats
            .iter()
            .map(|(k, h)| {
                let at: Vec<Value> = h.enforcements.iter().map(|(t, n)| json!([ms(*t), n])).collect();
                let mut v = json!({ "enforcements": at });
                if let Some(r) = h.reported {
                    v["reported"] = ms(r);
                }
                (k.to_string(), v)
            })
            .collect();
        root["repeats"] = Value::Object(repeats);
    }
    let mut out = serde_json::to_vec_pretty(&root).unwrap();
    out.push(b'\n');
    out
}

/// The whole state of a state file's bytes; the optional sections of a file written by an older
/// guard are simply empty. `None` when the clocks are not readable (see [`parse`]).
pub fn parse_state(bytes: &[u8]) -> Option<State> {
    let clocks = parse(bytes)?;
    let mut state = State { clocks, ..Default::default() };
    let Ok(Value::Object(root)) = serde_json::from_slice::<Value>(bytes) else { return Some(state) };
    if root.get("version").and_then(Value::as_u64) != Some(STATE_VERSION) {
        return Some(state);
    }
    let time = |v: &Value| v.as_f64().filter(|t| t.is_finite() && *t >= 0.0);
    if let Some(Value::Object(m)) = root.get("warned") {
        state.warned = m.iter().filter_map(|(k, v)| Some((Comm::from_escaped(k)?, time(v)?))).collect();
    }
    if let Some(Value::Object(m)) = root.get("repeats") {
        for (k, v) in m {
            let Some(name) = Comm::from_escaped(k) else { continue };
            let enforcements = v
                .get("enforcements")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|e| Some((time(e.get(0)?)?, u32::try_from(e.get(1)?.as_u64()?).ok()?)))
                        .take(MAX_REPEAT_ENTRIES)
                        .collect()
                })
                .unwrap_or_default();
            let reported = v.get("reported").and_then(time);
            state.repeats.insert(name, RepeatHistory { enforcements, reported });
        }
    }
    Some(state)
}

/// Enforcements kept per name (`repeatAfter` is at most 1000).
pub const MAX_REPEAT_ENTRIES: usize = 1000;

/// Reads the whole state as the account `who` (see [`load`]).
pub fn load_state(path: &Path, who: FsIdentity) -> Result<State, StateError> {
    let bytes = match read_account_file(path, who, MAX_STATE_BYTES, Follow::NoLinks) {
        Ok(b) => b,
        Err(ReadError::NotFound { .. }) => return Ok(State::default()),
        Err(e) => return Err(StateError::Malformed { path: path.into(), reason: Some(e.log_fields()) }),
    };
    parse_state(&bytes).ok_or_else(|| StateError::Malformed { path: path.into(), reason: None })
}

pub fn save_state(path: &Path, user: &str, state: &State, who: FsIdentity) -> Result<(), StateError> {
    Ok(atomic_write(path, &render_state(user, state), who)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(name: &[u8]) -> Comm {
        Comm::new(name)
    }

    #[test]
    fn clocks_round_trip_and_legacy_files_are_read() {
        let clocks = FlagClocks::from([(c(b"agentihooks"), 1700000000.5)]);
        assert_eq!(parse(&render("u", &clocks)).unwrap(), clocks);
        assert_eq!(parse(br#"{"sleep": 12}"#).unwrap(), FlagClocks::from([(c(b"sleep"), 12.0)]));
        let v1 = br#"{"version": 1, "user": "u", "flagged": {"sleep": 12, "a\\b": 13}}"#;
        assert_eq!(parse(v1).unwrap(), FlagClocks::from([(c(b"sleep"), 12.0), (c(b"a\\b"), 13.0)]));
    }

    #[test]
    fn names_differing_only_in_invalid_bytes_keep_separate_clocks_through_a_file() {
        let clocks = FlagClocks::from([(c(b"q\xff"), 100.0), (c(b"q\xfe"), 200.0), (c(b"x\nKILLED pid=1"), 300.0)]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("guard-daemon-state.json");
        let who = FsIdentity::current();
        save(&path, "u", &clocks, who).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(r#""q\\xff": 100.0"#) && text.contains(r#""q\\xfe": 200.0"#), "{text}");
        let back = load(&path, who).unwrap();
        assert_eq!(back, clocks);
        assert_eq!(back[&c(b"q\xff")], 100.0);
        assert_eq!(back[&c(b"q\xfe")], 200.0);
    }

    #[test]
    fn warnings_and_repeat_histories_round_trip_and_older_files_have_none() {
        let state = State {
            clocks: FlagClocks::from([(c(b"pile"), 100.0)]),
            warned: FlagClocks::from([(c(b"pile"), 100.0)]),
            repeats: BTreeMap::from([(
                c(b"q\xff"),
                RepeatHistory { enforcements: vec![(10.0, 3), (20.5, 1)], reported: Some(20.5) },
            )]),
        };
        assert_eq!(parse_state(&render_state("u", &state)).unwrap(), state);
        let only_clocks = render("u", &state.clocks);
        assert_eq!(parse_state(&only_clocks).unwrap(), State { clocks: state.clocks.clone(), ..Default::default() });
        assert_eq!(parse(&render_state("u", &state)).unwrap(), state.clocks, "an older reader still finds its clocks");
    }

    #[test]
    fn a_lossy_legacy_key_longer_than_a_name_is_dropped_not_guessed() {
        // 14 bytes + U+FFFD (3 bytes) is 17 bytes: no process can have that name.
        let legacy = "{\"abcdefghijklmn\u{fffd}\": 5, \"ok\": 6}";
        assert_eq!(parse(legacy.as_bytes()).unwrap(), FlagClocks::from([(c(b"ok"), 6.0)]));
    }

    #[test]
    fn corrupt_state_is_malformed_and_missing_state_is_empty() {
        assert!(parse(b"{\"flagged\": {\"x\": \"soon\"}}").is_none());
        assert!(parse(b"{\"flag").is_none());
        assert!(parse(br#"{"version": 2, "flagged": {"bad\\q": 1}}"#).is_none());
        assert!(parse(br#"{"version": 2, "flagged": {"x": -1}}"#).is_none());
        assert!(parse(br#"{"version": 3, "flagged": {"x": 1}}"#).is_none());
        let dir = tempfile::tempdir().unwrap();
        let who = FsIdentity::current();
        assert!(load(&dir.path().join("none.json"), who).unwrap().is_empty());
        std::fs::write(dir.path().join("bad.json"), "garbage").unwrap();
        let e = load(&dir.path().join("bad.json"), who).unwrap_err().to_string();
        assert!(e.starts_with("state_malformed path=") && e.ends_with("bad.json"), "{e}");
    }

    #[test]
    fn a_state_file_that_is_a_link_or_a_directory_is_malformed_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let who = FsIdentity::current();
        let real = dir.path().join("real.json");
        std::fs::write(&real, render("u", &FlagClocks::new())).unwrap();
        let link = dir.path().join("state.json");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let e = load(&link, who).unwrap_err().to_string();
        assert_eq!(e, format!("state_malformed path={} reason=not_regular kind=symlink", link.display()));
        let e = load(dir.path(), who).unwrap_err().to_string();
        assert!(e.ends_with(" reason=not_regular kind=directory"), "{e}");
    }
}
