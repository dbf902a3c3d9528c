//! The slot rules from events alone (docs/configuration.md `slots`): no kernel, no cgroup.
use std::time::Duration;

use super::slots::{Action, Caps, SlotBook, TreeId, Verdict};
use crate::{
    comm::Comm,
    config::{Slot, SlotMode},
    event::{Event, ProcId, ProcState, StateKind},
    log::{Kind, Line},
};

const UID: u32 = 1000;

fn st(pid: u32, name: &str) -> ProcState {
    ProcState { id: ProcId { pid, start_ticks: u64::from(pid) * 10 }, euid: UID, comm: Comm::new(name.as_bytes()) }
}

fn slot(name: &str, max: u32, mode: SlotMode) -> Slot {
    Slot { name: name.into(), commands: vec!["x".into()], max, max_wait: Duration::from_secs(60), mode }
}

fn book(slots: &[Slot]) -> SlotBook {
    let mut b = SlotBook::new(UID, None, Caps::DAEMON);
    assert!(b.configure(slots, &["bash".into()], false, 0.0).is_empty());
    b
}

/// An exec of `pid` (forked from `parent`, if any) answered with `verdict`: the actions of both.
fn run(b: &mut SlotBook, pid: u32, parent: Option<u32>, name: &str, verdict: Option<&str>, now: f64) -> Vec<Action> {
    let mut out = Vec::new();
    if let Some(pp) = parent {
        out.extend(b.on_event(&Event::Fork { child: st(pid, "sh"), parent_pid: pp }, now));
    }
    let acts = b.on_event(&Event::State { kind: StateKind::Exec, state: st(pid, name) }, now);
    let (tree, seq) = classify_of(&acts);
    out.extend(acts);
    let v = verdict.map_or(Verdict::Other, |s| Verdict::Slot(s.into()));
    out.extend(b.verdict(tree, seq, Comm::new(name.as_bytes()), &v, now));
    out
}

fn classify_of(acts: &[Action]) -> (TreeId, u32) {
    acts.iter()
        .find_map(|a| match a {
            Action::Classify { tree, seq, .. } => Some((*tree, *seq)),
            _ => None,
        })
        .expect("an exec outside a slot tree is classified")
}

fn exit(b: &mut SlotBook, pid: u32, now: f64) -> Vec<Action> {
    b.on_event(&Event::Exit(st(pid, "x").id), now)
}

fn held(acts: &[Action]) -> Vec<u32> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Hold { procs, .. } => Some(procs.iter().map(|p| p.pid).collect::<Vec<_>>()),
            _ => None,
        })
        .flatten()
        .collect()
}

fn lines(acts: &[Action]) -> Vec<String> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Hold { line, .. } | Action::Log(line) | Action::Release { line: Some(line), .. } => {
                Some(line.body())
            }
            _ => None,
        })
        .collect()
}

#[test]
fn max_two_of_six_holds_two_and_starts_the_rest_first_come_first_served() {
    let mut b = book(&[slot("build", 2, SlotMode::Queue)]);
    let mut all = Vec::new();
    for pid in 1..=6 {
        all.extend(run(&mut b, pid, None, "cargo", Some("build"), f64::from(pid)));
    }
    assert_eq!(held(&all), [3, 4, 5, 6], "the third and later wait");
    assert_eq!(
        lines(&all),
        [
            "SLOT_START slot=build pid=1 waited=0s reason=free",
            "SLOT_START slot=build pid=2 waited=0s reason=free",
            "SLOT_WAIT slot=build pid=3 name=cargo position=1 mode=queue",
            "SLOT_WAIT slot=build pid=4 name=cargo position=2 mode=queue",
            "SLOT_WAIT slot=build pid=5 name=cargo position=3 mode=queue",
            "SLOT_WAIT slot=build pid=6 name=cargo position=4 mode=queue",
        ]
    );
    let v = b.view();
    assert_eq!((v.slots[0].holders.len(), v.slots[0].waiting.len()), (2, 4));
    // Holders end one by one: each time the first in line starts, never more than two at once.
    assert_eq!(lines(&exit(&mut b, 2, 20.0)), ["SLOT_START slot=build pid=3 waited=17s reason=turn"]);
    assert_eq!(lines(&exit(&mut b, 1, 21.0)), ["SLOT_START slot=build pid=4 waited=17s reason=turn"]);
    assert!(exit(&mut b, 1, 21.0).is_empty(), "an exit told twice changes nothing");
    assert_eq!(lines(&exit(&mut b, 3, 22.0)), ["SLOT_START slot=build pid=5 waited=17s reason=turn"]);
    assert_eq!(lines(&exit(&mut b, 4, 23.0)), ["SLOT_START slot=build pid=6 waited=17s reason=turn"]);
    assert!(exit(&mut b, 5, 24.0).is_empty() && exit(&mut b, 6, 25.0).is_empty());
    let v = b.view();
    assert!(v.slots[0].holders.is_empty() && v.slots[0].waiting.is_empty() && v.nodes == 0);
    assert_eq!((v.totals.waits, v.totals.wait_secs), (4, 68.0));
}

#[test]
fn report_mode_says_what_would_wait_and_holds_nothing() {
    let mut b = book(&[slot("build", 1, SlotMode::Report)]);
    let mut all = Vec::new();
    for pid in 1..=3 {
        all.extend(run(&mut b, pid, None, "cargo", Some("build"), 1.0));
    }
    assert!(held(&all).is_empty());
    assert_eq!(
        lines(&all),
        [
            "SLOT_START slot=build pid=1 waited=0s reason=free",
            "SLOT_WAIT slot=build pid=2 name=cargo position=1 mode=report",
            "SLOT_WAIT slot=build pid=3 name=cargo position=2 mode=report",
        ]
    );
    assert!(exit(&mut b, 1, 2.0).is_empty(), "nothing waited, nothing starts");
    // A dry run reports whatever the mode says.
    let mut dry = SlotBook::new(UID, None, Caps::DAEMON);
    dry.configure(&[slot("build", 1, SlotMode::Queue)], &[], true, 0.0);
    run(&mut dry, 1, None, "cargo", Some("build"), 1.0);
    assert!(held(&run(&mut dry, 2, None, "cargo", Some("build"), 1.0)).is_empty());
}

#[test]
fn what_a_holder_runs_never_waits_even_when_it_matches_again() {
    let mut b = book(&[slot("build", 1, SlotMode::Queue)]);
    run(&mut b, 1, None, "make", Some("build"), 1.0);
    // `make` runs `make` (a recursive build): part of the holder, not classified at all.
    let acts = b.on_event(&Event::Fork { child: st(2, "make"), parent_pid: 1 }, 2.0);
    assert!(acts.is_empty());
    let acts = b.on_event(&Event::State { kind: StateKind::Exec, state: st(2, "make") }, 2.0);
    assert!(acts.is_empty(), "{acts:?}");
    // Through a shell whose verdict is still to come: it joins the holder once it matches.
    b.on_event(&Event::Fork { child: st(3, "make"), parent_pid: 2 }, 3.0);
    b.on_event(&Event::State { kind: StateKind::Exec, state: st(3, "sh") }, 3.0);
    b.on_event(&Event::Fork { child: st(4, "sh"), parent_pid: 3 }, 3.0);
    assert!(b.on_event(&Event::State { kind: StateKind::Exec, state: st(4, "cargo") }, 3.0).is_empty());
    let v = b.view();
    assert_eq!(v.slots[0].holders.len(), 1);
    assert!(v.slots[0].waiting.is_empty());
    // The holder ends with its last process, not with its head.
    for pid in [1, 2, 3] {
        assert!(exit(&mut b, pid, 4.0).is_empty());
    }
    assert_eq!(b.view().slots[0].holders.len(), 1);
    exit(&mut b, 4, 5.0);
    assert!(b.view().slots[0].holders.is_empty());
}

#[test]
fn a_pending_exec_inside_a_pending_one_is_judged_on_its_own() {
    let mut b = book(&[slot("build", 1, SlotMode::Queue)]);
    run(&mut b, 1, None, "cargo", Some("build"), 1.0);
    // A script's shell, then `cargo build` from it, both still unclassified.
    let sh = b.on_event(&Event::State { kind: StateKind::Exec, state: st(10, "bash") }, 2.0);
    b.on_event(&Event::Fork { child: st(11, "bash"), parent_pid: 10 }, 2.0);
    let cargo = b.on_event(&Event::State { kind: StateKind::Exec, state: st(11, "cargo") }, 2.0);
    let (sh_tree, _) = classify_of(&sh);
    let (cargo_tree, _) = classify_of(&cargo);
    assert!(b.verdict(sh_tree, 0, Comm::new(b"bash"), &Verdict::Other, 2.0).is_empty());
    let acts = b.verdict(cargo_tree, 0, Comm::new(b"cargo"), &Verdict::Slot("build".into()), 2.0);
    assert_eq!(held(&acts), [11], "the shell's own process is no part of it");
}

#[test]
fn forks_of_a_waiting_tree_are_held_too() {
    let mut b = book(&[slot("build", 1, SlotMode::Queue)]);
    run(&mut b, 1, None, "cargo", Some("build"), 1.0);
    // It forked before its verdict came: the child is part of the tree.
    b.on_event(&Event::State { kind: StateKind::Exec, state: st(2, "cargo") }, 2.0);
    b.on_event(&Event::Fork { child: st(3, "cargo"), parent_pid: 2 }, 2.0);
    let acts = b.verdict(2, 0, Comm::new(b"cargo"), &Verdict::Slot("build".into()), 2.0);
    assert_eq!(held(&acts), [2, 3]);
    // And one whose fork raced the freeze is held as soon as the fork is seen.
    let acts = b.on_event(&Event::Fork { child: st(4, "cargo"), parent_pid: 3 }, 2.5);
    assert_eq!(acts, [Action::HoldMore { tree: 2, procs: vec![st(4, "x").id] }]);
}

#[test]
fn max_wait_lets_a_waiting_command_go_and_says_so() {
    let mut b = book(&[slot("build", 1, SlotMode::Queue)]);
    run(&mut b, 1, None, "cargo", Some("build"), 0.0);
    run(&mut b, 2, None, "cargo", Some("build"), 10.0);
    run(&mut b, 3, None, "cargo", Some("build"), 20.0);
    assert_eq!(b.next_deadline(), Some(70.0));
    assert!(b.on_time(69.9).is_empty());
    let acts = b.on_time(70.0);
    assert_eq!(lines(&acts), ["SLOT_TIMEOUT slot=build pid=2 waited=60s"]);
    assert!(matches!(acts[0], Action::Release { tree: 2, .. }));
    assert_eq!(b.next_deadline(), Some(80.0));
    assert_eq!(b.view().slots[0].holders.len(), 2, "let go, it holds the slot (over max) while it runs");
    // The first holder's end does not start the third: two still hold a slot of one.
    assert!(exit(&mut b, 1, 75.0).is_empty());
    assert_eq!(lines(&exit(&mut b, 2, 76.0)), ["SLOT_START slot=build pid=3 waited=56s reason=turn"]);
    assert_eq!((b.view().totals.timeouts, b.next_deadline()), (1, None));
}

#[test]
fn excluded_names_commands_and_other_accounts_never_wait() {
    let mut b = book(&[slot("build", 1, SlotMode::Queue)]);
    run(&mut b, 1, None, "cargo", Some("build"), 1.0);
    // Its name is in excludes (compared ignoring case).
    let acts = run(&mut b, 2, None, "BASH", Some("build"), 1.0);
    assert!(held(&acts).is_empty() && lines(&acts).is_empty());
    // The classifier says Other for a command matching excludeCommands.
    assert!(held(&run(&mut b, 3, None, "cargo", None, 1.0)).is_empty());
    // Another account's exec opens nothing, and neither does a fork into it.
    let other = ProcState { euid: UID + 1, ..st(4, "cargo") };
    assert!(b.on_event(&Event::State { kind: StateKind::Exec, state: other }, 1.0).is_empty());
    assert!(b.on_event(&Event::Fork { child: other, parent_pid: 1 }, 1.0).is_empty());
    assert_eq!(b.view().nodes, 1, "only the holder's own process");
}

#[test]
fn the_verdict_of_an_earlier_exec_counts_when_it_names_a_slot() {
    let mut b = book(&[slot("build", 1, SlotMode::Queue)]);
    run(&mut b, 1, None, "cargo", Some("build"), 1.0);
    // `npm` runs through `env node`: the second exec's name is excluded, the first matched.
    let first = b.on_event(&Event::State { kind: StateKind::Exec, state: st(2, "npm") }, 2.0);
    let second = b.on_event(&Event::State { kind: StateKind::Exec, state: st(2, "bash") }, 2.0);
    assert_eq!((classify_of(&first).1, classify_of(&second).1), (0, 1));
    let acts = b.verdict(2, 0, Comm::new(b"npm"), &Verdict::Slot("build".into()), 2.0);
    assert_eq!(held(&acts), [2]);
    assert!(b.verdict(2, 1, Comm::new(b"bash"), &Verdict::Other, 2.0).is_empty());
    // A stale "no" waits for the latest exec's answer (`sh -c 'exec cargo build'`).
    let sh = b.on_event(&Event::State { kind: StateKind::Exec, state: st(3, "sh") }, 3.0);
    b.on_event(&Event::State { kind: StateKind::Exec, state: st(3, "cargo") }, 3.0);
    let (tree, _) = classify_of(&sh);
    assert!(b.verdict(tree, 0, Comm::new(b"sh"), &Verdict::Other, 3.0).is_empty());
    assert_eq!(held(&b.verdict(tree, 1, Comm::new(b"cargo"), &Verdict::Slot("build".into()), 3.0)), [3]);
}

#[test]
fn a_waiting_command_killed_by_its_parent_leaves_the_queue_cleanly() {
    let mut b = book(&[slot("build", 1, SlotMode::Queue)]);
    run(&mut b, 1, None, "cargo", Some("build"), 0.0);
    run(&mut b, 2, None, "cargo", Some("build"), 0.0);
    run(&mut b, 3, None, "cargo", Some("build"), 0.0);
    assert_eq!(exit(&mut b, 2, 5.0), [Action::Release { tree: 2, line: None }]);
    assert_eq!(b.view().slots[0].waiting.iter().map(|t| t.head.id.pid).collect::<Vec<_>>(), [3]);
    // A signal waiting for a process of a tree lets it go at once, to act on it.
    assert_eq!(lines(&b.signalled(3, 6.0)), ["SLOT_START slot=build pid=3 waited=6s reason=signal"]);
    assert!(b.signalled(3, 6.0).is_empty());
}

#[test]
fn turning_slots_off_or_down_lets_every_waiting_command_go() {
    let mut b = book(&[slot("build", 1, SlotMode::Queue), slot("test", 1, SlotMode::Queue)]);
    for (pid, s) in [(1, "build"), (2, "build"), (3, "test"), (4, "test"), (5, "test")] {
        run(&mut b, pid, None, "cargo", Some(s), 0.0);
    }
    // `test` raised to 2: its first in line starts; `build` gone: its waiting one goes.
    let acts = b.configure(&[slot("test", 2, SlotMode::Queue)], &[], false, 9.0);
    assert_eq!(
        lines(&acts),
        ["SLOT_START slot=build pid=2 waited=9s reason=config", "SLOT_START slot=test pid=4 waited=9s reason=turn"]
    );
    let v = b.view();
    assert_eq!((v.slots.len(), v.slots[0].holders.len(), v.slots[0].waiting.len()), (1, 2, 1));
    // report only now: what waits goes.
    let acts = b.configure(&[slot("test", 2, SlotMode::Report)], &[], false, 10.0);
    assert_eq!(lines(&acts), ["SLOT_START slot=test pid=5 waited=10s reason=config"]);
    b.configure(&[slot("test", 1, SlotMode::Queue)], &[], false, 11.0);
    run(&mut b, 6, None, "cargo", Some("test"), 11.0);
    // Off: everything goes, and the book forgets all.
    let acts = b.configure(&[], &[], false, 12.0);
    assert_eq!(lines(&acts), ["SLOT_START slot=test pid=6 waited=1s reason=config"]);
    assert!(!b.is_on() && b.view().nodes == 0);
    assert!(b.on_event(&Event::State { kind: StateKind::Exec, state: st(7, "cargo") }, 13.0).is_empty());
}

#[test]
fn the_waiting_cap_runs_the_rest_at_once_and_says_so_once() {
    let mut b = SlotBook::new(UID, None, Caps { waiting: 2, ..Caps::DAEMON });
    b.configure(&[slot("build", 1, SlotMode::Queue)], &[], false, 0.0);
    let mut all = Vec::new();
    for pid in 1..=5 {
        all.extend(run(&mut b, pid, None, "cargo", Some("build"), 0.0));
    }
    assert_eq!(held(&all), [2, 3]);
    let warns: Vec<String> = lines(&all).into_iter().filter(|l| l.starts_with("WARN")).collect();
    assert_eq!(warns, ["WARN slots_cap what=waiting limit=2"]);
    assert_eq!(b.view().totals.over_cap, 2);
    // The daemon stops: everything waiting goes.
    let acts = b.release_all(3.0, "stop");
    assert_eq!(
        acts.iter()
            .filter(|a| matches!(a, Action::Release { line: Some(l), .. } if l.kind() == Kind::SlotStart))
            .count(),
        2
    );
}

#[test]
fn a_rebuild_ends_the_trees_whose_exits_were_lost() {
    let mut b = book(&[slot("build", 1, SlotMode::Queue)]);
    run(&mut b, 1, None, "cargo", Some("build"), 0.0);
    run(&mut b, 2, None, "cargo", Some("build"), 0.0);
    let acts = b.reconcile(&|id| id.pid != 1, 4.0);
    assert_eq!(lines(&acts), ["SLOT_START slot=build pid=2 waited=4s reason=turn"]);
    // A pid reused since its exit was lost is another process: its exec ends the old node.
    let reused = ProcState { id: ProcId { pid: 2, start_ticks: 999 }, ..st(2, "ls") };
    let acts = b.on_event(&Event::State { kind: StateKind::Exec, state: reused }, 5.0);
    assert!(matches!(acts.as_slice(), [Action::Classify { .. }]), "{acts:?}");
    assert!(b.view().slots[0].holders.is_empty());
}

#[test]
fn a_line_never_lets_a_command_name_pose_as_a_key() {
    let mut b = book(&[slot("build", 1, SlotMode::Queue)]);
    run(&mut b, 1, None, "cargo", Some("build"), 0.0);
    let acts = run(&mut b, 2, None, "x position=9\n", Some("build"), 0.0);
    let line = lines(&acts).pop().unwrap();
    assert_eq!(line, r#"SLOT_WAIT slot=build pid=2 name="x position=9\n" position=1 mode=queue"#);
    assert!(matches!(&acts[..], [.., Action::Hold { line: Line::SlotWait { .. }, .. }]));
}

/// `heavyjob -c 'sleep 3; true'`: the shell forks `sleep` and the child execs before either
/// verdict came. The child's exec is judged on its own (no slot's), then goes back into the
/// shell's tree: held with it, whichever verdict comes first, so a waiting command's work waits.
#[test]
fn a_child_that_execs_before_the_verdicts_waits_with_its_tree() {
    for child_first in [false, true] {
        let mut b = book(&[slot("build", 1, SlotMode::Queue)]);
        run(&mut b, 1, None, "heavyjob", Some("build"), 1.0);
        let shell = b.on_event(&Event::State { kind: StateKind::Exec, state: st(10, "heavyjob") }, 2.0);
        b.on_event(&Event::Fork { child: st(11, "heavyjob"), parent_pid: 10 }, 2.0);
        let child = b.on_event(&Event::State { kind: StateKind::Exec, state: st(11, "sleep") }, 2.0);
        let ((shell_tree, _), (child_tree, _)) = (classify_of(&shell), classify_of(&child));
        let shell_verdict = |b: &mut SlotBook| b.verdict(shell_tree, 0, Comm::new(b"heavyjob"), &Verdict::Slot("build".into()), 2.0);
        let child_verdict = |b: &mut SlotBook| b.verdict(child_tree, 0, Comm::new(b"sleep"), &Verdict::Other, 2.0);
        let held_pids: Vec<u32> = if child_first {
            assert!(child_verdict(&mut b).is_empty(), "its shell's tree does not wait yet");
            held(&shell_verdict(&mut b))
        } else {
            let first = held(&shell_verdict(&mut b));
            let more: Vec<u32> = child_verdict(&mut b)
                .iter()
                .flat_map(|a| match a {
                    Action::HoldMore { tree, procs } if *tree == shell_tree => procs.iter().map(|p| p.pid).collect(),
                    _ => Vec::new(),
                })
                .collect();
            first.into_iter().chain(more).collect()
        };
        assert_eq!(held_pids, [10, 11], "child's verdict first: {child_first}");
        // The holder ends: the shell's tree starts, one turn for one end.
        let started = lines(&exit(&mut b, 1, 5.0));
        assert_eq!(started, ["SLOT_START slot=build pid=10 waited=3s reason=turn"]);
    }
}
