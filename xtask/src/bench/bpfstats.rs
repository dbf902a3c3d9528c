//! The kernel's own statistics of a daemon's BPF programs: with `kernel.bpf_stats_enabled=1`
//! every run of a program adds its time to `run_time_ns` and one to `run_cnt`
//! (`BPF_OBJ_GET_INFO_BY_FD`, what `bpftool prog show` prints). The programs are found through
//! the daemon's open fds: `/proc/PID/fdinfo/N` names the `prog_id` of each program fd and link
//! fd, and a tp_btf link's fdinfo its tracepoint (`tp_name`), which tells `sched_process_exec`
//! from `sched_process_exit_*` (the kernel keeps 15 bytes of a program's name).
use std::{collections::BTreeMap, fs};

use anyhow::Context as _;

/// `kernel.bpf_stats_enabled` set to 1 while this lives, then back to what it was (the sysctl
/// costs every BPF program of the machine two clock reads per run).
pub struct StatsEnabled {
    before: String,
}

const SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl StatsEnabled {
    pub fn on() -> anyhow::Result<StatsEnabled> {
        let before = fs::read_to_string(SYSCTL).with_context(|| format!("reading {SYSCTL}"))?;
        fs::write(SYSCTL, "1").with_context(|| format!("writing 1 to {SYSCTL}"))?;
        Ok(StatsEnabled { before })
    }
}

impl Drop for StatsEnabled {
    fn drop(&mut self) {
        let _ = fs::write(SYSCTL, self.before.trim());
    }
}

/// One program's counters.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    pub run_time_ns: u64,
    pub run_cnt: u64,
}

impl Counters {
    /// Mean ns per run between `before` and `self`; `None` without runs.
    pub fn ns_per_run_since(&self, before: &Counters) -> Option<f64> {
        let runs = self.run_cnt.checked_sub(before.run_cnt)?;
        (runs > 0).then(|| self.run_time_ns.saturating_sub(before.run_time_ns) as f64 / runs as f64)
    }

    pub fn runs_since(&self, before: &Counters) -> u64 {
        self.run_cnt.saturating_sub(before.run_cnt)
    }
}

/// The counters of every BPF program process `pid` holds, by what it is attached to (the
/// tracepoint, else the program's name as the kernel keeps it).
pub fn programs_of(pid: u32) -> anyhow::Result<BTreeMap<String, Counters>> {
    let mut tp_of: BTreeMap<u32, String> = BTreeMap::new();
    let mut ids = Vec::new();
    for entry in fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        let Ok(text) = fs::read_to_string(entry?.path()) else { continue };
        let field = |key: &str| text.lines().find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()));
        let Some(id) = field("prog_id:").and_then(|v| v.parse::<u32>().ok()) else { continue };
        if let Some(tp) = field("tp_name:") {
            tp_of.insert(id, tp);
        }
        ids.push(id);
    }
    ids.sort_unstable();
    ids.dedup();
    let mut out = BTreeMap::new();
    for id in ids {
        let Ok((name, c)) = info(id) else { continue };
        out.insert(tp_of.get(&id).cloned().unwrap_or(name), c);
    }
    Ok(out)
}

/// Offsets in `struct bpf_prog_info` (include/uapi/linux/bpf.h): `name[16]` at 64,
/// `run_time_ns` at 192, `run_cnt` at 200 (stable since Linux 5.1).
const INFO_NAME: usize = 64;
const INFO_RUN_TIME: usize = 192;
const INFO_RUN_CNT: usize = 200;
const INFO_LEN: usize = 256;

fn info(id: u32) -> anyhow::Result<(String, Counters)> {
    const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    // union bpf_attr: prog_id first; the rest zero.
    let mut attr = [0u32; 32];
    attr[0] = id;
    // SAFETY: a zeroed bpf_attr of the size given; returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_PROG_GET_FD_BY_ID, attr.as_mut_ptr(), 128u32) };
    anyhow::ensure!(fd >= 0, "BPF_PROG_GET_FD_BY_ID {id}: {}", std::io::Error::last_os_error());
    let mut buf = [0u8; INFO_LEN];
    // union bpf_attr, info: bpf_fd, info_len, info (a pointer).
    #[repr(C)]
    struct InfoByFd {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    let attr = InfoByFd { bpf_fd: fd as u32, info_len: INFO_LEN as u32, info: buf.as_mut_ptr() as u64 };
    // SAFETY: the buffer outlives the call and is `info_len` bytes.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            &attr as *const InfoByFd,
            std::mem::size_of::<InfoByFd>() as u32,
        )
    };
    let err = std::io::Error::last_os_error();
    // SAFETY: our fd.
    unsafe { libc::close(fd as i32) };
    anyhow::ensure!(r == 0, "BPF_OBJ_GET_INFO_BY_FD {id}: {err}");
    let u64_at = |o: usize| u64::from_ne_bytes(buf[o..o + 8].try_into().unwrap());
    let name = &buf[INFO_NAME..INFO_NAME + 16];
    let name = String::from_utf8_lossy(&name[..name.iter().position(|&b| b == 0).unwrap_or(16)]).into_owned();
    Ok((name, Counters { run_time_ns: u64_at(INFO_RUN_TIME), run_cnt: u64_at(INFO_RUN_CNT) }))
}
