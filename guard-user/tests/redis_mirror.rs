//! The swarm Redis mirror against a real `redis-server` (docs/operations.md).
//!
//! Each test starts its own server (redis_harness/) on a free loopback port (never 6379) in a
//! temp directory, with persistence off, and a `RedisServer` guard kills it on drop. Without a
//! `redis-server` binary the server tests print why and pass without checking anything
//! (`cargo xtask test` installs one). Waits poll for the state they need with generous bounds;
//! nothing asserts how long a call took.
use guard_test::guard_test;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use guard::cmd::fleet::fleet_table;
use guard::mirror::{
    check_lines, fleet, heartbeat_key, read_heartbeat, Endpoint, Heartbeat, Mirror, MirrorError, StreamEvent,
    EVENT_QUEUE_CAPACITY, STREAM_KEY,
};
use redis::aio::MultiplexedConnection;

mod redis_harness;
use redis_harness::{capture_warnings, free_port, wait_for, warnings, HungServer, RedisServer};

const SECRET: &str = "secret";

/// One account's heartbeat as `check` reads it, without who wrote it (a redis-server here).
async fn beat(endpoint: &Endpoint, user: &str) -> Result<Option<Heartbeat>, MirrorError> {
    read_heartbeat(endpoint, "box1", user, None).await.map(|r| r.value)
}

/// Every heartbeat as `status --fleet` reads them.
async fn listed(endpoint: &Endpoint) -> Result<Vec<Heartbeat>, MirrorError> {
    fleet(endpoint).await.map(|r| r.value.beats)
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn heartbeat(user: &str, pid: u32) -> Heartbeat {
    Heartbeat {
        host: "box1".into(),
        user: user.into(),
        home: format!("/home/{user}"),
        pid,
        version: guard::VERSION.into(),
        backend: "ebpf".into(),
        dry_run: false,
        last_tick: now_secs(),
        flagged: vec!["sleep".into()],
        flagged_omitted: 0,
        kills: 3,
        kills_by_reason: guard::status::KillsByReason { ghost_detected: 3, leftover: 0 },
        lost_events: 1,
        resyncs: 2,
        interval_secs: 60,
        config_error: None,
        sessions: None,
        slots: None,
    }
}

fn killed(pid: u32, count: u64) -> StreamEvent {
    StreamEvent {
        event: "KILLED".into(),
        pid: Some(pid),
        name: Some("sleep".into()),
        reason: "ghost_detected".into(),
        count: Some(count),
        elapsed_secs: Some(3600),
        ts: 1_700_000_000,
        extra: Vec::new(),
    }
}

async fn stream_entries(conn: &mut MultiplexedConnection) -> Vec<HashMap<String, String>> {
    let entries: Vec<(String, HashMap<String, String>)> =
        redis::cmd("XRANGE").arg(STREAM_KEY).arg("-").arg("+").query_async(conn).await.expect("XRANGE");
    entries.into_iter().map(|(_, fields)| fields).collect()
}

async fn xlen(conn: &mut MultiplexedConnection) -> u64 {
    redis::cmd("XLEN").arg(STREAM_KEY).query_async(conn).await.expect("XLEN")
}

#[guard_test(needs = [redis], multi_thread)]
async fn heartbeat_is_written_with_its_ttl_and_expires() {
    let server = RedisServer::start(None);
    let endpoint = server.endpoint();
    let (warn, warned) = capture_warnings();
    let mirror = Mirror::spawn(endpoint.clone(), "box1".into(), "alice".into(), None, warn);
    let hb = heartbeat("alice", 4242);
    mirror.heartbeat(hb.clone(), Duration::from_secs(2));

    wait_for(Duration::from_secs(10), "the heartbeat", || async {
        matches!(beat(&endpoint, "alice").await, Ok(Some(_)))
    })
    .await;
    let read = beat(&endpoint, "alice").await.expect("read the heartbeat");
    assert_eq!(read.as_ref(), Some(&hb));
    assert_eq!(
        check_lines(&endpoint, "box1", "alice", &Ok(guard::mirror::query::Read { value: read, written_by: None })),
        None
    );

    let mut conn = server.conn().await;
    let ttl: i64 = redis::cmd("TTL").arg(heartbeat_key("box1", "alice")).query_async(&mut conn).await.unwrap();
    assert!((1..=2).contains(&ttl), "TTL {ttl}");
    let json: String = redis::cmd("GET").arg(heartbeat_key("box1", "alice")).query_async(&mut conn).await.unwrap();
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    for field in [
        "host",
        "user",
        "home",
        "pid",
        "version",
        "backend",
        "dry_run",
        "last_tick",
        "flagged",
        "kills",
        "lost_events",
        "resyncs",
        "interval_secs",
        "config_error",
    ] {
        assert!(value.get(field).is_some(), "heartbeat JSON lacks {field}: {json}");
    }
    assert!(value["last_tick"].is_u64(), "last_tick is unix seconds: {json}");

    wait_for(Duration::from_secs(6), "the heartbeat to expire", || async {
        matches!(beat(&endpoint, "alice").await, Ok(None))
    })
    .await;
    let missing = read_heartbeat(&endpoint, "box1", "alice", None).await;
    assert_eq!(
        check_lines(&endpoint, "box1", "alice", &missing),
        Some(format!("no heartbeat for box1:alice on redis://127.0.0.1:{}/0", server.port))
    );
    assert_eq!(beat(&endpoint, "bob").await.unwrap(), None);
    assert!(warnings(&warned).is_empty(), "{:?}", warnings(&warned));
}

#[guard_test(needs = [redis], multi_thread)]
async fn events_reach_the_stream_with_their_fields() {
    let server = RedisServer::start(None);
    let (warn, warned) = capture_warnings();
    let mirror = Mirror::spawn(server.endpoint(), "box1".into(), "alice".into(), None, warn);
    mirror.event(StreamEvent {
        event: "FLAGGED".into(),
        pid: None,
        name: Some("sleep".into()),
        reason: String::new(),
        count: Some(31),
        elapsed_secs: None,
        ts: 1_700_000_000,
        extra: Vec::new(),
    });
    mirror.event(killed(777, 31));
    mirror.event(StreamEvent {
        event: "SKIPPED".into(),
        pid: Some(778),
        name: Some("sleep".into()),
        reason: "excluded_command".into(),
        count: None,
        elapsed_secs: None,
        ts: 1_700_000_001,
        extra: Vec::new(),
    });

    let mut conn = server.conn().await;
    wait_for(Duration::from_secs(10), "three stream entries", || {
        let mut conn = conn.clone();
        async move { xlen(&mut conn).await == 3 }
    })
    .await;
    let entries = stream_entries(&mut conn).await;
    let fields = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let expected: Vec<HashMap<String, String>> = vec![
        fields(&[
            ("host", "box1"),
            ("user", "alice"),
            ("event", "FLAGGED"),
            ("name", "sleep"),
            ("count", "31"),
            ("ts_unix", "1700000000"),
        ]),
        fields(&[
            ("host", "box1"),
            ("user", "alice"),
            ("event", "KILLED"),
            ("pid", "777"),
            ("name", "sleep"),
            ("reason", "ghost_detected"),
            ("count", "31"),
            ("elapsed_secs", "3600"),
            ("ts_unix", "1700000000"),
        ]),
        fields(&[
            ("host", "box1"),
            ("user", "alice"),
            ("event", "SKIPPED"),
            ("pid", "778"),
            ("name", "sleep"),
            ("reason", "excluded_command"),
            ("ts_unix", "1700000001"),
        ]),
    ];
    assert_eq!(entries, expected);
    assert_eq!(mirror.dropped(), 0);
    assert!(warnings(&warned).is_empty(), "{:?}", warnings(&warned));
}

#[guard_test(needs = [redis], multi_thread)]
async fn stream_stays_near_its_maxlen() {
    let server = RedisServer::start(None);
    let (warn, _warned) = capture_warnings();
    let mirror = Mirror::spawn(server.endpoint(), "box1".into(), "alice".into(), None, warn);
    const TOTAL: u64 = 25_000;
    const CHUNK: u64 = 500; // below the queue's capacity, so nothing is dropped
    for start in (0..TOTAL).step_by(CHUNK as usize) {
        for i in start..start + CHUNK {
            mirror.event(killed(1000, i));
        }
        let m = mirror.clone();
        wait_for(Duration::from_secs(20), "the queue to drain", move || {
            let m = m.clone();
            async move { m.pending_events() == 0 }
        })
        .await;
    }
    let mut conn = server.conn().await;
    wait_for(Duration::from_secs(20), "the last event", || {
        let mut conn = conn.clone();
        async move {
            let last: Vec<(String, HashMap<String, String>)> = redis::cmd("XREVRANGE")
                .arg(STREAM_KEY)
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(1)
                .query_async(&mut conn)
                .await
                .unwrap();
            last.first().is_some_and(|(_, f)| f.get("count").map(String::as_str) == Some("24999"))
        }
    })
    .await;
    let len = xlen(&mut conn).await;
    assert!((10_000..=11_000).contains(&len), "stream length {len} after {TOTAL} events");
    assert_eq!(mirror.dropped(), 0);
}

#[guard_test(needs = [redis], multi_thread)]
async fn outage_warns_once_and_recovery_restores_the_heartbeat() {
    let mut server = RedisServer::start(None);
    let endpoint = server.endpoint();
    let (warn, warned) = capture_warnings();
    let mirror = Mirror::spawn(endpoint.clone(), "box1".into(), "alice".into(), None, warn);
    mirror.heartbeat(heartbeat("alice", 1), Duration::from_secs(60));
    wait_for(Duration::from_secs(10), "the first heartbeat", || async {
        matches!(beat(&endpoint, "alice").await, Ok(Some(_)))
    })
    .await;

    server.stop();
    mirror.heartbeat(heartbeat("alice", 2), Duration::from_secs(60));
    let w = Arc::clone(&warned);
    wait_for(Duration::from_secs(10), "redis_unreachable", move || {
        let w = Arc::clone(&w);
        async move { !warnings(&w).is_empty() }
    })
    .await;
    let unreachable = format!("redis_unreachable endpoint=redis://127.0.0.1:{}/0", server.port);
    assert_eq!(warnings(&warned), std::slice::from_ref(&unreachable));
    assert!(beat(&endpoint, "alice").await.is_err());

    // While Redis is down, calls return at once and nothing grows past its bound.
    let queued = 3 * EVENT_QUEUE_CAPACITY as u64;
    for i in 0..queued {
        mirror.event(killed(2000, i));
        if i % 100 == 0 {
            mirror.heartbeat(heartbeat("alice", 3), Duration::from_secs(60));
        }
    }
    assert!(mirror.pending_events() <= EVENT_QUEUE_CAPACITY);
    assert!(mirror.dropped() >= queued - EVENT_QUEUE_CAPACITY as u64, "dropped {}", mirror.dropped());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(mirror.pending_events() <= EVENT_QUEUE_CAPACITY);
    assert_eq!(warnings(&warned), std::slice::from_ref(&unreachable), "one warning per outage");

    server.restart();
    wait_for(Duration::from_secs(45), "the heartbeat after the restart", || async {
        matches!(beat(&endpoint, "alice").await, Ok(Some(hb)) if hb.pid == 3)
    })
    .await;
    let m = mirror.clone();
    wait_for(Duration::from_secs(10), "the queued events", move || {
        let m = m.clone();
        async move { m.pending_events() == 0 }
    })
    .await;
    let mut conn = server.conn().await;
    let c = conn.clone();
    wait_for(Duration::from_secs(10), "the queued events in the stream", move || {
        let mut c = c.clone();
        async move { xlen(&mut c).await > 0 }
    })
    .await;
    let len = xlen(&mut conn).await;
    assert!(len <= EVENT_QUEUE_CAPACITY as u64, "{len} events kept through the outage");
    let recovered = format!("redis_recovered endpoint=redis://127.0.0.1:{}/0", server.port);
    assert_eq!(warnings(&warned), [unreachable, recovered]);
}

#[guard_test(multi_thread)]
async fn hung_redis_bounds_reads_and_never_holds_up_callers() {
    let hung = HungServer::start();
    let endpoint = Endpoint::new(format!("redis://:{SECRET}@127.0.0.1:{}/0", hung.port));
    let read = tokio::time::timeout(Duration::from_secs(5), read_heartbeat(&endpoint, "box1", "alice", None))
        .await
        .expect("read_heartbeat returns within its bound");
    let err = read.expect_err("a hung Redis gives an error");
    assert!(matches!(err, MirrorError::Timeout { .. }), "{err:?}");
    assert!(!err.to_string().contains(SECRET), "{err}");
    assert_eq!(
        check_lines(&endpoint, "box1", "alice", &Err(err)),
        Some(format!(
            "the swarm Redis at redis://127.0.0.1:{}/0 is unreachable, so the fleet heartbeat was not checked",
            hung.port
        ))
    );
    let listed = tokio::time::timeout(Duration::from_secs(10), listed(&endpoint)).await.expect("fleet returns");
    assert!(listed.is_err());

    let (warn, warned) = capture_warnings();
    let mirror = Mirror::spawn(endpoint.clone(), "box1".into(), "alice".into(), None, warn);
    mirror.heartbeat(heartbeat("alice", 1), Duration::from_secs(60));
    mirror.event(killed(1, 1));
    let w = Arc::clone(&warned);
    wait_for(Duration::from_secs(10), "redis_unreachable", move || {
        let w = Arc::clone(&w);
        async move { !warnings(&w).is_empty() }
    })
    .await;
    for round in 0..3 {
        for i in 0..2 * EVENT_QUEUE_CAPACITY as u64 {
            mirror.event(killed(1, i));
        }
        mirror.heartbeat(heartbeat("alice", round + 2), Duration::from_secs(60));
        assert!(mirror.pending_events() <= EVENT_QUEUE_CAPACITY);
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    let lines = warnings(&warned);
    assert_eq!(lines, [format!("redis_unreachable endpoint=redis://127.0.0.1:{}/0", hung.port)]);
}

#[guard_test(needs = [redis], multi_thread)]
async fn passwords_never_appear_in_errors_or_warnings() {
    let mut server = RedisServer::start(Some(SECRET));
    let endpoint = server.endpoint();
    assert!(endpoint.url.contains(SECRET));
    let (warn, warned) = capture_warnings();
    let mirror = Mirror::spawn(endpoint.clone(), "box1".into(), "alice".into(), None, warn.clone());
    mirror.heartbeat(heartbeat("alice", 1), Duration::from_secs(60));
    wait_for(Duration::from_secs(10), "the heartbeat behind a password", || async {
        matches!(beat(&endpoint, "alice").await, Ok(Some(_)))
    })
    .await;

    let port = server.port;
    let mut errors = Vec::new();
    let wrong = [
        format!("redis://:{SECRET}-wrong@127.0.0.1:{port}/0"),
        format!("redis://default:{SECRET}-wrong@127.0.0.1:{port}/0"),
        format!("redis://127.0.0.1:{port}/0"),
        format!("redis://:{SECRET}@/0"),
        format!("redis://:{SECRET}@127.0.0.1:{port}/not-a-db"),
        format!("http://:{SECRET}@127.0.0.1:{port}/0"),
        format!("redis://:{SECRET}@127.0.0.1:{}/0", free_port()),
    ];
    for url in &wrong {
        let endpoint = Endpoint::new(url);
        match beat(&endpoint, "alice").await {
            Ok(found) => panic!("{} read {found:?}", endpoint.redacted()),
            Err(err) => errors.push(err),
        }
        let listed = listed(&endpoint).await;
        errors.push(listed.expect_err("fleet with bad credentials"));
    }
    // A mirror with the wrong password warns like an outage.
    let bad = Mirror::spawn(Endpoint::new(&wrong[0]), "box1".into(), "alice".into(), None, warn.clone());
    bad.heartbeat(heartbeat("alice", 9), Duration::from_secs(60));
    // An unusable URL is said once and then discarded.
    let invalid = Mirror::spawn(Endpoint::new(&wrong[5]), "box1".into(), "alice".into(), None, warn.clone());
    invalid.event(killed(1, 1));

    server.stop();
    mirror.heartbeat(heartbeat("alice", 2), Duration::from_secs(60));
    let w = Arc::clone(&warned);
    wait_for(Duration::from_secs(10), "three warnings", move || {
        let w = Arc::clone(&w);
        async move { warnings(&w).len() >= 3 }
    })
    .await;
    server.restart();
    let w = Arc::clone(&warned);
    wait_for(Duration::from_secs(45), "redis_recovered", move || {
        let w = Arc::clone(&w);
        async move { warnings(&w).iter().any(|l| l.starts_with("redis_recovered")) }
    })
    .await;

    let lines = warnings(&warned);
    let redacted = format!("endpoint=redis://127.0.0.1:{port}/0");
    assert!(lines.contains(&format!("redis_unreachable {redacted}")), "{lines:?}");
    assert!(lines.contains(&format!("redis_recovered {redacted}")), "{lines:?}");
    assert!(lines.contains(&format!("redis_endpoint_invalid endpoint=http://127.0.0.1:{port}/0")), "{lines:?}");
    assert!(lines.iter().all(|l| l.starts_with("redis_")), "{lines:?}");
    for line in &lines {
        assert!(!line.contains(SECRET), "warning leaks the password: {line}");
    }
    assert!(errors.iter().any(|e| matches!(e, MirrorError::InvalidEndpoint { .. })), "{errors:?}");
    assert!(errors.iter().any(|e| matches!(e, MirrorError::Unreachable { .. })), "{errors:?}");
    for err in &errors {
        assert!(!err.to_string().contains(SECRET), "error leaks the password: {err}");
        assert!(!format!("{err:?}").contains(SECRET), "error leaks the password: {err:?}");
    }
    assert_eq!(invalid.pending_events(), 0);
}

#[guard_test(needs = [redis], multi_thread)]
async fn fleet_lists_every_heartbeat_but_not_the_stream() {
    let server = RedisServer::start(None);
    let endpoint = server.endpoint();
    let (warn, _warned) = capture_warnings();
    let alice = Mirror::spawn(endpoint.clone(), "box1".into(), "alice".into(), None, warn.clone());
    let bob = Mirror::spawn(endpoint.clone(), "box1".into(), "bob".into(), None, warn);
    alice.heartbeat(heartbeat("alice", 1), Duration::from_secs(60));
    bob.heartbeat(heartbeat("bob", 2), Duration::from_secs(60));
    alice.event(killed(5, 31));
    let mut conn = server.conn().await;
    let _: () =
        redis::cmd("SET").arg("agentihooks:host-guard:not-a-heartbeat").arg("{").query_async(&mut conn).await.unwrap();
    let _: () = redis::cmd("SET").arg("agentihooks:other").arg("{}").query_async(&mut conn).await.unwrap();

    wait_for(Duration::from_secs(10), "both heartbeats and the event", || {
        let mut conn = conn.clone();
        let endpoint = endpoint.clone();
        async move { xlen(&mut conn).await == 1 && listed(&endpoint).await.is_ok_and(|f| f.len() == 2) }
    })
    .await;
    let listed = listed(&endpoint).await.unwrap();
    assert_eq!(listed, [heartbeat_like(&listed[0], "alice", 1), heartbeat_like(&listed[1], "bob", 2)]);
    let table = fleet_table(&listed, SystemTime::now(), None);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    let user_col = lines[0].find("USER").unwrap();
    assert!(lines[1][user_col..].starts_with("alice"), "{table}");
    assert!(lines[2][user_col..].starts_with("bob"), "{table}");
}

/// `heartbeat(user, pid)` with the `last_tick` actually stored (the clock moved on since).
fn heartbeat_like(stored: &Heartbeat, user: &str, pid: u32) -> Heartbeat {
    Heartbeat { last_tick: stored.last_tick, ..heartbeat(user, pid) }
}

#[guard_test(needs = [redis], multi_thread)]
async fn dropping_the_mirror_still_sends_what_was_queued() {
    let server = RedisServer::start(None);
    let endpoint = server.endpoint();
    let (warn, warned) = capture_warnings();
    let mirror = Mirror::spawn(endpoint.clone(), "box1".into(), "alice".into(), None, warn);
    let clone = mirror.clone();
    clone.heartbeat(heartbeat("alice", 7), Duration::from_secs(60));
    for i in 0..600 {
        clone.event(killed(7, i));
    }
    drop(clone);
    drop(mirror);
    let mut conn = server.conn().await;
    wait_for(Duration::from_secs(10), "the queued events after the last handle went", || {
        let mut conn = conn.clone();
        async move { xlen(&mut conn).await == 600 }
    })
    .await;
    assert_eq!(xlen(&mut conn).await, 600);
    assert!(matches!(beat(&endpoint, "alice").await, Ok(Some(hb)) if hb.pid == 7));
    assert!(warnings(&warned).is_empty(), "{:?}", warnings(&warned));
}

/// Names the account picks, with what could split a field, a line or a protocol frame.
const HOSTILE_NAMES: [&str; 6] =
    ["a b\r\nname x", "x\"}{=,\\ ts 1", "*3\r\n$4\r\nPING\r\n", "\u{1b}[2J\u{fffd}\u{202e}", "", "fifteen-bytes-x"];

#[guard_test(needs = [redis], multi_thread)]
async fn a_hostile_name_stays_one_field_in_the_stream_and_the_heartbeat() {
    let server = RedisServer::start(None);
    let endpoint = server.endpoint();
    let (warn, warned) = capture_warnings();
    let mirror = Mirror::spawn(endpoint.clone(), "box1".into(), "alice".into(), None, warn);
    for name in HOSTILE_NAMES {
        mirror.event(StreamEvent { name: Some(name.into()), ..killed(9, 31) });
    }
    let hb = Heartbeat { flagged: HOSTILE_NAMES.map(String::from).to_vec(), ..heartbeat("alice", 9) };
    mirror.heartbeat(hb.clone(), Duration::from_secs(60));
    let mut conn = server.conn().await;
    wait_for(Duration::from_secs(10), "the hostile events", || {
        let mut conn = conn.clone();
        async move { xlen(&mut conn).await == HOSTILE_NAMES.len() as u64 }
    })
    .await;
    // Raw bytes and the entries' field lists in order: nothing was split, joined or re-encoded.
    type RawEntry = (String, Vec<(Vec<u8>, Vec<u8>)>);
    let entries: Vec<RawEntry> =
        redis::cmd("XRANGE").arg(STREAM_KEY).arg("-").arg("+").query_async(&mut conn).await.expect("XRANGE");
    for ((_, fields), name) in entries.iter().zip(HOSTILE_NAMES) {
        let keys: Vec<&[u8]> = fields.iter().map(|(k, _)| k.as_slice()).collect();
        assert_eq!(
            keys,
            [&b"host"[..], b"user", b"event", b"pid", b"name", b"reason", b"count", b"elapsed_secs", b"ts_unix"],
            "{name:?}"
        );
        assert_eq!(fields[4].1, name.as_bytes(), "{name:?}");
    }
    wait_for(Duration::from_secs(10), "the hostile heartbeat", || async {
        matches!(beat(&endpoint, "alice").await, Ok(Some(_)))
    })
    .await;
    assert_eq!(beat(&endpoint, "alice").await.unwrap(), Some(hb));
    assert!(warnings(&warned).is_empty(), "{:?}", warnings(&warned));
}

#[guard_test(needs = [redis], multi_thread)]
async fn a_config_error_reaches_the_heartbeat_and_the_fleet_and_the_stream_once() {
    use guard::cmd::fleet::fleet_exit_code;
    use guard::daemon::report::ConfigOutage;
    let server = RedisServer::start(None);
    let endpoint = server.endpoint();
    let (warn, warned) = capture_warnings();
    let mirror = Mirror::spawn(endpoint.clone(), "box1".into(), "alice".into(), None, warn);
    let error =
        guard::config::parse(br#"{"threshold": "30"}"#, std::path::Path::new("/home/alice")).unwrap_err().log_reason();
    let mut outage = ConfigOutage::default();
    let mut conn = server.conn().await;
    let start = now_secs() as f64;
    // Three ticks with the config broken, then one with it mended.
    for (tick, broken) in [true, true, true, false].into_iter().enumerate() {
        let now = start + tick as f64;
        let config_error = broken.then(|| error.clone());
        if let Some(ev) = outage.observe(config_error.as_deref(), now) {
            mirror.event(ev);
        }
        // (The replay tests check the daemon fills the heartbeat's config_error every tick.)
        let hb = Heartbeat { last_tick: now as u64, config_error, ..heartbeat("alice", 1) };
        mirror.heartbeat(hb, Duration::from_secs(180));
        if tick == 2 {
            wait_for(Duration::from_secs(10), "the broken heartbeat", || async {
                matches!(beat(&endpoint, "alice").await, Ok(Some(hb)) if hb.last_tick == now as u64)
            })
            .await;
            let hb = beat(&endpoint, "alice").await.unwrap().unwrap();
            assert_eq!(hb.config_error.as_deref(), Some(error.as_str()), "the ERROR line's reason, as logged");
            let listed = listed(&endpoint).await.unwrap();
            let table = fleet_table(&listed, SystemTime::now(), None);
            assert!(table.lines().nth(1).unwrap().ends_with(&format!("CONFIG INVALID: {error}")), "{table}");
            assert_eq!(fleet_exit_code(&listed, SystemTime::now(), None), std::process::ExitCode::from(1));
        }
    }
    wait_for(Duration::from_secs(10), "the mended heartbeat", || {
        let mut conn = conn.clone();
        let endpoint = endpoint.clone();
        async move {
            xlen(&mut conn).await == 2
                && matches!(beat(&endpoint, "alice").await, Ok(Some(hb)) if hb.config_error.is_none())
        }
    })
    .await;
    let listed = listed(&endpoint).await.unwrap();
    assert_eq!(fleet_exit_code(&listed, SystemTime::now(), None), std::process::ExitCode::SUCCESS);
    assert!(fleet_table(&listed, SystemTime::now(), None).lines().nth(1).unwrap().ends_with("  ok"));
    // One event when it broke, one when it was mended: not one per tick, and about no process.
    let entries = stream_entries(&mut conn).await;
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert_eq!(entries[0]["event"], "config_error");
    assert_eq!(entries[0]["error"], error);
    assert_eq!(entries[1]["event"], "config_ok");
    assert_eq!(entries[1]["after_secs"], "3");
    for e in &entries {
        assert!(!e.contains_key("name") && !e.contains_key("pid"), "{e:?}");
        assert_eq!((e["host"].as_str(), e["user"].as_str()), ("box1", "alice"));
    }
    assert!(warnings(&warned).is_empty(), "{:?}", warnings(&warned));
}

guard_test::main!();
