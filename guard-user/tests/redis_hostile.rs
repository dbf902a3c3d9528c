//! The swarm Redis endpoint is untrusted (docs/operations.md, "Moving the swarm Redis"): the
//! default `127.0.0.1:6379` is a port any local account can listen on. A listener that answers
//! with more than a reply may take has its connection closed (`redis_reply_rejected`), by the
//! daemon's mirror and by `check` and `status --fleet` alike; a listener an account owns is said
//! once (`redis_listener_owned_by_account`), never gets the password, and what `check` and
//! `status --fleet` read there is marked as that account's.
use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use guard::mirror::{check_lines, fleet, read_heartbeat, Endpoint, Heartbeat, Mirror, MirrorError};
use guard_test::guard_test;

// Shared with redis_mirror.rs, which uses the rest of it (the real redis-server).
#[allow(dead_code)]
mod redis_harness;
use redis_harness::{capture_warnings, wait_for, warnings};

/// An account's uid (the integration tests' `guardtest1`; it need not exist here).
const ACCOUNT: u32 = 4201;

/// A listener that answers every command with `answer` and keeps every byte it was sent.
struct Fake {
    port: u16,
    got: Arc<Mutex<Vec<u8>>>,
    connections: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Fake {
    /// Listens on a free loopback port; `owner`: the file-system uid the socket is made with
    /// (needs root), so `/proc/net/tcp` names that uid as its owner.
    fn start(answer: &'static [u8], owner: Option<u32>) -> Fake {
        // SAFETY: setfsuid changes this thread's file-system uid only; set back right after.
        let before = owner.map(|uid| unsafe { libc::setfsuid(uid) });
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        if let Some(old) = before {
            unsafe { libc::setfsuid(old as u32) };
        }
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let (got, connections, stop) =
            (Arc::default(), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let (g, c, s) = (Arc::clone(&got), Arc::clone(&connections), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let Ok((stream, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                c.fetch_add(1, Ordering::Relaxed);
                let (g, s) = (Arc::clone(&g), Arc::clone(&s));
                std::thread::spawn(move || serve(stream, answer, &g, &s));
            }
        });
        Fake { port, got, connections, stop }
    }

    fn endpoint(&self, password: Option<&str>) -> Endpoint {
        match password {
            Some(p) => Endpoint::new(format!("redis://:{p}@127.0.0.1:{}/0", self.port)),
            None => Endpoint::new(format!("redis://127.0.0.1:{}/0", self.port)),
        }
    }

    fn received(&self) -> String {
        String::from_utf8_lossy(&self.got.lock().unwrap()).into_owned()
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Answers each request with `answer` (a huge one is written until the peer closes).
fn serve(mut stream: TcpStream, answer: &[u8], got: &Mutex<Vec<u8>>, stop: &AtomicBool) {
    stream.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                got.lock().unwrap().extend_from_slice(&buf[..n]);
                if stream.write_all(answer).is_err() {
                    return;
                }
                if answer == HUGE {
                    // The five bulk strings' bytes, until the reader gives up and closes.
                    let chunk = vec![b'x'; 1 << 20];
                    for _ in 0..80 {
                        if stream.write_all(&chunk).is_err() {
                            return;
                        }
                    }
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

/// Five bulk strings of 16 MiB - 1 each: each under the per-piece cap the parser had, 80 MiB
/// in all (issue 32: the daemon was OOM-killed at its first heartbeat).
const HUGE: &[u8] = b"*5\r\n$16777215\r\n";

fn heartbeat() -> Heartbeat {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    Heartbeat { host: "box1".into(), user: "alice".into(), last_tick: now, interval_secs: 60, ..Default::default() }
}

#[guard_test(multi_thread)]
async fn a_reply_past_its_budget_closes_the_connection_and_every_reader_goes_on() {
    let fake = Fake::start(HUGE, None);
    let endpoint = fake.endpoint(None);
    let (warn, lines) = capture_warnings();
    let mirror = Mirror::spawn(endpoint.clone(), "box1".into(), "alice".into(), Some(ACCOUNT), warn);
    mirror.heartbeat(heartbeat(), Duration::from_secs(180));
    let want = format!("redis_reply_rejected endpoint={} bytes=", endpoint.redacted());
    wait_for(Duration::from_secs(10), "redis_reply_rejected", || {
        let found = warnings(&lines).iter().any(|l| l.starts_with(&want));
        async move { found }
    })
    .await;
    let line = warnings(&lines).into_iter().find(|l| l.starts_with(&want)).unwrap();
    let bytes: usize = line[want.len()..].parse().unwrap();
    assert!(bytes > guard::mirror::resp::REPLY_BYTES && bytes < 17 << 20, "{line}");
    // The mirror goes on: it reconnects (with backoff) for the next heartbeat, and says it once.
    mirror.heartbeat(heartbeat(), Duration::from_secs(180));
    wait_for(Duration::from_secs(10), "a second connection", || {
        let n = fake.connections.load(Ordering::Relaxed);
        async move { n >= 2 }
    })
    .await;
    assert_eq!(warnings(&lines).iter().filter(|l| l.contains("redis_reply_rejected")).count(), 1);
    // check and status --fleet read within the same budget.
    let got = read_heartbeat(&endpoint, "box1", "alice", Some(ACCOUNT)).await;
    assert!(
        matches!(got, Err(MirrorError::ReplyRejected { bytes, .. }) if bytes > guard::mirror::resp::REPLY_BYTES),
        "{got:?}"
    );
    let line = check_lines(&endpoint, "box1", "alice", &got).unwrap();
    assert!(line.contains("over the 65536 a reply may take"), "{line}");
    assert!(matches!(fleet(&endpoint).await, Err(MirrorError::ReplyRejected { .. })));
}

/// The process's peak resident memory so far (`VmHWM`), in KiB.
fn peak_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A listener that answers every SCAN with a page of one 60 KiB key under the prefix, and a
/// cursor that never ends: each page is inside a reply's budget, so the keys must be bounded on
/// their own. `status --fleet` keeps no key a heartbeat could not have, so root's memory stays
/// flat (it held up to 10,000 × 60 KiB, 600 MB, before).
#[guard_test(multi_thread)]
async fn a_listener_paging_huge_keys_never_grows_status_fleet() {
    let key = format!("agentihooks:host-guard:{}", "k".repeat(60 << 10));
    let page = format!("*2\r\n$1\r\n1\r\n*1\r\n${}\r\n{key}\r\n", key.len());
    let fake = Fake::start(Box::leak(page.into_bytes().into_boxed_slice()), None);
    let before = peak_kib();
    let got = fleet(&fake.endpoint(None)).await;
    let grown = peak_kib().saturating_sub(before);
    assert!(!matches!(&got, Ok(read) if !read.value.beats.is_empty()), "{got:?}");
    assert!(grown < 64 << 10, "status --fleet grew by {grown} KiB reading one endless page of huge keys");
}

// Root: the socket is made with another uid's file-system identity.
#[guard_test(needs = [root], multi_thread)]
async fn a_listener_an_account_owns_never_gets_the_password_and_is_said_once() {
    let fake = Fake::start(b"+OK\r\n", Some(ACCOUNT));
    let endpoint = fake.endpoint(Some("s3cret-pw"));
    let (warn, lines) = capture_warnings();
    let mirror = Mirror::spawn(endpoint.clone(), "box1".into(), "alice".into(), Some(ACCOUNT), warn);
    let want = format!("redis_listener_owned_by_account endpoint={} uid={ACCOUNT}", endpoint.redacted());
    for _ in 0..3 {
        mirror.heartbeat(heartbeat(), Duration::from_secs(180));
        let n = fake.connections.load(Ordering::Relaxed);
        wait_for(Duration::from_secs(10), "another connection attempt", || {
            let now = fake.connections.load(Ordering::Relaxed);
            async move { now > n }
        })
        .await;
    }
    assert_eq!(warnings(&lines), [want], "said once, and no other outage line");
    assert_eq!(fake.received(), "", "nothing was sent, the password least of all");
    // check says so rather than reading a heartbeat there.
    let got = read_heartbeat(&endpoint, "box1", "alice", Some(ACCOUNT)).await;
    assert!(matches!(got, Err(MirrorError::AccountListener { uid: ACCOUNT, .. })), "{got:?}");
    assert!(check_lines(&endpoint, "box1", "alice", &got).unwrap().contains("an account, so the fleet heartbeat"));
    assert!(!fake.received().contains("s3cret"));
}

#[guard_test(needs = [root], multi_thread)]
async fn what_is_read_from_a_listener_an_account_owns_is_marked_as_its_writing() {
    // No password: the mirror writes there (it is said once), and the readers mark what they read.
    let beat = serde_json::to_string(&heartbeat()).unwrap();
    let answer: &'static [u8] = Box::leak(format!("${}\r\n{beat}\r\n", beat.len()).into_bytes().into_boxed_slice());
    let fake = Fake::start(answer, Some(ACCOUNT));
    let endpoint = fake.endpoint(None);
    let got = read_heartbeat(&endpoint, "box1", "alice", Some(ACCOUNT)).await.unwrap();
    assert_eq!((got.value.is_some(), got.written_by), (true, Some(ACCOUNT)));
    assert!(check_lines(&endpoint, "box1", "alice", &Ok(got)).unwrap().contains("listens as"));
    let (warn, lines) = capture_warnings();
    let mirror = Mirror::spawn(endpoint.clone(), "box1".into(), "alice".into(), Some(ACCOUNT), warn);
    mirror.heartbeat(heartbeat(), Duration::from_secs(180));
    wait_for(Duration::from_secs(10), "the heartbeat sent", || {
        let sent = fake.received().contains("SET");
        async move { sent }
    })
    .await;
    assert_eq!(warnings(&lines).len(), 1, "{:?}", warnings(&lines));
    let now = SystemTime::now();
    let table = guard::cmd::fleet::fleet_table(&[heartbeat()], now, Some("guardtest1"));
    assert!(table.contains("UNTRUSTED: written by account guardtest1"), "{table}");
    let json: serde_json::Value =
        serde_json::from_str(&guard::cmd::fleet::fleet_json(&[heartbeat()], now, Some("guardtest1"))).unwrap();
    assert_eq!(json[0]["written_by_account"], "guardtest1");
    assert_eq!(
        guard::cmd::fleet::fleet_exit_code(&[heartbeat()], now, Some("guardtest1")),
        std::process::ExitCode::from(1)
    );
}

guard_test::main!();
