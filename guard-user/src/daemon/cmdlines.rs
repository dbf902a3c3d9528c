//! The one way a tick reads command lines (docs/architecture.md, "Bounds"): [`CmdlineReader`].
//!
//! A command line is the account's to make 1 MiB long, to share between as many forks as it
//! likes, and to make slow to read (the kernel copies it out of the process's memory a page at a
//! time under that process's memory-map lock, which the process can keep busy). So every read
//! goes through one reader that owns:
//!
//! - one buffer, which each read replaces: a text is read, judged, and dropped, unless it waits
//!   for the matcher;
//! - a deadline for the whole phase and a share of it for each read, checked between chunks of
//!   the read ([`crate::budget::CHUNK`]): what is not read in time is [`Read::Deferred`], and the
//!   caller protects that process for this tick;
//! - the [`Pool`] every text waiting for the matcher is charged to ([`CmdlineReader::hold`]), at
//!   most [`HELD_CMDLINE_BYTES`] at one time, shared by everything that holds command lines in a
//!   tick (the `excludeCommands` verdicts and the session roots).
//!
//! The `excludeCommands` verdicts (`daemon::verdicts`) read through it; so does anything else that
//! needs a command line in a tick: make a reader for the phase with [`CmdlineReader::for_phase`],
//! read, and hold what waits for a matcher; when `hold` says the pool is full, match and drop what
//! is held (or leave the rest for the next tick).
use std::time::{Duration, Instant};

use super::effects::ProcessReader;
use crate::{
    budget::{Budget, Held, Pool},
    policy::cmdline::Deferred,
    procfs::CmdRead,
};

/// What one read gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Read {
    /// The command line is in [`CmdlineReader::text`] until the next read (a longer one than the
    /// `max` asked for comes back cut at `max + 1`); [`CmdlineReader::hold`] keeps a copy.
    Text,
    /// The process is gone.
    Gone,
    /// Not read in time: the phase's reading time ran out before it (`NotReached`), or its own
    /// read overran its share (`Slow`).
    Deferred(Deferred),
}

/// The tick's reader of command lines (see the module doc).
pub struct CmdlineReader<'a> {
    procs: &'a mut dyn ProcessReader,
    buf: Vec<u8>,
    /// When reading stops for this phase.
    until: Instant,
    /// One read's share of the phase.
    per_read: Duration,
    pool: Pool,
}

impl<'a> CmdlineReader<'a> {
    /// A reader that reads until `until`, each read for at most `per_read`, holding texts in
    /// `pool`.
    pub fn new(procs: &'a mut dyn ProcessReader, pool: Pool, until: Instant, per_read: Duration) -> CmdlineReader<'a> {
        CmdlineReader { procs, buf: Vec::new(), until, per_read, pool }
    }

    /// A reader for a phase that may last from `now` until `ends` and also matches what it
    /// reads: reading gets the first half of it, one read a quarter of that.
    pub fn for_phase(procs: &'a mut dyn ProcessReader, pool: Pool, now: Instant, ends: Instant) -> CmdlineReader<'a> {
        let (until, per_read) = read_times(now, ends);
        CmdlineReader::new(procs, pool, until, per_read)
    }

    /// Reads the command line of `pid`, up to `max + 1` bytes.
    pub fn read(&mut self, pid: u32, max: usize) -> Read {
        let now = Instant::now();
        if now >= self.until {
            self.buf.clear();
            return Read::Deferred(Deferred::NotReached);
        }
        let mut budget = Budget::until(self.until).ending(now + self.per_read);
        match self.procs.cmdline(pid, max, &mut budget, &mut self.buf) {
            CmdRead::Text => Read::Text,
            CmdRead::Gone => Read::Gone,
            CmdRead::Stopped(_) if Instant::now() >= self.until => Read::Deferred(Deferred::NotReached),
            CmdRead::Stopped(_) => Read::Deferred(Deferred::Slow),
        }
    }

    /// The command line the last [`CmdlineReader::read`] gave; after [`Read::Deferred`], what was
    /// read before it stopped (its length says whether the text was long).
    pub fn text(&self) -> &[u8] {
        &self.buf
    }

    /// Whether `pid` is there, for a verdict that needs no command line.
    pub fn exists(&mut self, pid: u32) -> bool {
        self.procs.exists(pid)
    }

    /// A copy of `text` charged to the pool while it lives; `None` when the pool is full (match
    /// and drop what is held, then hold again).
    pub fn hold(&self, text: &[u8]) -> Option<Held> {
        self.pool.hold(text)
    }

    /// Whether `n` more bytes can be held now.
    pub fn fits(&self, n: usize) -> bool {
        self.pool.fits(n)
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.pool.held()
    }
}

/// Reading time for a phase that may last from `now` until `ends`: reads get its first half
/// (the matching rounds the rest), one read a quarter of that.
pub fn read_times(now: Instant, ends: Instant) -> (Instant, Duration) {
    let reads = ends.saturating_duration_since(now) / 2;
    (now + reads, reads / 4)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::recording::FakeProcs;

    #[test]
    fn a_reader_past_its_time_reads_nothing_and_the_pool_bounds_what_it_holds() {
        let mut procs = FakeProcs::default();
        procs.0.lock().unwrap().insert(7, vec![b'a'; 3000]);
        let pool = Pool::new(4000);
        let now = Instant::now();
        let mut r = CmdlineReader::new(&mut procs, pool.clone(), now + Duration::from_secs(5), Duration::from_secs(1));
        assert_eq!(r.read(7, 1 << 20), Read::Text);
        let held = r.hold(r.text()).expect("fits");
        assert!(r.hold(r.text()).is_none(), "3000 + 3000 > 4000");
        assert_eq!(&*held, &[b'a'; 3000][..]);
        assert_eq!(r.read(8, 1 << 20), Read::Gone);
        drop(held);
        assert_eq!(pool.held(), 0);
        let mut late = CmdlineReader::new(&mut procs, pool, now, Duration::from_secs(1));
        assert_eq!(late.read(7, 1 << 20), Read::Deferred(Deferred::NotReached));
    }

    #[test]
    fn reading_gets_half_of_its_phase_and_one_read_a_quarter_of_that() {
        let now = Instant::now();
        let (until, per_read) = read_times(now, now + Duration::from_secs(8));
        assert_eq!((until - now, per_read), (Duration::from_secs(4), Duration::from_secs(1)));
    }
}
