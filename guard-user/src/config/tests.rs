use super::*;

fn home() -> PathBuf {
    PathBuf::from("/home/u")
}

fn err(json: &str) -> String {
    parse(json.as_bytes(), &home()).unwrap_err().to_string()
}

/// Every problem of `json`, as `validate` prints them.
fn listed(json: &str) -> Vec<String> {
    problems(json.as_bytes(), &home()).iter().map(|p| p.to_string()).collect()
}

#[test]
fn an_empty_object_takes_every_default() {
    let c = parse(b"{}", &home()).unwrap();
    assert_eq!(c.threshold, 30);
    assert_eq!(c.timeout, Duration::from_secs(3600));
    assert_eq!(c.excludes.len(), 13);
    assert_eq!(c.exclude_commands, DEFAULT_EXCLUDE_COMMANDS);
    assert_eq!(c.log_max_bytes, 10 << 20);
    assert_eq!(c.state_file, PathBuf::from("/home/u/guard-daemon-state.json"));
    assert_eq!(c.warn_before, Duration::from_secs(600));
    assert_eq!(c.repeat_after, 3);
    assert_eq!(c.stall_watch, Some(StallWatch { pegged_cpu: 0.75, pegged_for: Duration::from_secs(300) }));
    assert!(problems(b"{}", &home()).is_empty());
    // The shipped patterns compile (the stopgap in-process compile).
    assert_eq!(c.compile_exclude_commands().unwrap().len(), 4);
}

#[test]
fn timeout_accepts_units_integers_and_digit_strings() {
    for (j, s) in [(r#""2h""#, 7200), (r#""5m""#, 300), (r#""9s""#, 9), ("120", 120), (r#""120""#, 120), ("0", 0)] {
        let c = parse(format!(r#"{{"timeout": {j}}}"#).as_bytes(), &home()).unwrap();
        assert_eq!(c.timeout, Duration::from_secs(s), "{j}");
    }
}

#[test]
fn wrong_types_and_ranges_name_the_key_and_the_value() {
    assert_eq!(err(r#"{"threshold": 0}"#), "config_malformed threshold value=0");
    // A string where a number belongs is shown quoted, so it never reads as the number.
    assert_eq!(err(r#"{"threshold": "30"}"#), r#"config_malformed threshold value="30""#);
    assert_eq!(err(r#"{"threshold": "3\"0 x"}"#), r#"config_malformed threshold value="3\"0 x""#);
    assert_eq!(err(r#"{"threshold": 2.5}"#), "config_malformed threshold value=2.5");
    assert_eq!(err(r#"{"timeout": "1d"}"#), "config_malformed timeout value=1d");
    assert_eq!(err(r#"{"timeout": -5}"#), "config_malformed timeout value=-5");
    assert_eq!(err(r#"{"excludes": "bash"}"#), r#"config_malformed excludes value="bash""#);
    assert_eq!(err(r#"{"excludes": [1]}"#), "config_malformed excludes value=[1]");
    assert_eq!(err(r#"{"logMaxSizeMB": 0}"#), "config_malformed logMaxSizeMB value=0");
    assert_eq!(err(r#"{"stateFile": 3}"#), "config_malformed stateFile value=3");
    assert_eq!(err(r#"{"excludeCommands": ["ok", 7]}"#), r#"config_malformed excludeCommands value="[\"ok\",7]""#);
    assert_eq!(err(r#"{"excludeCommands": ["a\u0000b"]}"#), r"config_malformed excludeCommands pattern=a\x00b");
}

#[test]
fn huge_numbers_are_bounded_at_validation() {
    // These crashed the deadline timer (an Instant overflow) after the first tick.
    assert_eq!(err(r#"{"timeout": 10000000000000000000}"#), "config_malformed timeout value=10000000000000000000");
    assert_eq!(err(r#"{"timeout": "5124095576030431h"}"#), "config_malformed timeout value=5124095576030431h");
    // Numbers as the file writes them, not as a float prints them.
    assert_eq!(err(r#"{"timeout": 1e300}"#), "config_malformed timeout value=1e300");
    assert_eq!(err(r#"{"timeout": 31536001}"#), "config_malformed timeout value=31536001");
    assert_eq!(parse(br#"{"timeout": "8760h"}"#, &home()).unwrap().timeout, MAX_TIMEOUT);
    assert_eq!(err(r#"{"warnBefore": "8761h"}"#), "config_malformed warnBefore value=8761h");
    assert_eq!(err(r#"{"threshold": 4194305}"#), "config_malformed threshold value=4194305");
    assert_eq!(parse(br#"{"threshold": 4194304}"#, &home()).unwrap().threshold, MAX_THRESHOLD);
    assert_eq!(err(r#"{"threshold": 18446744073709551616}"#), "config_malformed threshold value=18446744073709551616");
    assert_eq!(err(r#"{"logMaxSizeMB": 4097}"#), "config_malformed logMaxSizeMB value=4097");
    assert_eq!(parse(br#"{"logMaxSizeMB": 4096}"#, &home()).unwrap().log_max_bytes, 4096 << 20);
    assert_eq!(err(r#"{"logMaxSizeMB": 1e308}"#), "config_malformed logMaxSizeMB value=1e308");
    assert_eq!(err(r#"{"repeatAfter": 1001}"#), "config_malformed repeatAfter value=1001");
    // A number too large for any float is a JSON error, not a crash.
    assert!(err(r#"{"timeout": 1e400}"#).starts_with("config_malformed json"));
}

#[test]
fn new_keys_parse_validate_and_default() {
    let c = parse(br#"{"warnBefore": 0, "repeatAfter": 1, "stallWatch": false}"#, &home()).unwrap();
    assert_eq!((c.warn_before, c.repeat_after, c.stall_watch), (Duration::ZERO, 1, None));
    let c = parse(br#"{"warnBefore": "15m", "stallWatch": {"peggedCpu": 2, "peggedFor": "10s"}}"#, &home()).unwrap();
    assert_eq!(c.warn_before, Duration::from_secs(900));
    assert_eq!(c.stall_watch, Some(StallWatch { pegged_cpu: 2.0, pegged_for: Duration::from_secs(10) }));
    let c = parse(br#"{"stallWatch": {"peggedFor": 600}}"#, &home()).unwrap();
    assert_eq!(c.stall_watch, Some(StallWatch { pegged_cpu: 0.75, pegged_for: Duration::from_secs(600) }));
    assert_eq!(parse(br#"{"stallWatch": true}"#, &home()).unwrap().stall_watch, Some(DEFAULT_STALL_WATCH));
    assert_eq!(err(r#"{"repeatAfter": 0}"#), "config_malformed repeatAfter value=0");
    assert_eq!(err(r#"{"warnBefore": "soon"}"#), "config_malformed warnBefore value=soon");
    assert_eq!(err(r#"{"stallWatch": "off"}"#), r#"config_malformed stallWatch value="off""#);
    assert_eq!(err(r#"{"stallWatch": {"peggedCpu": 0}}"#), "config_malformed stallWatch.peggedCpu value=0");
    assert_eq!(err(r#"{"stallWatch": {"peggedCpu": 1025}}"#), "config_malformed stallWatch.peggedCpu value=1025");
    assert_eq!(err(r#"{"stallWatch": {"peggedFor": "9s"}}"#), "config_malformed stallWatch.peggedFor value=9s");
    assert_eq!(err(r#"{"stallWatch": {"peggedFor": "25h"}}"#), "config_malformed stallWatch.peggedFor value=25h");
}

#[test]
fn invalid_json_reports_line_and_column() {
    assert_eq!(err("{\n  \"threshold\": 3,\n}"), "config_malformed json line=3 column=1");
    assert_eq!(err(""), "config_malformed json line=1 column=0");
    assert_eq!(err("  [1]"), "config_malformed json line=1 column=3");
}

#[test]
fn json_nesting_stops_at_serde_jsons_limit_of_128() {
    // The top-level object and 126 arrays are 127 levels: parsed (an unknown key). One more
    // level is serde_json's recursion limit: an error, not a stack overflow.
    let nested = |n: usize| format!(r#"{{"colour": {}{}}}"#, "[".repeat(n), "]".repeat(n));
    assert!(parse(nested(MAX_JSON_DEPTH - 1).as_bytes(), &home()).is_ok());
    assert_eq!(err(&nested(MAX_JSON_DEPTH)), "config_malformed json line=1 column=138");
    let p = listed(&nested(MAX_JSON_DEPTH));
    assert!(p[0].contains("nested deeper than 127 levels"), "{p:?}");
    let deep = format!(r#"{{"x": {}{}}}"#, "[".repeat(100_000), "]".repeat(100_000));
    assert!(err(&deep).starts_with("config_malformed json"));
}

#[test]
fn lists_and_paths_are_bounded() {
    let many = |n: usize, item: &str| format!("[{}]", vec![item; n].join(","));
    assert!(parse(format!(r#"{{"excludes": {}}}"#, many(1024, "\"a\"")).as_bytes(), &home()).is_ok());
    assert!(err(&format!(r#"{{"excludes": {}}}"#, many(1025, "\"a\""))).starts_with("config_malformed excludes value="));
    let long = format!("\"{}\"", "n".repeat(256));
    assert!(err(&format!(r#"{{"excludes": [{long}]}}"#)).starts_with("config_malformed excludes value="));
    assert!(parse(format!(r#"{{"excludeCommands": {}}}"#, many(256, "\"x\"")).as_bytes(), &home()).is_ok());
    assert!(err(&format!(r#"{{"excludeCommands": {}}}"#, many(257, "\"x\"")))
        .starts_with("config_malformed excludeCommands value="));
    let long = "p".repeat(1025);
    let e = err(&format!(r#"{{"excludeCommands": ["{long}"]}}"#));
    assert!(e.starts_with("config_malformed excludeCommands pattern=ppp") && e.len() < 260, "{e}");
    assert!(parse(format!(r#"{{"stateFile": "/{}"}}"#, "s".repeat(4094)).as_bytes(), &home()).is_ok());
    assert!(err(&format!(r#"{{"stateFile": "/{}"}}"#, "s".repeat(4095))).starts_with("config_malformed stateFile"));
}

#[test]
fn patterns_are_not_compiled_while_parsing() {
    // An invalid regex parses: the matcher judges it (here, the stopgap compile).
    let c = parse(br#"{"excludeCommands": ["ok", "(unclosed"]}"#, &home()).unwrap();
    assert_eq!(c.exclude_commands, ["ok", "(unclosed"]);
    let e = c.compile_exclude_commands().unwrap_err();
    assert_eq!(e.to_string(), "config_malformed excludeCommands pattern=(unclosed");
}

#[test]
fn a_state_file_with_a_control_character_is_refused() {
    // Defence in depth for install: a newline in stateFile once became a unit directive.
    let e = err(r#"{"stateFile": "/home/u/s\nExecStartPre=+/bin/sh"}"#);
    assert_eq!(e, r#"config_malformed stateFile value="/home/u/s\nExecStartPre=+/bin/sh""#);
    assert_eq!(err(r#"{"stateFile": ""}"#), r#"config_malformed stateFile value="""#);
    assert!(err(r#"{"stateFile": "a\u0000b"}"#).starts_with("config_malformed stateFile"));
}

#[test]
fn error_values_are_escaped_and_quoted_as_log_values() {
    assert_eq!(err(r#"{"timeout": "1h KILLED pid=1"}"#), r#"config_malformed timeout value="1h KILLED pid=1""#);
    assert_eq!(
        err(r#"{"timeout": "x\n2026-01-01 00:00:00 KILLED"}"#),
        r#"config_malformed timeout value="x\n2026-01-01 00:00:00 KILLED""#
    );
    assert_eq!(err(r#"{"timeout": {"a": 1}}"#), r#"config_malformed timeout value="{\"a\":1}""#);
    let e = ConfigError::Missing { path: "/home/u/my config.json".into() };
    assert_eq!(e.to_string(), r#"config_missing path="/home/u/my config.json""#);
}

#[test]
fn unknown_keys_are_kept_as_warnings_not_errors() {
    let c = parse(br#"{"threshold": 3, "colour": "blue"}"#, &home()).unwrap();
    assert_eq!(c.unknown_keys, vec!["colour".to_string()]);
    let p = problems(br#"{"treshold": 3, "stallWatch": {"peggedcpu": 1}}"#, &home());
    assert!(p.iter().all(|p| p.warning && p.error().is_none()), "{p:?}");
    let text: Vec<String> = p.iter().map(|p| p.to_string()).collect();
    assert_eq!(
        text,
        [
            r#"stallWatch.peggedcpu: is not a key guard knows, so it is ignored; did you mean "peggedCpu"? (an unknown key is ignored)"#,
            r#"treshold: is not a key guard knows, so it is ignored; did you mean "threshold"? (an unknown key is ignored)"#,
        ]
    );
}

#[test]
fn validate_lists_every_problem_with_its_fix_in_parse_order() {
    let json = r#"{"threshold": "30", "timeout": "1d", "excludes": ["ok", 5, "a\u0000"], "logMaxSizeMB": -1,
        "repeatAfter": 2.5, "stallWatch": {"peggedFor": "1s"}, "colour": 1}"#;
    assert_eq!(
        listed(json),
        [
            r#"threshold: "30" is a string; write a whole number >= 1, e.g. 30"#,
            r#"timeout: "1d" is not a duration; write "<n>h", "<n>m", "<n>s" or whole seconds, at most 1 year (8760h), e.g. "1h""#,
            r#"excludes[1]: 5 is a number; write each name as a string of at most 255 bytes without NUL, e.g. "node""#,
            r#"excludes[2]: contains a NUL character; write each name as a string of at most 255 bytes without NUL, e.g. "node""#,
            "logMaxSizeMB: -1 is not above 0; write a number of MiB > 0 and <= 4096, e.g. 10",
            "repeatAfter: 2.5 is not a whole number; write a whole number from 1 to 1000, e.g. 3",
            r#"stallWatch.peggedFor: "1s" is shorter than 10s; write a duration from 10s to 24h, e.g. "5m""#,
            "colour: is not a key guard knows, so it is ignored; remove it; the keys are threshold, timeout, excludes, \
             excludeCommands, logMaxSizeMB, stateFile, warnBefore, repeatAfter, stallWatch, sessions, slots",
        ]
    );
    // parse fails with the first of them, as the ERROR line.
    let first = problems(json.as_bytes(), &home()).into_iter().next().unwrap();
    assert_eq!(first.error().unwrap().to_string(), err(json));
    assert_eq!(first.error().unwrap().fix(), "write a whole number >= 1, e.g. 30");
}

#[test]
fn parse_and_problems_agree_on_every_seed_document() {
    for json in [
        "{}",
        "[]",
        "null",
        r#"{"threshold": 0}"#,
        r#"{"threshold": 3, "timeout": "1s"}"#,
        r#"{"excludes": {"a": 1}}"#,
        r#"{"stallWatch": null}"#,
        r#"{"timeout": true, "threshold": null}"#,
        "{\"threshold\": 3,}",
    ] {
        let p = problems(json.as_bytes(), &home());
        let first_error = p.iter().find_map(|p| p.error()).map(|e| e.to_string());
        assert_eq!(parse(json.as_bytes(), &home()).err().map(|e| e.to_string()), first_error, "{json}");
        for problem in &p {
            let line = problem.to_string();
            assert!(!line.contains(['\n', '\r']), "{line:?}");
        }
    }
}

#[test]
fn a_problems_quoted_value_prints_on_one_line() {
    let p = listed("{\"timeout\": \"\\u001b[2J\\n\\u2028x\"}");
    assert_eq!(
        p[0],
        r#"timeout: "\x1b[2J\n\xe2\x80\xa8x" is not a duration; write "<n>h", "<n>m", "<n>s" or whole seconds, at most 1 year (8760h), e.g. "1h""#
    );
    let p = listed(&format!(r#"{{"threshold": "{}"}}"#, "9".repeat(500)));
    assert!(p[0].len() < 200 && p[0].contains('…'), "{}", p[0]);
}

#[test]
fn state_file_tilde_expands_to_the_home() {
    let c = parse(br#"{"stateFile": "~/s/state.json"}"#, &home()).unwrap();
    assert_eq!(c.state_file, PathBuf::from("/home/u/s/state.json"));
    let c = parse(br#"{"stateFile": "/var/lib/g.json"}"#, &home()).unwrap();
    assert_eq!(c.state_file, PathBuf::from("/var/lib/g.json"));
}

#[test]
fn excludes_compare_ignoring_case() {
    let c = parse(br#"{"excludes": ["Sleep"]}"#, &home()).unwrap();
    assert!(c.is_excluded(&crate::comm::Comm::new(b"sleep")));
    assert!(!c.is_excluded(&crate::comm::Comm::new(b"sleeper")));
}

#[test]
fn load_reads_as_the_account_and_maps_read_errors_to_config_lines() {
    let dir = tempfile::tempdir().unwrap();
    let who = FsIdentity::current();
    let path = dir.path().join("guard-config.json");
    let e = load(&path, dir.path(), who).unwrap_err();
    assert_eq!(e.to_string(), format!("config_missing path={}", path.display()));
    std::fs::create_dir(&path).unwrap();
    let e = load(&path, dir.path(), who).unwrap_err();
    assert_eq!(e.to_string(), format!("config_unreadable path={} reason=not_regular kind=directory", path.display()));
    assert_eq!(e.fix(), "replace it with a regular file");
    std::fs::remove_dir(&path).unwrap();
    std::fs::File::create(&path).unwrap().set_len(MAX_CONFIG_BYTES + 1).unwrap();
    let e = load(&path, dir.path(), who).unwrap_err();
    assert_eq!(e.to_string(), format!("config_unreadable path={} reason=too_large max_bytes=1048576", path.display()));
    std::fs::write(&path, br#"{"threshold": 4}"#).unwrap();
    assert_eq!(load(&path, dir.path(), who).unwrap().threshold, 4);
}

/// The ERROR line's text for `json`, and the first problem `validate` lists for it.
fn reason_and_problem(json: &str) -> (String, Problem) {
    let reason = parse(json.as_bytes(), &home()).unwrap_err().log_reason();
    let first = problems(json.as_bytes(), &home()).into_iter().find(|p| !p.warning).unwrap();
    (reason, first)
}

#[test]
fn the_error_line_carries_validates_reason_and_fix() {
    let (reason, p) = reason_and_problem(r#"{"threshold": "30"}"#);
    assert_eq!(
        reason,
        r#"config_malformed threshold value="30" reason="\"30\" is a string" fix="write a whole number >= 1, e.g. 30""#
    );
    assert_eq!(p.to_string(), r#"threshold: "30" is a string; write a whole number >= 1, e.g. 30"#);
    // The number 30 where a list belongs reads as a number, the string "30" as a string.
    assert_eq!(
        reason_and_problem(r#"{"excludes": 30}"#).0.split(" reason=").next(),
        Some("config_malformed excludes value=30")
    );
    assert_eq!(
        reason_and_problem(r#"{"excludes": "30"}"#).0.split(" reason=").next(),
        Some(r#"config_malformed excludes value="30""#)
    );
    // A list's element: which one, and the list as JSON.
    let (reason, _) = reason_and_problem(r#"{"excludes": ["bash", 7]}"#);
    assert_eq!(
        reason,
        r#"config_malformed excludes value="[\"bash\",7]" index=1 reason="7 is a number" fix="write each name as a string of at most 255 bytes without NUL, e.g. \"node\"""#
    );
    // Every kind of error ends with validate's fix; the JSON ones with its reason too.
    let (reason, p) = reason_and_problem("[30]");
    assert_eq!(
        reason,
        r#"config_malformed json line=1 column=1 reason="[30] is an array" fix="write one JSON object, e.g. {\"threshold\": 30}""#
    );
    assert_eq!(p.fix, r#"write one JSON object, e.g. {"threshold": 30}"#);
    let e = ConfigError::Missing { path: "/home/u/c.json".into() };
    assert_eq!(
        e.log_reason(),
        r#"config_missing path=/home/u/c.json fix="create it (guard-user install links the shipped config)""#
    );
}

#[test]
fn the_daemon_words_a_refused_pattern_as_validate_does() {
    use crate::pattern::PatternSetError;
    let patterns = vec!["ok".to_string(), "(unclosed".to_string()];
    let refused =
        PatternSetError::Invalid { index: 1, pattern: "(unclosed".into(), reason: "Unmatched ( or \\(".into() };
    let daemon = refused_patterns(&patterns, &refused);
    let validate = Problem::refused_pattern(1, "(unclosed", &refused);
    assert_eq!(daemon.log_reason(), validate.error().unwrap().log_reason());
    assert_eq!(
        daemon.log_reason(),
        r#"config_malformed excludeCommands pattern=(unclosed index=1 reason="\"(unclosed\" is not a valid bash extended regex (Unmatched ( or \\()" fix="write a valid bash extended regex (try it with guard-user match --pattern)""#
    );
}

#[test]
fn hostile_values_make_a_bounded_line_of_one_grammar() {
    let huge = format!(r#"{{"threshold": "{}"}}"#, "\\u001b[2J\\n".repeat(200_000));
    let deep = format!(r#"{{"threshold": {}{}}}"#, "[".repeat(126), "]".repeat(126));
    let wide = format!(r#"{{"excludes": [{}7]}}"#, "\"x\",".repeat(1000));
    let long_pattern = format!(r#"{{"excludeCommands": ["{}"]}}"#, "\\u0007".repeat(2000));
    for json in [huge, deep, wide, long_pattern] {
        let reason = parse(json.as_bytes(), &home()).unwrap_err().log_reason();
        assert!(reason.len() < 1000, "{} bytes: {reason}", reason.len());
        assert!(!reason.contains(|c: char| c.is_control()), "{reason:?}");
        assert!(reason.contains('…'), "the cut is marked: {reason}");
    }
}

#[test]
fn a_config_of_a_hundred_thousand_unknown_keys_lists_256_and_counts_the_rest() {
    let keys: Vec<String> = (0..100_000).map(|i| format!(r#""k{i:06}": {{"deep": [1, 2, 3]}}"#)).collect();
    let json = format!(r#"{{"threshold": 3, {}}}"#, keys.join(", "));
    let c = parse(json.as_bytes(), &home()).unwrap();
    assert_eq!(c.threshold, 3, "unknown keys never make a config invalid");
    assert_eq!(c.unknown_keys.len(), MAX_UNKNOWN_KEYS);
    assert_eq!(c.unknown_keys_unlisted, 100_000 - MAX_UNKNOWN_KEYS);
    assert_eq!(c.unknown_keys[0], "k000000");
    let p = listed(&json);
    assert_eq!(p.len(), MAX_UNKNOWN_KEYS + 1);
    assert!(p[MAX_UNKNOWN_KEYS].starts_with("unknown keys: 99744 more keys guard does not know"), "{}", p[256]);
}

#[test]
fn an_unknown_key_is_kept_cut_to_200_bytes() {
    let key = "é".repeat(50_000);
    let c = parse(format!(r#"{{"{key}": 1}}"#).as_bytes(), &home()).unwrap();
    assert_eq!(c.unknown_keys.len(), 1);
    let kept = &c.unknown_keys[0];
    assert!(kept.len() <= 200 + "…".len() && kept.ends_with('…') && kept.starts_with("éé"), "{kept}");
}

#[test]
fn a_known_key_holding_half_a_million_values_is_refused_without_building_them() {
    let json = format!(r#"{{"excludes": [{}"x"]}}"#, "0,".repeat(500_000));
    let shown = &format!("[{}", "0,".repeat(100))[..200];
    assert_eq!(err(&json), format!("config_malformed excludes value={shown}…"));
    let p = listed(&json);
    assert_eq!(p.len(), 1);
    assert!(p[0].starts_with("excludes: holds more than 4096 JSON values; write the value"), "{}", p[0]);
    // A list only a little too long keeps its exact count.
    let names: Vec<String> = (0..2000).map(|i| format!(r#""n{i}""#)).collect();
    let p = listed(&format!(r#"{{"excludes": [{}]}}"#, names.join(",")));
    assert!(p[0].contains("2000 names, more than 1024"), "{p:?}");
}

#[test]
fn a_document_nested_too_deep_under_an_unknown_key_is_still_invalid_json() {
    let json = format!(r#"{{"x": {}{}}}"#, "[".repeat(100_000), "]".repeat(100_000));
    assert!(err(&json).starts_with("config_malformed json line=1 column="), "{}", err(&json));
}

#[test]
fn a_whole_number_written_with_an_exponent_or_a_zero_fraction_is_taken() {
    let c =
        parse(br#"{"threshold": 1e3, "repeatAfter": 3.0, "timeout": 3.6e3, "warnBefore": 30e-1}"#, &home()).unwrap();
    assert_eq!((c.threshold, c.repeat_after), (1000, 3));
    assert_eq!((c.timeout, c.warn_before), (Duration::from_secs(3600), Duration::from_secs(3)));
    // Decided on the digits as written, which a float cannot tell apart.
    let e = err(r#"{"threshold": 30.0000000000000001}"#);
    assert_eq!(e, "config_malformed threshold value=30.0000000000000001");
    let (_, p) = reason_and_problem(r#"{"threshold": 30.0000000000000001}"#);
    assert_eq!(p.what, "30.0000000000000001 is not a whole number");
    assert_eq!(reason_and_problem(r#"{"threshold": 2.5e0}"#).1.what, "2.5e0 is not a whole number");
    assert_eq!(
        reason_and_problem(r#"{"threshold": 5e6}"#).1.what,
        "5e6 is more than 4194304 (no account can have more processes)"
    );
}

#[test]
fn a_number_is_quoted_as_written_in_problems_and_in_the_error_line() {
    let json = r#"{"repeatAfter": 100000000000000000000}"#;
    let (reason, p) = reason_and_problem(json);
    assert!(reason.starts_with("config_malformed repeatAfter value=100000000000000000000 "), "{reason}");
    assert_eq!(p.what, "100000000000000000000 is more than 1000");
    let (reason, p) = reason_and_problem(r#"{"stallWatch": {"peggedCpu": 2e3}}"#);
    assert!(reason.starts_with("config_malformed stallWatch.peggedCpu value=2e3 "), "{reason}");
    assert_eq!(p.what, "2e3 is not above 0 and at most 1024");
}

#[test]
fn a_key_written_twice_is_named_with_both_lines_and_the_last_one_is_used() {
    let json = "{\n  \"threshold\": 5,\n  \"timeout\": \"1h\",\n  \"threshold\": 50\n}\n";
    let c = parse(json.as_bytes(), &home()).unwrap();
    assert_eq!(c.threshold, 50);
    assert_eq!(c.repeated_keys, [RepeatedKey { key: "threshold".into(), lines: vec![2, 4], count: 2 }]);
    let listed: Vec<String> = problems(json.as_bytes(), &home()).iter().map(|p| p.to_string()).collect();
    assert_eq!(
        listed,
        ["threshold: is written 2 times (lines 2 and 4); the daemon uses the last one; keep only the one you mean"]
    );
    // Inside stallWatch and sessions too, however the key is spelled.
    let json = r#"{"stallWatch": {"peggedFor": "1m", "pegged\u0046or": "2m"}, "sessions": {"roots": [], "roots": []}}"#;
    let keys: Vec<String> = parse(json.as_bytes(), &home()).unwrap().repeated_keys.into_iter().map(|r| r.key).collect();
    assert_eq!(keys, ["stallWatch.peggedFor", "sessions.roots"]);
    // Inside slots: a slot's name twice, a member twice in one slot (the last one is used).
    let json = "{\"slots\": {\n \"build\": {\"commands\": [\"make\"], \"max\": 1},\n \"test\": {\"commands\": [\"pytest\"], \
                \"max\": 1, \"max\": 3},\n \"build\": {\"commands\": [\"cargo\"], \"max\": 2}}}";
    let c = parse(json.as_bytes(), &home()).unwrap();
    let keys: Vec<(String, Vec<usize>)> = c.repeated_keys.into_iter().map(|r| (r.key, r.lines)).collect();
    assert_eq!(keys, [("slots.build".to_string(), vec![2, 4]), ("slots.test.max".to_string(), vec![3, 3])]);
    assert_eq!(c.slots.iter().map(|s| (s.name.as_str(), s.max)).collect::<Vec<_>>(), [("build", 2), ("test", 3)]);
    let listed: Vec<String> = problems(json.as_bytes(), &home()).iter().map(|p| p.to_string()).collect();
    assert!(listed.iter().any(|p| p.starts_with("slots.build: is written 2 times (lines 2 and 4)")), "{listed:?}");
    assert!(listed.iter().any(|p| p.starts_with("slots.test.max: is written 2 times")), "{listed:?}");
}

#[test]
fn an_unknown_key_inside_slots_sessions_or_stall_watch_is_shown_cut_like_a_top_level_one() {
    let long = "k".repeat(1 << 20);
    for json in [
        format!(r#"{{"slots": {{"build": {{"commands": ["make"], "max": 1, "{long}": 1}}}}}}"#),
        format!(r#"{{"sessions": {{"roots": [], "{long}": 1}}}}"#),
        format!(r#"{{"stallWatch": {{"peggedCpu": 90, "{long}": 1}}}}"#),
    ] {
        let listed: Vec<String> = problems(json.as_bytes(), &home()).iter().map(|p| p.to_string()).collect();
        assert_eq!(listed.len(), 1, "{}", listed.iter().map(|p| &p[..p.len().min(300)]).collect::<Vec<_>>().join("\n"));
        assert!(listed[0].len() < 600 && listed[0].contains("kkk…"), "{} bytes: {}", listed[0].len(), &listed[0][..300]);
    }
}

#[test]
fn every_config_error_line_starts_with_the_token_of_its_what() {
    let dir = tempfile::tempdir().unwrap();
    let who = FsIdentity::current();
    let errors = [
        load(&dir.path().join("none.json"), &home(), who).unwrap_err(),
        load(dir.path(), &home(), who).unwrap_err(),
        parse(b"{\"threshold\": 3,}", &home()).unwrap_err(),
        parse(br#"{"threshold": "30"}"#, &home()).unwrap_err(),
        ConfigError::Pattern {
            list: PatternList::ExcludeCommands,
            pattern: "(".into(),
            index: Some(0),
            why: "unbalanced".into(),
            fix: "close it",
        },
    ];
    let kinds: Vec<&str> = errors.iter().map(|e| e.what().token()).collect();
    assert_eq!(
        kinds,
        ["config_missing", "config_unreadable", "config_malformed", "config_malformed", "config_malformed"]
    );
    for e in &errors {
        let reason = e.log_reason();
        assert_eq!(crate::log::What::of_reason(&reason), Some(e.what()), "{reason}");
    }
}

#[test]
fn a_key_repeated_on_one_line_names_that_line_once() {
    let json = r#"{"threshold": 5, "threshold": 6, "threshold": 7}"#;
    let listed: Vec<String> = problems(json.as_bytes(), &home()).iter().map(|p| p.to_string()).collect();
    assert_eq!(
        listed,
        ["threshold: is written 3 times (line 1); the daemon uses the last one; keep only the one you mean"]
    );
}
