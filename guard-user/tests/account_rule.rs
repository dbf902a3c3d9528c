//! Every subcommand names its account the same way (docs/operations.md, "Which account"):
//! `--user`, else `$SUDO_USER` as root through sudo, else the invoking user. Run as root with
//! neither, the default would be root itself: the subcommands that act or print command lines
//! refuse (exit 2, asking for `--user`), the ones that only read say whom they read on their
//! first line, and `check` checks the installed instances, never a `guard-user@root.service`.
//! Also the other paths an operator meets before anything runs: a non-root `run` for another
//! account, a passwd home that is not there.
use std::{
    fs,
    os::unix::process::CommandExt as _,
    path::Path,
    process::{Command, Output},
};

use guard_test::guard_test;

fn guard() -> Command {
    guard_at(Path::new(env!("CARGO_BIN_EXE_guard-user")))
}

/// [`guard`] from `bin`.
fn guard_at(bin: &Path) -> Command {
    let mut c = Command::new(bin);
    // Nothing of this test's own environment decides the account, and no Redis is asked.
    c.env_remove("SUDO_USER")
        .env_remove("AGENTIHOOKS_HIVE_REDIS_URL")
        .env("AGENTIHOOKS_SWARM_REDIS_URL", "redis://127.0.0.1:1/0");
    c
}

/// A test account (what `integration_tests::ensure_account` does for the kernel tests): created
/// when missing, as the runs of `cargo xtask test` and the guests have it.
fn test_account(name: &str, uid: u32) -> guard::account::Account {
    if let Ok(a) = guard::account::Account::by_name(name) {
        return a;
    }
    let uid = uid.to_string();
    let _ = Command::new("useradd")
        .args(["--uid", &uid, "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", name])
        .status();
    guard::account::Account::by_name(name).unwrap_or_else(|e| panic!("the test account {name}: {e}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn run_in(dir: &Path, args: &[&str]) -> Output {
    guard().args(args).current_dir(dir).output().unwrap()
}

#[guard_test(needs = [root])]
fn as_root_with_no_account_named_what_acts_or_shows_command_lines_refuses_and_asks_for_user() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_str().unwrap();
    let refused: &[&[&str]] = &[
        &["run", "--dry-run", "--home", home],
        &["--dry-run", "--home", home],
        &["install", "--home", home, "--unit-dir", home, "--bin-dir", home],
        &["uninstall", "--unit-dir", home, "--bin-dir", home],
        &["holders", home, "--stop"],
        &["match", "--pattern", "."],
        &["explain", "sleep", "--home", home],
    ];
    for args in refused {
        for sudo_user in [None, Some("root")] {
            let mut cmd = guard();
            if let Some(s) = sudo_user {
                // sudo run by root is root too.
                cmd.env("SUDO_USER", s);
            }
            let o = cmd.args(*args).current_dir(dir.path()).output().unwrap();
            let (out, err) = (text(&o.stdout), text(&o.stderr));
            assert_eq!(o.status.code(), Some(2), "{args:?} SUDO_USER={sudo_user:?}: {o:?}");
            assert!(err.contains("no account named") && err.contains("--user"), "{args:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{args:?}: one line, the refusal: {err}");
            // Nothing of root's was printed (match and explain list command lines).
            assert!(out.is_empty(), "{args:?}: {out}");
        }
    }
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0, "something was written");
    // Named, root is guarded and shown: the refusal is about the default only.
    let o = run_in(dir.path(), &["match", "--user", "root", "--pattern", "."]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(text(&o.stdout).lines().count() > 0, "{o:?}");
}

#[guard_test(needs = [root])]
fn as_root_with_no_account_named_what_only_reads_says_whom_it_read_on_its_first_line() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_str().unwrap();
    fs::write(dir.path().join("guard-config.json"), "{}").unwrap();
    for args in [
        &["status", "--home", home][..],
        &["status", "--json", "--home", home],
        &["tree", "--home", home],
        &["validate", "--home", home],
    ] {
        let o = run_in(dir.path(), args);
        let err = text(&o.stderr);
        let first = err.lines().next().unwrap_or_default();
        assert!(first.contains("account root (uid 0)") && first.contains("--user NAME"), "{args:?}: {err}");
        // stdout stays the command's own output (JSON for --json).
        assert!(!text(&o.stdout).contains("account root"), "{args:?}: {o:?}");
    }
    // holders reads no account without --user but every process of the machine, and says so
    // first, on the line its output starts with (docs/operations.md, holders).
    let o = run_in(dir.path(), &["holders", home]);
    let out = text(&o.stdout);
    assert!(out.lines().next().unwrap_or_default().contains("every process of the machine (read as root)"), "{o:?}");
    // Named (by --user or by sudo), nothing is said: the reader chose.
    test_account("guardtest1", 4201);
    for (user, sudo) in [(Some("root"), None), (None, Some("guardtest1"))] {
        let mut cmd = guard();
        cmd.args(["validate", "--home", home]);
        if let Some(u) = user {
            cmd.args(["--user", u]);
        }
        if let Some(s) = sudo {
            cmd.env("SUDO_USER", s);
        }
        let o = cmd.output().unwrap();
        assert!(!text(&o.stderr).contains("account root"), "{user:?} {sudo:?}: {o:?}");
    }
}

#[guard_test(needs = [root])]
fn sudo_user_names_the_account_for_every_subcommand_when_root_runs_through_sudo() {
    // Processes as a test account: one test at a time on the host.
    let _serial = guard_test::serial::serial();
    let account = test_account("guardtest1", 4201);
    // `match` lists the processes of the account $SUDO_USER names: this sleep, not root's.
    let mut sleeper = Command::new("sleep").arg("30").uid(account.uid).gid(account.gid).spawn().unwrap();
    let o = guard().env("SUDO_USER", "guardtest1").args(["match", "--pattern", "^sleep 30$"]).output().unwrap();
    sleeper.kill().ok();
    sleeper.wait().ok();
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(out.lines().any(|l| l == format!("match {} sleep 30", sleeper.id())), "{out}");
    assert!(out.lines().all(|l| !l.contains("guard-user")), "root's own processes listed: {out}");
}

#[guard_test(needs = [root])]
fn check_as_root_with_no_account_named_checks_the_installed_instances_never_root() {
    let units = tempfile::tempdir().unwrap();
    let dir = units.path().to_str().unwrap();
    let o = guard().args(["check", "--unit-dir", dir, "--bin-dir", dir]).output().unwrap();
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(out.starts_with(&format!("no guard is installed in {dir}")), "{out}");
    assert!(!out.contains("root"), "{out}");

    // One instance's drop-in (its content is check's to judge): checked under its name.
    test_account("guardtest1", 4201);
    let dropin = units.path().join("guard-user@guardtest1.service.d");
    fs::create_dir(&dropin).unwrap();
    fs::write(dropin.join("home.conf"), "[Service]\n").unwrap();
    // Not an instance: no drop-in inside, an invalid account name.
    fs::create_dir(units.path().join("guard-user@nobody.service.d")).unwrap();
    fs::create_dir_all(units.path().join("guard-user@-x.service.d")).unwrap();
    fs::write(units.path().join("guard-user@-x.service.d/home.conf"), "").unwrap();
    let o = guard()
        .args(["check", "--unit-dir", dir, "--bin-dir", dir])
        .env("GUARD_SYSTEMD_RUNNING", "0")
        .output()
        .unwrap();
    let out = text(&o.stdout);
    assert_eq!(out.lines().next(), Some("guard-user@guardtest1.service:"), "{out}");
    assert!(out.lines().filter(|l| l.ends_with(".service:")).count() == 1, "{out}");
    assert!(!out.contains("root"), "root's instance was checked: {out}");
    assert_eq!(o.status.code(), Some(1), "an instance that differs is drift: {o:?}");

    // An account removed without uninstall (listed first): said as drift, and the next
    // instance is checked all the same.
    let gone = units.path().join("guard-user@aaguardgone.service.d");
    fs::create_dir(&gone).unwrap();
    fs::write(gone.join("home.conf"), "[Service]\n").unwrap();
    let o = guard()
        .args(["check", "--unit-dir", dir, "--bin-dir", dir])
        .env("GUARD_SYSTEMD_RUNNING", "0")
        .output()
        .unwrap();
    let out = text(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "guard-user@aaguardgone.service:", "{out}");
    assert!(lines[1].starts_with("the account aaguardgone no longer exists, yet its guard is installed ("), "{out}");
    assert!(lines.contains(&"guard-user@guardtest1.service:"), "the next instance was not checked: {out}");
    assert_eq!(o.status.code(), Some(1), "{o:?}");
}

#[guard_test(needs = [root])]
fn a_run_for_another_account_without_root_is_refused_before_it_starts() {
    let _serial = guard_test::serial::serial();
    let me = test_account("guardtest1", 4201);
    test_account("guardtest2", 4202);
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(dir.path(), Some(me.uid), Some(me.gid)).unwrap();
    // As the account: from where it can run guard-user (a copy when the clone is out of its reach).
    let bin = guard_test::child::runnable_by_accounts(Path::new(env!("CARGO_BIN_EXE_guard-user")));
    let o = guard_at(&bin)
        .args(["run", "--user", "guardtest2", "--dry-run", "--backend", "procfs", "--home"])
        .arg(dir.path())
        .uid(me.uid)
        .gid(me.gid)
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(err.contains("guarding guardtest2 (uid 4202) needs root"), "{err}");
    assert!(!dir.path().join("guard-daemon.log").exists());
}

#[guard_test(needs = [root])]
fn a_passwd_home_that_is_not_there_is_named_as_the_passwd_home_not_as_a_home_option() {
    // Debian's nobody has /nonexistent as its home.
    let nobody = guard::account::Account::by_name("nobody").expect("Debian's nobody");
    assert!(!nobody.home.exists(), "nobody's home {} exists here", nobody.home.display());
    let o = guard().args(["run", "--user", "nobody", "--dry-run", "--backend", "procfs"]).output().unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let expected = format!("the home of nobody in the passwd database, {}, is not a directory", nobody.home.display());
    assert!(err.contains(&expected) && err.contains("--home DIR"), "{err}");
    assert!(!err.contains("--home /"), "{err}");
}

guard_test::main!();
