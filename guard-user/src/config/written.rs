//! Where the config's keys are written, and how: the line of every occurrence of each key guard
//! reads (a key written twice is a problem serde's reading hides, since the last one silently
//! wins), and the text of its value as the file spells it (`1e3`, a 20-digit number), so a
//! problem quotes what the operator wrote rather than what a float made of it.
//!
//! One linear pass over a document serde_json has already accepted (so it is valid JSON; the
//! scanner still never indexes past the end). Only the keys guard knows are recorded — the top
//! level's, those inside the `stallWatch`, `sessions` and `slots` objects, and those inside each
//! slot — each with at most [`MAX_LINES`] lines and its count, so a hostile file of a million
//! repeats costs a counter; at most [`MAX_KEYS`] keys of at most [`MAX_KEY_BYTES`] bytes are
//! recorded, so a file of a million distinct keys costs a scan.
use std::borrow::Cow;

use super::KNOWN_KEYS;

/// The objects whose members are recorded too, under `<key>.<member>`.
const NESTED: &[&str] = &["stallWatch", "sessions", "slots"];
/// Keys recorded at most: the known ones, and 16 slots of a few members each, fit many times.
pub const MAX_KEYS: usize = 512;
/// Longest key recorded (a known key is at most 15 bytes, a slot's name 32): a longer one is
/// not guard's (a problem of its own), and a 1 MiB key never becomes a path.
const MAX_KEY_BYTES: usize = 64;
/// Lines kept per key; the count goes on.
pub const MAX_LINES: usize = 8;
/// Bytes of a scalar value kept as written (a number, a string with its quotes).
const MAX_RAW: usize = 64;

/// One key as the file writes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Occurrences {
    /// `threshold`, `stallWatch.peggedCpu`.
    pub path: String,
    /// 1-based lines of the first [`MAX_LINES`] occurrences.
    pub lines: Vec<usize>,
    /// How many times it is written.
    pub count: usize,
    /// The last occurrence's value as written, when it is a scalar of at most [`MAX_RAW`] bytes.
    pub last: Option<String>,
}

/// Every recorded key of a document, in the order first met.
#[derive(Clone, Debug, Default)]
pub struct Written {
    pub keys: Vec<Occurrences>,
}

impl Written {
    /// The last value of `path` as written, when it was a short scalar.
    pub fn raw(&self, path: &str) -> Option<&str> {
        self.keys.iter().find(|k| k.path == path).and_then(|k| k.last.as_deref())
    }

    /// The keys written more than once.
    pub fn repeated(&self) -> impl Iterator<Item = &Occurrences> {
        self.keys.iter().filter(|k| k.count > 1)
    }
}

/// A container being scanned.
struct Frame {
    object: bool,
    /// The prefix its recorded members get (`""` for the top level, `"stallWatch."`), or
    /// `None` when its members are not recorded.
    prefix: Option<String>,
    /// Inside an object: the next string is a key.
    expect_key: bool,
    /// The last key of this object (it names the container a `{` opens).
    key: Option<String>,
    /// The entry whose value comes next, if it is a recorded key's.
    pending: Option<usize>,
}

/// Scans `bytes` (a document serde_json accepted).
pub fn scan(bytes: &[u8]) -> Written {
    let mut out = Written::default();
    let mut stack: Vec<Frame> = Vec::new();
    let (mut i, mut line) = (0usize, 1usize);
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'\n' => line += 1,
            b'{' | b'[' => {
                let prefix = match stack.last_mut() {
                    None => Some(String::new()),
                    Some(parent) => {
                        parent.pending = None;
                        match (&parent.prefix, &parent.key) {
                            (Some(p), Some(k)) if p.is_empty() && b == b'{' && NESTED.contains(&k.as_str()) => {
                                Some(format!("{k}."))
                            }
                            // One slot's members: `slots.<name>.max`.
                            // One slot's members: `slots.<name>.max`; those of a slot written again
                            // are not (the slot's own repeat says it).
                            (Some(p), Some(k)) if p == "slots." && b == b'{' && k.len() <= MAX_KEY_BYTES => {
                                let again = out.keys.iter().any(|o| o.count > 1 && o.path == format!("slots.{k}"));
                                (!again).then(|| format!("slots.{k}."))
                            }
                            _ => None,
                        }
                    }
                };
                stack.push(Frame { object: b == b'{', prefix, expect_key: b == b'{', key: None, pending: None });
            }
            b'}' | b']' => {
                stack.pop();
            }
            b',' => {
                if let Some(top) = stack.last_mut().filter(|f| f.object) {
                    top.expect_key = true;
                }
            }
            b'"' => {
                let end = string_end(bytes, i);
                let literal = &bytes[i..end.min(bytes.len())];
                if let Some(top) = stack.last_mut() {
                    if top.object && top.expect_key {
                        top.expect_key = false;
                        top.pending = None;
                        let key = decode_key(literal);
                        if let (Some(prefix), Some(k)) = (&top.prefix, &key) {
                            let known = if prefix.is_empty() {
                                KNOWN_KEYS.contains(&k.as_ref())
                            } else {
                                k.len() <= MAX_KEY_BYTES
                            };
                            let path = format!("{prefix}{k}");
                            if known && (out.keys.len() < MAX_KEYS || out.keys.iter().any(|o| o.path == path)) {
                                top.pending = Some(record(&mut out, path, line));
                            }
                        }
                        top.key = key.map(Cow::into_owned);
                    } else if let Some(at) = top.pending.take() {
                        out.keys[at].last = raw(literal);
                    }
                }
                i = end;
                continue;
            }
            b' ' | b'\t' | b'\r' | b':' => {}
            _ => {
                // A number, true, false or null: up to the next delimiter.
                let end = bytes[i..]
                    .iter()
                    .position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\r' | b'\n'))
                    .map_or(bytes.len(), |n| i + n);
                if let Some(at) = stack.last_mut().and_then(|f| f.pending.take()) {
                    out.keys[at].last = raw(&bytes[i..end]);
                }
                i = end;
                continue;
            }
        }
        i += 1;
    }
    out
}

/// The index just past the string literal that starts at `start` (its opening quote).
fn string_end(bytes: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// A key literal (with its quotes) as the text serde reads: escapes decoded.
fn decode_key(literal: &[u8]) -> Option<Cow<'_, str>> {
    let inner = literal.get(1..literal.len().saturating_sub(1))?;
    if !inner.contains(&b'\\') {
        return std::str::from_utf8(inner).ok().map(Cow::Borrowed);
    }
    serde_json::from_slice::<String>(literal).ok().map(Cow::Owned)
}

fn raw(text: &[u8]) -> Option<String> {
    (text.len() <= MAX_RAW).then(|| String::from_utf8_lossy(text).into_owned())
}

/// Counts one occurrence of `path` on `line`; returns its entry.
fn record(out: &mut Written, path: String, line: usize) -> usize {
    let at = match out.keys.iter().position(|k| k.path == path) {
        Some(at) => at,
        None => {
            out.keys.push(Occurrences { path, ..Default::default() });
            out.keys.len() - 1
        }
    };
    let k = &mut out.keys[at];
    k.count += 1;
    k.last = None;
    if k.lines.len() < MAX_LINES {
        k.lines.push(line);
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(json: &str) -> Vec<(String, Vec<usize>, usize, Option<String>)> {
        scan(json.as_bytes()).keys.into_iter().map(|k| (k.path, k.lines, k.count, k.last)).collect()
    }

    #[test]
    fn every_occurrence_of_a_known_key_is_found_on_its_line_with_its_value_as_written() {
        let doc = "{\n  \"threshold\": 5,\n  \"excludes\": [\"a\", \"threshold\"],\n  \"threshold\": 1e3\n}";
        assert_eq!(
            keys(doc),
            [("threshold".into(), vec![2, 4], 2, Some("1e3".into())), ("excludes".into(), vec![3], 1, None),]
        );
        let big = r#"{"repeatAfter": 100000000000000000000, "timeout": "1h"}"#;
        assert_eq!(scan(big.as_bytes()).raw("repeatAfter"), Some("100000000000000000000"));
        assert_eq!(scan(big.as_bytes()).raw("timeout"), Some("\"1h\""));
    }

    #[test]
    fn members_of_stall_watch_and_sessions_are_found_and_nothing_deeper_or_unknown() {
        let doc = r#"{"stallWatch": {"peggedCpu": 1, "peggedCpu": 2}, "x": {"threshold": 1, "y": {"a": 1}},
                      "sessions": {"roots": ["a"], "grace": "1s", "roots": []}}"#;
        let found = keys(doc);
        let paths: Vec<&str> = found.iter().map(|k| k.0.as_str()).collect();
        assert_eq!(paths, ["stallWatch", "stallWatch.peggedCpu", "sessions", "sessions.roots", "sessions.grace"]);
        assert_eq!(found[1].2, 2);
        assert_eq!(found[3].2, 2);
    }

    #[test]
    fn an_escaped_key_is_the_key_serde_reads() {
        let doc = r#"{"threshold": 5, "thr\u0065shold": 50}"#;
        assert_eq!(keys(doc)[0].2, 2);
        // Braces and quotes inside strings are text.
        let doc = r#"{"excludes": ["{\"threshold\": 1}", "}"], "threshold": 2}"#;
        assert_eq!(keys(doc)[1], ("threshold".into(), vec![1], 1, Some("2".into())));
    }

    #[test]
    fn a_million_repeats_cost_a_counter() {
        let doc = format!("{{{}\"threshold\": 1}}", "\"threshold\": 1,\n".repeat(100_000));
        let w = scan(doc.as_bytes());
        assert_eq!((w.keys.len(), w.keys[0].count, w.keys[0].lines.len()), (1, 100_001, MAX_LINES));
    }
}
