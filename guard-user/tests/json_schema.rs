//! docs/json.md lists exactly the fields the JSON outputs have, in both directions, and the enum
//! values they take: `status --json` on statuses the whole daemon wrote while replaying recorded
//! traces (piles, warnings, repeats, the stall watch, sessions), `explain --json` run by the
//! binary on live processes and a real config, `tree --json` run by the binary on a replayed
//! session lineage whose processes are made live ones, `holders --json` run by the binary on a
//! live process (listed, read on a starved budget, stopped). Nothing here lists a field by hand: the
//! fields come from the outputs, the expectations from the docs.
mod replay_harness;

use guard_test::guard_test;
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use replay_harness::{replay, Setup};
use serde_json::Value;

/// One documented field: its type column.
type Doc = BTreeMap<String, String>;

/// The fields docs/json.md lists under the `## \`<title>\`` heading.
fn documented(title: &str) -> Doc {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/json.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let heading = format!("## `{title}`");
    let start = text.find(&format!("\n{heading}\n")).unwrap_or_else(|| panic!("docs/json.md has no {heading}"));
    let section = &text[start + heading.len() + 2..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let mut doc = Doc::new();
    for row in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.split(" | ").collect();
        let field = cells[0].trim_start_matches("| ").trim_matches('`').to_string();
        assert!(doc.insert(field.clone(), cells[1].to_string()).is_none(), "{title}: {field} is listed twice");
    }
    assert!(!doc.is_empty(), "docs/json.md lists no field under {heading}");
    doc
}

/// The enum values a type column allows (`one of `a`, `b``), `None` for other types.
fn allowed(ty: &str) -> Option<BTreeSet<String>> {
    let rest = ty.strip_prefix("one of ")?;
    Some(rest.split('`').skip(1).step_by(2).map(str::to_string).collect())
}

/// Every field path in `v` (`a`, `a.b`, `list[].c`) with the values seen there.
fn fields(v: &Value, prefix: &str, out: &mut BTreeMap<String, Vec<Value>>) {
    match v {
        Value::Object(map) => {
            for (k, x) in map {
                let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                out.entry(path.clone()).or_default().push(x.clone());
                fields(x, &path, out);
            }
        }
        Value::Array(items) => {
            for x in items {
                fields(x, &format!("{prefix}[]"), out);
            }
        }
        _ => {}
    }
}

/// The outputs against the docs: the same fields, and enum values from the documented set.
fn check(title: &str, outputs: &[Value]) {
    let doc = documented(title);
    let mut seen = BTreeMap::new();
    for v in outputs {
        fields(v, "", &mut seen);
    }
    let emitted: BTreeSet<&String> = seen.keys().collect();
    let listed: BTreeSet<&String> = doc.keys().collect();
    let undocumented: Vec<_> = emitted.difference(&listed).collect();
    let never: Vec<_> = listed.difference(&emitted).collect();
    assert!(undocumented.is_empty(), "{title}: fields emitted but not in docs/json.md: {undocumented:?}");
    assert!(never.is_empty(), "{title}: fields in docs/json.md that no output had: {never:?}");
    for (field, ty) in &doc {
        let Some(set) = allowed(ty) else { continue };
        for v in &seen[field] {
            match v {
                Value::String(s) => assert!(set.contains(s), "{title}: {field} = {s:?} is not one of {set:?}"),
                Value::Null => assert!(ty.contains("or null"), "{title}: {field} is null, documented as {ty}"),
                other => panic!("{title}: {field} = {other} is not a string"),
            }
        }
    }
}

/// Every status the daemon wrote in these replays, as `status --json` prints it.
fn status_outputs() -> (Vec<Value>, Vec<guard::status::Status>) {
    let mut cpu = Vec::new();
    for m in 0..12u64 {
        cpu.push((Duration::from_secs(m * 60 + 1), 900, "spin", m * 60_000_000_000));
    }
    let setups = [
        // Flagged, warned, then enforced.
        Setup {
            fixture: "two-names.trace",
            config: r#"{"threshold": 3, "timeout": "30m", "warnBefore": "10m", "excludes": ["beta"]}"#,
            run_for: Duration::from_secs(1900),
            ..Default::default()
        },
        // A respawn loop: REPEAT; and the stall watch.
        Setup {
            fixture: "two-names.trace",
            config: r#"{"threshold": 3, "timeout": "0s", "repeatAfter": 3, "excludes": ["beta"],
                        "stallWatch": {"peggedCpu": 0.75, "peggedFor": "5m"}}"#,
            run_for: Duration::from_secs(12 * 60 + 30),
            cpu,
            ..Default::default()
        },
        // Sessions: a live root, then its leftovers in their grace and stopped.
        Setup {
            fixture: "handmade-session.trace",
            config: r#"{"excludeCommands": ["--keep"],
                        "sessions": {"roots": ["(^|/)agent-wrapper( |$)"], "leftovers": "stop", "grace": "10s"}}"#,
            run_for: Duration::from_secs(150),
            ..Default::default()
        },
    ];
    let mut outputs = Vec::new();
    let mut statuses = Vec::new();
    for setup in setups {
        let r = replay(setup);
        for s in r.rec.status.0.lock().unwrap().iter() {
            let json = guard::cmd::status::render_json(s, SystemTime::now());
            outputs.push(serde_json::from_str(&json).unwrap());
            statuses.push(s.clone());
        }
    }
    // Slots live in the daemon's pump (a replay configures none): one status with a holder and
    // a waiting tree, one from a host where they only report.
    for unavailable in [None, Some("no_cgroup2".to_string())] {
        let s = guard::status::Status { slots: Some(slots_status(1, 2, unavailable)), ..statuses[0].clone() };
        let json = guard::cmd::status::render_json(&s, SystemTime::now());
        outputs.push(serde_json::from_str(&json).unwrap());
        statuses.push(s);
    }
    (outputs, statuses)
}

/// A slot `build` held by the tree of `holder` and waited for by `waiter`'s (pid = start time).
fn slots_status(holder: u32, waiter: u32, unavailable: Option<String>) -> guard::status::SlotsStatus {
    use guard::status::{SlotStatus, SlotTree, SlotsStatus};
    let tree = |pid: u32, start: u64| SlotTree {
        pid,
        start_ticks: start,
        name: "cargo".into(),
        since_unix: 1_700_000_000.0,
        processes: 3,
    };
    SlotsStatus {
        unavailable,
        slots: vec![SlotStatus {
            name: "build".into(),
            max: 1,
            max_wait_secs: 1800.0,
            mode: "queue".into(),
            holders: vec![tree(holder, start_ticks_or(holder))],
            holders_count: 1,
            waiting: vec![tree(waiter, start_ticks_or(waiter))],
            waiting_count: 1,
        }],
        pending_execs: 0,
        tracked: 6,
        waits_total: 1,
        timeouts_total: 0,
        wait_seconds_total: 12.5,
        not_held_total: 0,
        unclassified_total: 0,
        untracked_total: 0,
        over_cap_total: 0,
    }
}

/// A live process's start time, or the pid itself for one that is not (a made-up tree).
fn start_ticks_or(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s[s.rfind(')')? + 2..].split(' ').nth(19)?.parse().ok())
        .unwrap_or(u64::from(pid))
}

#[guard_test]
fn status_json_has_exactly_the_documented_fields() {
    let (outputs, _) = status_outputs();
    check("status --json", &outputs);
}

/// Kills the probes a test spawned, whatever happens.
struct Probes(Vec<Child>);

impl Drop for Probes {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `sleep` copied as `name` into `dir` (the process name is the file's), spawned with `args`.
fn probe(dir: &Path, name: &str, args: &[&str]) -> Child {
    let exe = dir.join(name);
    if !exe.exists() {
        // A link, not a copy: a copy still open for writing in this process when another test's
        // child forks cannot be exec'd (ETXTBSY). The kernel names the process after the link.
        std::os::unix::fs::symlink("/bin/sleep", &exe).unwrap();
    }
    let child = Command::new(&exe).args(args).spawn().unwrap();
    // Exec'd once /proc shows its own name and arguments (not the test's, as right after fork).
    let (pid, want) = (child.id(), format!("{}\0{}\0", exe.display(), args.join("\0")));
    guard_test::wait::until(Duration::from_secs(10), &format!("{name} ({pid}) to exec"), || {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        (comm.trim_end() == name && cmdline == want.as_bytes()).then_some(())
    });
    child
}

/// A process's start time in clock ticks since boot (field 22 of /proc/PID/stat).
fn start_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    after.split(' ').nth(19).unwrap().parse().unwrap()
}

fn user() -> String {
    guard::account::Account::resolve(None).map(|a| a.account.name).unwrap_or_else(|_| "root".into())
}

/// A home the account (the test's own user) can read, with `config` as its config.
fn home(config: &str) -> tempfile::TempDir {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("guard-config.json"), config).unwrap();
    home
}

fn run(args: &[&str], home: &Path) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_guard-user"))
        .args(args)
        .args(["--user", &user(), "--home"])
        .arg(home)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{args:?}: {e}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr)))
}

#[guard_test]
fn explain_json_has_exactly_the_documented_fields() {
    let bin = tempfile::tempdir().unwrap();
    // Three of a name no other process has; one is protected by a pattern.
    let _probes = Probes(vec![
        probe(bin.path(), "gjsonprobe", &["1000", "1"]),
        probe(bin.path(), "gjsonprobe", &["1000", "2"]),
        probe(bin.path(), "gjsonprobe", &["1000", "3"]),
    ]);
    let mut outputs = Vec::new();
    // Flagged a minute ago (the state file as the daemon writes it), not flagged yet, excluded.
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
    let flagged = home(r#"{"threshold": 2, "timeout": "1h", "excludeCommands": ["gjsonprobe 1000 3$"]}"#);
    let mut state = guard::domain::State::default();
    state.clocks.insert(guard::comm::Comm::new(b"gjsonprobe"), now - 60.0);
    let file = guard::state::render_state(&user(), &state);
    std::fs::write(flagged.path().join("guard-daemon-state.json"), file).unwrap();
    outputs.push(run(&["explain", "gjsonprobe", "--json"], flagged.path()));
    let next = home(r#"{"threshold": 2, "timeout": "1h"}"#);
    // The running guard's last status says the first probe holds a slot, the second waits.
    let (first, second) = (_probes.0[0].id(), _probes.0[1].id());
    // Run as root, explain reads the daemon's own copy only, as tree does.
    let uid = guard::account::Account::resolve(None).map_or(0, |a| a.account.uid);
    let status = guard::status::Status {
        uid,
        pid: std::process::id(),
        slots: Some(slots_status(first, second, None)),
        ..Default::default()
    };
    let _copy = TrustedCopy::write(uid, next.path(), &status);
    outputs.push(run(&["explain", "gjsonprobe", "--json"], next.path()));
    let places: Vec<&Value> = outputs[1]["processes"].as_array().unwrap().iter().map(|p| &p["slot"]["state"]).collect();
    assert!(places.contains(&&Value::from("holding")) && places.contains(&&Value::from("waiting")), "{:#}", outputs[1]);
    let excluded = home(r#"{"threshold": 2, "excludes": ["gjsonprobe"]}"#);
    outputs.push(run(&["explain", "gjsonprobe", "--json"], excluded.path()));
    let stages: Vec<&Value> = outputs.iter().map(|o| &o["enforcement"]).collect();
    assert_eq!(stages, ["scheduled", "flagged_next_tick", "excluded"], "{outputs:#?}");
    // Flagged a minute ago with a 1 h timeout: due in under 59 minutes, at the flag time + 1 h.
    let (left, at) = (outputs[0]["due_in_secs"].as_f64().unwrap(), outputs[0]["due_at_unix"].as_f64().unwrap());
    assert!(left > 0.0 && left <= 3540.0, "{:#}", outputs[0]);
    assert!((at - (now + 3540.0)).abs() < 1.0, "{:#}", outputs[0]);
    assert_eq!(outputs[1]["due_in_secs"], 3600.0, "the timeout the next tick's flag starts: {:#}", outputs[1]);
    assert_eq!(outputs[2]["due_in_secs"], Value::Null, "{:#}", outputs[2]);
    let verdicts: Vec<(&Value, &Value)> =
        outputs[0]["processes"].as_array().unwrap().iter().map(|p| (&p["verdict"], &p["skip_reason"])).collect();
    assert!(verdicts.contains(&(&"skip".into(), &"excluded_command".into())), "{:#}", outputs[0]);
    assert!(verdicts.contains(&(&"end".into(), &Value::Null)), "{:#}", outputs[0]);
    check("explain NAME --json", &outputs);
    // With no excludeCommands no command line is matched, and each is still shown.
    let bare = home(r#"{"threshold": 2, "timeout": "1h", "excludeCommands": []}"#);
    let o = run(&["explain", "gjsonprobe", "--json"], bare.path());
    let shown: Vec<&Value> = o["processes"].as_array().unwrap().iter().map(|p| &p["cmdline"]).collect();
    assert!(!shown.is_empty() && shown.iter().all(|c| c.as_str().is_some_and(|c| c.contains("gjsonprobe"))), "{o:#}");
}

/// The status where `tree` reads it: the daemon's own copy (beside its instance lock in
/// /run/guard-user/, both removed on drop) when this test runs as root, else the file in the home.
struct TrustedCopy(Option<guard::status::TrustedCopy>);

impl TrustedCopy {
    fn write(uid: u32, home: &Path, s: &guard::status::Status) -> TrustedCopy {
        let bytes = serde_json::to_vec(s).unwrap();
        let Some(copy) = guard::daemon::instance::trusted_status(uid, home) else {
            std::fs::write(home.join("guard-status.json"), bytes).unwrap();
            return TrustedCopy(None);
        };
        std::fs::create_dir_all(copy.lock.parent().unwrap()).unwrap();
        std::fs::write(&copy.lock, format!("{}\n{}\n", s.pid, home.display())).unwrap();
        std::fs::write(&copy.status, bytes).unwrap();
        // What the account writes in its home is never read by root's tree.
        std::fs::write(home.join("guard-status.json"), b"{}").unwrap();
        TrustedCopy(Some(copy))
    }
}

impl Drop for TrustedCopy {
    fn drop(&mut self) {
        if let Some(c) = &self.0 {
            let _ = std::fs::remove_file(&c.status);
            let _ = std::fs::remove_file(&c.lock);
        }
    }
}

#[guard_test]
fn tree_json_has_exactly_the_documented_fields() {
    let (_, statuses) = status_outputs();
    let bin = tempfile::tempdir().unwrap();
    let probes = Probes(vec![probe(bin.path(), "gjsonroot", &["1000"]), probe(bin.path(), "gjsonkid", &["1000"])]);
    let (root, kid) = (probes.0[0].id(), probes.0[1].id());
    let uid = unsafe { libc::geteuid() };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
    let mut outputs = Vec::new();
    // Each stage the replay wrote, with the lineage's pids made the live probes'.
    let mut stages = BTreeSet::new();
    for mut s in statuses.into_iter().filter(|s| s.sessions.as_ref().is_some_and(|x| !x.sessions.is_empty())) {
        let row = &mut s.sessions.as_mut().unwrap().sessions[0];
        if !stages.insert(row.stage.clone()) {
            continue;
        }
        (row.root_pid, row.root_start) = (root, start_ticks(root));
        for p in &mut row.processes {
            (p.pid, p.start) = (kid, start_ticks(kid));
        }
        (s.uid, s.last_tick, s.pid) = (uid, now, std::process::id());
        let home = home("{}");
        // Run as root, tree reads the daemon's own copy only: written where a root daemon writes
        // it for this home (and removed after); otherwise the file in the home.
        let _copy = TrustedCopy::write(uid, home.path(), &s);
        outputs.push(run(&["tree", "--json"], home.path()));
    }
    assert!(stages.contains("live") && stages.contains("grace"), "{stages:?}");
    // Heavy-command slots: beside the sessions, and alone.
    for sessions in [true, false] {
        let mut s = guard::status::Status { uid, last_tick: now, pid: std::process::id(), ..Default::default() };
        if sessions {
            s.sessions = Some(guard::domain::SessionsStatus { leftovers: "report".into(), ..Default::default() });
        }
        s.slots = Some(slots_status(root, kid, None));
        let home = home("{}");
        // As above: root's own copy when run as root, else the file in the home.
        let _copy = TrustedCopy::write(uid, home.path(), &s);
        let out = run(&["tree", "--json"], home.path());
        assert_eq!(out["slots"]["slots"][0]["waiting"][0]["pid"], kid, "{out:#}");
        outputs.push(out);
    }
    let listed = outputs.iter().flat_map(|o| o["sessions"][0]["processes"].as_array().unwrap().clone());
    assert!(listed.clone().any(|p| p["pid"] == kid), "the live kid is listed: {outputs:#?}");
    check("tree --json", &outputs);
}

#[guard_test]
fn holders_json_has_exactly_the_documented_fields() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let exe = dir.path().join("gjsonhold");
    // A link, not a copy: a copy still open for writing in this process when another test's
    // child forks cannot be exec'd (ETXTBSY). The kernel names the process after the link.
    std::os::unix::fs::symlink("/bin/sleep", &exe).unwrap();
    let probes = Probes(vec![Command::new(&exe).arg("1000").current_dir(&work).spawn().unwrap()]);
    let pid = probes.0[0].id();
    let run = |args: &[&str], env: &[(&str, &str)]| -> Value {
        let out = Command::new(env!("CARGO_BIN_EXE_guard-user"))
            .arg("holders")
            .arg(&work)
            .args(args)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr)))
    };
    let listed = |v: &Value| v["holders"].as_array().unwrap().iter().any(|r| r["pid"] == pid);
    let mut outputs = Vec::new();
    // Until the probe has started in the directory (seconds, on a loaded machine).
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < until {
        let v = run(&["--json"], &[]);
        if listed(&v) {
            outputs.push(v);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!outputs.is_empty(), "the probe never showed as a holder");
    // A read budget of nothing (a debug build's fault hook): every other process of the account
    // is unread, the probe is found by its working directory and read in part.
    let starved = run(&["--json", "--user", &user()], &[("GUARD_FAULT", "holders_budget:0")]);
    assert!(!starved["unread"].as_array().unwrap().is_empty(), "{starved:#}");
    outputs.push(starved);
    let stopped = run(&["--json", "--user", &user(), "--stop"], &[]);
    assert!(stopped["holders"].as_array().unwrap().iter().any(|r| r["pid"] == pid && r["outcome"] == "stopped"));
    outputs.push(stopped);
    check("holders --json", &outputs);
}

guard_test::main!();
