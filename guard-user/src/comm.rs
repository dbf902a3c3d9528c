//! A process name: the kernel's `comm`, at most 15 bytes, not necessarily UTF-8.
//!
//! One definition for every source: the name is exactly the bytes the kernel keeps in
//! `task->comm`, a 16-byte array holding at most 15 bytes and a NUL (`__set_task_comm` copies
//! with `strscpy_pad`; exec, prctl(PR_SET_NAME) and a write to /proc/PID/comm all go through
//! it). The BPF events (the leader's `task->comm`, or for a rename the tracepoint's new name read
//! into all 16 bytes), the task iterator, the /proc scan (`stat`'s comm field, taken whole
//! between the first `(` and the last `)`), the trace format and the enforcer's identity check
//! build a [`Comm`] through [`Comm::new`], [`Comm::from_kernel`] or [`Comm::exact`] below and
//! compare all 15 bytes: a name cut to 14 would never match /proc again, and two names sharing
//! 14 bytes would count as one.
use std::fmt;

use guard_common::COMM_LEN;

/// The most bytes a name has (the kernel's `TASK_COMM_LEN` less its NUL).
const MAX_LEN: usize = COMM_LEN - 1;

/// A comm stored inline (no allocation per process), compared and hashed by its bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Comm {
    len: u8,
    bytes: [u8; MAX_LEN],
}

impl Comm {
    /// The name the kernel keeps when a process is given `name` (exec's file name, prctl, a
    /// write to /proc/PID/comm, none of which holds a NUL): its first 15 bytes.
    pub fn new(name: &[u8]) -> Comm {
        let len = name.len().min(MAX_LEN);
        let mut bytes = [0u8; MAX_LEN];
        bytes[..len].copy_from_slice(&name[..len]);
        Comm { len: len as u8, bytes }
    }

    /// `name` itself when the kernel can hold it (at most 15 bytes, no NUL), else `None`: for
    /// input that claims to be a kept name already (a trace, a legacy state file's key), where cutting
    /// it would make it another name.
    pub fn exact(name: &[u8]) -> Option<Comm> {
        (name.len() <= MAX_LEN && !name.contains(&0)).then(|| Comm::new(name))
    }

    /// From a NUL-padded kernel buffer (`task->comm` as the BPF programs copy it): the bytes
    /// before the first NUL, at most 15.
    pub fn from_kernel(buf: &[u8; COMM_LEN]) -> Comm {
        let len = buf.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
        Comm::new(&buf[..len])
    }

    #[cfg(any(test, feature = "testing"))]
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
        (bytes.len() <= MAX_LEN).then(|| Comm::new(&bytes))
    }

    /// docs/configuration.md: `excludes` compare ignoring (ASCII) case.
    pub fn eq_ignore_case(&self, other: &str) -> bool {
        let o = other.as_bytes();
        o.len() >= self.len as usize
            && self.as_bytes().eq_ignore_ascii_case(&o[..o.len().min(MAX_LEN)])
            && (o.len() == self.len as usize || o.len() > MAX_LEN && self.len as usize == MAX_LEN)
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
    fn a_name_is_what_the_kernel_keeps_all_fifteen_bytes_up_to_a_nul() {
        assert_eq!(Comm::new(b"fifteen-bytes-a").as_bytes(), b"fifteen-bytes-a");
        assert_ne!(Comm::new(b"fifteen-bytes-a"), Comm::new(b"fifteen-bytes-b"));
        assert_eq!(Comm::new(b"").as_bytes(), b"");
        // The kernel's buffer: NUL padded, or (never from the kernel, but bounded) full.
        assert_eq!(Comm::from_kernel(b"fifteen-bytes-a\0").as_bytes(), b"fifteen-bytes-a");
        assert_eq!(Comm::from_kernel(b"sixteen-bytes-ab").as_bytes(), b"sixteen-bytes-a");
        assert_eq!(Comm::from_kernel(b"ab\0\0\0\0\0\0\0\0\0\0\0\0\0\0").as_bytes(), b"ab");
        for name in [&b"fifteen-bytes-a"[..], b"x) R 9 9\n\xff ( \n)", b""] {
            let c = Comm::new(name);
            assert_eq!(Comm::from_kernel(&c.to_kernel()), c, "{c}");
        }
    }

    #[test]
    fn exact_takes_only_names_the_kernel_can_hold() {
        assert_eq!(Comm::exact(b"fifteen-bytes-a"), Some(Comm::new(b"fifteen-bytes-a")));
        assert_eq!(Comm::exact(b""), Some(Comm::new(b"")));
        assert_eq!(Comm::exact(b"sixteen-bytes-ab"), None);
        assert_eq!(Comm::exact(b"a\0b"), None);
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
