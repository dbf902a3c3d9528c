//! The status file (`guard-status.json` beside the state file), written atomically every tick
//! and read by `guard-user status` and `check`.
use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::domain::{NameStatus, PeggedProcess, RepeatOffender, SessionsStatus};

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Status {
    pub version: String,
    pub user: String,
    pub uid: u32,
    pub pid: u32,
    pub backend: String,
    pub dry_run: bool,
    /// When the daemon started, unix seconds (written `started_at_unix`; `started_at` in older
    /// status files).
    #[serde(rename = "started_at_unix", alias = "started_at")]
    pub started_at: f64,
    /// When the last tick completed, unix seconds (written `last_tick_unix`; `last_tick` in
    /// older status files).
    #[serde(rename = "last_tick_unix", alias = "last_tick")]
    pub last_tick: f64,
    pub interval_secs: f64,
    pub ticks: u64,
    pub events: u64,
    pub lost_events: u64,
    pub resyncs: u64,
    /// Processes ended since start, for every reason (`kills_by_reason` splits them).
    pub kills: u64,
    /// The guarded account's live processes (every name, excluded ones too). Status files written
    /// before `machine_processes` existed hold the machine's total here.
    pub tracked_processes: u64,
    /// The last tick's config error (the ERROR line's reason), if any.
    pub config_error: Option<String>,
    /// Names at or over half the threshold, largest count first.
    pub names: Vec<NameStatus>,
    // Everything below was added later: absent in an older status file, it reads as empty and
    // the views leave its line or section out.
    /// Every live process in the table, of every uid: what the event source keeps up to date,
    /// shown beside `tracked_processes` so neither is mistaken for the other.
    #[serde(default)]
    pub machine_processes: Option<u64>,
    /// Names enforced `repeatAfter` times or more within 24 h (docs/configuration.md, the `REPEAT` line).
    #[serde(default)]
    pub repeat_offenders: Vec<RepeatOffender>,
    /// Processes the stall watch reports as pegged (docs/configuration.md).
    #[serde(default)]
    pub pegged: Vec<PeggedProcess>,
    /// The daemon's own health, so an operator can tell a slow guard from a busy machine.
    #[serde(default)]
    pub vitals: Option<Vitals>,
    /// Session roots and their leftovers (docs/configuration.md `sessions`); absent when off.
    #[serde(default)]
    pub sessions: Option<SessionsStatus>,
    /// Processes whose command line the last tick could not read in time, so it protected them
    /// for that tick (`SKIPPED … reason=read_budget` when enforced) and reads them again.
    #[serde(default)]
    pub cmdlines_unread: u64,
    /// The same, summed over every tick since the daemon started.
    #[serde(default)]
    pub cmdlines_unread_total: u64,
    /// Heavy-command slots (docs/configuration.md `slots`): holders and the queue; absent when off.
    #[serde(default)]
    pub slots: Option<SlotsStatus>,
    /// `kills` by why they were ended (absent in older status files, whose `kills` counted
    /// `KILLED` lines only).
    #[serde(default)]
    pub kills_by_reason: KillsByReason,
}

/// Processes ended since start, by reason (the reason of their log line).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct KillsByReason {
    /// `KILLED … reason=ghost_detected`: a pile of one name over the threshold for the timeout.
    pub ghost_detected: u64,
    /// Leftovers of ended sessions stopped (the sum of `REAPED`'s `count=`).
    pub leftover: u64,
}

impl KillsByReason {
    /// Every reason with its total, in the order metrics and docs list them.
    pub fn each(&self) -> [(&'static str, u64); 2] {
        [("ghost_detected", self.ghost_detected), ("leftover", self.leftover)]
    }

    pub fn total(&self) -> u64 {
        self.ghost_detected + self.leftover
    }
}

/// The slots as the pump held them at the last tick, for `status`, `tree` and `explain`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct SlotsStatus {
    /// Why nothing is held on this host (the slots report only): `WARN slots_unavailable`'s
    /// reason; `null` when slots can hold.
    pub unavailable: Option<String>,
    pub slots: Vec<SlotStatus>,
    /// Execs whose command line is still to be classified.
    pub pending_execs: u64,
    /// Processes in a slot's tree or awaiting their exec's verdict.
    pub tracked: u64,
    /// Trees that waited (or, reporting, would have), since start.
    pub waits_total: u64,
    /// Trees `maxWait` let go, since start.
    pub timeouts_total: u64,
    /// Seconds trees spent waiting, since start.
    pub wait_seconds_total: f64,
    /// Trees that could not be held and ran at once, since start.
    pub not_held_total: u64,
    /// Execs not classified (a cap, or a classifier that could not keep up), since start.
    pub unclassified_total: u64,
    /// Processes left out of their tree at the node cap, since start.
    pub untracked_total: u64,
    /// Trees run at once because the waiting cap was reached, since start.
    pub over_cap_total: u64,
}

/// One slot.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct SlotStatus {
    pub name: String,
    pub max: u32,
    pub max_wait_secs: f64,
    /// `queue` or `report` (a dry run, or a host where nothing can be held, reports).
    pub mode: String,
    /// The trees holding it (at most 64 listed; `holders_count` counts them all).
    pub holders: Vec<SlotTree>,
    pub holders_count: u64,
    /// The trees waiting, first in line first (at most 64 listed).
    pub waiting: Vec<SlotTree>,
    pub waiting_count: u64,
}

/// One tree: its head (the matching exec) and how many processes it has.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct SlotTree {
    pub pid: u32,
    /// The head's start time in clock ticks since boot (its identity with the pid).
    pub start_ticks: u64,
    pub name: String,
    /// Since it holds the slot, or since it waits (unix seconds).
    pub since_unix: f64,
    pub processes: u64,
}

/// The daemon's own resource use and pace. Every field is optional: the daemon fills what it
/// measures, and the views show only what is there.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Vitals {
    /// CPU used by the daemon since the previous tick, in percent of one core.
    pub cpu_percent: Option<f64>,
    /// Resident memory, bytes.
    pub rss_bytes: Option<u64>,
    pub tick_duration_last_secs: Option<f64>,
    pub tick_duration_max_secs: Option<f64>,
    /// How far the event pump trails the kernel's ring buffer, seconds.
    pub pump_lag_secs: Option<f64>,
    /// Events applied per second, averaged since the previous tick.
    pub events_per_sec: Option<f64>,
}

/// How old the last tick is, and whether that means the guard stopped ticking (docs/operations.md: older
/// than two intervals). The one place this is decided, for `status`, `status --json` and
/// `check`'s "has not completed a tick" line, so they cannot disagree.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Freshness {
    /// Seconds since the last tick completed (0 when it lies in the future).
    pub age_secs: f64,
    pub stale: bool,
}

impl Freshness {
    /// From a last tick and an interval in unix seconds / seconds, as the status file and the
    /// heartbeat carry them. An interval under a second counts as one; values that are not
    /// finite (never in a file the daemon wrote) read as stale rather than failing.
    pub fn of(last_tick: f64, interval_secs: f64, now: std::time::SystemTime) -> Freshness {
        let now = now.duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        let age_secs = (now - last_tick).max(0.0);
        let limit = 2.0 * interval_secs.max(1.0);
        let stale = !last_tick.is_finite() || age_secs.is_nan() || age_secs > limit;
        Freshness { age_secs: if age_secs.is_finite() { age_secs } else { f64::MAX }, stale }
    }
}

impl Status {
    pub fn freshness(&self, now: std::time::SystemTime) -> Freshness {
        Freshness::of(self.last_tick, self.interval_secs, now)
    }
}

/// `bytes` as text that cannot move a terminal's cursor, start a line or hide what follows:
/// `\\` for a backslash, `\n` `\r` `\t`, and `\xNN` for every other control character (C0,
/// DEL, C1), for Unicode's bidirectional controls and for each byte that is not UTF-8. The mapping
/// is one to one (it can be undone), so two different names never show, or become a metric label,
/// as the same text. Used for everything the account controls in `status` and the metrics file.
pub fn escape_for_terminal(bytes: &[u8]) -> String {
    crate::escape::text(bytes)
}

/// Whether `c` acts on a terminal instead of showing: a control character (C0, DEL, C1) or one of
/// Unicode's bidirectional controls, which reorder the text around them on screen ("Trojan Source").
pub fn is_hidden_control(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// The status file that goes with a state file: `guard-status.json` in the same directory. The
/// daemon writes there; readers find it through [`locate`].
pub fn path_beside(state_file: &Path) -> PathBuf {
    state_file.with_file_name("guard-status.json")
}

/// Where the account's guard writes its status: beside the `stateFile` of the config at
/// `config_path` (read as `who`), or beside the default state file under `home` when that config
/// cannot be read. The one answer for every reader (`status`, `tree`, `check`), so they cannot
/// look in different places.
pub fn locate(config_path: &Path, home: &Path, who: crate::safefs::FsIdentity) -> PathBuf {
    use crate::config;
    let state_file = config::load(config_path, home, who)
        .map(|c| c.state_file)
        .unwrap_or_else(|_| config::expand_tilde(config::DEFAULT_STATE_FILE, home));
    path_beside(&state_file)
}

/// A status file is written by the daemon; 16 MiB is far beyond one (a few hundred bytes per
/// name at or over half the threshold) and bounds what a planted file can make a reader parse.
pub const MAX_STATUS_BYTES: u64 = 16 << 20;

/// Why `status`/`check` have no status to show. Displays naming the file and what to do.
#[derive(Debug, thiserror::Error)]
pub enum StatusReadError {
    #[error("{0}; {fix}", fix = .0.fix())]
    Unreadable(#[from] crate::safefs::ReadError),
    /// Not a status file. Only the position is given: serde's message can quote the content.
    #[error("{} is not a guard status file (line {line}, column {column}); it is rewritten by the running guard every tick", crate::escape::Escaped(path.as_os_str().as_encoded_bytes()))]
    Malformed { path: PathBuf, line: usize, column: usize },
    #[error("{} holds a number out of range, so it is not a guard status file; it is rewritten by the running guard every tick", crate::escape::Escaped(path.as_os_str().as_encoded_bytes()))]
    OutOfRange { path: PathBuf },
}

impl StatusReadError {
    /// The file does not exist (no guard has run with this state directory).
    pub fn is_missing(&self) -> bool {
        matches!(self, StatusReadError::Unreadable(crate::safefs::ReadError::NotFound { .. }))
    }
}

/// The daemon's own copy of the status file, where the account cannot write (a root daemon
/// writes it beside its instance lock in `/run/guard-user/`), and that lock file, whose first
/// line is the pid of the daemon that last held it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrustedCopy {
    pub status: PathBuf,
    pub lock: PathBuf,
}

/// What `status` and `check` show: the daemon's own copy when there is one to trust, else the
/// file in the home ([`read`]). The account can rewrite the file in its home at any moment (a
/// fresh `last_tick`, no `config_error`, no flagged names), so a reader that can use the copy
/// does: root, when the copy was written by the daemon that last held the lock (its `pid`; a
/// copy left by another daemon, e.g. before a downgrade, is not used).
pub fn read_trusted(
    path: &Path,
    who: crate::safefs::FsIdentity,
    copy: Option<&TrustedCopy>,
) -> Result<Status, StatusReadError> {
    use crate::safefs::{read_account_file, Follow, FsIdentity};
    let root = FsIdentity { uid: 0, gid: 0 };
    let trusted = copy.and_then(|c| {
        let holder = read_account_file(&c.lock, root, 4096, Follow::NoLinks).ok()?;
        let holder: u32 = std::str::from_utf8(&holder).ok()?.lines().next()?.trim().parse().ok()?;
        let st = read(&c.status, root).ok()?;
        (st.pid == holder).then_some(st)
    });
    match trusted {
        Some(st) => Ok(st),
        None => read(path, who),
    }
}

/// The daemon's own copy alone (`guard-user tree` as root, docs/operations.md): never the file in
/// the home, which the account can make say anything. Missing when no daemon running as root
/// wrote one for this account and home, or another daemon holds the lock now.
pub fn read_trusted_only(copy: &TrustedCopy) -> Result<Status, StatusReadError> {
    use crate::safefs::{read_account_file, Follow, FsIdentity};
    let root = FsIdentity { uid: 0, gid: 0 };
    let holder = read_account_file(&copy.lock, root, 4096, Follow::NoLinks)?;
    let holder: Option<u32> = std::str::from_utf8(&holder).ok().and_then(|t| t.lines().next()?.trim().parse().ok());
    let st = read(&copy.status, root)?;
    if Some(st.pid) != holder {
        let path = copy.status.clone();
        return Err(StatusReadError::Unreadable(crate::safefs::ReadError::NotFound { path }));
    }
    Ok(st)
}

/// Reads the status file as the account `who` (the commands reading it may run as root): never
/// through a link, regular files only, at most [`MAX_STATUS_BYTES`], never blocking.
pub fn read(path: &Path, who: crate::safefs::FsIdentity) -> Result<Status, StatusReadError> {
    use crate::safefs::{read_account_file, Follow};
    let bytes = read_account_file(path, who, MAX_STATUS_BYTES, Follow::NoLinks)?;
    let malformed = |e: serde_json::Error| StatusReadError::Malformed {
        path: path.to_path_buf(),
        line: e.line(),
        column: e.column(),
    };
    // Typed first, for the position of a problem; then every string made printable, since the
    // account can edit this file and `status`/`check` print its names on a terminal.
    serde_json::from_slice::<Status>(&bytes).map_err(malformed)?;
    let mut value: serde_json::Value = serde_json::from_slice(&bytes).map_err(malformed)?;
    if !sanitize(&mut value) {
        return Err(StatusReadError::OutOfRange { path: path.to_path_buf() });
    }
    serde_json::from_value(value).map_err(malformed)
}

/// Makes every string in `v` printable ([`crate::escape::printable`]) and checks every number
/// is within ±2^53, however deep. False when a number is out of that range: times and ages
/// computed from one (`Duration::from_secs_f64(now - 1e300)`) would panic the reader.
fn sanitize(v: &mut serde_json::Value) -> bool {
    use serde_json::Value;
    const MAX: f64 = (1u64 << 53) as f64;
    match v {
        Value::String(s) => {
            if let std::borrow::Cow::Owned(p) = crate::escape::printable(s) {
                *s = p;
            }
            true
        }
        Value::Number(n) => n.as_f64().is_some_and(|x| x.abs() <= MAX),
        Value::Array(items) => items.iter_mut().all(sanitize),
        Value::Object(map) => map.values_mut().all(sanitize),
        Value::Null | Value::Bool(_) => true,
    }
}

/// JSON with every C1 and bidirectional control written as a `\u` escape (serde_json does that
/// for C0 only), so JSON made from what an account or another guard wrote is safe to print.
pub fn json_for_terminal(json: &str) -> String {
    // Outside strings JSON is plain ASCII, so any such character is inside a string, where a
    // `\uXXXX` escape means the same character.
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if !c.is_ascii() && is_hidden_control(c) {
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push(c);
        }
    }
    out
}
