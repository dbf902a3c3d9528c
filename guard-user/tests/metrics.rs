//! The metrics file (docs/metrics.md): the exact text for a known tick, hostile process names, and the
//! whole output read back by a real Prometheus parser (Debian's python3-prometheus-client).
use guard_test::guard_test;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::process::{Command, Stdio};

use guard::comm::Comm;
use guard::domain::{NameStatus, PeggedProcess};
use guard::metrics::{render, MetricsInput, TOP_NAMES};
use guard::status::{escape_for_terminal, Status, Vitals};

/// One tick's status and what the metrics add to it, as the daemon hands them to `render`.
#[derive(Clone)]
struct Tick {
    status: Status,
    more: MetricsInput,
}

fn render_tick(t: &Tick) -> String {
    render(&t.status, &t.more)
}

/// A flagged name's status row: flagged `age_secs` before `last_tick`, due in `left`.
fn flagged(name: &[u8], last_tick: f64, age_secs: f64, left: f64) -> NameStatus {
    NameStatus {
        name: Comm::new(name).to_string(),
        count: 31,
        threshold: 30,
        flagged_since: Some(last_tick - age_secs),
        time_left_secs: Some(left),
        would_skip: Some(0),
        would_end: Some(31),
        ..Default::default()
    }
}

fn tick() -> Tick {
    let last_tick = 1_700_003_600.5;
    Tick {
        status: Status {
            user: "alice".into(),
            version: "0.1.0".into(),
            backend: "ebpf".into(),
            dry_run: false,
            started_at: 1_700_000_000.0,
            last_tick,
            vitals: Some(Vitals { tick_duration_last_secs: Some(0.004), ..Default::default() }),
            interval_secs: 60.0,
            tracked_processes: 45,
            machine_processes: Some(412),
            // Warned (WARNING) and not yet enforced.
            names: vec![NameStatus { warned: true, ..flagged(b"sleep", last_tick, 120.0, 3480.0) }],
            config_error: None,
            ticks: 61,
            kills: 5,
            kills_by_reason: guard::status::KillsByReason { ghost_detected: 3, leftover: 2 },
            lost_events: 0,
            resyncs: 1,
            events: 98_765,
            repeat_offenders: Vec::new(),
            pegged: vec![PeggedProcess::default(), PeggedProcess::default()],
            sessions: None,
            ..Default::default()
        },
        more: MetricsInput {
            names: vec![(Comm::new(b"bash"), 4), (Comm::new(b"sleep"), 31), (Comm::new(b"agentihooks"), 10)],
            threshold: Some(30),
            timeout_secs: Some(3600.0),
            dry_runs: 0,
            skipped: 2,
            config_errors: 1,
            mirror_dropped: 0,
        },
    }
}

const GOLDEN: &str = r#"# HELP guard_build_info Always 1; the version of the running guard-user.
# TYPE guard_build_info gauge
guard_build_info{user="alice",version="0.1.0"} 1
# HELP guard_backend_info Always 1; the event source in use (ebpf or procfs).
# TYPE guard_backend_info gauge
guard_backend_info{user="alice",backend="ebpf"} 1
# HELP guard_dry_run 1 when the guard only logs DRY_RUN instead of ending processes.
# TYPE guard_dry_run gauge
guard_dry_run{user="alice"} 0
# HELP guard_start_time_seconds When the daemon started, unix seconds.
# TYPE guard_start_time_seconds gauge
guard_start_time_seconds{user="alice"} 1700000000
# HELP guard_last_tick_timestamp_seconds When the last tick completed, unix seconds.
# TYPE guard_last_tick_timestamp_seconds gauge
guard_last_tick_timestamp_seconds{user="alice"} 1700003600.5
# HELP guard_tick_duration_seconds How long the last tick took.
# TYPE guard_tick_duration_seconds gauge
guard_tick_duration_seconds{user="alice"} 0.004
# HELP guard_tick_interval_seconds Time between ticks.
# TYPE guard_tick_interval_seconds gauge
guard_tick_interval_seconds{user="alice"} 60
# HELP guard_ticks_total Ticks completed since the daemon started.
# TYPE guard_ticks_total counter
guard_ticks_total{user="alice"} 61
# HELP guard_config_error 1 when the last tick's config was invalid, so that tick ended nothing.
# TYPE guard_config_error gauge
guard_config_error{user="alice"} 0
# HELP guard_config_errors_total Ticks whose config was invalid.
# TYPE guard_config_errors_total counter
guard_config_errors_total{user="alice"} 1
# HELP guard_threshold Live processes of one name that flag the name (config threshold).
# TYPE guard_threshold gauge
guard_threshold{user="alice"} 30
# HELP guard_timeout_seconds How long a flagged name may stay before it is ended (config timeout).
# TYPE guard_timeout_seconds gauge
guard_timeout_seconds{user="alice"} 3600
# HELP guard_tracked_processes Live processes of the guarded account.
# TYPE guard_tracked_processes gauge
guard_tracked_processes{user="alice"} 45
# HELP guard_machine_processes Processes on the machine as ps -e counts them: every user's, kernel threads and zombies included; every guard of a host writes the same value, so aggregate with max by (instance), never sum.
# TYPE guard_machine_processes gauge
guard_machine_processes{user="alice"} 412
# HELP guard_names Distinct names among the guarded account's live processes.
# TYPE guard_names gauge
guard_names{user="alice"} 3
# HELP guard_name_processes Live processes of the guarded account per name (the 100 names with the most).
# TYPE guard_name_processes gauge
guard_name_processes{user="alice",name="sleep"} 31
guard_name_processes{user="alice",name="agentihooks"} 10
guard_name_processes{user="alice",name="bash"} 4
# HELP guard_flagged_names Names at or over the threshold.
# TYPE guard_flagged_names gauge
guard_flagged_names{user="alice"} 1
# HELP guard_warned_names Flagged names warned about (WARNING) whose enforcement is still ahead.
# TYPE guard_warned_names gauge
guard_warned_names{user="alice"} 1
# HELP guard_repeat_offenders Names enforced repeatAfter times within 24 h (REPEAT): a respawn loop killing will not fix.
# TYPE guard_repeat_offenders gauge
guard_repeat_offenders{user="alice"} 0
# HELP guard_pegged_processes Processes of the account pegged at peggedCpu for peggedFor (PEGGED; report only).
# TYPE guard_pegged_processes gauge
guard_pegged_processes{user="alice"} 2
# HELP guard_flagged_since_timestamp_seconds When the name was flagged, unix seconds.
# TYPE guard_flagged_since_timestamp_seconds gauge
guard_flagged_since_timestamp_seconds{user="alice",name="sleep"} 1700003480.5
# HELP guard_flagged_due_timestamp_seconds When the flagged name's processes are due to be ended, unix seconds.
# TYPE guard_flagged_due_timestamp_seconds gauge
guard_flagged_due_timestamp_seconds{user="alice",name="sleep"} 1700007080.5
# HELP guard_kills_total Processes ended, by reason: ghost_detected (KILLED lines), leftover (leftovers of ended sessions).
# TYPE guard_kills_total counter
guard_kills_total{user="alice",reason="ghost_detected"} 3
guard_kills_total{user="alice",reason="leftover"} 2
# HELP guard_dry_runs_total Processes a dry run would have ended (DRY_RUN lines).
# TYPE guard_dry_runs_total counter
guard_dry_runs_total{user="alice"} 0
# HELP guard_skipped_total Processes left alone at enforcement (SKIPPED lines).
# TYPE guard_skipped_total counter
guard_skipped_total{user="alice"} 2
# HELP guard_events_total Process events applied to the live table.
# TYPE guard_events_total counter
guard_events_total{user="alice"} 98765
# HELP guard_lost_events_total Process events the kernel dropped (ring buffer full) or skipped (a program busy on that CPU).
# TYPE guard_lost_events_total counter
guard_lost_events_total{user="alice"} 0
# HELP guard_resyncs_total Rebuilds of the live table from /proc (RESYNC lines).
# TYPE guard_resyncs_total counter
guard_resyncs_total{user="alice"} 1
# HELP guard_cmdlines_unread_total Command lines a tick could not read within its reading time (each protected for that tick, read again).
# TYPE guard_cmdlines_unread_total counter
guard_cmdlines_unread_total{user="alice"} 0
# HELP guard_mirror_dropped_total Events the swarm Redis mirror dropped (queue full while Redis was away, or rejected).
# TYPE guard_mirror_dropped_total counter
guard_mirror_dropped_total{user="alice"} 0
"#;

#[guard_test]
fn a_known_tick_renders_exactly() {
    assert_eq!(render_tick(&tick()), GOLDEN);
}

/// Names an account can give its processes (prctl or /proc/PID/comm: any bytes but NUL, at
/// most 15), chosen to break a label, a line, a sample or the UTF-8 the format requires.
fn hostile_names() -> Vec<Vec<u8>> {
    let mut names: Vec<Vec<u8>> = [
        &b"\""[..],
        b"\\",
        b"\n",
        b"}",
        b"{",
        b"=",
        b",",
        b"a\"b\\c\nd}e{f=g,h",
        b"x\"} 1\nguard_k",
        b"\n# TYPE x gauge",
        b"\xff",
        b"\xfe",
        b"\\xff",
        b"\\\\xff",
        b"a\xc3",
        b"\xe2\x80\xae",
        b"\x1b[31mred",
        b"\r\t\x7f",
        b"exactly15bytes!",
        b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
        b"\"\"\"\"\"\"\"\"\"\"\"\"\"\"\"",
        "\u{fffd}".as_bytes(),
    ]
    .iter()
    .map(|n| n.to_vec())
    .collect();
    // Every single byte but NUL, as a one-byte name.
    names.extend((1..=255u8).map(|b| vec![b]));
    let mut seen = BTreeSet::new();
    names.retain(|n| seen.insert(n.clone()));
    names
}

fn hostile_tick() -> Tick {
    let names = hostile_names();
    let mut t = tick();
    t.status.user = "ali\"ce\\".into();
    t.status.version = "0.1.0\n".into();
    t.status.names = names.iter().take(30).map(|n| flagged(n, t.status.last_tick, 1.5, 0.0)).collect();
    t.more.names = names.iter().enumerate().map(|(i, n)| (Comm::new(n), 1000 - i as u32)).collect();
    t
}

#[guard_test]
fn hostile_names_stay_inside_their_label() {
    let text = render_tick(&hostile_tick());
    for line in text.lines() {
        assert!(
            line.starts_with("# HELP guard_") || line.starts_with("# TYPE guard_") || line.starts_with("guard_"),
            "a line that is neither a comment nor a sample: {line:?}"
        );
        assert!(!line.contains(['\r', '\u{1b}', '\u{7f}', '\u{202e}']), "{line:?}");
    }
    // Distinct names, distinct series: no two samples of one family with the same labels.
    let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    let series: BTreeSet<&str> = samples.iter().map(|l| &l[..l.rfind(' ').unwrap()]).collect();
    assert_eq!(series.len(), samples.len(), "duplicate series in\n{text}");
    let named = text.lines().filter(|l| l.starts_with("guard_name_processes{")).count();
    assert_eq!(named, TOP_NAMES, "the top names only");
}

#[guard_test]
fn the_text_escape_is_one_to_one() {
    let names = hostile_names();
    let escaped: BTreeSet<String> = names.iter().map(|n| escape_for_terminal(n)).collect();
    assert_eq!(escaped.len(), names.iter().collect::<BTreeSet<_>>().len());
    assert_eq!(escape_for_terminal(b"\xff"), "\\xff");
    assert_eq!(escape_for_terminal(b"\\xff"), "\\\\xff");
    assert_eq!(escape_for_terminal("caf\u{e9}".as_bytes()), "caf\u{e9}");
}

#[guard_test]
fn the_largest_names_are_kept_and_duplicates_merge() {
    let mut m = tick();
    m.more.names = (0..150u32).map(|i| (Comm::new(format!("n{i:03}").as_bytes()), i)).collect();
    m.more.names.push((Comm::new(b"n149"), 1));
    let text = render_tick(&m);
    let kept: Vec<&str> = text.lines().filter(|l| l.starts_with("guard_name_processes{")).collect();
    assert_eq!(kept.len(), TOP_NAMES);
    assert_eq!(kept[0], r#"guard_name_processes{user="alice",name="n149"} 150"#);
    assert_eq!(kept[99], r#"guard_name_processes{user="alice",name="n050"} 50"#);
    assert!(text.contains("guard_names{user=\"alice\"} 150\n"), "{text}");
}

#[guard_test]
fn an_invalid_config_leaves_its_values_out_and_says_so() {
    let mut m = tick();
    (m.more.threshold, m.more.timeout_secs) = (None, None);
    m.status.config_error = Some("config_malformed".into());
    let text = render_tick(&m);
    assert!(text.contains("# TYPE guard_threshold gauge\n# HELP guard_timeout_seconds"), "{text}");
    assert!(!text.contains("guard_timeout_seconds{"), "{text}");
    assert!(text.contains("guard_config_error{user=\"alice\"} 1\n"), "{text}");
}

/// Families as Python's parser reads them: name → (type, help, samples (name, labels, value)).
type Parsed = BTreeMap<String, (String, String, Vec<(String, BTreeMap<String, String>, f64)>)>;

fn parse_with_prometheus_client(python: &str, text: &str) -> Parsed {
    const SCRIPT: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
text = sys.stdin.buffer.read().decode("utf-8")  # strict: the format is UTF-8
out = {}
for f in text_string_to_metric_families(text):
    assert f.name not in out, "family twice: " + f.name
    out[f.name] = [f.type, f.documentation, [[s.name, s.labels, s.value] for s in f.samples]]
json.dump(out, sys.stdout)
"#;
    let mut child = Command::new(python)
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python");
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "prometheus_client rejected the file: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the script's JSON")
}

/// What the renderer meant, read from its own text by splitting on known structure; compared with
/// what the real parser understood.
#[guard_test(needs = [prometheus_client])]
fn a_real_prometheus_parser_reads_back_every_family_sample_and_label() {
    // The PATH's python3 first, else Debian's (`python3-prometheus-client` installs for
    // /usr/bin/python3, which a pyenv or venv on PATH does not see).
    let python = guard_test::need::prometheus_python().expect("the need says there is one");
    for m in [tick(), hostile_tick(), slots_tick()] {
        let text = render_tick(&m);
        let parsed = parse_with_prometheus_client(python, &text);
        // Families: every TYPE line's metric, with its HELP, read back under its name (the client
        // names a counter's family without `_total`).
        let mut families = 0;
        for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let mut parts = line[7..].split(' ');
            let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
            let family = if kind == "counter" { name.strip_suffix("_total").unwrap() } else { name };
            let (ptype, help, _) = parsed.get(family).unwrap_or_else(|| panic!("{family} not parsed"));
            assert_eq!(ptype, kind, "{family}");
            assert!(!help.is_empty(), "{family} has no HELP");
            families += 1;
        }
        assert_eq!(parsed.len(), families, "families the parser saw beyond the TYPE lines");
        // Samples: the user label everywhere, and each name label exactly the escaped name.
        let user = escape_for_terminal(m.status.user.as_bytes());
        let samples: Vec<_> = parsed.values().flat_map(|(_, _, s)| s).collect();
        assert_eq!(samples.len(), text.lines().filter(|l| !l.starts_with('#')).count());
        for (name, labels, _) in &samples {
            assert_eq!(labels.get("user"), Some(&user), "{name} {labels:?}");
        }
        let top = &parsed["guard_name_processes"].2;
        let mut expected: Vec<(String, f64)> =
            m.more.names.iter().map(|(n, c)| (escape_for_terminal(n.as_bytes()), f64::from(*c))).collect();
        expected.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        expected.truncate(TOP_NAMES);
        let got: Vec<(String, f64)> = top.iter().map(|(_, l, v)| (l["name"].clone(), *v)).collect();
        assert_eq!(got, expected);
        let flagged: BTreeSet<String> =
            parsed["guard_flagged_since_timestamp_seconds"].2.iter().map(|(_, l, _)| l["name"].clone()).collect();
        let want: BTreeSet<String> =
            m.status.names.iter().filter(|n| n.flagged_since.is_some()).map(|n| n.name.clone()).collect();
        assert_eq!(flagged, want);
        assert_eq!(parsed["guard_build_info"].2[0].1["version"], escape_for_terminal(m.status.version.as_bytes()));
        assert_eq!(parsed["guard_events"].2[0].2, m.status.events as f64);
        assert_eq!(parsed["guard_last_tick_timestamp_seconds"].2[0].2, m.status.last_tick);
        if let Some(x) = &m.status.slots {
            for (family, build, unit) in
                [("guard_slot_holders", 2.0, 0.0), ("guard_slot_waiting", 3.0, 1.0), ("guard_slot_max", 2.0, 0.0)]
            {
                let got: Vec<(String, f64)> =
                    parsed[family].2.iter().map(|(_, l, v)| (l["slot"].clone(), *v)).collect();
                assert_eq!(got, [("build".to_string(), build), ("test.unit".to_string(), unit)], "{family}");
            }
            assert_eq!(parsed["guard_slot_wait_seconds"].2[0].2, x.wait_seconds_total);
            assert_eq!(parsed["guard_slots_available"].2[0].2, 1.0);
        }
    }
}

/// A tick with two slots: `build` (max 2) held by two trees with three waiting, `test.unit`
/// with one waiting (a max of 0 cannot be configured; the renderer writes what it is given).
fn slots_tick() -> Tick {
    use guard::status::{SlotStatus, SlotsStatus};
    let mut t = tick();
    let slot = |name: &str, max: u32, holders: u64, waiting: u64| SlotStatus {
        name: name.into(),
        max,
        mode: "queue".into(),
        holders_count: holders,
        waiting_count: waiting,
        ..Default::default()
    };
    t.status.slots = Some(SlotsStatus {
        slots: vec![slot("build", 2, 2, 3), slot("test.unit", 0, 0, 1)],
        waits_total: 7,
        wait_seconds_total: 93.5,
        ..Default::default()
    });
    t
}

guard_test::main!();
