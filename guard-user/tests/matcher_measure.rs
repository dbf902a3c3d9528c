//! The numbers behind the bounds in `pattern::limits` (ignored by default: it measures, it
//! does not judge). Run it in release, where the daemon runs:
//! `cargo test --release -p guard-user --test matcher_measure -- --ignored --nocapture`
use guard_test::guard_test;
use std::time::{Duration, Instant};

use guard::pattern::{Limits, MatchOutcome, Matcher, Pattern};

fn exe() -> std::path::PathBuf {
    env!("CARGO_BIN_EXE_guard-user").into()
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn kib(b: u64) -> String {
    format!("{} KiB", b >> 10)
}

/// Short command lines like a workstation's, one in eight matching a shipped pattern.
fn cmdlines(n: usize) -> Vec<Vec<u8>> {
    let shapes = [
        "/usr/bin/node /home/u/.npm/_npx/bin/claude --dangerously-skip-permissions",
        "python3 -m pytest tests/ -x -q",
        "/usr/lib/chromium/chromium --type=renderer --lang=en-US --num-raster-threads=4",
        "bash -c sleep 3600",
        "node /x/agentihooks select-profile default",
        "/usr/bin/python3 -u -m scripts.swarm.scheduled_tick --dry-run",
        "cargo build --release -p guard-user",
        "/usr/bin/agentihooks swarm tick --once",
    ];
    (0..n).map(|i| format!("{} {i}", shapes[i % shapes.len()]).into_bytes()).collect()
}

#[guard_test(ignore = "measurement; run with --ignored --nocapture in release")]
fn measure_the_bounded_matcher() {
    let shipped: Vec<String> = guard::config::DEFAULT_EXCLUDE_COMMANDS.iter().map(|s| s.to_string()).collect();
    let far = || Instant::now() + Duration::from_secs(120);

    // Start-up and compile.
    let mut m = Matcher::new(exe(), Limits::default());
    let t = Instant::now();
    m.set_patterns(&["x".to_string()]).unwrap();
    println!("spawn + harden + compile one pattern: {}", ms(t.elapsed()));
    let idle = m.worker_memory().unwrap();
    println!("worker idle: rss {} anon {} peak {}", kib(idle.rss), kib(idle.anon), kib(idle.peak));
    let t = Instant::now();
    m.set_patterns(&shipped).unwrap();
    println!("compile the shipped set (running worker, incl. round trip): {}", ms(t.elapsed()));
    let t = Instant::now();
    for _ in 0..1000 {
        for p in &shipped {
            std::hint::black_box(Pattern::new(p).unwrap());
        }
    }
    println!("compile the shipped set in-process: {}", ms(t.elapsed() / 1000));
    let with_set = m.worker_memory().unwrap();
    println!("worker with the shipped set: rss {} anon {}", kib(with_set.rss), kib(with_set.anon));

    // Throughput: 10,000 short command lines × the 4 shipped patterns.
    let lines = cmdlines(10_000);
    let texts: Vec<&[u8]> = lines.iter().map(Vec::as_slice).collect();
    let compiled: Vec<Pattern> = shipped.iter().map(|p| Pattern::new(p).unwrap()).collect();
    for _ in 0..2 {
        let t = Instant::now();
        let ours = m.classify(&texts, far());
        let bounded = t.elapsed();
        let t = Instant::now();
        let reference: Vec<MatchOutcome> = texts
            .iter()
            .map(|text| match compiled.iter().position(|p| p.is_match(text)) {
                Some(i) => MatchOutcome::Matched(i),
                None => MatchOutcome::NoMatch,
            })
            .collect();
        let in_process = t.elapsed();
        assert_eq!(ours, reference);
        println!(
            "10,000 cmdlines × 4 shipped: bounded {} ({:.2} µs/text), in-process {} ({:.2} µs/text)",
            ms(bounded),
            bounded.as_secs_f64() * 1e6 / 1e4,
            ms(in_process),
            in_process.as_secs_f64() * 1e6 / 1e4
        );
    }
    let after = m.worker_memory().unwrap();
    println!("worker after 20,000 texts: rss {} anon {} peak {}", kib(after.rss), kib(after.anon), kib(after.peak));

    // A long legitimate text.
    let mut long = vec![b'x'; 1 << 20];
    long.extend_from_slice(b" agentihooks swarm tick");
    long.truncate(1 << 20);
    let t = Instant::now();
    let out = m.classify(&[&long], far());
    println!("one 1 MiB text × 4 shipped: {} ({out:?})", ms(t.elapsed()));

    // Hostile patterns: how long until Budget, and how long the next answer takes.
    for (name, pattern, text) in [
        ("(a*)*\\1, 100 KiB of a (memory bound)", "(a*)*\\1", vec![b'a'; 100 << 10]),
        ("(a|aa)*\\1c, 300 bytes of a (time bound)", "(a|aa)*\\1c", vec![b'a'; 300]),
        ("()(\\1\\1)+ (stack overflow)", "()(\\1\\1)+", b"aaaa".to_vec()),
    ] {
        m.set_patterns(&[pattern.to_string()]).unwrap();
        let before = m.stats();
        let t = Instant::now();
        let out = m.classify(&[&text], far());
        let budget = t.elapsed();
        let t = Instant::now();
        m.classify(&[b"x"], far());
        let next = t.elapsed();
        let s = m.stats();
        println!(
            "{name}: {out:?} after {}; next text {} (kills +{}, deaths +{}, spawns +{})",
            ms(budget),
            ms(next),
            s.kills - before.kills,
            s.deaths - before.deaths,
            s.spawns - before.spawns
        );
    }
    let t = Instant::now();
    let texts = vec![vec![b'a'; 100 << 10]; 100];
    let refs: Vec<&[u8]> = texts.iter().map(Vec::as_slice).collect();
    m.set_patterns(&["(a*)*\\1".to_string()]).unwrap();
    let out = m.classify(&refs, far());
    println!(
        "100 texts of 100 KiB against (a*)*\\1 in one round: {} ({} Budget)",
        ms(t.elapsed()),
        out.iter().filter(|&&o| o == MatchOutcome::Budget).count()
    );
    let t = Instant::now();
    let e = m.set_patterns(&["((a{1,255}){1,255}){1,255}".to_string()]).unwrap_err();
    println!("((a{{1,255}}){{1,255}}){{1,255}}: refused in {}: {e}", ms(t.elapsed()));
    let t = Instant::now();
    let e = m.set_patterns(&["a{1,2000}".to_string()]).unwrap_err();
    println!("a{{1,2000}}: refused in {}: {e}", ms(t.elapsed()));
}

guard_test::main!();
