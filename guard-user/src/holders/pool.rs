//! Reading many processes on a few threads, none of which can hold the command up for good.
//!
//! Most `/proc` reads return at once, but some wait on the process: `maps` and `cmdline` take its
//! memory-map lock, and a lookup of a file's parent walks real filesystems (a hung NFS or FUSE
//! server). So every item is read on a worker thread that reports progress (each fd, mapping
//! or thread read), and a worker that makes none for `stall` is left behind: its item is
//! reported as not read, a fresh worker takes the next one, and its own result, should it
//! ever come, is dropped. At most `max_abandoned` workers are left behind; past that the items
//! not yet started are reported as not read too, so the command always ends.
use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Condvar, Mutex, MutexGuard,
    },
    time::{Duration, Instant},
};

/// A worker's sign of life: bumped for every unit of work on its current item.
#[derive(Default)]
pub struct Progress(AtomicU64);

impl Progress {
    pub fn tick(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// What became of one item.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome<R> {
    Done(R),
    /// Its worker made no progress for the stall time: left behind.
    Stalled,
    /// Never started: too many workers were left behind already.
    NotStarted,
}

/// One worker's slot, watched by the caller's thread.
#[derive(Default)]
struct Slot {
    /// The item it is on, `usize::MAX` between items.
    item: AtomicUsize,
    progress: Progress,
    abandoned: AtomicBool,
}

/// The bounds of one run.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    pub workers: usize,
    pub stall: Duration,
    pub max_abandoned: usize,
}

type Work<T, R> = Arc<dyn Fn(&T, &Progress) -> R + Send + Sync>;

/// Each item's outcome so far (`None`: pending) and how many are pending.
struct Board<R> {
    outcomes: Vec<Option<Outcome<R>>>,
    pending: usize,
}

impl<R> Board<R> {
    /// Settles item `i` unless it already is; true when it was pending.
    fn settle(&mut self, i: usize, outcome: Outcome<R>) -> bool {
        if self.outcomes[i].is_some() {
            return false;
        }
        self.outcomes[i] = Some(outcome);
        self.pending -= 1;
        true
    }
}

struct Shared<T, R> {
    items: Vec<T>,
    next: AtomicUsize,
    work: Work<T, R>,
    /// Written by the workers as they finish, read by the caller's thread: it wakes when all
    /// are settled, or every 50 ms to watch the workers (not once per item: 2,000 items would
    /// be 2,000 context switches).
    board: Mutex<Board<R>>,
    settled: Condvar,
}

fn lock<R>(b: &Mutex<Board<R>>) -> MutexGuard<'_, Board<R>> {
    b.lock().unwrap_or_else(|p| p.into_inner())
}

fn spawn_worker<T, R>(shared: &Arc<Shared<T, R>>) -> Option<Arc<Slot>>
where
    T: Send + Sync + 'static,
    R: Send + 'static,
{
    let slot = Arc::new(Slot { item: AtomicUsize::new(usize::MAX), ..Slot::default() });
    let (s, sh) = (slot.clone(), shared.clone());
    let spawned = std::thread::Builder::new().name("guard-holders".into()).spawn(move || loop {
        if s.abandoned.load(Ordering::SeqCst) {
            return;
        }
        let i = sh.next.fetch_add(1, Ordering::SeqCst);
        if i >= sh.items.len() {
            return;
        }
        s.item.store(i, Ordering::SeqCst);
        let r = (sh.work)(&sh.items[i], &s.progress);
        if s.abandoned.load(Ordering::SeqCst) {
            return;
        }
        let mut board = lock(&sh.board);
        board.settle(i, Outcome::Done(r));
        if board.pending == 0 {
            sh.settled.notify_all();
        }
        drop(board);
        s.item.store(usize::MAX, Ordering::SeqCst);
    });
    spawned.ok().map(|_| slot)
}

/// Runs `work` on every item (see the module doc); outcomes in the items' order.
pub fn run<T, R>(items: Vec<T>, bounds: Bounds, work: Work<T, R>) -> Vec<Outcome<R>>
where
    T: Send + Sync + 'static,
    R: Send + 'static,
{
    let n = items.len();
    let board = Board { outcomes: (0..n).map(|_| None).collect(), pending: n };
    let shared =
        Arc::new(Shared { items, next: AtomicUsize::new(0), work, board: Mutex::new(board), settled: Condvar::new() });
    // (slot, item and progress last seen, since when)
    let mut watched: Vec<(Arc<Slot>, (usize, u64), Instant)> = Vec::new();
    for _ in 0..bounds.workers.max(1) {
        if let Some(s) = spawn_worker(&shared) {
            watched.push((s, (usize::MAX, 0), Instant::now()));
        }
    }
    let mut abandoned = 0;
    loop {
        let board = lock(&shared.board);
        let (board, _) = shared
            .settled
            .wait_timeout_while(board, Duration::from_millis(50), |b| b.pending > 0)
            .unwrap_or_else(|p| p.into_inner());
        if board.pending == 0 {
            break;
        }
        drop(board);
        let now = Instant::now();
        let mut replace = 0;
        for (slot, seen, since) in &mut watched {
            let now_seen = (slot.item.load(Ordering::SeqCst), slot.progress.0.load(Ordering::Relaxed));
            if now_seen != *seen || now_seen.0 == usize::MAX {
                (*seen, *since) = (now_seen, now);
            } else if now.duration_since(*since) >= bounds.stall {
                slot.abandoned.store(true, Ordering::SeqCst);
                abandoned += 1;
                replace += 1;
                lock(&shared.board).settle(now_seen.0, Outcome::Stalled);
            }
        }
        watched.retain(|(s, _, _)| !s.abandoned.load(Ordering::SeqCst));
        if abandoned >= bounds.max_abandoned {
            // Nothing more is handed out: what was not started never will be.
            let from = shared.next.swap(usize::MAX / 2, Ordering::SeqCst).min(n);
            let mut board = lock(&shared.board);
            for i in from..n {
                board.settle(i, Outcome::NotStarted);
            }
            replace = 0;
        }
        for _ in 0..replace {
            if let Some(s) = spawn_worker(&shared) {
                watched.push((s, (usize::MAX, 0), Instant::now()));
            }
        }
        if watched.is_empty() {
            // No worker left (none could be started again): the rest is not read.
            let mut board = lock(&shared.board);
            for i in 0..n {
                board.settle(i, Outcome::NotStarted);
            }
            break;
        }
    }
    let mut board = lock(&shared.board);
    std::mem::take(&mut board.outcomes).into_iter().map(|o| o.unwrap_or(Outcome::NotStarted)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds(stall_ms: u64, max_abandoned: usize) -> Bounds {
        Bounds { workers: 2, stall: Duration::from_millis(stall_ms), max_abandoned }
    }

    #[test]
    fn every_item_is_done_in_order() {
        let out = run((0..1000u32).collect(), bounds(5000, 4), Arc::new(|x: &u32, _: &Progress| x * 2));
        assert_eq!(out, (0..1000u32).map(|x| Outcome::Done(x * 2)).collect::<Vec<_>>());
    }

    #[test]
    fn an_item_that_blocks_is_left_behind_and_the_rest_is_read() {
        // Item 3 blocks for good (a /proc read that never returns); item 5 is slow but
        // progressing (a process with very many fds), so it is waited for.
        let (_hold, block) = std::sync::mpsc::channel::<()>();
        let block = Arc::new(std::sync::Mutex::new(block));
        let work = move |x: &u32, p: &Progress| {
            if *x == 3 {
                let _ = block.lock().unwrap().recv();
            }
            if *x == 5 {
                for _ in 0..30 {
                    std::thread::sleep(Duration::from_millis(20));
                    p.tick();
                }
            }
            *x
        };
        let out = run((0..10u32).collect(), bounds(300, 4), Arc::new(work));
        for (i, o) in out.iter().enumerate() {
            let want = if i == 3 { Outcome::Stalled } else { Outcome::Done(i as u32) };
            assert_eq!(*o, want, "item {i}");
        }
    }

    #[test]
    fn past_the_cap_of_abandoned_workers_nothing_more_is_started() {
        // Every item blocks for good: the two workers are left behind (a replacement may start
        // one more item before the second is), then nothing more is started.
        let work = |_: &u32, _: &Progress| -> u32 {
            loop {
                std::thread::park();
            }
        };
        let out = run((0..6u32).collect(), bounds(200, 2), Arc::new(work));
        let stalled = out.iter().filter(|o| **o == Outcome::Stalled).count();
        assert!((2..=3).contains(&stalled), "{out:?}");
        assert_eq!(out.iter().filter(|o| **o == Outcome::NotStarted).count(), 6 - stalled, "{out:?}");
    }
}
