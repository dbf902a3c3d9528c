//! Giving memory back after the moments that need a lot of it once: start-up and rebuilds.
//!
//! Measured at 10,000 tracked processes (docs/BENCH.md, the `scale` figure, smaps by mapping):
//! - a rebuild leaves its transient buffers' small pieces in glibc's heap (the table grown step
//!   by step, the records replayed over the scan): 0.3–1.4 MiB from one run to the next, free
//!   but resident. `malloc_trim` hands every free page of the heap back;
//! - start-up touches code and data that nothing touches again: parsing the kernel's BTF,
//!   loading the BPF object, the argument parser, and the dynamic linker's symbol lookups
//!   through every library's hash tables (the binary is linked with BIND_NOW). Those pages stay
//!   mapped, and with the kernel's fault-around each touch maps 64 KiB. After the first tick
//!   the daemon asks the kernel to reclaim its read-only file-backed pages (`MADV_PAGEOUT`,
//!   Linux 5.4): what the ticks need comes back on their first use (minor faults from the page
//!   cache), the rest leaves the process, and the page cache may drop it.

/// Returns the heap's free pages to the kernel.
pub fn heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap memory.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Asks the kernel to reclaim this process's read-only file-backed pages (code, read-only data,
/// the libraries'), see the module doc. Returns the bytes advised; 0 where the kernel has no
/// `MADV_PAGEOUT` (before 5.4) or /proc/self/maps cannot be read.
pub fn startup_pages() -> u64 {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else { return 0 };
    let mut advised = 0;
    for m in maps.lines().filter_map(read_only_file_mapping) {
        // SAFETY: the range is one of our own mappings, as the kernel listed it; MADV_PAGEOUT
        // never changes its contents, only whether its pages are resident.
        if unsafe { libc::madvise(m.0 as *mut libc::c_void, m.1 - m.0, libc::MADV_PAGEOUT) } == 0 {
            advised += (m.1 - m.0) as u64;
        }
    }
    advised
}

/// `(start, end)` of a line of /proc/PID/maps that maps a file (a path) without write
/// permission.
fn read_only_file_mapping(line: &str) -> Option<(usize, usize)> {
    let mut f = line.split_whitespace();
    let range = f.next()?;
    let perms = f.next()?;
    let path = f.nth(3)?;
    if !path.starts_with('/') || perms.as_bytes().get(1) != Some(&b'-') {
        return None;
    }
    let (a, b) = range.split_once('-')?;
    Some((usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_read_only_file_mappings_are_advised() {
        let text = "55d0120c0000-55d012413000 r-xp 000c2000 fe:00 6079480 /usr/bin/guard-user";
        assert_eq!(read_only_file_mapping(text), Some((0x55d0120c0000, 0x55d012413000)));
        for other in [
            "55d0222dd000-55d022532000 rw-p 00000000 00:00 0 [heap]",
            "7fb796618000-7fb79669d000 rw-p 00000000 00:00 0",
            "7fb7966e3000-7fb796764000 r--s 00001000 00:10 1039 anon_inode:bpf-map",
            "7fb797092000-7fb797094000 rw-p 00033000 fe:00 325843 /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
            "7ffd7536c000-7ffd7538d000 rw-p 00000000 00:00 0 [stack]",
        ] {
            assert_eq!(read_only_file_mapping(other), None, "{other}");
        }
    }

    #[test]
    fn advising_this_process_keeps_it_running() {
        let advised = startup_pages();
        // Code paged out is faulted back in: this test goes on running.
        assert!(advised > 0 || std::fs::read_to_string("/proc/self/maps").is_err());
        heap();
    }
}
