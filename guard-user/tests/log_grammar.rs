//! The log's grammar (docs/log.md) read back by a strict parser written here from the grammar, not
//! from the writer's code: typed lines holding hostile values go through the real `Logger` (what
//! the daemon writes, `Line::body` and all) into a real file, and every line must parse to
//! exactly the event, keys and value bytes that were logged.
//!
//! ```text
//! line   = timestamp " " event *(" " key "=" value) "\n"
//! event  = word *(" " word)          ; words hold no "=" (EVENT, or `WARN what`, `ERROR what`)
//! value  = bare / quoted
//! bare   = 1*(char / escape)         ; char: printable, not space, `"`, `=` or `\`
//! quoted = DQUOTE *(char / " " / "=" / escape / `\"`) DQUOTE
//! escape = `\\` / `\n` / `\t` / `\r` / `\x` 2lowerhex
//! ```

use guard::{
    comm::Comm,
    log::{
        line::{Ended, ResyncReason, StopReason, UnflagReason},
        Kind, Line as LogLine, Logger, Notice, What,
    },
    mirror::wire::StreamEvent,
    safefs::FsIdentity,
};
use guard_test::{guard_test, rng::Rng};

#[derive(Debug, PartialEq)]
struct Line {
    event: String,
    fields: Vec<(String, Vec<u8>)>,
    /// The keys whose value was written in double quotes (a config value that is a string
    /// where another type belongs always is: `value="30"`, never `value=30`).
    quoted: Vec<String>,
}

fn hex(c: u8) -> Result<u8, String> {
    match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        _ => Err(format!("bad hex digit {:?}", c as char)),
    }
}

/// Parses one line (without its newline) strictly; any deviation is an error.
fn parse(line: &str) -> Result<Line, String> {
    let b = line.as_bytes();
    if b.len() < 20 || b[19] != b' ' {
        return Err("no timestamp".into());
    }
    for (i, &c) in b[..19].iter().enumerate() {
        let ok = match i {
            4 | 7 => c == b'-',
            10 => c == b' ',
            13 | 16 => c == b':',
            _ => c.is_ascii_digit(),
        };
        if !ok {
            return Err(format!("bad timestamp at {i}"));
        }
    }
    let rest = &line[20..];
    let mut words = Vec::new();
    let mut i = 0;
    let r = rest.as_bytes();
    // Event words: up to the first word holding `=`.
    loop {
        let end = rest[i..].find(' ').map(|n| i + n).unwrap_or(rest.len());
        let word = &rest[i..end];
        if word.contains('=') {
            break;
        }
        if word.is_empty() || !word.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'.') {
            return Err(format!("bad event word {word:?}"));
        }
        words.push(word.to_string());
        if end == rest.len() {
            return Ok(Line { event: words.join(" "), fields: Vec::new(), quoted: Vec::new() });
        }
        i = end + 1;
    }
    let mut fields = Vec::new();
    let mut quoted_keys = Vec::new();
    while i < r.len() {
        let eq = rest[i..].find('=').ok_or("a key without =")? + i;
        let key = &rest[i..eq];
        if key.is_empty() || !key.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'.') {
            return Err(format!("bad key {key:?}"));
        }
        i = eq + 1;
        let quoted = r.get(i) == Some(&b'"');
        if quoted {
            i += 1;
        }
        let mut value = Vec::new();
        loop {
            let Some(&c) = r.get(i) else {
                if quoted {
                    return Err("unterminated quote".into());
                }
                break;
            };
            match c {
                b'"' if quoted => {
                    i += 1;
                    break;
                }
                b' ' if !quoted => break,
                b'"' | b'=' if !quoted => return Err(format!("{:?} in a bare value", c as char)),
                b'\\' => {
                    let e = *r.get(i + 1).ok_or("a trailing backslash")?;
                    i += 2;
                    match e {
                        b'\\' => value.push(b'\\'),
                        b'"' if quoted => value.push(b'"'),
                        b'n' => value.push(b'\n'),
                        b't' => value.push(b'\t'),
                        b'r' => value.push(b'\r'),
                        b'x' => {
                            let (h, l) = (*r.get(i).ok_or("short \\x")?, *r.get(i + 1).ok_or("short \\x")?);
                            value.push(hex(h)? << 4 | hex(l)?);
                            i += 2;
                        }
                        other => return Err(format!("unknown escape \\{}", other as char)),
                    }
                }
                c if c < 0x20 || c == 0x7f => return Err(format!("raw control byte {c:#x}")),
                c => {
                    value.push(c);
                    i += 1;
                }
            }
        }
        if !quoted && value.is_empty() {
            return Err(format!("empty bare value for {key}"));
        }
        if quoted {
            quoted_keys.push(key.to_string());
        }
        fields.push((key.to_string(), value));
        match r.get(i) {
            None => break,
            Some(b' ') => i += 1,
            Some(c) => return Err(format!("{:?} after a value", *c as char)),
        }
        if i == r.len() {
            return Err("trailing space".into());
        }
    }
    // Characters a viewer would take as a line break or hide must not appear unescaped.
    if line.contains(['\u{85}', '\u{2028}', '\u{2029}', '\u{202e}']) {
        return Err("an unescaped line separator or bidi control".into());
    }
    Ok(Line { event: words.join(" "), fields, quoted: quoted_keys })
}

/// Hostile values, as bytes.
fn hostile() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    v.extend(
        [
            &b"\n2026-01-01 00:00:00 KILLED pid=1"[..],
            b"x KILLED pid=1",
            b"a=b c",
            b"",
            b"\"",
            b"\"\"",
            b"a\"b",
            b"\"a b\"",
            b"\\",
            b"\\\\",
            b"\\x41",
            b"\\\"",
            b"trailing\\",
            b"q\xff",
            b"q\xfe",
            b"\xc3",
            b"\xed\xa0\x80",
            b"\r\n",
            b"\x1b[2J\x1b[31mred",
            b"name=x",
            b"=",
            b" ",
            b"pid=1 ",
        ]
        .iter()
        .map(|s| s.to_vec()),
    );
    for s in ["a\u{2028}b", "a\u{2029}b", "\u{85}", "\u{9b}31m", "\u{202e}gnp.exe", "\u{feff}", "café ✓", "\u{a0}"] {
        v.push(s.as_bytes().to_vec());
    }
    // Pseudo-random byte strings (fixed seed).
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..5_000 {
        let mut s = Vec::new();
        for _ in 0..rng.next_u64() % 40 {
            let x = rng.next_u64();
            // Bias towards the interesting bytes.
            s.push(match x % 4 {
                0 => b" =\"\\\n\r\t"[(x >> 8) as usize % 7],
                1 => (x >> 16) as u8 | 0x80,
                _ => (x >> 24) as u8,
            });
        }
        v.push(s);
    }
    v
}

/// Writes `lines` through a real `Logger` into a real file and parses what it wrote.
fn written(lines: &[LogLine]) -> Vec<(String, Line)> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("guard-daemon.log");
    let log = Logger::new(path.clone(), FsIdentity::current(), u64::MAX, false);
    for l in lines {
        log.write(l);
    }
    let text = String::from_utf8(std::fs::read(&path).unwrap()).expect("the log is UTF-8");
    let out: Vec<(String, Line)> = text
        .split_terminator('\n')
        .map(|l| (l.to_string(), parse(l).unwrap_or_else(|e| panic!("{e}: {l:?}"))))
        .collect();
    assert_eq!(out.len(), lines.len(), "one line per event:\n{text}");
    out
}

#[guard_test]
fn every_hostile_value_round_trips_through_a_real_log_file() {
    let values = hostile();
    let mut lines = Vec::new();
    for v in &values {
        let name = Comm::new(v);
        let text = String::from_utf8_lossy(v).into_owned();
        lines.push(LogLine::Flagged { name, count: 3, minutes_ago: None });
        lines.push(LogLine::Killed(Ended { pid: 7, name, count: 3, elapsed_secs: 5400.0 }));
        lines.push(LogLine::Warn(Notice::new(What::ConfigUnknownKey).with("path", v.as_slice()).with("text", text)));
    }
    let parsed = written(&lines);
    for (chunk, v) in parsed.chunks(3).zip(&values) {
        let name = Comm::new(v);
        let (line, flagged) = &chunk[0];
        assert_eq!(flagged.event, "FLAGGED");
        let keys: Vec<&str> = flagged.fields.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["name", "count", "first_flagged"], "{line}");
        assert_eq!(flagged.fields[0].1, name.as_bytes(), "{line}");
        let (line, killed) = &chunk[1];
        assert_eq!(killed.event, "KILLED");
        assert_eq!(killed.fields[1], ("name".to_string(), name.as_bytes().to_vec()), "{line}");
        assert_eq!(killed.fields[4].1, b"1.5h", "{line}");
        let (line, warn) = &chunk[2];
        assert_eq!(warn.event, "WARN config_unknown_key");
        assert_eq!(&warn.fields[0].1, v, "{line}");
        assert_eq!(warn.fields[1].1, String::from_utf8_lossy(v).as_bytes(), "{line}");
    }
}

/// One line of every kind, as the daemon builds them, with a hostile name where a line has one.
fn one_of_each(name: Comm) -> Vec<LogLine> {
    let ended = Ended { pid: 9, name, count: 4, elapsed_secs: 61.0 };
    vec![
        LogLine::Flagged { name, count: 4, minutes_ago: None },
        LogLine::Flagged { name, count: 4, minutes_ago: Some(3) },
        LogLine::Unflagged { name, count: 1, flagged_for_mins: 2, reason: UnflagReason::BelowThreshold },
        LogLine::Warning { name, count: 4, due_in_secs: 61, ends: 3, skips: 1 },
        LogLine::Killed(ended.clone()),
        LogLine::DryRun(ended),
        LogLine::DryRunLeftover { pid: 9, name, root: 2 },
        LogLine::Skipped { pid: 9, name, reason: "excluded_command" },
        LogLine::Repeat { name, enforcements_24h: 3, kills_24h: 9 },
        LogLine::Pegged { pid: 9, name, cpu: 1.0, for_secs: 300 },
        LogLine::Recovered { pid: 9, name, after_secs: 60 },
        LogLine::Leftover { pid: 9, name, root: 2, age_secs: 30 },
        LogLine::Reaped { root: 2, name, count: 1, survivors: 0 },
        LogLine::SlotWait { slot: "build".into(), pid: 9, name, position: 2, mode: "queue" },
        LogLine::SlotStart { slot: "build".into(), pid: 9, waited_secs: 61, reason: "turn" },
        LogLine::SlotTimeout { slot: "build".into(), pid: 9, waited_secs: 1800 },
        LogLine::Started { version: "0.1.0", backend: "ebpf", user: "a b=c".into(), dry_run: true, pid: 1 },
        LogLine::Stopped(StopReason::Hang),
        LogLine::Reload,
        LogLine::Resync { reason: ResyncReason::LostEvents, lost: 3 },
        LogLine::TickComplete { flagged: 1, kills: 1, errors: 0 },
        LogLine::Warn(Notice::new(What::RedisUnreachable).with("endpoint", "redis://h:6379/0")),
        LogLine::Warn(Notice::new(What::SessionsCap).with("what", "sessions").with("limit", 1024usize)),
        LogLine::Error(Notice::new(What::StateUnwritable).with("path", "/home/u/my state.json")),
    ]
}

#[guard_test]
fn every_kind_of_line_the_daemon_writes_follows_the_grammar_with_its_documented_keys() {
    let name = Comm::new(b"x KILLED pid=1\n");
    let lines = one_of_each(name);
    let parsed = written(&lines);
    let expect: [(&str, &[&str]); 24] = [
        ("FLAGGED", &["name", "count", "first_flagged"]),
        ("FLAGGED", &["name", "count", "first_flagged"]),
        ("UNFLAGGED", &["name", "count", "flagged_for", "reason"]),
        ("WARNING", &["name", "count", "due_in", "ends", "skips"]),
        ("KILLED", &["pid", "name", "reason", "count", "elapsed"]),
        ("DRY_RUN", &["pid", "name", "reason", "count", "elapsed"]),
        ("DRY_RUN", &["pid", "name", "reason", "root"]),
        ("SKIPPED", &["pid", "name", "reason"]),
        ("REPEAT", &["name", "enforcements_24h", "kills_24h"]),
        ("PEGGED", &["pid", "name", "cpu", "for"]),
        ("RECOVERED", &["pid", "name", "after"]),
        ("LEFTOVER", &["pid", "name", "root", "age"]),
        ("REAPED", &["root", "name", "count", "survivors"]),
        ("SLOT_WAIT", &["slot", "pid", "name", "position", "mode"]),
        ("SLOT_START", &["slot", "pid", "waited", "reason"]),
        ("SLOT_TIMEOUT", &["slot", "pid", "waited"]),
        ("STARTED", &["version", "backend", "user", "dry_run", "pid"]),
        ("STOPPED", &["reason"]),
        ("RELOAD", &["reason"]),
        ("RESYNC", &["reason", "lost"]),
        ("TICK_COMPLETE", &["flagged", "kills", "errors"]),
        ("WARN redis_unreachable", &["endpoint"]),
        ("WARN sessions_cap", &["what", "limit"]),
        ("ERROR state_unwritable", &["path"]),
    ];
    for ((line, p), (typed, (event, keys))) in parsed.iter().zip(lines.iter().zip(expect)) {
        assert_eq!(p.event, event, "{line}");
        assert!(p.event.starts_with(typed.kind().word()), "{line}");
        let got: Vec<&str> = p.fields.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(got, keys, "{line}");
        if let Some((_, v)) = p.fields.iter().find(|(k, _)| k == "name") {
            assert_eq!(v, name.as_bytes(), "{line}");
        }
    }
    // The texts docs/log.md shows, byte for byte.
    let bodies: Vec<&str> = parsed.iter().map(|(l, _)| &l[20..]).collect();
    assert_eq!(bodies[1], r#"FLAGGED name="x KILLED pid=1\n" count=4 first_flagged=3m_ago"#);
    assert_eq!(bodies[3], r#"WARNING name="x KILLED pid=1\n" count=4 due_in=2m ends=3 skips=1"#);
    assert_eq!(bodies[4], r#"KILLED pid=9 name="x KILLED pid=1\n" reason=ghost_detected count=4 elapsed=0.0h"#);
    assert_eq!(bodies[9], r#"PEGGED pid=9 name="x KILLED pid=1\n" cpu=1.00 for=300s"#);
    assert_eq!(bodies[13], r#"SLOT_WAIT slot=build pid=9 name="x KILLED pid=1\n" position=2 mode=queue"#);
    assert_eq!(bodies[14], "SLOT_START slot=build pid=9 waited=61s reason=turn");
    assert_eq!(bodies[15], "SLOT_TIMEOUT slot=build pid=9 waited=1800s");
    assert_eq!(bodies[16], r#"STARTED version=0.1.0 backend=ebpf user="a b=c" dry_run=1 pid=1"#);
    assert_eq!(bodies[22], "WARN sessions_cap what=sessions limit=1024");
    assert_eq!(bodies[23], r#"ERROR state_unwritable path="/home/u/my state.json""#);
}

#[guard_test]
fn one_of_each_writes_every_kind_of_line() {
    // `Kind::ALL` is every kind (declared from one list), so a new kind fails here until
    // `one_of_each` writes one, and the grammar and docs checks below then see it.
    let written: std::collections::BTreeSet<&str> =
        one_of_each(Comm::new(b"x")).iter().map(|l| l.kind().word()).collect();
    let all: std::collections::BTreeSet<&str> = Kind::ALL.iter().map(|k| k.word()).collect();
    assert_eq!(written, all, "one_of_each misses a kind of line");
}

#[guard_test]
fn the_stream_decision_is_line_streams_alone() {
    // Every kind of line (`one_of_each` holds each, test above), both FLAGGED forms included:
    // the stream entry exists exactly when `Line::stream` names one, under that event.
    for line in one_of_each(Comm::new(b"x")) {
        let entry = StreamEvent::of(&line, 1_700_000_000.0).map(|e| e.event);
        assert_eq!(entry.as_deref(), line.stream(), "{}", line.body());
    }
}

#[guard_test]
fn docs_log_md_names_every_kind_of_line() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/log.md")).unwrap();
    for word in Kind::ALL.iter().map(|k| k.word()) {
        assert!(doc.contains(&format!("{word} ")), "docs/log.md never shows a {word} line");
    }
    for line in one_of_each(Comm::new(b"x")) {
        let word = line.kind().word();
        assert!(doc.contains(&format!("{word} ")), "docs/log.md never shows a {word} line");
    }
    // Each WARN has its own heading, with its keys.
    assert!(doc.contains("#### `WARN sessions_cap what=<cap> limit=<n>`"), "docs/log.md has no WARN sessions_cap");
}

#[guard_test]
fn docs_log_md_documents_every_warning_and_error_token() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/log.md")).unwrap();
    // `What::ALL` is every token the daemon can write (declared from one list), so a new one
    // fails here until docs/log.md says what it means.
    for what in What::ALL {
        let (word, token) = (what.kind().word(), what.token());
        let documented = match what.kind() {
            // A heading of its own, with its keys.
            Kind::Warn => {
                doc.contains(&format!("#### `WARN {token} ")) || doc.contains(&format!("#### `WARN {token}`"))
            }
            // Among the errors, as the line starts.
            _ => doc.contains(&format!("{word} {token}")),
        };
        assert!(documented, "docs/log.md does not document `{word} {token}`");
    }
}

#[guard_test]
fn a_comm_holding_every_byte_is_logged_and_read_back_exactly() {
    let chunks: Vec<Vec<u8>> = (0..=255u8).collect::<Vec<_>>().chunks(15).map(<[u8]>::to_vec).collect();
    let lines: Vec<LogLine> = chunks
        .iter()
        .map(|c| LogLine::Killed(Ended { pid: 7, name: Comm::new(c), count: 3, elapsed_secs: 0.0 }))
        .collect();
    for ((line, parsed), chunk) in written(&lines).iter().zip(&chunks) {
        assert_eq!(parsed.fields[1], ("name".to_string(), chunk.clone()), "{line}");
        let name = Comm::new(chunk);
        // The name's Display (status JSON, Redis, state keys) decodes to the same bytes.
        assert_eq!(Comm::from_escaped(&name.to_string()), Some(name));
    }
}

#[guard_test]
fn the_parser_rejects_forgeries_it_would_otherwise_accept() {
    // The parser is strict: the forms the writer never produces are errors, so the round trip
    // above proves the writer produced none of them.
    for bad in [
        "2026-01-01 00:00:00 KILLED pid=1 name=x KILLED pid=2",
        "2026-01-01 00:00:00 FLAGGED name=a=b",
        "2026-01-01 00:00:00 FLAGGED name=\"a",
        "2026-01-01 00:00:00 FLAGGED name=a\\q",
        "2026-01-01 00:00:00 FLAGGED name=a\u{2028}b",
        "2026-01-01 00:00:00 FLAGGED name=",
        "2026-01-01 00:00:00 FLAGGED name=a ",
    ] {
        let parsed = parse(bad);
        let duplicate_key = parsed.as_ref().is_ok_and(|l| {
            let mut keys: Vec<&str> = l.fields.iter().map(|(k, _)| k.as_str()).collect();
            keys.sort();
            keys.windows(2).any(|w| w[0] == w[1])
        });
        assert!(parsed.is_err() || duplicate_key, "{bad:?} parsed as {parsed:?}");
    }
}

/// An error's text in a `WARN` field is escaped like any value.
#[guard_test]
fn an_error_text_is_escaped_like_any_value() {
    let e = std::io::Error::other("bad\nthing");
    let parsed = written(&[LogLine::Warn(Notice::new(What::RedisUnreachable).with("error", e.to_string()))]);
    assert_eq!(parsed[0].1.event, "WARN redis_unreachable");
    assert_eq!(parsed[0].1.fields[0].1, b"bad\nthing");
}

/// The `ERROR` line of each config, written as the daemon writes it (through the real `Logger`,
/// as its `LogSink`), read back with the strict parser.
fn config_error_lines(configs: &[String]) -> Vec<Line> {
    use guard::daemon::effects::LogSink;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("guard-daemon.log");
    let log = Logger::new(path.clone(), FsIdentity::current(), u64::MAX, false);
    for json in configs {
        let e = guard::config::parse(json.as_bytes(), dir.path()).unwrap_err();
        LogSink::write(&log, &LogLine::Error(Notice::reason(e.what(), e.log_reason())));
    }
    let written = String::from_utf8(std::fs::read(&path).unwrap()).expect("the log is UTF-8");
    let lines: Vec<&str> = written.split_terminator('\n').collect();
    assert_eq!(lines.len(), configs.len(), "one line per error:\n{written}");
    lines.iter().map(|l| parse(l).unwrap_or_else(|e| panic!("{e}: {l:?}"))).collect()
}

fn field<'a>(line: &'a Line, key: &str) -> &'a [u8] {
    line.fields
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_slice())
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
}

#[guard_test]
fn a_config_value_of_the_wrong_type_is_logged_as_its_json_with_validates_reason_and_fix() {
    let huge = "x\n\u{1b}[2J ".repeat(300_000);
    let deep = format!("{}{}", "[".repeat(120), "]".repeat(120));
    let cases: Vec<(String, &str, Vec<u8>)> = vec![
        // (config, the line's event words, the value as read back; a string's is its text, quoted)
        (r#"{"threshold": "30"}"#.into(), "ERROR config_malformed threshold", b"30".to_vec()),
        (r#"{"excludes": 30}"#.into(), "ERROR config_malformed excludes", b"30".to_vec()),
        (r#"{"excludes": "30"}"#.into(), "ERROR config_malformed excludes", b"30".to_vec()),
        (r#"{"threshold": true}"#.into(), "ERROR config_malformed threshold", b"true".to_vec()),
        (r#"{"threshold": null}"#.into(), "ERROR config_malformed threshold", b"null".to_vec()),
        (r#"{"threshold": [30]}"#.into(), "ERROR config_malformed threshold", b"[30]".to_vec()),
        (r#"{"threshold": {"n": 30}}"#.into(), "ERROR config_malformed threshold", br#"{"n":30}"#.to_vec()),
        (
            r#"{"stallWatch": "a=b KILLED pid=1"}"#.into(),
            "ERROR config_malformed stallWatch",
            b"a=b KILLED pid=1".to_vec(),
        ),
        // Cut (below): the text's start, then the mark of the cut.
        (
            format!(r#"{{"threshold": {}}}"#, serde_json::to_string(&huge).unwrap()),
            "ERROR config_malformed threshold",
            huge.clone().into_bytes(),
        ),
        (format!(r#"{{"threshold": {deep}}}"#), "ERROR config_malformed threshold", deep.clone().into_bytes()),
    ];
    let configs: Vec<String> = cases.iter().map(|(c, _, _)| c.clone()).collect();
    let lines = config_error_lines(&configs);
    for ((config, event, value), line) in cases.iter().zip(&lines) {
        let shown = &config[..config.len().min(60)];
        assert_eq!(line.event, *event, "{shown}");
        let keys: Vec<&str> = line.fields.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["value", "reason", "fix"], "{shown}");
        let read = field(line, "value");
        match read.strip_suffix("…".as_bytes()) {
            // At most 200 bytes of the value's escaped text (docs/log.md), whatever its size.
            Some(start) if value.len() > 200 => {
                assert!(value.starts_with(start) && start.len() > 100, "{shown}: {}", String::from_utf8_lossy(read));
                assert!(guard::escape::text(start).len() <= 200, "{shown}");
            }
            _ => assert_eq!(read, value.as_slice(), "{shown}: {}", String::from_utf8_lossy(read)),
        }
        // The reason and the fix are validate's, byte for byte.
        let problem =
            guard::config::problems(config.as_bytes(), std::path::Path::new("/h")).into_iter().next().unwrap();
        assert_eq!(field(line, "reason"), problem.what.as_bytes(), "{shown}");
        assert_eq!(field(line, "fix"), problem.fix.as_bytes(), "{shown}");
    }
    // The string "30" and the number 30 never read the same: the string's text is quoted
    // (docs/log.md: `value="30"`), the number is bare.
    let string = |l: &Line| l.quoted.iter().any(|k| k == "value");
    assert!(string(&lines[0]) && string(&lines[2]) && !string(&lines[1]), "{lines:?}");
    assert_eq!(field(&lines[1], "value"), field(&lines[2], "value"));
    assert_eq!(field(&lines[0], "reason"), br#""30" is a string"#);
}

#[guard_test]
fn a_bad_list_element_and_a_bad_pattern_name_their_index() {
    let lines = config_error_lines(&[
        r#"{"excludes": ["bash", 7]}"#.to_string(),
        format!(r#"{{"excludeCommands": ["ok", "{}"]}}"#, "\\n".repeat(1100)),
    ]);
    assert_eq!(lines[0].event, "ERROR config_malformed excludes");
    assert_eq!(field(&lines[0], "value"), br#"["bash",7]"#);
    assert_eq!(field(&lines[0], "index"), b"1");
    assert_eq!(field(&lines[0], "reason"), b"7 is a number");
    assert_eq!(lines[1].event, "ERROR config_malformed excludeCommands");
    // A pattern is shown as the text it is, cut at 200 bytes of its escaped form.
    assert_eq!(field(&lines[1], "pattern"), [&b"\n".repeat(100)[..], "…".as_bytes()].concat());
    assert_eq!(field(&lines[1], "index"), b"1");
    assert_eq!(field(&lines[1], "reason"), b"is 1100 bytes long, more than 1024");
}

/// The mirror's warnings carry the endpoint as a field, escaped like any value: an endpoint
/// whose text holds a quote, a newline and `key=value` text (an operator's environment, or a
/// socket path) is read back as one `endpoint` value, and forges no field and no line. Each
/// warning comes from the real mirror worker: an unreachable socket, and a URL it refuses.
#[guard_test(multi_thread)]
async fn the_mirror_s_warnings_escape_the_endpoint() {
    use std::sync::{Arc, Mutex};

    use guard::mirror::{Endpoint, Mirror};

    let dir = tempfile::tempdir().unwrap();
    let hostile = "a\"b\nkill=1 pid=2 c";
    let socket = format!("unix://{}/{hostile}.sock?pass=secret", dir.path().display());
    let tcp = format!("redis://:secret@h{hostile}:notaport/0");
    for (url, event) in [(socket, "WARN redis_unreachable"), (tcp, "WARN redis_endpoint_invalid")] {
        let endpoint = Endpoint::new(url);
        let said: Arc<Mutex<Vec<LogLine>>> = Arc::default();
        let sink = Arc::clone(&said);
        let warn: Arc<dyn Fn(Notice) + Send + Sync> = Arc::new(move |n| sink.lock().unwrap().push(LogLine::Warn(n)));
        let mirror = Mirror::spawn(endpoint.clone(), "box1".into(), "alice".into(), None, warn);
        mirror.heartbeat(Default::default(), std::time::Duration::from_secs(60));
        let first = guard_test::wait::until(std::time::Duration::from_secs(10), "the mirror's warning", || {
            said.lock().unwrap().first().cloned()
        });
        let parsed = written(&[first]);
        let (line, warn) = &parsed[0];
        assert_eq!(warn.event, event, "{line}");
        assert_eq!(warn.fields, [("endpoint".to_string(), endpoint.redacted().into_bytes())], "{line}");
        assert!(!line.contains("secret"), "{line}");
        drop(mirror);
    }
}

/// docs/log.md's journal table says which `<N>` each line gets; every kind of line the daemon
/// writes (every `STOPPED` and `RESYNC` reason too) is in the row of the priority the daemon
/// gives it (`Line::priority`), and the table names nothing the daemon does not write.
#[guard_test]
fn the_journal_priority_table_is_what_the_daemon_writes() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/log.md")).unwrap();
    let table = doc.split("## The journal").nth(1).expect("docs/log.md has a journal section");
    // `| `<5>` notice | `KILLED`, `STOPPED reason=signal`, … |` → (5, ["KILLED", "STOPPED reason=signal", …])
    let rows: Vec<(u8, Vec<String>)> = table
        .lines()
        .skip_while(|l| !l.starts_with("| priority"))
        .skip(2)
        .take_while(|l| l.starts_with("| `<"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let n = cells[1].trim_start_matches("`<").chars().next().unwrap().to_digit(10).unwrap() as u8;
            (n, cells[2].split(", ").map(|i| i.trim_matches('`').to_string()).collect())
        })
        .collect();
    assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), [3, 4, 5, 6], "{rows:?}");
    let mut lines = one_of_each(Comm::new(b"x"));
    lines.extend([StopReason::Signal, StopReason::Error].map(LogLine::Stopped));
    lines.extend([ResyncReason::Startup, ResyncReason::Drift].map(|reason| LogLine::Resync { reason, lost: 0 }));
    let mut used = std::collections::BTreeSet::new();
    for line in &lines {
        let body = line.body();
        // The most specific item this line starts with: `STOPPED reason=hang` before `STOPPED`.
        let item = rows
            .iter()
            .flat_map(|(n, items)| items.iter().map(move |i| (*n, i)))
            .filter(|(_, i)| body == **i || body.starts_with(&format!("{i} ")))
            .max_by_key(|(_, i)| i.len());
        let (n, item) = item.unwrap_or_else(|| panic!("{body}: in no row of docs/log.md's journal table"));
        assert_eq!(n, line.priority(), "{body}: docs/log.md puts {item} under <{n}>");
        used.insert(item.clone());
    }
    let all: std::collections::BTreeSet<String> = rows.into_iter().flat_map(|(_, i)| i).collect();
    assert_eq!(all, used, "items of the table no line of the daemon is");
}

guard_test::main!();
