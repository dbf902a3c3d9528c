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

#[guard_test]
fn validate_names_a_slot_pattern_bash_refuses_or_one_that_matches_every_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let o = validate(
        dir.path(),
        r#"{"slots": {"build": {"commands": ["(^|/)cargo build( |$)", "(unclosed"], "max": 2},
                      "test": {"commands": ["."], "max": 1, "mode": "queue"}}}"#,
    );
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let lines = stdout_lines(&o);
    assert!(
        lines[0].starts_with(r#"slots.build.commands[1]: "(unclosed" is not a valid bash extended regex"#),
        "{lines:?}"
    );
    assert!(
        lines[1].starts_with(r#"slots.test.commands[0]: "." matches every command line, so every command"#),
        "{lines:?}"
    );
    assert_eq!(lines.len(), 3, "{lines:?}");
    let o = validate(dir.path(), r#"{"slots": {"build": {"commands": ["(^|/)cargo build( |$)"], "max": 2}}}"#);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
}

/// Every problem, the slots' patterns too, whatever else is wrong (SPEC: validate prints every
/// problem): another key's problem, or another slot's, never hides a slot's pattern.
#[guard_test]
fn validate_lists_a_slot_pattern_problem_beside_every_other_problem() {
    let dir = tempfile::tempdir().unwrap();
    let o = validate(dir.path(), r#"{"threshold": 0, "slots": {"build": {"commands": ["."], "max": 2}}}"#);
    let lines = stdout_lines(&o);
    assert!(lines.iter().any(|l| l.starts_with("threshold:")), "{lines:?}");
    assert!(
        lines.iter().any(|l| l.starts_with(r#"slots.build.commands[0]: "." matches every command line"#)),
        "{lines:?}"
    );
    let o = validate(
        dir.path(),
        r#"{"slots": {"build": {"commands": ["(a"], "max": 2}, "zz": {"commands": ["a"], "max": 0}}}"#,
    );
    let lines = stdout_lines(&o);
    assert!(lines.iter().any(|l| l.starts_with("slots.zz.max:")), "{lines:?}");
    assert!(lines.iter().any(|l| l.starts_with(r#"slots.build.commands[0]: "(a" is not a valid"#)), "{lines:?}");
    assert!(lines.last().unwrap().ends_with("is invalid: 2 problems"), "{lines:?}");
    // What the slots' own smaller matcher refuses is said by validate, not first by the daemon:
    // alone (one costly pattern) or together with excludeCommands.
    let o = validate(dir.path(), r#"{"slots": {"build": {"commands": ["(^|/)cargo y{0,1000}"], "max": 2}}}"#);
    let lines = stdout_lines(&o);
    assert!(lines[0].starts_with("slots.build.commands[0]:") && lines[0].contains("costly"), "{lines:?}");
    let o = validate(
        dir.path(),
        r#"{"excludeCommands": ["q y{0,500}"], "slots": {"build": {"commands": ["(^|/)heavyjob slot-job w{0,500}"], "max": 2}}}"#,
    );
    let lines = stdout_lines(&o);
    assert!(lines[0].starts_with("slots:") && lines[0].contains("together"), "{lines:?}");
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

/// A pipe whose reader is already gone: every write to it fails with EPIPE.
fn closed_pipe() -> std::io::PipeWriter {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    writer
}

/// `guard-user explain X | head`: a reader that goes away ends a subcommand quietly, with the
/// status a C tool killed by SIGPIPE has (141), never a panic (101) or `Broken pipe` on stderr.
#[guard_test]
fn a_reader_that_goes_away_ends_a_subcommand_quietly() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("guard-config.json"), "{}").unwrap();
    fs::write(dir.path().join("bad.json"), r#"{"threshold": "30", "timeout": 0.5}"#).unwrap();
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() }.to_string();
    let home = dir.path().to_str().unwrap();
    let bad = dir.path().join("bad.json");
    let cases: &[&[&str]] = &[
        &["explain", "--user", &me, "--home", home, "sleep"],
        &["validate", "--user", &me, "--home", home, bad.to_str().unwrap()],
        &["match", "--pattern", "x", "--cmdline", "a", "--cmdline", "x"],
        &["match", "--user", &me, "--pattern", "."],
    ];
    for args in cases {
        let o = guard().args(*args).stdout(closed_pipe()).output().unwrap();
        assert_eq!(o.status.code(), Some(141), "{args:?}: {o:?}");
        assert!(o.stderr.is_empty(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
}

/// A daemon that cannot write its log (here: a home the account cannot write) with stderr a
/// closed pipe keeps guarding and stops cleanly on SIGTERM: the complaint goes through the
/// diagnostics, which never panic on a closed stream (it used to exit 101 on the first line).
#[guard_test(needs = [root])]
fn a_closed_stderr_never_ends_the_daemon() {
    // Root's 0700 directory: nobody can neither write its log there nor read its config.
    let home = tempfile::Builder::new().prefix("guard-closed-").tempdir_in("/tmp").unwrap();
    let (reader, writer) = std::io::pipe().unwrap();
    let mut child = guard()
        .args(["run", "--user", "nobody", "--backend", "procfs", "--interval", "1s", "--dry-run", "--home"])
        .arg(home.path())
        .env_remove("AGENTIHOOKS_HIVE_REDIS_URL")
        .env("AGENTIHOOKS_SWARM_REDIS_URL", "redis://127.0.0.1:1/0")
        .stdout(writer)
        .stderr(closed_pipe())
        .spawn()
        .unwrap();
    // Two ticks reach stdout, each after a log line that could not be written.
    let mut out = BufReader::new(reader);
    let mut ticks = 0;
    let end = Instant::now() + Duration::from_secs(60);
    while ticks < 2 && Instant::now() < end {
        let mut l = String::new();
        if out.read_line(&mut l).unwrap() == 0 {
            break;
        }
        ticks += usize::from(l.contains("TICK_COMPLETE"));
    }
    assert_eq!(ticks, 2, "the daemon stopped ticking: {:?}", child.try_wait());
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

/// Under systemd stdout and stderr are one journal stream: every line the daemon writes there,
/// log lines and diagnostics alike, starts with its `<N>` priority, so no entry is left without
/// one (a BPF error used to span three lines), and nothing tells root it "needs root".
#[guard_test(needs = [root])]
fn every_line_on_the_journal_stream_carries_a_priority() {
    let home = tempfile::Builder::new().prefix("guard-journal-").tempdir_in("/tmp").unwrap();
    chown(home.path(), Some(65534), Some(65534)).unwrap();
    fs::write(home.path().join("guard-config.json"), r#"{"threshold": 4000000}"#).unwrap();
    let (reader, writer) = std::io::pipe().unwrap();
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::fstat(writer.as_raw_fd(), &mut st) }, 0);
    // The default backend: BPF where it loads, with whatever it has to say about it.
    let mut child = guard()
        .args(["run", "--user", "nobody", "--interval", "1s", "--dry-run", "--home"])
        .arg(home.path())
        .env("JOURNAL_STREAM", format!("{}:{}", st.st_dev, st.st_ino))
        .env_remove("GUARD_LOG")
        .env_remove("AGENTIHOOKS_HIVE_REDIS_URL")
        .env("AGENTIHOOKS_SWARM_REDIS_URL", "redis://127.0.0.1:1/0")
        .stdout(writer.try_clone().unwrap())
        .stderr(writer)
        .spawn()
        .unwrap();
    let mut lines = Vec::new();
    let mut out = BufReader::new(reader);
    let end = Instant::now() + Duration::from_secs(60);
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
    assert!(lines.iter().any(|l| l.contains("TICK_COMPLETE")), "{lines:#?}");
    let priority = |l: &str| l.len() > 3 && l.starts_with('<') && l.as_bytes()[1].is_ascii_digit() && &l[2..3] == ">";
    assert!(lines.iter().all(|l| priority(l)), "{lines:#?}");
    assert!(lines.iter().all(|l| !l.contains("needs root")), "{lines:#?}");
}

/// What the daemon would take silently, `validate` names: a key written twice (with both
/// lines: the daemon uses the last), another regex dialect's syntax (what bash reads instead),
/// a stateFile the unit cannot write; and a costly pattern hides no invalid one behind it.
#[guard_test]
fn validate_names_what_the_daemon_would_take_silently() {
    let dir = tempfile::tempdir().unwrap();
    let o = validate(dir.path(), "{\n  \"threshold\": 5,\n  \"timeout\": \"1h\",\n  \"threshold\": 50\n}\n");
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert_eq!(
        stdout_lines(&o)[0],
        "threshold: is written 2 times (lines 2 and 4); the daemon uses the last one; keep only the one you mean"
    );

    let json =
        r#"{"excludeCommands": ["((a{1,255}){1,255}){1,255}", "(a", "\\d+ --port \\d", "[\\w-]+", "x.*?y", "ok"]}"#;
    let o = validate(dir.path(), json);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let lines = stdout_lines(&o);
    let at = |key: &str| lines.iter().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("{key}: {lines:#?}"));
    assert!(at("excludeCommands[0]: is too costly").contains("regex nodes"));
    assert!(at("excludeCommands[1]: ").contains("is not a valid bash extended regex"), "hidden behind [0]");
    assert!(at("excludeCommands[2]: ").contains("bash reads `\\d` as the letter d (write [0-9] for a digit)"));
    assert!(at("excludeCommands[3]: ").contains("bash reads `[\\w-]` as two characters"));
    // Lazy `*?` matches the same command lines in bash: a warning only.
    assert!(at("warning: excludeCommands[4]: ").contains("bash reads `*?` as a repetition made optional"));
    assert!(!lines.iter().any(|l| l.contains("excludeCommands[5]")), "{lines:#?}");
    assert!(lines.last().unwrap().ends_with("c.json is invalid: 4 problems"), "{lines:#?}");

    let o = validate(dir.path(), r#"{"excludeCommands": ["(?i)claude"]}"#);
    assert!(stdout_lines(&o)[0].contains("for (?i) write each letter as [Aa]"), "{o:?}");

    std::fs::create_dir(dir.path().join("s")).unwrap();
    std::fs::write(dir.path().join("f"), "").unwrap();
    for (state, unwritable) in [
        ("/var/lib/guard/state.json", true),
        ("~/../other/state.json", true),
        ("~/s/state.json", false),
        ("state.json", false),
        // In the home, but in a directory the daemon would not find (it creates none).
        ("~/nodir/state.json", true),
        ("~/f/state.json", true),
    ] {
        let o = validate(dir.path(), &format!(r#"{{"stateFile": {state:?}}}"#));
        let lines = stdout_lines(&o);
        assert_eq!(o.status.code(), Some(if unwritable { 1 } else { 0 }), "{state}: {lines:?}");
        assert_eq!(
            lines[0].starts_with("stateFile: ") && lines[0].contains("state_unwritable"),
            unwritable,
            "{lines:?}"
        );
    }
}

/// `match --pattern` speaks of the pattern it was given, not of a config list it never read.
#[guard_test]
fn match_names_its_own_pattern_and_what_bash_reads() {
    let o = guard().args(["match", "--pattern", "(?i)claude", "--cmdline", "claude"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(err.starts_with("guard-user match: --pattern \"(?i)claude\" is not a valid bash extended regex"), "{err}");
    assert!(!err.contains("excludeCommands"), "{err}");
    let o = guard().args(["match", "--pattern", "((a{1,255}){1,255}){1,255}", "--cmdline", "a"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(!String::from_utf8_lossy(&o.stderr).contains("excludeCommands"), "{o:?}");
    // Valid but another dialect's: answered as bash reads it, with a note on stderr.
    let o = guard().args(["match", "--pattern", "^\\d$", "--cmdline", "d", "--cmdline", "5"]).output().unwrap();
    assert_eq!((o.status.code(), stdout_lines(&o)), (Some(0), vec!["match".to_string(), "other".into()]));
    assert!(String::from_utf8_lossy(&o.stderr).contains("bash reads `\\d` as the letter d"), "{o:?}");
}

guard_test::main!();

/// `match --roots` tries the pattern as one of `sessions.roots`: one that matches every ordinary
/// command line or the empty one is refused with exit 2 as validate and the daemon refuse it, an
/// invalid one is named under `sessions.roots` too, and one that leaves any ordinary line alone is
/// answered like any pattern.
#[guard_test]
fn match_roots_refuses_what_the_daemon_refuses_and_names_sessions_roots() {
    let run = |pattern: &str, lines: &[&str]| {
        let mut args = vec!["match", "--roots", "--pattern", pattern];
        for l in lines {
            args.extend(["--cmdline", l]);
        }
        guard().args(&args).output().unwrap()
    };
    for broad in ["^", ".*", "[a-z]", "[[:alnum:]]"] {
        let o = run(broad, &["x"]);
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert_eq!(o.status.code(), Some(2), "{broad}: {err}");
        let want = format!(
            "guard-user match: sessions.roots: --pattern \"{broad}\" matches every ordinary command line (or the \
             empty one), so nearly every process would be a session root and every orphan a leftover; match only \
             the command lines of the programs that start sessions"
        );
        assert!(err.starts_with(&want), "{broad}: {err}");
        assert!(o.stdout.is_empty(), "{broad}");
    }
    let o = run("(", &["x"]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with("guard-user match: sessions.roots: --pattern \"(\" is not a valid bash extended regex"),
        "{err}"
    );
    // Without --roots, the pattern is only --pattern's.
    let o = guard().args(["match", "--pattern", "(", "--cmdline", "x"]).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).starts_with("guard-user match: --pattern \"(\""));
    let o = run("^[^a]", &["apt update", "bash"]);
    assert_eq!((o.status.code(), stdout_lines(&o)), (Some(0), vec!["other".to_string(), "match".into()]));
    assert!(o.stderr.is_empty(), "{}", String::from_utf8_lossy(&o.stderr));
}
