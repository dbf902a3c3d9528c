use super::*;
use crate::table::{ProcessTable, Scope};
use crate::{comm::Comm, event::StateKind};

const UID: u32 = 1000;
const OTHER: u32 = 1001;

/// A table and a lineage fed the same events, as the pump feeds them.
struct World {
    table: ProcessTable,
    lineage: Lineage,
}

fn st(pid: u32, start: u64, name: &str) -> ProcState {
    ProcState { id: ProcId { pid, start_ticks: start }, euid: UID, comm: Comm::new(name.as_bytes()) }
}

impl World {
    fn new() -> World {
        World::with_caps(Caps::DAEMON)
    }

    fn with_caps(caps: Caps) -> World {
        World { table: ProcessTable::new(Scope::account(UID)), lineage: Lineage::new(UID, None, caps) }
    }

    fn ev(&mut self, e: Event) -> &mut World {
        self.table.apply(&e);
        self.lineage.apply(&e);
        assert!(self.lineage.is_consistent(), "after {e:?}: {:#?}", self.lineage);
        self
    }

    fn fork(&mut self, parent: u32, pid: u32, start: u64, name: &str) -> &mut World {
        self.ev(Event::Fork { child: st(pid, start, name), parent_pid: parent })
    }

    fn exec(&mut self, pid: u32, start: u64, name: &str) -> &mut World {
        self.ev(Event::State { kind: StateKind::Exec, state: st(pid, start, name) })
    }

    fn exit(&mut self, pid: u32, start: u64) -> &mut World {
        self.ev(Event::Exit(ProcId { pid, start_ticks: start }))
    }

    fn view(&self) -> SessionsView {
        self.lineage.view(&self.table, usize::MAX)
    }

    /// Classifies every candidate: a root when its name is in `roots`.
    fn classify(&mut self, roots: &[&str]) {
        for c in self.view().candidates {
            let root = roots.iter().any(|r| c.process.comm == Comm::new(r.as_bytes()));
            self.lineage.command(LineageCmd::Classified { session: c.session, root });
        }
        assert!(self.lineage.is_consistent());
    }

    fn members(&self, root: u32) -> Vec<u32> {
        let v = self.view();
        let row = v.sessions.iter().find(|s| s.root.pid == root).unwrap_or_else(|| panic!("no session of {root}"));
        row.members.iter().map(|p| p.id.pid).collect()
    }
}

/// The shell that starts the wrapper, already classified (not a root).
fn with_shell() -> World {
    shell_in(World::new())
}

fn shell_in(mut w: World) -> World {
    w.exec(100, 1, "bash");
    w.classify(&[]);
    w
}

/// The shell and a root `wrapper` 200 (start 10) it started, recognised.
fn with_wrapper() -> World {
    with_wrapper_under(Caps::DAEMON)
}

/// `with_wrapper` in a lineage with these caps.
fn with_wrapper_under(caps: Caps) -> World {
    let mut w = shell_in(World::with_caps(caps));
    w.fork(100, 200, 10, "bash").exec(200, 10, "wrapper");
    w.classify(&["wrapper"]);
    w
}

#[test]
fn a_roots_session_keeps_a_setsid_child_a_double_forked_grandchild_and_renamed_or_execd_members() {
    let mut w = with_wrapper();
    // setsid child (a fork; setsid itself is no event), which execs.
    w.fork(200, 201, 11, "wrapper").exec(201, 11, "watcher");
    // Double fork: 202 forks 203 and exits; 203 is reparented to init and execs.
    w.fork(200, 202, 12, "wrapper").fork(202, 203, 13, "wrapper").exit(202, 12).exec(203, 13, "daemon");
    // A rename.
    w.fork(200, 204, 14, "wrapper").ev(Event::State { kind: StateKind::Rename, state: st(204, 14, "renamed") });
    w.classify(&["wrapper"]); // 201 and 203 exec'd: their own pending sessions are not roots
    assert_eq!(w.members(200), [201, 203, 204]);
    // No dead intermediate is kept: 202 left no node behind.
    assert_eq!(w.lineage.counts().nodes, 4, "{:#?}", w.lineage);
    w.exit(200, 10);
    assert!(w.lineage.take_news(), "the root's exit is news for the tick");
    let v = w.view();
    assert_eq!(v.sessions.len(), 1);
    assert!(v.sessions[0].ended && v.sessions[0].root_state.is_none());
    assert_eq!(w.members(200), [201, 203, 204], "the session outlives its root");
    assert_eq!((v.counts.live, v.counts.ended), (0, 1));
}

#[test]
fn what_a_non_root_forked_goes_back_to_the_session_it_is_in() {
    let mut w = with_wrapper();
    w.fork(200, 201, 11, "wrapper").exec(201, 11, "make");
    w.fork(201, 202, 12, "make"); // stamped into make's pending session
    w.classify(&["wrapper"]); // make is not a root: 202 goes back to the wrapper's session
    assert_eq!(w.members(200), [201, 202]);
    // Outside any session, a non-root's children leave no node at all.
    w.fork(100, 300, 20, "bash").exec(300, 20, "ls").fork(300, 301, 21, "ls");
    w.classify(&["wrapper"]);
    assert_eq!(w.lineage.session_of(ProcId { pid: 301, start_ticks: 21 }), None);
    assert_eq!(w.lineage.counts().nodes, 3, "{:#?}", w.lineage);
}

#[test]
fn a_root_that_re_execs_stays_the_root_of_one_session() {
    let mut w = with_wrapper();
    w.fork(200, 201, 11, "wrapper");
    w.exec(200, 10, "wrapper").exec(200, 10, "something-else");
    assert!(w.view().candidates.is_empty(), "a root's exec opens no pending session");
    w.fork(200, 202, 12, "something-else");
    assert_eq!(w.members(200), [201, 202]);
    assert_eq!(w.view().sessions.len(), 1);
}

#[test]
fn an_unclassified_process_that_execs_again_keeps_nothing_it_forked_before() {
    let mut w = with_shell();
    w.fork(100, 200, 10, "bash").exec(200, 10, "bash");
    w.fork(200, 201, 11, "bash"); // forked while 200 was an unclassified `bash`
    w.exec(200, 10, "wrapper"); // `bash -c 'x & exec wrapper'`
    w.fork(200, 202, 12, "wrapper");
    w.classify(&["wrapper"]);
    assert_eq!(w.members(200), [202], "only what the root forked after the exec the tick classified");
}

#[test]
fn a_pending_session_whose_process_exits_before_the_tick_is_dissolved() {
    let mut w = with_shell();
    w.fork(100, 200, 10, "bash").exec(200, 10, "wrapper").fork(200, 201, 11, "wrapper").exit(200, 10);
    assert!(!w.lineage.take_news(), "an unclassified process is no root");
    assert!(w.view().candidates.is_empty() && w.view().sessions.is_empty());
    assert_eq!(w.lineage.session_of(ProcId { pid: 201, start_ticks: 11 }), None);
}

#[test]
fn a_nested_root_has_its_own_session_and_its_survivors_go_back_to_the_outer_one_when_settled() {
    let mut w = with_shell();
    w.fork(100, 200, 10, "bash").exec(200, 10, "outer");
    w.classify(&["outer", "inner"]);
    w.fork(200, 300, 20, "outer").exec(300, 20, "inner");
    w.classify(&["outer", "inner"]);
    w.fork(300, 301, 21, "inner").fork(300, 302, 22, "inner");
    assert_eq!(w.members(200), [300]);
    assert_eq!(w.members(300), [301, 302]);
    w.exit(300, 20);
    let inner = w.view().sessions.iter().find(|s| s.root.pid == 300).unwrap().id;
    w.exit(301, 21);
    w.lineage.command(LineageCmd::Settle(inner));
    assert!(w.lineage.is_consistent());
    assert_eq!(w.members(200), [302], "the inner leftover belongs to the outer session again");
    let v = w.view();
    assert_eq!(v.sessions.len(), 2, "and stays listed under its ended root: {v:#?}");
    assert!(v.sessions[1].reported && v.sessions[1].members.iter().map(|p| p.id.pid).eq([302]));
}

#[test]
fn a_member_that_becomes_another_accounts_process_stays_in_its_session_away_and_so_do_its_forks() {
    let mut w = with_wrapper();
    w.fork(200, 201, 11, "wrapper").fork(200, 202, 12, "wrapper");
    w.ev(Event::State { kind: StateKind::Setuid, state: ProcState { euid: OTHER, ..st(201, 11, "wrapper") } });
    // Its fork is another account's process, still of the session.
    w.ev(Event::Fork { child: ProcState { euid: OTHER, ..st(203, 13, "wrapper") }, parent_pid: 201 });
    // An exec of a set-user-ID program takes 202 out of the account too.
    w.ev(Event::State { kind: StateKind::Exec, state: ProcState { euid: OTHER, ..st(202, 12, "su") } });
    assert!(w.members(200).is_empty(), "away from the account: never listed, never signalled");
    for (pid, start) in [(201, 11), (202, 12), (203, 13)] {
        let id = ProcId { pid, start_ticks: start };
        assert!(w.lineage.is_away(id) && w.lineage.session_of(id).is_some(), "{pid}: {:#?}", w.lineage);
    }
    assert_eq!(w.lineage.counts().nodes, 4, "{:#?}", w.lineage);
}

#[test]
fn a_root_that_becomes_another_accounts_process_ends_its_session() {
    let mut w = with_wrapper();
    w.fork(200, 201, 11, "wrapper");
    w.ev(Event::State { kind: StateKind::Setuid, state: ProcState { euid: OTHER, ..st(200, 10, "wrapper") } });
    assert!(w.lineage.take_news(), "a root that left ended its session");
    let v = w.view();
    assert!(v.sessions[0].ended && v.sessions[0].root_state.is_none());
    assert_eq!(w.members(200), [201], "its leftovers follow");
}

#[test]
fn a_recycled_pid_whose_exit_was_lost_ends_the_old_process_not_the_new_one() {
    let mut w = with_wrapper();
    w.fork(200, 201, 11, "wrapper");
    // The root's exit is lost; its pid is reused by a process forked by the shell.
    w.table.remove(ProcId { pid: 200, start_ticks: 10 });
    w.fork(100, 200, 50, "bash");
    assert!(w.lineage.take_news(), "the root is gone: its session ended");
    let v = w.view();
    assert!(v.sessions[0].ended);
    assert_eq!(w.members(200), [201]);
    // The new holder of pid 200 is no root and no member of the ended session.
    assert_eq!(w.lineage.session_of(ProcId { pid: 200, start_ticks: 50 }), None);
}

#[test]
fn start_up_adoption_takes_sessions_from_parent_links_in_start_order() {
    let mut w = World::new();
    // Before the daemon: bash 100 → wrapper 200 → watcher 201 → 202, and an orphan 300 (ppid 1).
    for p in [st(100, 1, "bash"), st(200, 10, "wrapper"), st(201, 11, "watcher"), st(202, 12, "watcher")] {
        w.table.upsert(p);
    }
    w.table.upsert(st(300, 13, "watcher"));
    let adopted = w.lineage.reconcile(None, &w.table, None);
    assert_eq!(adopted.iter().map(|id| id.pid).collect::<Vec<_>>(), [100, 200, 201, 202, 300]);
    // Given in any order: applied parents first.
    let parents = [(adopted[3], 201), (adopted[2], 200), (adopted[1], 100), (adopted[4], 1), (adopted[0], 1)];
    w.lineage.attach_parents(&adopted, &parents);
    assert!(w.lineage.is_consistent());
    w.classify(&["wrapper"]);
    assert_eq!(w.members(200), [201, 202]);
    assert_eq!(w.lineage.session_of(ProcId { pid: 300, start_ticks: 13 }), None);
}

#[test]
fn a_rebuild_ends_the_sessions_whose_roots_died_unseen_and_adopts_the_unknown() {
    let mut w = with_wrapper();
    w.fork(200, 201, 11, "wrapper");
    // Lost events: the root exited, 202 was born to 201.
    let before = w.table.clone();
    w.table.remove(ProcId { pid: 200, start_ticks: 10 });
    w.table.upsert(st(202, 12, "watcher"));
    let adopted = w.lineage.reconcile(Some(&before), &w.table, None);
    assert_eq!(adopted, [ProcId { pid: 202, start_ticks: 12 }]);
    assert!(w.lineage.take_news());
    w.lineage.attach_parents(&adopted, &[(adopted[0], 201)]);
    assert!(w.lineage.is_consistent());
    assert_eq!(w.members(200), [201, 202]);
}

#[test]
fn after_lost_forks_a_rebuild_asks_again_about_the_window_and_every_member_comes_back() {
    let mut w = with_wrapper();
    // Lost: 200 forked 201 (start 11) and 203 (start 13). Delivered: 201 forked 202, 203 exec'd,
    // and outside the session the shell forked 300 (start 14).
    w.fork(201, 202, 12, "wrapper");
    w.exec(203, 13, "cargo");
    w.fork(100, 300, 14, "bash");
    assert_eq!(w.members(200), Vec::<u32>::new());
    // The scan finds 201; the table already held 202, 203 and 300.
    let before = w.table.clone();
    w.table.upsert(st(201, 11, "wrapper"));
    let asked = w.lineage.reconcile(Some(&before), &w.table, Some(11));
    let ids: Vec<u32> = asked.iter().map(|id| id.pid).collect();
    assert_eq!(ids, [201, 202, 203, 300], "every process of the window, oldest first");
    let parents = [(asked[0], 200), (asked[1], 201), (asked[2], 200), (asked[3], 100)];
    w.lineage.attach_parents(&asked, &parents);
    assert!(w.lineage.is_consistent());
    w.classify(&[]);
    assert_eq!(w.members(200), [201, 202, 203]);
    assert_eq!(w.lineage.session_of(ProcId { pid: 300, start_ticks: 14 }), None, "the shell's child stays out");
    // Without the window (a rebuild with no loss) only what the table lacked is adopted.
    let mut w = with_wrapper();
    w.fork(201, 202, 12, "wrapper");
    let before = w.table.clone();
    w.table.upsert(st(201, 11, "wrapper"));
    let asked = w.lineage.reconcile(Some(&before), &w.table, None);
    assert_eq!(asked, [ProcId { pid: 201, start_ticks: 11 }]);
}

/// Hostile: an account that forks faster than the ring buffer drains makes every rebuild re-ask
/// about its whole storm; the window's adoption stays within the caps on pending sessions and
/// nodes, however many processes the window holds, and what it asks about is what it holds.
#[test]
fn a_storms_loss_window_is_adopted_within_the_caps() {
    let mut w = with_wrapper_under(Caps { nodes: 40, pending: 16, sessions: 4, members: 40, reported: 4 });
    // 5,000 processes whose forks from the root were lost; each forked once (delivered).
    for i in 0..5_000u32 {
        w.table.upsert(st(1_000 + 2 * i, 11 + u64::from(i), "storm"));
        w.fork(1_000 + 2 * i, 1_001 + 2 * i, 11 + u64::from(i), "storm");
    }
    let before = w.table.clone();
    let asked = w.lineage.reconcile(Some(&before), &w.table, Some(0));
    let c = w.lineage.counts();
    assert!(c.nodes <= 40 && c.pending <= 16, "{c:?}");
    assert!(asked.len() <= 40, "asked about {} processes", asked.len());
    assert!(c.unclassified_total > 0, "the cap was reached and counted: {c:?}");
    assert!(w.lineage.is_consistent());
}

#[test]
fn a_fork_bomb_under_a_root_is_held_to_the_member_cap_and_the_rest_is_counted_untracked() {
    let mut w = with_wrapper_under(Caps { nodes: 1000, pending: 100, sessions: 4, members: 50, reported: 4 });
    for i in 0..250u32 {
        // The root forks 250; the last of those forks a chain of 250 more.
        w.fork(200, 1000 + i, 100 + u64::from(i), "bomb");
    }
    for i in 0..250u32 {
        w.fork(1000 + 249 + i, 1250 + i, 400 + u64::from(i), "bomb");
    }
    assert_eq!(w.members(200).len(), 50);
    let c = w.lineage.counts();
    // Each refused fork of a tracked parent is counted; a refused process's own forks are
    // outside the lineage altogether.
    assert_eq!(c.untracked_total, 200, "{c:?}");
    assert_eq!(c.nodes, 51, "{c:?}");
}

#[test]
fn the_pending_node_and_session_caps_fail_safe() {
    let caps = Caps { nodes: 10, pending: 3, sessions: 1, members: 10, reported: 1 };
    let mut w = World::with_caps(caps);
    for pid in 1..=5 {
        w.exec(pid, u64::from(pid), "wrapper");
    }
    let c = w.lineage.counts();
    assert_eq!((c.pending, c.unclassified_total), (3, 2), "{c:?}");
    w.classify(&["wrapper"]);
    let c = w.lineage.counts();
    assert_eq!((c.live, c.roots_refused_total), (1, 2), "{c:?}");
    // Nodes: the live root only (the refused ones have no session).
    for pid in 20..40 {
        w.fork(1, pid, u64::from(pid), "x");
    }
    let c = w.lineage.counts();
    assert_eq!(c.nodes, 10, "{c:?}");
    assert_eq!(c.untracked_total, 11, "{c:?}");
}

#[test]
fn the_daemon_itself_and_other_accounts_are_never_tracked() {
    let mut l = Lineage::new(UID, Some(77), Caps::DAEMON);
    l.apply(&Event::State { kind: StateKind::Exec, state: st(77, 1, "guard-user") });
    l.apply(&Event::State { kind: StateKind::Exec, state: ProcState { euid: OTHER, ..st(78, 1, "wrapper") } });
    assert_eq!(l.counts().nodes, 0);
}

#[path = "tests_away.rs"]
mod away;
