//! How a config value is quoted back: in a problem's sentence ([`shown`]: JSON, one printable
//! line, 60 bytes) and in the `ERROR` line's `value=` ([`shown_value`]); a number as the file
//! writes it where the scanner found its text ([`super::written`]).
use serde_json::Value;

use super::MAX_SHOWN_VALUE;
use crate::escape;

/// What kind of JSON value `v` is, for "… is a string".
pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `v` as a human reads it in a problem: JSON, escaped to one printable line, cut at 60 bytes.
pub(super) fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => format!("\"{}\"", escape::text_capped(s.as_bytes(), 60)),
        other => escape::text_capped(&json_prefix(other, 61), 60),
    }
}

/// The keys whose value may be a string: theirs is shown as its text (`value=1d`).
pub(super) fn takes_string(log_key: &str) -> bool {
    matches!(
        log_key,
        "timeout" | "warnBefore" | "stateFile" | "stallWatch.peggedFor" | "sessions.leftovers" | "sessions.grace"
    )
}

/// A value as the log shows it (docs/log.md): a string where the key takes one as its text,
/// anything else as its compact JSON, so a value of the wrong type never passes for one of the
/// right type (`"30"` where a number belongs is `"30"`, not `30`). Only the first
/// [`MAX_SHOWN_VALUE`] + 1 bytes: the display cuts at [`MAX_SHOWN_VALUE`] (escaped) and a
/// megabyte value is never copied or serialized whole.
pub(super) fn shown_value(v: &Value, takes_string: bool) -> Vec<u8> {
    match v {
        Value::String(s) if takes_string => s.as_bytes()[..s.len().min(MAX_SHOWN_VALUE + 1)].to_vec(),
        other => json_prefix(other, MAX_SHOWN_VALUE + 1),
    }
}

/// The first `limit` bytes of `v`'s compact JSON; serializing stops there.
pub(super) fn json_prefix(v: &Value, limit: usize) -> Vec<u8> {
    struct Prefix(Vec<u8>, usize);
    impl std::io::Write for Prefix {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.1 - self.0.len());
            self.0.extend_from_slice(&buf[..n]);
            Ok(n) // 0 once full: serde_json stops with a WriteZero error
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut out = Prefix(Vec::new(), limit);
    let _ = serde_json::to_writer(&mut out, v);
    out.0
}

/// `s`, or its first [`MAX_SHOWN_VALUE`] + 1 bytes (to the next character boundary) when longer:
/// enough for the display to cut and mark the cut.
pub(super) fn prefix(s: &str) -> String {
    let mut end = s.len().min(MAX_SHOWN_VALUE + 1);
    while !s.is_char_boundary(end) {
        end += 1;
    }
    s[..end].to_string()
}
