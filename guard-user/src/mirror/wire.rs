//! What the guard writes to the swarm Redis (docs/operations.md): the heartbeat key and its JSON, the event
//! stream and its fields. The one file to read to know the format, and the only one that builds
//! the write commands, so tests can check them without a server.
//!
//! - Heartbeat: `SET agentihooks:host-guard:<host>:<user> <json> EX <ttl>` with the JSON of
//!   [`Heartbeat`]; `last_tick` is unix seconds (UTC), which every consumer can compare without
//!   parsing dates. A TTL below a second is rounded up to one.
//! - Events: `XADD agentihooks:host-guard:events MAXLEN ~ 10000 * host <h> user <u> event <e>
//!   [pid <p>] [name <n>] [reason <r>] [count <c>] [elapsed <e>] [<other fields>] ts <unix
//!   seconds>`. Fields with no value (`None`, or an empty reason) are omitted rather than written
//!   empty, so a reader can tell "no pid" from "pid 0"; the `config_error` and `config_ok`
//!   events are about no process, so they have no `name` either.
//!
//! Values the account controls (process names, in the stream and in the heartbeat's `flagged`)
//! need no escaping here: each stream value is its own length-prefixed argument of the Redis
//! protocol, which is binary-safe, so a name holding spaces, newlines or protocol text stays one
//! field; in the heartbeat, serde_json escapes it as a JSON string.
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::resp::Cmd;

/// The stream every guard appends its FLAGGED-first / KILLED / DRY_RUN / SKIPPED events to.
pub const STREAM_KEY: &str = "agentihooks:host-guard:events";
/// Approximate length the stream is trimmed to (`MAXLEN ~`).
pub const STREAM_MAXLEN: u64 = 10_000;
/// Every key of ours starts with it: the heartbeats and [`STREAM_KEY`].
pub const KEY_PREFIX: &str = "agentihooks:host-guard:";

/// Flagged names a heartbeat lists: with the config error cut to [`HEARTBEAT_ERROR_BYTES`], a
/// heartbeat stays far inside the 64 KiB a Redis reply may take (`resp::REPLY_BYTES`), so every
/// guard's heartbeat can be read back by `status --fleet` and `check`.
pub const HEARTBEAT_FLAGGED: usize = 200;
/// Bytes of the config error a heartbeat carries (the log line's reason, escaped).
pub const HEARTBEAT_ERROR_BYTES: usize = 4096;

/// The heartbeat key of one guarded account.
pub fn heartbeat_key(host: &str, user: &str) -> String {
    format!("{KEY_PREFIX}{host}:{user}")
}

/// What one guard publishes every tick (docs/operations.md). Missing fields read as their defaults, so a
/// heartbeat from an older or newer guard still parses.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(default)]
pub struct Heartbeat {
    pub host: String,
    pub user: String,
    pub home: String,
    pub pid: u32,
    pub version: String,
    /// `ebpf` or `procfs`.
    pub backend: String,
    pub dry_run: bool,
    /// Completion of the last tick, unix seconds (UTC).
    pub last_tick: u64,
    /// Names at or over the threshold at that tick, the first [`HEARTBEAT_FLAGGED`] of them.
    pub flagged: Vec<String>,
    /// Flagged names beyond those listed.
    pub flagged_omitted: u64,
    /// Processes ended since the daemon started, for every reason (`kills_by_reason` splits them).
    pub kills: u64,
    /// `kills` by reason: `ghost_detected` (`KILLED` lines), `leftover` (leftovers of ended
    /// sessions, the sum of `REAPED`'s `count=`).
    pub kills_by_reason: crate::status::KillsByReason,
    pub lost_events: u64,
    pub resyncs: u64,
    /// The tick interval, so a reader can judge how stale `last_tick` is.
    pub interval_secs: u64,
    /// The last tick's config error (the `ERROR` line's reason, as in the log), `null` when
    /// the config was valid. While it is set the guard ends nothing.
    pub config_error: Option<String>,
    /// Session counts (docs/configuration.md `sessions`); `null` while sessions are off.
    pub sessions: Option<SessionCounts>,
    /// Heavy-command slot counts (docs/configuration.md `slots`); absent while no slot is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<SlotCounts>,
}

/// The heartbeat's slot counts.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(default)]
pub struct SlotCounts {
    /// Trees holding a slot, all slots.
    pub holding: u64,
    /// Trees waiting for one.
    pub waiting: u64,
    /// `SLOT_WAIT` lines since the daemon started.
    pub waits: u64,
    /// `SLOT_TIMEOUT` lines since the daemon started.
    pub timeouts: u64,
    /// Why nothing is held here, if so (`WARN slots_unavailable`'s reason).
    pub unavailable: Option<String>,
}

/// The heartbeat's session counts.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(default)]
pub struct SessionCounts {
    /// Root sessions whose root is alive.
    pub live: u64,
    /// Root sessions that ended, their leftovers still to deal with.
    pub ended: u64,
    /// Live processes of ended sessions.
    pub pending_leftovers: u64,
    /// `LEFTOVER` lines since the daemon started.
    pub leftovers: u64,
    /// `REAPED` lines since the daemon started.
    pub reaped: u64,
    /// Leftovers ended since the daemon started.
    pub stopped: u64,
}

/// One stream entry (docs/log.md, "The Redis stream"): a streamed log line ([`StreamEvent::of`]),
/// or the config breaking (`config_error`) or being mended (`config_ok`), once per outage.
/// Durations and times are numbers with their unit in the field's name (`elapsed_secs`,
/// `ts_unix`), never text such as `1.0h`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamEvent {
    /// `FLAGGED`, `KILLED`, `DRY_RUN`, `SKIPPED` (the log's words, as the spec names them), or
    /// `warning`, `repeat`, `pegged`, `recovered`, `leftover`, `reaped`, `config_error`, `config_ok`.
    pub event: String,
    pub pid: Option<u32>,
    /// The process name, escaped as in the log; `None` (and left out) for the config events,
    /// which are about no process.
    pub name: Option<String>,
    /// `ghost_detected`, `excluded_command`, `identity_changed`; empty for FLAGGED.
    pub reason: String,
    pub count: Option<u64>,
    /// Whole seconds since the name was flagged (`elapsed_secs`; the log shows hours).
    pub elapsed_secs: Option<u64>,
    /// The tick's time, unix seconds (`ts_unix`).
    pub ts: i64,
    /// The line's other fields (`due_in_secs`, `ends`, `skips`, `enforcements_24h`, `cpu`, …;
    /// the config events' `error` and `after_secs`), in order.
    pub extra: Vec<(String, String)>,
}

/// `SET <key> <json> EX <ttl>`: the heartbeat, gone by itself `ttl` after the last write so a
/// guard that stopped (or a Redis that moved) strands nothing.
pub fn set_heartbeat(key: &str, hb: &Heartbeat, ttl: Duration) -> Cmd {
    let json = serde_json::to_string(hb).expect("a heartbeat always serializes");
    let mut cmd = Cmd::new("SET");
    cmd.arg(key).arg(json).arg("EX").arg(ttl_secs(ttl));
    cmd
}

/// Whole seconds for `EX`, rounded up, at least one (`EX 0` is an error in Redis).
fn ttl_secs(ttl: Duration) -> u64 {
    ttl.as_secs_f64().ceil().max(1.0) as u64
}

/// `XADD` of one event of `host`/`user`, trimming the stream to about [`STREAM_MAXLEN`].
pub fn xadd(host: &str, user: &str, ev: &StreamEvent) -> Cmd {
    let mut cmd = Cmd::new("XADD");
    cmd.arg(STREAM_KEY).arg("MAXLEN").arg("~").arg(STREAM_MAXLEN).arg("*");
    cmd.arg("host").arg(host).arg("user").arg(user).arg("event").arg(&ev.event);
    if let Some(pid) = ev.pid {
        cmd.arg("pid").arg(pid);
    }
    if let Some(name) = &ev.name {
        cmd.arg("name").arg(name);
    }
    if !ev.reason.is_empty() {
        cmd.arg("reason").arg(&ev.reason);
    }
    if let Some(count) = ev.count {
        cmd.arg("count").arg(count);
    }
    if let Some(elapsed) = ev.elapsed_secs {
        cmd.arg("elapsed_secs").arg(elapsed);
    }
    for (k, v) in &ev.extra {
        cmd.arg(k).arg(v);
    }
    cmd.arg("ts_unix").arg(ev.ts);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(cmd: &Cmd) -> Vec<Vec<u8>> {
        cmd.args().to_vec()
    }

    #[test]
    fn a_hostile_name_is_one_stream_field() {
        let name = "a b\r\nname x\n*3\r\n$4\r\nPING =\"";
        let ev = StreamEvent {
            event: "KILLED".into(),
            pid: Some(7),
            name: Some(name.into()),
            reason: "ghost_detected".into(),
            count: Some(31),
            elapsed_secs: Some(3600),
            ts: 1,
            extra: Vec::new(),
        };
        let a = args(&xadd("box1", "alice", &ev));
        let at = a.iter().position(|x| x == b"name").expect("a name field");
        assert_eq!(a[at + 1], name.as_bytes(), "the name is one argument, byte for byte");
        let fields: Vec<&[u8]> = a[6..].iter().step_by(2).map(Vec::as_slice).collect();
        assert_eq!(
            fields,
            [&b"host"[..], b"user", b"event", b"pid", b"name", b"reason", b"count", b"elapsed_secs", b"ts_unix"]
        );
    }

    #[test]
    fn heartbeat_ttl_is_whole_seconds_and_at_least_one() {
        let a = args(&set_heartbeat("k", &Heartbeat::default(), Duration::from_millis(1500)));
        assert_eq!(a[3..], [b"EX".to_vec(), b"2".to_vec()]);
        let a = args(&set_heartbeat("k", &Heartbeat::default(), Duration::ZERO));
        assert_eq!(a[4], b"1");
    }
}
