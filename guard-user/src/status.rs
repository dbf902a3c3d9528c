//! The status file (`guard-status.json` beside the state file), written atomically every tick
//! and read by `guard-user status` and `check`.
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct NameStatus {
    pub name: String,
    pub count: u32,
    pub threshold: u32,
    /// Unix seconds when the name was flagged; absent below the threshold.
    pub flagged_since: Option<f64>,
    /// Seconds left before enforcement (0 when due); absent when not flagged.
    pub time_left_secs: Option<f64>,
    /// For flagged names: processes an enforcement would leave alone (excludeCommands).
    pub would_skip: Option<u32>,
    /// For flagged names: processes an enforcement would end.
    pub would_end: Option<u32>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Status {
    pub version: String,
    pub user: String,
    pub uid: u32,
    pub pid: u32,
    pub backend: String,
    pub dry_run: bool,
    /// Unix seconds.
    pub started_at: f64,
    pub last_tick: f64,
    pub interval_secs: f64,
    pub ticks: u64,
    pub events: u64,
    pub lost_events: u64,
    pub resyncs: u64,
    pub kills: u64,
    pub tracked_processes: u64,
    /// The last tick's config error (the ERROR line's reason), if any.
    pub config_error: Option<String>,
    /// Names at or over half the threshold, largest count first.
    pub names: Vec<NameStatus>,
}

pub fn path_beside(state_file: &Path) -> PathBuf {
    state_file.with_file_name("guard-status.json")
}

pub fn read(path: &Path) -> Result<Status, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{} is not a guard status file: {e}", path.display()))
}
