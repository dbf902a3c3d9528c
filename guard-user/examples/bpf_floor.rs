//! `cargo xtask bench`'s measurement floor for the `bpf` figure: attaches guard-ebpf's `noop`
//! program to `sched_process_fork`, says `ready`, and keeps it attached until stdin closes. The
//! bench reads its ns per run (`kernel.bpf_stats_enabled`) beside the daemon's programs: the
//! part of every run's time that is the kernel's own clock reads. Not shipped; xtask builds it
//! with `cargo build --release --example bpf_floor`.
use std::io::{Read, Write};

fn main() {
    let _probe = guard::ebpf::load_noop_probe().expect("attaching the no-op program");
    println!("ready");
    std::io::stdout().flush().expect("stdout");
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}
