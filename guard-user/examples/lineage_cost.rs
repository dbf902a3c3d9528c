//! What the session lineage costs the pump (docs/BENCH.md): events per second applied to the
//! table alone and to the table plus the lineage, and the heap the lineage holds at 10,000
//! tracked processes (one root session of 10,000 members; 10,000 execs awaiting classification).
//! Pure user-space work on synthetic events, no kernel:
//! `cargo run --release -p guard-user --example lineage_cost`.
use std::time::Instant;

use guard::{
    comm::Comm,
    event::{Event, ProcId, ProcState, StateKind},
    lineage::{Caps, Lineage, LineageCmd},
    table::{ProcessTable, Scope},
};

const UID: u32 = 4299;

fn st(pid: u32, start: u64, name: &[u8]) -> ProcState {
    ProcState { id: ProcId { pid, start_ticks: start }, euid: UID, comm: Comm::new(name) }
}

/// Heap bytes in use (glibc's mallinfo2: the arena's allocated bytes plus mmap'ed blocks, where
/// large tables go).
fn heap() -> usize {
    // SAFETY: mallinfo2 has no preconditions.
    let m = unsafe { libc::mallinfo2() };
    m.uordblks + m.hblkhd
}

/// The bench's storm, as events: a worker forks a child that execs and exits, `n` times.
fn storm(n: u32) -> Vec<Event> {
    let mut out = Vec::with_capacity(n as usize * 3);
    for i in 0..n {
        let pid = 10_000 + i % 50_000;
        let start = 1_000 + u64::from(i);
        out.push(Event::Fork { child: st(pid, start, b"worker"), parent_pid: 200 });
        out.push(Event::State { kind: StateKind::Exec, state: st(pid, start, b"true") });
        out.push(Event::Exit(ProcId { pid, start_ticks: start }));
    }
    out
}

fn main() {
    // A shell and a worker of the account, the worker inside a root's session (the worst case:
    // every forked child gets a node).
    let setup = [
        Event::State { kind: StateKind::Exec, state: st(100, 1, b"bash") },
        Event::State { kind: StateKind::Exec, state: st(150, 2, b"wrapper") },
        Event::Fork { child: st(200, 3, b"wrapper"), parent_pid: 150 },
    ];
    let events = storm(1_000_000);

    let mut table = ProcessTable::new(Scope::account(UID));
    let t = Instant::now();
    for e in setup.iter().chain(&events) {
        table.apply(e);
    }
    let alone = events.len() as f64 / t.elapsed().as_secs_f64();

    let mut table = ProcessTable::new(Scope::account(UID));
    let mut lineage = Lineage::new(UID, None, Caps::DAEMON);
    for e in &setup {
        table.apply(e);
        lineage.apply(e);
    }
    let v = lineage.view(&table, usize::MAX);
    for c in v.candidates {
        lineage.command(LineageCmd::Classified { session: c.session, root: c.process.comm == Comm::new(b"wrapper") });
    }
    let t = Instant::now();
    for e in &events {
        table.apply(e);
        lineage.apply(e);
    }
    let with = events.len() as f64 / t.elapsed().as_secs_f64();
    println!("events/s, table alone:        {:>12.0}", alone);
    println!("events/s, table + lineage:    {:>12.0}  ({:.2}x the time)", with, alone / with);

    // 10,000 live members of one root session.
    let before = heap();
    for i in 0..10_000u32 {
        let e = Event::Fork { child: st(100_000 + i, 5_000_000 + u64::from(i), b"gbsleep"), parent_pid: 200 };
        lineage.apply(&e);
    }
    let members = heap() - before;
    println!(
        "heap for 10,000 session members: {:.2} MiB ({} bytes each)",
        members as f64 / 1048576.0,
        members / 10_000
    );
    // 10,000 execs awaiting classification (each opens a pending session).
    let mut fresh = Lineage::new(UID, None, Caps::DAEMON);
    let before = heap();
    for i in 0..10_000u32 {
        fresh.apply(&Event::State { kind: StateKind::Exec, state: st(300_000 + i, 6_000_000 + u64::from(i), b"x") });
    }
    let pending = heap() - before;
    println!(
        "heap for 10,000 pending execs:   {:.2} MiB ({} bytes each)",
        pending as f64 / 1048576.0,
        pending / 10_000
    );
    println!("lineage counts: {:?}", lineage.counts());
}
