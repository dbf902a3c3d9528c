//! Where events come from: the BPF ring buffer, nothing at all (the `procfs` backend rescans
//! instead), or a recorded trace (`crate::trace`). The pump is generic over [`EventSource`].
use std::{future::Future, io, sync::Arc};

use crate::{
    ebpf::{task_iter, EbpfSource},
    event::{Event, ProcId, ProcState},
    procfs,
};

/// How a rebuild reads the whole table: runs on a blocking thread.
pub type Scanner = Arc<dyn Fn() -> io::Result<Vec<ProcState>> + Send + Sync>;

/// How the lineage learns the parent of each process it adopts from a scan (`(process, ppid)`
/// for those still alive as themselves): runs on a blocking thread.
pub type ParentReader = Arc<dyn Fn(&[ProcId]) -> Vec<(ProcId, u32)> + Send + Sync>;

/// A stream of process events plus a way to read the whole table.
pub trait EventSource: Send + 'static {
    /// `backend=` of the `STARTED` line.
    fn backend(&self) -> &'static str;

    /// Returns once events may be waiting (a wake-up, or the periodic drain). Cancel-safe.
    fn wait(&mut self) -> impl Future<Output = io::Result<()>> + Send;

    /// Pops up to `max` events without blocking, appending them to `out`. Returns how many records
    /// it popped (records that failed to decode count, and are reported on stderr).
    fn drain(&mut self, max: usize, out: &mut Vec<Event>) -> usize;

    /// Events the source could not deliver so far (monotonic).
    fn lost(&self) -> u64;

    /// Reads the whole table (start-up, resync, audit).
    fn scanner(&self) -> Scanner;

    /// True when the source delivers no events, so every tick needs a fresh scan (the legacy
    /// cost model of the `procfs` backend).
    fn rescans_every_tick(&self) -> bool {
        false
    }

    /// Which events wake the pump at once (heavy-command slots); a source without wake-ups
    /// ignores it.
    fn wake_for(&mut self, _wake: crate::event::Wake) {}

    /// Parent links of live processes (`/proc/PID/stat`; a trace answers from its records).
    fn parents(&self) -> ParentReader {
        Arc::new(crate::lineage::parents::read_parents)
    }
}

impl EventSource for EbpfSource {
    fn backend(&self) -> &'static str {
        "ebpf"
    }

    async fn wait(&mut self) -> io::Result<()> {
        tokio::select! {
            r = self.readable() => r?,
            () = tokio::time::sleep(crate::ebpf::DRAIN_PERIOD) => return Ok(()),
        }
        // Woken by the first record after a quiet spell (slots on: the ring's adaptive
        // notification): what follows within a millisecond is drained with it, so a storm costs
        // a wake-up per millisecond, not one per event.
        if self.wake() == crate::event::Wake::Adaptive {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        Ok(())
    }

    fn drain(&mut self, max: usize, out: &mut Vec<Event>) -> usize {
        EbpfSource::drain(self, max, |e| match e {
            Ok(e) => out.push(e),
            Err(e) => tracing::warn!("bad event record: {e}"),
        })
    }

    fn lost(&self) -> u64 {
        EbpfSource::lost(self)
    }

    fn wake_for(&mut self, wake: crate::event::Wake) {
        EbpfSource::wake_for(self, wake)
    }

    /// The BPF task iterator (one pass, ~1 µs per task), else the /proc scan: a read that is not
    /// complete falls back to /proc for that rebuild (see `ebpf::task_iter`).
    fn scanner(&self) -> Scanner {
        let iter = self.task_iter().filter(|_| !task_iter::forced_procfs()).cloned();
        Arc::new(move || task_iter::snapshot_states(iter.as_ref()))
    }
}

/// The `procfs` backend: no events; the table is rebuilt from /proc for every tick.
pub struct ProcfsSource;

impl EventSource for ProcfsSource {
    fn backend(&self) -> &'static str {
        "procfs"
    }

    async fn wait(&mut self) -> io::Result<()> {
        std::future::pending().await
    }

    fn drain(&mut self, _max: usize, _out: &mut Vec<Event>) -> usize {
        0
    }

    fn lost(&self) -> u64 {
        0
    }

    fn scanner(&self) -> Scanner {
        Arc::new(procfs::snapshot)
    }

    fn rescans_every_tick(&self) -> bool {
        true
    }
}
