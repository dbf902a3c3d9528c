//! The read side: one account's heartbeat (for `check`) and every heartbeat on the endpoint (for
//! `status --fleet`). Each call is bounded like the writer's; nothing here is on the daemon's path.
use std::time::Duration;

use tokio::time::Instant;

use super::call::{bounded, connect, MirrorError, CALL_TIMEOUT};
use super::conn::Conn;
use super::resp::{Cmd, Reply, RespError};
use super::wire::{heartbeat_key, Heartbeat, KEY_PREFIX, STREAM_KEY};
use super::Endpoint;

/// Bound on all of [`fleet`]: it pages through SCAN, so it is several calls.
pub const FLEET_TIMEOUT: Duration = Duration::from_secs(5);
/// More heartbeat keys than any fleet has; stops [`fleet`] from reading an unrelated keyspace.
const FLEET_MAX_KEYS: usize = 10_000;
/// Heartbeat text [`fleet`] keeps in all (a heartbeat is about 1 KiB, at most about 48 KiB);
/// the heartbeats past it are counted, not read.
pub const FLEET_BYTES: usize = 16 << 20;
/// Keys a SCAN page asks for: 100 keys of at most ~130 bytes stay far inside a reply's budget.
const SCAN_COUNT: u64 = 100;
/// The longest key a heartbeat can have: the prefix, a host name (at most 253 bytes), `:` and
/// an account name (guard takes at most 256 bytes). A longer key under the prefix is not a
/// heartbeat and is never kept, so the keys [`fleet`] holds are at most
/// [`FLEET_MAX_KEYS`] × this (5.3 MB), whatever a listener answers.
const MAX_HEARTBEAT_KEY: usize = KEY_PREFIX.len() + 253 + 1 + 256;
/// Heartbeats read per round trip.
const GET_BATCH: usize = 50;
/// The most of one heartbeat asked for (`GETRANGE`), so a real Redis never answers past a
/// reply's budget; a longer value reads as invalid JSON and is skipped.
const HEARTBEAT_READ: usize = super::resp::REPLY_BYTES - 64;

/// What was read from the endpoint, and who wrote it when that is not a guard.
#[derive(Debug)]
pub struct Read<T> {
    pub value: T,
    /// The endpoint's listening socket belongs to this account (`mirror::listener`): whatever
    /// was read there is that account's writing, not a guard's report.
    pub written_by: Option<u32>,
}

fn written_by(conn: &Conn, guarded: Option<u32>) -> Option<u32> {
    conn.listener_uid.filter(|&u| super::listener::is_account(u, guarded))
}

fn parse_heartbeat(endpoint: &Endpoint, key: &str, json: &str) -> Result<Heartbeat, MirrorError> {
    serde_json::from_str(json).map_err(|e| MirrorError::MalformedHeartbeat {
        endpoint: endpoint.redacted(),
        key: key.to_owned(),
        reason: e.to_string(),
    })
}

/// The heartbeat of `host`/`user`, `None` when the key is absent (never written, or expired).
/// Connecting and reading share one [`CALL_TIMEOUT`]. `guarded`: that account's uid.
pub async fn read_heartbeat(
    endpoint: &Endpoint,
    host: &str,
    user: &str,
    guarded: Option<u32>,
) -> Result<Read<Option<Heartbeat>>, MirrorError> {
    let deadline = Instant::now() + CALL_TIMEOUT;
    let key = heartbeat_key(host, user);
    let mut conn = connect(endpoint, deadline, guarded).await?;
    let written_by = written_by(&conn, guarded);
    let reply = bounded(endpoint, "GET", deadline, conn.call(&get_range(&key))).await?;
    // GETRANGE answers a missing key with an empty string: no heartbeat is ever empty.
    let raw = reply.into_text().map_err(|e| protocol(endpoint, e))?.filter(|json| !json.is_empty());
    let value = raw.map(|json| parse_heartbeat(endpoint, &key, &json)).transpose()?;
    Ok(Read { value, written_by })
}

/// `GETRANGE key 0 <HEARTBEAT_READ - 1>`: a heartbeat, never more than a reply may take (a
/// missing key reads as an empty string).
fn get_range(key: &str) -> Cmd {
    let mut get = Cmd::new("GETRANGE");
    get.arg(key).arg(0u64).arg(HEARTBEAT_READ as u64 - 1);
    get
}

/// Every heartbeat on an endpoint ([`fleet`]).
#[derive(Debug, Default)]
pub struct Fleet {
    /// Sorted by host and user.
    pub beats: Vec<Heartbeat>,
    /// Heartbeat keys not read: past [`FLEET_BYTES`] of heartbeats read.
    pub unread: usize,
}

/// Every heartbeat on the endpoint, sorted by host and user. Keys under the prefix that are not
/// heartbeats (the stream, other tools' keys, unparsable values) are skipped. Each call is
/// bounded by [`CALL_TIMEOUT`], the whole by [`FLEET_TIMEOUT`], each reply by its budget and all
/// the heartbeats kept by [`FLEET_BYTES`].
pub async fn fleet(endpoint: &Endpoint) -> Result<Read<Fleet>, MirrorError> {
    let end = Instant::now() + FLEET_TIMEOUT;
    let deadline = || end.min(Instant::now() + CALL_TIMEOUT);
    let mut conn = connect(endpoint, deadline(), None).await?;
    let written_by = written_by(&conn, None);
    let mut keys = Vec::new();
    let mut cursor = 0u64;
    loop {
        let mut scan = Cmd::new("SCAN");
        scan.arg(cursor).arg("MATCH").arg(format!("{KEY_PREFIX}*")).arg("COUNT").arg(SCAN_COUNT);
        let reply = bounded(endpoint, "SCAN", deadline(), conn.call(&scan)).await?;
        let (next, batch) = scan_page(reply).map_err(|e| protocol(endpoint, e))?;
        keys.extend(batch.into_iter().filter(|k| k != STREAM_KEY && k.len() <= MAX_HEARTBEAT_KEY));
        cursor = next;
        if cursor == 0 || keys.len() >= FLEET_MAX_KEYS {
            break;
        }
    }
    keys.sort();
    keys.dedup(); // SCAN may return a key twice
    keys.truncate(FLEET_MAX_KEYS);
    let mut fleet = Fleet::default();
    let mut kept = 0usize;
    for (i, chunk) in keys.chunks(GET_BATCH).enumerate() {
        if kept >= FLEET_BYTES {
            fleet.unread = keys.len() - i * GET_BATCH;
            break;
        }
        // A key holding a non-string answers an error, which skips it alone.
        let gets: Vec<Cmd> = chunk.iter().map(|k| get_range(k)).collect();
        let replies = bounded(endpoint, "GETRANGE", deadline(), conn.pipeline_replies(&gets)).await?;
        for json in replies.into_iter().filter_map(|v| v.into_text().ok().flatten()) {
            kept += json.len();
            fleet.beats.extend(serde_json::from_str::<Heartbeat>(&json).ok());
        }
    }
    fleet.beats.sort_by(|a, b| (&a.host, &a.user).cmp(&(&b.host, &b.user)));
    Ok(Read { value: fleet, written_by })
}

/// SCAN's reply: the next cursor and a page of keys.
fn scan_page(reply: Reply) -> Result<(u64, Vec<String>), RespError> {
    let mut parts = reply.into_array()?.into_iter();
    let (Some(cursor), Some(keys), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err(RespError::Protocol("SCAN did not answer a cursor and a page".into()));
    };
    let cursor = cursor.into_text()?.and_then(|c| c.parse().ok());
    let cursor = cursor.ok_or_else(|| RespError::Protocol("SCAN's cursor is not a number".into()))?;
    let keys = keys.into_array()?.into_iter().filter_map(|k| k.into_text().ok().flatten()).collect();
    Ok((cursor, keys))
}

/// A reply of the wrong shape: the server is not the Redis we expect.
fn protocol(endpoint: &Endpoint, e: RespError) -> MirrorError {
    MirrorError::Unreachable { endpoint: endpoint.redacted(), reason: endpoint.scrub(&e.to_string()) }
}

/// The `check` line for the heartbeat of `host`/`user` (docs/operations.md), `None` when it is there.
/// Takes the result of [`read_heartbeat`] on `endpoint`. A key holding invalid JSON is reported
/// as a missing heartbeat with that reason appended; a heartbeat read from a listener an account
/// owns is not taken as one.
pub fn check_lines(
    endpoint: &Endpoint,
    host: &str,
    user: &str,
    result: &Result<Read<Option<Heartbeat>>, MirrorError>,
) -> Option<String> {
    let endpoint = endpoint.redacted();
    match result {
        Ok(Read { written_by: Some(uid), .. }) | Err(MirrorError::AccountListener { uid, .. }) => Some(format!(
            "the swarm Redis at {endpoint} listens as {}, an account, so the fleet heartbeat there was not checked",
            super::listener::account_name(*uid)
        )),
        Ok(Read { value: Some(_), .. }) => None,
        Ok(Read { value: None, .. }) => Some(format!("no heartbeat for {host}:{user} on {endpoint}")),
        Err(MirrorError::MalformedHeartbeat { .. }) => {
            Some(format!("no heartbeat for {host}:{user} on {endpoint} (the key holds invalid JSON)"))
        }
        Err(MirrorError::ReplyRejected { bytes, .. }) => Some(format!(
            "the swarm Redis at {endpoint} answered with a reply of at least {bytes} bytes, over the {} a reply may \
             take, so the fleet heartbeat was not checked",
            super::resp::REPLY_BYTES
        )),
        Err(_) => Some(format!("the swarm Redis at {endpoint} is unreachable, so the fleet heartbeat was not checked")),
    }
}
