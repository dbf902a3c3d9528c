//! The config document, read in one bounded pass before any check (docs/architecture.md).
//!
//! A `serde_json::Value` of a 1 MiB config can hold half a million values (a `[0,0,…]` array,
//! or 150,000 unknown keys), tens of MB built before a single bound is checked, on every tick.
//! Here only the keys guard knows are built, each at most [`MAX_KEY_VALUES`] JSON values (the
//! rest of a bigger one is drained, and the key is reported as too big); an unknown key's value
//! is drained without being built, and at most [`MAX_UNKNOWN_KEYS`] unknown keys are kept, each
//! cut to [`MAX_KEY_SHOWN`] bytes.
use std::{cell::Cell, collections::BTreeSet};

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::{KNOWN_KEYS, MAX_EXCLUDES, MAX_UNKNOWN_KEYS};
use crate::bounded_json::{Capped, Skip};

/// JSON values a known key may hold: four times the largest valid value (`excludes` at its
/// [`MAX_EXCLUDES`] names), so a list a little too long still gets its exact count in the
/// problem, while one of 500,000 values costs no more than this to read.
pub const MAX_KEY_VALUES: usize = 4 * MAX_EXCLUDES;

/// An unknown key is kept (for its warning) cut to this many bytes: the longest known key is 15
/// bytes, so the cut never hides a near miss, and a 1 MiB key makes a short line.
pub const MAX_KEY_SHOWN: usize = 200;

/// What [`read`] keeps of a document.
#[derive(Debug)]
pub(super) struct Doc {
    /// An object of the known keys present (each value at most [`MAX_KEY_VALUES`]), or the
    /// document itself when it is not an object (also bounded).
    pub root: Value,
    /// Known keys whose value held more than [`MAX_KEY_VALUES`] (kept cut).
    pub cut: Vec<&'static str>,
    /// Unknown keys, at most [`MAX_UNKNOWN_KEYS`] (the first met), each cut to [`MAX_KEY_SHOWN`].
    pub unknown: BTreeSet<String>,
    /// Unknown keys met once `unknown` was full.
    pub more_unknown: usize,
}

/// Reads a config document (see the module doc). A syntax error, or a document nested deeper
/// than serde_json's limit, is serde_json's error with its line and column.
pub(super) fn read(bytes: &[u8]) -> serde_json::Result<Doc> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let doc = Root.deserialize(&mut de)?;
    de.end()?;
    Ok(doc)
}

/// `s` cut to at most `max` bytes on a character boundary, with `…` when cut.
pub(super) fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

struct Root;

/// A document that is not an object (an error for the checker to name).
fn not_object(root: Value) -> Doc {
    Doc { root, cut: Vec::new(), unknown: BTreeSet::new(), more_unknown: 0 }
}

impl<'de> DeserializeSeed<'de> for Root {
    type Value = Doc;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Doc, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Root {
    type Value = Doc;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON document")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Doc, A::Error> {
        let mut doc = Doc { root: Value::Null, cut: Vec::new(), unknown: BTreeSet::new(), more_unknown: 0 };
        let mut known = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if let Some(&k) = KNOWN_KEYS.iter().find(|k| **k == key) {
                let (left, cut) = (Cell::new(MAX_KEY_VALUES), Cell::new(false));
                known.insert(key, map.next_value_seed(Capped { left: &left, cut: &cut })?);
                doc.cut.retain(|c| *c != k);
                if cut.get() {
                    doc.cut.push(k);
                }
                continue;
            }
            map.next_value::<Skip>()?;
            let key = cut(&key, MAX_KEY_SHOWN);
            if doc.unknown.len() < MAX_UNKNOWN_KEYS || doc.unknown.contains(&key) {
                doc.unknown.insert(key);
            } else {
                doc.more_unknown += 1;
            }
        }
        doc.root = Value::Object(known);
        Ok(doc)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Doc, A::Error> {
        let (left, cut) = (Cell::new(MAX_KEY_VALUES), Cell::new(false));
        Ok(not_object(Capped { left: &left, cut: &cut }.visit_seq(seq)?))
    }
    fn visit_bool<E>(self, b: bool) -> Result<Doc, E> {
        Ok(not_object(Value::Bool(b)))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Doc, E> {
        Ok(not_object(Value::from(n)))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Doc, E> {
        Ok(not_object(Value::from(n)))
    }
    fn visit_f64<E>(self, x: f64) -> Result<Doc, E> {
        Ok(not_object(Value::from(x)))
    }
    fn visit_str<E>(self, s: &str) -> Result<Doc, E> {
        Ok(not_object(Value::String(s.to_string())))
    }
    fn visit_unit<E>(self) -> Result<Doc, E> {
        Ok(not_object(Value::Null))
    }
}
