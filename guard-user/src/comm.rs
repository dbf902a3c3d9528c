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

    /// The name for log lines and JSON: raw where it is UTF-8, lossy otherwise.
    pub fn display(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(self.as_bytes())
    }

    /// SPEC §3: `excludes` compare ignoring (ASCII) case.
    pub fn eq_ignore_case(&self, other: &str) -> bool {
        let o = other.as_bytes();
        o.len() >= self.len as usize && self.as_bytes().eq_ignore_ascii_case(&o[..o.len().min(COMM_LEN - 1)])
            && (o.len() == self.len as usize || o.len() > COMM_LEN - 1 && self.len as usize == COMM_LEN - 1)
    }
}

impl fmt::Debug for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.display())
    }
}

impl fmt::Display for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display())
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
}
