use super::{
    line::{Ended, ResyncReason, StopReason},
    *,
};
use crate::comm::Comm;

fn killed(name: &[u8]) -> Line {
    Line::Killed(Ended { pid: 42, name: Comm::new(name), count: 31, elapsed_secs: 5400.0 })
}

#[test]
fn lines_follow_the_spec_grammar() {
    assert_eq!(
        killed(b"agentihooks").body(),
        "KILLED pid=42 name=agentihooks reason=ghost_detected count=31 elapsed=1.5h"
    );
    let ts = local_timestamp(SystemTime::now());
    let b = ts.as_bytes();
    assert_eq!(ts.len(), 19);
    assert!(b[4] == b'-' && b[7] == b'-' && b[10] == b' ' && b[13] == b':' && b[16] == b':', "{ts}");
}

#[test]
fn a_newline_in_a_value_cannot_forge_a_second_line() {
    let line = Line::Error(Notice::new(What::ConfigMalformed).with("pattern", "a\n2026-01-01 00:00:00 KILLED pid=1"));
    assert_eq!(line.body(), r#"ERROR config_malformed pattern="a\n2026-01-01 00:00:00 KILLED pid=1""#);
}

#[test]
fn a_value_cannot_pass_for_another_key() {
    let name = Comm::new(b"x KILLED pid=1");
    let line = Line::Flagged { name, count: 3, minutes_ago: None };
    assert_eq!(line.body(), r#"FLAGGED name="x KILLED pid=1" count=3 first_flagged=now"#);
    assert_eq!(Line::Warn(Notice::new(What::TickOverrun).with("v", "a=b")).body(), r#"WARN tick_overrun v="a=b""#);
    assert_eq!(Line::Warn(Notice::new(What::TickOverrun).with("v", "")).body(), r#"WARN tick_overrun v="""#);
}

#[test]
fn a_comm_is_escaped_from_its_bytes_once_not_from_its_display_twice() {
    let name = Comm::new(b"q\xff\\");
    assert_eq!(name.to_string(), r"q\xff\\");
    assert!(killed(b"q\xff\\").body().contains(r" name=q\xff\\ "));
    // A string that merely looks escaped is escaped again: it is a different value.
    assert_eq!(
        Line::Warn(Notice::new(What::TickOverrun).with("name", r"q\xff")).body(),
        r"WARN tick_overrun name=q\\xff"
    );
}

#[test]
fn syslog_priorities_follow_the_table() {
    let n = Comm::new(b"x");
    let ended = Ended { pid: 1, name: n, count: 3, elapsed_secs: 0.0 };
    for (line, p) in [
        (Line::Error(Notice::new(What::ConfigMissing).with("path", "/x")), 3),
        (Line::Stopped(StopReason::Hang), 3),
        (Line::Stopped(StopReason::Error), 3),
        (Line::Warn(Notice::new(What::BackendFallback).with("reason", "no_btf")), 4),
        (Line::Warning { name: n, count: 3, due_in_secs: 300, ends: 3, skips: 0 }, 4),
        (Line::Killed(ended.clone()), 5),
        (Line::DryRun(ended), 5),
        (Line::DryRunLeftover { pid: 1, name: n, root: 2 }, 5),
        (Line::Repeat { name: n, enforcements_24h: 3, kills_24h: 9 }, 5),
        (Line::Pegged { pid: 1, name: n, cpu: 1.0, for_secs: 300 }, 5),
        (Line::Recovered { pid: 1, name: n, after_secs: 60 }, 5),
        (Line::Leftover { pid: 1, name: n, root: 2, age_secs: 30 }, 5),
        (Line::Reaped { root: 2, name: n, count: 1, survivors: 0 }, 5),
        (Line::SlotWait { slot: "b".into(), pid: 1, name: n, position: 1, mode: "queue" }, 5),
        (Line::SlotStart { slot: "b".into(), pid: 1, waited_secs: 3, reason: "turn" }, 6),
        (Line::SlotTimeout { slot: "b".into(), pid: 1, waited_secs: 1800 }, 4),
        (Line::Started { version: "0.1.0", backend: "ebpf", user: "u".into(), dry_run: false, pid: 1 }, 5),
        (Line::Stopped(StopReason::Signal), 5),
        (Line::Reload, 5),
        (Line::Resync { reason: ResyncReason::LostEvents, lost: 3 }, 5),
        (Line::Resync { reason: ResyncReason::Drift, lost: 0 }, 5),
        (Line::Resync { reason: ResyncReason::Startup, lost: 0 }, 6),
        (Line::Flagged { name: n, count: 3, minutes_ago: None }, 6),
        (Line::Skipped { pid: 1, name: n, reason: "excluded_command" }, 6),
        (Line::TickComplete { flagged: 0, kills: 0, errors: 0 }, 6),
    ] {
        assert_eq!(line.priority(), p, "{}", line.body());
    }
    // A value cannot raise or lower a line's priority: it is the variant's, whatever the text.
    assert_eq!(Line::Flagged { name: Comm::new(b"x reason=hang"), count: 3, minutes_ago: None }.priority(), 6);
}

#[test]
fn only_the_first_flagged_tick_and_the_incident_lines_are_streamed() {
    let n = Comm::new(b"x");
    assert_eq!(Line::Flagged { name: n, count: 3, minutes_ago: None }.stream(), Some("FLAGGED"));
    assert_eq!(Line::Flagged { name: n, count: 3, minutes_ago: Some(0) }.stream(), None);
    assert_eq!(Line::Recovered { pid: 1, name: n, after_secs: 1 }.stream(), Some("recovered"));
    assert_eq!(Line::TickComplete { flagged: 1, kills: 0, errors: 0 }.stream(), None);
    assert_eq!(Line::Error(Notice::new(What::ConfigMissing)).stream(), None, "config events come from the outage");
}

#[test]
fn the_journal_prefix_goes_on_stdout_only_when_journal_stream_names_it() {
    let (reader, writer) = std::io::pipe().unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: fstat fills one stat we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::fstat(writer.as_raw_fd(), &mut st) }, 0);
    let value = format!("{}:{}", st.st_dev, st.st_ino);
    assert!(journal_stream_matches(&value, writer.as_raw_fd()));
    assert!(journal_stream_matches(&value, reader.as_raw_fd()), "both ends are one pipe inode");
    assert!(!journal_stream_matches(&format!("{}:{}", st.st_dev, st.st_ino + 1), writer.as_raw_fd()));
    assert!(!journal_stream_matches("garbage", writer.as_raw_fd()));
    let line = "2026-01-01 00:00:00 ERROR config_missing path=/x\n";
    assert_eq!(echo_line(line, 3, true), format!("<3>{line}"));
    assert_eq!(echo_line(line, 3, false), line);
}

#[test]
fn the_log_file_gets_no_prefix_and_an_errors_own_reason_stays_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("guard-daemon.log");
    let log = Logger::new(path.clone(), FsIdentity::current(), 1 << 20, false);
    log.write(&Line::Error(Notice::reason(
        What::ConfigMalformed,
        "config_malformed value=a\nKILLED pid=1\u{85}".into(),
    )));
    log.write(&Line::Warn(Notice::new(What::ConfigUnknownKey).with("key", "colour\r\nX")));
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].ends_with(r" ERROR config_malformed value=a\x0aKILLED pid=1\xc2\x85"), "{text}");
    assert!(lines[1].ends_with(r" WARN config_unknown_key key=colour\r\nX"), "{text}");
    assert!(!text.contains('<'), "{text}");
}
