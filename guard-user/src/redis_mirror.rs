//! The swarm Redis mirror (SPEC §9): one heartbeat key per guarded account and a shared event
//! stream, written by a background task so that Redis is never on the tick's path.
//!
//! The daemon calls [`Mirror::heartbeat`] and [`Mirror::event`]. Both only replace an in-memory
//! slot or push onto a bounded queue and wake the worker, so a dead or hung Redis can neither
//! delay a tick nor grow memory. The worker owns the one connection, bounds every call (connect
//! included) by [`CALL_TIMEOUT`], reconnects with exponential backoff ([`BACKOFF_INITIAL`] …
//! [`BACKOFF_MAX`]) and reports an outage once through the `warn` callback:
//! `redis_unreachable endpoint=<redacted>` on the first failure, `redis_recovered
//! endpoint=<redacted>` on the first success after it.
//!
//! # Wire format
//! - Heartbeat: `SET agentihooks:host-guard:<host>:<user> <json> EX <ttl>` with the JSON of
//!   [`Heartbeat`]; `last_tick` is unix seconds (UTC), which every consumer can compare without
//!   parsing dates. A TTL below a second is rounded up to one.
//! - Events: `XADD agentihooks:host-guard:events MAXLEN ~ 10000 * host <h> user <u> event <e>
//!   [pid <p>] name <n> [reason <r>] [count <c>] [elapsed <e>] ts <unix seconds>`. Fields with no
//!   value (`None`, or an empty reason) are omitted rather than written empty, so a reader can
//!   tell "no pid" from "pid 0".
//!
//! # Delivery
//! While Redis is away only the latest heartbeat and at most [`EVENT_QUEUE_CAPACITY`] events are
//! kept; when the queue is full the oldest event is dropped and counted ([`Mirror::dropped`]).
//! A batch whose call failed in transport (timeout, refused, reset) is put back and sent again,
//! so an event may reach the stream twice across an outage; a batch the server rejected
//! (e.g. `NOAUTH`, `WRONGTYPE`) is dropped and counted, since resending cannot succeed.
//!
//! Secrets: an [`Endpoint`]'s password never leaves this module. Its `Display` and `Debug`, every
//! warn line and every [`MirrorError`] carry [`Endpoint::redacted`], and error texts from the
//! client library are scrubbed of the password before they are stored.
use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio::time::Instant;

/// The stream every guard appends its FLAGGED-first / KILLED / DRY_RUN / SKIPPED events to.
pub const STREAM_KEY: &str = "agentihooks:host-guard:events";
/// Approximate length the stream is trimmed to (`MAXLEN ~`).
pub const STREAM_MAXLEN: u64 = 10_000;
/// Bound on every single Redis call, connecting included (SPEC §9: ≤ 1 s).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(1);
/// Bound on all of [`fleet`]: it pages through SCAN, so it is several calls.
pub const FLEET_TIMEOUT: Duration = Duration::from_secs(5);
/// Events kept while Redis is slow or away; the oldest is dropped beyond this.
pub const EVENT_QUEUE_CAPACITY: usize = 1024;
/// First wait after a failure; doubled on each further failure up to [`BACKOFF_MAX`].
pub const BACKOFF_INITIAL: Duration = Duration::from_millis(500);
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Endpoint when neither environment variable is set.
pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379/0";

const KEY_PREFIX: &str = "agentihooks:host-guard:";
/// Events per pipelined round trip; keeps one slow call from holding many events in flight.
const EVENT_BATCH: usize = 256;
/// More heartbeat keys than any fleet has; stops [`fleet`] from reading an unrelated keyspace.
const FLEET_MAX_KEYS: usize = 10_000;

/// The heartbeat key of one guarded account.
pub fn heartbeat_key(host: &str, user: &str) -> String {
    format!("{KEY_PREFIX}{host}:{user}")
}

/// Where the swarm Redis is. `url` carries the password, so print [`Endpoint::redacted`] (which
/// `Display` and `Debug` do) and never the field itself.
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub url: String,
}

impl Endpoint {
    pub fn new(url: impl Into<String>) -> Endpoint {
        Endpoint { url: url.into() }
    }

    /// SPEC §9: `AGENTIHOOKS_HIVE_REDIS_URL` unless `AGENTIHOOKS_LEDGER_MODE=local`, then
    /// `AGENTIHOOKS_SWARM_REDIS_URL`, then [`DEFAULT_URL`]. Values are trimmed; an empty value
    /// counts as unset. `local` is compared ignoring case.
    pub fn resolve(env: impl Fn(&str) -> Option<String>) -> Endpoint {
        let get = |name: &str| env(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        let local = get("AGENTIHOOKS_LEDGER_MODE").is_some_and(|m| m.eq_ignore_ascii_case("local"));
        let hive = if local { None } else { get("AGENTIHOOKS_HIVE_REDIS_URL") };
        let url = hive
            .or_else(|| get("AGENTIHOOKS_SWARM_REDIS_URL"))
            .unwrap_or_else(|| DEFAULT_URL.to_owned());
        Endpoint { url }
    }

    /// The URL without credentials: `redis://:secret@h:1/0` → `redis://h:1/0`, and likewise
    /// `user:password@` for `redis://` and `rediss://`, and the `user=`/`pass=` query
    /// parameters of `unix://` and `redis+unix://` socket URLs.
    pub fn redacted(&self) -> String {
        let (scheme, rest) = split_scheme(&self.url);
        let rest = &rest[userinfo_len(scheme, rest)..];
        let rest = strip_secret_params(rest);
        match scheme {
            Some(scheme) => format!("{scheme}://{rest}"),
            None => rest,
        }
    }

    /// The passwords in the URL, raw and percent-decoded, to scrub from library error texts.
    fn secrets(&self) -> Vec<String> {
        let (scheme, rest) = split_scheme(&self.url);
        let mut found = Vec::new();
        let userinfo = rest[..userinfo_len(scheme, rest)].trim_end_matches('@');
        if let Some((_, password)) = userinfo.split_once(':') {
            found.push(password.to_owned());
        }
        if let Some((_, query)) = rest.split_once('?') {
            for pair in query.split(['&', '#']) {
                if let Some((key, value)) = pair.split_once('=') {
                    if is_secret_param(key) {
                        found.push(value.to_owned());
                    }
                }
            }
        }
        let decoded: Vec<String> = found.iter().map(|s| percent_decode(s)).collect();
        found.extend(decoded);
        found.retain(|s| !s.is_empty());
        // Longest first, so a secret that contains another is replaced whole.
        found.sort_by_key(|s| std::cmp::Reverse(s.len()));
        found
    }

    /// `text` with every password of this endpoint replaced by `***`.
    fn scrub(&self, text: &str) -> String {
        self.secrets()
            .iter()
            .fold(text.to_owned(), |t, s| t.replace(s.as_str(), "***"))
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Endpoint").field(&self.redacted()).finish()
    }
}

fn split_scheme(url: &str) -> (Option<&str>, &str) {
    match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    }
}

fn is_unix_scheme(scheme: Option<&str>) -> bool {
    scheme.is_some_and(|s| s.eq_ignore_ascii_case("unix") || s.eq_ignore_ascii_case("redis+unix"))
}

/// Length of `user:password@` at the start of `rest` (0 when there is none).
fn userinfo_len(scheme: Option<&str>, rest: &str) -> usize {
    let searched = if is_unix_scheme(scheme) {
        // A socket path may contain '@'; credentials can only sit before the path's first '/'.
        &rest[..rest.find('/').unwrap_or(rest.len())]
    } else {
        // Host, port, db number and query never contain '@', so the last one ends the
        // credentials even when a hand-written password holds a raw '/', '?' or '#'.
        rest
    };
    searched.rfind('@').map_or(0, |at| at + 1)
}

fn is_secret_param(key: &str) -> bool {
    ["pass", "password", "user", "username"]
        .iter()
        .any(|k| key.eq_ignore_ascii_case(k))
}

/// `rest` without `user=`/`pass=` query parameters (redis-rs reads them for socket URLs).
fn strip_secret_params(rest: &str) -> String {
    let Some((before, query)) = rest.split_once('?') else {
        return rest.to_owned();
    };
    let (query, fragment) = match query.split_once('#') {
        Some((q, f)) => (q, Some(f)),
        None => (query, None),
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| !is_secret_param(pair.split_once('=').map_or(*pair, |(k, _)| k)))
        .collect();
    let mut out = before.to_owned();
    if !kept.is_empty() && kept != [""] {
        out.push('?');
        out.push_str(&kept.join("&"));
    }
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(fragment);
    }
    out
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What one guard publishes every tick (SPEC §9). Missing fields read as their defaults, so a
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
    /// Names at or over the threshold at that tick.
    pub flagged: Vec<String>,
    /// KILLED lines since the daemon started.
    pub kills: u64,
    pub lost_events: u64,
    pub resyncs: u64,
    /// The tick interval, so a reader can judge how stale `last_tick` is.
    pub interval_secs: u64,
}

/// One stream entry; mirrors a FLAGGED (first tick only), KILLED, DRY_RUN or SKIPPED log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamEvent {
    /// `FLAGGED`, `KILLED`, `DRY_RUN` or `SKIPPED`.
    pub event: String,
    pub pid: Option<u32>,
    pub name: String,
    /// `ghost_detected`, `excluded_command`, `identity_changed`; empty for FLAGGED.
    pub reason: String,
    pub count: Option<u64>,
    /// As in the log line, e.g. `1.5h`.
    pub elapsed: Option<String>,
    /// Unix seconds.
    pub ts: i64,
}

/// Why a Redis operation failed. Every message names the redacted endpoint and never a password.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error("the swarm Redis URL {endpoint} is not usable: {reason}")]
    InvalidEndpoint { endpoint: String, reason: String },
    #[error("the swarm Redis at {endpoint} did not answer {what} within 1s")]
    Timeout { endpoint: String, what: &'static str },
    #[error("the swarm Redis at {endpoint} is unreachable: {reason}")]
    Unreachable { endpoint: String, reason: String },
    #[error("the swarm Redis at {endpoint} rejected {what}: {reason}")]
    Rejected {
        endpoint: String,
        what: &'static str,
        reason: String,
    },
    #[error("the heartbeat {key} on {endpoint} is not valid JSON: {reason}")]
    MalformedHeartbeat {
        endpoint: String,
        key: String,
        reason: String,
    },
}

impl MirrorError {
    fn from_redis(endpoint: &Endpoint, what: &'static str, err: &redis::RedisError) -> MirrorError {
        use redis::ErrorKind;
        let reason = endpoint.scrub(&err.to_string());
        let endpoint = endpoint.redacted();
        if err.kind() == ErrorKind::InvalidClientConfig {
            MirrorError::InvalidEndpoint { endpoint, reason }
        } else if err.is_timeout() {
            // The library's own timeout (set to the same bound) can fire just before ours.
            MirrorError::Timeout { endpoint, what }
        } else if err.is_io_error()
            || err.is_connection_refusal()
            || err.is_connection_dropped()
            || err.kind() == ErrorKind::AuthenticationFailed
        {
            MirrorError::Unreachable { endpoint, reason }
        } else {
            MirrorError::Rejected { endpoint, what, reason }
        }
    }

    /// Whether the work of the failed call is worth sending again once Redis answers.
    fn is_transient(&self) -> bool {
        matches!(self, MirrorError::Timeout { .. } | MirrorError::Unreachable { .. })
    }
}

/// Runs one Redis call, bounded by `deadline`.
async fn bounded<T>(
    endpoint: &Endpoint,
    what: &'static str,
    deadline: Instant,
    call: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, MirrorError> {
    match tokio::time::timeout_at(deadline, call).await {
        Ok(result) => result.map_err(|e| MirrorError::from_redis(endpoint, what, &e)),
        Err(_) => Err(MirrorError::Timeout {
            endpoint: endpoint.redacted(),
            what,
        }),
    }
}

async fn connect(endpoint: &Endpoint, deadline: Instant) -> Result<MultiplexedConnection, MirrorError> {
    let client =
        redis::Client::open(endpoint.url.as_str()).map_err(|e| MirrorError::from_redis(endpoint, "connect", &e))?;
    // The library's own timeouts back up ours, so a call it abandons does not linger inside.
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(CALL_TIMEOUT)
        .set_response_timeout(CALL_TIMEOUT);
    bounded(
        endpoint,
        "connect",
        deadline,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
}

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
    let mut get = redis::cmd("GET");
    get.arg(&key);
    let raw: Option<String> = bounded(endpoint, "GET", deadline, get.query_async(&mut conn)).await?;
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
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(format!("{KEY_PREFIX}*"))
            .arg("COUNT")
            .arg(1000);
        let (next, batch): (u64, Vec<String>) =
            bounded(endpoint, "SCAN", deadline(), scan.query_async(&mut conn)).await?;
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
        let mut mget = redis::cmd("MGET");
        mget.arg(chunk);
        let values: Vec<Option<String>> = bounded(endpoint, "MGET", deadline(), mget.query_async(&mut conn)).await?;
        beats.extend(
            values
                .iter()
                .flatten()
                .filter_map(|json| serde_json::from_str::<Heartbeat>(json).ok()),
        );
    }
    beats.sort_by(|a, b| (&a.host, &a.user).cmp(&(&b.host, &b.user)));
    Ok(beats)
}

/// An aligned table of heartbeats: host, user, age of the last tick, backend, flagged names,
/// kills. Columns are separated by at least two spaces; no line has trailing spaces.
pub fn fleet_table(hbs: &[Heartbeat], now: SystemTime) -> String {
    let now_secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut rows = vec![["HOST", "USER", "LAST TICK", "BACKEND", "FLAGGED", "KILLS"].map(String::from)];
    for hb in hbs {
        let flagged = if hb.flagged.is_empty() {
            "-".to_owned()
        } else {
            hb.flagged.join(",")
        };
        let backend = if hb.dry_run {
            format!("{} (dry run)", hb.backend)
        } else {
            hb.backend.clone()
        };
        rows.push([
            hb.host.clone(),
            hb.user.clone(),
            format!("{} ago", age(now_secs.saturating_sub(hb.last_tick))),
            backend,
            flagged,
            hb.kills.to_string(),
        ]);
    }
    let mut widths = [0usize; 6];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            line.push_str(cell);
            if i + 1 < row.len() {
                line.extend(std::iter::repeat_n(' ', widths[i] - cell.chars().count() + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn age(secs: u64) -> String {
    match secs {
        0..120 => format!("{secs}s"),
        120..7200 => format!("{}m", secs / 60),
        7200..172_800 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}

/// The `check` line for the heartbeat of `host`/`user` (SPEC §9), `None` when it is there.
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
        Err(MirrorError::MalformedHeartbeat { .. }) => Some(format!(
            "no heartbeat for {host}:{user} on {endpoint} (the key holds invalid JSON)"
        )),
        Err(_) => Some(format!(
            "the swarm Redis at {endpoint} is unreachable, so the fleet heartbeat was not checked"
        )),
    }
}

/// What waits to be sent. Held under a std mutex for a few instructions at a time and never
/// across an await, so callers never wait on Redis.
#[derive(Default)]
struct Outbox {
    /// Only the latest heartbeat matters: it supersedes every earlier one.
    heartbeat: Option<(Heartbeat, Duration)>,
    events: VecDeque<StreamEvent>,
    /// Set when the last [`Mirror`] handle is dropped; the worker then sends what it can and ends.
    closed: bool,
}

struct Shared {
    outbox: Mutex<Outbox>,
    /// Woken on every heartbeat/event and on close.
    work: Notify,
    /// Woken on close only, so a backoff sleep ends early then but not on every event.
    closing: Notify,
    dropped: AtomicU64,
}

impl Shared {
    fn outbox(&self) -> MutexGuard<'_, Outbox> {
        // A panic while holding the lock leaves plain data behind; keep using it.
        self.outbox.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn take_heartbeat(&self) -> Option<(Heartbeat, Duration)> {
        self.outbox().heartbeat.take()
    }

    /// Puts a heartbeat back after a failed call unless a newer one arrived meanwhile.
    fn restore_heartbeat(&self, hb: (Heartbeat, Duration)) {
        self.outbox().heartbeat.get_or_insert(hb);
    }

    fn take_events(&self, max: usize) -> Vec<StreamEvent> {
        let mut outbox = self.outbox();
        let n = outbox.events.len().min(max);
        outbox.events.drain(..n).collect()
    }

    /// Puts a failed batch back in front of newer events, dropping the oldest beyond capacity.
    fn restore_events(&self, batch: Vec<StreamEvent>) {
        let mut outbox = self.outbox();
        for ev in batch.into_iter().rev() {
            outbox.events.push_front(ev);
        }
        let excess = outbox.events.len().saturating_sub(EVENT_QUEUE_CAPACITY);
        outbox.events.drain(..excess);
        self.dropped.fetch_add(excess as u64, Ordering::Relaxed);
    }

    fn is_closed(&self) -> bool {
        self.outbox().closed
    }
}

/// The daemon's handle on the mirror. Cheap to clone; the worker ends after the last clone is
/// dropped (once it has tried to send what was queued).
#[derive(Clone)]
pub struct Mirror {
    handle: Arc<Handle>,
}

/// Exists once per mirror so that its `Drop` runs when the last [`Mirror`] clone goes.
struct Handle {
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shared.outbox().closed = true;
        self.shared.work.notify_one();
        self.shared.closing.notify_one();
    }
}

impl Mirror {
    /// Starts the worker on the current tokio runtime (panics outside one, like `tokio::spawn`).
    /// `warn` receives the text of a `WARN` line without the `WARN ` prefix.
    pub fn spawn(endpoint: Endpoint, host: String, user: String, warn: Arc<dyn Fn(String) + Send + Sync>) -> Mirror {
        let shared = Arc::new(Shared {
            outbox: Mutex::new(Outbox::default()),
            work: Notify::new(),
            closing: Notify::new(),
            dropped: AtomicU64::new(0),
        });
        let worker = Worker {
            key: heartbeat_key(&host, &user),
            endpoint,
            host,
            user,
            shared: Arc::clone(&shared),
            warn,
            conn: None,
            in_outage: false,
            backoff: BACKOFF_INITIAL,
        };
        tokio::spawn(worker.run());
        Mirror {
            handle: Arc::new(Handle { shared }),
        }
    }

    /// Replaces the pending heartbeat; it is written with `EX ttl`. Never waits on Redis.
    pub fn heartbeat(&self, hb: Heartbeat, ttl: Duration) {
        let shared = &self.handle.shared;
        shared.outbox().heartbeat = Some((hb, ttl));
        shared.work.notify_one();
    }

    /// Queues a stream entry, dropping (and counting) the oldest queued one when the queue holds
    /// [`EVENT_QUEUE_CAPACITY`]. Never waits on Redis.
    pub fn event(&self, ev: StreamEvent) {
        let shared = &self.handle.shared;
        {
            let mut outbox = shared.outbox();
            if outbox.events.len() >= EVENT_QUEUE_CAPACITY {
                outbox.events.pop_front();
                shared.dropped.fetch_add(1, Ordering::Relaxed);
            }
            outbox.events.push_back(ev);
        }
        shared.work.notify_one();
    }

    /// Events dropped so far: pushed out of a full queue, or rejected by the server.
    pub fn dropped(&self) -> u64 {
        self.handle.shared.dropped.load(Ordering::Relaxed)
    }

    /// Events waiting to be sent (at most [`EVENT_QUEUE_CAPACITY`]).
    pub fn pending_events(&self) -> usize {
        self.handle.shared.outbox().events.len()
    }
}

/// The background task: the only place that talks to Redis on the mirror's behalf.
struct Worker {
    endpoint: Endpoint,
    host: String,
    user: String,
    key: String,
    shared: Arc<Shared>,
    warn: Arc<dyn Fn(String) + Send + Sync>,
    /// Dropped after any failure, so a hung or half-closed connection is never reused.
    conn: Option<MultiplexedConnection>,
    /// Between the `redis_unreachable` warning and the next success.
    in_outage: bool,
    /// Wait before the next attempt after a failure.
    backoff: Duration,
}

impl Worker {
    async fn run(mut self) {
        while self.wait_for_work().await {
            match self.deliver_once().await {
                Ok(()) => {
                    if self.in_outage {
                        self.in_outage = false;
                        (self.warn)(format!("redis_recovered endpoint={}", self.endpoint.redacted()));
                    }
                    self.backoff = BACKOFF_INITIAL;
                }
                Err(err) => {
                    self.conn = None;
                    if let MirrorError::InvalidEndpoint { .. } = err {
                        // Retrying cannot help: say so once and discard from now on.
                        (self.warn)(format!("redis_endpoint_invalid endpoint={}", self.endpoint.redacted()));
                        return self.discard_forever().await;
                    }
                    if !self.in_outage {
                        self.in_outage = true;
                        (self.warn)(format!("redis_unreachable endpoint={}", self.endpoint.redacted()));
                    }
                    if self.shared.is_closed() {
                        return;
                    }
                    tokio::select! {
                        () = tokio::time::sleep(self.backoff) => {}
                        () = self.shared.closing.notified() => {}
                    }
                    self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }

    /// Waits until something is queued; false once the mirror is closed and nothing is left.
    async fn wait_for_work(&self) -> bool {
        loop {
            {
                let outbox = self.shared.outbox();
                if outbox.heartbeat.is_some() || !outbox.events.is_empty() {
                    return true;
                }
                if outbox.closed {
                    return false;
                }
            }
            // notify_one stores a permit when nobody waits, so a wake-up between the check
            // above and this await is not lost.
            self.shared.work.notified().await;
        }
    }

    /// Sends the pending heartbeat and one batch of events, connecting first if needed.
    async fn deliver_once(&mut self) -> Result<(), MirrorError> {
        let conn = match &mut self.conn {
            Some(conn) => conn,
            None => self
                .conn
                .insert(connect(&self.endpoint, Instant::now() + CALL_TIMEOUT).await?),
        };
        if let Some((hb, ttl)) = self.shared.take_heartbeat() {
            let json = serde_json::to_string(&hb).expect("a heartbeat always serializes");
            let mut set = redis::cmd("SET");
            set.arg(&self.key)
                .arg(json)
                .arg("EX")
                .arg(ttl.as_secs_f64().ceil().max(1.0) as u64);
            let deadline = Instant::now() + CALL_TIMEOUT;
            if let Err(err) = bounded(&self.endpoint, "SET", deadline, set.query_async::<()>(conn)).await {
                if err.is_transient() {
                    self.shared.restore_heartbeat((hb, ttl));
                }
                return Err(err);
            }
        }
        let batch = self.shared.take_events(EVENT_BATCH);
        if !batch.is_empty() {
            let mut pipe = redis::pipe();
            for ev in &batch {
                pipe.add_command(xadd(&self.host, &self.user, ev)).ignore();
            }
            let deadline = Instant::now() + CALL_TIMEOUT;
            if let Err(err) = bounded(&self.endpoint, "XADD", deadline, pipe.query_async::<()>(conn)).await {
                if err.is_transient() {
                    self.shared.restore_events(batch);
                } else {
                    self.shared.dropped.fetch_add(batch.len() as u64, Ordering::Relaxed);
                }
                return Err(err);
            }
        }
        Ok(())
    }

    /// After an unusable endpoint: keep the queue empty so callers stay cheap, count the drops.
    async fn discard_forever(self) {
        while self.wait_for_work().await {
            let mut outbox = self.shared.outbox();
            outbox.heartbeat = None;
            self.shared
                .dropped
                .fetch_add(outbox.events.len() as u64, Ordering::Relaxed);
            outbox.events.clear();
        }
    }
}

fn xadd(host: &str, user: &str, ev: &StreamEvent) -> redis::Cmd {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(STREAM_KEY).arg("MAXLEN").arg("~").arg(STREAM_MAXLEN).arg("*");
    cmd.arg("host")
        .arg(host)
        .arg("user")
        .arg(user)
        .arg("event")
        .arg(&ev.event);
    if let Some(pid) = ev.pid {
        cmd.arg("pid").arg(pid);
    }
    cmd.arg("name").arg(&ev.name);
    if !ev.reason.is_empty() {
        cmd.arg("reason").arg(&ev.reason);
    }
    if let Some(count) = ev.count {
        cmd.arg("count").arg(count);
    }
    if let Some(elapsed) = &ev.elapsed {
        cmd.arg("elapsed").arg(elapsed);
    }
    cmd.arg("ts").arg(ev.ts);
    cmd
}
