//! The state file: flag clocks that survive a restart (SPEC §2, §4).
//!
//! Format (documented in DEVELOPERS.md): `{"version":1,"user":"<name>","flagged":{"<name>":
//! <unix seconds>}}`. A legacy flat map `{"<name>": <unix seconds>}` is read too.
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use crate::{
    policy::FlagClocks,
    safefs::{atomic_write, read_as, FsIdentity, SafeFsError},
};

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Logged as `ERROR state_malformed path=<path>`; the state is then treated as empty.
    #[error("state_malformed path={}", path.display())]
    Malformed { path: PathBuf },
    #[error("cannot write the state file: {0}")]
    Write(#[from] SafeFsError),
}

/// Reads the flag clocks. A missing file is an empty state, not an error.
pub fn load(path: &Path, who: FsIdentity) -> Result<FlagClocks, StateError> {
    let bytes = match read_as(path, who, 16 << 20) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(FlagClocks::new()),
        Err(_) => return Err(StateError::Malformed { path: path.into() }),
    };
    parse(&bytes).ok_or_else(|| StateError::Malformed { path: path.into() })
}

pub fn parse(bytes: &[u8]) -> Option<FlagClocks> {
    let Value::Object(root) = serde_json::from_slice::<Value>(bytes).ok()? else { return None };
    let flagged: &Map<String, Value> = match root.get("flagged") {
        Some(Value::Object(m)) => m,
        Some(_) => return None,
        None => &root, // legacy flat map
    };
    flagged
        .iter()
        .filter(|(k, _)| root.contains_key("flagged") || k.as_str() != "version")
        .map(|(k, v)| v.as_f64().filter(|t| t.is_finite()).map(|t| (k.clone(), t)))
        .collect()
}

pub fn render(user: &str, clocks: &FlagClocks) -> Vec<u8> {
    let flagged: Map<String, Value> =
        clocks.iter().map(|(k, v)| (k.clone(), json!((v * 1000.0).round() / 1000.0))).collect();
    let mut out = serde_json::to_vec_pretty(&json!({"version": 1, "user": user, "flagged": flagged})).unwrap();
    out.push(b'\n');
    out
}

pub fn save(path: &Path, user: &str, clocks: &FlagClocks, who: FsIdentity) -> Result<(), StateError> {
    Ok(atomic_write(path, &render(user, clocks), who)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_round_trip_and_legacy_flat_maps_are_read() {
        let clocks = FlagClocks::from([("agentihooks".to_string(), 1700000000.5)]);
        assert_eq!(parse(&render("u", &clocks)).unwrap(), clocks);
        assert_eq!(parse(br#"{"sleep": 12}"#).unwrap(), FlagClocks::from([("sleep".to_string(), 12.0)]));
    }

    #[test]
    fn corrupt_state_is_malformed_and_missing_state_is_empty() {
        assert!(parse(b"{\"flagged\": {\"x\": \"soon\"}}").is_none());
        assert!(parse(b"{\"flag").is_none());
        let dir = tempfile::tempdir().unwrap();
        let who = unsafe { FsIdentity { uid: libc::geteuid(), gid: libc::getegid() } };
        assert!(load(&dir.path().join("none.json"), who).unwrap().is_empty());
        std::fs::write(dir.path().join("bad.json"), "garbage").unwrap();
        let e = load(&dir.path().join("bad.json"), who).unwrap_err().to_string();
        assert!(e.starts_with("state_malformed path=") && e.ends_with("bad.json"), "{e}");
    }
}
