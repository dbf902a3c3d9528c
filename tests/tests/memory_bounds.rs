//! The account cannot starve the daemon of memory (docs/architecture.md, "Bounds"): run inside a
//! real memory cgroup limited like the shipped unit (`MemoryMax=64M`), with a planted state file
//! of hundreds of thousands of entries (every time in the future) and a config rewritten before
//! every tick with tens of thousands of new unknown keys, the real daemon is never OOM-killed,
//! moves the state file aside with `ERROR state_rejected`, stops reporting unknown keys one by
//! one, and still ends a pile of probe processes.
//!
//! The cgroup is cgroup v2's (`/sys/fs/cgroup`, the VM guests) or v1's memory hierarchy
//! (`/sys/fs/cgroup/memory`, this project's CI host); without either the test is ignored with
//! the reason (`needs = [memory_cgroup]`).
use std::{
    fs,
    os::unix::fs::MetadataExt,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use integration_tests::{
    bounds::{config_with_unknown_keys, hostile_state, UnitCgroup, MEMORY_MAX as LIMIT},
    *,
};

/// The config the pile is ended under. No excludeCommands: the matcher is a process of its own
/// with its own limits, and under a TCG guest its first round does not fit a 1 s tick's budget
/// (every process `match_budget`), which is not what this test is about.
const VALID: &str = r#"{"threshold": 5, "timeout": "2s", "excludes": [], "excludeCommands": [], "warnBefore": 0}"#;

#[guard_test(needs = [root, memory_cgroup])]
fn a_daemon_fed_a_huge_state_and_ever_new_unknown_keys_stays_within_64m_and_keeps_guarding() {
    let _g = setup();
    let cg = UnitCgroup::new(LIMIT, None).unwrap_or_else(|why| panic!("a memory cgroup: {why}"));
    let home = Home::new();
    let state_path = home.path().join("guard-daemon-state.json");
    let state = hostile_state();
    assert!(state.len() as u64 <= guard::state::MAX_STATE_BYTES, "{}", state.len());
    fs::write(&state_path, &state).unwrap();
    std::os::unix::fs::chown(&state_path, Some(TEST_UID), Some(TEST_UID)).unwrap();
    home.write_config(&config_with_unknown_keys(VALID, 0, 40_000));
    assert!(fs::metadata(home.path().join("guard-config.json")).unwrap().len() < 1 << 20);

    // Before every tick (1 s), a config with 40,000 keys the daemon has not seen, swapped in
    // whole (a rename), so each tick reads a valid config.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, dir) = (stop.clone(), home.path().to_path_buf());
        std::thread::spawn(move || {
            let mut generation = 1;
            while !stop.load(Ordering::Relaxed) {
                let tmp = dir.join("guard-config.json.new");
                fs::write(&tmp, config_with_unknown_keys(VALID, generation, 40_000)).unwrap();
                fs::rename(&tmp, dir.join("guard-config.json")).unwrap();
                generation += 1;
                std::thread::sleep(Duration::from_millis(700));
            }
            generation
        })
    };

    let exe = home.probe_named("mempile");
    let mut pile: Vec<Probe> = (0..6).map(|_| Probe::spawn(&exe, &[], TEST_UID)).collect();
    let mut d = cg.start_daemon(&home, "1s", &[]);
    let log = home
        .wait_log(Duration::from_secs(180), |l| lines(l, "KILLED").len() >= 6 && lines(l, "TICK_COMPLETE").len() >= 10);
    stop.store(true, Ordering::Relaxed);
    let generations = writer.join().unwrap();
    let alive = matches!(d.child.try_wait(), Ok(None));
    let oom_kills = cg.oom_kills();
    match cg.peak() {
        Some(peak) => eprintln!("memory bounds: cgroup peak {:.1} MiB of {} MiB", peak as f64 / 1048576.0, LIMIT >> 20),
        None => eprintln!("memory bounds: this kernel does not report the cgroup's peak"),
    }
    assert!(alive && oom_kills == 0, "the daemon died (OOM kills in its cgroup: {oom_kills}):\n{log}");
    let errors = lines(&log, "ERROR");
    let want = format!("ERROR state_rejected path={} reason=too_many_flagged limit=4096", state_path.display());
    assert!(errors.len() == 1 && errors[0].ends_with(&want), "{log}");
    let rejected = home.path().join("guard-daemon-state.json.rejected");
    assert_eq!(fs::read(&rejected).unwrap(), state, "the rejected file is kept as it was");
    assert_eq!(fs::metadata(&rejected).unwrap().uid(), TEST_UID);
    let fresh = fs::metadata(&state_path).map(|m| m.len()).unwrap_or(0);
    assert!(fresh < 4096, "the daemon started clean and wrote a small state ({fresh} bytes)");
    let warned = log.lines().filter(|l| l.contains(" WARN config_unknown_key ")).count();
    assert_eq!(warned, guard::config::MAX_UNKNOWN_KEYS, "{generations} configs written");
    assert_eq!(log.matches(" WARN config_unknown_keys_unreported limit=256 path=").count(), 1, "{log}");
    assert_eq!(lines(&log, "KILLED").len(), 6, "{log}");
    assert!(pile.iter_mut().all(|p| p.wait_dead(Duration::from_secs(5))), "the pile was ended");
    let st = d.stop();
    assert_eq!(st.code(), Some(0), "{st:?}");
    assert_eq!(cg.oom_kills(), 0);
}

/// Root's `explain` (and `match`) over 300 processes sharing one 1 MiB command line (one exec, 299 forks):
/// each text is read and matched once and shown cut to its first 4 KiB with the bytes left out,
/// so root's peak memory stays a few MiB and the output small, in text and in JSON (it peaked at
/// 616 MB and 2.44 GB, with 312 MB and 624 MB of output, when every row held its whole text).
#[guard_test(needs = [root])]
fn explain_over_processes_sharing_a_huge_command_line_stays_small() {
    let _g = setup();
    let home = Home::new();
    home.write_config(r#"{"threshold": 1000}"#);
    let exe = home.probe_named("gbigargv");
    let mut argv = vec!["forks".to_string(), "299".to_string()];
    for i in 0..8u8 {
        argv.push("pad".into());
        argv.push(char::from(b'b' + i).to_string().repeat(130_000));
    }
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let _probe = Probe::spawn(&exe, &argv, TEST_UID);
    for (json, what) in [(false, "explain"), (true, "explain"), (false, "match")] {
        let mut cmd = std::process::Command::new(guard_bin());
        match what {
            "explain" => cmd.args(["explain", "gbigargv", "--user", "guardtest1", "--home"]).arg(home.path()),
            _ => cmd.args(["match", "--pattern", "^nothing$", "--user", "guardtest1"]),
        };
        if json {
            cmd.arg("--json");
        }
        // Reaped below by wait4, for its resource usage (which Child::wait does not give).
        #[allow(clippy::zombie_processes)]
        let mut child = cmd.stdout(std::process::Stdio::piped()).spawn().unwrap();
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut child.stdout.take().unwrap(), &mut out).unwrap();
        // The child's own peak resident memory, from the kernel's accounting at its reaping.
        let mut status = 0;
        // SAFETY: a zeroed rusage is valid; wait4 fills it for our own child.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let pid = child.id() as i32;
        assert_eq!(unsafe { libc::wait4(pid, &mut status, 0, &mut usage) }, pid);
        let text = String::from_utf8_lossy(&out);
        assert!(libc::WIFEXITED(status), "{what} (json {json}) did not exit: {status}");
        let peak_mib = usage.ru_maxrss as f64 / 1024.0;
        let rows = if json {
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            let rows = v["processes"].as_array().unwrap().clone();
            assert!(
                rows.iter().all(|r| r["cmdline_omitted_bytes"].as_u64().unwrap_or(0) > 1_000_000),
                "{}",
                &text[..2000]
            );
            rows.len()
        } else {
            assert!(text.contains("…[+"), "no row says what it left out: {}", &text[..2000]);
            text.lines().filter(|l| l.contains("gbigargv")).count()
        };
        assert!(rows >= 300, "{what} (json {json}): {rows} rows");
        assert!(peak_mib < 64.0, "{what} (json {json}) peaked at {peak_mib:.1} MiB");
        assert!(out.len() < 8 << 20, "{what} (json {json}) wrote {} bytes", out.len());
        eprintln!("{what} (json {json}): {rows} rows, peak {peak_mib:.1} MiB, {} bytes of output", out.len());
    }
}

guard_test::main!();
