//! Budgets for what guard reads from the account (docs/architecture.md, "Bounds").
//!
//! The account decides how much there is to read: its command lines (up to the kernel's exec
//! limit each, shared by as many forks as it likes), its `/proc` files, its config and state
//! files, and whatever answers on a loopback port it can listen on. None of that may decide how
//! much the daemon holds or how long it reads. So every reader of account data reads through a
//! [`Budget`]: at most so many bytes, by a deadline, in chunks of at most [`CHUNK`] bytes with
//! the clock checked between them, and what it keeps for later is charged to a [`Pool`] for as
//! long as it is kept. A reader that runs out stops and says why ([`Stop`]); the caller decides
//! what that means (a command line not read in time protects its process for this tick, a Redis
//! reply over its budget closes the connection), and nothing is ever allocated the size the
//! account announces.
//!
//! | reader | budget |
//! |---|---|
//! | a command line (`/proc/PID/cmdline`) | 1 MiB + 1 byte (a longer one is protected as too long), read in 16 KiB chunks: [`crate::procfs::read_cmdline`] |
//! | the tick's command-line reads | by [`crate::daemon::verdicts`]' read deadline (a share of the tick), each read at most a quarter of it |
//! | command lines held for the matcher | [`HELD_CMDLINE_BYTES`] at one time ([`Pool`]): a full pool is matched and dropped before more are kept |
//! | `/proc/PID/stat`, `/proc/PID/status` | [`PROC_FILE_BYTES`] each |
//! | the config, the state file, the status file | 1 MiB, 4 MiB, 16 MiB (`safefs::read_account_file`) |
//! | one Redis reply | [`crate::mirror::resp::REPLY_BYTES`] (64 KiB), its bytes and 32 bytes per value it holds |
use std::{
    io::{self, Read},
    ops::Deref,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Instant,
};

/// The most a reader takes in one `read`: the clock is looked at between two. A command line is
/// read from the process's memory a page at a time under its memory map's lock, which the
/// process itself can hold for long (e.g. `mprotect` on a large mapping in a loop: ~8 ms per
/// page measured with 8 GiB mapped), so a smaller chunk bounds how far past its deadline one
/// read can go.
pub const CHUNK: usize = 16 << 10;

/// Command-line bytes the daemon holds at one time while they wait for the matcher. Four of the
/// longest command lines it matches (1 MiB); a full pool is matched and its texts dropped before
/// more are read, so more command lines only cost more rounds, never more memory.
pub const HELD_CMDLINE_BYTES: usize = 4 << 20;

/// A `/proc/PID/stat` line is about 300 bytes (a kernel thread's name is at most 64); `status`
/// has its `Uid:` line in its first few hundred. Read more and the scan learns nothing new.
pub const PROC_FILE_BYTES: usize = 4 << 10;

/// Why a read stopped before its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The budget's bytes are spent.
    Bytes,
    /// Its deadline passed.
    Time,
}

/// How a [`Budget::fill`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fill {
    /// The source ended: the buffer holds all of it.
    Whole,
    /// The buffer holds `cap` bytes and the source may go on.
    Full,
    /// The budget stopped the read; the buffer holds what was read.
    Stopped(Stop),
}

/// What one reader may still read: bytes, and until when.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    left: usize,
    ends: Option<Instant>,
}

impl Budget {
    /// At most `n` bytes, with no deadline.
    pub const fn bytes(n: usize) -> Budget {
        Budget { left: n, ends: None }
    }

    /// No byte limit of its own, until `ends` (the caller caps each read with `fill`'s `cap`).
    pub const fn until(ends: Instant) -> Budget {
        Budget { left: usize::MAX, ends: Some(ends) }
    }

    /// This budget, ending at `ends` at the latest.
    pub fn ending(self, ends: Instant) -> Budget {
        Budget { ends: Some(self.ends.map_or(ends, |e| e.min(ends))), ..self }
    }

    /// Bytes still allowed.
    pub fn left(&self) -> usize {
        self.left
    }

    /// When reading must stop, if it must.
    #[cfg(test)]
    pub fn ends(&self) -> Option<Instant> {
        self.ends
    }

    /// Takes `n` bytes from the budget, or says it cannot (and takes nothing).
    pub fn charge(&mut self, n: usize) -> Result<(), Stop> {
        self.left = self.left.checked_sub(n).ok_or(Stop::Bytes)?;
        Ok(())
    }

    /// Whether the deadline passed.
    pub fn in_time(&self) -> Result<(), Stop> {
        match self.ends {
            Some(ends) if Instant::now() >= ends => Err(Stop::Time),
            _ => Ok(()),
        }
    }

    /// Reads `r` into `buf` (emptied first): at most `cap` bytes, in chunks of at most
    /// [`CHUNK`], each charged to the budget, the deadline checked before each. The buffer grows
    /// with what arrives, never with what anyone announces.
    pub fn fill<R: Read + ?Sized>(&mut self, r: &mut R, cap: usize, buf: &mut Vec<u8>) -> io::Result<Fill> {
        buf.clear();
        loop {
            if let Err(stop) = self.in_time() {
                return Ok(Fill::Stopped(stop));
            }
            if buf.len() >= cap {
                return Ok(Fill::Full);
            }
            let want = CHUNK.min(cap - buf.len()).min(self.left);
            if want == 0 {
                return Ok(Fill::Stopped(Stop::Bytes));
            }
            let start = buf.len();
            // Grow by doubling (few copies for a long text), never past `cap`.
            if buf.capacity() - start < want {
                let target = cap.min((start * 2).max(start + want));
                buf.reserve_exact(target - start);
            }
            buf.resize(start + want, 0);
            let n = loop {
                match r.read(&mut buf[start..]) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    other => break other,
                }
            };
            let n = match n {
                Ok(n) => n,
                Err(e) => {
                    buf.truncate(start);
                    return Err(e);
                }
            };
            buf.truncate(start + n);
            if n == 0 {
                return Ok(Fill::Whole);
            }
            self.left -= n;
        }
    }
}

/// A shared cap on bytes kept at one time: each [`Held`] is charged while it lives and given
/// back when it is dropped, so the cap holds however the holders are passed around.
#[derive(Clone, Debug)]
pub struct Pool {
    inner: Arc<PoolInner>,
}

#[derive(Debug)]
struct PoolInner {
    cap: usize,
    used: AtomicUsize,
    /// The most held at once since the pool was made (tests and the debug log).
    peak: AtomicUsize,
}

impl Pool {
    pub fn new(cap: usize) -> Pool {
        Pool { inner: Arc::new(PoolInner { cap, used: AtomicUsize::new(0), peak: AtomicUsize::new(0) }) }
    }

    /// A copy of `bytes` charged to the pool, or `None` when it would take the pool past its cap.
    pub fn hold(&self, bytes: &[u8]) -> Option<Held> {
        let n = bytes.len();
        let inner = &self.inner;
        let mut used = inner.used.load(Ordering::Relaxed);
        loop {
            let after = used.checked_add(n).filter(|&a| a <= inner.cap)?;
            match inner.used.compare_exchange_weak(used, after, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    inner.peak.fetch_max(after, Ordering::Relaxed);
                    break;
                }
                Err(now) => used = now,
            }
        }
        Some(Held { bytes: bytes.into(), pool: Arc::clone(&self.inner) })
    }

    /// Whether `n` more bytes fit now.
    pub fn fits(&self, n: usize) -> bool {
        self.held().checked_add(n).is_some_and(|a| a <= self.inner.cap)
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.inner.used.load(Ordering::Relaxed)
    }

    /// The most ever held at once.
    #[cfg(test)]
    pub fn peak(&self) -> usize {
        self.inner.peak.load(Ordering::Relaxed)
    }
}

/// Bytes kept under a [`Pool`]'s cap; dropping them gives their room back.
#[derive(Debug)]
pub struct Held {
    bytes: Box<[u8]>,
    pool: Arc<PoolInner>,
}

impl Deref for Held {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.pool.used.fetch_sub(self.bytes.len(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A source that never ends and counts what was asked of it.
    struct Endless {
        asked: usize,
    }

    impl Read for Endless {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.asked += buf.len();
            buf.fill(b'x');
            Ok(buf.len())
        }
    }

    #[test]
    fn a_fill_stops_at_its_cap_and_never_asks_for_more() {
        let mut src = Endless { asked: 0 };
        let mut buf = Vec::new();
        let mut b = Budget::bytes(usize::MAX);
        assert_eq!(b.fill(&mut src, 100_001, &mut buf).unwrap(), Fill::Full);
        assert_eq!((buf.len(), src.asked), (100_001, 100_001));
        assert_eq!(buf.capacity(), 100_001, "grown with what arrived, never past the cap");
    }

    #[test]
    fn a_fill_stops_when_the_bytes_are_spent_and_says_so() {
        let mut b = Budget::bytes(40_000);
        let mut buf = Vec::new();
        let fill = b.fill(&mut Endless { asked: 0 }, 1 << 20, &mut buf).unwrap();
        assert_eq!((fill, buf.len(), b.left()), (Fill::Stopped(Stop::Bytes), 40_000, 0));
        assert_eq!(b.charge(1), Err(Stop::Bytes));
    }

    #[test]
    fn a_fill_past_its_deadline_reads_nothing_and_a_slow_source_stops_between_chunks() {
        let mut buf = vec![1, 2, 3];
        let late = Budget::until(Instant::now());
        let fill = { late }.fill(&mut Endless { asked: 0 }, 10, &mut buf).unwrap();
        assert_eq!((fill, buf.len()), (Fill::Stopped(Stop::Time), 0));
        /// Each read takes 20 ms, as a page of a contended process does.
        struct Slow;
        impl Read for Slow {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                std::thread::sleep(Duration::from_millis(20));
                buf.fill(0);
                Ok(buf.len())
            }
        }
        let mut b = Budget::until(Instant::now() + Duration::from_millis(50));
        assert_eq!(b.fill(&mut Slow, 1 << 20, &mut buf).unwrap(), Fill::Stopped(Stop::Time));
        assert!(buf.len() <= 4 * CHUNK && !buf.is_empty(), "{}", buf.len());
    }

    #[test]
    fn a_whole_source_reads_whole() {
        let mut b = Budget::bytes(10);
        let mut buf = Vec::new();
        assert_eq!(b.fill(&mut &b"abc"[..], 10, &mut buf).unwrap(), Fill::Whole);
        assert_eq!((buf.as_slice(), b.left()), (&b"abc"[..], 7));
        assert_eq!(Budget::bytes(3).fill(&mut &b"abc"[..], 3, &mut buf).unwrap(), Fill::Full);
    }

    #[test]
    fn a_pool_holds_at_most_its_cap_and_dropping_gives_the_room_back() {
        let pool = Pool::new(10);
        let a = pool.hold(b"123456").unwrap();
        assert!(pool.hold(b"12345").is_none(), "6 + 5 > 10");
        let b = pool.hold(b"1234").unwrap();
        assert_eq!((pool.held(), &*a, &*b), (10, &b"123456"[..], &b"1234"[..]));
        drop(a);
        assert!(pool.fits(6) && !pool.fits(7));
        let c = pool.clone().hold(b"abcdef").unwrap();
        drop((b, c));
        assert_eq!((pool.held(), pool.peak()), (0, 10));
    }
}
