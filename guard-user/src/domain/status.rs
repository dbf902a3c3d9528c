//! What a tick found about names, sessions and repeat offenders: the rows `policy` computes and
//! the status file, `status`, `tree`, the metrics and the heartbeat show. Their serde form is the
//! status file's (docs/json.md); the file itself (paths, reading, trust) is `crate::status`.
use serde::{Deserialize, Serialize};

/// One name at or over half its threshold.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct NameStatus {
    pub name: String,
    pub count: u32,
    pub threshold: u32,
    /// Unix seconds when the name was flagged; `null` when it is not flagged. Written
    /// `flagged_since_unix` (docs/json.md); `flagged_since` is how older status files call it.
    #[serde(rename = "flagged_since_unix", alias = "flagged_since")]
    pub flagged_since: Option<f64>,
    /// Seconds left before enforcement (0 when due); `null` when not flagged. Written
    /// `due_in_secs`, the name `explain --json` and `tree --json` use for the same figure;
    /// `time_left_secs` is how older status files call it.
    #[serde(rename = "due_in_secs", alias = "time_left_secs")]
    pub time_left_secs: Option<f64>,
    /// For flagged names: processes an enforcement would leave alone (excludeCommands).
    pub would_skip: Option<u32>,
    /// For flagged names: processes an enforcement would end.
    pub would_end: Option<u32>,
    /// A name in `excludes` at or over the threshold: never flagged, never ended, but shown, so
    /// a pile that renamed itself to an excluded name (`bash`, or `BASH`: excludes ignore case)
    /// is not invisible. Always written, `false` included, so every row has the same fields.
    #[serde(default)]
    pub excluded: bool,
    /// A `WARNING` was logged for this flagged name's incident and enforcement is still ahead:
    /// `status` shows it as `<name>: enforcement due in <m>m: ends <would_end>, skips
    /// <would_skip>` from this row's own figures. Absent (false) in older status files, which
    /// carried the warnings as text in a `warnings` list instead.
    #[serde(default)]
    pub warned: bool,
}

/// The sessions as the last tick saw them, for `status` and `guard-user tree`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct SessionsStatus {
    /// `report` or `stop`.
    pub leftovers: String,
    pub grace_secs: f64,
    /// Root sessions whose root is alive.
    pub live: u64,
    /// Root sessions whose root ended, in their grace or being stopped.
    pub ended: u64,
    /// Settled sessions whose leftovers (reported, or left alive by the stop) still run.
    pub reported: u64,
    /// Live processes of ended sessions in their grace or being stopped.
    pub pending_leftovers: u64,
    /// Live processes of reported sessions: leftovers given a `LEFTOVER` line and still running.
    pub reported_leftovers: u64,
    /// `LEFTOVER` lines since the daemon started.
    pub leftovers_total: u64,
    /// `REAPED` lines since the daemon started.
    pub reaped_total: u64,
    /// Leftovers ended since the daemon started.
    pub stopped_total: u64,
    /// Processes the lineage holds (members of a session, execs awaiting classification).
    pub tracked: u64,
    /// Execs whose command line is still to be classified.
    pub pending_execs: u64,
    /// Processes left without lineage at a cap (never reaped), since start.
    pub untracked_total: u64,
    /// Execs never classified because of the cap on pending ones, since start.
    pub unclassified_total: u64,
    /// Roots refused at the cap on sessions, since start.
    pub roots_refused_total: u64,
    /// How often each cap was reached since start (each said once by `WARN sessions_cap`).
    pub caps: SessionCaps,
    /// The first sessions (at most 64), in the order they were opened.
    pub sessions: Vec<SessionStatus>,
    /// Sessions beyond the first 64.
    pub sessions_omitted: u64,
}

/// How often each cap of the sessions was reached since start (docs/configuration.md).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct SessionCaps {
    /// Roots refused at the cap on sessions.
    pub sessions: u64,
    /// Forks left without lineage at the cap on one session's members.
    pub members: u64,
    /// Forks and execs left without lineage at the cap on the lineage's processes.
    pub nodes: u64,
    /// Execs left unclassified at the cap on pending ones.
    pub pending_execs: u64,
    /// Settled sessions whose leftovers could not stay listed.
    pub reported: u64,
    /// Ticks with more pending execs than one tick is handed.
    pub candidates: u64,
    /// Ticks whose byte budget for roots' command lines left candidates for the next tick.
    pub command_bytes: u64,
}

impl SessionCaps {
    /// Every cap with its count, by the name `WARN sessions_cap what=` gives it.
    pub fn each(&self) -> [(&'static str, u64); 7] {
        [
            ("sessions", self.sessions),
            ("members", self.members),
            ("nodes", self.nodes),
            ("pending_execs", self.pending_execs),
            ("reported", self.reported),
            ("candidates", self.candidates),
            ("command_bytes", self.command_bytes),
        ]
    }
}

/// One root session.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct SessionStatus {
    pub root_pid: u32,
    /// The root's start time in clock ticks since boot (its identity with the pid); written
    /// `root_start_ticks`, `root_start` in older status files.
    #[serde(rename = "root_start_ticks", alias = "root_start")]
    pub root_start: u64,
    pub root_name: String,
    /// The root's command line when it was recognised (escaped, at most 256 bytes of it).
    pub command: String,
    /// Bytes of that command line after the first 256, not kept (0 when it is kept whole).
    pub command_omitted_bytes: u64,
    /// When it was recognised (unix seconds; written `since_unix`, `since` in older files).
    #[serde(rename = "since_unix", alias = "since")]
    pub since: Option<f64>,
    /// The root's age while it lives.
    pub root_age_secs: Option<u64>,
    /// `live`, `grace` (the root ended; leftovers are due at `due_at`), `stopping`, or
    /// `reported` (settled: its leftovers were reported, or left alive by the stop, and still run).
    pub stage: String,
    /// When the root ended (unix seconds; written `ended_at_unix`, `ended_at` in older files).
    #[serde(rename = "ended_at_unix", alias = "ended_at")]
    pub ended_at: Option<f64>,
    /// When the next step is due (unix seconds; written `due_at_unix`, `due_at` in older files).
    #[serde(rename = "due_at_unix", alias = "due_at")]
    pub due_at: Option<f64>,
    /// Its live processes (at most 256).
    pub processes: Vec<SessionProcess>,
    pub processes_omitted: u64,
}

/// One process of a session.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct SessionProcess {
    pub pid: u32,
    /// Start time in clock ticks since boot (`tree` checks it before reading the process);
    /// written `start_ticks`, `start` in older status files.
    #[serde(rename = "start_ticks", alias = "start")]
    pub start: u64,
    pub name: String,
}

/// A name that keeps coming back after being ended (docs/log.md `REPEAT`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct RepeatOffender {
    pub name: String,
    pub enforcements_24h: u32,
    pub kills_24h: u32,
}

/// A process the stall watch found using at least `peggedCpu` of a core for `peggedFor` (docs/configuration.md).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct PeggedProcess {
    pub pid: u32,
    pub name: String,
    /// Cores used, averaged over the window (the `cpu=` of the `PEGGED` line); written
    /// `cpu_cores`, `cpu` in older status files.
    #[serde(rename = "cpu_cores", alias = "cpu")]
    pub cpu: f64,
    /// How long it has been pegged.
    pub for_secs: f64,
}
