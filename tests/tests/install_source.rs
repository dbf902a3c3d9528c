//! The config source (docs/operations.md): `install` refuses one the service cannot see (a tree
//! the unit hides, or one that comes and goes with logins), records the one it linked where
//! only root can write, and `check` compares the link against that record, never against a
//! default; a record the account could have written is not trusted; every path the account
//! made is printed escaped. Real files in a temp root and a fake `systemctl` (install_host/).
use std::{
    ffi::OsStr,
    fs,
    os::unix::{
        ffi::OsStrExt,
        fs::{symlink, PermissionsExt},
    },
    path::{Path, PathBuf},
    time::SystemTime,
};

use integration_tests::*;

mod install_host;
use install_host::{out, shipped_config, tree, Host, Out};

fn escaped(p: &Path) -> String {
    guard::escape::text(p.as_os_str().as_bytes())
}

/// A fresh heartbeat, so `check` has no stale-tick drift.
fn fresh_status(host: &Host) {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs_f64();
    let s = guard::status::Status { last_tick: now, interval_secs: 60.0, user: host.user.into(), ..Default::default() };
    fs::write(host.h("guard-status.json"), serde_json::to_vec(&s).unwrap()).unwrap();
}

/// `check` as an operator types it: no `--home`, no `--config-source` (learned from the drop-in
/// and the record).
fn plain(host: &Host, sub: &str) -> Out {
    out(host.command(sub))
}

fn install(host: &Host, source: &Path, extra: &[&OsStr]) -> Out {
    let mut c = host.command("install");
    c.arg("--home").arg(host.home.path()).arg("--config-source").arg(source).args(extra);
    out(c)
}

/// Points the account's config link (`link`) at `target`, as the account would (its own link).
fn relink_as_account(host: &Host, link: &Path, target: &Path) {
    let tmp = host.h(".relink");
    let _ = fs::remove_file(&tmp);
    symlink(target, &tmp).unwrap();
    std::os::unix::fs::lchown(&tmp, Some(host.uid), Some(host.uid)).unwrap();
    fs::rename(&tmp, link).unwrap();
}

fn record(host: &Host) -> PathBuf {
    host.dropin().with_file_name("config-source")
}

/// A file holding a valid config, readable by the account, in a fresh directory under `parent`.
fn config_in(parent: &Path, uid: u32) -> (tempfile::TempDir, PathBuf) {
    fs::create_dir_all(parent).unwrap();
    let dir = tempfile::Builder::new().prefix("guard-src-").tempdir_in(parent).unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let file = dir.path().join("guard-config.json");
    fs::write(&file, shipped_config()).unwrap();
    std::os::unix::fs::chown(&file, Some(uid), Some(uid)).unwrap();
    (dir, file)
}

#[guard_test(needs = [root])]
fn a_source_or_config_the_service_cannot_see_is_refused_before_anything_is_written() {
    let _g = setup();
    let host = Host::new();
    let (_t, in_tmp) = config_in(Path::new("/tmp"), host.uid);
    let (_v, in_var_tmp) = config_in(Path::new("/var/tmp"), host.uid);
    // /run/user/<uid> exists while the account is logged in; made here when it is not.
    let run_user = PathBuf::from(format!("/run/user/{}", host.uid));
    let made_run_user = !run_user.exists();
    let (_r, in_run_user) = config_in(&run_user, host.uid);
    // A link in the home pointing into /tmp, and a link in /tmp pointing back into the home.
    let checkout = host.h("checkout");
    fs::create_dir(&checkout).unwrap();
    fs::write(checkout.join("guard-config.json"), shipped_config()).unwrap();
    let into_tmp = host.h("into-tmp.json");
    symlink(&in_tmp, &into_tmp).unwrap();
    let out_of_tmp = in_tmp.with_file_name("out-of-tmp.json");
    symlink(checkout.join("guard-config.json"), &out_of_tmp).unwrap();

    let tmp_config = in_tmp.with_file_name("link.json");
    let visible = host.source();
    let source = OsStr::new("--config-source");
    let config = OsStr::new("--config");
    // (arguments, the path the error must name, the tree, why the unit cannot see it)
    let cases: Vec<(Vec<&OsStr>, PathBuf, &str, &str)> = vec![
        (vec![source, in_tmp.as_os_str()], in_tmp.clone(), "/tmp", "(PrivateTmp=yes)"),
        (vec![source, in_var_tmp.as_os_str()], in_var_tmp.clone(), "/var/tmp", "(PrivateTmp=yes)"),
        (vec![source, in_run_user.as_os_str()], in_run_user.clone(), "/run/user", "systemd-logind removes"),
        (vec![source, into_tmp.as_os_str()], in_tmp.clone(), "/tmp", "(PrivateTmp=yes)"),
        (vec![source, out_of_tmp.as_os_str()], out_of_tmp.clone(), "/tmp", "(PrivateTmp=yes)"),
        (
            vec![source, visible.as_os_str(), config, tmp_config.as_os_str()],
            tmp_config.clone(),
            "/tmp",
            "(PrivateTmp=yes)",
        ),
    ];
    for (args, step, tree_path, why) in &cases {
        let mut c = host.command("install");
        c.arg("--home").arg(host.home.path()).args(args);
        let o = out(c);
        assert_eq!(o.code, 2, "{args:?}: {}{}", o.stdout, o.stderr);
        assert_eq!(o.stderr.lines().count(), 1, "one line: {}", o.stderr);
        // The path, why the unit cannot see it, and the fix.
        assert!(o.stderr.contains(&format!("\"{}\"", escaped(step))), "{args:?}: {}", o.stderr);
        assert!(o.stderr.contains(&format!(" inside {tree_path}, which ")) && o.stderr.contains(why), "{}", o.stderr);
        assert!(o.stderr.contains("so the guard could not read it; "), "{}", o.stderr);
        let fix = if args.contains(&config) {
            "pass a --config FILE the service can see"
        } else {
            "under the account's home or /etc/guard-user"
        };
        assert!(o.stderr.contains(fix), "{}", o.stderr);
        assert_eq!(tree(&host.p("units")), Vec::<String>::new(), "{args:?} wrote units");
        assert_eq!(tree(&host.p("bin")), Vec::<String>::new(), "{args:?} installed the binary");
        assert!(fs::symlink_metadata(host.link()).is_err(), "{args:?} linked the config");
    }

    // A --home under /run/user is refused the same way (under /tmp: install_hostile.rs).
    let home = run_user.join("guard-home");
    fs::create_dir_all(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(host.uid), Some(host.uid)).unwrap();
    let mut c = host.command("install");
    c.arg("--home").arg(&home).arg("--config-source").arg(host.source());
    let o = out(c);
    assert_eq!(o.code, 2, "{}{}", o.stdout, o.stderr);
    assert!(o.stderr.contains(" is inside /run/user, which holds login sessions' runtime directories"), "{}", o.stderr);
    assert_eq!(tree(&host.p("units")), Vec::<String>::new());

    drop((_t, _v, _r));
    let _ = fs::remove_dir(&home);
    if made_run_user {
        let _ = fs::remove_dir(&run_user);
    }
}

#[guard_test(needs = [root])]
fn check_reports_a_config_link_that_leads_through_a_tree_the_service_cannot_see() {
    let _g = setup();
    let host = Host::new();
    let source = host.source();
    let o = install(&host, &source, &[]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    fresh_status(&host);
    // The account routes its link through /tmp: root still reads the same file (so the link
    // "points to the source"), the daemon in its own /tmp finds nothing.
    let (_t, in_tmp) = config_in(Path::new("/tmp"), host.uid);
    let hop = in_tmp.with_file_name("hop.json");
    symlink(&source, &hop).unwrap();
    relink_as_account(&host, &host.link(), &hop);
    let o = plain(&host, "check");
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let line = format!(
        "{} leads to {}, inside /tmp, which the unit replaces with an empty directory of the service's own \
         (PrivateTmp=yes), so the guard cannot read it; run guard-user install --user {} --home {} --config-source {}",
        escaped(&host.link()),
        escaped(&hop),
        host.user,
        escaped(host.home.path()),
        escaped(&source)
    );
    assert!(o.stdout.lines().any(|l| l == line), "missing `{line}` in\n{}", o.stdout);
    assert!(!o.stdout.contains("is not a link to"), "{}", o.stdout);

    // Straight into /tmp: the same line (the link itself is then also not the source).
    relink_as_account(&host, &host.link(), &in_tmp);
    let o = plain(&host, "check");
    assert!(
        o.stdout.lines().any(|l| l.starts_with(&format!(
            "{} leads to {}, inside /tmp, ",
            escaped(&host.link()),
            escaped(&in_tmp)
        ))),
        "{}",
        o.stdout
    );
}

#[guard_test(needs = [root])]
fn a_record_the_account_could_have_written_is_not_trusted() {
    let _g = setup();
    let host = Host::new();
    let chosen = fs::canonicalize(host.p("b.json")).unwrap();
    let o = install(&host, &chosen, &[]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    fresh_status(&host);
    assert_eq!(plain(&host, "check").stdout, format!("[OK] Host guard in sync with {}\n", escaped(&chosen)));
    let rec = record(&host);
    let good = fs::read(&rec).unwrap();

    // The account wants its own file checked as "in sync": it links it, and a record naming it
    // appears in each way the account could have put one there.
    let (_t, own) = config_in(&host.h("mine"), host.uid);
    relink_as_account(&host, &host.link(), &own);
    let own_record = guard::install::record::text(&guard::install::escape::AccountName::new(host.user).unwrap(), &own);
    let dir = rec.parent().unwrap().to_path_buf();
    let bob = guard::install::escape::AccountName::new(TEST_USER).unwrap();
    type Plant<'a> = (&'a str, Box<dyn Fn() + 'a>, Box<dyn Fn() + 'a>);
    let restore_file = || {
        let _ = fs::remove_file(&rec);
        fs::write(&rec, &good).unwrap();
        fs::set_permissions(&rec, fs::Permissions::from_mode(0o644)).unwrap();
    };
    let plants: Vec<Plant> = vec![
        (
            "belongs to uid",
            Box::new(|| {
                fs::write(&rec, &own_record).unwrap();
                std::os::unix::fs::chown(&rec, Some(host.uid), Some(host.uid)).unwrap();
            }),
            Box::new(|| {
                std::os::unix::fs::chown(&rec, Some(0), Some(0)).unwrap();
                restore_file();
            }),
        ),
        (
            "is writable by group or others",
            Box::new(|| {
                fs::write(&rec, &own_record).unwrap();
                fs::set_permissions(&rec, fs::Permissions::from_mode(0o666)).unwrap();
            }),
            Box::new(restore_file),
        ),
        (
            "its directory belongs to uid",
            Box::new(|| {
                fs::write(&rec, &own_record).unwrap();
                std::os::unix::fs::chown(&dir, Some(host.uid), Some(host.uid)).unwrap();
            }),
            Box::new(|| {
                std::os::unix::fs::chown(&dir, Some(0), Some(0)).unwrap();
                restore_file();
            }),
        ),
        (
            "it is a symbolic link",
            Box::new(|| {
                fs::write(host.p("planted-record"), &own_record).unwrap();
                fs::remove_file(&rec).unwrap();
                symlink(host.p("planted-record"), &rec).unwrap();
            }),
            Box::new(restore_file),
        ),
        (
            "not in the format guard-user install writes for this account",
            // Another account's record (root's own file) moved in.
            Box::new(|| fs::write(&rec, guard::install::record::text(&bob, &own)).unwrap()),
            Box::new(restore_file),
        ),
    ];
    for (why, plant, restore) in &plants {
        plant();
        let o = plain(&host, "check");
        assert_eq!(o.code, 1, "{why}: {}{}", o.stdout, o.stderr);
        assert!(!o.stdout.contains("[OK]"), "{why}: {}", o.stdout);
        let line = format!("{} is missing or differs from this build", escaped(&rec));
        assert!(o.stdout.lines().any(|l| l == line), "{why}: missing `{line}` in\n{}", o.stdout);
        assert!(o.stderr.contains(why), "{why}: {}", o.stderr);
        assert!(o.stderr.contains("--config-source FILE"), "{}", o.stderr);
        // install without --config-source neither takes it nor falls back to the default.
        let before = fs::read_link(host.link()).unwrap();
        let o = out({
            let mut c = host.command("install");
            c.arg("--home").arg(host.home.path());
            c
        });
        assert_eq!(o.code, 2, "{why}: {}{}", o.stdout, o.stderr);
        assert!(o.stderr.contains("pass --config-source FILE"), "{}", o.stderr);
        assert_eq!(fs::read_link(host.link()).unwrap(), before, "{why}: install relinked");
        restore();
    }
    // With the record restored, check compares against the operator's choice again.
    let o = plain(&host, "check");
    assert!(
        o.stdout.lines().any(|l| l.starts_with(&format!(
            "{} is not a link to {};",
            escaped(&host.link()),
            escaped(&chosen)
        ))),
        "{}",
        o.stdout
    );
}

#[guard_test(needs = [root])]
fn every_path_the_account_made_is_printed_escaped() {
    let _g = setup();
    let host = Host::new();
    // The account's checkout: a name with a terminal title sequence, a bell, a newline that
    // would forge a line of output, and a right-to-left override.
    let checkout = host.h("checkout");
    fs::create_dir(&checkout).unwrap();
    let name = OsStr::from_bytes(b"cfg \x1b]0;pwned\x07\n[OK] Host guard in sync \xe2\x80\xae.json");
    let source = checkout.join(name);
    fs::write(&source, shipped_config()).unwrap();
    std::os::unix::fs::chown(&source, Some(host.uid), Some(host.uid)).unwrap();
    // --config may hold what a unit file can carry, a right-to-left override too.
    let config = host.h("my\u{202e}cfg.json");
    let clean = |o: &Out| {
        for text in [&o.stdout, &o.stderr] {
            assert!(!text.chars().any(|c| (c.is_control() && c != '\n') || c == '\u{202e}'), "{text:?}");
        }
    };

    let o = install(&host, &source, &[OsStr::new("--config"), config.as_os_str()]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    clean(&o);
    let first = o.stdout.lines().next().unwrap();
    assert!(first.contains(&format!(" from {}, every 60s", escaped(&source))), "{first}");
    assert!(o.stdout.contains(&format!("  linked {} to {}\n", escaped(&config), escaped(&source))), "{}", o.stdout);
    assert!(!o.stdout.lines().any(|l| l.starts_with("[OK] Host guard in sync")), "a forged line: {}", o.stdout);

    fresh_status(&host);
    let o = plain(&host, "check");
    clean(&o);
    assert_eq!(o.stdout, format!("[OK] Host guard in sync with {}\n", escaped(&source)), "{}", o.stderr);

    // Drift: the line names the recorded source, and the fix is a command with each argument escaped.
    // (The link is --config here; it lives in the home, so the account can move it.)
    relink_as_account(&host, &config, &fs::canonicalize(host.p("b.json")).unwrap());
    let o = plain(&host, "check");
    clean(&o);
    let arg = |p: &Path| guard::escape::log_value(p.as_os_str().as_bytes());
    let line = format!(
        "{} is not a link to {}; run guard-user install --user {} --home {} --config {} --config-source {}",
        escaped(&config),
        escaped(&source),
        host.user,
        arg(host.home.path()),
        arg(&config),
        arg(&source)
    );
    assert!(o.stdout.lines().any(|l| l == line), "missing `{line}` in\n{}", o.stdout);

    let o = plain(&host, "uninstall");
    clean(&o);
    assert!(
        o.stdout.starts_with(&format!(
            "[OK] Host guard removed for {}; kept {} and the log\n",
            host.user,
            escaped(&config)
        )),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains(&format!("  removed {}\n", escaped(&record(&host)))), "{}", o.stdout);
    assert!(!record(&host).exists() && !host.dropin().exists());
}

guard_test::main!();
