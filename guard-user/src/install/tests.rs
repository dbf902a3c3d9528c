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
    home::{validate_home, HomeError},
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
         --config \"/srv/cfg $$x.json\"\n\
         ReadWritePaths=\"/srv/alice home %%i\"\n"
    );
    let d = dropin("/home/alice", None);
    assert!(d.text().contains("ExecStart=/usr/local/bin/guard-user run --user alice --home \"/home/alice\"\n"));
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
            "ExecStart=/opt/bin/guard-user run --user %i",
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
            "ProtectHome=read-only",
            "PrivateTmp=yes",
            "PrivateDevices=yes",
            "ProtectKernelTunables=yes",
            "ProtectKernelModules=yes",
            "ProtectControlGroups=yes",
            "ProtectClock=yes",
            "ProtectHostname=yes",
            "RestrictNamespaces=yes",
            "RestrictRealtime=yes",
            "RestrictSUIDSGID=yes",
            "LockPersonality=yes",
            "SystemCallArchitectures=native",
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
