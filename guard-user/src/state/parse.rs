//! The state file's bytes → [`State`], in one pass that never holds more than the bounds allow.
//!
//! A `serde_json::Value` of the whole file would cost ~100 bytes per entry before a single bound
//! could be checked: a 3.7 MB file of 440,000 clocks needed more than the unit's 64 MiB and the
//! daemon was OOM-killed at every start. Here typed visitors read the document as it streams
//! past: each section's entries are counted as they come and the parse stops at the first one
//! over its bound ([`Rejection`]); values of keys that are not read are skipped without being
//! built ([`Skip`]); a key longer than any name's escaped form is never kept.
//!
//! The format's own rules (see the parent module): `version` may come after `flagged` (the
//! writer sorts its keys), so the `flagged` entries are kept as raw keys until the version says
//! how to read them; a file without `flagged` is the legacy flat map, whose every key but
//! `version` is a plain name.
use std::{cell::Cell, collections::BTreeMap, fmt};

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

use super::{
    FlagClocks, RepeatHistory, State, MAX_FLAGGED_NAMES, MAX_REPEAT_ENTRIES, MAX_REPEAT_NAMES, MAX_REPEAT_TOTAL,
    STATE_VERSION,
};
use crate::{bounded_json::Skip, comm::Comm};

/// The scalar visits of a visitor for which any value but a container means `$none` (a wrong
/// type is skipped, as it was when the file was read into a `Value`).
macro_rules! scalars_are {
    ($none:expr) => {
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok($none)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok($none)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok($none)
        }
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok($none)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok($none)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok($none)
        }
    };
}

/// The longest key that can be a name: 15 bytes, each escaped as `\xNN` at most (60), rounded
/// up. A longer key is never stored.
const MAX_KEY_BYTES: usize = 64;

/// Which bound a state file broke (the `reason=` of `ERROR state_rejected`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// More than [`super::MAX_STATE_BYTES`].
    TooLarge,
    /// More than [`MAX_FLAGGED_NAMES`] flag clocks.
    TooManyFlagged,
    /// More than [`MAX_FLAGGED_NAMES`] warned names.
    TooManyWarned,
    /// More than [`MAX_REPEAT_NAMES`] repeat histories.
    TooManyRepeats,
    /// One history longer than [`MAX_REPEAT_ENTRIES`].
    HistoryTooLong,
    /// More than [`MAX_REPEAT_TOTAL`] enforcements across the histories.
    TooManyEnforcements,
}

impl Rejection {
    /// The log's `reason=` token.
    pub fn token(self) -> &'static str {
        match self {
            Rejection::TooLarge => "too_large",
            Rejection::TooManyFlagged => "too_many_flagged",
            Rejection::TooManyWarned => "too_many_warned",
            Rejection::TooManyRepeats => "too_many_repeats",
            Rejection::HistoryTooLong => "history_too_long",
            Rejection::TooManyEnforcements => "too_many_enforcements",
        }
    }
}

/// Why bytes are not a state the daemon takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParseError {
    /// Not a state file (invalid JSON, a wrong type, a key that is not a name, a newer version).
    Malformed,
    /// A state file over one of its bounds.
    Rejected(Rejection),
}

/// Parses a state file (see the module doc).
pub fn parse(bytes: &[u8]) -> Result<State, ParseError> {
    let broke = Cell::new(None);
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let raw = Root { broke: &broke }.deserialize(&mut de).and_then(|raw| de.end().map(|()| raw));
    if let Some(r) = broke.get() {
        return Err(ParseError::Rejected(r));
    }
    raw.map_err(|_| ParseError::Malformed)?.into_state().ok_or(ParseError::Malformed)
}

/// A key as read: its text when it is short enough to be a name.
type RawKey = Option<String>;

/// A map of names to times as read: raw keys, and a number or `None` for another value.
type RawTimes = Vec<(RawKey, Option<f64>)>;

/// The document before the version says how to read its names.
#[derive(Default)]
struct Raw {
    version: Option<Version>,
    /// `None`: absent; `Some(None)`: present but not an object.
    flagged: Option<Option<RawTimes>>,
    /// Top-level keys other than the known ones: the names of a legacy flat map.
    others: RawTimes,
    /// More `others` than a state may hold (only a bound for a flat map).
    others_over: bool,
    warned: FlagClocks,
    repeats: BTreeMap<Comm, RepeatHistory>,
}

#[derive(Clone, Copy, PartialEq)]
enum Version {
    Number(u64),
    Other,
}

fn valid_time(t: Option<f64>) -> Option<f64> {
    t.filter(|t| t.is_finite() && *t >= 0.0)
}

/// A plain (version 1 or flat) key: its bytes, or `None` for one no process can have (longer
/// than the kernel keeps, a lossy one, or holding a NUL), which is dropped: that name's clock
/// restarts, which only ever delays enforcement.
fn plain(key: &RawKey) -> Option<Comm> {
    key.as_deref().and_then(|k| Comm::exact(k.as_bytes()))
}

impl Raw {
    fn into_state(self) -> Option<State> {
        let mut clocks = FlagClocks::new();
        let escaped = match (&self.flagged, self.version) {
            (Some(Some(_)), Some(Version::Number(STATE_VERSION))) => true,
            (Some(Some(_)), Some(Version::Number(1))) => false,
            // A newer version, no version, or a `flagged` that is not a map: not ours to guess at.
            (Some(_), _) => return None,
            // The legacy flat map (one over its bound was rejected while it was read).
            (None, _) => {
                for (key, t) in &self.others {
                    let t = valid_time(*t)?;
                    if let Some(name) = plain(key) {
                        clocks.insert(name, t);
                    }
                }
                return Some(State { clocks, ..Default::default() });
            }
        };
        for (key, t) in self.flagged.into_iter().flatten().flatten() {
            let t = valid_time(t)?;
            let name = if escaped {
                Comm::from_escaped(key.as_deref()?)?
            } else {
                match plain(&key) {
                    Some(n) => n,
                    None => continue,
                }
            };
            clocks.insert(name, t);
        }
        if !escaped {
            return Some(State { clocks, ..Default::default() });
        }
        Some(State { clocks, warned: self.warned, repeats: self.repeats })
    }
}

/// Makes a serde error that also records which bound broke.
fn reject<E: de::Error>(broke: &Cell<Option<Rejection>>, r: Rejection) -> E {
    broke.set(Some(r));
    E::custom(r.token())
}

struct Root<'a> {
    broke: &'a Cell<Option<Rejection>>,
}

impl<'de> DeserializeSeed<'de> for Root<'_> {
    type Value = Raw;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Raw, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Root<'_> {
    type Value = Raw;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a state object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Raw, A::Error> {
        let mut raw = Raw::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key.0.as_deref() {
                Some("version") => raw.version = Some(map.next_value::<VersionValue>()?.0),
                Some("flagged") => {
                    raw.flagged =
                        Some(map.next_value_seed(Times { broke: self.broke, over: Rejection::TooManyFlagged })?)
                }
                Some("warned") => {
                    let times = map.next_value_seed(Times { broke: self.broke, over: Rejection::TooManyWarned })?;
                    raw.warned = times
                        .into_iter()
                        .flatten()
                        .filter_map(|(k, t)| Some((Comm::from_escaped(k.as_deref()?)?, valid_time(t)?)))
                        .collect();
                }
                Some("repeats") => {
                    raw.repeats = map.next_value_seed(Repeats { broke: self.broke })?.unwrap_or_default()
                }
                _ => {
                    let t = map.next_value::<Time>()?.0;
                    if raw.others.len() < MAX_FLAGGED_NAMES {
                        raw.others.push((key.0, t));
                    } else {
                        raw.others_over = true;
                    }
                }
            }
        }
        if raw.flagged.is_none() && raw.others_over {
            return Err(reject(self.broke, Rejection::TooManyFlagged));
        }
        Ok(raw)
    }
}

/// A map key, kept only when it could be a name (or is one of the format's keys).
struct Key(RawKey);

impl<'de> de::Deserialize<'de> for Key {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Key, E> {
                Ok(Key((s.len() <= MAX_KEY_BYTES).then(|| s.to_string())))
            }
        }
        d.deserialize_str(V)
    }
}

/// `version`: a whole number, or anything else (skipped without being built).
struct VersionValue(Version);

impl<'de> de::Deserialize<'de> for VersionValue {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<VersionValue, D::Error> {
        let t = d.deserialize_any(Scalar)?;
        Ok(VersionValue(match t {
            Some(Num::U(n)) => Version::Number(n),
            _ => Version::Other,
        }))
    }
}

/// A time: a number, or `None` for anything else (skipped without being built).
struct Time(Option<f64>);

impl<'de> de::Deserialize<'de> for Time {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Time, D::Error> {
        Ok(Time(d.deserialize_any(Scalar)?.map(Num::as_f64)))
    }
}

/// A kill count: a whole number that fits a `u32`, or `None`.
struct Kills(Option<u32>);

impl<'de> de::Deserialize<'de> for Kills {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Kills, D::Error> {
        Ok(Kills(match d.deserialize_any(Scalar)? {
            Some(Num::U(n)) => u32::try_from(n).ok(),
            _ => None,
        }))
    }
}

#[derive(Clone, Copy)]
enum Num {
    U(u64),
    F(f64),
}

impl Num {
    fn as_f64(self) -> f64 {
        match self {
            Num::U(n) => n as f64,
            Num::F(x) => x,
        }
    }
}

/// Any JSON value: a number comes back, anything else is drained and is `None`.
struct Scalar;

impl<'de> Visitor<'de> for Scalar {
    type Value = Option<Num>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_u64<E>(self, n: u64) -> Result<Option<Num>, E> {
        Ok(Some(Num::U(n)))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Option<Num>, E> {
        Ok(Some(Num::F(n as f64)))
    }
    fn visit_f64<E>(self, x: f64) -> Result<Option<Num>, E> {
        Ok(Some(Num::F(x)))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Option<Num>, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Option<Num>, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Option<Num>, E> {
        Ok(None)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<Num>, A::Error> {
        while seq.next_element::<Skip>()?.is_some() {}
        Ok(None)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<Num>, A::Error> {
        while map.next_entry::<Skip, Skip>()?.is_some() {}
        Ok(None)
    }
}

/// A map of name → time, at most [`MAX_FLAGGED_NAMES`] entries (more is `over`); `None` when
/// the value is not an object (drained).
struct Times<'a> {
    broke: &'a Cell<Option<Rejection>>,
    over: Rejection,
}

impl<'de> DeserializeSeed<'de> for Times<'_> {
    type Value = Option<RawTimes>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Times<'_> {
    type Value = Option<RawTimes>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map of names to times")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(key) = map.next_key::<Key>()? {
            if out.len() == MAX_FLAGGED_NAMES {
                return Err(reject(self.broke, self.over));
            }
            out.push((key.0, map.next_value::<Time>()?.0));
        }
        Ok(Some(out))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        Scalar.visit_seq(seq).map(|_| None)
    }
    scalars_are!(None);
}

/// `repeats`: name → history, at most [`MAX_REPEAT_NAMES`] names and [`MAX_REPEAT_TOTAL`]
/// enforcements in all; `None` when the value is not an object.
struct Repeats<'a> {
    broke: &'a Cell<Option<Rejection>>,
}

impl<'de> DeserializeSeed<'de> for Repeats<'_> {
    type Value = Option<BTreeMap<Comm, RepeatHistory>>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Repeats<'_> {
    type Value = Option<BTreeMap<Comm, RepeatHistory>>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map of names to repeat histories")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = BTreeMap::new();
        let (mut names, mut total) = (0usize, 0usize);
        while let Some(key) = map.next_key::<Key>()? {
            names += 1;
            if names > MAX_REPEAT_NAMES {
                return Err(reject(self.broke, Rejection::TooManyRepeats));
            }
            let history = map.next_value_seed(History { broke: self.broke })?;
            total += history.enforcements.len();
            if total > MAX_REPEAT_TOTAL {
                return Err(reject(self.broke, Rejection::TooManyEnforcements));
            }
            if let Some(name) = key.0.as_deref().and_then(Comm::from_escaped) {
                out.insert(name, history);
            }
        }
        Ok(Some(out))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        Scalar.visit_seq(seq).map(|_| None)
    }
    scalars_are!(None);
}

/// One repeat history: `{"enforcements": [[t, kills], …], "reported": t}`. Entries that are not
/// a valid `[time, count]` are skipped (as before); a list longer than [`MAX_REPEAT_ENTRIES`]
/// breaks a bound. Anything but an object is an empty history.
struct History<'a> {
    broke: &'a Cell<Option<Rejection>>,
}

impl<'de> DeserializeSeed<'de> for History<'_> {
    type Value = RepeatHistory;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<RepeatHistory, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for History<'_> {
    type Value = RepeatHistory;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a repeat history")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RepeatHistory, A::Error> {
        let mut h = RepeatHistory::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key.0.as_deref() {
                Some("enforcements") => h.enforcements = map.next_value_seed(Enforcements { broke: self.broke })?,
                Some("reported") => h.reported = valid_time(map.next_value::<Time>()?.0),
                _ => {
                    map.next_value::<Skip>()?;
                }
            }
        }
        Ok(h)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<RepeatHistory, A::Error> {
        Scalar.visit_seq(seq).map(|_| RepeatHistory::default())
    }
    scalars_are!(RepeatHistory::default());
}

struct Enforcements<'a> {
    broke: &'a Cell<Option<Rejection>>,
}

impl<'de> DeserializeSeed<'de> for Enforcements<'_> {
    type Value = Vec<(f64, u32)>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Enforcements<'_> {
    type Value = Vec<(f64, u32)>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of enforcements")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        let mut seen = 0usize;
        while let Some(entry) = seq.next_element::<Entry>()? {
            seen += 1;
            if seen > MAX_REPEAT_ENTRIES {
                return Err(reject(self.broke, Rejection::HistoryTooLong));
            }
            out.extend(entry.0);
        }
        Ok(out)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        Scalar.visit_map(map).map(|_| Vec::new())
    }
    scalars_are!(Vec::new());
}

/// `[time, kills]`, or `None` for anything else.
struct Entry(Option<(f64, u32)>);

impl<'de> de::Deserialize<'de> for Entry {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Entry, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entry;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("[time, kills]")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Entry, A::Error> {
                let t = seq.next_element::<Time>()?.and_then(|t| valid_time(t.0));
                let n = seq.next_element::<Kills>()?.and_then(|n| n.0);
                while seq.next_element::<Skip>()?.is_some() {}
                Ok(Entry(t.zip(n)))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Entry, A::Error> {
                Scalar.visit_map(map).map(|_| Entry(None))
            }
            scalars_are!(Entry(None));
        }
        d.deserialize_any(V)
    }
}
