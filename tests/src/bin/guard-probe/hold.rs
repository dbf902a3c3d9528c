//! Ways of holding a path, for the holders tests (`tests/tests/holders.rs`); each is a
//! `KEY VALUE` pair of the probe's arguments, applied in order before `ready`:
//!
//! - `chdir DIR`; `chroot DIR` (as root; the working directory stays where it was, so the
//!   root directory is the only way this holds DIR); `setuid UID` (drop root for UID, e.g.
//!   after `chroot`);
//! - `open FILE` (read, kept open, as `tail -f` does); `write FILE` (appended to, kept open);
//!   `map FILE` (one page mapped, then the fd closed); `fds N:FILE` (N fds on FILE);
//!   `maps N:FILE` (N separate mappings of FILE, the fd closed); `listen PATH` (a unix socket
//!   bound at PATH, listening);
//! - `thread-chdir DIR`: a thread with a working directory of its own (`unshare(CLONE_FS)`);
//!   `thread-open FILE`: a thread with an fd table of its own (`unshare(CLONE_FILES)`) holding
//!   FILE open, which the process's `/proc/PID/fd` does not show.
use std::{ffi::CString, os::fd::IntoRawFd, time::Duration};

fn c(path: &str) -> CString {
    CString::new(path).unwrap()
}

fn check(what: &str, r: libc::c_int) {
    assert!(r >= 0, "{what}: {}", std::io::Error::last_os_error());
}

/// Maps one page of `fd` (not touched: a file may be shorter).
fn map_page(fd: libc::c_int, flags: libc::c_int) {
    // SAFETY: a fresh mapping the probe never reads or unmaps.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, flags, fd, 0) };
    assert!(p != libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
}

fn count_and_file(v: &str) -> (usize, &str) {
    let (n, f) = v.split_once(':').expect("N:FILE");
    (n.parse().unwrap(), f)
}

/// Runs `setup` in a new thread that then sleeps for ever; returns once `setup` is done.
fn thread_that(setup: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        setup();
        tx.send(()).unwrap();
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    });
    rx.recv().unwrap();
}

/// Applies `KEY VALUE`; false when KEY is not one of these.
pub fn apply(key: &str, value: &str) -> bool {
    // SAFETY (all blocks below): plain syscalls on paths and fds the probe owns.
    match key {
        "chdir" => std::env::set_current_dir(value).unwrap(),
        "chroot" => check("chroot", unsafe { libc::chroot(c(value).as_ptr()) }),
        "setuid" => unsafe {
            let id: libc::uid_t = value.parse().unwrap();
            check("setgroups", libc::setgroups(0, std::ptr::null()));
            check("setresgid", libc::setresgid(id, id, id));
            check("setresuid", libc::setresuid(id, id, id));
        },
        "open" => {
            let _ = std::fs::File::open(value).unwrap().into_raw_fd();
        }
        "write" => {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().append(true).create(true).open(value).unwrap();
            f.write_all(b"a line\n").unwrap();
            let _ = f.into_raw_fd();
        }
        "listen" => {
            let l = std::os::unix::net::UnixListener::bind(value).unwrap();
            let _ = l.into_raw_fd();
        }
        "map" => {
            let fd = std::fs::File::open(value).unwrap();
            map_page(std::os::fd::AsRawFd::as_raw_fd(&fd), libc::MAP_SHARED);
        }
        "fds" => {
            let (n, file) = count_and_file(value);
            unsafe {
                let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
                libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
                lim.rlim_cur = lim.rlim_max;
                check("setrlimit", libc::setrlimit(libc::RLIMIT_NOFILE, &lim));
            }
            let fd = std::fs::File::open(file).unwrap().into_raw_fd();
            for _ in 1..n {
                check("dup", unsafe { libc::dup(fd) });
            }
        }
        "maps" => {
            let (n, file) = count_and_file(value);
            let fd = std::fs::File::open(file).unwrap();
            for _ in 0..n {
                map_page(std::os::fd::AsRawFd::as_raw_fd(&fd), libc::MAP_PRIVATE);
            }
        }
        "thread-chdir" => {
            let dir = value.to_string();
            thread_that(move || unsafe {
                check("unshare(CLONE_FS)", libc::unshare(libc::CLONE_FS));
                check("chdir", libc::chdir(c(&dir).as_ptr()));
            });
        }
        "thread-open" => {
            let file = value.to_string();
            thread_that(move || {
                check("unshare(CLONE_FILES)", unsafe { libc::unshare(libc::CLONE_FILES) });
                let _ = std::fs::File::open(file).unwrap().into_raw_fd();
            });
        }
        _ => return false,
    }
    true
}
