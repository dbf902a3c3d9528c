//! The read side: one account's heartbeat (for `check`) and every heartbeat on the endpoint (for
//! `status --fleet`). Each call is bounded like the writer's; nothing here is on the daemon's path.
use std::time::Duration;

use tokio::time::Instant;

use super::call::{bounded, connect, MirrorError, CALL_TIMEOUT};
use super::resp::{Cmd, Reply, RespError};
use super::wire::{heartbeat_key, Heartbeat, KEY_PREFIX, STREAM_KEY};
use super::Endpoint;

/// Bound on all of [`fleet`]: it pages through SCAN, so it is several calls.
pub const FLEET_TIMEOUT: Duration = Duration::from_secs(5);
/// More heartbeat keys than any fleet has; stops [`fleet`] from reading an unrelated keyspace.
const FLEET_MAX_KEYS: usize = 10_000;

fn parse_heartbeat(endpoint: &Endpoint, key: &str, json: &str) -> Result<Heartbeat, MirrorError> {
    serde_json::from_str(json).map_err(|e| MirrorError::MalformedHeartbeat {
        endpoint: endpoint.redacted(),
        key: key.to_owned(),
        reason: e.to_string(),
    })
}

/// The heartbeat of `host`/`user`, `None` when the key is absent (never written, or expired).
/// Connecting and reading share one [`CALL_TIMEOUT`].
pub async fn read_heartbeat(endpoint: &Endpoint, host: &str, user: &str) -> Result<Option<Heartbeat>, MirrorError> {
    let deadline = Instant::now() + CALL_TIMEOUT;
    let key = heartbeat_key(host, user);
    let mut conn = connect(endpoint, deadline).await?;
    let mut get = Cmd::new("GET");
    get.arg(&key);
    let reply = bounded(endpoint, "GET", deadline, conn.call(&get)).await?;
    let raw = reply.into_text().map_err(|e| protocol(endpoint, e))?;
    raw.map(|json| parse_heartbeat(endpoint, &key, &json)).transpose()
}

/// Every heartbeat on the endpoint, sorted by host and user. Keys under the prefix that are not
/// heartbeats (the stream, other tools' keys, unparsable values) are skipped. Each call is
/// bounded by [`CALL_TIMEOUT`] and the whole by [`FLEET_TIMEOUT`].
pub async fn fleet(endpoint: &Endpoint) -> Result<Vec<Heartbeat>, MirrorError> {
    let end = Instant::now() + FLEET_TIMEOUT;
    let deadline = || end.min(Instant::now() + CALL_TIMEOUT);
    let mut conn = connect(endpoint, deadline()).await?;
    let mut keys = Vec::new();
    let mut cursor = 0u64;
    loop {
        let mut scan = Cmd::new("SCAN");
        scan.arg(cursor).arg("MATCH").arg(format!("{KEY_PREFIX}*")).arg("COUNT").arg(1000u64);
        let reply = bounded(endpoint, "SCAN", deadline(), conn.call(&scan)).await?;
        let (next, batch) = scan_page(reply).map_err(|e| protocol(endpoint, e))?;
        keys.extend(batch.into_iter().filter(|k| k != STREAM_KEY));
        cursor = next;
        if cursor == 0 || keys.len() >= FLEET_MAX_KEYS {
            break;
        }
    }
    keys.sort();
    keys.dedup(); // SCAN may return a key twice
    keys.truncate(FLEET_MAX_KEYS);
    let mut beats = Vec::new();
    for chunk in keys.chunks(500) {
        // MGET answers nil for a key holding a non-string, so a stray non-heartbeat key is harmless.
        let mut mget = Cmd::new("MGET");
        for key in chunk {
            mget.arg(key);
        }
        let reply = bounded(endpoint, "MGET", deadline(), conn.call(&mget)).await?;
        let values = reply.into_array().map_err(|e| protocol(endpoint, e))?;
        let texts = values.into_iter().filter_map(|v| v.into_text().ok().flatten());
        beats.extend(texts.filter_map(|json| serde_json::from_str::<Heartbeat>(&json).ok()));
    }
    beats.sort_by(|a, b| (&a.host, &a.user).cmp(&(&b.host, &b.user)));
    Ok(beats)
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
/// as a missing heartbeat with that reason appended.
pub fn check_lines(
    endpoint: &Endpoint,
    host: &str,
    user: &str,
    result: &Result<Option<Heartbeat>, MirrorError>,
) -> Option<String> {
    let endpoint = endpoint.redacted();
    match result {
        Ok(Some(_)) => None,
        Ok(None) => Some(format!("no heartbeat for {host}:{user} on {endpoint}")),
        Err(MirrorError::MalformedHeartbeat { .. }) => {
            Some(format!("no heartbeat for {host}:{user} on {endpoint} (the key holds invalid JSON)"))
        }
        Err(_) => Some(format!("the swarm Redis at {endpoint} is unreachable, so the fleet heartbeat was not checked")),
    }
}
