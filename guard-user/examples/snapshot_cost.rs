//! `cargo xtask bench`'s probe for the cost of one snapshot of the machine's processes: the BPF
//! task iterator, the /proc scan, and the stall watch's CPU sample of one account, both ways
//! (the scheduler accounting the daemon uses, and the task iterator's pass, its fallback). Not
//! shipped; xtask builds it with `cargo build --release --example snapshot_cost`.
//!
//! Usage: `snapshot_cost <uid> <reps>` (as root). Prints one JSON object per repetition:
//! `{"iter_cpu_ms":…,"iter_wall_ms":…,"procfs_cpu_ms":…,"procfs_wall_ms":…,"sample_cpu_ms":…,
//! "sample_wall_ms":…,"rt_sample_cpu_ms":…,"rt_sample_wall_ms":…,"processes":…,"sampled":…,
//! "rt_sampled":…}`. CPU is this process's (the /proc scan runs
//! on up to 4 threads; the iterator's kernel work is charged to the reading thread).
use std::time::Instant;

use guard::{
    ebpf::{EbpfOptions, EbpfSource},
    procfs,
};

fn process_cpu_ms() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 * 1e3 + t.tv_nsec as f64 / 1e6
}

/// (CPU ms, wall ms, result) of one call.
fn measure<T>(f: impl FnOnce() -> T) -> (f64, f64, T) {
    let (c0, w0) = (process_cpu_ms(), Instant::now());
    let out = f();
    (process_cpu_ms() - c0, w0.elapsed().as_secs_f64() * 1e3, out)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let uid: u32 = args.next().and_then(|a| a.parse().ok()).expect("usage: snapshot_cost <uid> <reps>");
    let reps: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let mut src = EbpfSource::load(&EbpfOptions { ring_bytes: Some(64 << 10), ..Default::default() })
        .expect("loading the BPF programs");
    let mut rt = src.take_cpu_runtime().expect("offered once").expect("the CPU accounting program loads");
    let _ = rt.sample(uid).expect("starting the accounting");
    let it = src.task_iter().unwrap_or_else(|| panic!("no task iterator: {:?}", src.task_iter_problem()));
    // Warm both paths once (page cache of /proc's dentries, the iterator's first allocation).
    let _ = it.snapshot().expect("iterator snapshot");
    let _ = procfs::snapshot().expect("/proc snapshot");
    for _ in 0..reps {
        let (ic, iw, snap) = measure(|| it.snapshot().expect("iterator snapshot"));
        let (pc, pw, _) = measure(|| procfs::snapshot().expect("/proc snapshot"));
        let (sc, sw, sample) = measure(|| it.cpu_sample(uid).expect("CPU sample"));
        let (rc, rw, rt_sample) = measure(|| rt.sample(uid).expect("CPU sample (accounting)"));
        println!(
            "{{\"iter_cpu_ms\":{ic:.3},\"iter_wall_ms\":{iw:.3},\"procfs_cpu_ms\":{pc:.3},\"procfs_wall_ms\":{pw:.3},\
             \"sample_cpu_ms\":{sc:.3},\"sample_wall_ms\":{sw:.3},\"rt_sample_cpu_ms\":{rc:.3},\
             \"rt_sample_wall_ms\":{rw:.3},\"processes\":{},\"sampled\":{},\"rt_sampled\":{}}}",
            snap.len(),
            sample.len(),
            rt_sample.len()
        );
    }
}
