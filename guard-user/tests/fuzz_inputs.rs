//! Bounded, deterministic fuzzing of what takes bytes from outside the daemon: the operator's
//! config (`config::parse`, `config::load`), ring-buffer records (`Event::decode`), and
//! `excludeCommands` patterns through the bounded matcher. No cargo-fuzz: a xorshift generator
//! with fixed seeds, so a failure reproduces with the printed case number. Properties: no panic;
//! every config rejection's reason starts with `config_malformed` or `config_missing` (what the
//! `ERROR` line and `check` print); every record that decodes re-encodes to an equal event; the
//! matcher always answers, in time, and agrees with glibc wherever glibc decides quickly.
use guard_test::{guard_test, rng::Rng};
use std::{
    path::Path,
    time::{Duration, Instant},
};

use guard::{
    config::{self, ConfigError},
    event::{DecodeError, Event},
    pattern::{Limits, MatchOutcome, Matcher, Pattern, PatternError, PatternSetError},
};
use guard_common::RawEvent;

const HOME: &str = "/home/fuzz";

/// Configs that parse, and configs close to parsing: the seeds the mutator starts from.
const SEEDS: &[&str] = &[
    "{}",
    r#"{"threshold": 3, "timeout": "1s", "excludes": ["bash"]}"#,
    r#"{"threshold": 30, "timeout": "1h", "excludeCommands": ["(^|[ /])agentihooks swarm tick( |$)"]}"#,
    r#"{"timeout": 120, "logMaxSizeMB": 0.5, "stateFile": "~/s.json"}"#,
    r#"{"timeout": "120", "excludes": [], "excludeCommands": []}"#,
    r#"{"threshold": 0}"#,
    r#"{"excludeCommands": ["(unclosed"]}"#,
    r#"{"stateFile": "/var/lib/guard.json", "colour": "blue"}"#,
    r#"{"threshold": 4294967296, "timeout": "99999999999999999999h"}"#,
    r#"{"logMaxSizeMB": 1e308, "timeout": "-1s"}"#,
    "[1, 2, 3]",
    "\"just a string\"",
    "null",
];

/// JSON-ish fragments spliced into configs: keys, values of every type, broken syntax.
const FRAGMENTS: &[&str] = &[
    "\"threshold\"",
    "\"timeout\"",
    "\"excludes\"",
    "\"excludeCommands\"",
    "\"logMaxSizeMB\"",
    "\"stateFile\"",
    ":",
    ",",
    "{",
    "}",
    "[",
    "]",
    "\"",
    "\\",
    "\\u0000",
    "\\ud800",
    "0",
    "-1",
    "1e999",
    "1.5",
    "18446744073709551616",
    "true",
    "null",
    "\"1h\"",
    "\"5m\"",
    "\"9s\"",
    "\"1d\"",
    "\"\"",
    "\"~\"",
    "\"~/\"",
    "\"[[:alpha:]\"",
    "\"a{1,\"",
    "\"\\\\(\"",
    "\"(a|b)*c\"",
    "\"x\\u0000y\"",
    "\n",
    "\t",
    "\r",
    " ",
    "\u{feff}",
    "é",
    "\u{10ffff}",
];

fn check_config(case: usize, bytes: &[u8]) {
    match config::parse(bytes, Path::new(HOME)) {
        Ok(c) => {
            assert!(c.threshold >= 1, "case {case}: threshold {} accepted", c.threshold);
            assert!(c.log_max_bytes >= 1, "case {case}: logMaxSizeMB 0 accepted");
            assert!(!c.state_file.as_os_str().is_empty(), "case {case}");
        }
        Err(e) => {
            let reason = e.to_string();
            assert!(
                reason.starts_with("config_malformed") || reason.starts_with("config_missing"),
                "case {case}: rejection reason {reason:?} for {:?}",
                String::from_utf8_lossy(bytes)
            );
            assert!(!reason.contains('\n') && !reason.contains('\r'), "case {case}: a reason spans lines: {reason:?}");
            let _ = e.fix();
        }
    }
}

fn random_config(rng: &mut Rng) -> Vec<u8> {
    match rng.below(4) {
        // Pure noise, short.
        0 => (0..rng.below(64)).map(|_| rng.byte()).collect(),
        // Fragments glued together.
        1 => {
            let mut s = Vec::new();
            for _ in 0..rng.below(24) {
                s.extend_from_slice(rng.pick(FRAGMENTS).as_bytes());
            }
            s
        }
        // A well-formed object with random typed values.
        2 => {
            let keys = ["threshold", "timeout", "excludes", "excludeCommands", "logMaxSizeMB", "stateFile", "x"];
            let mut s = String::from("{");
            for i in 0..rng.below(7) {
                if i > 0 {
                    s.push(',');
                }
                s.push_str(&format!("\"{}\":", rng.pick(&keys)));
                let v = match rng.below(6) {
                    0 => rng.pick(FRAGMENTS).to_string(),
                    1 => (rng.next_u64() as i64 % 100_000).to_string(),
                    2 => format!("\"{}{}\"", rng.below(1000), rng.pick(&["h", "m", "s", "", "d", "ms"])),
                    3 => format!(
                        "[{}]",
                        (0..rng.below(4)).map(|_| rng.pick(FRAGMENTS).to_string()).collect::<Vec<_>>().join(",")
                    ),
                    4 => format!("{}", f64::from_bits(rng.next_u64())).replace("NaN", "0").replace("inf", "1"),
                    _ => format!(
                        "[\"{}\"]",
                        (0..rng.below(12))
                            .map(|_| *rng.pick(&[
                                '(', ')', '[', ']', '{', '}', '|', '*', 'a', '\\', '^', '$', '.', '+', '?', ',', '1'
                            ]))
                            .collect::<String>()
                    ),
                };
                s.push_str(&v);
            }
            s.push('}');
            s.into_bytes()
        }
        // A mutated seed.
        _ => {
            let mut s = rng.pick(SEEDS).as_bytes().to_vec();
            for _ in 0..1 + rng.below(6) {
                let at = if s.is_empty() { 0 } else { rng.below(s.len() + 1) };
                match rng.below(5) {
                    0 if at < s.len() => s[at] = rng.byte(),
                    1 if at < s.len() => {
                        s.remove(at);
                    }
                    2 => s.insert(at, rng.byte()),
                    3 => {
                        let f = rng.pick(FRAGMENTS).as_bytes();
                        s.splice(at..at, f.iter().copied());
                    }
                    _ => s.truncate(at),
                }
            }
            s
        }
    }
}

#[guard_test]
fn fifty_thousand_random_and_mutated_configs_never_panic_and_reject_with_a_config_reason() {
    let mut rng = Rng(0x5eed_c0f1_6000_0001);
    let mut accepted = 0;
    for case in 0..50_000 {
        let bytes = random_config(&mut rng);
        if config::parse(&bytes, Path::new(HOME)).is_ok() {
            accepted += 1;
        }
        check_config(case, &bytes);
    }
    // The generator must reach the accepting paths too, or the fuzz only tests the JSON parser.
    assert!(accepted > 1_000, "only {accepted} of 50000 configs parsed");
}

#[guard_test]
fn a_mebibyte_of_whitespace_around_an_object_parses() {
    let mut bytes = vec![b' '; 1 << 20];
    bytes.extend_from_slice(br#"{"threshold": 7}"#);
    bytes.extend(std::iter::repeat_n(b'\n', 1000));
    let c = config::parse(&bytes, Path::new(HOME)).expect("whitespace is valid JSON");
    assert_eq!(c.threshold, 7);

    // Through the file: beyond MAX_CONFIG_BYTES it is refused with a config reason, not read.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("guard-config.json");
    std::fs::write(&path, &bytes).unwrap();
    let me = guard::safefs::FsIdentity::current();
    let e = config::load(&path, dir.path(), me).unwrap_err();
    assert!(
        e.to_string().starts_with("config_unreadable") && e.to_string().ends_with("reason=too_large max_bytes=1048576"),
        "{e}"
    );
    let e = config::load(&dir.path().join("absent.json"), dir.path(), me).unwrap_err();
    assert!(matches!(e, ConfigError::Missing { .. }) && e.to_string().starts_with("config_missing path="), "{e}");
}

#[guard_test]
fn a_huge_value_makes_a_short_one_line_reason() {
    let big = format!(r#"{{"excludes": "{}\n{}"}}"#, "x".repeat(1 << 19), "é".repeat(1 << 10));
    let e = config::parse(big.replace('\n', "\\n").as_bytes(), Path::new(HOME)).unwrap_err().to_string();
    assert!(e.starts_with("config_malformed excludes value="), "{}", &e[..80]);
    assert!(e.len() < 300 && !e.contains('\n'), "reason of {} bytes", e.len());
}

#[guard_test]
fn deep_nesting_in_every_position_is_an_error_not_a_stack_overflow() {
    let n = 100_000;
    for (open, close) in [("[", "]"), ("{\"a\":", "}")] {
        for wrap in [
            format!("{}{}", open.repeat(n), close.repeat(n)),
            format!(r#"{{"threshold": {}1{}}}"#, open.repeat(n), close.repeat(n)),
            format!(r#"{{"excludes": [{}]}}"#, open.repeat(n)),
            open.repeat(n),
        ] {
            let e = config::parse(wrap.as_bytes(), Path::new(HOME)).unwrap_err().to_string();
            assert!(e.starts_with("config_malformed json"), "{e}");
        }
    }
}

#[guard_test]
fn non_utf8_bytes_in_strings_and_keys_are_rejected_as_malformed() {
    for bad in [&b"\xff"[..], b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80abc", b"\xc0\xaf"] {
        for template in [
            &b"{\"excludes\": [\"X\"]}"[..],
            b"{\"stateFile\": \"X\"}",
            b"{\"X\": 1}",
            b"{\"excludeCommands\": [\"aX\"]}",
        ] {
            let at = template.iter().position(|&b| b == b'X').unwrap();
            let mut bytes = template[..at].to_vec();
            bytes.extend_from_slice(bad);
            bytes.extend_from_slice(&template[at + 1..]);
            let e = config::parse(&bytes, Path::new(HOME)).unwrap_err().to_string();
            assert!(e.starts_with("config_malformed json"), "{bytes:?}: {e}");
        }
    }
    // Escaped lone surrogates are invalid JSON too; an escaped NUL in stateFile is refused.
    assert!(config::parse(br#"{"excludes": ["\udc00"]}"#, Path::new(HOME)).is_err());
    let e = config::parse(br#"{"stateFile": "a\u0000b"}"#, Path::new(HOME)).unwrap_err().to_string();
    assert!(e.starts_with("config_malformed stateFile"), "{e}");
}

#[guard_test]
fn two_hundred_thousand_random_records_decode_or_are_rejected_without_panicking() {
    let mut rng = Rng(0xdec0_de00_2000_0002);
    let size = RawEvent::SIZE;
    let (mut ok, mut errs) = (0u32, 0u32);
    for case in 0..200_000 {
        // Mostly full-size records (the interesting path), sometimes any length up to 2×.
        let len = if rng.below(8) == 0 { rng.below(2 * size + 1) } else { size };
        let mut buf: Vec<u8> = (0..len).map(|_| rng.byte()).collect();
        if len == size {
            // Steer the kind into and around the valid range, and sometimes zero the pid.
            if rng.below(4) != 0 {
                let k = rng.below(8) as u32;
                buf[0..4].copy_from_slice(&k.to_ne_bytes());
            }
            if rng.below(16) == 0 {
                buf[4..8].fill(0);
            }
            // comm: sometimes NUL-terminated early, sometimes no NUL at all.
            if rng.below(2) == 0 {
                let at = 24 + rng.below(size - 24);
                buf[at] = 0;
            }
        }
        match Event::decode(&buf) {
            Ok(e) => {
                ok += 1;
                assert!(e.id().pid != 0, "case {case}");
                assert_eq!(Event::decode(&e.encode()), Ok(e), "case {case}: {buf:?}");
            }
            Err(DecodeError::Size(n)) => {
                errs += 1;
                assert_eq!(n, len, "case {case}");
                assert_ne!(len, size, "case {case}");
            }
            Err(DecodeError::ZeroPid) => {
                errs += 1;
                assert_eq!(&buf[4..8], &[0; 4], "case {case}");
            }
            Err(DecodeError::Kind(k)) => {
                errs += 1;
                assert_eq!(k.to_ne_bytes(), buf[0..4], "case {case}");
            }
        }
    }
    assert!(ok > 50_000 && errs > 10_000, "ok={ok} errors={errs}");
}

/// A random ERE of the kinds that hurt glibc: back-references (valid or not), nested and counted
/// repeats, empty alternatives and groups.
fn hostile_ere(rng: &mut Rng, depth: usize, groups: &mut usize) -> String {
    let mut s = String::new();
    for _ in 0..1 + rng.below(4) {
        let atom = match rng.below(10) {
            0..=2 => rng.pick(&["a", "b", "a", "c"]).to_string(),
            3 => ".".to_string(),
            4 | 5 if depth < 3 => {
                *groups += 1;
                format!("({})", hostile_ere(rng, depth + 1, groups))
            }
            6 => format!("\\{}", 1 + rng.below(3)),
            7 => rng.pick(&["()", "(|a)", "(a|)", "[ab]", "^", "$"]).to_string(),
            _ => rng.pick(&["a", "b"]).to_string(),
        };
        s.push_str(&atom);
        if rng.below(3) == 0 {
            let (m, n) = (rng.below(7), rng.below(13));
            s.push_str(&match rng.below(7) {
                0 => "*".to_string(),
                1 => "+".to_string(),
                2 => "?".to_string(),
                3 => format!("{{{m}}}"),
                4 => format!("{{{m},}}"),
                5 => format!("{{{m},{n}}}"),
                _ => format!("{{,{n}}}"),
            });
        }
        if rng.below(8) == 0 {
            s.push('|');
        }
    }
    s
}

/// What glibc says in this process's image, run in a forked child so a pattern that overflows
/// the stack or never finishes cannot take the test down: `None` unless it decided within 50 ms
/// and 512 MiB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reference {
    Match,
    Other,
    Invalid,
}

fn reference(pattern: &str, text: &[u8]) -> Option<Reference> {
    // SAFETY: the child only compiles, matches (glibc's malloc is fork-safe) and `_exit`s.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = unsafe {
            libc::signal(libc::SIGSEGV, libc::SIG_DFL);
            let space = libc::rlimit { rlim_cur: 512 << 20, rlim_max: 512 << 20 };
            libc::setrlimit(libc::RLIMIT_AS, &space);
            let timer = libc::itimerval {
                it_interval: libc::timeval { tv_sec: 0, tv_usec: 0 },
                it_value: libc::timeval { tv_sec: 0, tv_usec: 50_000 },
            };
            libc::setitimer(libc::ITIMER_REAL, &timer, std::ptr::null_mut());
            match Pattern::new(pattern) {
                Ok(p) => match p.try_match(text) {
                    Ok(true) => 10,
                    Ok(false) => 11,
                    Err(_) => 13,
                },
                Err(PatternError::OutOfMemory { .. }) => 13,
                Err(_) => 12,
            }
        };
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: reaping the child forked above.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    match libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)) {
        Some(10) => Some(Reference::Match),
        Some(11) => Some(Reference::Other),
        Some(12) => Some(Reference::Invalid),
        _ => None,
    }
}

#[guard_test]
fn random_hostile_eres_through_the_bounded_matcher_always_answer_and_agree_with_glibc() {
    let limits = Limits { per_match: Duration::from_millis(100), ..Limits::default() };
    let mut matcher = Matcher::new(env!("CARGO_BIN_EXE_guard-user").into(), limits.clone());
    let mut rng = Rng(0xbac4_4ef5_0000_0003);
    let (mut cases, mut decided, mut agreed, mut budget_where_fast, mut refused) = (0, 0, 0, 0, 0);
    let started = Instant::now();
    for case in 0..1000 {
        let inner = hostile_ere(&mut rng, 1, &mut 0);
        // A third are shaped like the known blow-ups: a starred group referenced after itself.
        let pattern = match rng.below(9) {
            0 => format!("({inner})*\\1"),
            1 => format!("({inner}|)(\\1\\1|a)+"),
            2 => format!("(({inner})*)*\\1c"),
            _ => hostile_ere(&mut rng, 0, &mut 0),
        };
        let texts: Vec<Vec<u8>> = (0..3)
            .map(|_| match rng.below(4) {
                0 => {
                    let mut t = vec![b'a'; 100 + rng.below(500)];
                    let tails: [&[u8]; 4] = [b"", b"b", b"c", b"ab"];
                    let tail: &[u8] = tails[rng.below(tails.len())];
                    t.extend_from_slice(tail);
                    t
                }
                _ => (0..rng.below(24)).map(|_| *rng.pick(b"aaabbc")).collect(),
            })
            .collect();
        cases += texts.len();
        let set = matcher.set_patterns(std::slice::from_ref(&pattern));
        let outcomes = match &set {
            Ok(()) => {
                let refs: Vec<&[u8]> = texts.iter().map(Vec::as_slice).collect();
                let t = Instant::now();
                let out = matcher.classify(&refs, Instant::now() + Duration::from_secs(3));
                assert!(t.elapsed() < Duration::from_secs(6), "case {case} {pattern:?}: {:?}", t.elapsed());
                assert_eq!(out.len(), texts.len(), "case {case}");
                out
            }
            Err(PatternSetError::Invalid { .. }) => vec![],
            Err(PatternSetError::TooCostly { .. }) => {
                refused += 1;
                continue;
            }
            Err(e) => panic!("case {case} {pattern:?}: {e}"),
        };
        for (i, text) in texts.iter().enumerate() {
            let Some(want) = reference(&pattern, text) else { continue };
            decided += 1;
            let got = match (&set, outcomes.get(i)) {
                (Err(_), _) => Reference::Invalid,
                (Ok(()), Some(MatchOutcome::Matched(0))) => Reference::Match,
                (Ok(()), Some(MatchOutcome::NoMatch)) => Reference::Other,
                (Ok(()), Some(MatchOutcome::Budget)) => {
                    budget_where_fast += 1;
                    continue;
                }
                (Ok(()), other) => panic!("case {case}: {other:?}"),
            };
            assert_eq!(
                got,
                want,
                "case {case}: pattern {pattern:?} text {:?}",
                String::from_utf8_lossy(&text[..text.len().min(60)])
            );
            agreed += 1;
        }
    }
    let stats = matcher.stats();
    println!(
        "hostile EREs: {cases} cases in {:?}, glibc decided {decided} quickly, {agreed} agreed, {budget_where_fast} \
         Budget where glibc was quick, {refused} lists refused as too costly; {stats:?}",
        started.elapsed()
    );
    // The generator must reach the hard parts (kills or deaths) and mostly easy ones.
    assert!(stats.kills + stats.deaths > 0, "{stats:?}");
    assert!(decided > cases / 2 && agreed > cases / 2, "decided {decided}, agreed {agreed} of {cases}");
    assert!(budget_where_fast * 50 <= decided, "{budget_where_fast} Budget where glibc decided fast");
}

guard_test::main!();
