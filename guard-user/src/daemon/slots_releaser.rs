//! The releaser of heavy-command slots (docs/architecture.md, slots): a child the daemon starts
//! with a pipe on its stdin. When the pipe closes (the daemon ended, however it ended) it puts
//! back and thaws every command the daemon's instance held.
use std::{
    io::Read,
    process::{Child, ChildStdin, Command, Stdio},
};

use crate::cgroup::{sweep, Hierarchy, Instance};

/// `guard-user __slots-release --instance NAME` with a pipe on its stdin, which closes when
/// this process ends, however it ends.
pub(super) fn spawn_releaser(name: &str) -> std::io::Result<(Child, ChildStdin)> {
    let mut child = Command::new("/proc/self/exe")
        .args(["__slots-release", "--instance", name])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdin = child.stdin.take().expect("piped");
    Ok((child, stdin))
}

/// The releaser's side: waits for stdin to close, then puts back everything `instance` holds.
/// SIGTERM, SIGINT and SIGHUP are ignored (a unit's stop sends SIGTERM to every process of the
/// service at once: the releaser must outlive the daemon, not die with it).
pub fn releaser_main(instance: &str) {
    close_inherited();
    // SAFETY: setting signal dispositions to SIG_IGN.
    unsafe {
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
    }
    let mut buf = [0u8; 64];
    let mut stdin = std::io::stdin().lock();
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    if let Ok(h) = Hierarchy::find() {
        let lock_dir = super::instance::lock_dir();
        let instance = Instance::new(h, instance.to_string());
        let n = sweep::release_instance(&instance, &lock_dir);
        instance.remove();
        if n > 0 {
            eprintln!("guard-user: released {n} waiting processes the daemon held");
        }
    }
}

/// Closes every fd above stderr: the daemon's BPF programs, maps and links must not live on in
/// the releaser (a link held open keeps a program attached).
fn close_inherited() {
    // SAFETY: close_range has no memory arguments; on a kernel without it (before 5.9) the
    // descriptors are closed one by one.
    if unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) } == 0 {
        return;
    }
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default();
    for fd in fds.into_iter().filter(|&fd| fd > 2) {
        // SAFETY: closing a descriptor this process no longer uses (the read_dir's own is gone).
        unsafe { libc::close(fd) };
    }
}
