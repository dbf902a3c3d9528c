//! `read_account_file` on the kinds of things an account can put where a file is expected, as
//! the current identity (root-only cases live in `guard-user/tests/hostile_files.rs`).
use std::{
    fs,
    os::unix::{fs::symlink, net::UnixListener},
    path::Path,
    time::{Duration, Instant},
};

use super::*;

fn me() -> FsIdentity {
    FsIdentity::current()
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo {}", path.display());
}

/// Reads, asserting it returned well within a generous bound (a blocking read would hang).
fn read(path: &Path, cap: u64, follow: Follow) -> Result<Vec<u8>, ReadError> {
    let t = Instant::now();
    let r = read_account_file(path, me(), cap, follow);
    assert!(t.elapsed() < Duration::from_secs(2), "{} took {:?}", path.display(), t.elapsed());
    r
}

#[test]
fn a_regular_file_is_read_whole_and_a_link_is_followed_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("real.json");
    fs::write(&file, b"{}").unwrap();
    let link = dir.path().join("link.json");
    symlink(&file, &link).unwrap();
    assert_eq!(read(&file, 10, Follow::NoLinks).unwrap(), b"{}");
    assert_eq!(read(&link, 10, Follow::Links).unwrap(), b"{}");
    let e = read(&link, 10, Follow::NoLinks).unwrap_err();
    assert!(matches!(e, ReadError::NotRegular { kind: FileKind::Symlink, .. }), "{e}");
    assert_eq!(e.log_fields(), "reason=not_regular kind=symlink");
}

#[test]
fn a_fifo_is_refused_at_once_and_its_bytes_stay_in_it() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("guard-config.json");
    mkfifo(&fifo);
    // No writer: a plain open would block here forever.
    let e = read(&fifo, 1 << 20, Follow::Links).unwrap_err();
    assert!(matches!(e, ReadError::NotRegular { kind: FileKind::Fifo, .. }), "{e}");
    assert!(e.to_string().contains("a FIFO"), "{e}");
    // With a writer holding bytes in it: still refused, and the bytes are still there.
    let holder = fs::OpenOptions::new().read(true).write(true).open(&fifo).unwrap();
    std::io::Write::write_all(&mut &holder, b"secret").unwrap();
    let e = read(&fifo, 1 << 20, Follow::NoLinks).unwrap_err();
    assert!(matches!(e, ReadError::NotRegular { kind: FileKind::Fifo, .. }), "{e}");
    assert_eq!(pending_bytes(&holder), 6);
}

/// Bytes waiting in a pipe (FIONREAD), without reading them.
fn pending_bytes(f: &fs::File) -> i32 {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    assert_eq!(unsafe { libc::ioctl(f.as_raw_fd(), libc::FIONREAD, &mut n) }, 0);
    n
}

#[test]
fn devices_directories_and_sockets_are_refused_by_kind() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("sock");
    let _listener = UnixListener::bind(&sock).unwrap();
    for (path, kind) in [
        (Path::new("/dev/zero"), FileKind::CharDevice),
        (Path::new("/dev/null"), FileKind::CharDevice),
        (dir.path(), FileKind::Directory),
        (sock.as_path(), FileKind::Socket),
    ] {
        let e = read(path, 1 << 20, Follow::Links).unwrap_err();
        assert!(matches!(e, ReadError::NotRegular { kind: k, .. } if k == kind), "{}: {e}", path.display());
        assert!(e.to_string().starts_with(&path.display().to_string()), "{e}");
    }
    // A link to a device is judged by what it points to.
    let link = dir.path().join("zero");
    symlink("/dev/zero", &link).unwrap();
    let e = read(&link, 1 << 20, Follow::Links).unwrap_err();
    assert_eq!(e.log_fields(), "reason=not_regular kind=char_device");
}

#[test]
fn a_huge_sparse_file_is_refused_by_its_size_without_reading_it() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.json");
    let f = fs::File::create(&big).unwrap();
    f.set_len(2 << 30).unwrap();
    let e = read(&big, 1 << 20, Follow::NoLinks).unwrap_err();
    assert!(matches!(e, ReadError::TooLarge { max: 1048576, .. }), "{e}");
    assert_eq!(e.log_fields(), "reason=too_large max_bytes=1048576");
    // Exactly at the cap is fine; one byte over is not.
    fs::write(&big, vec![b' '; 100]).unwrap();
    assert_eq!(read(&big, 100, Follow::NoLinks).unwrap().len(), 100);
    assert!(matches!(read(&big, 99, Follow::NoLinks), Err(ReadError::TooLarge { .. })));
}

#[test]
fn a_missing_file_and_a_file_under_a_non_directory_are_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let e = read(&dir.path().join("absent"), 10, Follow::Links).unwrap_err();
    assert!(matches!(e, ReadError::NotFound { .. }), "{e}");
    let file = dir.path().join("f");
    fs::write(&file, "x").unwrap();
    assert!(matches!(read(&file.join("below"), 10, Follow::Links), Err(ReadError::NotFound { .. })));
    let dangling = dir.path().join("dangling");
    symlink(dir.path().join("nowhere"), &dangling).unwrap();
    assert!(matches!(read(&dangling, 10, Follow::Links), Err(ReadError::NotFound { .. })));
}

#[test]
fn a_proc_file_with_size_zero_is_still_capped_while_reading() {
    // /proc files report size 0 and may hold more: the cap holds while reading too.
    let e = read(Path::new("/proc/self/maps"), 16, Follow::Links).unwrap_err();
    assert!(matches!(e, ReadError::TooLarge { max: 16, .. }), "{e}");
}

#[test]
fn error_messages_escape_the_path() {
    let e = ReadError::NotFound { path: "/home/u/a\nb".into() };
    assert_eq!(e.to_string(), "/home/u/a\\nb: no such file");
    let e = ReadError::Io { path: "/x".into(), source: std::io::Error::from_raw_os_error(libc::EIO) };
    assert!(e.log_fields().starts_with("reason=io error=\"Input/output error"), "{}", e.log_fields());
}
