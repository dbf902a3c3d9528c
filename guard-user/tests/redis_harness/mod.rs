//! A real `redis-server` for the mirror tests: started on a free loopback port (never 6379) in a
//! temp directory with persistence off, killed on drop; a server that accepts and never answers;
//! and the small waits the tests share.
use std::future::Future;
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use guard::{
    log::{Line, Notice},
    mirror::Endpoint,
};
use redis::aio::MultiplexedConnection;

pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral loopback port");
    let port = listener.local_addr().expect("local addr").port();
    assert_ne!(port, 6379);
    port
}

/// A redis-server this test started; killed (and reaped) on drop.
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    password: Option<&'static str>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    pub fn start(password: Option<&'static str>) -> RedisServer {
        let mut server = RedisServer {
            child: None,
            port: free_port(),
            password,
            dir: tempfile::tempdir().expect("temp dir for redis-server"),
        };
        server.restart();
        server
    }

    /// Starts the server (again) on the same port, with an empty dataset.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "server already running");
        let mut cmd = Command::new(
            guard_test::need::which("redis-server").expect("redis-server (the test declares needs = [redis])"),
        );
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--protected-mode", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(password) = self.password {
            cmd.args(["--requirepass", password]);
        }
        self.child = Some(cmd.spawn().expect("start redis-server"));
        let started = std::time::Instant::now();
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(started.elapsed() < Duration::from_secs(10), "redis-server did not listen on {}", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn url(&self) -> String {
        match self.password {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}/0", self.port),
            None => format!("redis://127.0.0.1:{}/0", self.port),
        }
    }

    pub fn endpoint(&self) -> Endpoint {
        Endpoint::new(self.url())
    }

    pub async fn conn(&self) -> MultiplexedConnection {
        let client = redis::Client::open(self.url()).expect("client");
        client.get_multiplexed_async_connection().await.expect("connect to the test redis-server")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A listener that accepts connections and never answers: a hung Redis.
pub struct HungServer {
    pub port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HungServer {
    pub fn start() -> HungServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => held.push(stream),
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        HungServer { port, stop, thread: Some(thread) }
    }
}

impl Drop for HungServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

pub type Warnings = Arc<Mutex<Vec<String>>>;

/// A warn callback for [`guard::mirror::Mirror::spawn`] and what it was told: each warning as
/// the log writes it after `WARN ` (`what key=value …`, values escaped), through the real
/// `Line::body`.
pub fn capture_warnings() -> (Arc<dyn Fn(Notice) + Send + Sync>, Warnings) {
    let lines: Warnings = Arc::default();
    let sink = Arc::clone(&lines);
    let warn = move |n: Notice| {
        let body = Line::Warn(n).body();
        sink.lock().unwrap().push(body.strip_prefix("WARN ").expect("a WARN line").to_string());
    };
    (Arc::new(warn), lines)
}

pub fn warnings(lines: &Warnings) -> Vec<String> {
    lines.lock().unwrap().clone()
}

/// Polls `cond` every 50 ms until it holds; panics with `what` after `limit`.
pub async fn wait_for<F, Fut>(limit: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = tokio::time::Instant::now();
    while !cond().await {
        assert!(start.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
