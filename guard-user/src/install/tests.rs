//! Unit tests of the install module: escaping, the drop-in format, the template's directives,
//! home validation. Writing, systemctl and a real systemd parsing our files are in
//! tests/tests/install.rs (root).
use std::{
    ffi::OsStr,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
};

use super::{
    escape::{split_exec_line, AccountName, Executable, UnitPath, UnitValueError},
    hidden::{
        hidden_trees, lookup_steps, refuse_hidden, service_hidden_trees, HiddenTree, Judge, HIDES_NOTHING, HIDING,
    },
    home::{validate_home, HomeError},
    layout::{Layout, Provider},
    record::{self, RecordError},
    unit::{unit_text, DropIn, DropInError},
};
use crate::account::Account;

fn up(s: &str) -> UnitPath {
    UnitPath::new("test", Path::new(s), "fix").unwrap()
}

fn dropin(home: &str, config: Option<&str>) -> DropIn {
    DropIn {
        bin: Executable::new(Path::new("/usr/local/bin/guard-user")).unwrap(),
        user: AccountName::new("alice").unwrap(),
        home: up(home),
        config: config.map(up),
    }
}

#[test]
fn exec_arguments_are_quoted_with_specifiers_dollars_quotes_and_backslashes_escaped() {
    let p = up(r#"/srv/a b/%h $HOME "q" \n 'x' ;"#);
    assert_eq!(p.exec_arg(), r#""/srv/a b/%%h $$HOME \"q\" \\n 'x' ;""#);
    // ReadWritePaths= expands no variables, so `$` stays single there.
    assert_eq!(p.path_list_item(), r#""/srv/a b/%%h $HOME \"q\" \\n 'x' ;""#);
    assert_eq!(up("/home/alice").exec_arg(), "\"/home/alice\"");
}

#[test]
fn what_no_directive_can_carry_is_refused() {
    let bad = |p: &Path| UnitPath::new("--home", p, "fix").unwrap_err();
    assert!(matches!(bad(Path::new("/home/a\nExecStartPre=/bin/sh")), UnitValueError::Control { .. }));
    assert!(matches!(bad(Path::new("/home/a\tb")), UnitValueError::Control { .. }));
    assert!(matches!(bad(Path::new("/home/a\u{85}b")), UnitValueError::Control { .. }));
    assert!(matches!(bad(Path::new(OsStr::from_bytes(b"/home/\xff"))), UnitValueError::NotUtf8 { .. }));
    for p in ["home/alice", "/home/../etc", "/home/./a", "/home//a", "/home/a/", ""] {
        assert!(matches!(bad(Path::new(p)), UnitValueError::NotNormalized { .. }), "{p:?}");
    }
    let long = format!("/{}", "a/".repeat(2100));
    assert!(matches!(bad(Path::new(long.trim_end_matches('/'))), UnitValueError::TooLong { .. }));
    // The message shows the value escaped on one line.
    let e = bad(Path::new("/x\ny")).to_string();
    assert!(e.contains(r#""/x\ny""#) && !e.contains('\n'), "{e}");
}

#[test]
fn the_binary_path_is_limited_to_bytes_systemd_takes_literally() {
    assert!(Executable::new(Path::new("/usr/bin/guard-user")).is_ok());
    assert!(Executable::new(Path::new("/opt/guard-1.0_x+y/bin/guard-user")).is_ok());
    for p in ["/opt/a b/guard-user", "/opt/%i/guard-user", "/opt/$x/guard-user", "/opt/\"/guard-user", "/o\\/g"] {
        assert!(matches!(Executable::new(Path::new(p)), Err(UnitValueError::UnsafeExecutable { .. })), "{p}");
    }
}

#[test]
fn account_names_must_be_plain_instance_names() {
    for ok in ["alice", "_svc", "a.b-c_d9", "A"] {
        assert!(AccountName::new(ok).is_ok(), "{ok}");
    }
    let too_long = "a".repeat(33);
    for bad in ["", "1000", "-x", ".x", "a b", "a%i", "a$", "a/b", "a\nb", "é", "a@b", too_long.as_str()] {
        assert!(AccountName::new(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn the_dropin_resets_execstart_and_runs_what_install_was_told() {
    assert_eq!(
        dropin("/srv/alice home %i", Some("/srv/cfg $x.json")).text(),
        "# Written by guard-user install for alice, from the values root gave it\n\
         # (--user, --home, --config; never the account's own files). `guard-user check` reports any\n\
         # edit as drift; run `guard-user install` again to change it.\n\
         [Service]\n\
         ExecStart=\n\
         ExecStart=/usr/local/bin/guard-user run --user alice --home \"/srv/alice home %%i\" \
         --config \"/srv/cfg $$x.json\" $GUARD_ARGS\n\
         ReadWritePaths=\"/srv/alice home %%i\"\n"
    );
    let d = dropin("/home/alice", None);
    assert!(d
        .text()
        .contains("ExecStart=/usr/local/bin/guard-user run --user alice --home \"/home/alice\" $GUARD_ARGS\n"));
    assert_eq!(d.argv(), ["/usr/local/bin/guard-user", "run", "--user", "alice", "--home", "/home/alice"]);
}

#[test]
fn a_dropin_parses_back_to_the_values_it_was_written_from() {
    for (home, config) in [
        ("/home/alice", None),
        (r#"/srv/a "b" \c %d $e 'f' ; -g"#, Some("/srv/x/%%y.json")),
        ("/srv/ünïcode", Some("/c")),
    ] {
        let d = dropin(home, config);
        assert_eq!(DropIn::parse(&d.text()), Ok(d.clone()), "{home}");
        assert_eq!(split_exec_line(&d.home.exec_arg()), Some(vec![home.to_string()]));
    }
    // A home that is literally `$GUARD_ARGS` is quoted with its `$` doubled: never the variable.
    let d = dropin("/srv/$GUARD_ARGS", None);
    assert!(d.text().contains(r#"--home "/srv/$$GUARD_ARGS" $GUARD_ARGS"#), "{}", d.text());
    assert_eq!(DropIn::parse(&d.text()), Ok(d.clone()));
}

#[test]
fn a_dropin_an_older_guard_user_wrote_is_named_as_such() {
    let d = dropin("/home/alice", None);
    let older = d.text().replace(" $GUARD_ARGS\n", "\n");
    assert_eq!(DropIn::parse(&older), Err(DropInError::Older));
    let e = DropInError::Older.to_string();
    assert!(e.contains("$GUARD_ARGS") && e.contains("install again"), "{e}");
}

#[test]
fn an_edited_or_foreign_dropin_is_not_accepted() {
    let good = dropin("/home/alice", None).text();
    let edits = [
        good.replace("[Service]\n", "[Service]\nExecStartPre=+/bin/sh -c id\n"),
        good.replace("ReadWritePaths=\"/home/alice\"", "ReadWritePaths=\"/home/alice\" /etc"),
        good.replace("# Written", "#Written"),
        format!("{good}ProtectSystem=no\n"),
        good.replace("--home \"/home/alice\"", "--home \"/home/alice\" --dry-run"),
    ];
    for e in &edits {
        assert!(matches!(DropIn::parse(e), Err(DropInError::Edited | DropInError::Foreign)), "{e}");
    }
    for foreign in [
        "",
        "[Service]\nReadWritePaths=/\n",
        "[Service]\nExecStart=/bin/sh -c id\n",
        "[Service]\nExecStart=/usr/local/bin/guard-user run --user alice --home \"/h\" ; /bin/sh\n",
        "[Service]\nExecStart=/usr/local/bin/guard-user run --user alice --home \"/h%i\"\n",
    ] {
        assert!(DropIn::parse(foreign).is_err(), "{foreign}");
    }
    // Values install would refuse are refused when read back, too.
    let relative = good.replace("--home \"/home/alice\"", "--home \"home\"");
    assert!(matches!(DropIn::parse(&relative), Err(DropInError::Invalid(_))), "{relative}");
}

#[test]
fn the_template_pins_its_directives() {
    let t = unit_text(&Executable::new(Path::new("/opt/bin/guard-user")).unwrap());
    let directives: Vec<&str> = t.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).collect();
    assert_eq!(
        directives,
        [
            "[Unit]",
            "Description=guard: ends process names that pile up for %i",
            "Documentation=file:///opt/bin/guard-user",
            "Wants=sys-kernel-tracing.mount",
            "After=sys-kernel-tracing.mount network.target",
            "StartLimitIntervalSec=0",
            "[Service]",
            "Type=notify",
            "NotifyAccess=main",
            "WatchdogSec=60s",
            "EnvironmentFile=-/etc/default/guard-user",
            "EnvironmentFile=-/etc/default/guard-user@%i",
            "ExecStart=/opt/bin/guard-user run --user %i $GUARD_ARGS",
            "ExecStartPre=+/opt/bin/guard-user __slots-release",
            "ExecStopPost=+/opt/bin/guard-user __slots-release",
            "ExecReload=/bin/kill -HUP $MAINPID",
            "Restart=always",
            "RestartSec=5s",
            "TimeoutStopSec=10s",
            "RuntimeDirectory=guard-user",
            "RuntimeDirectoryMode=0700",
            "RuntimeDirectoryPreserve=yes",
            "CapabilityBoundingSet=CAP_BPF CAP_PERFMON CAP_KILL CAP_SETUID CAP_SETGID CAP_DAC_READ_SEARCH",
            "AmbientCapabilities=CAP_BPF CAP_PERFMON CAP_KILL CAP_SETUID CAP_SETGID CAP_DAC_READ_SEARCH",
            "NoNewPrivileges=yes",
            "LimitMEMLOCK=infinity",
            "ProtectSystem=strict",
            "ReadWritePaths=-/var/lib/prometheus/node-exporter",
            "ProtectHome=read-only",
            "PrivateTmp=yes",
            "PrivateDevices=yes",
            "ProtectKernelTunables=yes",
            "ProtectKernelModules=yes",
            "ProtectKernelLogs=yes",
            "ProtectClock=yes",
            "ProtectHostname=yes",
            "RestrictNamespaces=yes",
            "RestrictRealtime=yes",
            "RestrictSUIDSGID=yes",
            "LockPersonality=yes",
            "MemoryDenyWriteExecute=yes",
            "SystemCallArchitectures=native",
            "SystemCallFilter=@system-service bpf",
            "SystemCallErrorNumber=EPERM",
            "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
            "MemoryMax=64M",
            "TasksMax=32",
            "OOMScoreAdjust=-900",
            "[Install]",
            "WantedBy=multi-user.target",
        ]
    );
}

fn account(uid: u32) -> Account {
    Account { name: "alice".into(), uid, gid: uid, home: PathBuf::from("/home/alice") }
}

#[test]
fn system_private_missing_and_root_homes_are_refused() {
    // SAFETY: geteuid cannot fail.
    let me = account(unsafe { libc::geteuid() }.max(1));
    let err = |p: &str| validate_home(&me, Path::new(p)).unwrap_err();
    assert!(matches!(err("/"), HomeError::System { .. }));
    assert!(matches!(err("/etc"), HomeError::System { .. }));
    assert!(matches!(err("/proc/self/cwd"), HomeError::NotCanonical { .. } | HomeError::System { .. }));
    assert!(matches!(err("/proc/1"), HomeError::System { .. }));
    assert!(matches!(err("/tmp"), HomeError::Private { .. }));
    assert!(matches!(err("/no/such/guard-home"), HomeError::Missing { .. }));
    assert!(matches!(err("home"), HomeError::Unit(UnitValueError::NotNormalized { .. })));
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    assert!(matches!(err(dir.path().to_str().unwrap()), HomeError::Private { .. }));
    let e = validate_home(&account(0), Path::new("/root")).unwrap_err();
    assert!(matches!(e, HomeError::Root { .. }), "{e}");
}

#[test]
fn a_home_the_service_cannot_see_or_that_comes_and_goes_with_logins_is_refused() {
    // SAFETY: geteuid cannot fail.
    let me = account(unsafe { libc::geteuid() }.max(1));
    for (p, tree, directive) in [
        ("/var/tmp", "/var/tmp", "PrivateTmp=yes"),
        ("/dev/shm", "/dev", "PrivateDevices=yes"),
        ("/run/user", "/run/user", "systemd-logind"),
    ] {
        match validate_home(&me, Path::new(p)) {
            Err(e @ HomeError::Private { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(&format!("is inside {tree}, ")) && msg.contains(directive), "{p}: {msg}");
            }
            other => panic!("{p}: {other:?}"),
        }
    }
}

fn trees(unit: &str) -> Vec<(String, String)> {
    hidden_trees(unit).into_iter().map(|t| (t.path, t.why)).collect()
}

fn template() -> String {
    unit_text(&Executable::new(Path::new("/usr/bin/guard-user")).unwrap())
}

#[test]
fn the_hidden_trees_are_read_from_the_units_own_directives() {
    let paths = |ts: Vec<HiddenTree>| ts.into_iter().map(|t| t.path).collect::<Vec<_>>();
    assert_eq!(paths(hidden_trees(&template())), ["/tmp", "/var/tmp", "/dev"]);
    // The one tree that is no directive of the unit: login runtime directories.
    assert_eq!(paths(service_hidden_trees()), ["/tmp", "/var/tmp", "/dev", "/run/user"]);
    let t = trees(&template());
    assert!(t[0].1.contains("(PrivateTmp=yes)") && t[2].1.contains("(PrivateDevices=yes)"), "{t:?}");

    // The rule follows the unit: a stricter unit hides more, a looser one less.
    let stricter = template().replace("ProtectHome=read-only", "ProtectHome=yes").replace(
        "PrivateDevices=yes",
        "PrivateDevices=no\nInaccessiblePaths=-/srv/secret \"/opt/x\"\nTemporaryFileSystem=/var/lib:ro",
    );
    let t = trees(&stricter);
    let got: Vec<&str> = t.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(got, ["/home", "/root", "/run/user", "/tmp", "/var/tmp", "/srv/secret", "/opt/x", "/var/lib"]);
    assert!(t[0].1.contains("makes inaccessible (ProtectHome=yes)"), "{t:?}");
    assert!(t[7].1.contains("empty tmpfs (TemporaryFileSystem=/var/lib)"), "{t:?}");
    let tmpfs = trees(&template().replace("ProtectHome=read-only", "ProtectHome=tmpfs"));
    assert!(tmpfs.iter().any(|(p, w)| p == "/home" && w.contains("empty tmpfs (ProtectHome=tmpfs)")), "{tmpfs:?}");
    assert_eq!(trees(&template().replace("PrivateTmp=yes", "PrivateTmp=no")).len(), 1);
    // Only [Service] counts, comments never.
    assert!(trees("[Unit]\nPrivateTmp=yes\n[Service]\n# PrivateTmp=yes\n").is_empty());
}

#[test]
fn every_directive_of_the_unit_is_classified() {
    // A directive the unit gains must be placed: it hides a tree (teach hidden_trees) or it
    // hides nothing (HIDES_NOTHING). Otherwise install could accept a path the service cannot see.
    let t = template();
    let service = t.split("\n[Service]\n").nth(1).unwrap().split("\n[Install]").next().unwrap();
    for line in service.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let key = line.split('=').next().unwrap();
        assert!(HIDING.contains(&key) || HIDES_NOTHING.contains(&key), "{key}: classify it in install/hidden.rs");
    }
}

#[test]
fn a_tree_holds_whole_components_only() {
    let tmp = HiddenTree { path: "/tmp".into(), why: String::new() };
    assert!(tmp.contains(Path::new("/tmp")) && tmp.contains(Path::new("/tmp/a/b")));
    assert!(
        !tmp.contains(Path::new("/tmpfoo")) && !tmp.contains(Path::new("/")) && !tmp.contains(Path::new("/var/tmp"))
    );
}

/// A new directory the service could see, wherever the checkout is (a clone under /tmp is
/// inside a hidden tree, so the test binary's own directory will not do): the first of the
/// account's home, /run/lock (world-writable on systemd hosts), /var/lib and /srv (root) that
/// is outside every tree the unit hides and takes a new directory.
fn visible_dir() -> tempfile::TempDir {
    let hidden = service_hidden_trees();
    let mut tried = Vec::new();
    let home = std::env::var_os("HOME").map(PathBuf::from);
    for base in home.into_iter().chain(["/run/lock", "/var/lib", "/srv"].map(PathBuf::from)) {
        let Ok(base) = std::fs::canonicalize(&base) else { continue };
        if let Some(tree) = hidden.iter().find(|t| t.contains(&base)) {
            tried.push(format!("{} (inside {})", base.display(), tree.path));
            continue;
        }
        match tempfile::Builder::new().prefix("guard-visible-").tempdir_in(&base) {
            Ok(dir) => return dir,
            Err(e) => tried.push(format!("{}: {e}", base.display())),
        }
    }
    panic!("no directory the service could see takes a new directory here: {}", tried.join("; "))
}

#[test]
fn a_lookup_lists_every_link_it_follows_and_the_file_it_ends_at() {
    let d = visible_dir();
    let dir = std::fs::canonicalize(d.path()).unwrap();
    std::fs::create_dir(dir.join("c")).unwrap();
    std::fs::write(dir.join("file"), "{}").unwrap();
    std::os::unix::fs::symlink("b", dir.join("a")).unwrap();
    std::os::unix::fs::symlink("c/../file", dir.join("b")).unwrap();
    std::os::unix::fs::symlink(dir.join("a"), dir.join("abs")).unwrap();
    assert_eq!(lookup_steps(&dir.join("a")).unwrap(), [dir.join("a"), dir.join("b"), dir.join("file")]);
    assert_eq!(
        lookup_steps(&dir.join("abs")).unwrap(),
        [dir.join("abs"), dir.join("a"), dir.join("b"), dir.join("file")]
    );
    assert_eq!(lookup_steps(&dir.join("c/../file")).unwrap(), [dir.join("file")]);
    std::os::unix::fs::symlink("loop", dir.join("loop")).unwrap();
    assert_eq!(lookup_steps(&dir.join("loop")).unwrap_err().raw_os_error(), Some(libc::ELOOP));
    assert!(lookup_steps(&dir.join("missing")).is_err());
}

#[test]
fn a_config_path_in_or_through_a_hidden_tree_is_refused_with_the_path_the_tree_and_the_fix() {
    let outside = visible_dir();
    let out = std::fs::canonicalize(outside.path()).unwrap();
    let tmp = tempfile::tempdir_in("/tmp").unwrap();
    let inside = std::fs::canonicalize(tmp.path()).unwrap();
    std::fs::write(out.join("real.json"), "{}").unwrap();
    std::fs::write(inside.join("real.json"), "{}").unwrap();
    // A link in the home pointing into /tmp, and a link in /tmp pointing out of it.
    std::os::unix::fs::symlink(inside.join("real.json"), out.join("into-tmp.json")).unwrap();
    std::os::unix::fs::symlink(out.join("real.json"), inside.join("out-of-tmp.json")).unwrap();

    let file = |p: &Path, fix: &str| refuse_hidden("the config source", p, Judge::File, fix);
    assert!(file(&out.join("real.json"), "fix").is_ok());
    // Missing is the caller's to report.
    assert!(file(&out.join("missing.json"), "fix").is_ok());
    // Where install writes a link is judged by its directory, not by what is there now.
    let place = |p: &Path| refuse_hidden("--config", p, Judge::LinkPlace, "fix");
    assert!(place(&out.join("not-yet.json")).is_ok());
    assert!(place(&out.join("into-tmp.json")).is_ok(), "a link there now is replaced, not followed");
    assert!(place(&inside.join("not-yet.json")).is_err());
    assert!(place(&inside.join("out-of-tmp.json")).is_err());
    for (given, step) in [
        (inside.join("real.json"), inside.join("real.json")),
        (out.join("into-tmp.json"), inside.join("real.json")),
        (inside.join("out-of-tmp.json"), inside.join("out-of-tmp.json")),
    ] {
        let e = file(&given, super::hidden::FIX).unwrap_err();
        assert_eq!(e.step, step, "{given:?}");
        let msg = e.to_string();
        assert!(msg.starts_with(&format!("the config source \"{}\" ", given.display())), "{msg}");
        assert!(msg.contains(" inside /tmp, which the unit replaces with an empty directory of the service's own (PrivateTmp=yes), so the guard could not read it; put it under the account's home or /etc/guard-user"), "{msg}");
        if given == step {
            assert!(msg.contains("\" is inside /tmp, "), "{msg}");
        }
        if given != step {
            assert!(msg.contains(&format!(" leads to \"{}\", ", step.display())), "{msg}");
        }
    }

    // A name the account made prints escaped, on one line.
    let evil = inside.join("x\u{1b}[2J\nFORGED \u{202e}.json");
    std::fs::write(&evil, "{}").unwrap();
    let msg = file(&evil, "fix").unwrap_err().to_string();
    assert!(msg.contains("x\\x1b[2J\\nFORGED \\xe2\\x80\\xae.json"), "{msg}");
    assert!(!msg.chars().any(|c| c.is_control() || c == '\u{202e}'), "{msg:?}");
}

#[test]
fn a_record_reads_back_exactly_the_source_it_was_written_for() {
    let alice = AccountName::new("alice").unwrap();
    for p in [
        b"/home/alice/checkout/guard-config.json".as_slice(),
        b"/srv/a b/\x1b[31m\nExecStartPre=/bin/sh\\x\"q\".json",
        b"/srv/\xff\xfe/\xe2\x80\xae.json",
    ] {
        let source = Path::new(OsStr::from_bytes(p));
        let text = record::text(&alice, source);
        assert_eq!(text.lines().count(), 4, "one line for the path: {text}");
        assert!(!text.lines().last().unwrap().chars().any(char::is_control), "{text:?}");
        assert_eq!(record::parse(text.as_bytes(), &alice).unwrap(), source);
    }
}

#[test]
fn an_edited_or_another_accounts_record_is_not_taken() {
    let alice = AccountName::new("alice").unwrap();
    let bob = AccountName::new("bob").unwrap();
    let good = record::text(&alice, Path::new("/srv/cfg.json"));
    let edits = [
        record::text(&bob, Path::new("/srv/cfg.json")),
        good.replace("/srv/cfg.json", "relative.json"),
        good.replace("/srv/cfg.json\n", "/srv/cfg.json\n/tmp/other.json\n"),
        good.replace("# Written", "#Written"),
        good.replace("/srv/cfg.json", "/srv/\\q.json"),
        good.replace("/srv/cfg.json", "/srv/a\u{1b}b.json"),
        good.trim_end().to_string(),
        String::new(),
    ];
    for e in &edits {
        assert!(matches!(record::parse(e.as_bytes(), &alice), Err(RecordError::Edited)), "{e:?}");
    }
    assert!(record::parse(b"\xff", &alice).is_err());
}

#[test]
fn the_suggested_install_keeps_the_home_and_config_and_quotes_what_needs_it() {
    let acct = account(1000);
    let layout = |home: &str, config: Option<&str>| Layout {
        account: acct.clone(),
        user: AccountName::new("alice").unwrap(),
        home: PathBuf::from(home),
        config: config.map(PathBuf::from),
        config_link: PathBuf::from(home).join("guard-config.json"),
        source: None,
        unit_dir: PathBuf::from("/etc/systemd/system"),
        provider: Provider::Source { bin_dir: PathBuf::from("/usr/local/bin") },
        exe: PathBuf::from("/usr/local/bin/guard-user"),
        defaults_root: PathBuf::from("/"),
    };
    assert_eq!(
        layout("/home/alice", None).install_command(Path::new("/srv/cfg.json")),
        "guard-user install --user alice --config-source /srv/cfg.json"
    );
    let src = Path::new(OsStr::from_bytes(b"/srv/my cfg/\x1b[2J\n.json"));
    assert_eq!(
        layout("/srv/alice home", Some("/srv/c=1.json")).install_command(src),
        r#"guard-user install --user alice --home "/srv/alice home" --config "/srv/c=1.json" --config-source "/srv/my cfg/\x1b[2J\n.json""#
    );
}
