//! The swarm Redis mirror's parts that need no server (docs/operations.md): which endpoint, how it is
//! printed, the `check` lines and the fleet table. The server tests are in redis_mirror.rs.
use guard_test::guard_test;
use std::time::{Duration, UNIX_EPOCH};

use guard::cmd::fleet::{fleet_exit_code, fleet_json, fleet_table};
use guard::mirror::query::Read;
use guard::mirror::{check_lines, Endpoint, Heartbeat, MirrorError};

const SECRET: &str = "secret";

fn heartbeat(user: &str, pid: u32) -> Heartbeat {
    Heartbeat {
        host: "box1".into(),
        user: user.into(),
        home: format!("/home/{user}"),
        pid,
        version: guard::VERSION.into(),
        backend: "ebpf".into(),
        dry_run: false,
        last_tick: 1_000_000,
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

#[guard_test]
fn endpoint_follows_spec_precedence() {
    let hive = "redis://hive:1/0";
    let swarm = "redis://swarm:2/0";
    for hive_value in [None, Some(""), Some("  "), Some(hive)] {
        for swarm_value in [None, Some(""), Some(swarm)] {
            for mode in [None, Some(""), Some("local"), Some("LOCAL"), Some("hive")] {
                let env = |name: &str| {
                    match name {
                        "AGENTIHOOKS_HIVE_REDIS_URL" => hive_value,
                        "AGENTIHOOKS_SWARM_REDIS_URL" => swarm_value,
                        "AGENTIHOOKS_LEDGER_MODE" => mode,
                        _ => None,
                    }
                    .map(String::from)
                };
                let local = mode.is_some_and(|m| m.eq_ignore_ascii_case("local"));
                let expected = if hive_value == Some(hive) && !local {
                    hive
                } else if swarm_value == Some(swarm) {
                    swarm
                } else {
                    "redis://127.0.0.1:6379/0"
                };
                assert_eq!(
                    Endpoint::resolve(env).url,
                    expected,
                    "hive={hive_value:?} swarm={swarm_value:?} ledger_mode={mode:?}"
                );
            }
        }
    }
}

#[guard_test]
fn redacted_endpoint_has_no_credentials() {
    let cases = [
        ("redis://:secret@h:1/0", "redis://h:1/0"),
        ("redis://default:secret@h:1/0", "redis://h:1/0"),
        ("rediss://alice:secret@redis.example:6380/2", "rediss://redis.example:6380/2"),
        ("rediss://:secret@redis.example/0#insecure", "rediss://redis.example/0#insecure"),
        ("redis://:s%40cr%2Fet@h:1/0", "redis://h:1/0"),
        ("redis://:se/cr@et@h:1/0", "redis://h:1/0"),
        ("redis://:secret@h:1/0?protocol=resp3", "redis://h:1/0?protocol=resp3"),
        ("redis://h:1/0", "redis://h:1/0"),
        ("redis+unix:///run/redis.sock?db=1&pass=secret", "redis+unix:///run/redis.sock?db=1"),
        ("unix:///run/redis.sock?user=alice&pass=secret", "unix:///run/redis.sock"),
        ("unix:///tmp/a@b.sock?db=2", "unix:///tmp/a@b.sock?db=2"),
        (":secret@h:1", "h:1"),
    ];
    for (url, expected) in cases {
        let endpoint = Endpoint::new(url);
        assert_eq!(endpoint.redacted(), expected, "{url}");
        assert_eq!(endpoint.to_string(), expected, "Display of {url}");
        assert!(!format!("{endpoint:?}").contains(SECRET), "Debug of {url}");
    }
}

#[guard_test]
fn check_lines_name_the_redacted_endpoint() {
    let endpoint = Endpoint::new("redis://:secret@10.0.0.5:6379/0");
    let read = |value| Ok(Read { value, written_by: None });
    let ok: Result<Read<Option<Heartbeat>>, MirrorError> = read(Some(heartbeat("alice", 1)));
    assert_eq!(check_lines(&endpoint, "box1", "alice", &ok), None);
    assert_eq!(
        check_lines(&endpoint, "box1", "alice", &read(None)).as_deref(),
        Some("no heartbeat for box1:alice on redis://10.0.0.5:6379/0")
    );
    let down = Err(MirrorError::Timeout { endpoint: endpoint.redacted(), what: "connect" });
    assert_eq!(
        check_lines(&endpoint, "box1", "alice", &down).as_deref(),
        Some("the swarm Redis at redis://10.0.0.5:6379/0 is unreachable, so the fleet heartbeat was not checked")
    );
}

#[guard_test]
fn fleet_table_aligns_its_columns() {
    let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
    let mut a = heartbeat("alice", 10);
    a.last_tick = 1_000_000 - 12;
    a.flagged = vec![];
    let mut b = heartbeat("a-much-longer-user", 11);
    b.host = "a-much-longer-host".into();
    b.last_tick = 1_000_000 - 300;
    b.backend = "procfs".into();
    b.flagged = vec!["sleep".into(), "yes".into()];
    b.kills = 12345;
    let table = fleet_table(&[a, b], now, None);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    let header = lines[0];
    let rows = [
        ["box1", "alice", "12s ago", "ebpf", "-", "3"],
        ["a-much-longer-host", "a-much-longer-user", "5m ago", "procfs", "sleep,yes", "12345"],
    ];
    for (col, title) in ["HOST", "USER", "LAST TICK", "BACKEND", "FLAGGED", "KILLS"].iter().enumerate() {
        let at = header.find(title).unwrap_or_else(|| panic!("{title} in {header:?}"));
        for (row, cells) in lines[1..].iter().zip(&rows) {
            assert!(row[at..].starts_with(cells[col]), "column {title} of {row:?} in\n{table}");
            assert!(at == 0 || row[..at].ends_with("  "), "column {title} of {row:?} not separated\n{table}");
        }
    }
    assert!(table.lines().all(|l| !l.ends_with(' ')), "trailing spaces in\n{table}");
}

#[guard_test]
fn a_hostile_heartbeat_is_one_row_of_the_fleet_table() {
    let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
    let mut hb = heartbeat("alice\nbob  box2", 1);
    hb.host = "box1\r\u{1b}[2K".into();
    hb.flagged = vec!["a\nb".into(), "\u{202e}x".into(), "c\\x0a".into()];
    let table = fleet_table(&[hb, heartbeat("carol", 2)], now, None);
    assert_eq!(table.lines().count(), 3, "{table}");
    assert!(!table.contains(['\r', '\u{1b}', '\u{202e}']), "{table:?}");
    let row = table.lines().nth(1).unwrap();
    assert!(row.starts_with("box1\\r\\x1b[2K  alice\\nbob  box2"), "{row:?}");
    // The backslash is escaped too, so the name `a\nb` and the name `a<newline>b` never look alike.
    assert!(row.contains("a\\nb,\\xe2\\x80\\xaex,c\\\\x0a"), "{row:?}");
}

#[guard_test]
fn a_guard_whose_config_is_invalid_is_an_unhealthy_row_with_the_reason() {
    let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
    let ok = heartbeat("alice", 1);
    let reason =
        r#"config_malformed threshold value="30" reason="\"30\" is a string" fix="write a whole number >= 1, e.g. 30""#;
    let broken = Heartbeat { config_error: Some(reason.into()), ..heartbeat("bob", 2) };
    let stale = Heartbeat { last_tick: 1_000_000 - 121, ..heartbeat("carol", 3) };
    assert_eq!(fleet_exit_code(std::slice::from_ref(&ok), now, None), std::process::ExitCode::SUCCESS);
    let table = fleet_table(&[ok.clone(), broken.clone(), stale.clone()], now, None);
    let lines: Vec<&str> = table.lines().collect();
    let at = lines[0].find("HEALTH").expect("a HEALTH column");
    assert_eq!(&lines[1][at..], "ok", "{table}");
    // The reason exactly as the log has it.
    assert_eq!(lines[2][at..], format!("CONFIG INVALID: {reason}"), "{table}");
    assert_eq!(&lines[3][at..], "STALE", "{table}");
    for unhealthy in [&broken, &stale] {
        assert_eq!(fleet_exit_code(&[ok.clone(), unhealthy.clone()], now, None), std::process::ExitCode::from(1));
    }
    let json: serde_json::Value = serde_json::from_str(&fleet_json(&[broken, stale], now, None)).unwrap();
    assert_eq!(json[0]["config_error"], reason);
    assert_eq!((json[0]["stale"].as_bool(), json[1]["stale"].as_bool()), (Some(false), Some(true)));
    assert_eq!(json[1]["config_error"], serde_json::Value::Null);
}

#[guard_test]
fn a_hostile_config_error_in_a_heartbeat_stays_in_its_cell() {
    let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
    let hb = Heartbeat { config_error: Some("x\nbox9  mallory\r\u{1b}[2K\u{202e}".into()), ..heartbeat("alice", 1) };
    let table = fleet_table(&[hb.clone(), heartbeat("carol", 2)], now, None);
    assert_eq!(table.lines().count(), 3, "{table}");
    assert!(!table.contains(['\r', '\u{1b}', '\u{202e}']), "{table:?}");
    let json = fleet_json(&[hb], now, None);
    assert!(!json.contains(['\r', '\u{1b}', '\u{202e}']), "{json:?}");
}

guard_test::main!();
