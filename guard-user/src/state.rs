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
//! [`MAX_STATE_BYTES`], and parsed in one bounded pass ([`parse`](self::parse) module): anything
//! that is not a state file is `ERROR state_malformed path=<p> reason=…` and an empty state; a
//! state file over one of its bounds is `ERROR state_rejected path=<p> reason=…`, moved aside by
//! the daemon ([`set_aside`]), and an empty state. Never a wait, never more memory than the
//! bounds allow, whatever the file holds. The writer never writes more than the reader takes
//! ([`bounded`]).
use std::{
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
};

use serde_json::{json, Map, Value};

use crate::{
    comm::Comm,
    domain::{cap_repeats, FlagClocks, RepeatHistory, State, MAX_REPEAT_ENTRIES, MAX_REPEAT_NAMES, MAX_REPEAT_TOTAL},
    escape,
    log::{Notice, What},
    safefs::{atomic_write, read_account_file, Follow, FsIdentity, ReadError, SafeFsError},
};

#[cfg(test)]
mod bounds_tests;
mod parse;

pub use parse::{ParseError, Rejection};

/// The format version this guard writes.
pub const STATE_VERSION: u64 = 2;

/// The largest state the daemon writes is about 2 MB (every section at its bound, names at
/// their longest escaped form; see the test `the_largest_state_the_daemon_writes_is_read_back`).
/// 4 MiB leaves room and bounds what a planted file can make the daemon read; it is read into
/// one buffer, the largest allocation of a load.
pub const MAX_STATE_BYTES: u64 = 4 << 20;

/// Flag clocks (and warned names) a state holds. A name is flagged only while it has at least
/// `threshold` live processes, so a state holds at most (the account's processes / threshold)
/// names: a few, or a few hundred for an account that runs a thousand distinct programs with
/// `threshold` 1. 4096 is ten times that with room; a clock costs ~50 bytes in memory. When
/// more names are flagged at once (all still enforced from memory), the file keeps the 4096
/// oldest clocks, the ones nearest enforcement: a restart then only restarts the youngest.
pub const MAX_FLAGGED_NAMES: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Logged as `ERROR state_malformed path=<path>` (plus `reason=…` when it could not be
    /// read at all); the state is then treated as empty.
    #[error("state_malformed path={}{}", escape::log_value(path.as_os_str().as_bytes()), reason.as_deref().map(|r| format!(" {r}")).unwrap_or_default())]
    Malformed { path: PathBuf, reason: Option<String> },
    /// Logged as `ERROR state_rejected path=<path> reason=<why> …`: the file broke a bound; the
    /// daemon moves it aside ([`set_aside`]) and starts clean.
    #[error("state_rejected path={} reason={}", escape::log_value(path.as_os_str().as_bytes()), rejection_fields(*why))]
    Rejected { path: PathBuf, why: Rejection },
    #[error("cannot write the state file: {0}")]
    Write(#[from] SafeFsError),
}

impl StateError {
    /// The `ERROR` line's notice: `state_malformed …` or `state_rejected …` (the daemon's
    /// `Memory::load` says it and counts it; the file is then an empty state). A write error
    /// comes from a save, never a load: its line is `state_unwritable`.
    pub fn notice(&self) -> Notice {
        match self {
            StateError::Malformed { .. } => Notice::reason(What::StateMalformed, self.to_string()),
            StateError::Rejected { .. } => Notice::reason(What::StateRejected, self.to_string()),
            StateError::Write(e) => Notice::new(What::StateUnwritable).with("error", e.to_string()),
        }
    }
}

/// `<token> <limit key>=<n>`: the bound and its value, so the line says what to look for.
fn rejection_fields(why: Rejection) -> String {
    let (key, n) = match why {
        Rejection::TooLarge => ("max_bytes", MAX_STATE_BYTES as usize),
        Rejection::TooManyFlagged | Rejection::TooManyWarned => ("limit", MAX_FLAGGED_NAMES),
        Rejection::TooManyRepeats => ("limit", MAX_REPEAT_NAMES),
        Rejection::HistoryTooLong => ("limit", MAX_REPEAT_ENTRIES),
        Rejection::TooManyEnforcements => ("limit", MAX_REPEAT_TOTAL),
    };
    format!("{} {key}={n}", why.token())
}

/// Reads the flag clocks as the account `who`. A missing file is an empty state, not an error.
#[cfg(any(test, feature = "testing"))]
pub fn load(path: &Path, who: FsIdentity) -> Result<FlagClocks, StateError> {
    load_state(path, who).map(|st| st.clocks)
}

/// The clocks of a state file's bytes, or `None` when they are not a state file (or break a
/// bound).
#[cfg(test)]
pub fn parse(bytes: &[u8]) -> Option<FlagClocks> {
    parse::parse(bytes).ok().map(|st| st.clocks)
}

#[cfg(test)]
pub fn render(user: &str, clocks: &FlagClocks) -> Vec<u8> {
    render_state(user, &State { clocks: clocks.clone(), ..Default::default() })
}

#[cfg(test)]
pub fn save(path: &Path, user: &str, clocks: &FlagClocks, who: FsIdentity) -> Result<(), StateError> {
    Ok(atomic_write(path, &render(user, clocks), who)?)
}

/// `state` within the bounds the reader takes: at most [`MAX_FLAGGED_NAMES`] clocks (the
/// oldest, nearest enforcement) and warned names, and the repeat bounds ([`cap_repeats`]).
pub fn bounded(state: &State) -> std::borrow::Cow<'_, State> {
    let repeats_ok = state.repeats.len() <= MAX_REPEAT_NAMES
        && state.repeats.values().all(|h| h.enforcements.len() <= MAX_REPEAT_ENTRIES)
        && state.repeats.values().map(|h| h.enforcements.len()).sum::<usize>() <= MAX_REPEAT_TOTAL;
    if state.clocks.len() <= MAX_FLAGGED_NAMES && state.warned.len() <= MAX_FLAGGED_NAMES && repeats_ok {
        return std::borrow::Cow::Borrowed(state);
    }
    let oldest = |m: &FlagClocks| -> FlagClocks {
        let mut v: Vec<(Comm, f64)> = m.iter().map(|(k, t)| (*k, *t)).collect();
        v.sort_unstable_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        v.into_iter().take(MAX_FLAGGED_NAMES).collect()
    };
    let mut repeats = state.repeats.clone();
    cap_repeats(&mut repeats);
    std::borrow::Cow::Owned(State { clocks: oldest(&state.clocks), warned: oldest(&state.warned), repeats })
}

fn ms(t: f64) -> Value {
    json!((t * 1000.0).round() / 1000.0)
}

/// The state file's bytes (within the bounds the reader takes, see [`bounded`]).
pub fn render_state(user: &str, state: &State) -> Vec<u8> {
    let state = bounded(state);
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
/// guard are simply empty. `None` when it is not a state file or breaks a bound (see
/// [`parse_checked`] for which).
#[cfg(test)]
fn parse_state(bytes: &[u8]) -> Option<State> {
    parse::parse(bytes).ok()
}

/// [`parse_state`], saying why not.
#[cfg(test)]
fn parse_checked(bytes: &[u8]) -> Result<State, ParseError> {
    parse::parse(bytes)
}

/// Reads the whole state as the account `who`: a missing file is an empty state; a file that
/// cannot be read or is not a state is [`StateError::Malformed`]; one over a bound (its size
/// included) is [`StateError::Rejected`]. Reading never moves anything (`explain` reads too);
/// the daemon calls [`set_aside`] on a rejected file.
pub fn load_state(path: &Path, who: FsIdentity) -> Result<State, StateError> {
    let bytes = match read_account_file(path, who, MAX_STATE_BYTES, Follow::NoLinks) {
        Ok(b) => b,
        Err(ReadError::NotFound { .. }) => return Ok(State::default()),
        Err(ReadError::TooLarge { .. }) => {
            return Err(StateError::Rejected { path: path.into(), why: Rejection::TooLarge })
        }
        Err(e) => return Err(StateError::Malformed { path: path.into(), reason: Some(e.log_fields()) }),
    };
    parse::parse(&bytes).map_err(|e| match e {
        ParseError::Malformed => StateError::Malformed { path: path.into(), reason: None },
        ParseError::Rejected(why) => StateError::Rejected { path: path.into(), why },
    })
}

/// Where a rejected state file is kept: `<path>.rejected`.
pub fn rejected_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_os_string();
    p.push(".rejected");
    PathBuf::from(p)
}

/// Moves a rejected state file to [`rejected_path`], as the account `who`: one `rename`, which
/// moves a link itself rather than what it points to and replaces an older `.rejected` (a
/// link planted there included) without following it. Returns where it went.
pub fn set_aside(path: &Path, who: FsIdentity) -> Result<PathBuf, SafeFsError> {
    let scope = who.scope();
    if !scope.is_as_account() {
        return Err(SafeFsError::Unsafe { path: path.into(), why: "cannot take the account's file-system identity" });
    }
    let to = rejected_path(path);
    std::fs::rename(path, &to).map_err(|source| SafeFsError::Io { path: path.into(), source })?;
    Ok(to)
}

pub fn save_state(path: &Path, user: &str, state: &State, who: FsIdentity) -> Result<(), StateError> {
    Ok(atomic_write(path, &render_state(user, state), who)?)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::log::Line;

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
    fn a_state_error_becomes_its_error_line() {
        let malformed = StateError::Malformed { path: "/h/my state.json".into(), reason: None };
        assert_eq!(Line::Error(malformed.notice()).body(), r#"ERROR state_malformed path="/h/my state.json""#);
        let rejected = StateError::Rejected { path: "/h/s.json".into(), why: Rejection::TooManyRepeats };
        assert_eq!(
            Line::Error(rejected.notice()).body(),
            "ERROR state_rejected path=/h/s.json reason=too_many_repeats limit=1024"
        );
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
