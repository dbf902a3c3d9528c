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
//!   the daemon gives its read-only file-backed pages back: what the ticks need comes back on
//!   their first use (minor faults from the page cache), the rest leaves the process. Two
//!   advices, because one is not enough: `MADV_PAGEOUT` (Linux 5.4) reclaims the pages only this
//!   process maps (the binary's start-up code: the page cache may drop them), but leaves every
//!   page another process maps too: the libraries' (every process maps libc) and the binary's
//!   pages the matcher worker runs. `MADV_DONTNEED` then unmaps those from this process (they
//!   stay in the page cache for the others). Measured at 10,000 tracked processes: the
//!   libraries 2.3 → 1.3 MiB resident (docs/BENCH.md, the `scale` figure).
//!
//! `MADV_DONTNEED` on a private file mapping drops the pages the process wrote (copied on
//! write) as well: their next read gives the file's bytes again. So it is advised only on
//! mappings that have no such page (`Anonymous: 0 kB` in /proc/self/smaps): never the
//! relocated read-only data (RELRO: written by the dynamic linker, then made read-only), whose
//! loss would undo the relocations. A read-only mapping cannot gain such a page afterwards (no
//! write reaches it), so the check and the advice cannot disagree.

/// Returns the heap's free pages to the kernel.
pub fn heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap memory.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Gives back this process's read-only file-backed pages (code, read-only data, the
/// libraries'), see the module doc: `MADV_PAGEOUT` on each such mapping, then `MADV_DONTNEED` on
/// those without a page of their own. Returns the bytes advised; 0 where /proc/self/smaps cannot
/// be read. A kernel without `MADV_PAGEOUT` (before 5.4) refuses it and the unmapping still
/// happens.
pub fn startup_pages() -> u64 {
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else { return 0 };
    let mut advised = 0;
    for m in read_only_file_mappings(&smaps) {
        let (at, len) = (m.start as *mut libc::c_void, m.end - m.start);
        // SAFETY: the range is one of our own mappings, as the kernel listed it; MADV_PAGEOUT
        // never changes its contents, only whether its pages are resident.
        let paged = unsafe { libc::madvise(at, len, libc::MADV_PAGEOUT) } == 0;
        // SAFETY: as above; on a private mapping without anonymous pages every page is the
        // file's, so after MADV_DONTNEED every read still gives the same bytes (module doc).
        let dropped = m.file_pages_only && unsafe { libc::madvise(at, len, libc::MADV_DONTNEED) } == 0;
        if paged || dropped {
            advised += len as u64;
        }
    }
    advised
}

/// A mapping of a file (a path) without write permission, from /proc/PID/smaps.
#[derive(Debug, PartialEq)]
struct Mapping {
    start: usize,
    end: usize,
    /// Private, and not one of its pages is anonymous (copied on write): every page it holds
    /// reads as the file does.
    file_pages_only: bool,
}

/// The read-only file mappings of /proc/PID/smaps: a header line (`start-end perms offset dev
/// inode path`) followed by its fields (`Anonymous:   N kB`, …).
fn read_only_file_mappings(smaps: &str) -> Vec<Mapping> {
    let mut out: Vec<Mapping> = Vec::new();
    // Whether the mapping of the last header was kept, and whether it is private.
    let mut current: Option<bool> = None;
    for line in smaps.lines() {
        if let Some(private) = current {
            if let Some(kib) = line.strip_prefix("Anonymous:") {
                let anon = kib.split_whitespace().next().and_then(|n| n.parse::<u64>().ok());
                if let Some(m) = out.last_mut() {
                    m.file_pages_only = private && anon == Some(0);
                }
                continue;
            }
        }
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else { continue };
        let Some((a, b)) = range.split_once('-') else { continue };
        let (Ok(start), Ok(end)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else { continue };
        if perms.len() != 4 {
            continue;
        }
        current = None;
        let path = f.nth(3).unwrap_or("");
        if path.starts_with('/') && perms.as_bytes()[1] == b'-' {
            out.push(Mapping { start, end, file_pages_only: false });
            current = Some(perms.as_bytes()[3] == b'p');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_read_only_file_mappings_are_advised_and_only_clean_ones_dropped() {
        let smaps = "\
55d0120c0000-55d012413000 r-xp 000c2000 fe:00 6079480 /usr/bin/guard-user
Size:               3556 kB
Rss:                2852 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me dw
55d012413000-55d012424000 r--p 00434000 fe:00 6079480 /usr/bin/guard-user
Rss:                  68 kB
Anonymous:            68 kB
55d0222dd000-55d022532000 rw-p 00000000 00:00 0 [heap]
Anonymous:           644 kB
7fb796618000-7fb79669d000 rw-p 00000000 00:00 0
Anonymous:            36 kB
7fb7966e3000-7fb796764000 r--s 00001000 00:10 1039 anon_inode:bpf-map
Anonymous:             0 kB
7fb796800000-7fb796801000 r--s 00000000 00:01 2049 /memfd:guard-page (deleted)
Anonymous:             0 kB
7fb797092000-7fb797094000 rw-p 00033000 fe:00 325843 /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
Anonymous:             8 kB
7fb7970a0000-7fb7970c2000 r--p 00000000 fe:00 325843 /usr/lib/x86_64-linux-gnu/libc.so.6
Anonymous:             0 kB
7ffd7536c000-7ffd7538d000 rw-p 00000000 00:00 0 [stack]
Anonymous:           104 kB
";
        let m = |start, end, file_pages_only| Mapping { start, end, file_pages_only };
        assert_eq!(
            read_only_file_mappings(smaps),
            vec![
                m(0x55d0120c0000, 0x55d012413000, true),
                // Relocated read-only data: written by the dynamic linker, never dropped.
                m(0x55d012413000, 0x55d012424000, false),
                // Shared: never dropped.
                m(0x7fb796800000, 0x7fb796801000, false),
                m(0x7fb7970a0000, 0x7fb7970c2000, true),
            ]
        );
    }

    /// A private read-only mapping with a page written before it was made read-only (as the
    /// dynamic linker leaves relocated data) keeps the written bytes; a clean one is unmapped
    /// and still reads as the file.
    #[test]
    fn written_pages_survive_and_clean_ones_leave() {
        use std::{io::Write as _, os::fd::AsRawFd as _};
        let page = 4096;
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&vec![b'a'; 2 * page]).unwrap();
        let map = |prot| {
            // SAFETY: a fresh mapping of our own file, unmapped at the end of the test.
            let p = unsafe { libc::mmap(std::ptr::null_mut(), 2 * page, prot, libc::MAP_PRIVATE, file.as_raw_fd(), 0) };
            assert_ne!(p, libc::MAP_FAILED);
            p.cast::<u8>()
        };
        let written = map(libc::PROT_READ | libc::PROT_WRITE);
        let clean = map(libc::PROT_READ);
        // SAFETY: both mappings are 2 pages long and readable; `written` is writable until the
        // mprotect.
        unsafe {
            *written = b'b';
            assert_eq!(libc::mprotect(written.cast(), 2 * page, libc::PROT_READ), 0);
            assert_eq!(std::ptr::read_volatile(clean), b'a');
        }
        let resident = |at: *mut u8| {
            let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
            let head = format!("{:x}-", at as usize);
            let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&head));
            lines.find_map(|l| l.strip_prefix("Rss:")).map(|kb| kb.trim().to_string())
        };
        assert_ne!(resident(clean).as_deref(), Some("0 kB"), "read, so resident (with its fault-around)");
        startup_pages();
        assert_eq!(resident(clean).as_deref(), Some("0 kB"), "the clean mapping is unmapped");
        // SAFETY: as above.
        unsafe {
            assert_eq!(std::ptr::read_volatile(written), b'b', "the written page is kept");
            assert_eq!(std::ptr::read_volatile(clean), b'a');
            libc::munmap(written.cast(), 2 * page);
            libc::munmap(clean.cast(), 2 * page);
        }
    }

    #[test]
    fn advising_this_process_keeps_it_running() {
        let advised = startup_pages();
        // Code paged out is faulted back in: this test goes on running.
        assert!(advised > 0 || std::fs::read_to_string("/proc/self/smaps").is_err());
        heap();
    }
}
