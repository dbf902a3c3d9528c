//! The session rules without a kernel: views built by hand, time passed in.
use std::{path::Path, time::Duration};

use super::*;
use crate::{
    config::parse,
    domain::{SessionProcess, SessionsStatus},
    lineage::{Candidate, LineageCounts},
};

const LIMITS: SessionLimits = SessionLimits { caps: Caps::DAEMON, candidates: 4096, command_bytes: 4 << 20 };

/// What a tick read of the candidates: `verdicts` only.
fn read(verdicts: impl IntoIterator<Item = (SessionId, RootVerdict)>) -> RootsRead {
    RootsRead { verdicts: verdicts.into_iter().collect(), ..Default::default() }
}

fn cand(session: SessionId, process: ProcState) -> Candidate {
    Candidate { session, process, parent: None, waited_empty: false }
}

const ROOT: u32 = 200;

fn p(pid: u32, name: &str) -> ProcState {
    ProcState { id: ProcId { pid, start_ticks: u64::from(pid) }, euid: 1000, comm: Comm::new(name.as_bytes()) }
}

fn config(leftovers: &str, grace: u64) -> Config {
    let json = format!(
        r#"{{"excludes": ["claude"], "sessions": {{"roots": ["wrapper"], "leftovers": "{leftovers}", "grace": {grace}}}}}"#
    );
    parse(json.as_bytes(), Path::new("/h")).unwrap()
}

/// One session of ROOT with `members`, ended or not.
fn view(ended: bool, members: &[ProcState]) -> SessionsView {
    SessionsView {
        candidates: Vec::new(),
        sessions: vec![SessionRow {
            id: 7,
            root: p(ROOT, "wrapper").id,
            root_state: (!ended).then(|| p(ROOT, "wrapper")),
            ended,
            reported: false,
            members: members.to_vec(),
            doomed: Vec::new(),
        }],
        counts: LineageCounts::default(),
    }
}

/// A tick's plan and the lines its outcomes add (every signal succeeds).
struct Tick {
    plan: SessionPlan,
    after: Vec<Line>,
}

impl Tick {
    fn lines(&self) -> Vec<String> {
        self.plan.lines.iter().chain(&self.after).map(Line::body).collect()
    }
}

fn tick(cfg: &Config, v: &SessionsView, book: &SessionBook, now: f64, dry_run: bool) -> Tick {
    let sessions = cfg.sessions.as_ref().unwrap();
    let due = due_members(v, book, sessions, now);
    let verdicts: HashMap<ProcId, CmdVerdict> = due
        .iter()
        .map(|m| {
            (m.id, if m.comm == Comm::new(b"protected") { CmdVerdict::Excluded { index: 0 } } else { CmdVerdict::End })
        })
        .collect();
    let roots = read(v.candidates.iter().map(|c| {
        let root = c.process.comm == Comm::new(b"wrapper");
        (c.session, if root { RootVerdict::Root { command: b"wrapper --x".to_vec() } } else { RootVerdict::Other })
    }));
    let mut plan = decide_sessions(&SessionsInput {
        view: v,
        config: cfg,
        sessions,
        now: Now::same(now),
        dry_run,
        ages: Ages { boot_unix: 0.0, ticks_per_sec: 1 },
        roots: &roots,
        verdicts: &verdicts,
        book,
        limits: LIMITS,
    });
    assert_eq!(plan.term_signal, if dry_run { Signal::Verify } else { Signal::Term }, "the plan carries the dry run");
    let ok = if dry_run { Outcome::Verified } else { Outcome::Ended { needed_sigkill: false } };
    let term = vec![ok; plan.term.len()];
    let kill = vec![Outcome::Ended { needed_sigkill: true }; plan.kill.len()];
    let after = after_reap(&mut plan, &term, &kill);
    Tick { plan, after }
}

fn status_of(cfg: &Config, v: &SessionsView, book: &SessionBook, now: f64) -> SessionsStatus {
    status(v, book, cfg.sessions.as_ref().unwrap(), Ages { boot_unix: 0.0, ticks_per_sec: 1 }, Now::same(now))
}

fn recognised(cfg: &Config) -> SessionBook {
    let mut v = view(false, &[]);
    v.sessions.clear();
    v.candidates = vec![cand(7, p(ROOT, "wrapper"))];
    let t = tick(cfg, &v, &SessionBook::default(), 1000.0, false);
    assert_eq!(t.plan.commands, [LineageCmd::Classified { session: 7, root: true }]);
    t.plan.book
}

#[test]
fn a_candidate_is_a_root_only_when_its_command_line_matched() {
    let cfg = config("report", 10);
    let mut v = view(false, &[]);
    v.sessions.clear();
    v.candidates =
        vec![cand(7, p(ROOT, "wrapper")), cand(8, p(300, "make")), cand(9, p(301, "unread")), cand(10, p(302, "x"))];
    let sessions = cfg.sessions.as_ref().unwrap();
    let mut roots = read([
        (7, RootVerdict::Root { command: vec![b'w'; 1000] }),
        (8, RootVerdict::Other),
        (10, RootVerdict::WaitEmpty),
    ]);
    roots.read_after = Some(10);
    let plan = decide_sessions(&SessionsInput {
        view: &v,
        config: &cfg,
        sessions,
        now: Now::same(5.0),
        dry_run: false,
        ages: Ages { boot_unix: 0.0, ticks_per_sec: 100 },
        roots: &roots,
        verdicts: &HashMap::new(),
        book: &SessionBook::default(),
        limits: LIMITS,
    });
    assert_eq!(
        plan.commands,
        [
            LineageCmd::Classified { session: 7, root: true },
            LineageCmd::Classified { session: 8, root: false },
            LineageCmd::WaitedEmpty(10),
            LineageCmd::ReadAfter(10),
        ],
        "an unread candidate waits for the next tick"
    );
    assert_eq!(plan.book.roots[&7].command.len(), MAX_ROOT_COMMAND);
    assert_eq!(plan.book.roots[&7].command_len, 1000);
}

/// The status keeps the root's first 256 bytes, escaped once, and says how many were left out
/// (`tree` shows `…[+N bytes]`).
#[test]
fn the_status_shows_a_root_command_escaped_once_and_the_bytes_left_out() {
    let cfg = config("report", 10);
    let mut v = view(false, &[]);
    v.sessions.clear();
    v.candidates = vec![cand(7, p(ROOT, "wrapper")), cand(8, p(201, "wrapper"))];
    let mut long = b"wrapper \\ \x1b".to_vec();
    long.resize(1000, b'w');
    let roots = read([
        (7, RootVerdict::Root { command: long }),
        (8, RootVerdict::Root { command: b"wrapper a\\b".to_vec() }),
    ]);
    let plan = decide_sessions(&SessionsInput {
        view: &v,
        config: &cfg,
        sessions: cfg.sessions.as_ref().unwrap(),
        now: Now::same(5.0),
        dry_run: false,
        ages: Ages { boot_unix: 0.0, ticks_per_sec: 100 },
        roots: &roots,
        verdicts: &HashMap::new(),
        book: &SessionBook::default(),
        limits: LIMITS,
    });
    let mut v = view(false, &[]);
    v.sessions.push(SessionRow { id: 8, root: p(201, "wrapper").id, ..v.sessions[0].clone() });
    let st = status_of(&cfg, &v, &plan.book, 6.0);
    let shown: Vec<(&str, u64)> = st.sessions.iter().map(|r| (&r.command[..12], r.command_omitted_bytes)).collect();
    assert_eq!(shown, [("wrapper \\\\ \\", 744), ("wrapper a\\\\b", 0)]);
    assert!(st.sessions[0].command.starts_with("wrapper \\\\ \\x1bwww"), "{}", st.sessions[0].command);
}

#[test]
fn leftovers_are_reported_after_the_grace_and_the_session_settled() {
    let cfg = config("report", 10);
    let book = recognised(&cfg);
    let ended = view(true, &[p(201, "watcher"), p(203, "daemon")]);
    let t = tick(&cfg, &ended, &book, 1100.0, false);
    assert!(t.lines().is_empty(), "nothing before the grace: {:?}", t.lines());
    assert_eq!(t.plan.next_deadline, Some(1110.0), "the deadline timer wakes the tick at the grace");
    assert_eq!(status_of(&cfg, &ended, &t.plan.book, 1100.0).sessions[0].stage, "grace");
    let t = tick(&cfg, &ended, &t.plan.book, 1110.0, false);
    assert_eq!(
        t.lines(),
        ["LEFTOVER pid=201 name=watcher root=200 age=909s", "LEFTOVER pid=203 name=daemon root=200 age=907s"]
    );
    assert_eq!(t.plan.commands, [LineageCmd::Settle(7)]);
    assert!(t.plan.term.is_empty() && t.plan.kill.is_empty(), "report ends nothing");
    assert_eq!(t.plan.book.totals.leftovers, 2);
    assert!(t.plan.book.ended.is_empty());
}

#[test]
fn a_session_that_left_nothing_logs_nothing() {
    let cfg = config("stop", 0);
    let book = recognised(&cfg);
    let t = tick(&cfg, &view(true, &[]), &book, 1100.0, false);
    assert!(t.lines().is_empty());
    assert_eq!(t.plan.commands, [LineageCmd::Settle(7)]);
}

#[test]
fn stop_sends_sigterm_after_the_grace_sigkill_ten_seconds_later_then_one_reaped_line() {
    let cfg = config("stop", 10);
    let book = recognised(&cfg);
    let (w, d, c, x) = (p(201, "watcher"), p(203, "daemon"), p(204, "claude"), p(205, "protected"));
    let ended = view(true, &[w, d, c, x]);
    let t = tick(&cfg, &ended, &book, 1100.0, false);
    let t = tick(&cfg, &ended, &t.plan.book, 1110.0, false);
    assert_eq!(
        t.lines(),
        [
            "LEFTOVER pid=201 name=watcher root=200 age=909s",
            "LEFTOVER pid=203 name=daemon root=200 age=907s",
            "LEFTOVER pid=204 name=claude root=200 age=906s",
            "LEFTOVER pid=205 name=protected root=200 age=905s",
            "SKIPPED pid=204 name=claude reason=excluded_name",
            "SKIPPED pid=205 name=protected reason=excluded_command",
        ]
    );
    assert_eq!(t.plan.term.iter().map(|t| t.proc.id.pid).collect::<Vec<_>>(), [201, 203]);
    assert_eq!(t.plan.next_deadline, Some(1120.0));
    // What they fork from now on is chased (see `chase`).
    assert_eq!(t.plan.commands, [LineageCmd::Doom(w.id), LineageCmd::Doom(d.id)]);
    // 203 ignores SIGTERM; a new member 206 appeared meanwhile. Nothing before the 10 s.
    let still = view(true, &[d, c, x, p(206, "child")]);
    let t = tick(&cfg, &still, &t.plan.book, 1115.0, false);
    assert!(t.lines().is_empty() && t.plan.kill.is_empty());
    assert_eq!(t.plan.next_deadline, Some(1120.0));
    let t = tick(&cfg, &still, &t.plan.book, 1120.0, false);
    assert_eq!(t.lines(), ["LEFTOVER pid=206 name=child root=200 age=914s"]);
    assert_eq!(t.plan.kill.iter().map(|t| t.proc.id.pid).collect::<Vec<_>>(), [203, 206]);
    assert_eq!(t.plan.next_deadline, Some(1121.0));
    // The survivors are the protected ones.
    let t = tick(&cfg, &view(true, &[c, x]), &t.plan.book, 1121.0, false);
    assert_eq!(t.lines(), ["REAPED root=200 name=wrapper count=3 survivors=2"]);
    assert_eq!(t.plan.commands, [LineageCmd::Settle(7)]);
    assert_eq!((t.plan.book.totals.reaped, t.plan.book.totals.stopped), (1, 3));
}

#[test]
fn a_session_whose_leftovers_all_left_after_sigterm_closes_at_the_next_tick() {
    let cfg = config("stop", 0);
    let book = recognised(&cfg);
    let t = tick(&cfg, &view(true, &[p(201, "watcher")]), &book, 1100.0, false);
    assert_eq!(t.plan.term.len(), 1);
    let t = tick(&cfg, &view(true, &[]), &t.plan.book, 1101.0, false);
    assert_eq!(t.lines(), ["REAPED root=200 name=wrapper count=1 survivors=0"]);
}

#[test]
fn only_protected_leftovers_still_make_one_reaped_line() {
    let cfg = config("stop", 0);
    let book = recognised(&cfg);
    let t = tick(&cfg, &view(true, &[p(204, "claude")]), &book, 1100.0, false);
    assert_eq!(
        t.lines(),
        [
            "LEFTOVER pid=204 name=claude root=200 age=896s",
            "SKIPPED pid=204 name=claude reason=excluded_name",
            "REAPED root=200 name=wrapper count=0 survivors=1",
        ]
    );
}

#[test]
fn a_dry_run_logs_dry_run_for_what_it_would_stop_and_settles() {
    let cfg = config("stop", 0);
    let book = recognised(&cfg);
    let t = tick(&cfg, &view(true, &[p(201, "watcher"), p(204, "claude")]), &book, 1100.0, true);
    assert_eq!(
        t.lines(),
        [
            "LEFTOVER pid=201 name=watcher root=200 age=899s",
            "LEFTOVER pid=204 name=claude root=200 age=896s",
            "SKIPPED pid=204 name=claude reason=excluded_name",
            "DRY_RUN pid=201 name=watcher reason=leftover root=200",
        ]
    );
    assert_eq!(t.plan.commands, [LineageCmd::Settle(7)]);
    assert!(t.plan.book.ended.is_empty());
}

#[test]
fn rounds_go_on_while_members_keep_appearing_and_close_at_the_most_rounds() {
    let cfg = config("stop", 0);
    let book = recognised(&cfg);
    let mut t = tick(&cfg, &view(true, &[p(300, "bomb")]), &book, 1100.0, false);
    let mut now = 1110.0;
    // A new pid at every round: never "nothing new", so the rounds go on past three.
    for round in 1..=MAX_KILL_ROUNDS {
        let v = view(true, &[p(300 + round, "bomb")]);
        t = tick(&cfg, &v, &t.plan.book, now, false);
        assert_eq!(t.plan.kill.len(), 1, "round {round}: {:?}", t.lines());
        now += 1.0;
    }
    let last = p(300 + MAX_KILL_ROUNDS + 1, "bomb");
    t = tick(&cfg, &view(true, &[last]), &t.plan.book, now, false);
    let want = format!("REAPED root=200 name=wrapper count={} survivors=1", MAX_KILL_ROUNDS + 1);
    assert_eq!(t.lines(), [format!("LEFTOVER pid={} name=bomb root=200 age=809s", last.id.pid), want]);
    assert_eq!(t.plan.commands, [LineageCmd::Settle(7)], "the survivor stays listed under its root");
}

#[test]
fn a_member_that_survives_its_sigkill_closes_the_session_after_three_rounds() {
    let cfg = config("stop", 0);
    let book = recognised(&cfg);
    let stuck = p(300, "stuck");
    let mut t = tick(&cfg, &view(true, &[stuck]), &book, 1100.0, false);
    let mut now = 1110.0;
    for _ in 0..KILL_ROUNDS {
        t = tick(&cfg, &view(true, &[stuck]), &t.plan.book, now, false);
        assert_eq!(t.plan.kill.len(), 1);
        now += 1.0;
    }
    t = tick(&cfg, &view(true, &[stuck]), &t.plan.book, now, false);
    assert_eq!(t.lines(), ["REAPED root=200 name=wrapper count=0 survivors=1"]);
}

/// The chase's verdicts when every candidate's command line, read at the chase, is one an `End`
/// covers (each kept its parent's argv).
fn all_end(v: &SessionsView, book: &SessionBook, cfg: &Config) -> HashMap<ProcId, CmdVerdict> {
    chase_asks(v, book, cfg).iter().map(|p| (p.id, CmdVerdict::End)).collect()
}

#[test]
fn the_chase_signals_what_doomed_members_forked_with_their_phase_and_spares_the_excluded() {
    let cfg = config("stop", 0);
    let book = recognised(&cfg);
    let t = tick(&cfg, &view(true, &[p(201, "loop")]), &book, 1100.0, false);
    // Meanwhile 201 forked 202 (doomed: forked from a signalled member), 203 exec'd claude
    // (excluded), 204 exec'd something else (not doomed: judged at the next round).
    let mut v = view(true, &[p(201, "loop"), p(202, "loop"), p(203, "claude"), p(204, "other")]);
    v.sessions[0].doomed = vec![p(201, "x").id, p(202, "x").id, p(203, "x").id];
    let asks: Vec<u32> = chase_asks(&v, &t.plan.book, &cfg).iter().map(|p| p.id.pid).collect();
    assert_eq!(asks, [202]);
    let chased = chase(&v, &t.plan.book, &cfg, &all_end(&v, &t.plan.book, &cfg));
    let got: Vec<(u32, Signal)> = chased.iter().map(|(t, s)| (t.proc.id.pid, *s)).collect();
    assert_eq!(got, [(202, Signal::Term)]);
    // Signalled: not chased again.
    let mut book = t.plan.book.clone();
    record(&mut book, &[chased[0].0.clone()], &[Outcome::Termed]);
    assert!(chase_asks(&v, &book, &cfg).is_empty());
    // In the kill rounds the chase sends SIGKILL.
    let t = tick(&cfg, &view(true, &[p(202, "loop")]), &book, 1110.0, false);
    let mut v = view(true, &[p(205, "loop")]);
    v.sessions[0].doomed = vec![p(205, "x").id];
    let verdicts = all_end(&v, &t.plan.book, &cfg);
    let got: Vec<(u32, Signal)> =
        chase(&v, &t.plan.book, &cfg, &verdicts).iter().map(|(t, s)| (t.proc.id.pid, *s)).collect();
    assert_eq!(got, [(205, Signal::Kill)]);
}

/// §15: commands matching `excludeCommands` are never ended, forks included. A fork of a signalled
/// member that rewrote its argv (`setproctitle`) to a protected command line, or whose command
/// line the chase could not judge, is not signalled by the chase: the next round reads it and
/// protects it (`SKIPPED … excluded_command`) or ends it.
#[test]
fn the_chase_signals_only_forks_whose_command_line_now_has_the_verdict_end() {
    let cfg = config("stop", 0);
    let book = recognised(&cfg);
    let t = tick(&cfg, &view(true, &[p(201, "loop")]), &book, 1100.0, false);
    assert_eq!(t.plan.term.len(), 1);
    let forks = [p(202, "protected"), p(203, "loop"), p(204, "loop"), p(205, "loop"), p(206, "loop"), p(207, "loop")];
    let mut members = vec![p(201, "loop")];
    members.extend(forks);
    let mut v = view(true, &members);
    v.sessions[0].doomed = members.iter().map(|m| m.id).collect();
    let verdicts: HashMap<ProcId, CmdVerdict> = [
        (202, CmdVerdict::Excluded { index: 0 }),
        (203, CmdVerdict::Deferred),
        (204, CmdVerdict::Budget),
        (205, CmdVerdict::TooLong),
        (206, CmdVerdict::Gone),
        (207, CmdVerdict::End),
    ]
    .into_iter()
    .map(|(pid, v)| (p(pid, "x").id, v))
    .collect();
    let asks: Vec<u32> = chase_asks(&v, &t.plan.book, &cfg).iter().map(|p| p.id.pid).collect();
    assert_eq!(asks, [202, 203, 204, 205, 206, 207]);
    let chased: Vec<u32> = chase(&v, &t.plan.book, &cfg, &verdicts).iter().map(|(t, _)| t.proc.id.pid).collect();
    assert_eq!(chased, [207]);
    // Nothing read at all: nothing chased.
    assert!(chase(&v, &t.plan.book, &cfg, &HashMap::new()).is_empty());
    // The next round judges the one that rewrote its argv and never signals it.
    let t = tick(&cfg, &v, &t.plan.book, 1110.0, false);
    assert!(t.lines().contains(&"SKIPPED pid=202 name=protected reason=excluded_command".to_string()), "{:?}", t.lines());
    assert!(t.plan.kill.iter().all(|k| k.proc.id.pid != 202));
    assert!(chase_asks(&v, &t.plan.book, &cfg).iter().all(|p| p.id.pid != 202));
}

#[test]
fn each_cap_reached_is_said_once() {
    let cfg = config("report", 10);
    let mut v = view(false, &[]);
    v.counts.caps.sessions = 2;
    v.counts.pending = 5000;
    let t = tick(&cfg, &v, &SessionBook::default(), 1000.0, false);
    assert_eq!(
        t.lines(),
        ["WARN sessions_cap what=sessions limit=1024", "WARN sessions_cap what=candidates limit=4096"]
    );
    v.counts.caps.sessions = 3;
    v.counts.caps.members = 1;
    let t = tick(&cfg, &v, &t.plan.book, 1001.0, false);
    assert_eq!(t.lines(), ["WARN sessions_cap what=members limit=16384"]);
    assert_eq!(t.plan.book.reading.candidates, 2, "counted at every tick it is reached");
}

#[test]
fn a_reported_session_is_listed_as_reported_and_left_alone() {
    let cfg = config("stop", 0);
    let mut book = recognised(&cfg);
    let info = book.roots.remove(&7).unwrap();
    book.reported.insert(7, info);
    let mut v = view(true, &[p(201, "watcher")]);
    v.sessions[0].reported = true;
    let t = tick(&cfg, &v, &book, 1100.0, false);
    assert!(t.lines().is_empty() && t.plan.commands.is_empty() && t.plan.term.is_empty(), "{:?}", t.lines());
    let s = status_of(&cfg, &v, &t.plan.book, 1100.0);
    let row = &s.sessions[0];
    assert_eq!(
        (row.stage.as_str(), row.root_name.as_str(), row.command.as_str()),
        ("reported", "wrapper", "wrapper --x")
    );
    assert_eq!(row.processes.len(), 1);
    assert_eq!((s.reported_leftovers, s.pending_leftovers), (1, 0));
}

#[test]
fn a_leftover_gone_before_its_sigterm_is_skipped_as_identity_changed_and_not_counted() {
    let cfg = config("stop", 0);
    let book = recognised(&cfg);
    let v = view(true, &[p(201, "watcher")]);
    let sessions = cfg.sessions.as_ref().unwrap();
    let verdicts = HashMap::from([(p(201, "x").id, CmdVerdict::End)]);
    let mut plan = decide_sessions(&SessionsInput {
        view: &v,
        config: &cfg,
        sessions,
        now: Now::same(1100.0),
        dry_run: false,
        ages: Ages { boot_unix: 0.0, ticks_per_sec: 1 },
        roots: &RootsRead::default(),
        verdicts: &verdicts,
        book: &book,
        limits: LIMITS,
    });
    let lines = after_reap(&mut plan, &[Outcome::Refused(crate::domain::Refusal::IdentityChanged)], &[]);
    assert_eq!(
        lines.iter().map(Line::body).collect::<Vec<_>>(),
        ["SKIPPED pid=201 name=watcher reason=identity_changed"]
    );
    let t = tick(&cfg, &view(true, &[]), &plan.book, 1101.0, false);
    assert_eq!(t.lines(), ["REAPED root=200 name=wrapper count=0 survivors=0"]);
}

#[test]
fn a_member_without_a_verdict_is_never_ended_on_a_guess_and_is_decided_again_at_the_next_step() {
    let cfg = config("stop", 0);
    let book = recognised(&cfg);
    let v = view(true, &[p(201, "watcher")]);
    let input = |now: f64, verdicts: &'static [(u32, CmdVerdict)], book: &SessionBook| {
        let verdicts: HashMap<ProcId, CmdVerdict> = verdicts.iter().map(|(pid, v)| (p(*pid, "x").id, *v)).collect();
        decide_sessions(&SessionsInput {
            view: &v,
            config: &cfg,
            sessions: cfg.sessions.as_ref().unwrap(),
            now: Now::same(now),
            dry_run: false,
            ages: Ages { boot_unix: 0.0, ticks_per_sec: 1 },
            roots: &RootsRead::default(),
            verdicts: &verdicts,
            book,
            limits: LIMITS,
        })
    };
    let plan = input(1100.0, &[], &book);
    assert!(plan.term.is_empty());
    assert!(plan.lines.iter().any(|l| l.body() == "SKIPPED pid=201 name=watcher reason=match_budget"));
    assert!(plan.lines.iter().all(|l| l.kind() != crate::log::Kind::Reaped), "the session waits for the next step");
    assert_eq!(plan.next_deadline, Some(1110.0));
    // Still undecided in between: no second line, nothing signalled.
    let plan = input(1105.0, &[(201, CmdVerdict::Budget)], &plan.book);
    assert!(plan.lines.is_empty() && plan.kill.is_empty());
    // Decided at the next step: ended then.
    let plan = input(1110.0, &[(201, CmdVerdict::End)], &plan.book);
    assert_eq!(plan.kill.iter().map(|t| t.proc.id.pid).collect::<Vec<_>>(), [201]);
}

#[test]
fn the_status_lists_sessions_their_stage_and_counts() {
    let cfg = config("stop", 30);
    let book = recognised(&cfg);
    let live = view(false, &[p(201, "watcher")]);
    let t = tick(&cfg, &live, &book, 1010.0, false);
    let s = &status_of(&cfg, &live, &t.plan.book, 1010.0);
    assert_eq!((s.leftovers.as_str(), s.grace_secs), ("stop", 30.0));
    let row = &s.sessions[0];
    assert_eq!(
        (row.root_pid, row.root_name.as_str(), row.command.as_str(), row.stage.as_str()),
        (200, "wrapper", "wrapper --x", "live")
    );
    assert_eq!(row.processes, [SessionProcess { pid: 201, start: 201, name: "watcher".into() }]);
    let ended = view(true, &[p(201, "watcher")]);
    let t = tick(&cfg, &ended, &t.plan.book, 1020.0, false);
    let s = status_of(&cfg, &ended, &t.plan.book, 1020.0);
    let row = &s.sessions[0];
    assert_eq!((row.stage.as_str(), row.ended_at, row.due_at), ("grace", Some(1020.0), Some(1050.0)));
    assert_eq!(s.pending_leftovers, 1);
    let _ = Duration::ZERO;
}

#[test]
fn leftovers_gone_before_their_command_line_was_read_still_start_the_rounds() {
    let cfg = config("stop", 0);
    let book = recognised(&cfg);
    let decide = |v: &SessionsView, verdicts: HashMap<ProcId, CmdVerdict>, book: &SessionBook, now: f64| {
        decide_sessions(&SessionsInput {
            view: v,
            config: &cfg,
            sessions: cfg.sessions.as_ref().unwrap(),
            now: Now::same(now),
            dry_run: false,
            ages: Ages { boot_unix: 0.0, ticks_per_sec: 1 },
            roots: &RootsRead::default(),
            verdicts: &verdicts,
            book,
            limits: LIMITS,
        })
    };
    // At the grace the one leftover had moved to a new pid before its command line was read.
    let plan =
        decide(&view(true, &[p(300, "hopper")]), HashMap::from([(p(300, "x").id, CmdVerdict::Gone)]), &book, 1100.0);
    assert!(plan.lines.iter().all(|l| l.kind() != crate::log::Kind::Reaped), "{:?}", plan.lines);
    assert!(plan.term.is_empty());
    assert_eq!(plan.next_deadline, Some(1101.0), "the first SIGKILL round is a second away");
    // A second later its successor is read alive: killed.
    let v = view(true, &[p(301, "hopper")]);
    let plan = decide(&v, HashMap::from([(p(301, "x").id, CmdVerdict::End)]), &plan.book, 1101.0);
    assert_eq!(plan.kill.iter().map(|t| t.proc.id.pid).collect::<Vec<_>>(), [301]);
}
