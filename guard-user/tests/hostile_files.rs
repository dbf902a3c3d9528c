//! What a hostile account can put where the root daemon (or `status`/`check` run as root) reads
//! its config, state and status files — real files, links, pipes, devices, sockets — and what
//! comes out: a clear error naming the file and the fix, at once, without reading anything the
//! account could not read itself (docs/operations.md, docs/architecture.md).
//!
//! Needs root (it reads as a test account through `setfsuid`): `needs = [root]`. The account is
//! only a uid/gid here: no passwd entry is needed.
use guard_test::guard_test;
use std::{
    fs,
    io::{Read, Write},
    os::{
        fd::AsRawFd,
        unix::{
            fs::{chown, symlink, PermissionsExt},
            net::UnixListener,
        },
    },
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use guard::{
    config::{self, ConfigError},
    safefs::{
        read_account_file, thread_effective_caps, FileKind, Follow, FsIdentity, ReadError, CAP_DAC_OVERRIDE,
        CAP_DAC_READ_SEARCH,
    },
    state, status,
};

const UID: u32 = 4201;
const ACCOUNT: FsIdentity = FsIdentity { uid: UID, gid: UID };
const SECRET: &str = "root-secret-3f9a";
/// Generous: a read that blocks would hang for good, so any bound proves it did not.
const PROMPT: Duration = Duration::from_secs(2);

/// A home owned by the account, mode 0755, under /tmp.
struct Home(tempfile::TempDir);

impl Home {
    fn new() -> Home {
        let dir = tempfile::Builder::new().prefix("guard-hostile-").tempdir_in("/tmp").unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        chown(dir.path(), Some(UID), Some(UID)).unwrap();
        Home(dir)
    }
    fn p(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }
    /// A file the account owns.
    fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.p(name);
        fs::write(&p, bytes).unwrap();
        chown(&p, Some(UID), Some(UID)).unwrap();
        p
    }
}

/// A root-only secret: a 0600 root file in a world-searchable root directory, so only the
/// file's own mode stands between the account and it.
struct Secret {
    _dir: tempfile::TempDir,
    file: PathBuf,
}

fn secret() -> Secret {
    let dir = tempfile::Builder::new().prefix("guard-secret-").tempdir_in("/tmp").unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let file = dir.path().join("secret.json");
    fs::write(&file, format!(r#"{{"timeout": "{SECRET}", "{SECRET}": 1}}"#)).unwrap();
    fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
    Secret { _dir: dir, file }
}

/// Runs `f`, asserting it returned promptly.
fn prompt<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    let took = t.elapsed();
    eprintln!("read {what}: {took:?}");
    assert!(took < PROMPT, "{what} took {took:?}");
    r
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    chown(path, Some(UID), Some(UID)).unwrap();
}

/// The config error for `path`, read as the account, checked to name the file and to leak nothing.
fn config_error(home: &Home, path: &Path) -> ConfigError {
    let e = prompt(&path.display().to_string(), || config::load(path, home.0.path(), ACCOUNT)).unwrap_err();
    let line = e.to_string();
    assert!(line.contains(&path.display().to_string()), "{line}");
    assert!(!line.contains(SECRET) && !line.contains('\n'), "{line}");
    assert!(!e.fix().is_empty());
    e
}

#[guard_test(needs = [root])]
fn root_read_is_refused_even_with_cap_dac_read_search() {
    let caps = thread_effective_caps();
    assert!(caps & (1 << CAP_DAC_READ_SEARCH) != 0, "the test process must hold CAP_DAC_READ_SEARCH: {caps:#x}");
    // Inside the account's scope the kernel (or the scope itself) has cleared the DAC overrides.
    {
        let scope = ACCOUNT.scope();
        assert!(scope.is_as_account());
        let inside = thread_effective_caps();
        assert_eq!(inside & (1 << CAP_DAC_READ_SEARCH | 1 << CAP_DAC_OVERRIDE), 0, "{inside:#x}");
    }
    assert_eq!(thread_effective_caps(), caps, "the scope gives root its capabilities back");

    let home = Home::new();
    let s = secret();
    let link = home.p("guard-config.json");
    symlink(&s.file, &link).unwrap();
    let e = config_error(&home, &link);
    assert_eq!(e.to_string(), format!("config_unreadable path={} reason=permission_denied", link.display()));
    assert!(e.is_permission_denied());
    // A large root-only file reads as denied too, not as "too large": the account's permission
    // check comes before anything about the content.
    let big = s.file.with_file_name("big.log");
    fs::File::create(&big).unwrap().set_len(2 << 30).unwrap();
    fs::set_permissions(&big, fs::Permissions::from_mode(0o600)).unwrap();
    let big_link = home.p("big.json");
    symlink(&big, &big_link).unwrap();
    assert!(config_error(&home, &big_link).is_permission_denied());
    // The same file read as root (what main did) is readable: the refusal is the account's.
    assert!(read_account_file(&link, FsIdentity::current(), 1 << 20, Follow::Links).is_ok());

    // A hard link (root can make one; protected_hardlinks stops the account) is judged by the
    // file's mode too, for the state and the status file.
    let hard = home.p("guard-daemon-state.json");
    fs::hard_link(&s.file, &hard).unwrap();
    let e = prompt("state", || state::load(&hard, ACCOUNT)).unwrap_err().to_string();
    assert_eq!(e, format!("state_malformed path={} reason=permission_denied", hard.display()));
    let status_link = home.p("guard-status.json");
    fs::hard_link(&s.file, &status_link).unwrap();
    let e = prompt("status", || status::read(&status_link, ACCOUNT)).unwrap_err().to_string();
    assert!(e.contains("permission denied to uid 4201") && !e.contains(SECRET), "{e}");
}

#[guard_test(needs = [root])]
fn a_directory_the_account_cannot_search_hides_a_world_readable_file() {
    let home = Home::new();
    let dir = tempfile::Builder::new().prefix("guard-private-").tempdir_in("/tmp").unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
    let file = dir.path().join("c.json");
    fs::write(&file, r#"{"threshold": 5}"#).unwrap();
    fs::set_permissions(&file, fs::Permissions::from_mode(0o644)).unwrap();
    let link = home.p("guard-config.json");
    symlink(&file, &link).unwrap();
    let e = config_error(&home, &link);
    assert!(e.is_permission_denied(), "{e}");
    // A link to a path that does not exist inside it reads the same: the account learns nothing.
    fs::remove_file(&link).unwrap();
    symlink(dir.path().join("absent.json"), &link).unwrap();
    assert!(config_error(&home, &link).is_permission_denied());
}

#[guard_test(needs = [root])]
fn a_config_linked_into_the_accounts_checkout_is_read() {
    let home = Home::new();
    fs::create_dir(home.p("checkout")).unwrap();
    chown(home.p("checkout"), Some(UID), Some(UID)).unwrap();
    let real = home.file("checkout/guard-config.json", br#"{"threshold": 7}"#);
    fs::set_permissions(&real, fs::Permissions::from_mode(0o600)).unwrap();
    let link = home.p("guard-config.json");
    symlink(&real, &link).unwrap();
    let c = prompt("config", || config::load(&link, home.0.path(), ACCOUNT)).unwrap();
    assert_eq!(c.threshold, 7);
}

#[guard_test(needs = [root])]
fn a_link_to_a_root_process_pipe_is_refused_and_its_bytes_stay_unread() {
    let (reader, mut writer) = std::io::pipe().unwrap();
    let kept = reader.try_clone().unwrap();
    let mut child = KillOnDrop(Command::new("sleep").arg("60").stdin(reader).stdout(Stdio::null()).spawn().unwrap());
    writer.write_all(SECRET.as_bytes()).unwrap();
    let home = Home::new();
    let link = home.p("guard-config.json");
    symlink(format!("/proc/{}/fd/0", child.0.id()), &link).unwrap();

    // As the account: /proc/<pid>/fd of a root process is not the account's to follow.
    assert!(config_error(&home, &link).is_permission_denied());
    // As state or status, the link itself is refused.
    let e = prompt("state", || state::load(&link, ACCOUNT)).unwrap_err().to_string();
    assert!(e.ends_with("reason=not_regular kind=symlink"), "{e}");
    // Even with root's own rights the pipe is named, not read.
    let e = prompt("root", || read_account_file(&link, FsIdentity::current(), 1 << 20, Follow::Links)).unwrap_err();
    assert!(matches!(e, ReadError::NotRegular { kind: FileKind::Fifo, .. }), "{e}");

    assert_eq!(pending(&kept), SECRET.len(), "bytes were taken from the pipe");
    let mut got = vec![0u8; SECRET.len()];
    (&kept).read_exact(&mut got).unwrap();
    assert_eq!(got, SECRET.as_bytes());
    child.0.kill().unwrap();
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Bytes waiting in a pipe (FIONREAD), without reading them.
fn pending(f: &impl AsRawFd) -> usize {
    let mut n: libc::c_int = 0;
    assert_eq!(unsafe { libc::ioctl(f.as_raw_fd(), libc::FIONREAD, &mut n) }, 0);
    n as usize
}

#[guard_test(needs = [root])]
fn a_fifo_as_config_state_or_status_returns_at_once_and_keeps_its_bytes() {
    let home = Home::new();
    let (config_path, state_path, status_path) =
        (home.p("guard-config.json"), home.p("guard-daemon-state.json"), home.p("guard-status.json"));
    for p in [&config_path, &state_path, &status_path] {
        mkfifo(p);
    }
    // No writer at all: a plain open(O_RDONLY) would block forever here.
    let e = config_error(&home, &config_path);
    assert_eq!(e.to_string(), format!("config_unreadable path={} reason=not_regular kind=fifo", config_path.display()));
    assert_eq!(e.fix(), "replace it with a regular file");
    let e = prompt("state", || state::load(&state_path, ACCOUNT)).unwrap_err().to_string();
    assert_eq!(e, format!("state_malformed path={} reason=not_regular kind=fifo", state_path.display()));
    let e = prompt("status", || status::read(&status_path, ACCOUNT)).unwrap_err().to_string();
    assert_eq!(e, format!("{}: it is a FIFO (named pipe); replace it with a regular file", status_path.display()));
    // The account's writer holding bytes: still refused at once, and the bytes stay.
    let holder = fs::OpenOptions::new().read(true).write(true).open(&config_path).unwrap();
    (&holder).write_all(b"{}").unwrap();
    config_error(&home, &config_path);
    assert_eq!(pending(&holder), 2);
}

#[guard_test(needs = [root])]
fn devices_sparse_files_directories_and_sockets_are_refused_by_what_they_are() {
    let home = Home::new();
    let link = |name: &str, to: &Path| {
        let p = home.p(name);
        symlink(to, &p).unwrap();
        p
    };
    let zero = link("zero.json", Path::new("/dev/zero"));
    let sparse = home.file("sparse.json", b"");
    fs::OpenOptions::new().write(true).open(&sparse).unwrap().set_len(2 << 30).unwrap();
    let dir = home.p("dir.json");
    fs::create_dir(&dir).unwrap();
    chown(&dir, Some(UID), Some(UID)).unwrap();
    let sock = home.p("sock.json");
    let _listener = UnixListener::bind(&sock).unwrap();
    chown(&sock, Some(UID), Some(UID)).unwrap();
    let environ = link("environ.json", Path::new("/proc/1/environ"));
    for (path, reason) in [
        (&zero, "reason=not_regular kind=char_device"),
        (&sparse, "reason=too_large max_bytes=1048576"),
        (&dir, "reason=not_regular kind=directory"),
        (&sock, "reason=not_regular kind=socket"),
        (&environ, "reason=permission_denied"),
    ] {
        let e = config_error(&home, path);
        assert_eq!(e.to_string(), format!("config_unreadable path={} {reason}", path.display()));
    }
    // The same through the state reader: size and kind, before a byte is read.
    let e = prompt("state", || state::load(&sparse, ACCOUNT)).unwrap_err().to_string();
    assert!(e.ends_with("reason=too_large max_bytes=4194304"), "{e}");
}

#[guard_test(needs = [root])]
fn deep_json_and_huge_numbers_in_a_real_config_are_clear_errors_with_fixes() {
    let home = Home::new();
    for (json, reason, fix) in [
        (format!(r#"{{"x": {}{}}}"#, "[".repeat(100_000), "]".repeat(100_000)), "config_malformed json", "JSON syntax"),
        (r#"{"timeout": 10000000000000000000}"#.to_string(), "config_malformed timeout value=", "at most 1 year"),
        (r#"{"timeout": "5124095576030431h"}"#.to_string(), "config_malformed timeout value=", "at most 1 year"),
        (r#"{"threshold": 1e300}"#.to_string(), "config_malformed threshold value=", ">= 1"),
        (r#"{"logMaxSizeMB": 1e300}"#.to_string(), "config_malformed logMaxSizeMB value=", "<= 4096"),
        (r#"{"warnBefore": 99999999999999999999}"#.to_string(), "config_malformed warnBefore value=", "duration"),
        (r#"{"stallWatch": {"peggedCpu": 1e308}}"#.to_string(), "config_malformed stallWatch.peggedCpu", "1024"),
    ] {
        let path = home.file("guard-config.json", json.as_bytes());
        let e = prompt(reason, || config::load(&path, home.0.path(), ACCOUNT)).unwrap_err();
        assert!(e.to_string().starts_with(reason), "{e}");
        assert!(e.fix().contains(fix), "{e}: {}", e.fix());
        // validate's list begins with the same problem.
        let p = config::problems(json.as_bytes(), home.0.path());
        assert_eq!(p[0].error().map(|e| e.to_string()), Some(e.to_string()));
    }
}

#[guard_test(needs = [root])]
fn a_status_file_that_is_not_ours_is_named_without_quoting_its_content() {
    let home = Home::new();
    let path = home.file("guard-status.json", format!(r#"{{"version": 1, "user": "{SECRET}"}}"#).as_bytes());
    let e = prompt("status", || status::read(&path, ACCOUNT)).unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "{} is not a guard status file (line 1, column 13); it is rewritten by the running guard every tick",
            path.display()
        )
    );
    // A link in its place is refused even when it points at a valid file the account owns.
    let real = home.file("real-status.json", b"{}");
    fs::remove_file(&path).unwrap();
    symlink(&real, &path).unwrap();
    let e = prompt("status", || status::read(&path, ACCOUNT)).unwrap_err().to_string();
    assert!(e.ends_with("it is a symbolic link, which is not followed here; remove the link; the guard writes this file itself and never follows a link here"), "{e}");
}

/// A thread that reads as the account leaves the process's other threads as root. (A thread
/// *spawned* inside a scope inherits it, as clone(2) copies credentials: the readers never spawn.)
#[guard_test(needs = [root])]
fn the_identity_switch_is_per_thread() {
    let s = secret();
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn({
        let f = s.file.clone();
        move || {
            wait.recv().unwrap();
            fs::read_to_string(f).map(|t| t.contains(SECRET))
        }
    });
    let scope = ACCOUNT.scope();
    assert!(fs::read(&s.file).is_err(), "this thread reads as the account");
    go.send(()).unwrap();
    assert!(other.join().unwrap().unwrap(), "another thread stays root");
    drop(scope);
    assert!(fs::read(&s.file).is_ok());
}

/// Under `SECBIT_NO_SETUID_FIXUP` the kernel keeps the DAC capabilities across setfsuid; the
/// scope then clears them itself, so the secret stays unreadable, and gives them back after.
#[guard_test(needs = [root])]
fn the_scope_drops_dac_capabilities_itself_when_the_kernel_fixup_is_off() {
    const PR_SET_SECUREBITS: libc::c_int = 28;
    const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;
    let s = secret();
    let dac = 1u64 << CAP_DAC_READ_SEARCH | 1 << CAP_DAC_OVERRIDE;
    // Securebits are per thread: set them on a thread of our own, which ends with the test.
    std::thread::spawn(move || {
        assert_eq!(unsafe { libc::prctl(PR_SET_SECUREBITS, SECBIT_NO_SETUID_FIXUP, 0, 0, 0) }, 0);
        let before = thread_effective_caps();
        {
            let scope = ACCOUNT.scope();
            assert!(scope.is_as_account());
            assert_eq!(thread_effective_caps() & dac, 0, "{:#x}", thread_effective_caps());
            assert!(fs::read(&s.file).is_err());
        }
        assert_eq!(thread_effective_caps(), before);
        assert!(fs::read(&s.file).is_ok());
    })
    .join()
    .unwrap();
}

/// The account can edit its status file: a name holding a newline or a terminal escape comes
/// back printable, so `status` and `check` cannot be made to print a forged row.
#[guard_test(needs = [root])]
fn names_in_an_edited_status_file_come_back_printable() {
    let home = Home::new();
    let mut s = status::Status::default();
    s.names.push(guard::domain::NameStatus { name: "x\n  forged 99\u{1b}[2J".into(), ..Default::default() });
    s.names.push(guard::domain::NameStatus { name: r"q\xff".into(), ..Default::default() });
    let path = home.file("guard-status.json", &serde_json::to_vec(&s).unwrap());
    let back = prompt("status", || status::read(&path, ACCOUNT)).unwrap();
    assert_eq!(back.names[0].name, r"x\x0a  forged 99\x1b[2J");
    assert_eq!(back.names[1].name, r"q\xff", "an escaped name is shown as written");
}

/// Times in the status file feed `Duration::from_secs_f64(now - t)` in `status` and `check`: a
/// planted `1e300` is refused at the read instead of panicking them.
#[guard_test(needs = [root])]
fn a_status_file_with_numbers_out_of_range_is_refused() {
    let home = Home::new();
    for (field, value) in
        [("last_tick_unix", "1e300"), ("started_at_unix", "-1e300"), ("interval_secs", "18446744073709551615")]
    {
        let mut v = serde_json::to_value(status::Status::default()).unwrap();
        v[field] = serde_json::from_str(value).unwrap();
        let path = home.file("guard-status.json", &serde_json::to_vec(&v).unwrap());
        let e = prompt(field, || status::read(&path, ACCOUNT)).unwrap_err().to_string();
        assert!(e.contains("holds a number out of range"), "{field}: {e}");
    }
}

guard_test::main!();
