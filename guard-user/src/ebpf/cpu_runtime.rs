//! The stall watch's CPU samples from the scheduler's own accounting (SPEC: its cost must not
//! grow with the number of idle processes).
//!
//! Kernel side: `sched_stat_runtime` in guard-ebpf adds every stretch of CPU a task of the
//! watched account used to its process's entry in one of two maps (`CPU_RUN_A`, `CPU_RUN_B`);
//! `CPU_CTL` says which account and which map, `CPU_LOST` counts updates that found no entry.
//! A sample flips the map the program writes to and drains the other one: the processes that
//! ran in the interval, each with the CPU it used.
//! A process that did not run has no entry and costs nothing — 10,000 idle processes cost what
//! none do. (The task iterator's sample, the fallback, visits every task of the machine.)
//!
//! Nor does a young one, with [`RuntimeCpu::set_min_age`]: the daemon sets the shortest
//! `peggedFor` the config accepts (10 s), the age below which no process can be in an incident.
//! A fork storm's processes live milliseconds; each used to make an entry that the next
//! sample drained (three syscalls each), which made the daemon ~4× costlier per storm exec.
//! The price: a process's samples begin at 10 s of age, so a spinner is told up to one sample
//! interval later than its `peggedFor` (at most 10 s later with ticks shorter than that).
//!
//! User space turns the intervals' CPU into a running total per process, which is what the
//! stall watch compares between samples; a process that did not run in an interval is left out
//! of that sample, which the stall watch reads as calm (and its track ends, as for one that
//! exited). A sample during which the program could not make an entry (more than
//! `CPU_RUN_ENTRIES` processes ran, or a failed kernel read) is not trusted: it is an error,
//! and the stall watch skips that tick rather than see a busy process as calm.
//!
//! Between the flip and the drain a program already running on another CPU may still add to
//! the old map: an add that lands between the drain's read and delete of an entry is lost, one
//! that lands after the delete makes a new entry there, picked up two samples later. Either way
//! it is microseconds of CPU, and nothing is counted twice.
use std::{collections::HashMap as StdHashMap, io};

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray},
    programs::BtfTracePoint,
    Btf as AyaBtf, Ebpf,
};
use guard_common::{CpuCtl, CpuRun};

use crate::{
    comm::Comm,
    event::{ns_to_ticks, ProcId, ProcState},
};

/// The program's name in the BPF object (and the tracepoint it attaches to).
const PROGRAM: &str = "sched_stat_runtime";
/// The tp_btf tracepoint (`btf_trace_sched_stat_runtime(task, runtime, …)`).
pub const TRACEPOINT: &str = PROGRAM;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("cannot load or attach `{PROGRAM}`: {0}")]
    Program(String),
    #[error("the BPF object has no map `{0}`")]
    Map(&'static str),
}

/// The accounting program's maps, attached and idle until [`RuntimeCpu::sample`] is first called.
pub struct RuntimeCpu {
    runs: [HashMap<MapData, u32, CpuRun>; 2],
    ctl: Array<MapData, CpuCtl>,
    lost: PerCpuArray<MapData, u64>,
    /// What `CPU_CTL` holds now.
    current: CpuCtl,
    /// `lost` at the previous sample.
    last_lost: u64,
    /// Running CPU total per process that ran in the previous interval (tgid → (start ns, ns)).
    totals: StdHashMap<u32, (u64, u64)>,
    /// Entries of each map (for the overflow's message).
    entries: u32,
    /// Processes younger than this are not accounted (`CpuCtl::min_age_ns`).
    min_age_ns: u64,
}

impl RuntimeCpu {
    /// Loads and attaches the accounting program (disabled: `CPU_CTL` is zero) and takes its
    /// maps out of `ebpf`, which keeps the program attached.
    pub fn load(ebpf: &mut Ebpf, btf: &AyaBtf, entries: u32) -> Result<RuntimeCpu, RuntimeError> {
        let prog: &mut BtfTracePoint = ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| RuntimeError::Program("not in the object".into()))?
            .try_into()
            .map_err(|e| RuntimeError::Program(super::describe(&e)))?;
        prog.load(TRACEPOINT, btf).map_err(|e| RuntimeError::Program(super::describe(&e)))?;
        prog.attach().map_err(|e| RuntimeError::Program(super::describe(&e)))?;
        let mut take = |name: &'static str| ebpf.take_map(name).ok_or(RuntimeError::Map(name));
        let (a, b, ctl, lost) = (take("CPU_RUN_A")?, take("CPU_RUN_B")?, take("CPU_CTL")?, take("CPU_LOST")?);
        Ok(RuntimeCpu {
            runs: [
                HashMap::try_from(a).map_err(|_| RuntimeError::Map("CPU_RUN_A"))?,
                HashMap::try_from(b).map_err(|_| RuntimeError::Map("CPU_RUN_B"))?,
            ],
            ctl: Array::try_from(ctl).map_err(|_| RuntimeError::Map("CPU_CTL"))?,
            lost: PerCpuArray::try_from(lost).map_err(|_| RuntimeError::Map("CPU_LOST"))?,
            current: CpuCtl::default(),
            last_lost: 0,
            totals: StdHashMap::new(),
            entries,
            min_age_ns: 0,
        })
    }

    /// From the next sample on, processes younger than `age` are not accounted (see the module
    /// doc); 0, the default, accounts every process.
    pub fn set_min_age(&mut self, age: std::time::Duration) {
        self.min_age_ns = u64::try_from(age.as_nanos()).unwrap_or(u64::MAX);
    }

    fn set_ctl(&mut self, ctl: CpuCtl) -> io::Result<()> {
        self.ctl.set(0, ctl, 0).map_err(io::Error::other)?;
        self.current = ctl;
        Ok(())
    }

    fn lost(&self) -> u64 {
        self.lost.get(&0, 0).map(|v| v.iter().sum()).unwrap_or(0)
    }

    /// Empties one map (every key, then deletes them).
    fn drain(&mut self, generation: u32) -> Vec<(u32, CpuRun)> {
        let map = &mut self.runs[(generation & 1) as usize];
        let keys: Vec<u32> = map.keys().filter_map(Result::ok).collect();
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            if let Ok(v) = map.get(&k, 0) {
                out.push((k, v));
            }
            let _ = map.remove(&k);
        }
        out
    }

    /// Stops the accounting (the stall watch was turned off): the program returns at once.
    pub fn pause(&mut self) {
        if self.current.enabled != 0 {
            let _ = self.set_ctl(CpuCtl::default());
            self.totals.clear();
        }
    }

    /// The processes of `euid` that used CPU since the previous sample, each with its running
    /// total (see the module doc). The first call starts the accounting and returns nothing.
    pub fn sample(&mut self, euid: u32) -> io::Result<Vec<(ProcState, u64)>> {
        if self.current.enabled == 0 || self.current.uid != euid {
            // Start afresh: whatever the maps hold is stale or another account's.
            self.set_ctl(CpuCtl { enabled: 1, uid: euid, generation: 0, _pad: 0, min_age_ns: self.min_age_ns })?;
            self.totals.clear();
            self.drain(0);
            self.drain(1);
            self.last_lost = self.lost();
            return Ok(Vec::new());
        }
        let old = self.current.generation;
        self.set_ctl(CpuCtl { generation: old ^ 1, min_age_ns: self.min_age_ns, ..self.current })?;
        let drained = self.drain(old);
        let lost = self.lost();
        let missed = lost.wrapping_sub(self.last_lost);
        self.last_lost = lost;
        let mut totals = StdHashMap::with_capacity(drained.len());
        let mut out = Vec::with_capacity(drained.len());
        for (tgid, run) in drained {
            let before = match self.totals.get(&tgid) {
                Some(&(start, ns)) if start == run.start_boottime_ns => ns,
                _ => 0,
            };
            let total = before.saturating_add(run.ns);
            totals.insert(tgid, (run.start_boottime_ns, total));
            let id = ProcId { pid: tgid, start_ticks: ns_to_ticks(run.start_boottime_ns) };
            out.push((ProcState { id, euid, comm: Comm::from_kernel(&run.comm) }, total));
        }
        if missed != 0 {
            // Keep every total (those missing may have run without an entry), answer nothing.
            for (k, v) in totals {
                self.totals.insert(k, v);
            }
            return Err(io::Error::other(format!(
                "{missed} CPU accounting update(s) had no map entry this interval (more than {} processes \
                 ran, or a kernel read failed): this sample is skipped",
                self.entries
            )));
        }
        self.totals = totals;
        out.sort_unstable_by_key(|(p, _)| p.id.pid);
        Ok(out)
    }
}
