//! Tests of `within`: where a holder's objects are, against real files, mounts and sockets.
use super::*;
use std::{fs, os::unix::fs::symlink};

fn within(p: &Path) -> Within {
    Within::new(Target::open(p).unwrap())
}

/// Where this process's own `fd` is, through its /proc link, as a holder's would be read.
fn fd_place(w: &Within, fd: RawFd) -> Place {
    let link = CString::new(format!("/proc/self/fd/{fd}")).unwrap();
    w.place_of_link(sys::CWD, &link).unwrap()
}

fn link_place(w: &Within, p: &Path) -> Place {
    fd_place(w, fs::File::open(p).unwrap().as_raw_fd())
}

#[test]
fn a_directory_holds_itself_and_what_is_below_it_by_device_and_inode() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let deep = repo.join("a/b/c");
    fs::create_dir_all(&deep).unwrap();
    fs::create_dir_all(tmp.path().join("repo2")).unwrap();
    fs::create_dir_all(repo.join("x (deleted)")).unwrap();
    fs::write(repo.join("a/f"), b"x").unwrap();
    fs::write(repo.join("a/g (deleted)"), b"x").unwrap();
    fs::write(tmp.path().join("outside"), b"x").unwrap();
    symlink(tmp.path().join("outside"), repo.join("link-out")).unwrap();
    symlink(repo.join("a"), tmp.path().join("link-in")).unwrap();
    let w = within(&repo);
    for inside in [&repo, &deep, &repo.join("x (deleted)"), &repo.join("a/f"), &repo.join("a/g (deleted)")] {
        assert_eq!(link_place(&w, inside), Place::Inside, "{}", inside.display());
    }
    // Reached through a symlink outside: still the object inside.
    assert_eq!(link_place(&w, &tmp.path().join("link-in/f")), Place::Inside);
    for outside in [&tmp.path().join("repo2"), tmp.path(), &tmp.path().join("outside"), &repo.join("link-out")] {
        assert_eq!(link_place(&w, outside), Place::Outside, "{}", outside.display());
    }
    // Asked again: the same answers, from the caches.
    assert_eq!(link_place(&w, &deep), Place::Inside);
    assert_eq!(link_place(&w, &tmp.path().join("outside")), Place::Outside);
}

#[test]
fn a_removed_file_or_directory_is_below_nothing_and_a_renamed_one_is_where_it_went() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    fs::create_dir_all(repo.join("gone")).unwrap();
    fs::write(repo.join("f"), b"x").unwrap();
    fs::write(repo.join("moved"), b"x").unwrap();
    let w = within(&repo);
    let held_dir = fs::File::open(repo.join("gone")).unwrap();
    let held_file = fs::File::open(repo.join("f")).unwrap();
    let held_moved = fs::File::open(repo.join("moved")).unwrap();
    fs::remove_dir(repo.join("gone")).unwrap();
    fs::remove_file(repo.join("f")).unwrap();
    // A new file where the removed one was: another inode, not what is held.
    fs::write(repo.join("f"), b"new").unwrap();
    fs::rename(repo.join("moved"), tmp.path().join("moved")).unwrap();
    let place = |f: &fs::File| fd_place(&w, f.as_raw_fd());
    assert_eq!(place(&held_dir), Place::Outside);
    assert_eq!(place(&held_file), Place::Outside);
    assert_eq!(place(&held_moved), Place::Outside);
}

#[test]
fn a_file_as_path_is_held_only_as_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("f (deleted)");
    fs::write(&f, b"x").unwrap();
    fs::write(tmp.path().join("f"), b"y").unwrap();
    let w = within(&f);
    assert!(!w.target.is_dir());
    assert_eq!(link_place(&w, &f), Place::Inside);
    assert_eq!(link_place(&w, &tmp.path().join("f")), Place::Outside);
    assert_eq!(link_place(&w, tmp.path()), Place::Outside);
}

#[test]
fn a_mapping_is_found_by_its_maps_line_through_its_parent() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    fs::create_dir_all(repo.join("n\nl")).unwrap();
    fs::write(repo.join("n\nl/lib (deleted)"), b"x").unwrap();
    let m = fs::metadata(repo.join("n\nl/lib (deleted)")).unwrap();
    let w = within(&repo);
    let text = [repo.as_os_str().as_bytes(), b"/n\\012l/lib (deleted)"].concat();
    // maps shows the superblock's device; on most filesystems that is st_dev.
    let dev = w.target.sb_dev.unwrap_or(m.dev());
    let named = |t: &[u8]| Some((t.to_vec(), true));
    assert_eq!(w.place_of_mapping(sys::CWD, dev, m.ino() + 1, || named(&text)), Place::Outside, "another inode");
    let fresh = within(&repo);
    assert_eq!(fresh.place_of_mapping(sys::CWD, dev, m.ino(), || named(b"/nowhere/lib")), Place::Outside);
    assert_eq!(w.place_of_mapping(sys::CWD, dev, m.ino(), || named(&text)), Place::Inside);
    // Decided once: the name is not asked for again.
    assert_eq!(w.place_of_mapping(sys::CWD, dev, m.ino(), || panic!("asked again")), Place::Inside);
}

#[test]
fn a_socket_is_held_where_the_file_it_is_bound_to_is() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    fs::create_dir_all(repo.join("run")).unwrap();
    let inside = std::os::unix::net::UnixListener::bind(repo.join("run/s.sock")).unwrap();
    let outside = std::os::unix::net::UnixListener::bind(tmp.path().join("s.sock")).unwrap();
    let unbound = std::os::unix::net::UnixStream::pair().unwrap().0;
    let place = fd_place;
    let w = within(&repo);
    assert_eq!(place(&w, inside.as_raw_fd()), Place::Inside);
    assert_eq!(place(&w, outside.as_raw_fd()), Place::Outside);
    assert_eq!(place(&w, unbound.as_raw_fd()), Place::Outside);
    // The socket file as PATH.
    let file = within(&repo.join("run/s.sock"));
    assert_eq!(place(&file, inside.as_raw_fd()), Place::Inside);
    assert_eq!(place(&file, outside.as_raw_fd()), Place::Outside);
    // Its file removed and another bound at the same name: the first holds nothing now, as
    // the socket diagnostics tell (they give each socket's own file). Where the kernel has
    // none, /proc/net/unix gives only the name, and both sockets are taken to hold the file
    // there now (unix.rs): a holder too many, never one missed.
    fs::remove_file(repo.join("run/s.sock")).unwrap();
    let _again = std::os::unix::net::UnixListener::bind(repo.join("run/s.sock")).unwrap();
    let expect = if unix::has_diagnostics() { Place::Outside } else { Place::Inside };
    assert_eq!(place(&within(&repo), inside.as_raw_fd()), expect);
}

/// A forked child that binds a unix socket by the relative name `rel.sock` in `dir` and
/// pauses: its pid and the socket's fd.
fn relative_binder(dir: &Path) -> (libc::pid_t, RawFd) {
    let dir = CString::new(dir.as_os_str().as_bytes()).unwrap();
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(b"rel.sock") {
        *d = *s as libc::c_char;
    }
    let mut pipe = [0; 2];
    // SAFETY: the child makes async-signal-safe calls only, on memory prepared before.
    unsafe {
        assert_eq!(libc::pipe(pipe.as_mut_ptr()), 0);
        let pid = libc::fork();
        if pid == 0 {
            let s = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            let ok = libc::chdir(dir.as_ptr()) == 0 && libc::bind(s, (&raw const addr).cast(), len) == 0;
            let out: i32 = if ok { s } else { -1 };
            libc::write(pipe[1], (&raw const out).cast(), 4);
            loop {
                libc::pause();
            }
        }
        let mut fd = 0i32;
        assert_eq!(libc::read(pipe[0], (&raw mut fd).cast(), 4), 4);
        libc::close(pipe[0]);
        libc::close(pipe[1]);
        assert!(fd >= 0, "the child could not bind its socket");
        (pid, fd)
    }
}

#[test]
fn a_socket_known_by_a_relative_name_or_not_listed_at_all_is_never_taken_for_outside() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    fs::create_dir_all(repo.join("run")).unwrap();
    fs::create_dir_all(tmp.path().join("elsewhere")).unwrap();
    let (pid, fd) = relative_binder(&repo.join("run"));
    let proc_dir = sys::open_path(sys::CWD, &CString::new(format!("/proc/{pid}")).unwrap(), true).unwrap();
    let link = CString::new(format!("fd/{fd}")).unwrap();
    let with = |path: &Path, listing: Result<HashMap<u64, unix::Bound>, &'static str>| {
        let w = within(path);
        w.sockets.set(listing).unwrap();
        w.place_of_link(proc_dir.as_raw_fd(), &link).unwrap()
    };
    let fallback = || unix::from_proc_net_unix().map_err(|e| e.why());
    assert!(fallback().unwrap().values().any(|b| b.by_name && b.path == b"rel.sock"), "{:?}", fallback());
    // Without socket diagnostics, the relative name is looked up from the holder's cwd.
    assert_eq!(with(&repo, fallback()), Place::Inside);
    assert_eq!(with(&repo.join("run/rel.sock"), fallback()), Place::Inside);
    assert_eq!(with(&tmp.path().join("elsewhere"), fallback()), Place::Outside);
    // No listing at all: the holder is read in part, not cleared.
    assert_eq!(with(&repo, Err("unlisted")), Place::Unknown("unlisted"));
    assert_eq!(with(&tmp.path().join("elsewhere"), Err("unlisted")), Place::Unknown("unlisted"));
    // SAFETY: our own child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
}

#[test]
fn candidates_try_the_text_as_written_and_as_the_kernel_may_have_changed_it() {
    assert_eq!(candidates(b"/a/b", false), [b"/a/b".to_vec()]);
    assert_eq!(candidates(b"/a/b (deleted)", false), [b"/a/b (deleted)".to_vec(), b"/a/b".to_vec()]);
    assert_eq!(candidates(b"/a\\012b", true), [b"/a\\012b".to_vec(), b"/a\nb".to_vec()]);
}

#[test]
fn mountinfo_lines_give_each_mounts_device() {
    let line = b"36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue";
    assert_eq!(parse_mountinfo_line(line), Some((36, libc::makedev(98, 0))));
    assert_eq!(parse_mountinfo_line(b""), None);
}
