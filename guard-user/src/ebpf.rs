//! The `ebpf` event source: loads guard's BPF programs, attaches them to the process
//! tracepoints, hands the offsets from [`crate::btf`] to them, and drains the ring buffer.
//!
//! Order matters: attach everything first, then mark `OFFSETS` ready, then the daemon scans
//! /proc (see `daemon` for why that order misses nothing).
use std::os::fd::AsRawFd;

use aya::{
    maps::{Array, MapData, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, TracePoint},
    Btf as AyaBtf, Ebpf, EbpfLoader,
};
use guard_common::{KernelOffsets, DEFAULT_RING_BYTES, LOST_INDEX};
use tokio::io::unix::AsyncFd;

use crate::{
    btf::{Btf, BtfError, VMLINUX},
    event::{DecodeError, Event},
};

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/guard.bpf.o"));

const TRACEFS: &str = "/sys/kernel/tracing";

pub struct EbpfOptions {
    /// Ring buffer bytes (a power of two ≥ the page size); None = the default 4 MiB.
    pub ring_bytes: Option<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    #[error("this guard-user was built without BPF programs (build it with `cargo xtask build`)")]
    NoObject,
    #[error("--ring-bytes {0}: must be a power of two of at least 4096")]
    RingSize(u32),
    #[error(transparent)]
    Btf(#[from] BtfError),
    #[error("loading BPF needs root (CAP_BPF and CAP_PERFMON): {0}")]
    Permission(String),
    #[error("cannot load the BPF object: {0}")]
    Load(String),
    #[error("cannot load or attach `{program}`: {detail}")]
    Attach { program: &'static str, detail: String },
    #[error("BPF map `{0}` is missing or of the wrong type")]
    Map(&'static str),
    #[error("cannot watch the ring buffer: {0}")]
    Poll(std::io::Error),
}

impl EbpfError {
    /// The token for `WARN backend_fallback reason=<token>`.
    pub fn reason(&self) -> &'static str {
        match self {
            EbpfError::NoObject => "no_bpf_object",
            EbpfError::RingSize(_) => "bad_ring_size",
            EbpfError::Btf(_) => "no_btf",
            EbpfError::Permission(_) => "permission_denied",
            EbpfError::Load(_) | EbpfError::Map(_) | EbpfError::Poll(_) => "load_failed",
            EbpfError::Attach { .. } => "attach_failed",
        }
    }
}

fn is_permission(detail: &str) -> bool {
    detail.contains("Operation not permitted") || detail.contains("Permission denied")
}

pub struct EbpfSource {
    /// Keeps programs and links alive.
    _ebpf: Ebpf,
    ring: AsyncFd<RingBuf<MapData>>,
    lost: PerCpuArray<MapData, u64>,
    setuid_tracked: bool,
}

/// Mounts tracefs when its event directory is absent (classic tracepoints resolve their ids
/// there). Fails quietly: without it only the setuid tracepoints are lost, and the audit
/// covers those.
fn ensure_tracefs() -> bool {
    if std::path::Path::new(TRACEFS).join("events").is_dir() {
        return true;
    }
    let c = |s: &str| std::ffi::CString::new(s).unwrap();
    // SAFETY: valid C strings; mount(2) has no other memory preconditions.
    let rc = unsafe { libc::mount(c("tracefs").as_ptr(), c(TRACEFS).as_ptr(), c("tracefs").as_ptr(), 0, std::ptr::null()) };
    if rc != 0 {
        eprintln!(
            "guard-user: cannot mount tracefs on {TRACEFS}: {} (setuid changes are then seen by the audit only)",
            std::io::Error::last_os_error()
        );
    }
    std::path::Path::new(TRACEFS).join("events").is_dir()
}

impl EbpfSource {
    pub fn load(opts: &EbpfOptions) -> Result<EbpfSource, EbpfError> {
        if OBJECT.is_empty() {
            return Err(EbpfError::NoObject);
        }
        let ring_bytes = opts.ring_bytes.unwrap_or(DEFAULT_RING_BYTES);
        if ring_bytes < 4096 || !ring_bytes.is_power_of_two() {
            return Err(EbpfError::RingSize(ring_bytes));
        }
        let btf = Btf::from_file(std::path::Path::new(VMLINUX))?;
        let mut offsets = btf.kernel_offsets()?;
        let aya_btf = AyaBtf::from_sys_fs().map_err(|e| EbpfError::Load(e.to_string()))?;
        let mut ebpf = EbpfLoader::new().btf(Some(&aya_btf)).map_max_entries("EVENTS", ring_bytes).load(OBJECT).map_err(|e| {
            let d = format!("{e:#}");
            if is_permission(&d) { EbpfError::Permission(d) } else { EbpfError::Load(d) }
        })?;
        let exit_prog = if offsets.exit_has_group_dead != 0 { "sched_process_exit_gd" } else { "sched_process_exit_live" };
        for (prog, tp) in [
            ("sched_process_fork", "sched_process_fork"),
            ("sched_process_exec", "sched_process_exec"),
            (exit_prog, "sched_process_exit"),
            ("task_rename", "task_rename"),
        ] {
            let attach = |ebpf: &mut Ebpf| -> Result<(), String> {
                let p: &mut BtfTracePoint =
                    ebpf.program_mut(prog).ok_or("missing from the object")?.try_into().map_err(|e| format!("{e}"))?;
                p.load(tp, &aya_btf).map_err(|e| format!("{e:#}"))?;
                p.attach().map_err(|e| format!("{e:#}"))?;
                Ok(())
            };
            attach(&mut ebpf).map_err(|detail| {
                if is_permission(&detail) {
                    EbpfError::Permission(detail)
                } else {
                    EbpfError::Attach { program: prog, detail }
                }
            })?;
        }
        let setuid_tracked = ensure_tracefs() && {
            let r = (|| -> Result<(), String> {
                let p: &mut TracePoint =
                    ebpf.program_mut("sys_exit_setuid").ok_or("missing")?.try_into().map_err(|e| format!("{e}"))?;
                p.load().map_err(|e| format!("{e:#}"))?;
                for sc in ["sys_exit_setuid", "sys_exit_setreuid", "sys_exit_setresuid"] {
                    p.attach("syscalls", sc).map_err(|e| format!("{sc}: {e:#}"))?;
                }
                Ok(())
            })();
            if let Err(e) = &r {
                eprintln!("guard-user: setuid tracepoints unavailable ({e}); the audit catches uid changes");
            }
            r.is_ok()
        };
        let ring = RingBuf::try_from(ebpf.take_map("EVENTS").ok_or(EbpfError::Map("EVENTS"))?)
            .map_err(|_| EbpfError::Map("EVENTS"))?;
        let lost = PerCpuArray::try_from(ebpf.take_map("LOST").ok_or(EbpfError::Map("LOST"))?)
            .map_err(|_| EbpfError::Map("LOST"))?;
        let mut offs: Array<_, KernelOffsets> = Array::try_from(ebpf.map_mut("OFFSETS").ok_or(EbpfError::Map("OFFSETS"))?)
            .map_err(|_| EbpfError::Map("OFFSETS"))?;
        offsets.ready = 1;
        offs.set(0, offsets, 0).map_err(|e| EbpfError::Load(e.to_string()))?;
        // The fd is owned by the RingBuf that AsyncFd itself owns, so it cannot be closed
        // while registered: the I/O-safety concern behind the deprecation does not arise.
        #[allow(deprecated)]
        let ring = AsyncFd::new(ring).map_err(EbpfError::Poll)?;
        Ok(EbpfSource { _ebpf: ebpf, ring, lost, setuid_tracked })
    }

    /// Whether uid changes without exec are reported (the syscall tracepoints attached).
    pub fn setuid_tracked(&self) -> bool {
        self.setuid_tracked
    }

    /// Records the kernel could not queue, summed over CPUs (monotonic).
    pub fn lost(&self) -> u64 {
        self.lost.get(&LOST_INDEX, 0).map(|v| v.iter().sum()).unwrap_or(0)
    }

    /// Waits until records are available, then moves up to `max` of them into `out`.
    /// Cancel-safe: records leave the ring only after the last await.
    pub async fn next_batch(&mut self, out: &mut Vec<Result<Event, DecodeError>>, max: usize) -> std::io::Result<usize> {
        loop {
            let mut guard = self.ring.readable_mut().await?;
            let ring = guard.get_inner_mut();
            let mut n = 0;
            while n < max {
                match ring.next() {
                    Some(item) => {
                        out.push(Event::decode(&item));
                        n += 1;
                    }
                    None => break,
                }
            }
            if n == 0 {
                guard.clear_ready();
                continue;
            }
            return Ok(n);
        }
    }

    /// The ring buffer's fd (for diagnostics).
    pub fn ring_fd(&self) -> i32 {
        self.ring.get_ref().as_raw_fd()
    }
}
