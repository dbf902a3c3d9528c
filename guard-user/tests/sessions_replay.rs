//! Sessions and leftovers replayed through the whole daemon (pump, lineage, tick, decide,
//! effects) on a paused tokio clock, from hand-made and recorded traces: the exact lines, the
//! signals, the stream events and the status. Beside replay.rs (which is near its size bound),
//! with the same harness in small.
use guard_test::guard_test;
use std::{path::PathBuf, time::Duration};

use guard::status::Status;

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
    replay_trace(Trace::open(&fixture(fixture_name)).unwrap(), config, secs, dry_run, interval)
}

/// A trace written line by line (the recorded format, docs in `guard::trace`), account 1000.
#[derive(Default)]
struct Lines(Vec<String>);

impl Lines {
    fn ev(&mut self, t: f64, ev: &str, pid: u32, start: u64, euid: u32, comm: &str) -> &mut Lines {
        self.0.push(format!(r#"{{"t":{t},"ev":"{ev}","pid":{pid},"start":{start},"euid":{euid},"comm":"{comm}"}}"#));
        self
    }

    fn fork(&mut self, t: f64, parent: u32, pid: u32, start: u64, euid: u32, comm: &str) -> &mut Lines {
        self.0.push(format!(
            r#"{{"t":{t},"ev":"fork","parent":{parent},"pid":{pid},"start":{start},"euid":{euid},"comm":"{comm}"}}"#
        ));
        self
    }

    fn cmdline(&mut self, t: f64, pid: u32, text: &str) -> &mut Lines {
        self.0.push(format!(r#"{{"t":{t},"pid":{pid},"cmdline":"{text}"}}"#));
        self
    }

    fn exit(&mut self, t: f64, pid: u32, start: u64) -> &mut Lines {
        self.0.push(format!(r#"{{"t":{t},"ev":"exit","pid":{pid},"start":{start}}}"#));
        self
    }

    /// A process forked by `parent` that execs `comm` with command line `text`.
    fn spawn(&mut self, t: f64, parent: u32, pid: u32, start: u64, comm: &str, text: &str) -> &mut Lines {
        self.fork(t, parent, pid, start, UID, "bash").ev(t, "exec", pid, start, UID, comm).cmdline(t, pid, text)
    }

    /// The trace: a shell (100) scanned at the start, then these records.
    fn trace(&self) -> Trace {
        let mut text = format!("{{\"guard_trace\":1,\"uid\":{UID},\"note\":\"hand-made in the test\"}}\n");
        text.push_str(&format!(
            "{{\"t\":0,\"scan\":[{{\"pid\":100,\"start\":10,\"euid\":{UID},\"comm\":\"bash\"}}]}}\n"
        ));
        text.push_str("{\"t\":0,\"parents\":[[100,1]]}\n{\"t\":0,\"pid\":100,\"cmdline\":\"-bash\"}\n");
        for l in &self.0 {
            text.push_str(l);
            text.push('\n');
        }
        Trace::parse("test", std::io::Cursor::new(text)).unwrap()
    }
}

const UID: u32 = 1000;

fn replay_trace(trace: Trace, config: &str, secs: u64, dry_run: bool, interval: Duration) -> Replayed {
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
    let s = status.sessions.as_ref().expect("sessions in the status");
    assert_eq!((s.leftovers_total, s.reaped_total, s.stopped_total, s.live, s.ended), (5, 1, 3, 0, 0));
    // The two protected ones still run: listed under their ended root until they exit.
    assert_eq!((s.reported, s.reported_leftovers), (1, 2));
    let hb = r.rec.mirror.heartbeats.lock().unwrap().last().cloned().unwrap();
    assert_eq!(hb.sessions.map(|s| (s.leftovers, s.reaped)), Some((5, 1)));
    let metrics = r.rec.metrics.0.lock().unwrap().last().cloned().unwrap();
    assert!(metrics.contains("guard_reaped_total{user=\"replay\"} 1\n"), "{metrics}");
    // The three ended count as ended wherever kills are counted, with their reason.
    let reaped_tick = r.log.iter().skip_while(|l| !l.starts_with("REAPED")).find(|l| l.starts_with("TICK_COMPLETE"));
    assert_eq!(reaped_tick.map(String::as_str), Some("TICK_COMPLETE flagged=0 kills=3 errors=0"), "{:#?}", r.log);
    assert_eq!((status.kills, status.kills_by_reason.leftover, status.kills_by_reason.ghost_detected), (3, 3, 0));
    assert_eq!((hb.kills, hb.kills_by_reason.leftover), (3, 3));
    assert!(metrics.contains("guard_kills_total{user=\"replay\",reason=\"leftover\"} 3\n"), "{metrics}");
    assert!(metrics.contains("guard_kills_total{user=\"replay\",reason=\"ghost_detected\"} 0\n"), "{metrics}");
}

fn last_status(r: &Replayed) -> Status {
    r.rec.status.0.lock().unwrap().last().cloned().unwrap()
}

/// The rows of the last status: (root pid, stage, pids of its processes).
fn rows(r: &Replayed) -> Vec<(u32, String, Vec<u32>)> {
    let st = last_status(r);
    st.sessions
        .unwrap()
        .sessions
        .iter()
        .map(|row| (row.root_pid, row.stage.clone(), row.processes.iter().map(|p| p.pid).collect()))
        .collect()
}

#[guard_test]
fn reported_leftovers_stay_listed_after_their_leftover_line_until_they_exit() {
    let config = STOP.replace(r#""stop""#, r#""report""#);
    // At 150: 201 and 203 exited at 80.5, 204 at 90.5; the excluded 205 and 206 run on.
    let r = replay("handmade-session.trace", &config, 150, false, Duration::from_secs(60));
    assert_eq!(r.lines(&["LEFTOVER"]).len(), 5, "{:#?}", r.log);
    assert_eq!(rows(&r), [(200, "reported".to_string(), vec![205, 206])]);
    let s = last_status(&r).sessions.unwrap();
    assert_eq!((s.live, s.ended, s.reported, s.reported_leftovers), (0, 0, 1, 2));
    assert_eq!(s.sessions[0].root_name, "agent-wrapper");
    assert_eq!(s.sessions[0].command, "/usr/bin/agent-wrapper --session a");
    // Right after the LEFTOVER lines (80 s), all five are listed.
    let r = replay("handmade-session.trace", &config, 81, false, Duration::from_secs(60));
    assert_eq!(rows(&r), [(200, "reported".to_string(), vec![201, 203, 204, 205, 206])]);
}

/// A roots pattern that matches every command line (or the empty one) would make every orphan a
/// leftover: the config is refused, named under its own key, and nothing is reported or ended.
#[guard_test]
fn a_roots_pattern_matching_everything_is_refused_and_sessions_stay_off() {
    // `[a-z]` and `[[:alnum:]]` leave odd lines alone, but no ordinary one.
    for pattern in ["^", ".*", "a||b", "^$", ".", "[a-z]", "[[:alnum:]]"] {
        let config =
            format!(r#"{{"sessions": {{"roots": ["(^|/)agent-wrapper( |$)", "{pattern}"], "leftovers": "stop"}}}}"#);
        let r = replay("handmade-session.trace", &config, 150, false, Duration::from_secs(60));
        let errors = r.lines(&["ERROR"]);
        assert!(
            errors
                .iter()
                .all(|l| l.starts_with(&format!("ERROR config_malformed sessions.roots pattern={pattern} index=1 "))),
            "{pattern}: {errors:#?}"
        );
        assert!(
            errors[0].contains("fix=\"match only the command lines of the programs that start sessions"),
            "{}",
            errors[0]
        );
        assert!(r.lines(&["LEFTOVER", "DRY_RUN", "REAPED", "SKIPPED"]).is_empty(), "{pattern}: {:#?}", r.log);
        assert!(r.terms().is_empty() && r.kills().is_empty());
    }
    // One that leaves an ordinary command line alone (`apt update`) names roots, however odd.
    let config = r#"{"sessions": {"roots": ["^[^a]"], "leftovers": "report"}}"#;
    let r = replay("handmade-session.trace", config, 150, false, Duration::from_secs(60));
    assert!(r.lines(&["ERROR"]).is_empty(), "{:#?}", r.log);
    assert!(!r.lines(&["LEFTOVER"]).is_empty(), "{:#?}", r.log);
}

/// `sg GROUP -c CMD` run by a member: the set-user-ID exec makes it root's (its real uid stays the
/// account's, so the kernel reports its fork), its child comes back to the account's uid and runs
/// the command; and a root that ends with `exec sg …` ended its session. Both leave leftovers.
#[guard_test]
fn members_that_visit_another_uid_stay_in_their_session_and_a_root_that_leaves_has_ended() {
    let mut t = Lines::default();
    t.spawn(5.0, 100, 200, 500, "agent-wrapper", "agent-wrapper --session a");
    t.fork(6.0, 200, 201, 600, UID, "agent-wrapper");
    // 201: sg → fork while root → the child back in the account, exec'ing a watcher.
    t.ev(70.0, "exec", 201, 600, 0, "sg").fork(70.1, 201, 202, 610, 0, "sg");
    t.ev(70.2, "setuid", 202, 610, UID, "sg").ev(70.3, "exec", 202, 610, UID, "watcher").cmdline(70.3, 202, "watcher");
    // The root: exec sg (it left the account: its session ended), whose child comes back.
    t.ev(80.0, "exec", 200, 500, 0, "sg").fork(80.1, 200, 203, 620, 0, "sg");
    t.ev(80.2, "setuid", 203, 620, UID, "sg").ev(80.3, "exec", 203, 620, UID, "agent").cmdline(80.3, 203, "agent --x");
    let config = r#"{"sessions": {"roots": ["(^|/)agent-wrapper( |$)"], "leftovers": "report", "grace": "10s"}}"#;
    let r = replay_trace(t.trace(), config, 150, false, Duration::from_secs(60));
    let named: Vec<String> =
        r.lines(&["LEFTOVER"]).iter().map(|l| l.rsplit_once(" age=").unwrap().0.to_string()).collect();
    assert_eq!(
        named,
        ["LEFTOVER pid=202 name=watcher root=200", "LEFTOVER pid=203 name=agent root=200"],
        "{:#?}",
        r.log
    );
}

/// `exec newgrp` (or an `sg` that does not fork) in the root itself: the root leaves the account
/// (its session ended), comes back to it in the same pid and execs a watcher that forks. The
/// process and what it forks are the ended session's leftovers, not members of whatever
/// session encloses the root.
#[guard_test]
fn a_root_that_leaves_and_comes_back_in_the_same_pid_is_its_sessions_leftover() {
    let mut t = Lines::default();
    t.spawn(5.0, 100, 200, 500, "agent-wrapper", "agent-wrapper --session a");
    t.ev(70.0, "exec", 200, 500, 0, "newgrp").ev(70.1, "setuid", 200, 500, UID, "newgrp");
    t.ev(70.2, "exec", 200, 500, UID, "watcher").cmdline(70.2, 200, "watcher --x");
    t.fork(70.3, 200, 201, 600, UID, "watcher");
    // A tick classifies the watcher's exec (not a root) before the grace ends.
    let config = r#"{"sessions": {"roots": ["(^|/)agent-wrapper( |$)"], "leftovers": "report", "grace": "30s"}}"#;
    let r = replay_trace(t.trace(), config, 150, false, Duration::from_secs(10));
    let named: Vec<String> =
        r.lines(&["LEFTOVER"]).iter().map(|l| l.rsplit_once(" age=").unwrap().0.to_string()).collect();
    assert_eq!(
        named,
        ["LEFTOVER pid=200 name=watcher root=200", "LEFTOVER pid=201 name=watcher root=200"],
        "{:#?}",
        r.log
    );
}

/// An excluded member that re-execs with an empty argv: its empty command line is no root once it
/// was read empty twice, so what it forks afterwards is the session's again.
#[guard_test]
fn an_empty_argv_exec_does_not_hide_what_the_process_forks_afterwards() {
    let mut t = Lines::default();
    t.spawn(5.0, 100, 200, 500, "agent-wrapper", "agent-wrapper --session a");
    t.fork(6.0, 200, 201, 600, UID, "agent-wrapper").ev(6.0, "exec", 201, 600, UID, "claude").cmdline(6.0, 201, "");
    t.fork(7.0, 201, 202, 700, UID, "claude").ev(7.0, "exec", 202, 700, UID, "worker").cmdline(7.0, 202, "worker");
    t.exit(200.0, 200, 500);
    let config = r#"{"excludes": ["claude"],
        "sessions": {"roots": ["(^|/)agent-wrapper( |$)"], "leftovers": "report", "grace": "10s"}}"#;
    let r = replay_trace(t.trace(), config, 300, false, Duration::from_secs(60));
    let named: Vec<String> =
        r.lines(&["LEFTOVER"]).iter().map(|l| l.rsplit_once(" age=").unwrap().0.to_string()).collect();
    assert_eq!(
        named,
        ["LEFTOVER pid=201 name=claude root=200", "LEFTOVER pid=202 name=worker root=200"],
        "{:#?}",
        r.log
    );
}

/// 4,100 execs with an empty argv (named like an excluded program, so uncounted), then a real
/// root: each empty one costs one wait, the reading goes round-robin, and the root is recognised
/// at the second tick after its exec.
#[guard_test]
fn four_thousand_empty_execs_do_not_stall_the_recognition_of_a_real_root() {
    let mut t = Lines::default();
    for i in 0..4100u32 {
        let (pid, start) = (1000 + i, 1000 + u64::from(i));
        t.fork(1.0, 100, pid, start, UID, "bash").ev(1.0, "exec", pid, start, UID, "claude").cmdline(1.0, pid, "");
    }
    t.spawn(2.0, 100, 200, 500, "agent-wrapper", "agent-wrapper --session a");
    let config = r#"{"excludes": ["claude"], "sessions": {"roots": ["(^|/)agent-wrapper( |$)"]}}"#;
    let r = replay_trace(t.trace(), config, 185, false, Duration::from_secs(60));
    let statuses = r.rec.status.0.lock().unwrap().clone();
    let recognised = statuses.iter().position(|s| s.sessions.as_ref().is_some_and(|x| x.live == 1));
    assert!(matches!(recognised, Some(i) if i <= 2), "the root was recognised at tick {recognised:?}");
    let last = statuses.last().unwrap().sessions.clone().unwrap();
    assert_eq!((last.live, last.pending_execs), (1, 0), "every empty exec settled within three ticks: {last:#?}");
    assert!(r.lines(&["WARN"]).contains(&"WARN sessions_cap what=candidates limit=4096"), "{:#?}", r.log);
}

/// 1,024 fake roots (`exec -a agent-wrapper sleep`) fill the cap on sessions: a later real root is
/// refused, and that is said (once) and counted, never silent.
#[guard_test]
fn past_the_cap_on_sessions_a_refused_root_is_said_and_counted() {
    let mut t = Lines::default();
    for i in 0..1024u32 {
        t.spawn(1.0, 100, 1000 + i, 1000 + u64::from(i), "sleep", "agent-wrapper fake");
    }
    t.spawn(70.0, 100, 200, 500, "agent-wrapper", "agent-wrapper --session a");
    let config = r#"{"sessions": {"roots": ["(^|/)agent-wrapper( |$)"]}}"#;
    let r = replay_trace(t.trace(), config, 200, false, Duration::from_secs(60));
    assert_eq!(r.lines(&["WARN"]), ["WARN sessions_cap what=sessions limit=1024"], "{:#?}", r.log);
    let s = last_status(&r).sessions.unwrap();
    assert_eq!((s.live, s.caps.sessions, s.roots_refused_total), (1024, 1, 1));
    let metrics = r.rec.metrics.0.lock().unwrap().last().cloned().unwrap();
    assert!(metrics.contains("guard_sessions_cap_reached_total{user=\"replay\",what=\"sessions\"} 1\n"), "{metrics}");
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

/// A leftover that keeps forking to new pids (every half second here, each generation exiting
/// right after its fork): the SIGKILL rounds go on while each finds a member no round signalled
/// yet, not three and done; the one still alive at the end is listed under its ended root.
#[guard_test]
fn the_kill_rounds_go_on_while_a_leftover_keeps_moving_to_new_pids() {
    let mut t = Lines::default();
    t.spawn(5.0, 100, 200, 500, "agent-wrapper", "agent-wrapper --session a");
    t.fork(6.0, 200, 300, 600, UID, "agent-wrapper").ev(6.0, "exec", 300, 600, UID, "hopper");
    t.cmdline(6.0, 300, "hopper");
    t.exit(70.0, 200, 500);
    // 300 → 301 → … every 0.5 s from 71 to 100; each parent exits right after its fork.
    for i in 0..60u32 {
        let at = 71.0 + f64::from(i) * 0.5;
        let (pid, start) = (300 + i, 600 + u64::from(i));
        t.fork(at, pid, pid + 1, start + 1, UID, "hopper").cmdline(at, pid + 1, "hopper");
        t.exit(at + 0.01, pid, start);
    }
    let config = r#"{"excludeCommands": [],
        "sessions": {"roots": ["(^|/)agent-wrapper( |$)"], "leftovers": "stop", "grace": "1s"}}"#;
    let r = replay_trace(t.trace(), config, 140, false, Duration::from_secs(1));
    let kills = r.kills();
    assert!(kills.len() > 10, "{} SIGKILL rounds: {kills:?}\n{:#?}", kills.len(), r.log);
    let reaped = r.lines(&["REAPED"]);
    assert_eq!(reaped.len(), 1, "{:#?}", r.log);
    assert!(reaped[0].ends_with("survivors=1"), "{reaped:?}");
    // The last generation (360) never exits in the trace: listed, not forgotten.
    assert_eq!(rows(&r), [(200, "reported".to_string(), vec![360])]);
}

guard_test::main!();

/// 2,001 reported leftovers of one root, beside 70 live sessions (more than the 64 live ones the
/// status lists): every leftover is listed under its ended root, so `tree` never leaves the log
/// as the only list; only live sessions are cut, and counted.
#[guard_test]
fn two_thousand_reported_leftovers_are_all_listed_beside_more_live_sessions_than_are_shown() {
    let mut t = Lines::default();
    for i in 0..70u32 {
        t.spawn(1.0, 100, 10_000 + i, 10_000 + u64::from(i), "sleep", "agent-wrapper fake");
    }
    t.spawn(1.0, 100, 200, 500, "agent-wrapper", "agent-wrapper --session a");
    for i in 0..2001u32 {
        t.fork(70.5, 200, 20_000 + i, 20_000 + u64::from(i), UID, "worker");
    }
    t.exit(80.0, 200, 500);
    let config = r#"{"sessions": {"roots": ["(^|/)agent-wrapper( |$)"], "leftovers": "report", "grace": "10s"}}"#;
    let r = replay_trace(t.trace(), config, 150, false, Duration::from_secs(60));
    assert_eq!(r.lines(&["LEFTOVER"]).len(), 2001);
    let s = last_status(&r).sessions.unwrap();
    assert_eq!((s.live, s.reported, s.reported_leftovers), (70, 1, 2001));
    let ended: Vec<_> = s.sessions.iter().filter(|row| row.stage == "reported").collect();
    assert_eq!(ended.len(), 1);
    assert_eq!((ended[0].root_pid, ended[0].processes.len(), ended[0].processes_omitted), (200, 2001, 0));
    let listed: std::collections::BTreeSet<u32> = ended[0].processes.iter().map(|p| p.pid).collect();
    assert_eq!(listed, (20_000..22_001).collect());
    assert_eq!(s.sessions.iter().filter(|row| row.stage == "live").count(), 64);
    assert_eq!(s.sessions_omitted, 6);
}
