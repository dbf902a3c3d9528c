//! `guard-probe slot-job FILE WORK_MS [handler]`: the heavy command of the slots tests. It waits
//! 300 ms (a slot holds it within milliseconds of its exec, so the hold lands before its work),
//! appends `start <pid> <boottime ns>` to FILE, works WORK_MS (sleeping), appends `end <pid>
//! <ns>` and exits 0. With `handler` it catches SIGTERM and SIGINT (as a build tool does), appends
//! `armed <pid>` once its handlers are in place, and on a signal `signal<sig> <pid>` and exits 3:
//! a frozen process with a handler holds the signal until it thaws, so only a released one can
//! write that line.
use std::{io::Write, time::Duration};

static mut FILE: Option<std::fs::File> = None;

fn boottime_ns() -> u128 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}

fn note(what: &str) {
    // SAFETY: set once before any handler is installed; one write(2) per line.
    unsafe {
        #[allow(static_mut_refs)]
        if let Some(f) = FILE.as_mut() {
            let _ = f.write_all(format!("{what} {} {}\n", std::process::id(), boottime_ns()).as_bytes());
        }
    }
}

extern "C" fn on_signal(sig: i32) {
    note(&format!("signal{sig}"));
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(3) };
}

pub fn main(args: &[String]) -> ! {
    let file = std::fs::OpenOptions::new().append(true).create(true).open(&args[0]).expect("slot-job FILE");
    let work: u64 = args[1].parse().expect("slot-job WORK_MS");
    // SAFETY: single-threaded; the handler only formats, writes and exits.
    unsafe {
        FILE = Some(file);
        if args.get(2).map(String::as_str) == Some("handler") {
            for sig in [libc::SIGTERM, libc::SIGINT] {
                libc::signal(sig, on_signal as *const () as libc::sighandler_t);
            }
            // Said once both are in place: a job frozen before this line has no handler yet.
            note("armed");
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    note("start");
    std::thread::sleep(Duration::from_millis(work));
    note("end");
    std::process::exit(0)
}
