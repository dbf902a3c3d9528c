//! The heavy command of the slots bench (docs/BENCH.md): `heavy_job <spawned-at ns> <MiB>
//! <cpu ms> <out>` allocates and touches MiB of memory, burns cpu ms of CPU, and appends one
//! line to `out`: `<pid> <spawned-at> <main> <held-at> <resumed-at> <end>` (CLOCK_BOOTTIME ns;
//! `held-at`/`resumed-at` 0 when it never waited).
//!
//! Whether and when it was frozen it learns from the clock: for its first 200 ms it reads the
//! clock every 0.2 ms, and a gap of more than 150 ms between two readings is the freeze (a
//! scheduler delay on a busy 2-core host is a few ms). `held-at` is the last reading before the
//! gap, so `held-at − spawned-at` bounds the exec-to-held latency from above (it includes the
//! fork, the exec and the dynamic loader). A job frozen before its `main` sees no gap: its
//! `main − spawned-at` is then the wait, and its latency is unknown (reported as not measured).
use std::{io::Write, time::Duration};

fn boottime_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: as above.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn main() {
    let main_at = boottime_ns();
    let args: Vec<String> = std::env::args().collect();
    let spawned: u64 = args[1].parse().expect("spawned-at ns");
    let mib: usize = args[2].parse().expect("MiB");
    let cpu_ms: u64 = args[3].parse().expect("cpu ms");
    let (mut held, mut resumed) = (0, 0);
    let mut last = main_at;
    while last - main_at < 200_000_000 {
        std::thread::sleep(Duration::from_micros(200));
        let now = boottime_ns();
        if now - last > 150_000_000 {
            (held, resumed) = (last, now);
            break;
        }
        last = now;
    }
    let mut memory = vec![0u8; mib << 20];
    for page in memory.chunks_mut(4096) {
        page[0] = 1;
    }
    let mut x = 0u64;
    while cpu_ns() < cpu_ms * 1_000_000 {
        for i in 0..100_000u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
        }
    }
    std::hint::black_box((&memory, x));
    let end = boottime_ns();
    let line = format!("{} {spawned} {main_at} {held} {resumed} {end}\n", std::process::id());
    let mut f = std::fs::OpenOptions::new().append(true).open(&args[4]).expect("out");
    f.write_all(line.as_bytes()).expect("write");
}
