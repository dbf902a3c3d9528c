//! `guard-user status [--json]` (docs/operations.md): staleness decided once, the same exit code for both
//! views, and a status file the account rewrote can neither forge a row nor crash the reader.
use guard_test::guard_test;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use guard::cmd::status::{render_json, render_table};
use guard::domain::{NameStatus, PeggedProcess, RepeatOffender};
use guard::status::{self, Freshness, Status, Vitals};

const NOW: u64 = 1_700_000_000;

fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(NOW)
}

fn status(last_tick_ago: f64) -> Status {
    Status {
        version: "0.1.0".into(),
        user: "alice".into(),
        uid: 1000,
        pid: 4242,
        backend: "ebpf".into(),
        started_at: NOW as f64 - 3600.0,
        last_tick: NOW as f64 - last_tick_ago,
        interval_secs: 60.0,
        tracked_processes: 45,
        names: vec![
            NameStatus {
                name: "sleep".into(),
                count: 31,
                threshold: 30,
                flagged_since: Some(NOW as f64 - 120.0),
                time_left_secs: Some(3480.0),
                would_skip: Some(1),
                would_end: Some(30),
                excluded: false,
                warned: false,
            },
            NameStatus { name: "yes".into(), count: 16, threshold: 30, ..Default::default() },
        ],
        ..Default::default()
    }
}

#[guard_test]
fn a_tick_older_than_two_intervals_is_stale() {
    let fresh = |ago: f64, interval: f64| Freshness::of(NOW as f64 - ago, interval, now());
    assert_eq!(fresh(120.0, 60.0), Freshness { age_secs: 120.0, stale: false });
    assert!(fresh(120.5, 60.0).stale);
    assert!(!fresh(2.0, 0.0).stale, "an interval under a second counts as one");
    assert!(fresh(2.5, 0.0).stale);
    assert_eq!(fresh(-30.0, 60.0), Freshness { age_secs: 0.0, stale: false }, "a tick in the future");
    let absurd = Freshness::of(-1e308, 60.0, now());
    assert!(absurd.stale && absurd.age_secs.is_finite());
    assert_eq!(status(121.0).freshness(now()), fresh(121.0, 60.0));
}

#[guard_test]
fn json_carries_stale_and_the_age_and_still_reads_as_a_status() {
    for (ago, stale) in [(30.0, false), (600.0, true)] {
        let s = status(ago);
        let json = render_json(&s, now());
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["stale"], stale, "{json}");
        assert_eq!(value["last_tick_age_secs"], ago, "{json}");
        assert_eq!(value["tracked_processes"], 45);
        assert_eq!(serde_json::from_str::<Status>(&json).unwrap(), s);
    }
}

#[guard_test]
fn the_table_says_stale_and_shows_both_process_counts() {
    let mut s = status(600.0);
    let table = render_table(&s, now());
    assert!(table.contains("last tick    10m00s ago (STALE: the guard is not ticking)\n"), "{table}");
    assert!(table.contains("tracked      45 processes\n"), "{table}");
    s.machine_processes = Some(412);
    let table = render_table(&status_with(s, 30.0), now());
    assert!(table.contains("tracked      45 processes of alice (412 on the machine)\n"), "{table}");
    assert!(!table.contains("STALE"), "{table}");
}

fn status_with(mut s: Status, ago: f64) -> Status {
    s.last_tick = NOW as f64 - ago;
    s
}

#[guard_test]
fn an_older_status_file_reads_and_shows_no_empty_sections() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("guard-status.json");
    let mut old = serde_json::to_value(status(10.0)).unwrap();
    for field in ["machine_processes", "repeat_offenders", "pegged", "vitals", "sessions"] {
        assert!(old.as_object_mut().unwrap().remove(field).is_some(), "{field}");
    }
    // Older guards wrote these names (docs/json.md, older status files), and warnings as text.
    let rename = |v: &mut serde_json::Value, from: &str, to: &str| {
        let x = v.as_object_mut().unwrap().remove(from).unwrap_or_else(|| panic!("{from}"));
        v[to] = x;
    };
    rename(&mut old, "started_at_unix", "started_at");
    rename(&mut old, "last_tick_unix", "last_tick");
    for row in old["names"].as_array_mut().unwrap() {
        rename(row, "flagged_since_unix", "flagged_since");
        rename(row, "due_in_secs", "time_left_secs");
        row.as_object_mut().unwrap().remove("warned");
    }
    old["warnings"] = serde_json::json!(["sleep: enforcement due in 58m: ends 30, skips 1"]);
    std::fs::write(&path, old.to_string()).unwrap();
    let s = status::read(&path, guard::safefs::FsIdentity::current()).expect("a status file without the newer fields");
    assert_eq!(s, status(10.0));
    let table = render_table(&s, now());
    for absent in ["warning", "daemon", "REPEAT", "PEGGED", "on the machine"] {
        assert!(!table.contains(absent), "{absent} in\n{table}");
    }
}

#[guard_test]
fn optional_sections_show_when_the_daemon_fills_them() {
    let mut s = status(10.0);
    s.names[0].warned = true;
    s.repeat_offenders = vec![RepeatOffender { name: "sleep".into(), enforcements_24h: 4, kills_24h: 120 }];
    s.pegged = vec![PeggedProcess { pid: 77, name: "spin".into(), cpu: 0.98, for_secs: 600.0 }];
    s.vitals = Some(Vitals { cpu_percent: Some(0.3), rss_bytes: Some(12 << 20), ..Default::default() });
    let table = render_table(&s, now());
    assert!(table.contains("warning      sleep: enforcement due in 58m: ends 30, skips 1\n"), "{table}");
    assert!(table.contains("daemon       cpu 0.3%, rss 12.0 MiB\n"), "{table}");
    assert!(table.contains("sleep                           4       120\n"), "{table}");
    assert!(table.contains("spin                   77   0.98     10m00s\n"), "{table}");
}

#[guard_test]
fn a_name_holding_a_newline_cannot_forge_a_row() {
    let mut s = status(10.0);
    let forged = "x\nsleep               31         30 2023-11-14 22:13:20     58m00s          0        31";
    s.names[1].name = forged.into();
    s.names.push(NameStatus { name: "\u{1b}[2J\u{9b}1A\u{202e}evil\r".into(), count: 15, ..Default::default() });
    s.user = "alice\u{1b}]0;owned\u{7}".into();
    s.config_error = Some("config_malformed excludeCommands pattern=a\nKILLED".into());
    s.names[2].warned = true;
    s.repeat_offenders = vec![RepeatOffender { name: "r\nPEGGED".into(), ..Default::default() }];
    s.pegged = vec![PeggedProcess { name: "p\n".into(), ..Default::default() }];
    let table = render_table(&s, now());
    assert!(!table.contains(['\r', '\u{1b}', '\u{7}', '\u{9b}', '\u{202e}']), "{table:?}");
    let name_rows = table.lines().skip_while(|l| !l.starts_with("NAME ")).skip(1).take_while(|l| !l.is_empty());
    assert_eq!(name_rows.count(), 3, "{table}");
    assert_eq!(table.lines().filter(|l| l.starts_with("warning ")).count(), 1, "{table}");
    assert_eq!(table.lines().filter(|l| l.starts_with("config ")).count(), 1, "{table}");
    assert_eq!(table.lines().count(), render_table(&status_plain_sections(), now()).lines().count() + 1);

    let json = render_json(&s, now());
    assert!(!json.contains(['\r', '\u{1b}', '\u{7}', '\u{9b}', '\u{202e}']), "{json:?}");
    assert_eq!(serde_json::from_str::<Status>(&json).unwrap(), s, "the JSON escapes mean the same text");
}

/// The same shape as the hostile status above (one more name row), with harmless texts.
fn status_plain_sections() -> Status {
    let mut s = status(10.0);
    s.config_error = Some("config_malformed".into());
    s.names[0].warned = true;
    s.repeat_offenders = vec![RepeatOffender { name: "r".into(), ..Default::default() }];
    s.pegged = vec![PeggedProcess { name: "p".into(), ..Default::default() }];
    s
}

#[guard_test]
fn absurd_numbers_in_the_status_file_do_not_crash_the_views() {
    let mut s = status(10.0);
    s.started_at = -1e300;
    s.last_tick = -1e300;
    s.interval_secs = 1e300;
    s.names[0].flagged_since = Some(1e300);
    s.names[0].time_left_secs = Some(-5.0);
    s.pegged = vec![PeggedProcess { for_secs: 1e300, cpu: -1.0, ..Default::default() }];
    s.vitals = Some(Vitals { tick_duration_last_secs: Some(1e300), ..Default::default() });
    let table = render_table(&s, now());
    assert!(table.contains("sleep"), "{table}");
    let json = render_json(&s, now());
    assert!(serde_json::from_str::<serde_json::Value>(&json).is_ok(), "{json}");
}

/// The binary: `status` and `status --json` exit 1 on a stale status, 0 on a fresh one.
#[guard_test]
fn both_views_exit_one_when_the_status_is_stale() {
    let home = tempfile::tempdir().unwrap();
    let user = guard::account::Account::resolve(None).map(|a| a.account.name).unwrap_or_else(|_| "root".into());
    let real_now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
    for (ago, code, stale) in [(5.0, 0, false), (600.0, 1, true)] {
        let s = Status { last_tick: real_now - ago, ..status(0.0) };
        std::fs::write(home.path().join("guard-status.json"), serde_json::to_vec(&s).unwrap()).unwrap();
        for json in [false, true] {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_guard-user"));
            cmd.args(["status", "--user", &user, "--home"]).arg(home.path());
            if json {
                cmd.arg("--json");
            }
            let out = cmd.output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert_eq!(out.status.code(), Some(code), "json={json} ago={ago}: {stdout}");
            if json {
                let value: serde_json::Value = serde_json::from_str(&stdout).unwrap();
                assert_eq!(value["stale"], stale, "{stdout}");
            } else {
                assert_eq!(stdout.contains("STALE"), stale, "{stdout}");
            }
        }
    }
}

/// The binary: a fresh status whose last tick had a config error shows the ERROR line's reason
/// exactly as the log has it, in both views, and exits 1 like a stale one: the guard ended nothing.
#[guard_test]
fn both_views_show_a_config_error_as_logged_and_exit_one() {
    let home = tempfile::tempdir().unwrap();
    let user = guard::account::Account::resolve(None).map(|a| a.account.name).unwrap_or_else(|_| "root".into());
    let real_now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
    let reason = guard::config::parse(br#"{"threshold": "30"}"#, home.path()).unwrap_err().log_reason();
    assert!(reason.starts_with(r#"config_malformed threshold value="30" reason="#), "{reason}");
    let s = Status { last_tick: real_now - 5.0, config_error: Some(reason.clone()), ..status(0.0) };
    std::fs::write(home.path().join("guard-status.json"), serde_json::to_vec(&s).unwrap()).unwrap();
    for json in [false, true] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_guard-user"));
        cmd.args(["status", "--user", &user, "--home"]).arg(home.path());
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "json={json}: {stdout}");
        if json {
            let value: serde_json::Value = serde_json::from_str(&stdout).unwrap();
            assert_eq!(value["config_error"], reason.as_str(), "{stdout}");
            assert_eq!(value["stale"], false, "{stdout}");
        } else {
            let row = stdout.lines().find(|l| l.starts_with("config ")).unwrap_or_else(|| panic!("{stdout}"));
            assert_eq!(row, format!("config       INVALID, so nothing is ended: {reason}"));
        }
    }
}

/// A status file an older guard wrote, with sessions and the stall watch: the names it used
/// (docs/json.md, older status files) read as today's, so `status` and `tree` keep working
/// across an upgrade until the daemon restarts.
#[guard_test]
fn an_older_status_files_session_and_pegged_names_read_as_the_new_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("guard-status.json");
    let mut old = serde_json::to_value(status(10.0)).unwrap();
    old["pegged"] = serde_json::json!([{"pid": 7, "name": "spin", "cpu": 0.9, "for_secs": 300.0}]);
    old["sessions"] = serde_json::json!({"leftovers": "stop", "sessions": [{
        "root_pid": 200, "root_start": 1234, "root_name": "w", "command": "w", "since": 5.0,
        "stage": "grace", "ended_at": 6.0, "due_at": 16.0,
        "processes": [{"pid": 201, "start": 1240, "name": "kid"}]}]});
    std::fs::write(&path, old.to_string()).unwrap();
    let s = status::read(&path, guard::safefs::FsIdentity::current()).expect("an older status file");
    assert_eq!(s.pegged[0].cpu, 0.9);
    let row = &s.sessions.as_ref().unwrap().sessions[0];
    assert_eq!((row.root_start, row.since, row.ended_at, row.due_at), (1234, Some(5.0), Some(6.0), Some(16.0)));
    assert_eq!(row.processes[0].start, 1240);
    // Written back with today's names only.
    let now = serde_json::to_value(&s).unwrap();
    assert_eq!(now["pegged"][0]["cpu_cores"], 0.9);
    assert_eq!(now["sessions"]["sessions"][0]["root_start_ticks"], 1234);
    assert_eq!(now["sessions"]["sessions"][0]["processes"][0]["start_ticks"], 1240);
    assert!(now["sessions"]["sessions"][0].get("due_at").is_none());
}

guard_test::main!();
