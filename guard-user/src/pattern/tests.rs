//! Unit tests of the raw in-process [`Pattern`] (bash semantics); the bounded matcher has its own
//! integration tests (`tests/matcher*.rs`).
use super::*;

const SHIPPED: [&str; 4] = [
    "(^|[ /])agentihooks swarm tick( |$)",
    " -m scripts[.]swarm[.]scheduled_tick( |$)",
    "(^|[ /])agentihooks select-profile( |$)",
    "(^|[ /])agentihooks swarm (tick-watch|prober|waker)( |$)",
];

fn matches(pattern: &str, text: &str) -> bool {
    Pattern::new(pattern).unwrap().is_match(text.as_bytes())
}

#[test]
fn shipped_patterns_protect_the_swarm_helpers() {
    assert!(matches(SHIPPED[0], "/usr/bin/agentihooks swarm tick"));
    assert!(matches(SHIPPED[0], "node /x/agentihooks swarm tick --once"));
    assert!(matches(SHIPPED[1], "python3 -m scripts.swarm.scheduled_tick"));
    assert!(matches(SHIPPED[2], "node /x/agentihooks select-profile foo"));
    assert!(matches(SHIPPED[3], "agentihooks swarm prober"));
    assert!(matches(SHIPPED[3], "/opt/agentihooks swarm tick-watch --all"));
}

#[test]
fn shipped_patterns_do_not_protect_lookalikes() {
    assert!(!matches(SHIPPED[0], "/usr/bin/agentihooks swarm ticker"));
    assert!(!matches(SHIPPED[0], "myagentihooks swarm tick"));
    assert!(!matches(SHIPPED[1], "python3 -m scripts_swarm.scheduled_tick"));
    assert!(!matches(SHIPPED[1], "python3 -m scripts.swarm.scheduled_tick2"));
    assert!(!matches(SHIPPED[2], "agentihooks select-profiles"));
    assert!(!matches(SHIPPED[3], "agentihooks swarm wakers"));
}

#[test]
fn invalid_pattern_reports_regerror_text() {
    let err = Pattern::new("(unclosed").unwrap_err();
    let PatternError::Invalid { pattern, reason } = &err else {
        panic!("expected Invalid, got {err:?}");
    };
    assert_eq!(pattern, "(unclosed");
    assert_eq!(reason, "Unmatched ( or \\(");
    assert_eq!(err.to_string(), "invalid pattern `(unclosed`: Unmatched ( or \\(");
    assert!(matches!(Pattern::new("a{2,1}"), Err(PatternError::Invalid { .. })));
    assert!(matches!(Pattern::new("[[:nope:]]"), Err(PatternError::Invalid { .. })));
}

#[test]
fn pattern_with_nul_is_rejected() {
    let err = Pattern::new("a\0b").unwrap_err();
    assert_eq!(err, PatternError::Nul { pattern: "a\0b".into() });
    assert!(err.to_string().contains("NUL"), "{err}");
}

#[test]
fn non_utf8_text_is_matched_byte_by_byte() {
    let p = Pattern::new("^caf.{2}$").unwrap();
    assert!(p.is_match("café".as_bytes()), "é is two bytes in the C locale");
    assert!(Pattern::new("x[^a]y").unwrap().is_match(b"x\xffy"));
    assert!(Pattern::new("^[\u{e9}]$").unwrap().is_match(b"\xa9"), "[é] is a set of bytes");
    assert!(!Pattern::new("^[[:alpha:]]$").unwrap().is_match(b"\xe9"));
}

#[test]
fn embedded_nul_is_an_ordinary_byte_not_a_terminator() {
    assert!(!Pattern::new("a$").unwrap().is_match(b"a\0b"));
    assert!(Pattern::new("b$").unwrap().is_match(b"a\0b"));
    assert!(!Pattern::new("a.b").unwrap().is_match(b"a\0b"));
    assert!(Pattern::new("a[^x]b").unwrap().is_match(b"a\0b"));
}

#[test]
fn back_references_have_one_digit() {
    let p = Pattern::new("(a|ab)(c|bcd)(d*)\\3$").unwrap();
    assert!(p.is_match(b"abcd"));
    assert!(Pattern::new("^(.)\\1$").unwrap().is_match(b"zz"));
    assert!(!Pattern::new("^(.)\\1$").unwrap().is_match(b"zy"));
    // `\10` is `\1` then `0`; ten groups also take the heap path for match slots.
    let many = Pattern::new("((((((((((x))))))))))\\10").unwrap();
    assert!(many.is_match(b"xx0"));
    assert!(!many.is_match(b"xx"));
}

#[test]
fn long_text_matches_at_its_end() {
    let mut text = vec![b'x'; 1 << 20];
    text.extend_from_slice(b" agentihooks swarm tick");
    assert!(Pattern::new(SHIPPED[0]).unwrap().is_match(&text));
}

#[test]
fn clone_debug_and_as_str_keep_the_source() {
    let p = Pattern::new(SHIPPED[1]).unwrap();
    let q = p.clone();
    assert_eq!(q.as_str(), SHIPPED[1]);
    assert_eq!(p, q);
    assert!(q.is_match(b"python3 -m scripts.swarm.scheduled_tick"));
    assert_eq!(format!("{p:?}"), format!("Pattern({:?})", SHIPPED[1]));
}

#[test]
fn pattern_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Pattern>();
    let p = std::sync::Arc::new(Pattern::new("(a|b)+c").unwrap());
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let p = p.clone();
            std::thread::spawn(move || (0..2000).all(|_| p.is_match(b"ababc") && !p.is_match(b"abab")))
        })
        .collect();
    assert!(handles.into_iter().all(|h| h.join().unwrap()));
}
