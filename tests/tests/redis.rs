//! The daemon and the swarm Redis (docs/operations.md) end to end: a real redis-server on a free
//! loopback port, a real kill, the heartbeat, the stream, and a Redis that dies mid-run.
use std::{
    net::TcpListener,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use integration_tests::*;

struct Redis {
    child: Child,
    port: u16,
}

impl Redis {
    /// A redis-server on a free loopback port (the test declares `needs = [redis]`).
    fn start() -> Redis {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let r = Redis { child, port };
        let end = Instant::now() + Duration::from_secs(10);
        while r.cli(&["PING"]).trim() != "PONG" {
            assert!(Instant::now() < end, "redis-server did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
        r
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    fn cli(&self, args: &[&str]) -> String {
        Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[guard_test(needs = [root, redis])]
fn a_real_kill_reaches_the_stream_and_the_heartbeat_and_a_dead_redis_never_stops_the_guard() {
    let _g = setup();
    let redis = Redis::start();
    let home = Home::new();
    home.write_config(r#"{"threshold": 3, "timeout": "1s"}"#);
    let exe = home.probe_named("agentihooks");
    let mut pile: Vec<Probe> = (0..3).map(|_| Probe::spawn(&exe, &[], TEST_UID)).collect();
    std::env::set_var("AGENTIHOOKS_SWARM_REDIS_URL", redis.url());
    std::env::remove_var("AGENTIHOOKS_HIVE_REDIS_URL");
    let daemon = Daemon::start(&home, &[]);
    home.wait_log(Duration::from_secs(20), |l| lines(l, "KILLED").len() >= 3);
    for p in &mut pile {
        assert!(p.wait_dead(Duration::from_secs(5)));
    }
    let host = guard::daemon::hostname();
    let key = format!("agentihooks:host-guard:{host}:{TEST_USER}");
    // The mirror's worker writes the stream and the heartbeat after the tick's log lines.
    let (stream, hb) = poll(Duration::from_secs(10), || {
        let stream = redis.cli(&["XRANGE", "agentihooks:host-guard:events", "-", "+"]);
        let hb = redis.cli(&["GET", &key]);
        (stream.matches("KILLED").count() >= 3 && hb.contains("\"kills\":3"), (stream, hb))
    });
    assert_eq!(stream.matches("KILLED").count(), 3, "{stream}");
    assert!(stream.contains("FLAGGED") && stream.contains("ghost_detected"), "{stream}");
    assert!(hb.contains("\"kills\":3"), "{hb}");
    let ttl: i64 = redis.cli(&["TTL", &key]).trim().parse().unwrap();
    assert!(ttl > 0 && ttl <= 3, "ttl {ttl}");

    // Redis dies: the guard keeps ticking and killing, and says so once.
    let port = redis.port;
    drop(redis);
    let mut more: Vec<Probe> = (0..3).map(|_| Probe::spawn(&exe, &[], TEST_UID)).collect();
    home.wait_log(Duration::from_secs(20), |l| lines(l, "KILLED").len() >= 6);
    for p in &mut more {
        assert!(p.wait_dead(Duration::from_secs(5)), "a kill waited on a dead Redis");
    }
    // The status is written when the tick that logged the kills ends.
    let status = home.wait_status(Duration::from_secs(10), |s| s.kills >= 6).expect("a status file");
    daemon.stop();
    let log = home.log();
    assert_eq!(log.matches("WARN redis_unreachable").count(), 1, "{log}");
    assert!(log.contains(&format!("endpoint=redis://127.0.0.1:{port}/0")), "{log}");
    assert!(status.kills >= 6, "the status counted {} kills", status.kills);
    std::env::remove_var("AGENTIHOOKS_SWARM_REDIS_URL");
}

fn check_output(home: &Home, url: &str) -> String {
    let out = Command::new(guard_bin())
        .args(["check", "--user", TEST_USER, "--home"])
        .arg(home.path())
        .env("AGENTIHOOKS_SWARM_REDIS_URL", url)
        .env_remove("AGENTIHOOKS_HIVE_REDIS_URL")
        .output()
        .unwrap();
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[guard_test(needs = [root, redis])]
fn check_reports_a_missing_heartbeat_and_an_unreachable_redis() {
    let _g = setup();
    let redis = Redis::start();
    let home = Home::new();
    let host = guard::daemon::hostname();
    let out = check_output(&home, &redis.url());
    assert!(out.contains(&format!("no heartbeat for {host}:{TEST_USER} on {}", redis.url())), "{out}");
    let key = format!("agentihooks:host-guard:{host}:{TEST_USER}");
    redis.cli(&["SET", &key, r#"{"host":"x","user":"guardtest1"}"#, "EX", "60"]);
    let out = check_output(&home, &redis.url());
    assert!(!out.contains("no heartbeat"), "{out}");
    let url = redis.url();
    drop(redis);
    let out = check_output(&home, &url.replace("127.0.0.1", ":hunter2@127.0.0.1"));
    assert!(
        out.contains(&format!("the swarm Redis at {url} is unreachable, so the fleet heartbeat was not checked")),
        "{out}"
    );
    assert!(!out.contains("hunter2"), "{out}");
}

#[guard_test(needs = [root, redis])]
fn a_hostile_process_name_reaches_the_stream_as_one_field() {
    let _g = setup();
    let redis = Redis::start();
    // The account names its processes: a space, a quote, a newline and `=` in 11 bytes.
    let name = "a b\"x\ny=z n";
    let home = Home::new();
    home.write_config(r#"{"threshold": 3, "timeout": "1s"}"#);
    let exe = home.probe_named(name);
    let mut pile: Vec<Probe> = (0..3).map(|_| Probe::spawn(&exe, &[], TEST_UID)).collect();
    std::env::set_var("AGENTIHOOKS_SWARM_REDIS_URL", redis.url());
    std::env::remove_var("AGENTIHOOKS_HIVE_REDIS_URL");
    let daemon = Daemon::start(&home, &[]);
    home.wait_log(Duration::from_secs(20), |l| lines(l, "KILLED").len() >= 3);
    for p in &mut pile {
        assert!(p.wait_dead(Duration::from_secs(5)));
    }
    let json = poll(Duration::from_secs(10), || {
        let json = redis.cli(&["--json", "XRANGE", "agentihooks:host-guard:events", "-", "+"]);
        (json.matches("\"KILLED\"").count() >= 3, json)
    });
    daemon.stop();
    std::env::remove_var("AGENTIHOOKS_SWARM_REDIS_URL");
    let entries: Vec<(String, Vec<String>)> = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    let killed: Vec<&Vec<String>> = entries.iter().map(|(_, f)| f).filter(|f| f[5] == "KILLED").collect();
    assert_eq!(killed.len(), 3, "{json}");
    for fields in killed {
        let keys: Vec<&str> = fields.iter().step_by(2).map(String::as_str).collect();
        assert_eq!(
            keys,
            ["host", "user", "event", "pid", "name", "reason", "count", "elapsed_secs", "ts_unix"],
            "{json}"
        );
        // One field, in the log's escaped text form (injective; without the log's quotes).
        assert_eq!(fields[9], guard::escape::text(name.as_bytes()), "{json}");
        assert_eq!(fields[9], r#"a b"x\ny=z n"#, "{json}");
    }
}

#[guard_test(needs = [root, redis])]
fn a_broken_config_reaches_the_heartbeat_the_fleet_and_the_stream_once() {
    let _g = setup();
    let redis = Redis::start();
    let home = Home::new();
    home.write_config(r#"{"threshold": "30"}"#);
    std::env::set_var("AGENTIHOOKS_SWARM_REDIS_URL", redis.url());
    std::env::remove_var("AGENTIHOOKS_HIVE_REDIS_URL");
    let daemon = Daemon::start(&home, &[]);
    let log = home.wait_log(Duration::from_secs(20), |l| lines(l, "ERROR").len() >= 3);
    // What the log says, the heartbeat says: the ERROR line's reason, as it is.
    let error_line = lines(&log, "ERROR")[0];
    let reason = &error_line[error_line.find("ERROR ").unwrap() + "ERROR ".len()..];
    assert!(reason.starts_with(r#"config_malformed threshold value="30" reason="#), "{log}");
    let host = guard::daemon::hostname();
    let key = format!("agentihooks:host-guard:{host}:{TEST_USER}");
    let hb: serde_json::Value = poll(Duration::from_secs(10), || {
        let hb = serde_json::from_str(&redis.cli(&["GET", &key])).unwrap_or(serde_json::Value::Null);
        (hb["config_error"].is_string(), hb)
    });
    assert_eq!(hb["config_error"], reason, "{hb}");
    // status --fleet: an unhealthy row with the reason, exit 1.
    let fleet = Command::new(guard_bin())
        .args(["status", "--fleet"])
        .env("AGENTIHOOKS_SWARM_REDIS_URL", redis.url())
        .env_remove("AGENTIHOOKS_HIVE_REDIS_URL")
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&fleet.stdout);
    assert_eq!(fleet.status.code(), Some(1), "{table}");
    assert!(
        table.lines().any(|l| l.contains(TEST_USER) && l.ends_with(&format!("CONFIG INVALID: {reason}"))),
        "{table}"
    );

    // Mended: the heartbeat clears, and the stream has heard of the outage once each way.
    home.write_config(r#"{"threshold": 30}"#);
    let hb: serde_json::Value = poll(Duration::from_secs(10), || {
        let hb = serde_json::from_str(&redis.cli(&["GET", &key])).unwrap_or(serde_json::Value::Null);
        (hb.get("config_error").is_some_and(|e| e.is_null()), hb)
    });
    assert!(hb["config_error"].is_null(), "{hb}");
    let json = poll(Duration::from_secs(10), || {
        let json = redis.cli(&["--json", "XRANGE", "agentihooks:host-guard:events", "-", "+"]);
        (json.contains("\"config_ok\""), json)
    });
    daemon.stop();
    std::env::remove_var("AGENTIHOOKS_SWARM_REDIS_URL");
    let log = home.log();
    assert!(lines(&log, "ERROR").len() >= 3, "{log}");
    let entries: Vec<(String, Vec<String>)> = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    let config: Vec<&Vec<String>> = entries.iter().map(|(_, f)| f).filter(|f| f[5].starts_with("config_")).collect();
    assert_eq!(config.len(), 2, "once per outage, not per tick: {json}");
    assert_eq!(config[0][4..8], ["event", "config_error", "error", reason], "{json}");
    assert_eq!(config[1][4..7], ["event", "config_ok", "after_secs"], "{json}");
}

guard_test::main!();
