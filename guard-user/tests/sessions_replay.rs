//! Sessions and leftovers replayed through the whole daemon (pump, lineage, tick, decide,
//! effects) on a paused tokio clock, from hand-made and recorded traces: the exact lines, the
//! signals, the stream events and the status. Beside replay.rs (which is near its size bound),
//! with the same harness in small.
use guard_test::guard_test;
use std::{path::PathBuf, time::Duration};

use guard::{
    account::Account,
    daemon::{
        recording::{Recorder, RecordingNotifier},
        run_with, Backend, Control, DaemonOptions,
    },
    trace::{Trace, TraceSource},
};

struct Replayed {
    log: Vec<String>,
    rec: Recorder,
}

impl Replayed {
    /// Lines of these events, in order.
    fn lines(&self, events: &[&str]) -> Vec<&str> {
        self.log.iter().map(String::as_str).filter(|l| events.contains(&l.split(' ').next().unwrap_or(""))).collect()
    }

    fn terms(&self) -> Vec<Vec<u32>> {
        self.rec.signals.terms.lock().unwrap().clone()
    }

    fn kills(&self) -> Vec<Vec<u32>> {
        self.rec.signals.kills.lock().unwrap().clone()
    }
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// Replays `fixture` under `config` for `secs` of virtual time (60 s ticks unless `interval`).
fn replay(fixture_name: &str, config: &str, secs: u64, dry_run: bool, interval: Duration) -> Replayed {
    let trace = Trace::open(&fixture(fixture_name)).unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("guard-config.json"), config).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let opts = DaemonOptions {
        config_path: home.path().join("guard-config.json"),
        home: home.path().into(),
        account: Account { name: "replay".into(), uid: trace.uid, gid: trace.uid, home: home.path().into() },
        dry_run,
        interval,
        backend: Backend::Auto,
        audit_interval: Duration::from_secs(600),
        ring_bytes: None,
        deadline_timer: true,
        metrics_file: None,
    };
    let rec = Recorder::default();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
    rt.block_on(async {
        let source = TraceSource::new(trace, rec.procs.0.clone());
        let (tx, mut rx) = tokio::sync::mpsc::channel(2);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(secs)).await;
            let _ = tx.send(Control::Stop).await;
        });
        run_with(opts, source, rec.effects(1_800_000_000.0), &mut RecordingNotifier::default(), &mut rx).await
    });
    Replayed { log: rec.log.bodies(), rec }
}

const STOP: &str = r#"{"excludeCommands": ["--keep"],
    "sessions": {"roots": ["(^|/)agent-wrapper( |$)"], "leftovers": "stop", "grace": "10s"}}"#;

#[guard_test]
fn a_roots_leftovers_are_stopped_after_the_grace_and_reaped_in_one_line() {
    let r = replay("handmade-session.trace", STOP, 150, false, Duration::from_secs(60));
    assert_eq!(
        r.lines(&["LEFTOVER", "SKIPPED", "DRY_RUN", "REAPED", "KILLED"]),
        [
            // The root ended at 70 (its exit woke a tick), the grace ended at 80: every live process
            // forked from it, whatever it did since (setsid + exec, a double fork, a rename).
            "LEFTOVER pid=201 name=watcher root=200 age=74s",
            "LEFTOVER pid=203 name=daemon root=200 age=72s",
            "LEFTOVER pid=204 name=renamed root=200 age=72s",
            "LEFTOVER pid=205 name=claude root=200 age=71s",
            "LEFTOVER pid=206 name=helper root=200 age=70s",
            "SKIPPED pid=205 name=claude reason=excluded_name",
            "SKIPPED pid=206 name=helper reason=excluded_command",
            // 201 and 203 left after the SIGTERM, 204 after the SIGKILL 10 s later.
            "REAPED root=200 name=agent-wrapper count=3 survivors=2",
        ],
        "{:#?}",
        r.log
    );
    // Never: the watcher outside the session (300), the other account's child (207), nor the new
    // holders of the root's pid (200) and of a leftover's pid reused during the grace (208).
    assert_eq!(r.terms(), [vec![201, 203, 204]]);
    assert_eq!(r.kills(), [vec![204]]);
    assert!(r.rec.signals.calls.lock().unwrap().is_empty(), "the count rule ended nothing");
    let kinds: Vec<String> = r.rec.mirror.events.lock().unwrap().iter().map(|e| e.event.clone()).collect();
    assert_eq!(kinds, ["leftover", "leftover", "leftover", "leftover", "leftover", "SKIPPED", "SKIPPED", "reaped"]);
    let reaped = r.rec.mirror.events.lock().unwrap().last().cloned().unwrap();
    assert_eq!((reaped.name.as_deref(), reaped.count), (Some("agent-wrapper"), Some(3)));
    let status = r.rec.status.0.lock().unwrap().last().cloned().unwrap();
    let s = status.sessions.expect("sessions in the status");
    assert_eq!((s.leftovers_total, s.reaped_total, s.stopped_total, s.live, s.ended), (5, 1, 3, 0, 0));
    let hb = r.rec.mirror.heartbeats.lock().unwrap().last().cloned().unwrap();
    assert_eq!(hb.sessions.map(|s| (s.leftovers, s.reaped)), Some((5, 1)));
    let metrics = r.rec.metrics.0.lock().unwrap().last().cloned().unwrap();
    assert!(metrics.contains("guard_reaped_total{user=\"replay\"} 1\n"), "{metrics}");
}

#[guard_test]
fn the_live_session_shows_in_the_status_with_its_root_command_and_processes() {
    let r = replay("handmade-session.trace", STOP, 65, false, Duration::from_secs(60));
    let status = r.rec.status.0.lock().unwrap().last().cloned().unwrap();
    let s = status.sessions.expect("sessions in the status");
    assert_eq!(s.live, 1);
    let row = &s.sessions[0];
    assert_eq!((row.root_pid, row.root_name.as_str(), row.stage.as_str()), (200, "agent-wrapper", "live"));
    assert_eq!(row.command, "/usr/bin/agent-wrapper --session a");
    let pids: Vec<u32> = row.processes.iter().map(|p| p.pid).collect();
    assert_eq!(pids, [201, 203, 204, 205, 206, 208]);
}

#[guard_test]
fn report_logs_the_leftovers_and_ends_nothing() {
    let config = STOP.replace(r#""stop""#, r#""report""#);
    let r = replay("handmade-session.trace", &config, 150, false, Duration::from_secs(60));
    assert_eq!(r.lines(&["LEFTOVER"]).len(), 5, "{:#?}", r.log);
    assert!(r.lines(&["SKIPPED", "REAPED", "DRY_RUN"]).is_empty(), "{:#?}", r.log);
    assert!(r.terms().is_empty() && r.kills().is_empty());
}

#[guard_test]
fn a_dry_run_logs_dry_run_for_each_leftover_it_would_stop_and_signals_nothing() {
    let r = replay("handmade-session.trace", STOP, 150, true, Duration::from_secs(60));
    assert_eq!(
        r.lines(&["DRY_RUN", "REAPED"]),
        [
            "DRY_RUN pid=201 name=watcher reason=leftover root=200",
            "DRY_RUN pid=203 name=daemon reason=leftover root=200",
            "DRY_RUN pid=204 name=renamed reason=leftover root=200",
        ],
        "{:#?}",
        r.log
    );
    assert!(r.terms().is_empty() && r.kills().is_empty());
    let verified: Vec<(bool, Vec<u32>)> = r.rec.signals.calls.lock().unwrap().clone();
    assert_eq!(verified, [(true, vec![201, 203, 204])]);
}

#[guard_test]
fn without_sessions_the_same_trace_logs_nothing_of_them() {
    let r = replay("handmade-session.trace", r#"{"excludeCommands": ["--keep"]}"#, 150, false, Duration::from_secs(60));
    assert!(r.lines(&["LEFTOVER", "REAPED", "SKIPPED", "DRY_RUN"]).is_empty(), "{:#?}", r.log);
    let status = r.rec.status.0.lock().unwrap().last().cloned().unwrap();
    assert!(status.sessions.is_none());
}

/// The session recorded from the real kernel (tests/tests/record.rs): a setsid child that
/// execs, a double-forked grandchild, an excluded name and a renamed child are all the root's
/// leftovers; the trace ends with them alive (nothing exits after its SIGTERM), so the SIGKILL
/// rounds run and the session closes with them as survivors.
#[guard_test]
fn a_session_recorded_from_the_kernel_replays_to_its_leftovers() {
    let config = r#"{"excludes": ["claude"],
        "sessions": {"roots": ["(^|/)agent-wrapper session "], "leftovers": "stop", "grace": "1s"}}"#;
    let r = replay("recorded-session.trace", config, 30, false, Duration::from_secs(1));
    let root = 35358;
    let (watcher, daemonish, claude, renamed) = (35359, 35361, 35362, 35363);
    let leftovers = r.lines(&["LEFTOVER"]);
    let named: Vec<String> = leftovers.iter().map(|l| l.rsplit_once(" age=").unwrap().0.to_string()).collect();
    assert_eq!(
        named,
        [
            format!("LEFTOVER pid={watcher} name=watcher root={root}"),
            format!("LEFTOVER pid={daemonish} name=daemonish root={root}"),
            format!("LEFTOVER pid={claude} name=claude root={root}"),
            format!("LEFTOVER pid={renamed} name=renamed root={root}"),
        ],
        "{:#?}",
        r.log
    );
    assert_eq!(r.terms(), [vec![watcher, daemonish, renamed]]);
    assert_eq!(r.kills().len(), 3, "three SIGKILL rounds: {:?}", r.kills());
    assert_eq!(r.lines(&["REAPED"]), [format!("REAPED root={root} name=agent-wrapper count=0 survivors=4")]);
}

/// Processes older than the daemon: their lineage comes from the start-up scan's parent links. A
/// root among them is recognised by its command line; its child that only forked (the same
/// command line) is a member, not a root of its own; an orphan outside is nobody's leftover.
#[guard_test]
fn a_root_older_than_the_daemon_is_recognised_and_its_forks_are_its_session() {
    let r = replay("handmade-session-startup.trace", STOP, 60, false, Duration::from_secs(10));
    assert_eq!(
        r.lines(&["LEFTOVER", "SKIPPED", "REAPED"]),
        [
            "LEFTOVER pid=201 name=agent-wrapper root=200 age=39s",
            "LEFTOVER pid=202 name=watcher root=200 age=39s",
            "REAPED root=200 name=agent-wrapper count=2 survivors=0",
        ],
        "{:#?}",
        r.log
    );
    assert_eq!(r.terms(), [vec![201, 202]]);
    assert_eq!(r.kills(), [vec![201]]);
}

guard_test::main!();
