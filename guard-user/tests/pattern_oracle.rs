//! Oracle test: `guard::pattern::Pattern` must give bash's verdict on every case.
//!
//! docs/configuration.md defines an `excludeCommands` pattern by what `[[ $cmdline =~ $pattern ]]` does, so
//! the reference is bash itself. One bash process (C locale, no rc files, clean environment)
//! reads NUL-separated pattern/text pairs from a temp file and prints, per pair, the status of
//! `[[ $t =~ $p ]]` (0 match, 1 no match, 2 invalid pattern) and the byte lengths it read, so a
//! pair mangled in transit is reported as such rather than as a verdict difference.
//!
//! The same corpus runs twice: through the raw in-process `Pattern`, and through the bounded
//! `Matcher` (sandboxed worker process, frames, static checks), which must not change a verdict.
use guard_test::{guard_test, rng::Rng};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use guard::pattern::{Limits, MatchOutcome, Matcher, Pattern, PatternSetError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Match,
    Other,
    Invalid,
}

struct Case {
    pattern: String,
    text: Vec<u8>,
}

const SHIPPED: [&str; 4] = [
    "(^|[ /])agentihooks swarm tick( |$)",
    " -m scripts[.]swarm[.]scheduled_tick( |$)",
    "(^|[ /])agentihooks select-profile( |$)",
    "(^|[ /])agentihooks swarm (tick-watch|prober|waker)( |$)",
];

/// Command lines as the daemon builds them (arguments joined by single spaces).
const CMDLINES: &[&str] = &[
    "node /x/agentihooks select-profile foo",
    "node /x/agentihooks select-profile",
    "node /x/agentihooks select-profiles foo",
    "node /x/agentihooks  select-profile foo",
    "agentihooks select-profile",
    "/home/a/.local/bin/agentihooks select-profile --json",
    "xagentihooks select-profile foo",
    "python3 -m scripts.swarm.scheduled_tick",
    "python3 -m scripts.swarm.scheduled_tick --dry-run",
    "python3 -m scripts.swarm.scheduled_tick2",
    "python3 -m scripts_swarm_scheduled_tick",
    "python3 -mscripts.swarm.scheduled_tick",
    "/usr/bin/python3 -u -m scripts.swarm.scheduled_tick",
    "/usr/bin/agentihooks swarm tick",
    "/usr/bin/agentihooks swarm tick --once",
    "/usr/bin/agentihooks swarm ticker",
    "agentihooks swarm tick",
    "agentihooks swarm tick-watch",
    "node /opt/agentihooks/bin/agentihooks swarm tick-watch --interval 5",
    "agentihooks swarm prober",
    "agentihooks swarm probers",
    "agentihooks swarm waker --all",
    "agentihooks swarm  waker",
    "agentihooks swarm sleeper",
    "bash -c agentihooks swarm tick",
    "bash -c 'agentihooks swarm tick'",
    "claude --dangerously-skip-permissions",
    "node /usr/lib/node_modules/npm/bin/npm-cli.js run build",
    "sleep 3600",
    "",
    " ",
    "AGENTIHOOKS SWARM TICK",
    "agentihooks\tswarm tick",
    "agentihooks swarm tick\n",
    "/x/agentihooks swarm waker\u{e9}",
];

/// Edge-case patterns, each tried against every text in `EDGE_TEXTS`.
#[rustfmt::skip]
const EDGE_PATTERNS: &[&str] = &[
    "", "^", "$", "^$", "a", "^a", "a$", ".", "..", "a|b", "a||b", "|a", "a|", "|", "()", "(|a)",
    "(a|)", "*a", "+a", "?a", "{1}a", "a**", "a+*", "a*?", "a{2}", "a{2,}", "a{1,2}", "a{,2}",
    "a{0}", "a{0,0}", "a{2,1}", "a{", "a{1", "a{1,", "a{x}", "a{1,2,3}", "a{}", "a{ 1}", "{", "}",
    "a}", "a{32767}", "a{32768}", "(a", "a)", ")", "(", "((a)", "[", "]", "[a", "a]", "[]", "[]]",
    "[]a]", "[^]]", "[^]a]", "[]-a]", "[a-]", "[-a]", "[^-]", "[a-c]", "[c-a]", "[a-a]", "[--/]",
    "[\\]", "[\\\\]", "[\\]]", "[a\\]b]", "\\", "a\\", "\\\\", "\\.", "\\a", "\\n", "\\t", "\\<a",
    "a\\>", "\\ba\\b", "\\Ba", "\\w+", "\\W", "\\s", "\\S", "\\`a", "a\\'", "\\(", "\\)", "\\{",
    "\\}", "\\|", "\\*", "\\+", "\\?", "\\[", "\\]", "\\^", "\\$", "\\/", "\\1", "(a)\\1",
    "(a)\\2", "(a*)\\1b", "(a|b)\\1", "((a)b)\\2", "(a)(b)\\2\\1", "^(.*)\\1$", "[[:alpha:]]",
    "[[:digit:]]+", "[[:space:]]", "[[:upper:]]", "[[:lower:]]", "[[:punct:]]", "[[:alnum:]_]",
    "[[:blank:]]", "[[:cntrl:]]", "[[:graph:]]", "[[:print:]]", "[[:xdigit:]]", "[[:bogus:]]",
    "[[:alpha:]", "[[:alpha]]", "[:alpha:]", "[[.a.]]", "[[.-.]]", "[[.space.]]", "[[.bogus.]]",
    "[[=a=]]", "[[=a=]b]", "[^[:alpha:]]", "[a-[:alpha:]]", "[[:alpha:]-z]", "é", "[é]", "^[é]$",
    "€", ".{3}", "\u{1}", "[\u{1}]", "\u{7f}", "[\u{7f}]", "\n", "a.b", "^a.*b$", "(^a|b$)", "x^",
    "$x", "a^b", "a$b", "(^)", "($)", "^*", "^+", "$*", "(*a)", "(+a)", "(|)", "a|*b", "a|+b",
    "[a|b]", "[(]", "[)]", "[.]", "[*]", "[$]", "[^^]", "[\\n]", "((((((((((x))))))))))\\10",
    "(a)(b)(c)(d)(e)(f)(g)(h)(i)\\9",
    // glibc quirks bash shows because it asks regexec for re_nsub + 1 slots: none of these
    // matches `ab`, though each would with a single slot.
    "a|(^a*|b){,2}.+", ".|(^a*|\\b){,2}.+", ".|(^.{2}*|\\b){,2}",
];

#[rustfmt::skip]
const EDGE_TEXTS: &[&[u8]] = &[
    b"", b"a", b"b", b"ab", b"aa", b"abab", b"a b", b"]", b"\\", b"-", b"x a/b", b"A1_", b"{1}",
    b"(a)", b"\xe9", b"\xc3\xa9", b"\xff\xfe", b"\x01", b"\x7f", b"\n", b"a\nb", b" \t", b"[a]",
    b"\xe2\x82\xac", b"aaa{", b"a}b$", b"$x^", b"*a+", b".", b"||",
];

const LITERALS: &[&str] = &["a", "b", "c", "x", " ", "/", "-", "_", "A", "1", "é", "\t", "\n"];
const CLASSES: &[&str] = &[
    "alpha", "digit", "space", "upper", "lower", "punct", "alnum", "blank", "cntrl", "graph", "print", "xdigit",
    "bogus", "",
];
const ESCAPES: &[&str] = &[
    "\\.", "\\\\", "\\<", "\\>", "\\b", "\\B", "\\w", "\\W", "\\s", "\\S", "\\`", "\\'", "\\a", "\\(", "\\)", "\\[",
    "\\]", "\\{", "\\}", "\\|", "\\*", "\\+", "\\?", "\\1", "\\2", "\\9", "\\-", "\\/", "\\ ",
];
const QUANTIFIERS: &[&str] = &[
    "*", "+", "?", "{2}", "{1,}", "{0,1}", "{1,3}", "{,2}", "{0}", "{3,1}", "{", "{1", "{x}", "{1,2,3}", "{}", "**",
    "*+", "+?", "{2}*",
];

/// One bracket expression, sometimes malformed: `]` first, `-` at either end, `^` negation,
/// ranges, classes, collating symbols, equivalence classes, backslashes.
fn bracket(rng: &mut Rng) -> String {
    let mut s = String::from("[");
    if rng.chance(30) {
        s.push('^');
    }
    if rng.chance(20) {
        s.push(']');
    }
    if rng.chance(15) {
        s.push('-');
    }
    for _ in 0..1 + rng.below(3) {
        match rng.below(8) {
            0 => s.push_str(&format!("[:{}:]", *rng.pick(CLASSES))),
            1 => s.push_str(rng.pick::<&str>(&["a-c", "c-a", "a-a", "--/", " -/", "0-9", "A-Z", "a-\\"])),
            2 => s.push('\\'),
            3 => s.push_str(rng.pick::<&str>(&["[.a.]", "[.-.]", "[=a=]", "[.space.]", "[:alpha:"])),
            4 => s.push_str(rng.pick::<&str>(&["[", "|", "(", ")", "*", ".", "$", "^", "{"])),
            _ => s.push_str(rng.pick::<&str>(LITERALS)),
        }
    }
    if rng.chance(15) {
        s.push('-');
    }
    if !rng.chance(8) {
        s.push(']');
    }
    s
}

/// One atom (possibly a group holding a smaller expression), maybe quantified.
fn piece(rng: &mut Rng, depth: usize) -> String {
    let mut s = match rng.below(12) {
        0..=3 => rng.pick(LITERALS).to_string(),
        4 => ".".to_string(),
        5 | 6 => bracket(rng),
        7 | 8 => rng.pick(ESCAPES).to_string(),
        9 if depth < 2 => format!("({})", expression(rng, depth + 1)),
        9 => "()".to_string(),
        10 => rng.pick(&["^", "$", "(", ")", "|", "*", "+", "?", "{1}", "}"]).to_string(),
        _ => rng.pick(&["agentihooks", "swarm", "tick", "[.]", "( |$)", "(^|[ /])"]).to_string(),
    };
    if rng.chance(30) {
        s.push_str(rng.pick::<&str>(QUANTIFIERS));
    }
    s
}

/// A sequence of pieces, sometimes anchored, sometimes with (possibly empty) alternatives.
fn expression(rng: &mut Rng, depth: usize) -> String {
    let mut s = String::new();
    if rng.chance(20) {
        s.push('^');
    }
    for _ in 0..1 + rng.below(4) {
        s.push_str(&piece(rng, depth));
        if rng.chance(12) {
            s.push('|');
        }
    }
    if rng.chance(20) {
        s.push('$');
    }
    s
}

/// A short text over the bytes patterns talk about, plus non-ASCII and non-UTF-8 bytes.
fn text(rng: &mut Rng, pattern: &str) -> Vec<u8> {
    const EXTRA: &[u8] = b"abcxA1_ -/.]\\[(){}|*+?^$\t\n\x01\x7f\x80\xe9\xff\xc3\xa9";
    let from_pattern = pattern.as_bytes();
    let len = rng.below(13);
    (0..len)
        .map(|_| if !from_pattern.is_empty() && rng.chance(60) { *rng.pick(from_pattern) } else { *rng.pick(EXTRA) })
        .collect()
}

fn corpus() -> Vec<Case> {
    let mut cases = Vec::new();
    let mut add = |pattern: &str, text: &[u8]| cases.push(Case { pattern: pattern.to_string(), text: text.to_vec() });
    for pattern in SHIPPED {
        for cmdline in CMDLINES {
            add(pattern, cmdline.as_bytes());
        }
        let mut long = vec![b'x'; 200_000];
        long.extend_from_slice(b" agentihooks swarm tick");
        add(pattern, &long);
        add(pattern, b"node /x/agentihooks select-profile \xff\xfe");
    }
    for pattern in EDGE_PATTERNS {
        for text in EDGE_TEXTS {
            add(pattern, text);
        }
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..1500 {
        let pattern = expression(&mut rng, 0);
        for _ in 0..3 {
            let text = text(&mut rng, &pattern);
            add(&pattern, &text);
        }
    }
    cases
}

fn ours(case: &Case) -> Verdict {
    match Pattern::new(&case.pattern) {
        Ok(p) if p.is_match(&case.text) => Verdict::Match,
        Ok(_) => Verdict::Other,
        Err(_) => Verdict::Invalid,
    }
}

/// bash's verdicts for all cases, from one bash process; `None` when bash is not installed.
fn bash_verdicts(cases: &[Case]) -> Option<Vec<Verdict>> {
    let mut input = tempfile::NamedTempFile::new().expect("create the corpus file");
    for case in cases {
        input.write_all(case.pattern.as_bytes()).unwrap();
        input.write_all(b"\0").unwrap();
        input.write_all(&case.text).unwrap();
        input.write_all(b"\0").unwrap();
    }
    input.flush().unwrap();
    let script = r#"shopt -u nocasematch
while IFS= read -r -d '' p && IFS= read -r -d '' t; do
  [[ $t =~ $p ]]
  printf '%d %d %d\n' "$?" "${#p}" "${#t}"
done"#;
    let output = match Command::new("bash")
        .args(["--noprofile", "--norc", "-c", script])
        .env_clear()
        .env("LC_ALL", "C")
        .stdin(std::fs::File::open(input.path()).unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
    {
        Ok(output) => output,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return None,
        Err(err) => panic!("cannot run bash: {err}"),
    };
    assert!(output.status.success(), "bash failed: {}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8(output.stdout).expect("bash prints digits");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), cases.len(), "bash answered {} of {} cases", lines.len(), cases.len());
    let verdicts = lines
        .iter()
        .zip(cases)
        .map(|(line, case)| {
            let fields: Vec<usize> = line.split(' ').map(|f| f.parse().unwrap()).collect();
            assert_eq!(
                (fields[1], fields[2]),
                (case.pattern.len(), case.text.len()),
                "bash read {:?} / {:?} with other lengths",
                case.pattern,
                String::from_utf8_lossy(&case.text)
            );
            match fields[0] {
                0 => Verdict::Match,
                1 => Verdict::Other,
                2 => Verdict::Invalid,
                other => panic!("bash status {other} for {:?}", case.pattern),
            }
        })
        .collect();
    Some(verdicts)
}

#[guard_test]
fn every_verdict_equals_bash() {
    let cases = corpus();
    // bash is the oracle, and every test host's shell: no need of its own.
    let expected = bash_verdicts(&cases).expect("bash, the oracle");
    let count = |v: Verdict| expected.iter().filter(|&&e| e == v).count();
    println!(
        "pattern oracle: {} cases, bash says {} match, {} other, {} invalid",
        cases.len(),
        count(Verdict::Match),
        count(Verdict::Other),
        count(Verdict::Invalid)
    );
    assert!(cases.len() >= 2000, "the corpus shrank to {} cases", cases.len());
    let mismatches: Vec<String> = cases
        .iter()
        .zip(&expected)
        .filter_map(|(case, &bash)| {
            let got = ours(case);
            (got != bash).then(|| {
                let text = String::from_utf8_lossy(&case.text);
                let text: String = text.chars().take(80).collect();
                format!("pattern {:?} text {text:?}: bash {bash:?}, ours {got:?}", case.pattern)
            })
        })
        .collect();
    assert!(
        mismatches.is_empty(),
        "{} of {} cases differ from bash; first 20:\n{}",
        mismatches.len(),
        cases.len(),
        mismatches.iter().take(20).cloned().collect::<Vec<_>>().join("\n")
    );
}

/// Verdicts for all cases through the bounded matcher: one `set_patterns` per distinct pattern,
/// one `classify` for its texts. `None` where the matcher refused the pattern as too costly (a
/// deliberate difference from bash, counted by the caller) or could not decide (`Budget`).
fn bounded_verdicts(cases: &[Case]) -> Vec<Option<Verdict>> {
    let mut matcher = Matcher::new(env!("CARGO_BIN_EXE_guard-user").into(), Limits::default());
    let mut verdicts = vec![None; cases.len()];
    let mut start = 0;
    while start < cases.len() {
        let pattern = &cases[start].pattern;
        let end = start + cases[start..].iter().take_while(|c| &c.pattern == pattern).count();
        match matcher.set_patterns(std::slice::from_ref(pattern)) {
            Ok(()) => {
                let texts: Vec<&[u8]> = cases[start..end].iter().map(|c| c.text.as_slice()).collect();
                let outcomes = matcher.classify(&texts, Instant::now() + Duration::from_secs(30));
                for (i, outcome) in outcomes.into_iter().enumerate() {
                    verdicts[start + i] = match outcome {
                        MatchOutcome::Matched(0) => Some(Verdict::Match),
                        MatchOutcome::NoMatch => Some(Verdict::Other),
                        MatchOutcome::Budget => None,
                        other => panic!("{other:?} from a one-pattern list"),
                    };
                }
            }
            Err(PatternSetError::Invalid { .. } | PatternSetError::Nul { .. }) => {
                verdicts[start..end].fill(Some(Verdict::Invalid));
            }
            Err(PatternSetError::TooCostly { .. }) => {}
            Err(e) => panic!("pattern {pattern:?}: {e}"),
        }
        start = end;
    }
    verdicts
}

#[guard_test]
fn every_verdict_through_the_bounded_matcher_equals_bash() {
    let cases = corpus();
    let expected = bash_verdicts(&cases).expect("bash, the oracle");
    let ours = bounded_verdicts(&cases);
    let undecided: Vec<&str> =
        cases.iter().zip(&ours).filter(|(_, o)| o.is_none()).map(|(c, _)| c.pattern.as_str()).collect();
    let mut refused = undecided.clone();
    refused.dedup();
    println!("bounded oracle: {} cases, {} undecided or refused, patterns {refused:?}", cases.len(), undecided.len());
    // Only the huge-count edge patterns are refused statically (`a{32767}` is valid for bash,
    // `a{32768}` not); nothing in this corpus is slow enough to hit a bound.
    assert!(
        refused.iter().all(|p| guard::pattern::limits::expansion(p.as_bytes()) > Limits::default().max_expansion),
        "refused or undecided beyond the static estimate: {refused:?}"
    );
    assert!(undecided.len() <= 2 * EDGE_TEXTS.len(), "{} undecided", undecided.len());
    let mismatches: Vec<String> = cases
        .iter()
        .zip(&expected)
        .zip(&ours)
        .filter_map(|((case, &bash), ours)| {
            let got = (*ours)?;
            (got != bash).then(|| {
                let text: String = String::from_utf8_lossy(&case.text).chars().take(80).collect();
                format!("pattern {:?} text {text:?}: bash {bash:?}, bounded {got:?}", case.pattern)
            })
        })
        .collect();
    assert!(
        mismatches.is_empty(),
        "{} of {} cases differ from bash; first 20:\n{}",
        mismatches.len(),
        cases.len(),
        mismatches.iter().take(20).cloned().collect::<Vec<_>>().join("\n")
    );
}

/// Every hint `validate` and `match` give about another dialect's syntax (`pattern::habits`) is
/// true of bash: each example verdict, each pattern called invalid, each GNU operator called
/// honoured; and each example's construct is found (or, for a fix, not found) by the scanner.
#[guard_test]
fn every_hint_about_another_dialect_is_true_of_bash() {
    use guard::pattern::habits::{self, Kind};
    let mut kinds: Vec<&Kind> = habits::LETTERS.iter().map(|(_, k)| k).collect();
    kinds.extend([
        &habits::OTHER_LETTER,
        &habits::BRACKET_ESCAPE,
        &habits::LAZY_OPTIONAL,
        &habits::LAZY_SAME,
        &habits::POSSESSIVE,
        &habits::GROUP_SYNTAX,
    ]);
    let mut cases = Vec::new();
    let mut expected = Vec::new();
    for kind in &kinds {
        for (pattern, text, matches) in kind.examples {
            cases.push(Case { pattern: pattern.to_string(), text: text.as_bytes().to_vec() });
            expected.push(if *matches { Verdict::Match } else { Verdict::Other });
        }
    }
    for p in habits::INVALID_EXAMPLES {
        assert!(!habits::habits(p).is_empty(), "{p}: no hint for a pattern bash refuses");
        cases.push(Case { pattern: p.to_string(), text: b"abc".to_vec() });
        expected.push(Verdict::Invalid);
    }
    for (p, text, matches) in habits::HONOURED {
        assert!(habits::habits(p).is_empty(), "{p} is honoured by bash, yet hinted at");
        cases.push(Case { pattern: p.to_string(), text: text.as_bytes().to_vec() });
        expected.push(if *matches { Verdict::Match } else { Verdict::Other });
    }
    // Every letter bash does not honour reads as itself, as OTHER_LETTER says.
    for c in ('a'..='z').chain('A'..='Z').filter(|c| !"wWsSbB".contains(*c)) {
        assert!(!habits::habits(&format!("\\{c}")).is_empty(), "\\{c}: no hint");
        cases.push(Case { pattern: format!("\\{c}"), text: c.to_string().into_bytes() });
        expected.push(Verdict::Match);
    }
    let bash = bash_verdicts(&cases).expect("bash, the oracle");
    let wrong: Vec<String> = cases
        .iter()
        .zip(bash.iter().zip(&expected))
        .filter(|(_, (b, e))| b != e)
        .map(|(c, (b, e))| {
            format!("{:?} on {:?}: bash {b:?}, the hint says {e:?}", c.pattern, String::from_utf8_lossy(&c.text))
        })
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
}

guard_test::main!();
