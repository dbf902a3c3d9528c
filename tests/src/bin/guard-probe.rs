//! A probe process for the integration tests: copied under a test name (e.g. `agentihooks`) and
//! run as a test account. `guard-probe [threads N] [forks N] [record FILE] [args…]` sleeps
//! until killed; with `threads` it runs N extra threads, with `forks` N children that do not
//! exec (they keep the name), with `record` it appends every signal it receives to FILE.
use std::{io::Write, time::Duration};

static mut RECORD: Option<std::fs::File> = None;

extern "C" fn on_signal(sig: i32) {
    // SAFETY: single write of a small buffer from a signal handler (write(2) is async-signal-safe).
    unsafe {
        #[allow(static_mut_refs)]
        if let Some(f) = RECORD.as_mut() {
            let msg = format!("{} {sig}\n", libc::getpid());
            let _ = f.write_all(msg.as_bytes());
        }
        if sig == libc::SIGTERM {
            libc::_exit(0);
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mut threads = 0;
    let mut forks = 0;
    let mut i = 1;
    while i + 1 < args.len() {
        match args[i].as_str() {
            "threads" => threads = args[i + 1].parse().unwrap(),
            "forks" => forks = args[i + 1].parse().unwrap(),
            "record" => unsafe {
                RECORD = Some(std::fs::OpenOptions::new().append(true).create(true).open(&args[i + 1]).unwrap());
                for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGUSR1] {
                    libc::signal(sig, on_signal as *const () as libc::sighandler_t);
                }
            },
            _ => {}
        }
        i += 2;
    }
    for _ in 0..forks {
        // SAFETY: the child only sleeps.
        if unsafe { libc::fork() } == 0 {
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
    }
    for _ in 0..threads {
        std::thread::spawn(|| loop {
            std::thread::sleep(Duration::from_secs(3600));
        });
    }
    // Tell the test we are set up (threads and children exist).
    println!("ready");
    let _ = std::io::stdout().flush();
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
