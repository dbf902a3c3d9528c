//! What operators read from the real binary: `guard-user validate` on broken and valid configs,
//! and the daemon's stdout under systemd (`JOURNAL_STREAM`) carrying syslog priorities while
//! its log file does not.
use guard_test::guard_test;
use std::{
    fs,
    io::{BufRead, BufReader},
    os::{fd::AsRawFd, unix::fs::chown},
    path::Path,
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

fn guard() -> Command {
    Command::new(env!("CARGO_BIN_EXE_guard-user"))
}

fn validate(dir: &Path, json: &str) -> Output {
    let file = dir.join("c.json");
    fs::write(&file, json).unwrap();
    guard().arg("validate").arg("--home").arg(dir).arg(&file).output().unwrap()
}

fn stdout_lines(o: &Output) -> Vec<String> {
    String::from_utf8(o.stdout.clone()).unwrap().lines().map(str::to_string).collect()
}

#[guard_test]
fn validate_prints_every_problem_with_its_fix_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let o = validate(dir.path(), r#"{"threshold": "30", "timeout": "5124095576030431h", "excludeCommands": ["(a"]}"#);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let lines = stdout_lines(&o);
    assert_eq!(lines[0], r#"threshold: "30" is a string; write a whole number >= 1, e.g. 30"#);
    assert!(lines[1].starts_with(r#"timeout: "5124095576030431h" is more than 1 year; write"#), "{lines:?}");
    assert!(lines[2].starts_with(r#"excludeCommands[0]: "(a" is not a valid bash extended regex ("#), "{lines:?}");
    assert!(lines[3].ends_with("c.json is invalid: 3 problems"), "{lines:?}");

    let o = validate(dir.path(), "{\n  \"threshold\": 3,\n}");
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stdout_lines(&o)[0],
        "json: invalid JSON at line 3 column 1 (trailing comma); fix the JSON syntax at that position"
    );

    let o = validate(dir.path(), r#"{"stallWatch": {"peggedFor": "1s"}, "stateFile": "s\nExecStartPre=x"}"#);
    assert_eq!(o.status.code(), Some(1));
    let lines = stdout_lines(&o);
    assert!(lines[0].starts_with(r#"stateFile: "s\nExecStartPre=x" contains a control character"#), "{lines:?}");
    assert!(lines[1].starts_with(r#"stallWatch.peggedFor: "1s" is shorter than 10s"#), "{lines:?}");
}

#[guard_test]
fn validate_refuses_an_unknown_key_naming_the_one_it_resembles_and_refuses_a_fifo_at_once() {
    // An unknown key is an error for validate (the daemon only warns, and runs on the default:
    // a misspelt key would otherwise pass CI silently). It was a warning with exit 0 before.
    let dir = tempfile::tempdir().unwrap();
    let o = validate(dir.path(), r#"{"threshold": 3, "warnBefore": 0, "stallWatch": false, "treshold": 4}"#);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let lines = stdout_lines(&o);
    assert_eq!(
        lines[0],
        r#"treshold: is not a key guard knows: the daemon would ignore it and keep that setting at its default; did you mean "threshold"?"#
    );
    assert!(lines[1].ends_with("c.json is invalid: 1 problem"), "{lines:?}");
    let o = validate(dir.path(), r#"{"threshold": 3, "warnBefore": 0, "stallWatch": false}"#);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(stdout_lines(&o)[0].ends_with("c.json is valid"), "{o:?}");

    let fifo = dir.path().join("fifo.json");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let t = Instant::now();
    let o = guard().arg("validate").arg("--home").arg(dir.path()).arg(&fifo).output().unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "validate waited on a FIFO");
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stdout_lines(&o)[0],
        format!("file: {}: it is a FIFO (named pipe); replace it with a regular file", fifo.display())
    );
}

#[guard_test]
fn validate_refuses_patterns_that_match_every_command_line_and_passes_ones_that_match_much() {
    let dir = tempfile::tempdir().unwrap();
    for (pattern, index) in [("a||b", 1), (".*", 1), ("^", 1), ("$", 1), ("()", 1), ("x|(^|[ /])*", 1)] {
        let json = format!(r#"{{"excludeCommands": ["(^|[ /])agentihooks swarm tick( |$)", {pattern:?}]}}"#);
        let o = validate(dir.path(), &json);
        assert_eq!(o.status.code(), Some(1), "{pattern}: {o:?}");
        let lines = stdout_lines(&o);
        let want = format!("excludeCommands[{index}]: {pattern:?} matches every command line, so it protects");
        assert!(lines[0].starts_with(&want) && lines[0].contains("list it in excludes"), "{pattern}: {lines:?}");
    }
    // Together, with neither alone.
    let o = validate(dir.path(), r#"{"excludeCommands": ["^$", "."]}"#);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(stdout_lines(&o)[0].starts_with("excludeCommands: together these patterns match every command line"));
    // Broad, but not everything: the empty command line, or one without a slash, stays unmatched.
    for pattern in ["^$", ".", "^[^/]*$", "[^z]", "\\b", " --keep( |$)"] {
        let json = format!(r#"{{"excludeCommands": [{pattern:?}]}}"#);
        let o = validate(dir.path(), &json);
        assert_eq!(o.status.code(), Some(0), "{pattern}: {o:?}");
    }
}

/// The daemon under "systemd": stdout is a pipe that `JOURNAL_STREAM` names. Its echoed lines
/// carry `<N>`; the log file's lines do not. Runs as root for the `nobody` account, in dry run
/// with an unreachable threshold, so it ends nothing.
#[guard_test(needs = [root])]
fn the_journal_gets_syslog_priorities_and_the_log_file_does_not() {
    let home = tempfile::Builder::new().prefix("guard-journal-").tempdir_in("/tmp").unwrap();
    chown(home.path(), Some(65534), Some(65534)).unwrap();
    fs::write(home.path().join("guard-config.json"), r#"{"threshold": 0}"#).unwrap();
    let (reader, writer) = std::io::pipe().unwrap();
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::fstat(writer.as_raw_fd(), &mut st) }, 0);
    let mut child = guard()
        .args(["run", "--user", "nobody", "--backend", "procfs", "--interval", "1s", "--dry-run", "--home"])
        .arg(home.path())
        .env("JOURNAL_STREAM", format!("{}:{}", st.st_dev, st.st_ino))
        .env_remove("AGENTIHOOKS_HIVE_REDIS_URL")
        .env("AGENTIHOOKS_SWARM_REDIS_URL", "redis://127.0.0.1:1/0")
        .stdout(writer)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = Vec::new();
    let mut out = BufReader::new(reader);
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end && !lines.iter().any(|l: &String| l.contains("TICK_COMPLETE")) {
        let mut l = String::new();
        if out.read_line(&mut l).unwrap() == 0 {
            break;
        }
        lines.push(l.trim_end().to_string());
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    lines.extend(rest.lines().map(str::to_string));
    child.wait().unwrap();

    let prefixed =
        |p: &str, event: &str| lines.iter().any(|l| l.starts_with(p) && l[p.len() + 20..].starts_with(event));
    assert!(prefixed("<5>", "STARTED "), "{lines:#?}");
    assert!(prefixed("<3>", "ERROR config_malformed threshold value=0"), "{lines:#?}");
    assert!(prefixed("<6>", "TICK_COMPLETE "), "{lines:#?}");
    assert!(prefixed("<5>", "STOPPED reason=signal"), "{lines:#?}");
    assert!(lines.iter().all(|l| l.starts_with('<')), "{lines:#?}");
    let log = fs::read_to_string(home.path().join("guard-daemon.log")).unwrap();
    let error =
        r#" ERROR config_malformed threshold value=0 reason="0 is below 1" fix="write a whole number >= 1, e.g. 30""#;
    assert!(log.contains(&format!("{error}\n")), "{log}");
    assert!(log.lines().all(|l| l.as_bytes()[0].is_ascii_digit()), "{log}");
}

guard_test::main!();
