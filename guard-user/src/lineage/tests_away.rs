//! The lineage across visits outside the account, reported leftovers, the round-robin of
//! pending execs, doomed forks and the caps' counts.
use super::*;

fn away(pid: u32, start: u64, name: &str) -> ProcState {
    ProcState { euid: 0, ..st(pid, start, name) }
}

fn id(pid: u32, start: u64) -> ProcId {
    ProcId { pid, start_ticks: start }
}

/// The shell, a root `wrapper` 200 (start 10) recognised, and its member 201 (start 11).
fn with_root() -> World {
    let mut w = with_wrapper();
    w.fork(200, 201, 11, "wrapper");
    w
}

/// `sg GROUP -c CMD` as sg does it: the set-user-ID exec (root's now, its real uid the
/// account's), a fork while root (the kernel reports it: the child's real uid is the account's),
/// the child back to the account's uid and exec'ing the command; and `newgrp`: the process itself
/// coming back.
#[test]
fn a_member_that_visits_another_uid_keeps_its_session_and_so_does_what_it_forks_there() {
    let mut w = with_root();
    w.ev(Event::State { kind: StateKind::Exec, state: away(201, 11, "sg") });
    w.ev(Event::Fork { child: away(202, 12, "sg"), parent_pid: 201 });
    assert!(w.members(200).is_empty(), "outside the account: not listed");
    w.ev(Event::State { kind: StateKind::Setuid, state: st(202, 12, "sg") });
    w.exec(202, 12, "watcher");
    w.classify(&["wrapper"]);
    assert_eq!(w.members(200), [202], "the command sg ran is the session's");
    w.ev(Event::State { kind: StateKind::Setuid, state: st(201, 11, "sg") });
    w.fork(201, 203, 13, "sg");
    assert_eq!(w.members(200), [201, 202, 203], "back in the account, a member as before");
    w.exit(200, 10);
    assert!(w.lineage.take_news());
    assert_eq!(w.members(200), [201, 202, 203], "all three are the ended root's leftovers");
}

#[test]
fn a_root_that_leaves_has_ended_and_what_it_forks_after_leaving_is_its_leftover() {
    let mut w = with_root();
    // `exec sg GROUP -c agent`: the root runs a set-user-ID program.
    w.ev(Event::State { kind: StateKind::Exec, state: away(200, 10, "sg") });
    assert!(w.lineage.take_news(), "the root left: its session ended");
    w.ev(Event::Fork { child: away(202, 12, "sg"), parent_pid: 200 });
    w.ev(Event::State { kind: StateKind::Setuid, state: st(202, 12, "sg") });
    w.exec(202, 12, "agent");
    w.classify(&[]);
    let v = w.view();
    assert!(v.sessions[0].ended && !v.sessions[0].reported);
    assert_eq!(w.members(200), [201, 202]);
    // Coming back does not revive it.
    w.ev(Event::State { kind: StateKind::Setuid, state: st(200, 10, "sg") });
    assert!(w.view().sessions[0].ended);
}

#[test]
fn a_member_away_at_a_rebuild_is_asked_about_and_dropped_only_when_gone() {
    let mut w = with_root();
    w.ev(Event::State { kind: StateKind::Setuid, state: away(201, 11, "wrapper") });
    let before = w.table.clone();
    let asked = w.lineage.reconcile(Some(&before), &w.table, None);
    assert_eq!(asked, [id(201, 11)], "not in the table, not taken for dead: asked about");
    w.lineage.attach_parents(&asked, &[(id(201, 11), 200)]);
    assert!(w.lineage.is_away(id(201, 11)), "still alive: kept");
    let asked = w.lineage.reconcile(Some(&before), &w.table, None);
    w.lineage.attach_parents(&asked, &[]);
    assert!(w.lineage.is_consistent());
    assert_eq!(w.lineage.session_of(id(201, 11)), None, "gone unseen: dropped");
}

#[test]
fn a_settled_sessions_leftovers_stay_listed_until_they_exit() {
    let mut w = with_root();
    w.fork(200, 202, 12, "wrapper");
    w.exit(200, 10);
    let sid = w.view().sessions[0].id;
    w.lineage.command(LineageCmd::Settle(sid));
    assert!(w.lineage.is_consistent(), "{:#?}", w.lineage);
    let v = w.view();
    assert!(v.sessions[0].reported && v.sessions[0].ended, "{v:#?}");
    assert_eq!(w.members(200), [201, 202]);
    assert_eq!(v.counts.reported, 1);
    w.exit(201, 11);
    assert_eq!(w.members(200), [202]);
    w.exit(202, 12);
    assert!(w.view().sessions.is_empty(), "the last one gone, the session goes");
    assert_eq!(w.lineage.counts().nodes, 0, "nothing held for them: {:#?}", w.lineage);
}

#[test]
fn past_the_cap_on_reported_sessions_a_settled_session_is_not_listed_and_that_is_counted() {
    let caps = Caps { reported: 1, ..Caps::DAEMON };
    let mut w = World::with_caps(caps);
    w.exec(100, 1, "bash");
    w.classify(&[]);
    for (root, start) in [(200, 10), (300, 30)] {
        w.fork(100, root, start, "bash").exec(root, start, "wrapper");
        w.classify(&["wrapper"]);
        w.fork(root, root + 1, start + 1, "wrapper");
        w.exit(root, start);
        let sid = w.view().sessions.iter().find(|s| s.root.pid == root).unwrap().id;
        w.lineage.command(LineageCmd::Settle(sid));
    }
    assert!(w.lineage.is_consistent());
    let v = w.view();
    assert_eq!(v.sessions.iter().map(|s| s.root.pid).collect::<Vec<_>>(), [200]);
    assert_eq!(v.counts.caps.reported, 1);
}

#[test]
fn pending_execs_are_handed_round_robin_from_where_the_tick_stopped_reading() {
    let mut w = with_shell();
    for pid in 1000..1010u32 {
        w.fork(100, pid, u64::from(pid), "bash").exec(pid, u64::from(pid), "x");
    }
    let pids = |w: &World| w.lineage.view(&w.table, 4).candidates.iter().map(|c| c.process.id.pid).collect::<Vec<_>>();
    assert_eq!(pids(&w), [1000, 1001, 1002, 1003]);
    let third = w.lineage.view(&w.table, 4).candidates[2].session;
    w.lineage.command(LineageCmd::ReadAfter(third));
    assert_eq!(pids(&w), [1003, 1004, 1005, 1006]);
    // Read up to the newest (1009, seventh from 1003): the next view wraps around.
    let newest = w.lineage.view(&w.table, 10).candidates[6];
    assert_eq!(newest.process.id.pid, 1009);
    w.lineage.command(LineageCmd::ReadAfter(newest.session));
    assert_eq!(pids(&w), [1000, 1001, 1002, 1003], "wraps around");
}

#[test]
fn a_pending_exec_read_empty_once_says_so_at_the_next_view() {
    let mut w = with_shell();
    w.fork(100, 200, 10, "bash").exec(200, 10, "x");
    let sid = w.view().candidates[0].session;
    assert!(!w.view().candidates[0].waited_empty);
    w.lineage.command(LineageCmd::WaitedEmpty(sid));
    assert!(w.view().candidates[0].waited_empty);
    // A new exec is a new pending session: it waits afresh.
    w.exec(200, 10, "y");
    assert!(!w.view().candidates[0].waited_empty);
}

#[test]
fn what_a_doomed_member_forks_is_doomed_until_it_execs() {
    let mut w = with_root();
    w.exit(200, 10);
    w.lineage.command(LineageCmd::Doom(id(201, 11)));
    w.fork(201, 202, 12, "wrapper").fork(202, 203, 13, "wrapper");
    w.fork(202, 204, 14, "wrapper").exec(204, 14, "claude");
    let row = &w.view().sessions[0];
    assert_eq!(row.doomed, [id(201, 11), id(202, 12), id(203, 13)], "{row:#?}");
}

/// A member that forked (and died) before the tick's doom came: what it forked runs the doomed
/// program all the same and is doomed with it, however many forks deep; an exec ends that.
#[test]
fn a_doom_reaches_what_the_doomed_forked_before_it_came_even_when_it_is_gone() {
    let mut w = with_root();
    w.exit(200, 10);
    w.fork(201, 202, 12, "wrapper").exit(201, 11);
    w.fork(202, 203, 13, "wrapper").fork(202, 204, 14, "wrapper").exec(204, 14, "other");
    w.lineage.commands(&[LineageCmd::Doom(id(201, 11))]);
    assert!(w.lineage.is_consistent());
    let row = &w.view().sessions[0];
    assert_eq!(row.doomed, [id(202, 12), id(203, 13)], "{row:#?}");
}

#[test]
fn each_cap_reached_is_counted_apart() {
    let caps = Caps { nodes: 6, pending: 3, sessions: 1, members: 2, reported: 1 };
    let mut w = World::with_caps(caps);
    for pid in 1..=4 {
        w.exec(pid, u64::from(pid), "wrapper");
    }
    w.classify(&["wrapper"]);
    // Three pending fit, the fourth did not; one root fits, two are refused.
    let c = w.lineage.counts().caps;
    assert_eq!((c.pending_execs, c.sessions), (1, 2), "{c:?}");
    for pid in 10..13 {
        w.fork(1, pid, u64::from(pid), "x");
    }
    assert_eq!(w.lineage.counts().caps.members, 1);
    for pid in 20..25 {
        w.fork(10, pid, u64::from(pid), "x");
    }
    let c = w.lineage.counts().caps;
    assert_eq!((c.members, c.nodes), (6, 0), "members before nodes: {c:?}");
}
