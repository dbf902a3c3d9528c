use super::*;

#[test]
fn lines_follow_the_spec_grammar() {
    let body = format_body("KILLED", &[("pid", &42), ("name", &"agentihooks"), ("reason", &"ghost_detected")]);
    assert_eq!(body, "KILLED pid=42 name=agentihooks reason=ghost_detected");
    let ts = local_timestamp(SystemTime::now());
    let b = ts.as_bytes();
    assert_eq!(ts.len(), 19);
    assert!(b[4] == b'-' && b[7] == b'-' && b[10] == b' ' && b[13] == b':' && b[16] == b':', "{ts}");
}

#[test]
fn a_newline_in_a_value_cannot_forge_a_second_line() {
    let body = format_body("ERROR", &[("pattern", &"a\n2026-01-01 00:00:00 KILLED pid=1")]);
    assert_eq!(body, r#"ERROR pattern="a\n2026-01-01 00:00:00 KILLED pid=1""#);
}

#[test]
fn a_value_cannot_pass_for_another_key() {
    let name = Comm::new(b"x KILLED pid=1");
    let body = format_body("FLAGGED", &[("name", &name), ("count", &3u32)]);
    assert_eq!(body, r#"FLAGGED name="x KILLED pid=1" count=3"#);
    assert_eq!(format_body("E", &[("v", &"a=b")]), r#"E v="a=b""#);
    assert_eq!(format_body("E", &[("v", &"")]), r#"E v="""#);
}

#[test]
fn a_comm_is_escaped_from_its_bytes_once_not_from_its_display_twice() {
    let name = Comm::new(b"q\xff\\");
    assert_eq!(name.to_string(), r"q\xff\\");
    assert_eq!(format_body("FLAGGED", &[("name", &name)]), r"FLAGGED name=q\xff\\");
    // A string that merely looks escaped is escaped again: it is a different value.
    assert_eq!(format_body("FLAGGED", &[("name", &r"q\xff")]), r"FLAGGED name=q\\xff");
}

#[test]
fn paths_numbers_and_shown_values_are_log_values() {
    let p = PathBuf::from("/home/u/my state.json");
    assert_eq!(
        format_body("ERROR state_unwritable", &[("path", &p)]),
        r#"ERROR state_unwritable path="/home/u/my state.json""#
    );
    assert_eq!(format_body("T", &[("a", &1.5f64), ("b", &true), ("c", &-3i64)]), "T a=1.5 b=true c=-3");
    let err = std::io::Error::from_raw_os_error(libc::ENOENT);
    assert_eq!(
        format_body("WARN x", &[("error", &Shown(&err))]),
        r#"WARN x error="No such file or directory (os error 2)""#
    );
}

#[test]
fn syslog_priorities_follow_the_table() {
    for (body, p) in [
        ("ERROR config_missing path=/x", 3),
        ("STOPPED reason=hang", 3),
        ("STOPPED reason=error", 3),
        ("WARN backend_fallback reason=no_btf", 4),
        ("WARNING name=x count=3 due_in=5m ends=3 skips=0", 4),
        ("KILLED pid=1 name=x", 5),
        ("DRY_RUN pid=1 name=x", 5),
        ("REPEAT name=x enforcements_24h=3 kills_24h=9", 5),
        ("PEGGED pid=1 name=x cpu=1.00 for=300s", 5),
        ("LEFTOVER pid=1 name=x root=2 age=30s", 5),
        ("REAPED root=2 name=x count=1 survivors=0", 5),
        ("STARTED version=0.1.0", 5),
        ("STOPPED reason=signal", 5),
        ("RELOAD reason=sighup", 5),
        ("RESYNC reason=lost_events lost=3", 5),
        ("RESYNC reason=startup lost=0", 6),
        ("FLAGGED name=x count=3 first_flagged=now", 6),
        ("SKIPPED pid=1 name=x reason=excluded_command", 6),
        ("TICK_COMPLETE flagged=0 kills=0 errors=0", 6),
    ] {
        assert_eq!(syslog_priority(body), p, "{body}");
    }
    // A value cannot raise or lower a line's priority: only the event word and our own keys count.
    let forged = format_body("FLAGGED", &[("name", &"x reason=hang")]);
    assert_eq!(syslog_priority(&forged), 6);
    let forged = format_body("STOPPED", &[("note", &"a reason=hang b"), ("reason", &"signal")]);
    assert_eq!(syslog_priority(&forged), 5);
    let forged = format_body("RESYNC", &[("note", &"a\" reason=startup \"b"), ("reason", &"drift")]);
    assert_eq!(syslog_priority(&forged), 5, "{forged}");
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
    assert_eq!(echo_line(line, "ERROR config_missing path=/x", true), format!("<3>{line}"));
    assert_eq!(echo_line(line, "ERROR config_missing path=/x", false), line);
}

#[test]
fn the_log_file_gets_no_prefix_and_a_hand_made_body_stays_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("guard-daemon.log");
    let log = Logger::new(path.clone(), FsIdentity::current(), 1 << 20, false);
    log.raw("ERROR something value=a\nKILLED pid=1\u{85}");
    log.line("WARN config_unknown_key", &[("key", &"colour\r\nX")]);
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].ends_with(r" ERROR something value=a\x0aKILLED pid=1\xc2\x85"), "{text}");
    assert!(lines[1].ends_with(r" WARN config_unknown_key key=colour\r\nX"), "{text}");
    assert!(!text.contains('<'), "{text}");
}
