//! `guard-user holders` on the real kernel: one process per way of holding a checkout (working
//! directory, root directory, executable, an open file, a file being written, a file mapped
//! and closed, a unix socket bound in it, a thread's own working directory or fd table, a
//! zombie leader, a bind mount),
//! plus another account's and root's, checked against `lsof +D`; a checkout that is a symlink
//! to `/`; a directory named `x (deleted)`; a file as PATH; the printed stop command pasted into
//! bash; exit codes; bounds (100,000 fds, 60,000 mappings, a read budget, a /proc read that
//! hangs). Each test needs root and takes the host lock (`setup`).
use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::OsStr,
    fs,
    io::{BufRead, BufReader},
    os::unix::{ffi::OsStrExt, fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Duration,
};

use integration_tests::{
    guard_bin, guard_test, probe_bin, setup, Home, Probe, OTHER_UID, OTHER_USER, TEST_UID, TEST_USER,
};
use serde_json::Value;

/// A probe as `uid` (0: root) working in `cwd`, with `args` (guard-probe/hold.rs), started from
/// `exe` (a copy of the probe where a test wants its executable); returns once it is ready.
fn hold(exe: &Path, uid: u32, cwd: &Path, args: &[&OsStr]) -> Probe {
    let mut cmd = Command::new(exe);
    cmd.args(args).current_dir(cwd).stdout(Stdio::piped()).stdin(Stdio::null()).process_group(0);
    if uid != 0 {
        cmd.uid(uid).gid(uid);
    }
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", exe.display()));
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "{args:?}: the probe did not set up");
    Probe { child }
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// `guard-user holders ARGS…` as root, with `env`.
fn holders(args: &[&OsStr], env: &[(&str, &str)]) -> Output {
    Command::new(guard_bin()).arg("holders").args(args).envs(env.iter().copied()).output().unwrap()
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    })
}

/// pid → the ways its row says it holds PATH.
fn ways(doc: &Value) -> BTreeMap<u32, Vec<String>> {
    doc["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let holds = r["holds"].as_array().unwrap().iter().map(|w| w.as_str().unwrap().to_string()).collect();
            (r["pid"].as_u64().unwrap() as u32, holds)
        })
        .collect()
}

/// What `lsof -t +D DIR` (or `lsof -t FILE`) lists; `None` where lsof is not installed, which
/// only a guest may lack (the host's CI installs it: `.ci/run`).
fn lsof(path: &Path) -> Option<BTreeSet<u32>> {
    let args: Vec<&OsStr> = if path.is_dir() {
        vec![os("-w"), os("-t"), os("+D"), path.as_os_str()]
    } else {
        vec![os("-w"), os("-t"), path.as_os_str()]
    };
    match Command::new("lsof").args(args).output() {
        Ok(out) => Some(String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.trim().parse().ok()).collect()),
        Err(_) if std::env::var_os("GUARD_IN_VM").is_some() => {
            eprintln!("lsof is not in this guest (the host had none to copy in): comparison with lsof skipped");
            None
        }
        Err(e) => panic!("lsof: {e}: install it (apt-get install lsof), the holders tests compare with it"),
    }
}

fn mkdirs(dirs: &[&Path]) {
    for d in dirs {
        fs::create_dir_all(d).unwrap();
        fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
    }
}

fn write(path: &Path, mode: u32) {
    fs::write(path, vec![b'x'; 8192]).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// A bind mount, unmounted on drop.
struct Bind(PathBuf);

impl Bind {
    fn new(src: &Path, dst: &Path) -> Option<Bind> {
        mkdirs(&[dst]);
        let (s, d) = (cstr(src), cstr(dst));
        // SAFETY: NUL-terminated paths; no data argument.
        let r = unsafe { libc::mount(s.as_ptr(), d.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) };
        if r != 0 {
            eprintln!("bind mount refused here ({}): the bind-mount case is skipped", std::io::Error::last_os_error());
            return None;
        }
        Some(Bind(dst.to_path_buf()))
    }
}

impl Drop for Bind {
    fn drop(&mut self) {
        unsafe { libc::umount2(cstr(&self.0).as_ptr(), libc::MNT_DETACH) };
    }
}

fn cstr(p: &Path) -> std::ffi::CString {
    std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap()
}

const WAIT: Duration = Duration::from_secs(5);

#[guard_test(needs = [root])]
fn every_way_of_holding_a_checkout_is_found_by_device_and_inode_as_lsof_finds_it() {
    let _g = setup();
    let home = Home::new();
    let top = home.path();
    let repo = top.join("repo");
    let (src, deep, deleted, gone) =
        (repo.join("src"), repo.join("src/deep"), repo.join("x (deleted)"), repo.join("gone"));
    let (sibling, outside) = (top.join("repo2"), top.join("outside"));
    mkdirs(&[&deep, &deleted, &gone, &repo.join("bin"), &sibling, &outside]);
    for d in [&src, &sibling] {
        // The account binds its sockets there.
        fs::set_permissions(d, fs::Permissions::from_mode(0o777)).unwrap();
    }
    for f in ["log.txt", "lib.so", "thread.txt", "root-file.txt"] {
        write(&repo.join(f), 0o644);
    }
    write(&repo.join("out.txt"), 0o666);
    write(&sibling.join("file"), 0o644);
    std::os::unix::fs::symlink(&outside, repo.join("link-out")).unwrap();
    let held_exe = repo.join("bin/held");
    fs::copy(probe_bin(), &held_exe).unwrap();
    fs::set_permissions(&held_exe, fs::Permissions::from_mode(0o755)).unwrap();
    let bind = Bind::new(&repo, &top.join("view"));

    let probe = probe_bin();
    let root = Path::new("/");
    let p = |path: &Path| path.as_os_str().to_owned();
    let mut inside: Vec<(&str, Vec<&str>, Probe)> = Vec::new();
    let mut add =
        |label: &'static str, holds: &[&'static str], probe: Probe| inside.push((label, holds.to_vec(), probe));
    add("cwd", &["cwd"], hold(&probe, TEST_UID, &repo, &[]));
    add("cwd below", &["cwd"], hold(&probe, TEST_UID, &deep, &[]));
    add("cwd in `x (deleted)`", &["cwd"], hold(&probe, TEST_UID, &deleted, &[]));
    add("open file", &["fd"], hold(&probe, TEST_UID, root, &[os("open"), &p(&repo.join("log.txt"))]));
    add("file being written", &["fd"], hold(&probe, TEST_UID, root, &[os("write"), &p(&repo.join("out.txt"))]));
    add("executable", &["exe", "mmap"], hold(&held_exe, TEST_UID, root, &[]));
    add("mapped, then closed", &["mmap"], hold(&probe, TEST_UID, root, &[os("map"), &p(&repo.join("lib.so"))]));
    add("a socket bound in it", &["fd"], hold(&probe, TEST_UID, root, &[os("listen"), &p(&src.join("dev.sock"))]));
    add("root directory", &["root"], hold(&probe, 0, root, &[os("chroot"), &p(&repo), os("setuid"), os("4201")]));
    add("a thread's own cwd", &["cwd"], hold(&probe, TEST_UID, root, &[os("thread-chdir"), &p(&src)]));
    add(
        "a thread's own fd table",
        &["fd"],
        hold(&probe, TEST_UID, root, &[os("thread-open"), &p(&repo.join("thread.txt"))]),
    );
    add("zombie leader", &["cwd"], hold(&probe, TEST_UID, &repo, &[os("leader-exits"), os("1")]));
    add("another account's", &["cwd"], hold(&probe, OTHER_UID, &src, &[]));
    add("root's", &["fd"], hold(&probe, 0, root, &[os("open"), &p(&repo.join("root-file.txt"))]));
    if bind.is_some() {
        add("through a bind mount", &["cwd"], hold(&probe, TEST_UID, &top.join("view/src"), &[]));
    }
    let outsiders = [
        hold(&probe, TEST_UID, &sibling, &[]),
        hold(&probe, TEST_UID, root, &[os("open"), &p(&sibling.join("file"))]),
        hold(&probe, TEST_UID, &outside, &[]),
        hold(&probe, TEST_UID, top, &[]),
        hold(&probe, TEST_UID, &gone, &[]),
        hold(&probe, TEST_UID, root, &[os("listen"), &p(&sibling.join("dev.sock"))]),
    ];
    // Removed while a process works in it: `…/repo/gone (deleted)` is below nothing now.
    fs::remove_dir(&gone).unwrap();
    // The zombie leader's main thread is gone once /proc says Z.
    let zombie = inside.iter().find(|(l, _, _)| *l == "zombie leader").unwrap().2.pid();
    integration_tests::poll(WAIT, || {
        let stat = fs::read_to_string(format!("/proc/{zombie}/stat")).unwrap_or_default();
        (stat.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')), ())
    });

    let out = holders(&[repo.as_os_str(), os("--json")], &[]);
    let doc = json(&out);
    let found = ways(&doc);
    let expected: BTreeMap<u32, Vec<String>> =
        inside.iter().map(|(_, w, p)| (p.pid(), w.iter().map(|s| s.to_string()).collect())).collect();
    let labels: BTreeMap<u32, &str> = inside.iter().map(|(l, _, p)| (p.pid(), *l)).collect();
    for (pid, want) in &expected {
        assert_eq!(
            found.get(pid),
            Some(want),
            "{} (pid {pid}) is not listed as holding it by {want:?}\n{doc:#}",
            labels[pid]
        );
    }
    for o in &outsiders {
        assert!(!found.contains_key(&o.pid()), "{} is outside the checkout and was listed\n{doc:#}", o.pid());
    }
    assert_eq!(found.len(), expected.len(), "exactly the holders\n{doc:#}");
    assert_eq!(out.status.code(), Some(1), "{doc:#}");
    assert_eq!(doc["read"], "machine");
    let users: BTreeSet<&str> =
        doc["holders"].as_array().unwrap().iter().map(|r| r["user"].as_str().unwrap()).collect();
    assert_eq!(users, BTreeSet::from([TEST_USER, OTHER_USER, "root"]), "each with its user");

    // The same as text: whom it read on the first line, one stop command per account, none for root.
    let text = holders(&[repo.as_os_str()], &[]);
    let text = String::from_utf8_lossy(&text.stdout);
    let first = text.lines().next().unwrap();
    assert!(first.contains("in every process of the machine (read as root): "), "{text}");
    let repo_shown = repo.to_str().unwrap();
    for user in [TEST_USER, OTHER_USER] {
        let hint = format!("to stop {user}'s the checked way: guard-user holders {repo_shown} --user {user} --stop");
        assert!(text.lines().any(|l| l == hint), "no `{hint}` in\n{text}");
    }
    assert!(!text.contains("--user root"), "{text}");

    // lsof +D sees a subset: not what a thread holds on its own nor a zombie leader's threads.
    if let Some(by_lsof) = lsof(&repo) {
        let ours: BTreeSet<u32> = found.keys().copied().collect();
        let missed: Vec<&str> = by_lsof.difference(&ours).map(|p| labels.get(p).copied().unwrap_or("?")).collect();
        assert!(missed.is_empty(), "lsof +D found holders that holders did not: {missed:?}\n{doc:#}");
        let only_ours: BTreeSet<&str> = ours.difference(&by_lsof).map(|p| labels[p]).collect();
        eprintln!(
            "{} ways of holding the checkout: lsof +D found {}, holders {}; only holders: {only_ours:?}",
            expected.len(),
            by_lsof.len(),
            ours.len()
        );
        let lsof_blind = BTreeSet::from(["a thread's own cwd", "a thread's own fd table", "zombie leader"]);
        assert!(only_ours.is_subset(&lsof_blind), "{only_ours:?}");
    }
}

#[guard_test(needs = [root])]
fn a_file_as_path_is_held_by_its_fds_mappings_and_executable_only() {
    let _g = setup();
    let home = Home::new();
    let repo = home.path().join("repo");
    let elsewhere = home.path().join("elsewhere");
    mkdirs(&[&repo, &elsewhere]);
    let file = repo.join("data (deleted)");
    write(&file, 0o644);
    fs::hard_link(&file, repo.join("other-name")).unwrap();
    write(&elsewhere.join("data (deleted)"), 0o644);
    write(&repo.join("data"), 0o644);
    let exe = repo.join("held");
    fs::copy(probe_bin(), &exe).unwrap();
    fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
    let probe = probe_bin();
    let p = |path: &Path| path.as_os_str().to_owned();
    let open = hold(&probe, TEST_UID, Path::new("/"), &[os("open"), &p(&file)]);
    let mapped = hold(&probe, TEST_UID, Path::new("/"), &[os("map"), &p(&file)]);
    let by_link = hold(&probe, OTHER_UID, Path::new("/"), &[os("open"), &p(&repo.join("other-name"))]);
    let namesakes = [
        hold(&probe, TEST_UID, Path::new("/"), &[os("open"), &p(&elsewhere.join("data (deleted)"))]),
        hold(&probe, TEST_UID, Path::new("/"), &[os("open"), &p(&repo.join("data"))]),
        hold(&probe, TEST_UID, &repo, &[]),
    ];
    let out = holders(&[file.as_os_str(), os("--json")], &[]);
    let doc = json(&out);
    assert_eq!(doc["kind"], "file");
    let want = BTreeMap::from([
        (open.pid(), vec!["fd".to_string()]),
        (mapped.pid(), vec!["mmap".to_string()]),
        (by_link.pid(), vec!["fd".to_string()]),
    ]);
    assert_eq!(ways(&doc), want, "{doc:#}");
    assert_eq!(out.status.code(), Some(1));
    for n in &namesakes {
        assert!(!ways(&doc).contains_key(&n.pid()));
    }
    if let Some(by_lsof) = lsof(&file) {
        assert_eq!(by_lsof, want.keys().copied().collect(), "lsof FILE\n{doc:#}");
    }
    // An executable as PATH.
    let running = hold(&exe, TEST_UID, Path::new("/"), &[]);
    let doc = json(&holders(&[exe.as_os_str(), os("--json"), os("--user"), os(TEST_USER)], &[]));
    assert_eq!(ways(&doc), BTreeMap::from([(running.pid(), vec!["exe".to_string(), "mmap".to_string()])]));
}

/// The account's "checkout" is a symlink to `/`: listing every holder is right (everything is
/// below `/`), but a stop only ever ends that account's, and never without `--user`.
#[guard_test(needs = [root])]
fn a_checkout_linking_to_root_never_leads_a_stop_beyond_the_account() {
    let _g = setup();
    let home = Home::new();
    let co = home.path().join("co");
    std::os::unix::fs::symlink("/", &co).unwrap();
    let probe = probe_bin();
    let mut mine = [hold(&probe, TEST_UID, Path::new("/"), &[]), hold(&probe, TEST_UID, Path::new("/tmp"), &[])];
    let mut others = [hold(&probe, OTHER_UID, Path::new("/"), &[]), hold(&probe, 0, Path::new("/"), &[])];
    // Read first (harmless on any build): the printed commands name the account.
    let listed = holders(&[co.as_os_str()], &[]);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(text.lines().next().unwrap().starts_with(&format!("/ (what {} resolves to) and", co.display())), "{text}");
    for user in [TEST_USER, OTHER_USER] {
        assert!(text.contains(&format!("guard-user holders / --user {user} --stop\n")), "{user}: {text}");
    }
    assert!(!text.contains("--user root") && !text.contains(" / --stop"), "{text}");
    // No --user: refused, even through sudo, before anything is read or ended.
    for env in [&[][..], &[("SUDO_USER", TEST_USER)][..]] {
        let refused = holders(&[co.as_os_str(), os("--stop")], env);
        assert_eq!(refused.status.code(), Some(2), "{env:?}");
        let err = String::from_utf8_lossy(&refused.stderr);
        assert!(err.contains("holders --stop needs --user"), "{err}");
    }
    for p in mine.iter_mut().chain(others.iter_mut()) {
        assert!(p.is_alive(), "{} was ended by a refused stop", p.pid());
    }
    let stopped = holders(&[co.as_os_str(), os("--user"), os(TEST_USER), os("--stop")], &[]);
    assert_eq!(stopped.status.code(), Some(0), "{}", String::from_utf8_lossy(&stopped.stdout));
    for p in &mut mine {
        assert!(p.wait_dead(WAIT), "{} (the account's) still runs", p.pid());
    }
    for p in &mut others {
        assert!(p.is_alive(), "{} (another account's or root's) was ended", p.pid());
    }
}

/// The stop command as printed, pasted into bash, for a directory whose name is the account's
/// to make hostile: it runs nothing else and stops that account's holders only.
#[guard_test(needs = [root])]
fn the_printed_stop_command_pasted_into_bash_stops_that_accounts_holders_only() {
    let _g = setup();
    let home = Home::new();
    let dir = home.path().join("co $(touch PWNED) 'q' `touch PWNED2`;\n; * \u{1b}[2J x (deleted)");
    mkdirs(&[&dir]);
    let probe = probe_bin();
    let mut mine = hold(&probe, TEST_UID, &dir, &[]);
    let mut other = hold(&probe, OTHER_UID, &dir, &[]);
    let listed = holders(&[dir.as_os_str()], &[]);
    assert_eq!(listed.status.code(), Some(1));
    let text = String::from_utf8_lossy(&listed.stdout);
    let prefix = format!("to stop {TEST_USER}'s the checked way: ");
    let cmd = text.lines().find_map(|l| l.strip_prefix(&prefix)).unwrap_or_else(|| panic!("no stop command:\n{text}"));
    assert!(!cmd.chars().any(char::is_control), "{cmd:?}");
    let run = Command::new("bash")
        .args(["-c", &format!("guard-user() {{ \"$GUARD\" \"$@\"; }}\n{cmd}")])
        .env("GUARD", guard_bin())
        .current_dir(home.path())
        .output()
        .unwrap();
    assert_eq!(
        run.status.code(),
        Some(0),
        "{cmd}\n{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(mine.wait_dead(WAIT), "the account's holder still runs after {cmd}");
    assert!(other.is_alive(), "another account's holder was ended by {cmd}");
    assert!(!home.path().join("PWNED").exists() && !home.path().join("PWNED2").exists(), "{cmd} ran a command");
}

#[guard_test(needs = [root])]
fn exit_status_says_none_some_or_error() {
    let _g = setup();
    let home = Home::new();
    let repo = home.path().join("x (deleted)");
    mkdirs(&[&repo]);
    let file = home.path().join("held.txt");
    write(&file, 0o644);
    let code = |args: &[&OsStr]| holders(args, &[]).status.code();
    assert_eq!(code(&[repo.as_os_str(), os("--user"), os(OTHER_USER)]), Some(0), "none");
    assert_eq!(code(&[file.as_os_str(), os("--user"), os(TEST_USER)]), Some(0), "none");
    let _in_dir = hold(&probe_bin(), TEST_UID, &repo, &[]);
    let _reading = hold(&probe_bin(), TEST_UID, Path::new("/"), &[os("open"), file.as_os_str()]);
    assert_eq!(code(&[repo.as_os_str(), os("--user"), os(TEST_USER)]), Some(1), "a process works in `x (deleted)`");
    assert_eq!(code(&[file.as_os_str(), os("--user"), os(TEST_USER)]), Some(1), "a process reads the file");
    let missing = holders(&[home.path().join("nope").as_os_str()], &[]);
    assert_eq!(missing.status.code(), Some(2));
    let said = String::from_utf8_lossy(&missing.stderr);
    assert!(said.contains("nope: No such file or directory") && said.matches("No such file").count() == 1, "{said}");
    let unknown = holders(&[repo.as_os_str(), os("--user"), os("no-such-account-x")], &[]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no-such-account-x"));
}

/// Run by an account without root: its own processes are read, the others' counted as not
/// readable, and a process of its own it may not read (one that dropped root, so not dumpable)
/// is listed as possibly holding, never silently left out.
#[guard_test(needs = [root])]
fn run_by_an_account_it_reads_its_own_and_says_what_it_could_not() {
    let _g = setup();
    let home = Home::new();
    let repo = home.path().join("repo");
    mkdirs(&[&repo]);
    let bin = home.path().join("guard-user");
    fs::copy(guard_bin(), &bin).unwrap();
    let probe = probe_bin();
    let mine = hold(&probe, TEST_UID, &repo, &[]);
    let undumpable = hold(&probe, 0, &repo, &[os("setuid"), os("4201")]);
    let _other = hold(&probe, OTHER_UID, &repo, &[]);
    let _root = hold(&probe, 0, &repo, &[]);
    let run = |extra: &[&str]| {
        Command::new(&bin).arg("holders").arg(&repo).args(extra).uid(TEST_UID).gid(TEST_UID).output().unwrap()
    };
    let out = run(&["--json"]);
    let doc = json(&out);
    assert_eq!(doc["read"], "caller");
    assert_eq!(ways(&doc), BTreeMap::from([(mine.pid(), vec!["cwd".to_string()])]), "{doc:#}");
    let unread: Vec<u64> = doc["unread"].as_array().unwrap().iter().map(|u| u["pid"].as_u64().unwrap()).collect();
    assert_eq!(unread, [u64::from(undumpable.pid())], "{doc:#}");
    assert!(doc["not_readable"].as_u64().unwrap() >= 2, "{doc:#}");
    assert_eq!(out.status.code(), Some(1));
    let text = run(&[]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.lines().next().unwrap().contains(&format!("in the processes {TEST_USER} can read: 1 holds it")),
        "{text}"
    );
    assert!(text.contains("processes of other accounts were not read: only root can read them"), "{text}");
    // Another account's, asked for by name without root: not one of them could be read.
    let other = run(&["--user", OTHER_USER, "--json"]);
    assert_eq!(other.status.code(), Some(2), "{}", String::from_utf8_lossy(&other.stdout));
}

/// 100,000 fds on one file and 60,000 mappings of another: read whole, shown capped; a run
/// over its read budget, and a process whose /proc read hangs, are listed as not read and the
/// command still ends.
#[guard_test(needs = [root])]
fn huge_fd_tables_and_maps_are_read_within_bounds_and_what_was_not_read_is_said() {
    let _g = setup();
    // 100,000 fds need the limit raised, which root without CAP_SYS_RESOURCE (a container)
    // cannot: there, as many as its hard limit allows.
    let mut lim = libc::rlimit { rlim_cur: 200_000, rlim_max: 200_000 };
    // SAFETY: plain syscalls on a struct we own; the probes inherit the limit.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
        eprintln!("RLIMIT_NOFILE stays at {} here (no CAP_SYS_RESOURCE): fewer than 100,000 fds", lim.rlim_max);
    }
    let n_fds = (lim.rlim_max.saturating_sub(64) as u32).min(100_000);
    let home = Home::new();
    let repo = home.path().join("repo");
    mkdirs(&[&repo]);
    write(&repo.join("f"), 0o644);
    write(&repo.join("m"), 0o644);
    let probe = probe_bin();
    let arg = |n: u32, f: &str| format!("{n}:{}", repo.join(f).display());
    let fds = hold(&probe, TEST_UID, Path::new("/"), &[os("fds"), os(&arg(n_fds, "f"))]);
    let maps = hold(&probe, TEST_UID, Path::new("/"), &[os("maps"), os(&arg(60_000, "m"))]);
    let args = [repo.as_os_str(), os("--user"), os(TEST_USER)];
    let doc = json(&holders(&[&args[..], &[os("--json")]].concat(), &[]));
    let rows: BTreeMap<u64, &Value> =
        doc["holders"].as_array().unwrap().iter().map(|r| (r["pid"].as_u64().unwrap(), r)).collect();
    let f = rows[&u64::from(fds.pid())];
    assert_eq!((f["holds"].clone(), f["fd_count"].clone()), (serde_json::json!(["fd"]), serde_json::json!(n_fds)));
    assert_eq!(f["fds"].as_array().unwrap().len(), 16);
    assert_eq!(rows[&u64::from(maps.pid())]["holds"], serde_json::json!(["mmap"]));
    let text = holders(&args, &[]);
    let text = String::from_utf8_lossy(&text.stdout);
    let line = text.lines().find(|l| l.trim_start().starts_with(&format!("{} ", fds.pid()))).unwrap();
    assert!(line.contains(&format!("fd(3,4,5,6,+{})", n_fds - 4)) && line.len() < 300, "{line}");

    // Over the budget: the fd table cannot be read whole, so that process may hold it.
    let out = holders(&[&args[..], &[os("--json")]].concat(), &[("GUARD_FAULT", "holders_budget:1000")]);
    let doc = json(&out);
    let unread = &doc["unread"].as_array().unwrap();
    // Each process is either not read (it may hold it) or found with what was read, saying
    // it was read in part; never a silent partial answer.
    let over = |pid: u32| {
        let said = |v: &Value| v.as_str().is_some_and(|w| w.contains("over the read budget"));
        unread.iter().any(|u| u["pid"] == pid && said(&u["why"]))
            || doc["holders"].as_array().unwrap().iter().any(|r| r["pid"] == pid && said(&r["incomplete"]))
    };
    assert!(over(fds.pid()), "{doc:#}");
    // The mappings are found within what is left, unless the fd table took it all first.
    let listed = !doc["holders"].as_array().unwrap().is_empty();
    assert!(ways(&doc).contains_key(&maps.pid()) || over(maps.pid()), "{doc:#}");
    assert_eq!(out.status.code(), Some(if listed { 1 } else { 2 }), "{doc:#}");
    // A /proc read that never returns: left behind after the stall time, the rest read.
    let hang = format!("holders_read:{}", maps.pid());
    let out = holders(&[&args[..], &[os("--json")]].concat(), &[("GUARD_FAULT", &hang)]);
    let doc = json(&out);
    assert!(ways(&doc).contains_key(&fds.pid()), "{doc:#}");
    let unread = &doc["unread"].as_array().unwrap();
    assert!(
        unread.iter().any(|u| u["pid"] == maps.pid() && u["why"].as_str().unwrap().contains("stopped answering")),
        "{doc:#}"
    );
}

#[guard_test(needs = [root])]
fn stop_ends_the_accounts_holders_the_checked_way_and_leaves_the_rest() {
    let _g = setup();
    let home = Home::new();
    let exe = home.probe_named("holder");
    let repo = home.path().join("repo");
    let sibling = home.path().join("repo2");
    mkdirs(&[&repo.join("src"), &sibling]);
    let mut inside = [hold(&exe, TEST_UID, &repo, &[]), hold(&exe, TEST_UID, &repo.join("src"), &[])];
    // Ignores SIGTERM (`dodge` renames itself and lives on as another identity: left alone).
    let mut stubborn = hold(&exe, TEST_UID, &repo, &[os("dodge"), os("renamed")]);
    let mut outside = [
        hold(&exe, TEST_UID, &sibling, &[]),
        hold(&exe, TEST_UID, home.path(), &[]),
        hold(&exe, OTHER_UID, &repo, &[]),
        hold(&exe, 0, &repo, &[]),
    ];
    let run = |extra: &[&str]| {
        Command::new(guard_bin())
            .args(["holders", "--user", TEST_USER, "--json"])
            .arg(&repo)
            .args(extra)
            .output()
            .unwrap()
    };
    let listed = json(&run(&[]));
    let pids: BTreeSet<u32> = ways(&listed).keys().copied().collect();
    assert_eq!(pids, BTreeSet::from([inside[0].pid(), inside[1].pid(), stubborn.pid()]), "{listed:#}");
    let stopped = run(&["--stop"]);
    let doc = json(&stopped);
    let outcome =
        |pid: u32| doc["holders"].as_array().unwrap().iter().find(|r| r["pid"] == pid).unwrap()["outcome"].clone();
    assert_eq!(outcome(inside[0].pid()), "stopped", "{doc:#}");
    assert_eq!(outcome(stubborn.pid()), "left", "it is another identity now: {doc:#}");
    assert_eq!(stopped.status.code(), Some(1), "one is left");
    for p in &mut inside {
        assert!(p.wait_dead(WAIT), "{} still holds the directory", p.pid());
    }
    assert!(stubborn.is_alive());
    for p in &mut outside {
        assert!(p.is_alive(), "{} was outside the directory (or another account's) and was ended", p.pid());
    }
}

guard_test::main!();
