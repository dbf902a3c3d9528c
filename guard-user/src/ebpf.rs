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
use std::{
    os::fd::{AsFd, AsRawFd, RawFd},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        OnceLock,
    },
    time::Duration,
};

use aya::{
    maps::{MapData, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, FEntry, ProgramError, TracePoint},
    Ebpf, EbpfLoader,
};
use guard_common::{KernelOffsets, ALL_ACCOUNTS, DEFAULT_RING_BYTES, LOST_INDEX};
use tokio::io::{unix::AsyncFd, Interest};

use crate::{
    btf::{Btf, BtfError, VMLINUX},
    event::{DecodeError, Event},
};

pub mod cpu_runtime;
mod prog_info;
pub mod task_iter;

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/guard.bpf.o"));

/// Where classic tracepoints (the setuid family, the credential hook's fallback) are looked up,
/// and where we mount tracefs when nothing is mounted. tp_btf and fentry programs do not need it.
const TRACEFS: &str = "/sys/kernel/tracing";
/// The older location, under debugfs; aya looks there too.
const DEBUGFS_TRACING: &str = "/sys/kernel/debug/tracing";

/// The tp_btf attach points (see `load`), for the BTF stub aya's loaders look them up in.
const ATTACHED_TRACEPOINTS: [&str; 4] =
    ["sched_process_fork", "sched_process_exec", "sched_process_exit", "task_rename"];

/// The kernel function every credential change goes through (kernel/cred.c): the setuid
/// family, exec's install of the new credentials, and a few that never change the euid
/// (setfsuid, capset, keyrings). The only writer of `task->real_cred` after fork.
const CRED_HOOK: &str = "commit_creds";

/// Uid-changing syscalls whose exit we watch where the credential hook cannot attach. setfsuid
/// does not change the euid; the `*32` variants exist only for 32-bit ABIs, which raise no
/// syscall tracepoints on x86_64.
const SETUID_SYSCALLS: [&str; 3] = ["setuid", "setreuid", "setresuid"];

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

#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    #[error("this guard-user was built without BPF programs (build it with `cargo xtask build`)")]
    NoObject,
    #[error("ring buffer of {bytes} bytes: must be a power of two of at least the page size ({page})")]
    RingSize { bytes: u32, page: u32 },
    #[error("no tracefs at {}: {detail}", path.display())]
    Tracefs { path: PathBuf, detail: String },
    #[error(transparent)]
    Btf(#[from] BtfError),
    #[error("{what} needs root (CAP_BPF and CAP_PERFMON): {detail}")]
    Permission { what: String, detail: String },
    #[error(
        "{what} is refused by kernel.perf_event_paranoid={level}: attaching a classic tracepoint \
         then needs CAP_SYS_ADMIN, which the unit does not grant (CAP_BPF and CAP_PERFMON are not \
         enough); set the sysctl to 2 to track uid changes at once ({detail})"
    )]
    PerfParanoid { what: String, level: i32, detail: String },
    #[error("cannot load the BPF object: {detail}")]
    Load { detail: String },
    #[error("cannot load or attach `{program}` to `{tracepoint}`: {detail}")]
    Attach { program: String, tracepoint: String, detail: String },
    #[error("BPF map `{name}` is missing or of the wrong type")]
    Map { name: &'static str },
    #[error("the account's uid {0} is the value that means every account")]
    Account(u32),
}

impl EbpfError {
    /// The token for `WARN backend_fallback reason=<token>`.
    pub fn reason(&self) -> &'static str {
        match self {
            EbpfError::NoObject => "no_bpf_object",
            EbpfError::RingSize { .. } => "bad_ring_size",
            EbpfError::Tracefs { .. } => "tracefs_unavailable",
            EbpfError::Btf(_) => "no_btf",
            EbpfError::Permission { .. } => "permission_denied",
            EbpfError::PerfParanoid { .. } => "perf_event_paranoid",
            EbpfError::Load { .. } | EbpfError::Map { .. } | EbpfError::Account(_) => "load_failed",
            EbpfError::Attach { .. } => "attach_failed",
        }
    }
}

/// Whether an aya error comes from EPERM/EACCES somewhere down its source chain.
fn is_permission(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if matches!(io.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES)) {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

/// An error's text with its sources and, for a verifier rejection, the end of the verifier's
/// log (the part that says which instruction it refused).
fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(err) = cur {
        s.push_str(": ");
        s.push_str(&err.to_string());
        cur = err.source();
    }
    if let Some(ProgramError::LoadError { verifier_log, .. }) = e.downcast_ref::<ProgramError>() {
        let log = verifier_log.to_string();
        let lines: Vec<&str> = log.lines().collect();
        s.push_str("\nverifier log (end):\n");
        s.push_str(&lines[lines.len().saturating_sub(30)..].join("\n"));
    }
    s
}

fn program_error(program: &str, tracepoint: &str, e: ProgramError) -> EbpfError {
    let detail = describe(&e);
    if is_permission(&e) {
        EbpfError::Permission { what: format!("attaching `{program}`"), detail }
    } else {
        EbpfError::Attach { program: program.into(), tracepoint: tracepoint.into(), detail }
    }
}

/// Makes sure a tracefs is mounted (classic tracepoints resolve their ids there), mounting one
/// at /sys/kernel/tracing when neither it nor the debugfs copy is.
fn ensure_tracefs() -> Result<(), EbpfError> {
    if Path::new(TRACEFS).join("events").is_dir() || Path::new(DEBUGFS_TRACING).join("events").is_dir() {
        return Ok(());
    }
    let fail = |detail: String| EbpfError::Tracefs { path: TRACEFS.into(), detail };
    nix::mount::mount(Some("tracefs"), TRACEFS, Some("tracefs"), nix::mount::MsFlags::empty(), None::<&str>).map_err(
        |e| {
            fail(format!(
                "mount -t tracefs failed: {e} (the kernel needs CONFIG_TRACING and mounting needs CAP_SYS_ADMIN)"
            ))
        },
    )?;
    if !Path::new(TRACEFS).join("events").is_dir() {
        return Err(fail("mounted, but it has no events directory (CONFIG_FTRACE_SYSCALLS?)".into()));
    }
    Ok(())
}

/// The offsets the programs need and the BTF stub aya's program loaders look ids up in (a stub
/// with the kernel's ids spares aya a second full parse).
fn kernel_btf_parts() -> Result<(KernelOffsets, aya::Btf), EbpfError> {
    let kernel_btf = Btf::from_file(Path::new(VMLINUX))?;
    let offsets = kernel_btf.kernel_offsets()?;
    // The stall watch's accounting is optional: without its tracepoint the samples fall back.
    let mut tracepoints = ATTACHED_TRACEPOINTS.to_vec();
    if kernel_btf.has_tracepoint(cpu_runtime::TRACEPOINT) {
        tracepoints.push(cpu_runtime::TRACEPOINT);
    }
    let stub = kernel_btf.aya_stub(&tracepoints, &[task_iter::BTF_FUNCTION, CRED_HOOK])?;
    Ok((offsets, stub))
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
    /// Owns the programs and their links.
    ebpf: Ebpf,
}

/// How often the ring is drained when the kernel has not woken us (its programs submit without
/// a wake-up until the ring is 1/16 full). Every tick also has the ring drained first (the
/// daemon's drain request), so a tick never decides on a table older than its own start.
/// Measured in `cargo xtask bench` (idle figure): one wake-up per event cost ~0.19 % of a core
/// at 10 execs/s.
pub const DRAIN_PERIOD: Duration = Duration::from_secs(1);

/// How a process entering or leaving the account through a credential change (the setuid
/// family, an exec of a set-user-ID binary) reaches the table.
#[derive(Debug)]
pub enum CredTracking {
    /// The fentry hook on `commit_creds`: every change, at once.
    Hook,
    /// The hook could not attach (why); the setuid-family syscall tracepoints did. An exec of
    /// a set-user-ID binary that takes a process out of the account is still reported by the
    /// exec program when the process's real uid is the account's; otherwise the audit sees it.
    Syscalls { hook: EbpfError },
    /// Neither attached: uid changes without exec reach the table through the audit only.
    Audit { hook: EbpfError, syscalls: EbpfError },
}

impl CredTracking {
    /// `fallback=` of `WARN setuid_untracked`, and the hook's failure, when the hook is missing.
    pub fn fallback(&self) -> Option<(&'static str, &EbpfError)> {
        match self {
            CredTracking::Hook => None,
            CredTracking::Syscalls { hook } => Some(("syscall_tracepoints", hook)),
            CredTracking::Audit { hook, .. } => Some(("audit", hook)),
        }
    }
}

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
        let ((offsets, aya_btf), mut loader) = std::thread::scope(|sc| {
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
        let (creds, cred_program) = attach_creds(&mut ebpf, &aya_btf, opts.skip_cred_hook);
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
        Ok(EbpfSource { poll: OnceLock::new(), ring, lost, creds, task_iter, cpu_runtime, missed, ebpf })
    }

    /// Whether uid changes without exec are reported at once (the credential hook, or the
    /// setuid-family tracepoints).
    pub fn setuid_tracked(&self) -> bool {
        !matches!(self.creds, CredTracking::Audit { .. })
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

    /// The stall watch's CPU accounting (once; later calls get `None`), or why it did not load.
    pub fn take_cpu_runtime(&mut self) -> Option<Result<cpu_runtime::RuntimeCpu, cpu_runtime::RuntimeError>> {
        self.cpu_runtime.take()
    }

    /// Why there is no task iterator, for `WARN task_iter_fallback reason=<token>`.
    pub fn task_iter_problem(&self) -> Option<&task_iter::TaskIterError> {
        self.task_iter.as_ref().err()
    }

    /// Every process of the machine from the task iterator (see [`task_iter::TaskIter::snapshot`]).
    pub fn snapshot(&self) -> std::io::Result<Vec<guard_common::TaskRecord>> {
        match &self.task_iter {
            Ok(it) => it.snapshot(),
            Err(e) => Err(std::io::Error::new(std::io::ErrorKind::Unsupported, e.to_string())),
        }
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

    /// [`Self::readable`] (the kernel wakes us once the ring is 1/16 full) or [`DRAIN_PERIOD`],
    /// whichever comes first, then [`Self::drain`] into `out`, until at least one record came;
    /// with `now`, drains at once (possibly nothing). Cancel-safe: records leave the ring only
    /// after the last await.
    pub async fn next_batch(
        &mut self,
        out: &mut Vec<Result<Event, DecodeError>>,
        max: usize,
        now: bool,
    ) -> std::io::Result<usize> {
        if now {
            return Ok(self.drain(max, |e| out.push(e)));
        }
        loop {
            tokio::select! {
                r = self.readable() => r?,
                () = tokio::time::sleep(DRAIN_PERIOD) => {}
            }
            let n = self.drain(max, |e| out.push(e));
            if n > 0 {
                return Ok(n);
            }
        }
    }

    /// The ring buffer's fd (for diagnostics).
    pub fn ring_fd(&self) -> RawFd {
        self.ring.as_fd().as_raw_fd()
    }
}

/// The benchmark's measurement floor: guard-ebpf's `noop` program attached to
/// `sched_process_fork` (`cargo xtask bench`, the `bpf` figure, runs it beside a daemon: with
/// `kernel.bpf_stats_enabled` every run's time includes the kernel's clock reads around it, and
/// this program's time is only that). The programs stay attached while the returned value lives.
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

/// One program on the three syscall-exit tracepoints of the setuid family (it reports), and one
/// on their enter tracepoints (it notes who may leave).
const SETUID_PROGRAM: &str = "sys_exit_setuid";
const SETUID_ENTER_PROGRAM: &str = "sys_enter_setuid";

/// The credential hook on `commit_creds` (its typed variant, else the one for kernels before
/// 5.11), else the setuid-family tracepoints, else nothing (the audit). Returns the tracking
/// and the program that reports, for the lost-event count.
fn attach_creds(ebpf: &mut Ebpf, btf: &aya::Btf, skip_hook: bool) -> (CredTracking, Option<&'static str>) {
    let mut hook_error = skip_hook.then(|| EbpfError::Attach {
        program: "commit_creds".into(),
        tracepoint: CRED_HOOK.into(),
        detail: "left out on request (EbpfOptions::skip_cred_hook)".into(),
    });
    for prog in ["commit_creds", "commit_creds_probe"].into_iter().filter(|_| !skip_hook) {
        match attach_fentry(ebpf, btf, prog) {
            Ok(()) => return (CredTracking::Hook, Some(prog)),
            Err(e) => {
                tracing::debug!("{prog}: {e}");
                // The first program's error says why (the second only exists for old kernels).
                hook_error.get_or_insert(e);
            }
        }
    }
    let hook = hook_error.expect("two attempts");
    match ensure_tracefs().and_then(|()| attach_setuid(ebpf)) {
        Ok(()) => (CredTracking::Syscalls { hook }, Some(SETUID_PROGRAM)),
        Err(syscalls) => (CredTracking::Audit { hook, syscalls }, None),
    }
}

fn attach_fentry(ebpf: &mut Ebpf, btf: &aya::Btf, prog: &str) -> Result<(), EbpfError> {
    let p: &mut FEntry = ebpf
        .program_mut(prog)
        .ok_or_else(|| EbpfError::Attach {
            program: prog.into(),
            tracepoint: CRED_HOOK.into(),
            detail: "not in the object".into(),
        })?
        .try_into()
        .map_err(|e| program_error(prog, CRED_HOOK, e))?;
    p.load(CRED_HOOK, btf).map_err(|e| program_error(prog, CRED_HOOK, e))?;
    p.attach().map_err(|e| program_error(prog, CRED_HOOK, e))?;
    Ok(())
}

/// The enter program on the three enter tracepoints first (so no exit misses its enter), then
/// the exit program on the three exit tracepoints.
fn attach_setuid(ebpf: &mut Ebpf) -> Result<(), EbpfError> {
    for (prog, side) in [(SETUID_ENTER_PROGRAM, "enter"), (SETUID_PROGRAM, "exit")] {
        let p: &mut TracePoint = ebpf
            .program_mut(prog)
            .ok_or_else(|| EbpfError::Attach {
                program: prog.into(),
                tracepoint: "syscalls".into(),
                detail: "not in the object".into(),
            })?
            .try_into()
            .map_err(|e| program_error(prog, "syscalls", e))?;
        p.load().map_err(|e| program_error(prog, "syscalls", e))?;
        for sc in SETUID_SYSCALLS {
            let tp = format!("sys_{side}_{sc}");
            p.attach("syscalls", &tp).map_err(|e| match program_error(prog, &format!("syscalls/{tp}"), e) {
                // Debian's default level 3 (a distribution patch) restricts perf_event_open, which
                // classic tracepoints attach through, to CAP_SYS_ADMIN whatever CAP_PERFMON says.
                EbpfError::Permission { what, detail } => match perf_event_paranoid() {
                    Some(level) if level > 2 => EbpfError::PerfParanoid { what, level, detail },
                    _ => EbpfError::Permission { what, detail },
                },
                other => other,
            })?;
        }
    }
    Ok(())
}

fn perf_event_paranoid() -> Option<i32> {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use aya::Btf as AyaBtf;

    use super::*;

    /// Kernels before 6.16 get `sched_process_exit_live`, which a newer kernel never loads on its
    /// own: make sure the verifier accepts it on every kernel (loading checks it; no attach
    /// needed). `sched_process_exit_gd` loads its `group_dead` argument directly, which only a
    /// kernel whose tracepoint has it accepts.
    #[test]
    fn both_exit_variants_pass_the_verifier() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 || OBJECT.is_empty() || !Path::new(VMLINUX).exists() {
            eprintln!("skipped: needs root, the BPF object and {VMLINUX}");
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
    fn the_kernel_reports_each_event_programs_skipped_runs() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 || OBJECT.is_empty() || !Path::new(VMLINUX).exists() {
            eprintln!("skipped: needs root, the BPF object and {VMLINUX}");
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

    #[test]
    fn reasons_are_single_tokens() {
        let errors = [
            EbpfError::NoObject,
            EbpfError::RingSize { bytes: 1, page: 4096 },
            EbpfError::Tracefs { path: TRACEFS.into(), detail: String::new() },
            EbpfError::Permission { what: String::new(), detail: String::new() },
            EbpfError::Load { detail: String::new() },
            EbpfError::Attach { program: String::new(), tracepoint: String::new(), detail: String::new() },
            EbpfError::Map { name: "EVENTS" },
        ];
        for e in errors {
            let r = e.reason();
            assert!(!r.is_empty() && r.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'), "{r}");
        }
    }
}
