//! A probe process for the integration tests: copied under a test name (e.g. `agentihooks`) and
//! run as a test account. `guard-probe [threads N] [forks N] [record FILE] [args…]` sleeps
//! until killed; with `threads` it runs N extra threads, with `forks` N children that do not
//! exec (they keep the name), with `record` it appends every signal it receives to FILE, with
//! `rename NAME` / `rename-hex HEX` it renames itself (prctl; the hex form for names that are not
//! UTF-8), with `comm-hex HEX` it writes those bytes to /proc/self/comm (the other way to
//! rename, which `ps` and node's `process.title` use; it takes any byte but NUL), with
//! `userns new` it moves into a new user namespace of its own (unshare(2); a /proc scan then
//! reads its euid from `status`), with
//! `dodge NAME` it survives SIGTERM by renaming itself to NAME, with `dodge-back NAME` it does
//! the same and takes its own name back 1.5 s later (past the enforcer's SIGKILL re-check), with
//! `blank-cmdline 1` it overwrites its arguments so /proc/PID/cmdline reads empty, with
//! `leader-exits 1` its main thread exits once it is set up (a thread keeps the process alive,
//! its leader a zombie), with `busy ON/OFF`
//! it burns a core ON ms then sleeps OFF ms, forever (`busy 1000/0` spins), with `slow-memory MIB`
//! it maps MIB MiB of memory and changes its protection in a loop on a thread of its own, so
//! reading its command line (which takes its memory-map lock page by page) is slow, and `pad X`
//! pairs only lengthen its command line.
//!
//! `announce ROLE=FILE` appends `ROLE <pid>` to FILE; `session …`, `bomb …`, `visitor …`,
//! `leaver …` and `hopper …` are the session roots of the sessions tests, `visit`, `hop` and
//! `many` what they start (see `guard-probe/session.rs`); `chdir`, `chroot`, `open`, `map`,
//! `thread-chdir` and the other ways of holding a path are the holders tests'
//! (`guard-probe/hold.rs`); `slot-job …` is the heavy command of the slots tests (see
//! `guard-probe/slot_job.rs`).
//!
//! Two helper modes for the pid tests:
//! - `guard-probe pidns UID EXE ARGS…` (run as root): EXE as UID, as pid 1 of a new pid namespace
//!   (the child of this process, which waits for it and dies with it; no util-linux needed);
//! - `guard-probe churn LIST RECORD` (run as the test account): forks sleeping children that
//!   record signals to RECORD, as fast as fork allows and forever; each child's pid is appended
//!   to LIST; `full` is printed when fork first fails (the pid space is exhausted), after which it
//!   keeps retrying, so every pid that becomes free is taken again at once.
use std::{io::Write, time::Duration};

#[path = "guard-probe/hold.rs"]
mod hold;
#[path = "guard-probe/session.rs"]
mod session;
#[path = "guard-probe/slot_job.rs"]
mod slot_job;

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

/// The name `dodge` renames to on SIGTERM (NUL-terminated, set before the handler is installed).
static mut DODGE: [u8; 16] = [0; 16];

extern "C" fn on_term_dodge(_sig: i32) {
    // SAFETY: prctl is a plain syscall; DODGE is written once before the handler is installed.
    unsafe {
        #[allow(static_mut_refs)]
        libc::prctl(libc::PR_SET_NAME, DODGE.as_ptr());
    }
}

/// Set by the `dodge-back` handler: the main loop takes the name back.
static DODGED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_term_dodge_back(sig: i32) {
    on_term_dodge(sig);
    DODGED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Overwrites the argument area so /proc/PID/cmdline reads as empty: its first byte NUL and its
/// last one not, which the kernel reads as a setproctitle(3) title ending at the first NUL.
fn blank_cmdline() {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split_whitespace().collect();
    // proc(5): arg_start and arg_end are fields 48 and 49; `fields[0]` is field 3.
    let (start, end): (usize, usize) = (fields[45].parse().unwrap(), fields[46].parse().unwrap());
    // SAFETY: [arg_start, arg_end) is this process's own argument area, which nothing reads
    // again (std copied the arguments at start-up).
    unsafe {
        std::ptr::write_bytes(start as *mut u8, 0, end - start);
        *((end - 1) as *mut u8) = b'x';
    }
}

/// Maps `mib` MiB, touches every page, and flips the mapping between read-only and read-write
/// forever on a thread of its own: each `mprotect` takes the process's memory-map lock for
/// writing while it walks every page table entry, which is what a `/proc/PID/cmdline` read waits
/// for between pages.
fn slow_memory(mib: usize) {
    let len = mib << 20;
    // SAFETY: a fresh private anonymous mapping this process owns and never frees.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
            -1,
            0,
        )
    };
    assert_ne!(addr, libc::MAP_FAILED, "mmap {mib} MiB: {}", std::io::Error::last_os_error());
    let at = addr as usize;
    std::thread::spawn(move || loop {
        for prot in [libc::PROT_READ, libc::PROT_READ | libc::PROT_WRITE] {
            // SAFETY: the mapping made above, whole.
            unsafe { libc::mprotect(at as *mut libc::c_void, len, prot) };
        }
    });
}

fn rename(name: &[u8]) {
    let mut buf = [0u8; 16];
    let n = name.len().min(15);
    buf[..n].copy_from_slice(&name[..n]);
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes we own.
    unsafe { libc::prctl(libc::PR_SET_NAME, buf.as_ptr()) };
}

fn unhex(h: &str) -> Vec<u8> {
    (0..h.len()).step_by(2).map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap()).collect()
}

fn install_recorder(path: &str) {
    // SAFETY: the file is set before any handler can run; handlers only write(2) and _exit.
    unsafe {
        RECORD = Some(std::fs::OpenOptions::new().append(true).create(true).open(path).unwrap());
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGUSR1] {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
}

fn pidns(args: &[String]) -> ! {
    use std::ffi::CString;
    let uid: u32 = args[0].parse().expect("pidns UID");
    let argv: Vec<CString> = args[1..].iter().map(|a| CString::new(a.as_str()).unwrap()).collect();
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    // SAFETY: plain syscalls; the child only changes ids and execs.
    unsafe {
        if libc::unshare(libc::CLONE_NEWPID) != 0 {
            panic!("unshare(CLONE_NEWPID): {}", std::io::Error::last_os_error());
        }
        let child = libc::fork();
        assert!(child >= 0, "fork: {}", std::io::Error::last_os_error());
        if child == 0 {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(uid, uid, uid) != 0
                || libc::setresuid(uid, uid, uid) != 0
            {
                libc::_exit(126);
            }
            libc::execv(ptrs[0], ptrs.as_ptr());
            libc::_exit(127);
        }
        let mut status = 0;
        while libc::waitpid(child, &mut status, 0) < 0 {}
        libc::_exit(if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { 128 + libc::WTERMSIG(status) });
    }
}

fn churn(list: &str, record: &str) -> ! {
    install_recorder(record);
    let mut list = std::fs::OpenOptions::new().append(true).create(true).open(list).unwrap();
    let mut full = false;
    loop {
        // SAFETY: the child only sleeps (its signal handlers are the recorder's).
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        if pid > 0 {
            let _ = list.write_all(format!("{pid}\n").as_bytes());
        } else if !full {
            full = true;
            println!("full");
            let _ = std::io::stdout().flush();
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("pidns") => pidns(&args[2..]),
        Some("churn") => churn(&args[2], &args[3]),
        Some("session") => session::root(&args[2..]),
        Some("session-after-reexec") => session::after_reexec(&args[2..]),
        Some("bomb") => session::bomb(&args[2..]),
        Some("visitor") => session::visitor(&args[2..]),
        Some("leaver") => session::leaver(&args[2..]),
        Some("hopper") => session::hopper(&args[2..]),
        Some("visit") => session::visit(&args[2..]),
        Some("hop") => session::hop(&args[2..]),
        Some("many") => session::many(&args[2..]),
        Some("slot-job") => slot_job::main(&args[2..]),
        _ => {}
    }
    let mut threads = 0;
    let mut forks = 0;
    // `busy ON_MS/OFF_MS`: burn a core for ON_MS, then sleep OFF_MS, forever (OFF_MS 0: spin).
    let mut busy: Option<(u64, u64)> = None;
    let mut dodge_back = false;
    let mut leader_exits = false;
    let mut i = 1;
    while i + 1 < args.len() {
        match args[i].as_str() {
            "threads" => threads = args[i + 1].parse().unwrap(),
            "forks" => forks = args[i + 1].parse().unwrap(),
            "busy" => {
                let (on, off) = args[i + 1].split_once('/').unwrap();
                busy = Some((on.parse().unwrap(), off.parse().unwrap()));
            }
            "record" => install_recorder(&args[i + 1]),
            // `announce ROLE=FILE`: appends `ROLE <pid>` to FILE (the sessions tests' roles).
            "announce" => {
                let (role, file) = args[i + 1].split_once('=').unwrap();
                let mut f = std::fs::OpenOptions::new().append(true).create(true).open(file).unwrap();
                let _ = f.write_all(format!("{role} {}\n", std::process::id()).as_bytes());
            }
            // prctl(PR_SET_NAME): the leader's comm, as a program renaming itself does.
            "rename" => rename(args[i + 1].as_bytes()),
            "rename-hex" => rename(&unhex(&args[i + 1])),
            "comm-hex" => std::fs::write("/proc/self/comm", unhex(&args[i + 1])).unwrap(),
            "userns" => {
                // SAFETY: a plain syscall; the probe is still single-threaded here.
                let r = unsafe { libc::unshare(libc::CLONE_NEWUSER) };
                assert_eq!(r, 0, "unshare(CLONE_NEWUSER): {}", std::io::Error::last_os_error());
            }
            "blank-cmdline" => blank_cmdline(),
            "slow-memory" => slow_memory(args[i + 1].parse().unwrap()),
            "leader-exits" => leader_exits = true,
            "dodge-back" => {
                let name = args[i + 1].as_bytes();
                dodge_back = true;
                // SAFETY: written before the handler that reads it is installed.
                unsafe {
                    #[allow(static_mut_refs)]
                    DODGE[..name.len().min(15)].copy_from_slice(&name[..name.len().min(15)]);
                    libc::signal(libc::SIGTERM, on_term_dodge_back as *const () as libc::sighandler_t);
                }
            }
            "dodge" => {
                let name = args[i + 1].as_bytes();
                // SAFETY: written before the handler that reads it is installed.
                unsafe {
                    #[allow(static_mut_refs)]
                    DODGE[..name.len().min(15)].copy_from_slice(&name[..name.len().min(15)]);
                    libc::signal(libc::SIGTERM, on_term_dodge as *const () as libc::sighandler_t);
                }
            }
            other => {
                hold::apply(other, &args[i + 1]);
            }
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
    if leader_exits {
        std::thread::spawn(|| loop {
            std::thread::sleep(Duration::from_secs(3600));
        });
        // SAFETY: the raw exit(2) ends only this thread (exit_group would end them all), with no
        // unwinding through Rust frames (pthread_exit's forced unwind aborts in Rust's main); the
        // process lives on in the thread just spawned.
        unsafe { libc::syscall(libc::SYS_exit, 0) };
    }
    if dodge_back {
        let own = std::fs::read("/proc/self/comm").unwrap();
        loop {
            std::thread::sleep(Duration::from_millis(50));
            if DODGED.swap(false, std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1500));
                rename(own.strip_suffix(b"\n").unwrap_or(&own));
            }
        }
    }
    if let Some((on, off)) = busy {
        let mut x = 0u64;
        loop {
            let until = std::time::Instant::now() + Duration::from_millis(on);
            while std::time::Instant::now() < until {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
            if off > 0 {
                std::thread::sleep(Duration::from_millis(off));
            }
        }
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
