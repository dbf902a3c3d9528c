//! Runs of our programs the kernel skipped. A tracing program does not nest on one CPU: while
//! it runs (and it can be preempted mid-run on kernels that allow it), another task reaching the
//! same attach point on that CPU is not given to it, and the kernel only counts the miss
//! (`bpf_prog_info.recursion_misses`, Linux 5.12+). Each miss is an event that never reached the
//! ring (a 7.3 guest lost a few exits of a fork storm this way, which left ghosts in the table),
//! so the source counts them with its lost records and the pump rebuilds the table.
use std::os::fd::{AsFd, AsRawFd};

use aya_obj::generated::{bpf_cmd, bpf_prog_info};

/// `recursion_misses` of the program behind `fd`; `None` if the kernel would not say (a kernel
/// before 5.12 says 0).
pub fn recursion_misses(fd: impl AsFd) -> Option<u64> {
    // SAFETY: bpf_prog_info is plain integers and arrays of them; all-zero is a valid value.
    let mut info: bpf_prog_info = unsafe { std::mem::zeroed() };
    /// The `info` member of `union bpf_attr` (BPF_OBJ_GET_INFO_BY_FD).
    #[repr(C)]
    struct InfoByFd {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    let attr = InfoByFd {
        bpf_fd: fd.as_fd().as_raw_fd() as u32,
        info_len: std::mem::size_of::<bpf_prog_info>() as u32,
        info: &mut info as *mut bpf_prog_info as u64,
    };
    // SAFETY: `attr` names a live program fd and a buffer of `info_len` bytes that outlives the
    // call; the kernel writes at most that many bytes into it.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            bpf_cmd::BPF_OBJ_GET_INFO_BY_FD as libc::c_long,
            &attr as *const InfoByFd,
            std::mem::size_of::<InfoByFd>(),
        )
    };
    (r == 0).then_some(info.recursion_misses)
}
