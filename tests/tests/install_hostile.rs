//! `install` and `check` against a hostile account (docs/architecture.md): nothing the account controls
//! reaches a unit file; what root gave install (`--home`, `--config`) reaches the drop-in
//! escaped exactly as systemd reads it back (checked with systemd's own loader where its
//! binary exists); a tampered drop-in is drift; the packaged host writes only the drop-in.
use std::{
    ffi::OsStr,
    fs,
    os::unix::{ffi::OsStrExt, fs::PermissionsExt},
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use integration_tests::*;

mod install_host;
use install_host::{out, stored, systemd_parse, tree, Host};

/// A home name with everything the drop-in must escape: spaces, `%` specifiers, `$`
/// variables, both quotes, a backslash, a `;` and a leading `-` on a word.
const HOSTILE_HOME: &str = r#"home dir %i %% $HOME ${X} "dq" 'sq' \b ; -x "#;

/// What the drop-in must be for `home` (and `config`), written out independently of the
/// library: systemd.service(5) quoting for ExecStart=, systemd.exec(5) for ReadWritePaths=.
fn expected_dropin(host: &Host, bin: &Path, home: &Path, config: Option<&Path>) -> String {
    let q = |p: &Path, exec: bool| {
        let s = p.to_str().unwrap().replace('\\', r"\\").replace('"', "\\\"").replace('%', "%%");
        format!("\"{}\"", if exec { s.replace('$', "$$") } else { s })
    };
    let config = config.map(|c| format!(" --config {}", q(c, true))).unwrap_or_default();
    format!(
        "# Written by guard-user install for {user}, from the values root gave it\n\
         # (--user, --home, --config; never the account's own files). `guard-user check` reports any\n\
         # edit as drift; run `guard-user install` again to change it.\n\
         [Service]\n\
         ExecStart=\n\
         ExecStart={bin} run --user {user} --home {home}{config} $GUARD_ARGS\n\
         ReadWritePaths={rw}\n",
        user = host.user,
        bin = bin.display(),
        home = q(home, true),
        rw = q(home, false),
    )
}

fn install_from(host: &Host, source: &Path, extra: &[&OsStr]) -> install_host::Out {
    let mut c = host.command("install");
    c.arg("--home").arg(host.home.path()).arg("--config-source").arg(source).args(extra);
    out(c)
}

#[guard_test(needs = [root])]
fn no_account_controlled_byte_reaches_the_unit_directory() {
    let _g = setup();
    let host = Host::for_account(OTHER_USER, OTHER_UID, HOSTILE_HOME);
    let home = host.home.path();
    // The account's own checkout, where its config link points.
    let checkout = host.h("checkout");
    fs::create_dir(&checkout).unwrap();
    std::os::unix::fs::chown(&checkout, Some(host.uid), Some(host.uid)).unwrap();
    let config = checkout.join("guard-config.json");
    let hostile_state_files = [
        "\n[Service]\nExecStartPre=+/bin/sh -c \"id > /guard-pwned\"\nCapabilityBoundingSet=~\nProtectSystem=no\n",
        "/srv/a b c/state.json",
        "/",
        "/guard-state.json",
        "/etc/x.json",
        "%h/%i/%%/state.json",
        "\"quoted\" 'single'",
        "back\\slash\\n",
        "\u{ff}\u{85}\u{7f}\u{1b}[31m",
        "$HOME/${PATH}",
    ];
    let mut template = None;
    for state_file in hostile_state_files {
        let json = serde_json::json!({ "threshold": 3, "stateFile": state_file, "excludes": [state_file] });
        fs::write(&config, json.to_string()).unwrap();
        // A hand copy at the link's place holding the same, too.
        fs::write(host.link(), json.to_string()).unwrap();
        let o = install_from(&host, &config, &[]);
        // A stateFile with control characters is not a valid config at all: install refuses the
        // source (naming the key and the fix) and writes nothing; the others install, and none of
        // their bytes reach a unit.
        if state_file.chars().any(char::is_control) {
            assert_eq!(o.code, 2, "stateFile {state_file:?}: {}{}", o.stdout, o.stderr);
            assert!(o.stderr.contains("config_malformed stateFile"), "{}", o.stderr);
            if template.is_none() {
                assert!(tree(&host.p("units")).is_empty(), "a refused install wrote units");
            }
            continue;
        }
        assert_eq!(o.code, 0, "stateFile {state_file:?}: {}{}", o.stdout, o.stderr);

        // The template, the drop-in, and beside it the record of the source (which systemd does not read).
        assert_eq!(
            tree(&host.p("units")),
            [
                "guard-user@.service",
                &format!("guard-user@{}.service.d/config-source", host.user),
                &format!("guard-user@{}.service.d/home.conf", host.user)
            ],
            "stateFile {state_file:?}"
        );
        let dropin = fs::read_to_string(host.dropin()).unwrap();
        assert_eq!(dropin, expected_dropin(&host, &host.p("bin/guard-user"), home, None), "stateFile {state_file:?}");
        let unit = fs::read(host.p("units/guard-user@.service")).unwrap();
        assert_eq!(template.get_or_insert_with(|| unit.clone()), &unit, "the template changed with the config");
        for needle in ["ExecStartPre", "CapabilityBoundingSet=~", "ProtectSystem=no", "state.json", "/etc/x"] {
            let all = [dropin.as_bytes(), &unit].concat();
            assert!(!all.windows(needle.len()).any(|w| w == needle.as_bytes()), "{needle} reached the units");
        }
    }

    // systemd's own loader reads back exactly the home root gave install.
    let instance = format!("guard-user@{}.service", host.user);
    if let Some(parsed) = systemd_parse(&[&host.p("units")], &instance) {
        assert_eq!(parsed.complaints, Vec::<String>::new());
        assert_eq!(Path::new(&parsed.fragment), host.p("units/guard-user@.service"));
        assert_eq!(Path::new(&parsed.dropins), host.dropin());
        // The template's own ExecReload (SIGHUP); no ExecStartPre or other command from the config.
        assert_eq!(parsed.exec_kinds, ["ExecStart", "ExecReload"]);
        let home_s = home.to_str().unwrap();
        let bin = host.p("bin/guard-user").display().to_string();
        // `$GUARD_ARGS`, the flags of /etc/default/guard-user, expanded at each start.
        let home_stored = stored(home_s);
        let exec = vec![bin.as_str(), "run", "--user", host.user, "--home", &home_stored, "$GUARD_ARGS"];
        assert_eq!(parsed.exec_start, [exec]);
        // The template's textfile-collector directory (optional: `-`), then the home.
        let rw = format!("-/var/lib/prometheus/node-exporter {home_s}");
        assert_eq!(parsed.read_write_paths.as_deref(), Some(rw.as_str()));
    }
    let o = out({
        let mut c = host.command("check");
        c.arg("--config-source").arg(&config);
        c
    });
    // The source lies in the account's home, whose name holds a backslash: printed escaped.
    let shown = guard::escape::text(config.as_os_str().as_bytes());
    assert!(shown.contains(r"\\b"), "{shown}");
    assert_eq!(o.stdout, format!("[OK] Host guard in sync with {shown}\n"), "{}", o.stderr);
}

#[guard_test(needs = [root])]
fn values_no_unit_can_carry_and_unsafe_homes_are_refused_before_anything_is_written() {
    let _g = setup();
    let host = Host::new();
    let mkhome = |rel: &str, parent_mode: Option<u32>| {
        let p = host.p(rel);
        if let Some(m) = parent_mode {
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::set_permissions(p.parent().unwrap(), fs::Permissions::from_mode(m)).unwrap();
        }
        fs::create_dir_all(&p).unwrap();
        std::os::unix::fs::chown(&p, Some(host.uid), Some(host.uid)).unwrap();
        p
    };
    let in_tmp = tempfile::Builder::new().prefix("guard-install-home-").tempdir_in("/tmp").unwrap();
    std::os::unix::fs::chown(in_tmp.path(), Some(host.uid), Some(host.uid)).unwrap();
    std::os::unix::fs::symlink(host.home.path(), host.p("link-to-home")).unwrap();
    let rooted = host.p("rooted");
    fs::create_dir(&rooted).unwrap();
    let cases: Vec<(Vec<&OsStr>, std::path::PathBuf, &str)> = vec![
        (vec![], mkhome("new\nline", None), "holds a control character"),
        (vec![], mkhome("esc\u{1b}[2J", None), "holds a control character"),
        (vec![], mkhome("shared/home", Some(0o1777)), "is writable by others (mode 1777) and"),
        (vec![], mkhome("open/home", Some(0o777)), "is writable by group or others (mode 777)"),
        (vec![], rooted.clone(), "belongs to uid 0, not to"),
        (vec![], in_tmp.path().to_path_buf(), "PrivateTmp=yes"),
        (vec![], host.p("link-to-home"), "is not canonical"),
        (vec![], "/".into(), "is a system directory"),
        (vec![], host.p("no-such-dir"), "create it, owned by"),
        (
            vec![OsStr::new("--config"), OsStr::from_bytes(b"/srv/\xff.json")],
            host.home.path().into(),
            "not valid UTF-8",
        ),
        (vec![OsStr::new("--config"), OsStr::new("/srv/a\nb.json")], host.home.path().into(), "control character"),
    ];
    for (extra, home, why) in &cases {
        let mut c = host.command("install");
        c.arg("--home").arg(home).arg("--config-source").arg(host.source()).args(extra);
        let o = out(c);
        assert_eq!(o.code, 2, "{home:?} {extra:?}: {}{}", o.stdout, o.stderr);
        assert!(o.stderr.contains(why), "{home:?}: expected `{why}` in {}", o.stderr);
        assert_eq!(o.stderr.lines().count(), 1, "the error is one line: {}", o.stderr);
        assert_eq!(tree(&host.p("units")), Vec::<String>::new(), "{home:?} {extra:?}");
        assert_eq!(tree(&host.p("bin")), Vec::<String>::new());
        assert!(fs::symlink_metadata(home.join("guard-config.json")).is_err(), "{home:?} was linked");
    }
    // An account name that is no plain instance name would be refused the same way; passwd
    // here holds only plain ones, so the rule is covered by the unit tests.
}

#[guard_test(needs = [root])]
fn a_tampered_or_planted_dropin_is_drift() {
    let _g = setup();
    let host = Host::new();
    let drift = format!("{} is missing or differs from this build", host.dropin().display());

    // Planted before any install: a foreign drop-in is not trusted for anything.
    fs::create_dir_all(host.dropin().parent().unwrap()).unwrap();
    fs::write(host.dropin(), "[Service]\nReadWritePaths=/\nExecStartPre=+/bin/sh -c id\n").unwrap();
    let o = host.run("check");
    assert!(o.stdout.lines().any(|l| l == drift), "{}", o.stdout);
    assert!(o.stderr.contains("not in the format guard-user install writes"), "{}", o.stderr);

    let o = host.run("install");
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(o.stdout.contains(&format!("wrote {}", host.dropin().display())), "{}", o.stdout);
    let good = fs::read_to_string(host.dropin()).unwrap();
    assert_eq!(host.run("check").stdout, format!("[OK] Host guard in sync with {}\n", host.source().display()));

    let home = host.home.path().to_str().unwrap();
    let forged_home = good.replace(&format!("\"{home}\""), "\"/\"");
    for (tampered, note) in [
        (format!("{good}ExecStartPre=+/bin/sh -c id\n"), "edited after guard-user install wrote it"),
        (good.replace("ReadWritePaths=", "ReadWritePaths=/etc "), "edited after guard-user install wrote it"),
        // Self-consistent, but for a home install refuses.
        (forged_home, "no longer valid"),
    ] {
        fs::write(host.dropin(), &tampered).unwrap();
        // Without --home, check learns the home from the drop-in, so a forged one is judged too.
        let o = out({
            let mut c = host.command("check");
            c.arg("--config-source").arg(host.source());
            c
        });
        assert_eq!(o.code, 1, "{tampered}");
        assert!(o.stdout.lines().any(|l| l == drift), "{tampered}\n{}", o.stdout);
        assert!(o.stderr.contains(note), "{note}: {}", o.stderr);
    }
    assert_eq!(host.run("install").code, 0);
    assert_eq!(fs::read_to_string(host.dropin()).unwrap(), good);
}

#[guard_test(needs = [root])]
fn install_with_home_runs_the_daemon_with_that_home() {
    let _g = setup();
    let host = Host::for_account(TEST_USER, TEST_UID, HOSTILE_HOME);
    let cfg = host.h("my config.json");
    let o = install_from(&host, &host.source(), &[OsStr::new("--config"), cfg.as_os_str()]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let dropin = fs::read_to_string(host.dropin()).unwrap();
    assert_eq!(dropin, expected_dropin(&host, &host.p("bin/guard-user"), host.home.path(), Some(&cfg)));
    assert!(fs::read_link(&cfg).unwrap() == host.source(), "the link is --config");

    // check learns --home and --config from the drop-in.
    let o = out({
        let mut c = host.command("check");
        c.arg("--config-source").arg(host.source());
        c
    });
    assert!(!o.stdout.contains("differs") && !o.stdout.contains("guard-config.json"), "{}{}", o.stdout, o.stderr);
    // Asked about another home, it says the drop-in was installed for this one.
    let other = host.p("other");
    fs::create_dir(&other).unwrap();
    std::os::unix::fs::chown(&other, Some(host.uid), Some(host.uid)).unwrap();
    let o = out({
        let mut c = host.command("check");
        c.arg("--home").arg(&other).arg("--config-source").arg(host.source());
        c
    });
    assert!(o.stdout.lines().any(|l| l.starts_with(&host.dropin().display().to_string())), "{}", o.stdout);
    assert!(o.stderr.contains("it was installed with --home"), "{}", o.stderr);

    // The drop-in's command line, run as systemd would (after `$$` → `$`), guards that home.
    // `$GUARD_ARGS` unset (no /etc/default/guard-user) expands to no argument at all.
    let argv: Vec<String> = match systemd_parse(&[&host.p("units")], &format!("guard-user@{}.service", host.user)) {
        Some(p) => p.exec_start[0].iter().filter(|a| *a != "$GUARD_ARGS").map(|a| a.replace("$$", "$")).collect(),
        None => guard::install::DropIn::parse(&dropin).unwrap().argv(),
    };
    assert_eq!(argv[4..], ["--home", host.home.path().to_str().unwrap(), "--config", cfg.to_str().unwrap()]);
    let mut daemon = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .args(["--interval", "1s", "--backend", "procfs", "--dry-run"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let log = host.home.wait_log(Duration::from_secs(10), |l| l.contains("TICK_COMPLETE"));
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let end = Instant::now() + Duration::from_secs(5);
    while daemon.try_wait().unwrap().is_none() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = daemon.kill();
    let _ = daemon.wait();
    assert!(log.contains(" STARTED ") && log.contains(&format!("user={TEST_USER}")), "{log}");
    assert!(log.contains("TICK_COMPLETE"), "no tick in {}: {log}", host.home.path().display());
}

#[guard_test(needs = [root])]
fn a_packaged_host_writes_only_the_dropin_and_check_accepts_the_packaged_unit() {
    let _g = setup();
    let mut host = Host::new();
    host.simulate_package();
    let pkg = host.packaged.clone().unwrap();
    let pkg_unit = pkg.join("lib/systemd/system/guard-user@.service");
    let pkg_config = pkg.join("usr/share/guard-user/guard-config.json");
    let instance = format!("guard-user@{}.service", host.user);
    let cmd = |sub: &str| {
        let mut c = host.command(sub);
        c.arg("--home").arg(host.home.path());
        out(c)
    };

    // No --config-source: the packaged config is the default.
    let o = cmd("install");
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(o.stdout.starts_with(&format!("[OK] Host guard installed for {} in ", host.user)), "{}", o.stdout);
    assert!(o.stdout.lines().next().unwrap().contains(&format!(" from {}, ", pkg_config.display())), "{}", o.stdout);
    assert_eq!(
        tree(&host.p("units")),
        [format!("{instance}.d/config-source"), format!("{instance}.d/home.conf")],
        "only the drop-in (and the record of the source beside it) is written"
    );
    assert_eq!(tree(&host.p("bin")), Vec::<String>::new(), "no binary is copied");
    let dropin = fs::read_to_string(host.dropin()).unwrap();
    assert_eq!(dropin, expected_dropin(&host, &pkg.join("usr/bin/guard-user"), host.home.path(), None));
    assert_eq!(cmd("check").stdout, format!("[OK] Host guard in sync with {}\n", pkg_config.display()));
    if let Some(p) = systemd_parse(&[&host.p("units"), &pkg.join("lib/systemd/system")], &instance) {
        assert_eq!(Path::new(&p.fragment), pkg_unit);
        assert_eq!(p.exec_start[0][0], pkg.join("usr/bin/guard-user").display().to_string());
        assert_eq!(p.complaints, Vec::<String>::new());
    }

    // The packaged unit must be what this build writes for the packaged binary.
    let shipped = fs::read_to_string(&pkg_unit).unwrap();
    fs::write(&pkg_unit, shipped.replace("MemoryMax=64M", "MemoryMax=1G")).unwrap();
    let o = cmd("check");
    let line = format!("{} is missing or differs from this build", pkg_unit.display());
    assert!(o.stdout.lines().any(|l| l == line), "{}", o.stdout);
    fs::write(&pkg_unit, &shipped).unwrap();

    // A source install's template in the unit dir shadows the packaged one: check says so and
    // install removes it (it is ours); someone else's is refused.
    let shadow = host.p("units/guard-user@.service");
    let old_bin = guard::install::escape::Executable::new(Path::new("/usr/local/bin/guard-user")).unwrap();
    fs::write(&shadow, guard::install::unit_text(&old_bin)).unwrap();
    let o = cmd("check");
    let line = format!("{} shadows the packaged {}", shadow.display(), pkg_unit.display());
    assert!(o.stdout.lines().any(|l| l == line), "{}", o.stdout);
    let o = cmd("install");
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(o.stdout.contains("(it shadowed the packaged unit)") && !shadow.exists(), "{}", o.stdout);
    fs::write(&shadow, "[Service]\nExecStart=/bin/true\n").unwrap();
    let o = cmd("install");
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("shadows the packaged unit and was not written by guard-user"), "{}", o.stderr);
    assert!(shadow.exists());
    fs::remove_file(&shadow).unwrap();

    // uninstall leaves the package's files to the package.
    assert_eq!(cmd("uninstall").code, 0);
    assert!(!host.dropin().exists());
    assert!(pkg_unit.exists() && pkg.join("usr/bin/guard-user").exists());
}

#[guard_test(needs = [root])]
fn legacy_files_are_retired_as_the_account_never_through_its_links() {
    let _g = setup();
    let host = Host::new();
    // The account points `.config` at root's files, hoping root removes them for it.
    let roots = host.p("roots-config");
    fs::create_dir_all(roots.join("systemd/user")).unwrap();
    fs::write(roots.join("systemd/user/guard-daemon.timer"), "[Timer]\n").unwrap();
    std::os::unix::fs::symlink(&roots, host.h(".config")).unwrap();
    std::os::unix::fs::lchown(host.h(".config"), Some(host.uid), Some(host.uid)).unwrap();
    let o = host.run("install");
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(roots.join("systemd/user/guard-daemon.timer").exists(), "root's file was removed");
    assert!(o.stdout.contains("cannot remove it"), "{}", o.stdout);
}

guard_test::main!();
