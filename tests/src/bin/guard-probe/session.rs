//! Session roots for the sessions tests (run as the test account, copied as `agent-wrapper`):
//!
//! - `session DIR OTHER_UID [reexec]`: forks what an agent wrapper leaves behind, then waits for
//!   a line on stdin and exits. Its processes announce themselves in `DIR/pids` (`<role> <pid>`)
//!   and record the signals they get in `DIR/signals` (`<pid> <signal>`):
//!   `setsid` (a child that calls setsid(2) and execs `DIR/watcher`), `double` (a grandchild
//!   whose parent exits at once, reparented to init, that execs `DIR/daemonish`), `excluded`
//!   (execs `DIR/claude`), `renamed` (renames itself without exec and ignores SIGTERM, so only
//!   SIGKILL ends it) and, when the root's real uid is 0 and OTHER_UID is not, `other` (a child
//!   that becomes OTHER_UID's process through setuid). With `reexec`, the first line makes the
//!   root exec itself (`session-after-reexec DIR`), which forks one more watcher (`late`) and
//!   waits for a second line.
//! - `bomb DIR N`: forks N children, each of which forks one more (2N processes, none execs),
//!   prints `ready` once all 2N exist, waits for a line and exits.
//! - `visitor DIR`: forks a child that execs `DIR/sgish visit DIR` (a set-user-ID-root copy of
//!   the probe: see `visit`), waits until it announced `visited`, `back` and `sgish`, prints
//!   `ready`, waits for a line and exits.
//! - `leaver DIR`: prints `ready`, and at a line execs `DIR/sgish visit DIR` itself: the root
//!   leaves the account.
//! - `hopper DIR MS`: forks a child that execs `DIR/hopper hop MS DIR/hops` (see `hop`), prints
//!   `ready`, waits for a line and exits.
//! - `visit DIR` (run set-user-ID root by the account, as `sg` and `newgrp` are): forks while
//!   root a child that comes back to the account's uid and execs `DIR/watcher` (`visited`), as `sg`
//!   does; then comes back itself and forks `DIR/watcher` (`back`), as `newgrp` does; then
//!   records signals and sleeps (`sgish`).
//! - `hop MS FILE`: a loop that keeps moving to new pids: appends its pid to FILE, sleeps MS ms
//!   (0: not at all), forks, and the parent exits; it ignores SIGTERM, so only SIGKILL ends it. It stays in its
//!   process group, which the tests kill as a whole (atomically, forks included).
//! - `many N EXE [ARG…]`: forks N children that each exec EXE with exactly the arguments ARG…
//!   (none: an empty argv), their standard input a pipe this process holds open (so a `cat`
//!   waits on it for as long as this process lives), prints `ready` and sleeps.
use std::{
    ffi::CString,
    fs::OpenOptions,
    io::{BufRead, Write},
    time::{Duration, Instant},
};

fn cstr(s: &str) -> CString {
    CString::new(s).unwrap()
}

/// execv(path, argv); returns only on failure (then the child exits 127).
fn exec(path: &str, argv: &[&str]) -> ! {
    let argv: Vec<CString> = argv.iter().map(|a| cstr(a)).collect();
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let path = cstr(path);
    // SAFETY: NUL-terminated strings and a NULL-terminated argv that outlive the call.
    unsafe {
        libc::execv(path.as_ptr(), ptrs.as_ptr());
        libc::_exit(127);
    }
}

fn announce(dir: &str, role: &str, pid: u32) {
    let mut f = OpenOptions::new().append(true).create(true).open(format!("{dir}/pids")).unwrap();
    let _ = f.write_all(format!("{role} {pid}\n").as_bytes());
}

/// Points stdout at /dev/null: only the root says `ready` on the test's pipe.
fn stdout_to_null() {
    // SAFETY: plain syscalls on fds this process owns.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY);
        libc::dup2(null, 1);
    }
}

/// A child that execs `DIR/<exe>` as one of the root's leftovers.
fn spawn_exec(dir: &str, exe: &str, role: &str, setsid: bool) {
    // SAFETY: the child only makes syscalls and execs.
    if unsafe { libc::fork() } == 0 {
        // SAFETY: plain syscalls. Its stdout is not the root's: only the root says `ready`.
        unsafe {
            if setsid {
                libc::setsid();
            }
        }
        stdout_to_null();
        let (path, signals, pids) = (format!("{dir}/{exe}"), format!("{dir}/signals"), format!("{role}={dir}/pids"));
        exec(&path, &[exe, "record", &signals, "announce", &pids]);
    }
}

static mut SIGNALS: i32 = -1;

extern "C" fn record_only(sig: i32) {
    // SAFETY: write(2) of a small stack buffer from a signal handler; SIGNALS is set before.
    unsafe {
        let mut buf = [0u8; 32];
        let msg = format!("{} {sig}\n", libc::getpid());
        let n = msg.len().min(buf.len());
        buf[..n].copy_from_slice(&msg.as_bytes()[..n]);
        libc::write(SIGNALS, buf.as_ptr().cast(), n);
    }
}

fn sleep_forever() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Waits until `DIR/pids` names every role in `roles` (at most 10 s).
fn wait_announced(dir: &str, roles: &[&str]) {
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        let pids = std::fs::read_to_string(format!("{dir}/pids")).unwrap_or_default();
        if roles.iter().all(|r| pids.lines().any(|l| l.split(' ').next() == Some(r))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("not every role announced itself in {dir}/pids");
}

fn ready_then_wait_line() {
    println!("ready");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
}

pub fn root(args: &[String]) -> ! {
    let dir = args[0].as_str();
    let other: u32 = args[1].parse().unwrap();
    let reexec = args.get(2).is_some_and(|a| a == "reexec");
    let mut roles = vec!["setsid", "double", "excluded", "renamed"];
    spawn_exec(dir, "watcher", "setsid", true);
    // The double fork: the middle process exits at once, its child is reparented to init.
    // SAFETY: both children only make syscalls and exec or exit.
    let middle = unsafe { libc::fork() };
    if middle == 0 {
        spawn_exec(dir, "daemonish", "double", false);
        // SAFETY: exits the middle process at once.
        unsafe { libc::_exit(0) };
    }
    // SAFETY: reaps the middle process.
    unsafe { libc::waitpid(middle, std::ptr::null_mut(), 0) };
    spawn_exec(dir, "claude", "excluded", false);
    // SAFETY: the child renames itself, records signals and sleeps.
    if unsafe { libc::fork() } == 0 {
        let f = OpenOptions::new().append(true).create(true).open(format!("{dir}/signals")).unwrap();
        // SAFETY: the fd is kept open for the handler; prctl and signal are plain calls.
        unsafe {
            use std::os::fd::IntoRawFd;
            SIGNALS = f.into_raw_fd();
            libc::prctl(libc::PR_SET_NAME, c"renamed".as_ptr());
            libc::signal(libc::SIGTERM, record_only as *const () as libc::sighandler_t);
        }
        announce(dir, "renamed", std::process::id());
        sleep_forever();
    }
    // SAFETY: getuid has no preconditions.
    if other != 0 && unsafe { libc::getuid() } == 0 {
        roles.push("other");
        // SAFETY: the child only changes its ids (its real uid 0 allows it), then sleeps.
        if unsafe { libc::fork() } == 0 {
            let f = OpenOptions::new().append(true).create(true).open(format!("{dir}/signals")).unwrap();
            announce(dir, "other", std::process::id());
            // SAFETY: plain syscalls; the handler only writes to the fd kept here.
            unsafe {
                use std::os::fd::IntoRawFd;
                SIGNALS = f.into_raw_fd();
                let ok = libc::setresuid(0, 0, 0) == 0
                    && libc::setgroups(0, std::ptr::null()) == 0
                    && libc::setresgid(other, other, other) == 0
                    && libc::setresuid(other, other, other) == 0;
                assert!(ok, "setuid to {other}: {}", std::io::Error::last_os_error());
                libc::signal(libc::SIGTERM, record_only as *const () as libc::sighandler_t);
            }
            sleep_forever();
        }
    }
    wait_announced(dir, &roles);
    ready_then_wait_line();
    if reexec {
        let me = std::fs::read_link("/proc/self/exe").unwrap();
        exec(me.to_str().unwrap(), &["agent-wrapper", "session-after-reexec", dir]);
    }
    std::process::exit(0)
}

/// The root after it exec'd itself: one more leftover, then a line to end.
pub fn after_reexec(args: &[String]) -> ! {
    let dir = args[0].as_str();
    spawn_exec(dir, "watcher", "late", false);
    wait_announced(dir, &["late"]);
    ready_then_wait_line();
    std::process::exit(0)
}

/// `execv(path, argv)` with exactly `argv` (possibly empty); returns only on failure.
fn exec_exact(path: &str, argv: &[&str]) -> ! {
    let argv: Vec<CString> = argv.iter().map(|a| cstr(a)).collect();
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let path = cstr(path);
    // SAFETY: NUL-terminated strings and a NULL-terminated argv that outlive the call.
    unsafe {
        libc::execv(path.as_ptr(), ptrs.as_ptr());
        libc::_exit(127);
    }
}

pub fn visitor(args: &[String]) -> ! {
    let dir = args[0].as_str();
    // SAFETY: the child only redirects its stdout and execs.
    if unsafe { libc::fork() } == 0 {
        // Only the root says `ready` on the test's pipe: the watchers sgish starts print theirs
        // too, and one read before the root's would let the test go on before they announced.
        stdout_to_null();
        exec(&format!("{dir}/sgish"), &["sgish", "visit", dir]);
    }
    wait_announced(dir, &["visited", "back", "sgish"]);
    ready_then_wait_line();
    std::process::exit(0)
}

pub fn leaver(args: &[String]) -> ! {
    let dir = args[0].as_str();
    ready_then_wait_line();
    exec(&format!("{dir}/sgish"), &["sgish", "visit", dir]);
}

pub fn hopper(args: &[String]) -> ! {
    let (dir, ms) = (args[0].as_str(), args[1].as_str());
    // SAFETY: the child only execs.
    if unsafe { libc::fork() } == 0 {
        // Its stdout is not the root's.
        stdout_to_null();
        exec(&format!("{dir}/hopper"), &["hopper", "hop", ms, &format!("{dir}/hops")]);
    }
    ready_then_wait_line();
    std::process::exit(0)
}

pub fn visit(args: &[String]) -> ! {
    let dir = args[0].as_str();
    // SAFETY: plain calls; the children only change ids and exec.
    unsafe {
        let ruid = libc::getuid();
        let rgid = libc::getgid();
        if libc::fork() == 0 {
            if libc::setresuid(ruid, ruid, ruid) != 0 {
                libc::_exit(126);
            }
            let (signals, pids) = (format!("{dir}/signals"), format!("visited={dir}/pids"));
            exec(&format!("{dir}/watcher"), &["watcher", "record", &signals, "announce", &pids]);
        }
        let ok = libc::setresgid(rgid, rgid, rgid) == 0 && libc::setresuid(ruid, ruid, ruid) == 0;
        assert!(ok, "back to uid {ruid}: {}", std::io::Error::last_os_error());
        // As the account (a file root made here would be closed to the account's processes).
        announce(dir, "sgish", std::process::id());
        if libc::fork() == 0 {
            let (signals, pids) = (format!("{dir}/signals"), format!("back={dir}/pids"));
            exec(&format!("{dir}/watcher"), &["watcher", "record", &signals, "announce", &pids]);
        }
        let f = OpenOptions::new().append(true).create(true).open(format!("{dir}/signals")).unwrap();
        use std::os::fd::IntoRawFd;
        SIGNALS = f.into_raw_fd();
        libc::signal(libc::SIGTERM, record_only as *const () as libc::sighandler_t);
    }
    sleep_forever()
}

pub fn hop(args: &[String]) -> ! {
    let ms: u64 = args[0].parse().unwrap();
    let mut hops = OpenOptions::new().append(true).create(true).open(&args[1]).unwrap();
    // SAFETY: ignoring SIGTERM; fork in a single-threaded process whose child only loops here.
    unsafe {
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
        loop {
            let _ = hops.write_all(format!("{}\n", libc::getpid()).as_bytes());
            if ms > 0 {
                std::thread::sleep(Duration::from_millis(ms));
            }
            match libc::fork() {
                0 => continue,
                -1 => {}
                _ => libc::_exit(0),
            }
        }
    }
}

pub fn many(args: &[String]) -> ! {
    let n: usize = args[0].parse().unwrap();
    let exe = args[1].as_str();
    let argv: Vec<&str> = args[2..].iter().map(String::as_str).collect();
    let mut pipe = [0i32; 2];
    // SAFETY: a pipe into an array we own.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    for _ in 0..n {
        // SAFETY: the child only sets its stdin and execs.
        if unsafe { libc::fork() } == 0 {
            unsafe {
                libc::dup2(pipe[0], 0);
                libc::close(pipe[1]);
            }
            exec_exact(exe, &argv);
        }
    }
    println!("ready");
    let _ = std::io::stdout().flush();
    sleep_forever()
}

pub fn bomb(args: &[String]) -> ! {
    let n: usize = args[1].parse().unwrap();
    // Each child writes a byte once its own fork returned: `ready` means all 2N processes exist
    // (under TCG a child can wait seconds for its first turn, and one stopped before it forked
    // would leave its grandchild unborn and the count short).
    let mut pipe = [0; 2];
    // SAFETY: `pipe` has room for the two descriptors.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    for _ in 0..n {
        // SAFETY: the children only fork once more, write one byte and pause.
        if unsafe { libc::fork() } == 0 {
            // SAFETY: as above.
            unsafe {
                if libc::fork() != 0 {
                    libc::write(pipe[1], b"+".as_ptr().cast(), 1);
                }
                libc::close(pipe[0]);
                libc::close(pipe[1]);
                loop {
                    libc::pause();
                }
            }
        }
    }
    // SAFETY: closing our copy of the write end, so a read sees the end if a child died early.
    unsafe { libc::close(pipe[1]) };
    let (mut got, mut buf) = (0, [0u8; 64]);
    while got < n {
        // SAFETY: `buf` is valid for its length.
        let r = unsafe { libc::read(pipe[0], buf.as_mut_ptr().cast(), buf.len()) };
        assert!(r > 0, "a bomb child ended before it forked ({got} of {n} forked)");
        got += r as usize;
    }
    ready_then_wait_line();
    std::process::exit(0)
}
