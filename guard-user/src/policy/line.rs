//! A log line as data: `EVENT key=value …` before it is timestamped and escaped.
//!
//! The policy builds lines; the log effect renders them ([`Line::body`]) with the escaping of
//! docs/log.md (a value the account controls can never start a new line or pass for another key).
use std::fmt::Write as _;

/// One log event: its name and its `key=value` fields, in order. Values are bytes because a
/// process name need not be UTF-8; rendering escapes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub event: &'static str,
    /// Words written as they are, right after the event (the reason of an `ERROR` line,
    /// e.g. `config_malformed threshold value=0`, whose values the error escaped itself).
    /// Control characters in them are still escaped, so they can never break the line.
    pub words: Vec<String>,
    pub fields: Vec<(&'static str, Vec<u8>)>,
}

/// Anything a field value can be made from.
pub trait FieldValue {
    fn bytes(&self) -> Vec<u8>;
}

macro_rules! display_value {
    ($($t:ty),*) => {$(impl FieldValue for $t { fn bytes(&self) -> Vec<u8> { self.to_string().into_bytes() } })*};
}
display_value!(u8, u32, u64, usize, i64, String);

impl FieldValue for &str {
    fn bytes(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
}

impl FieldValue for &[u8] {
    fn bytes(&self) -> Vec<u8> {
        self.to_vec()
    }
}

impl FieldValue for crate::comm::Comm {
    fn bytes(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
}

impl Line {
    pub fn new(event: &'static str) -> Line {
        Line { event, words: Vec::new(), fields: Vec::new() }
    }

    /// Adds a word written as it is (see [`Line::words`]).
    pub fn word(mut self, word: impl Into<String>) -> Line {
        self.words.push(word.into());
        self
    }

    /// Adds `key=value`.
    pub fn with(mut self, key: &'static str, value: impl FieldValue) -> Line {
        self.fields.push((key, value.bytes()));
        self
    }

    /// `EVENT k=v k=v`, every value escaped (see [`escape`]).
    pub fn body(&self) -> String {
        let mut s = String::from(self.event);
        for w in &self.words {
            s.push(' ');
            s.push_str(&crate::escape::printable(w));
        }
        for (k, v) in &self.fields {
            let _ = write!(s, " {k}={}", escape(v));
        }
        s
    }

    /// The value of `key`, if the line has it (tests and the stream mirror read lines back).
    pub fn get(&self, key: &str) -> Option<&[u8]> {
        self.fields.iter().find(|(k, _)| *k == key).map(|(_, v)| v.as_slice())
    }
}

/// docs/log.md's value escaping (see [`crate::escape::log_value`]).
pub fn escape(v: &[u8]) -> String {
    crate::escape::log_value(v)
}
