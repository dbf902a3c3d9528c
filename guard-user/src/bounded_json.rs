//! Reading JSON the account wrote without building more than a bound (docs/architecture.md,
//! the trust boundary): the config and the state file are parsed by visitors that keep what
//! they need, count as they go, and drain the rest without building it.
//!
//! Both pieces nest through serde_json's `deserialize_any`, so its recursion limit (128 levels)
//! still refuses a too-deep document as invalid JSON, exactly as a `Value` parse did
//! (serde's `IgnoredAny` skips without that limit).
use std::cell::Cell;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Drains one JSON value without building it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Skip;

impl<'de> de::Deserialize<'de> for Skip {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Skip, D::Error> {
        d.deserialize_any(Skip)
    }
}

impl<'de> Visitor<'de> for Skip {
    type Value = Skip;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_str<E>(self, _: &str) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_unit<E>(self) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Skip, A::Error> {
        while seq.next_element::<Skip>()?.is_some() {}
        Ok(Skip)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Skip, A::Error> {
        while map.next_key::<Skip>()?.is_some() {
            map.next_value::<Skip>()?;
        }
        Ok(Skip)
    }
}

/// Builds a `Value` of at most `left` JSON values (each element, member and scalar is one).
/// Past the budget the rest of every array and object is drained, not built, and `cut` is set:
/// the value is then a prefix of the document's.
#[derive(Clone, Copy)]
pub struct Capped<'a> {
    pub left: &'a Cell<usize>,
    pub cut: &'a Cell<bool>,
}

impl Capped<'_> {
    /// Takes one value from the budget; `false` when it is spent.
    fn take(&self) -> bool {
        match self.left.get() {
            0 => false,
            n => {
                self.left.set(n - 1);
                true
            }
        }
    }
}

impl<'de> DeserializeSeed<'de> for Capped<'_> {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Capped<'_> {
    type Value = Value;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }
    fn visit_f64<E>(self, x: f64) -> Result<Value, E> {
        // As serde_json's own `Value` does.
        Ok(Number::from_f64(x).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_string()))
    }
    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while self.take() {
            match seq.next_element_seed(self)? {
                Some(v) => out.push(v),
                None => return Ok(Value::Array(out)),
            }
        }
        if seq.next_element::<Skip>()?.is_some() {
            self.cut.set(true);
            while seq.next_element::<Skip>()?.is_some() {}
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while self.take() {
            match map.next_key::<String>()? {
                Some(k) => {
                    let v = map.next_value_seed(self)?;
                    out.insert(k, v);
                }
                None => return Ok(Value::Object(out)),
            }
        }
        if map.next_key::<Skip>()?.is_some() {
            self.cut.set(true);
            map.next_value::<Skip>()?;
            while map.next_key::<Skip>()?.is_some() {
                map.next_value::<Skip>()?;
            }
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capped(text: &str, budget: usize) -> (Value, bool) {
        let (left, cut) = (Cell::new(budget), Cell::new(false));
        let mut de = serde_json::Deserializer::from_str(text);
        let v = Capped { left: &left, cut: &cut }.deserialize(&mut de).unwrap();
        de.end().unwrap();
        (v, cut.get())
    }

    #[test]
    fn a_value_within_the_budget_is_the_one_serde_json_builds() {
        let text = r#"{"a": [1, -2, 3.5, "x", null, true, {"b": []}], "c": 1e3}"#;
        let (v, cut) = capped(text, 100);
        assert_eq!(v, serde_json::from_str::<Value>(text).unwrap());
        assert!(!cut);
    }

    #[test]
    fn past_the_budget_the_rest_is_drained_and_the_value_is_cut() {
        let text = format!("[{}0]", "0,".repeat(100_000));
        let (v, cut) = capped(&text, 10);
        assert!(cut);
        assert_eq!(v.as_array().unwrap().len(), 10);
        let (v, cut) = capped(r#"{"a": 1, "b": 2, "c": 3}"#, 2);
        assert!(cut);
        assert_eq!(v.as_object().unwrap().len(), 2);
    }

    #[test]
    fn skipping_still_refuses_a_document_nested_past_the_recursion_limit() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(serde_json::from_str::<Skip>(&deep).is_err());
        let fine = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert!(serde_json::from_str::<Skip>(&fine).is_ok());
    }
}
