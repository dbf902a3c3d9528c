//! A process name: the kernel's `comm`, at most 15 bytes, not necessarily UTF-8.
use std::fmt;

use guard_common::COMM_LEN;

/// A comm stored inline (no allocation per process), compared and hashed by its bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Comm {
    len: u8,
    bytes: [u8; COMM_LEN - 1],
}

impl Comm {
    /// Truncates to 15 bytes, as the kernel does.
    pub fn new(name: &[u8]) -> Comm {
        let len = name.len().min(COMM_LEN - 1);
        let mut bytes = [0u8; COMM_LEN - 1];
        bytes[..len].copy_from_slice(&name[..len]);
        Comm { len: len as u8, bytes }
    }

    /// From a NUL-padded kernel buffer.
    pub fn from_kernel(buf: &[u8; COMM_LEN]) -> Comm {
        let len = buf.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
        Comm::new(&buf[..len])
    }

    pub fn to_kernel(self) -> [u8; COMM_LEN] {
        let mut out = [0u8; COMM_LEN];
        out[..self.len as usize].copy_from_slice(self.as_bytes());
        out
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// Decodes a name from its escaped form (its `Display`, as the state file and the status file
    /// hold it). `None` when the text is not an escaped form or names more than 15 bytes.
    pub fn from_escaped(text: &str) -> Option<Comm> {
        let bytes = crate::escape::unescape(text).ok()?;
        (bytes.len() < COMM_LEN).then(|| Comm::new(&bytes))
    }

    /// docs/configuration.md: `excludes` compare ignoring (ASCII) case.
    pub fn eq_ignore_case(&self, other: &str) -> bool {
        let o = other.as_bytes();
        o.len() >= self.len as usize
            && self.as_bytes().eq_ignore_ascii_case(&o[..o.len().min(COMM_LEN - 1)])
            && (o.len() == self.len as usize || o.len() > COMM_LEN - 1 && self.len as usize == COMM_LEN - 1)
    }
}

impl fmt::Debug for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

/// The escaped form ([`crate::escape::text`]): one line, printable, and distinct for distinct
/// bytes, so the log, the status file, the Redis mirror and the state file all show the same
/// text for one name and never the same text for two.
impl fmt::Display for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::escape::text(self.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_truncated_to_fifteen_bytes_like_the_kernel() {
        assert_eq!(Comm::new(b"agentihooks-select-profile").as_bytes(), b"agentihooks-sel");
    }

    #[test]
    fn excludes_match_ignoring_case_and_a_long_exclude_matches_its_truncation() {
        assert!(Comm::new(b"Bash").eq_ignore_case("bash"));
        assert!(!Comm::new(b"bash").eq_ignore_case("bas"));
        assert!(!Comm::new(b"bas").eq_ignore_case("bash"));
        assert!(Comm::new(b"agentihooks-sel").eq_ignore_case("agentihooks-select-profile"));
    }

    #[test]
    fn names_differing_only_in_invalid_bytes_display_differently_and_decode_back() {
        let (a, b) = (Comm::new(b"q\xff"), Comm::new(b"q\xfe"));
        assert_eq!(a.to_string(), r"q\xff");
        assert_ne!(a.to_string(), b.to_string());
        for c in [a, b, Comm::new(b"x\nKILLED pid=1"), Comm::new(br"back\slash"), Comm::new(br"q\xff"), Comm::new(b"")]
        {
            assert_eq!(Comm::from_escaped(&c.to_string()), Some(c), "{c}");
        }
        assert_eq!(format!("{:?}", Comm::new(b"a\x1b")), r#""a\x1b""#);
    }

    #[test]
    fn from_escaped_refuses_bad_escapes_and_names_over_fifteen_bytes() {
        assert_eq!(Comm::from_escaped("sixteen-bytes-xx"), None);
        assert_eq!(Comm::from_escaped(r"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"), None);
        assert_eq!(Comm::from_escaped(r"bad\q"), None);
        assert_eq!(Comm::from_escaped(r"bad\"), None);
        assert_eq!(Comm::from_escaped("fifteen-bytes-x"), Some(Comm::new(b"fifteen-bytes-x")));
    }
}
