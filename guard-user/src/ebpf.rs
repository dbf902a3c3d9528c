//! The `ebpf` event source: loads guard's BPF programs with the offsets from [`crate::btf`]
//! and the watched account's uid as load-time constants, attaches them to the process
//! tracepoints and the credential hook, and drains the ring buffer.
//!
//! Filtered in the kernel: with [`EbpfOptions::account`] set, the programs report only that
//! account's processes and those entering or leaving it (guard-ebpf's crate doc says which
//! credentials each event tests), so every other account's fork, exec, exit and rename costs a
//! daemon one credential load in the kernel and nothing in user space.
//!
//! Order matters: attach everything first, then the daemon scans (see `daemon` for why that
//! order misses nothing).
//!
//! Reading follows the BPF ring buffer's wake-up rule (kernel/bpf/ringbuf.c,
//! `bpf_ringbuf_commit`): the kernel wakes the reader only for a record submitted while the
//! reader had consumed everything before it. A reader that stops early (`drain` with a small
//! `max`) therefore gets no new wake-up for the records left behind, so [`EbpfSource::readable`]
//! asks the kernel whether data is waiting before it sleeps on the fd.
//!
//! # Layout
//! This file loads the object and reads the ring; `creds` attaches the credential hook or its
//! fallback, `syscalls` gives the fallback its syscall numbers, `error` says why a step failed,
//! `task_iter` and `cpu_runtime` are the snapshot and stall-watch programs, `prog_info` reads
//! the kernel's count of skipped program runs.
use std::{
    os::fd::{AsFd, AsRawFd, RawFd},
    path::Path,
    sync::{
        atomic::{AtomicU64, Ordering},
        OnceLock,
    },
    time::Duration,
};

use aya::{
    maps::{Array, MapData, PerCpuArray, RingBuf},
    programs::BtfTracePoint,
    Ebpf, EbpfLoader,
};
use guard_common::{KernelOffsets, SetuidSyscalls, ALL_ACCOUNTS, DEFAULT_RING_BYTES, LOST_INDEX};
use tokio::io::{unix::AsyncFd, Interest};

use crate::{
    btf::{Btf, VMLINUX},
    event::{DecodeError, Event},
};

pub mod cpu_runtime;
mod creds;
mod error;
mod prog_info;
mod syscalls;
pub mod task_iter;

pub use creds::CredTracking;
use creds::{attach_creds, CRED_HOOK, SYSCALL_TRACEPOINTS};
use error::{describe, is_permission, program_error};
pub use error::{holds_bpf_capabilities, EbpfError};

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/guard.bpf.o"));

/// Whether this build carries its BPF programs: a plain `cargo build` without `cargo xtask
/// build-ebpf`'s object embeds none (build.rs warns), and the ebpf backend then refuses
/// ([`EbpfError::NoObject`]). The tests ask it to ignore (or fail) what needs the backend.
#[cfg(any(test, feature = "testing"))]
pub fn object_embedded() -> bool {
    !OBJECT.is_empty()
}

/// The tp_btf attach points (see `load`), for the BTF stub aya's loaders look them up in.
const ATTACHED_TRACEPOINTS: [&str; 4] =
    ["sched_process_fork", "sched_process_exec", "sched_process_exit", "task_rename"];

#[derive(Clone, Copy, Debug, Default)]
pub struct EbpfOptions {
    /// The account whose processes are reported (effective uid); None = every process of the
    /// machine (tools and tests that watch everything).
    pub account: Option<u32>,
    /// Ring buffer bytes (a power of two ≥ the page size); None = `DEFAULT_RING_BYTES` (256 KiB).
    pub ring_bytes: Option<u32>,
    /// Entries of each CPU accounting map; None = `CPU_RUN_ENTRIES`. Tests shrink it to reach
    /// the overflow with a few hundred processes.
    pub cpu_run_entries: Option<u32>,
    /// Leave the `commit_creds` hook out, as if it could not attach (tests of the fallback).
    pub skip_cred_hook: bool,
}

/// What the programs read from the kernel's BTF: the structure offsets, the credential
/// fallback's syscall filter (or why it has none), and the BTF stub aya's program loaders look
/// ids up in (a stub with the kernel's ids spares aya a second full parse).
struct KernelParts {
    offsets: KernelOffsets,
    syscalls: Result<SetuidSyscalls, EbpfError>,
    stub: aya::Btf,
}

fn kernel_btf_parts() -> Result<KernelParts, EbpfError> {
    let kernel_btf = Btf::from_file(Path::new(VMLINUX))?;
    let offsets = kernel_btf.kernel_offsets()?;
    // The stall watch's accounting is optional: without its tracepoint the samples fall back.
    let mut tracepoints = ATTACHED_TRACEPOINTS.to_vec();
    if kernel_btf.has_tracepoint(cpu_runtime::TRACEPOINT) {
        tracepoints.push(cpu_runtime::TRACEPOINT);
    }
    // The credential fallback is optional too: without the raw syscall tracepoints (or the
    // fields it reads) uid changes reach the table through the audit.
    let mut syscalls = syscalls::setuid_syscalls(&kernel_btf).map_err(EbpfError::from);
    if SYSCALL_TRACEPOINTS.iter().all(|tp| kernel_btf.has_tracepoint(tp)) {
        tracepoints.extend(SYSCALL_TRACEPOINTS);
    } else {
        syscalls = Err(EbpfError::Attach {
            program: "sys_exit_setuid".into(),
            tracepoint: SYSCALL_TRACEPOINTS.join(", "),
            detail: "the kernel has no raw syscall tracepoints (CONFIG_HAVE_SYSCALL_TRACEPOINTS)".into(),
        });
    }
    let stub = kernel_btf.aya_stub(&tracepoints, &[task_iter::BTF_FUNCTION, CRED_HOOK])?;
    Ok(KernelParts { offsets, syscalls, stub })
}

/// glibc's allocator, tuned for a small long-lived daemon (measured in `cargo xtask bench`'s RSS
/// figure): one arena for all threads (by default every tokio worker that allocates gets its
/// own, ~1.3 MiB each at 10,000 tracked processes) and a fixed mmap threshold, so the big
/// transient buffers of start-up and of every snapshot (the BTF file, the type index, the
/// snapshot's vectors) are mmapped and go back to the kernel when freed. By default glibc raises
/// the threshold to the size of the largest mmapped block freed, after which such buffers stay
/// in the heap. The daemon calls it before it starts any thread (a thread that allocates before
/// it gets an arena of its own, which stays: measured, 0.7 MiB at 10,000 tracked); loading the
/// programs calls it again for the other users of this module.
pub fn limit_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
    }
}

fn page_size() -> u32 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 {
        v as u32
    } else {
        4096
    }
}

/// The running kernel's event source. Dropping it detaches every program.
pub struct EbpfSource {
    /// The ring buffer fd registered with tokio's reactor, on the first [`Self::readable`] (so
    /// `load` need not run inside a runtime). Declared before `ring` so it deregisters before
    /// the fd closes.
    poll: OnceLock<std::io::Result<AsyncFd<RawFd>>>,
    ring: RingBuf<MapData>,
    /// Records the programs could not queue or build, per CPU.
    lost: PerCpuArray<MapData, u64>,
    /// How credential changes reach the ring.
    creds: CredTracking,
    /// The task iterator for snapshots, or why there is none (then /proc is read instead).
    task_iter: Result<task_iter::TaskIter, task_iter::TaskIterError>,
    /// The stall watch's CPU accounting until the daemon takes it, or why there is none.
    cpu_runtime: Option<Result<cpu_runtime::RuntimeCpu, cpu_runtime::RuntimeError>>,
    /// The event programs, each with the most runs the kernel has skipped (see
    /// [`prog_info`]): those are lost events too.
    missed: Vec<(&'static str, AtomicU64)>,
    /// `EXEC_WAKE`: which records wake us at once (heavy-command slots).
    exec_wake: Option<Array<MapData, u32>>,
    /// What `EXEC_WAKE` holds.
    wake: crate::event::Wake,
    /// Owns the programs and their links.
    ebpf: Ebpf,
}

/// How often the ring is drained when the kernel has not woken us (its programs submit without
/// a wake-up until the ring is 1/16 full). Every tick also has the ring drained first (the
/// daemon's drain request), so a tick never decides on a table older than its own start.
/// Measured in `cargo xtask bench` (idle figure): one wake-up per event cost ~0.19 % of a core
/// at 10 execs/s.
pub const DRAIN_PERIOD: Duration = Duration::from_secs(1);

impl EbpfSource {
    pub fn load(opts: &EbpfOptions) -> Result<EbpfSource, EbpfError> {
        limit_heap();
        let uid = opts.account.unwrap_or(ALL_ACCOUNTS);
        if opts.account == Some(ALL_ACCOUNTS) {
            return Err(EbpfError::Account(ALL_ACCOUNTS));
        }
        let ring_bytes = opts.ring_bytes.unwrap_or(DEFAULT_RING_BYTES);
        let page = page_size();
        if ring_bytes < page || !ring_bytes.is_power_of_two() {
            return Err(EbpfError::RingSize { bytes: ring_bytes, page });
        }
        if OBJECT.is_empty() {
            return Err(EbpfError::NoObject);
        }
        // EbpfLoader::new() parses the whole vmlinux BTF (aya reads it for relocations; ~20 ms
        // of CPU), and we parse it for the offsets: on two threads, the start-up's longest step
        // takes the time of one. Where no thread can be made, one after the other.
        let (KernelParts { offsets, syscalls, stub: aya_btf }, mut loader) = std::thread::scope(|sc| {
            let loader = std::thread::Builder::new().name("guard-btf".into()).spawn_scoped(sc, EbpfLoader::new);
            let ours = kernel_btf_parts();
            let loader = match loader {
                Ok(handle) => handle.join().unwrap_or_else(|_| EbpfLoader::new()),
                Err(_) => EbpfLoader::new(),
            };
            ours.map(|o| (o, loader))
        })?;
        crate::startup_phase("btf parsed (offsets, stub; aya's loader in parallel)");
        let _ = aya::features();
        crate::startup_phase("aya features probed");
        let cpu_run_entries = opts.cpu_run_entries.unwrap_or(guard_common::CPU_RUN_ENTRIES).max(1);
        // The programs' constants (guard-ebpf's crate doc): in a frozen read-only map, so the
        // verifier folds them into the code it checks.
        let wake_bytes = u64::from(ring_bytes / 16);
        let mut ebpf = loader
            .override_global("GUARD_UID", &uid, true)
            .override_global("GUARD_OFFSETS", &offsets, true)
            .override_global("GUARD_WAKE_BYTES", &wake_bytes, true)
            .override_global("GUARD_SYSCALLS", syscalls.as_ref().unwrap_or(&SetuidSyscalls::NONE), true)
            .map_max_entries("EVENTS", ring_bytes)
            .map_max_entries("CPU_RUN_A", cpu_run_entries)
            .map_max_entries("CPU_RUN_B", cpu_run_entries)
            .load(OBJECT)
            .map_err(|e| {
                let detail = describe(&e);
                if is_permission(&e) {
                    EbpfError::Permission { what: "creating BPF maps".into(), detail }
                } else {
                    EbpfError::Load { detail }
                }
            })?;
        crate::startup_phase("object loaded (maps created)");

        // sched_process_exit gained `group_dead` in 6.16; each variant reads its own signature.
        let exit_prog =
            if offsets.exit_has_group_dead != 0 { "sched_process_exit_gd" } else { "sched_process_exit_live" };
        for (prog, tp) in [
            ("sched_process_fork", "sched_process_fork"),
            ("sched_process_exec", "sched_process_exec"),
            (exit_prog, "sched_process_exit"),
            ("task_rename", "task_rename"),
        ] {
            let p: &mut BtfTracePoint = ebpf
                .program_mut(prog)
                .ok_or_else(|| EbpfError::Attach {
                    program: prog.into(),
                    tracepoint: tp.into(),
                    detail: "not in the object".into(),
                })?
                .try_into()
                .map_err(|e| program_error(prog, tp, e))?;
            p.load(tp, &aya_btf).map_err(|e| program_error(prog, tp, e))?;
            p.attach().map_err(|e| program_error(prog, tp, e))?;
            crate::startup_phase(prog);
        }
        let (creds, cred_program) = attach_creds(&mut ebpf, &aya_btf, opts.skip_cred_hook, syscalls.map(|_| ()));
        crate::startup_phase("credential hook");
        let task_iter = task_iter::TaskIter::load(&mut ebpf, &aya_btf);
        crate::startup_phase("task iterator");
        let cpu_runtime = Some(cpu_runtime::RuntimeCpu::load(&mut ebpf, &aya_btf, cpu_run_entries));
        crate::startup_phase("CPU accounting");

        let ring = RingBuf::try_from(ebpf.take_map("EVENTS").ok_or(EbpfError::Map { name: "EVENTS" })?)
            .map_err(|_| EbpfError::Map { name: "EVENTS" })?;
        let lost = PerCpuArray::try_from(ebpf.take_map("LOST").ok_or(EbpfError::Map { name: "LOST" })?)
            .map_err(|_| EbpfError::Map { name: "LOST" })?;
        let mut event_programs = vec!["sched_process_fork", "sched_process_exec", exit_prog, "task_rename"];
        event_programs.extend(cred_program);
        let missed = event_programs.into_iter().map(|p| (p, AtomicU64::new(0))).collect();
        // An object built before the map existed: execs are drained on the timer (slots still
        // work, a drain period later).
        let exec_wake = ebpf.take_map("EXEC_WAKE").and_then(|m| Array::try_from(m).ok());
        let wake = crate::event::Wake::Timer;
        Ok(EbpfSource {
            poll: OnceLock::new(),
            ring,
            lost,
            creds,
            task_iter,
            cpu_runtime,
            missed,
            exec_wake,
            wake,
            ebpf,
        })
    }

    /// How credential changes are tracked (for the `WARN setuid_untracked` line and tests).
    pub fn cred_tracking(&self) -> &CredTracking {
        &self.creds
    }

    /// The task iterator, for snapshots off the pump's thread (clone it into the blocking
    /// task); `None` when it could not load (see [`Self::task_iter_problem`]).
    pub fn task_iter(&self) -> Option<&task_iter::TaskIter> {
        self.task_iter.as_ref().ok()
    }

    /// When the kernel wakes the pump (heavy-command slots want every event at once).
    pub fn wake_for(&mut self, wake: crate::event::Wake) {
        self.wake = wake;
        if let Some(m) = self.exec_wake.as_mut() {
            if let Err(e) = m.set(0, wake as u32, 0) {
                tracing::warn!("cannot set EXEC_WAKE: {e}");
            }
        }
    }

    /// The wake-ups asked for by [`Self::wake_for`].
    pub fn wake(&self) -> crate::event::Wake {
        self.wake
    }

    /// The stall watch's CPU accounting (once; later calls get `None`), or why it did not load.
    pub fn take_cpu_runtime(&mut self) -> Option<Result<cpu_runtime::RuntimeCpu, cpu_runtime::RuntimeError>> {
        self.cpu_runtime.take()
    }

    /// Why there is no task iterator, for `WARN task_iter_fallback reason=<token>`.
    pub fn task_iter_problem(&self) -> Option<&task_iter::TaskIterError> {
        self.task_iter.as_ref().err()
    }

    /// Events lost, monotonic: records the programs could not queue or build (summed over
    /// CPUs), plus the event programs' runs the kernel skipped ([`prog_info`]).
    pub fn lost(&self) -> u64 {
        let ring: u64 = self.lost.get(&LOST_INDEX, 0).map(|v| v.iter().sum()).unwrap_or(0);
        let missed: u64 = self
            .missed
            .iter()
            .map(|(name, most)| {
                let now = self.ebpf.program(name).and_then(|p| p.fd().ok()).and_then(prog_info::recursion_misses);
                if let Some(n) = now {
                    most.fetch_max(n, Ordering::Relaxed);
                }
                most.load(Ordering::Relaxed)
            })
            .sum();
        ring + missed
    }

    /// Returns once records are waiting. Cancel-safe: it consumes nothing.
    pub async fn readable(&self) -> std::io::Result<()> {
        let fd = match self.poll.get_or_init(|| {
            // SAFETY: the fd belongs to `self.ring`, which is neither closed nor replaced while
            // this AsyncFd exists (it is dropped first: see the field order).
            unsafe { AsyncFd::register_with_interest(self.ring_fd(), Interest::READABLE) }.map_err(std::io::Error::from)
        }) {
            Ok(fd) => fd,
            Err(e) => return Err(std::io::Error::new(e.kind(), e.to_string())),
        };
        loop {
            // Records left by an earlier drain raise no new wake-up (see the module doc).
            if self.waiting()? {
                return Ok(());
            }
            // tokio's readiness is edge-triggered: clear it, then look again before sleeping,
            // so a record submitted in between is never missed.
            fd.readable().await?.clear_ready();
        }
    }

    /// Whether the ring holds unread records: poll(2) with no timeout, which asks the ring
    /// buffer itself (`ringbuf_map_poll_user`/`_kern`: producer ≠ consumer position).
    fn waiting(&self) -> std::io::Result<bool> {
        let mut pfd = libc::pollfd { fd: self.ring_fd(), events: libc::POLLIN, revents: 0 };
        loop {
            // SAFETY: one valid pollfd, count 1.
            let rc = unsafe { libc::poll(&mut pfd, 1, 0) };
            if rc >= 0 {
                return Ok(rc > 0 && pfd.revents & libc::POLLIN != 0);
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Pops up to `max` records without blocking, passing each, decoded, to `f`. Returns how
    /// many it popped.
    pub fn drain(&mut self, max: usize, mut f: impl FnMut(Result<Event, DecodeError>)) -> usize {
        let mut n = 0;
        while n < max {
            let Some(item) = self.ring.next() else { break };
            f(Event::decode(&item));
            n += 1;
        }
        n
    }

    /// The ring buffer's fd, for the reactor and poll(2).
    fn ring_fd(&self) -> RawFd {
        self.ring.as_fd().as_raw_fd()
    }
}

/// The benchmark's measurement floor: guard-ebpf's `noop` program attached to
/// `sched_process_fork` (`cargo xtask bench`, the `bpf` figure, runs it beside a daemon: with
/// `kernel.bpf_stats_enabled` every run's time includes the kernel's clock reads around it, and
/// this program's time is only that). The programs stay attached while the returned value lives.
#[cfg(any(test, feature = "testing"))]
pub fn load_noop_probe() -> Result<Ebpf, EbpfError> {
    if OBJECT.is_empty() {
        return Err(EbpfError::NoObject);
    }
    let btf = Btf::from_file(Path::new(VMLINUX))?.aya_stub(&["sched_process_fork"], &[])?;
    let mut ebpf = EbpfLoader::new().load(OBJECT).map_err(|e| EbpfError::Load { detail: describe(&e) })?;
    let p: &mut BtfTracePoint = ebpf
        .program_mut("noop")
        .ok_or_else(|| EbpfError::Attach {
            program: "noop".into(),
            tracepoint: "sched_process_fork".into(),
            detail: "not in the object".into(),
        })?
        .try_into()
        .map_err(|e| program_error("noop", "sched_process_fork", e))?;
    p.load("sched_process_fork", &btf).map_err(|e| program_error("noop", "sched_process_fork", e))?;
    p.attach().map_err(|e| program_error("noop", "sched_process_fork", e))?;
    Ok(ebpf)
}

#[cfg(test)]
mod tests {
    /// The tests that load the BPF object (guard-test's `need::here`).
    mod needs_root {
        mod needs_ebpf {
            use aya::Btf as AyaBtf;

            use guard_test::need::{here, Need};

            use super::super::super::*;

            /// Root, BTF and this build's object (these tests run with `--ignored`, see guard-test).
            fn kernel() -> bool {
                here(&[Need::Root, Need::Ebpf], guard_test::Facts { bpf_object: object_embedded() })
            }

            /// Kernels before 6.16 get `sched_process_exit_live`, which a newer kernel never loads on its
            /// own: make sure the verifier accepts it on every kernel (loading checks it; no attach
            /// needed). `sched_process_exit_gd` loads its `group_dead` argument directly, which only a
            /// kernel whose tracepoint has it accepts.
            #[test]
            #[ignore = "needs root and the ebpf backend: `cargo xtask test` runs it as root (--ignored)"]
            fn both_exit_variants_pass_the_verifier() {
                if !kernel() {
                    return;
                }
                let btf = AyaBtf::from_sys_fs().unwrap();
                let offsets = Btf::from_file(Path::new(VMLINUX)).unwrap().kernel_offsets().unwrap();
                let mut ebpf =
                    EbpfLoader::new().btf(Some(&btf)).override_global("GUARD_OFFSETS", &offsets, true).load(OBJECT).unwrap();
                let variants: &[&str] = if offsets.exit_has_group_dead != 0 {
                    &["sched_process_exit_gd", "sched_process_exit_live"]
                } else {
                    &["sched_process_exit_live"]
                };
                for &prog in variants {
                    let p: &mut BtfTracePoint = ebpf.program_mut(prog).unwrap().try_into().unwrap();
                    p.load("sched_process_exit", &btf).unwrap_or_else(|e| panic!("{prog}: {}", describe(&e)));
                }
            }

            /// Every event program's skipped runs are readable (they are part of `lost()`).
            #[test]
            #[ignore = "needs root and the ebpf backend: `cargo xtask test` runs it as root (--ignored)"]
            fn the_kernel_reports_each_event_programs_skipped_runs() {
                if !kernel() {
                    return;
                }
                let src = EbpfSource::load(&EbpfOptions::default()).unwrap();
                assert!(src.missed.len() >= 4, "{:?}", src.missed.iter().map(|(n, _)| n).collect::<Vec<_>>());
                for (name, _) in &src.missed {
                    let fd = src.ebpf.program(name).unwrap().fd().unwrap();
                    assert!(prog_info::recursion_misses(fd).is_some(), "{name}");
                }
                let _ = src.lost();
            }
        }
    }
}
