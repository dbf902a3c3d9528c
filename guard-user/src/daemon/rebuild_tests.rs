use super::*;
use crate::{
    comm::Comm,
    event::{ProcId, StateKind},
};

const SCOPE: Scope = Scope { account: 1000, ignore_pid: None };

fn st(pid: u32, start: u64, name: &str) -> ProcState {
    ProcState { id: ProcId { pid, start_ticks: start }, euid: 1000, comm: Comm::new(name.as_bytes()) }
}

fn body(l: &Option<Line>) -> Option<String> {
    l.as_ref().map(Line::body)
}

#[test]
fn start_up_replays_what_happened_during_the_scan_and_becomes_ready() {
    let mut r = Rebuilder::new();
    assert_eq!(r.start_up(), Step::Scan);
    assert!(!r.ready());
    // During the scan: 11 is born (the scan missed it), 10 exits (the scan saw it).
    r.on_events(&[
        Event::Fork { child: st(11, 5, "x"), parent_pid: 1 },
        Event::Exit(ProcId { pid: 10, start_ticks: 1 }),
    ]);
    let f = r.on_scan(&ProcessTable::new(SCOPE), Ok(vec![st(10, 1, "a"), st(12, 2, "b")]), SCOPE);
    assert!(r.ready() && !r.scanning());
    let t = f.table.unwrap();
    assert_eq!(t, ProcessTable::from_snapshot(vec![st(11, 5, "x"), st(12, 2, "b")], SCOPE));
    assert_eq!(body(&f.resync).as_deref(), Some("RESYNC reason=startup lost=0"));
    assert_eq!(f.next, Step::Nothing);
}

#[test]
fn losses_during_a_scan_ask_for_another_scan_after_it() {
    let mut r = Rebuilder::new();
    r.start_up();
    assert_eq!(r.on_lost(3), Step::Nothing, "a scan is running: queue, do not abandon it");
    assert_eq!(r.on_lost(2), Step::Nothing);
    let f = r.on_scan(&ProcessTable::new(SCOPE), Ok(vec![]), SCOPE);
    assert_eq!(f.next, Step::Scan);
    let f = r.on_scan(&ProcessTable::new(SCOPE), Ok(vec![]), SCOPE);
    assert_eq!(body(&f.resync).as_deref(), Some("RESYNC reason=lost_events lost=5"));
    assert_eq!(f.next, Step::Nothing);
}

#[test]
fn an_audit_logs_only_when_the_table_had_drifted() {
    let mut r = Rebuilder::new();
    r.start_up();
    let live = r.on_scan(&ProcessTable::new(SCOPE), Ok(vec![st(10, 1, "a")]), SCOPE).table.unwrap();
    assert_eq!(r.on_audit(), Step::Scan);
    let f = r.on_scan(&live, Ok(vec![st(10, 1, "a")]), SCOPE);
    assert!(f.resync.is_none(), "no drift, no line");
    assert_eq!(r.on_audit(), Step::Scan);
    let f = r.on_scan(&live, Ok(vec![st(10, 1, "renamed")]), SCOPE);
    assert_eq!(body(&f.resync).as_deref(), Some("RESYNC reason=drift lost=0"));
}

#[test]
fn a_failed_start_up_scan_is_retried_and_nothing_is_ready_meanwhile() {
    let mut r = Rebuilder::new();
    r.start_up();
    let f = r.on_scan(&ProcessTable::new(SCOPE), Err(io::Error::other("EMFILE")), SCOPE);
    assert!(f.failed.is_some() && f.table.is_none());
    assert_eq!(f.next, Step::Scan);
    assert!(!r.ready());
}

#[test]
fn too_many_recorded_events_restart_the_scan_with_the_same_reason() {
    let mut r = Rebuilder::with_max_recorded(2);
    r.on_lost(7);
    let ev = Event::State { kind: StateKind::Exec, state: st(10, 1, "a") };
    assert_eq!(r.on_events(&[ev, ev]), Step::Nothing);
    assert_eq!(r.on_events(&[ev]), Step::Scan, "over the cap: restart");
    let f = r.on_scan(&ProcessTable::new(SCOPE), Ok(vec![]), SCOPE);
    assert_eq!(body(&f.resync).as_deref(), Some("RESYNC reason=lost_events lost=7"));
    assert_eq!(f.table.unwrap().len(), 0, "the events recorded before the restart are not replayed");
}

#[test]
fn an_audit_while_scanning_and_a_stray_scan_result_change_nothing() {
    let mut r = Rebuilder::new();
    r.start_up();
    assert_eq!(r.on_audit(), Step::Nothing);
    r.on_scan(&ProcessTable::new(SCOPE), Ok(vec![]), SCOPE);
    let f = r.on_scan(&ProcessTable::new(SCOPE), Ok(vec![st(1, 1, "x")]), SCOPE);
    assert!(f.table.is_none() && f.resync.is_none());
}

#[test]
fn a_loss_hands_the_lineage_the_window_its_lost_processes_can_date_from_once() {
    let mut r = Rebuilder::new();
    r.start_up();
    r.on_scan(&ProcessTable::new(SCOPE), Ok(vec![]), SCOPE);
    let margin = LOSS_MARGIN_SECS * crate::event::clock_ticks_per_sec();
    let fork = |pid, start| Event::Fork { child: st(pid, start, "x"), parent_pid: 1 };
    // Read clean after a process started at margin + 50; then one at margin + 90, then a loss.
    r.on_events(&[fork(10, margin + 20), fork(11, margin + 50)]);
    assert_eq!(r.on_lost(0), Step::Nothing);
    r.on_events(&[fork(12, margin + 90)]);
    assert_eq!(r.on_lost(4), Step::Scan);
    // More loss while it scans: the window keeps its earliest start, and goes with the last scan.
    r.on_events(&[fork(13, margin + 120)]);
    assert_eq!(r.on_lost(1), Step::Nothing);
    let f = r.on_scan(&ProcessTable::new(SCOPE), Ok(vec![]), SCOPE);
    assert_eq!((f.next, f.adopt_since), (Step::Scan, None), "another scan follows: not yet");
    let f = r.on_scan(&ProcessTable::new(SCOPE), Ok(vec![]), SCOPE);
    assert_eq!(f.adopt_since, Some(50), "the newest start at the last clean read, less the margin");
    // Handed once: an audit after it asks nothing of the lineage.
    assert_eq!(r.on_audit(), Step::Scan);
    assert_eq!(r.on_scan(&ProcessTable::new(SCOPE), Ok(vec![]), SCOPE).adopt_since, None);
    // A loss before any clean read reaches back to the start.
    let mut r = Rebuilder::new();
    r.start_up();
    r.on_scan(&ProcessTable::new(SCOPE), Ok(vec![]), SCOPE);
    r.on_events(&[fork(10, 5)]);
    r.on_lost(2);
    assert_eq!(r.on_scan(&ProcessTable::new(SCOPE), Ok(vec![]), SCOPE).adopt_since, Some(0));
}

/// What the pump applied before the scan started is what the scan reads: a fork from then is
/// not replayed over it (its child, which the scan left out, had exited, its exit lost), while
/// an exit from then is (a process can still show a moment after its exit was reported). What
/// comes after the start is replayed whole.
#[test]
fn of_what_came_before_the_scan_started_only_exits_are_replayed() {
    let mut r = Rebuilder::new();
    r.start_up();
    r.on_scan(&ProcessTable::new(SCOPE), Ok(vec![st(10, 1, "a")]), SCOPE);
    assert_eq!(r.on_lost(4), Step::Scan);
    // Queued before the scan: a storm child whose exit was lost, and 10's exit.
    r.on_events(&[
        Event::Fork { child: st(20, 7, "storm"), parent_pid: 10 },
        Event::Exit(ProcId { pid: 10, start_ticks: 1 }),
    ]);
    r.scan_starting();
    // During the scan: 21 is born after the scan passed its pid.
    r.on_events(&[Event::Fork { child: st(21, 9, "new"), parent_pid: 1 }]);
    // The scan still saw 10 (exiting), not 20 (gone) nor 21 (too late).
    let f = r.on_scan(&ProcessTable::new(SCOPE), Ok(vec![st(10, 1, "a"), st(30, 2, "b")]), SCOPE);
    let t = f.table.unwrap();
    assert_eq!(t, ProcessTable::from_snapshot(vec![st(21, 9, "new"), st(30, 2, "b")], SCOPE));
}
