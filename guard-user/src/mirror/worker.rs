//! The mirror's writer: a background task that owns the one connection and sends the latest
//! heartbeat and the queued events, so Redis is never on the tick's path.
//!
//! [`Mirror::heartbeat`] and [`Mirror::event`] only replace an in-memory slot or push onto a
//! bounded queue and wake the worker, so a dead or hung Redis can neither delay a tick nor grow
//! memory. The worker bounds every call (connect included) by [`CALL_TIMEOUT`], reconnects with
//! exponential backoff ([`BACKOFF_INITIAL`] … [`BACKOFF_MAX`]) and reports an outage once through
//! the `warn` callback: `redis_unreachable endpoint=<redacted>` on the first failure,
//! `redis_recovered endpoint=<redacted>` on the first success after it. Each is a typed
//! [`Notice`] with the endpoint as a field, so the log escapes it like any value.
//!
//! A reply over its budget (`resp::REPLY_BYTES`) closes the connection and is an outage of its
//! own: `redis_reply_rejected endpoint=<redacted> bytes=<n>` once per outage, in place of
//! `redis_unreachable`. A listening socket that belongs to an account (`mirror::listener`) is
//! said once per run, `redis_listener_owned_by_account endpoint=<redacted> uid=<uid>`; the
//! mirror goes on writing there unless the URL has a password, which is never sent there (that
//! is then an outage, retried, since the real Redis may come back on the port).
//!
//! While Redis is away only the latest heartbeat and at most [`EVENT_QUEUE_CAPACITY`] events are
//! kept; when the queue is full the oldest event is dropped and counted ([`Mirror::dropped`]).
//! A batch whose call failed in transport (timeout, refused, reset) is put back and sent again,
//! so an event may reach the stream twice across an outage; a batch the server rejected
//! (e.g. `NOAUTH`, `WRONGTYPE`) is dropped and counted, since resending cannot succeed.
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::call::{bounded, connect, MirrorError, CALL_TIMEOUT};
use super::conn::Conn;
use super::wire::{heartbeat_key, set_heartbeat, xadd, Heartbeat, StreamEvent};
use super::Endpoint;
use crate::log::{Notice, What};

/// Events kept while Redis is slow or away; the oldest is dropped beyond this.
pub const EVENT_QUEUE_CAPACITY: usize = 1024;
/// First wait after a failure; doubled on each further failure up to [`BACKOFF_MAX`].
pub const BACKOFF_INITIAL: Duration = Duration::from_millis(500);
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Events per pipelined round trip; keeps one slow call from holding many events in flight.
const EVENT_BATCH: usize = 256;

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
    /// `warn` receives what a `WARN` line says (its event word and typed fields).
    /// `guarded`: the daemon's account, whose listening socket on the endpoint is an account's
    /// whatever its uid (`mirror::listener::is_account`).
    pub fn spawn(
        endpoint: Endpoint,
        host: String,
        user: String,
        guarded: Option<u32>,
        warn: Arc<dyn Fn(Notice) + Send + Sync>,
    ) -> Mirror {
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
            guarded,
            owner_warned: false,
        };
        tokio::spawn(worker.run());
        Mirror { handle: Arc::new(Handle { shared }) }
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
    #[cfg(any(test, feature = "testing"))]
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
    warn: Arc<dyn Fn(Notice) + Send + Sync>,
    /// Dropped after any failure, so a hung or half-closed connection is never reused.
    conn: Option<Conn>,
    /// Between the `redis_unreachable` warning and the next success.
    in_outage: bool,
    /// Wait before the next attempt after a failure.
    backoff: Duration,
    /// The guarded account (see [`Mirror::spawn`]).
    guarded: Option<u32>,
    /// `redis_listener_owned_by_account` was said (once per run).
    owner_warned: bool,
}

impl Worker {
    async fn run(mut self) {
        while self.wait_for_work().await {
            match self.deliver_once().await {
                Ok(()) => {
                    if self.in_outage {
                        self.in_outage = false;
                        (self.warn)(self.notice(What::RedisRecovered));
                    }
                    self.backoff = BACKOFF_INITIAL;
                }
                Err(err) => {
                    self.conn = None;
                    if let MirrorError::InvalidEndpoint { .. } = err {
                        // Retrying cannot help: say so once and discard from now on.
                        (self.warn)(self.notice(What::RedisEndpointInvalid));
                        return self.discard_forever().await;
                    }
                    match &err {
                        MirrorError::AccountListener { uid, .. } => {
                            self.listener_is_an_account(*uid);
                            self.in_outage = true;
                        }
                        MirrorError::ReplyRejected { bytes, .. } if !self.in_outage => {
                            self.in_outage = true;
                            (self.warn)(self.notice(What::RedisReplyRejected).with("bytes", *bytes));
                        }
                        _ if !self.in_outage => {
                            self.in_outage = true;
                            (self.warn)(self.notice(What::RedisUnreachable));
                        }
                        _ => {}
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

    /// A warning about this endpoint: `what endpoint=<redacted>`, the endpoint a typed field so
    /// the log escapes it like any value (an operator's URL or socket path can hold a quote, a
    /// newline or `key=value` text).
    fn notice(&self, what: What) -> Notice {
        Notice::new(what).with("endpoint", self.endpoint.redacted())
    }

    /// `redis_listener_owned_by_account`, once per run.
    fn listener_is_an_account(&mut self, uid: u32) {
        if !self.owner_warned {
            self.owner_warned = true;
            (self.warn)(self.notice(What::RedisListenerOwnedByAccount).with("uid", uid));
        }
    }

    /// Sends the pending heartbeat and one batch of events, connecting first if needed.
    async fn deliver_once(&mut self) -> Result<(), MirrorError> {
        if self.conn.is_none() {
            let conn = connect(&self.endpoint, Instant::now() + CALL_TIMEOUT, self.guarded).await?;
            if let Some(uid) = conn.listener_uid.filter(|&u| super::listener::is_account(u, self.guarded)) {
                self.listener_is_an_account(uid);
            }
            self.conn = Some(conn);
        }
        let conn = self.conn.as_mut().expect("connected above");
        if let Some((hb, ttl)) = self.shared.take_heartbeat() {
            let set = set_heartbeat(&self.key, &hb, ttl);
            let deadline = Instant::now() + CALL_TIMEOUT;
            if let Err(err) = bounded(&self.endpoint, "SET", deadline, conn.call(&set)).await {
                if err.is_transient() {
                    self.shared.restore_heartbeat((hb, ttl));
                }
                return Err(err);
            }
        }
        let batch = self.shared.take_events(EVENT_BATCH);
        if !batch.is_empty() {
            let cmds: Vec<_> = batch.iter().map(|ev| xadd(&self.host, &self.user, ev)).collect();
            let deadline = Instant::now() + CALL_TIMEOUT;
            if let Err(err) = bounded(&self.endpoint, "XADD", deadline, conn.pipeline(&cmds)).await {
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
            self.shared.dropped.fetch_add(outbox.events.len() as u64, Ordering::Relaxed);
            outbox.events.clear();
        }
    }
}
