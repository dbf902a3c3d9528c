//! `guard-user install`, `check` and `uninstall` (docs/operations.md) against real files in a temp root
//! (`--home`, `--unit-dir`, `--bin-dir`) and a fake `systemctl` (see install_host/). The hostile
//! account, `--home` and the packaged host are in install_hostile.rs.
use std::{
    fs,
    os::unix::{fs::MetadataExt, process::CommandExt as _},
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::{Duration, SystemTime},
};

use guard_test::child::{say, wait_for_eof, Child};
use integration_tests::*;

mod install_host;
use install_host::Host;

trait HostExt {
    fn record(&self) -> std::path::PathBuf;
    fn write_status(&self, last_tick: f64, interval_secs: f64);
    fn plant_legacy(&self);
    fn fingerprint(&self) -> Vec<(u64, i64, i64)>;
}

impl HostExt for Host {
    fn record(&self) -> std::path::PathBuf {
        self.dropin().with_file_name("config-source")
    }

    fn write_status(&self, last_tick: f64, interval_secs: f64) {
        let s = guard::status::Status { last_tick, interval_secs, user: self.user.into(), ..Default::default() };
        fs::write(self.h("guard-status.json"), serde_json::to_vec(&s).unwrap()).unwrap();
    }

    fn plant_legacy(&self) {
        let units = self.h(".config/systemd/user");
        fs::create_dir_all(units.join("timers.target.wants")).unwrap();
        fs::write(self.h("guard-daemon.sh"), "#!/bin/bash\n").unwrap();
        fs::write(units.join("guard-daemon.timer"), "[Timer]\n").unwrap();
        fs::write(units.join("guard-daemon.service"), "[Service]\n").unwrap();
        std::os::unix::fs::symlink("../guard-daemon.timer", units.join("timers.target.wants/guard-daemon.timer"))
            .unwrap();
        // The account's own files: install retires them as the account.
        for rel in [
            ".config",
            ".config/systemd",
            ".config/systemd/user",
            ".config/systemd/user/timers.target.wants",
            ".config/systemd/user/timers.target.wants/guard-daemon.timer",
            ".config/systemd/user/guard-daemon.timer",
            ".config/systemd/user/guard-daemon.service",
            "guard-daemon.sh",
        ] {
            std::os::unix::fs::lchown(self.h(rel), Some(self.uid), Some(self.uid)).unwrap();
        }
    }

    /// (inode, mtime in ns) of every file install writes.
    fn fingerprint(&self) -> Vec<(u64, i64, i64)> {
        [self.link(), self.p("units/guard-user@.service"), self.dropin(), self.record(), self.p("bin/guard-user")]
            .iter()
            .map(|p| {
                let m = fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                (m.ino(), m.mtime(), m.mtime_nsec())
            })
            .collect()
    }
}

fn now_secs() -> f64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs_f64()
}

#[guard_test(needs = [root])]
fn check_reports_every_drift_and_install_brings_it_in_sync() {
    let _g = setup();
    let host = Host::new();
    let user = host.user;
    let home = host.home.path().display().to_string();
    let units = host.p("units").display().to_string();
    let instance = format!("guard-user@{user}.service");

    // Nothing there yet. (Asked about a source, check names the install that links it.)
    let out = host.run("check");
    assert_eq!(out.code, 1, "{}", out.stdout);
    for line in [
        format!(
            "{home}/guard-config.json is missing; run guard-user install --user {user} --home {home} --config-source {}",
            host.source().display()
        ),
        format!("{}/guard-user@{user}.service.d/config-source is missing or differs from this build", units),
        format!("{units}/guard-user@.service is missing or differs from this build"),
        format!("{instance} is not enabled"),
        format!("{instance} is not active"),
    ] {
        assert!(out.stdout.lines().any(|l| l == line), "missing `{line}` in\n{}", out.stdout);
    }

    // A hand copy with identical text is still drift; so are the legacy files and a stale heartbeat.
    fs::copy(host.source(), host.link()).unwrap();
    host.plant_legacy();
    let last = now_secs() - 1000.0;
    host.write_status(last, 60.0);
    let out = host.run("check");
    assert_eq!(out.code, 1);
    let last_at = guard::log::local_timestamp(SystemTime::UNIX_EPOCH + Duration::from_secs_f64(last));
    for line in [
        // The line names the source and the install that links it again, with this home.
        format!(
            "{home}/guard-config.json is not a link to {src}; run guard-user install --user {user} --home {home} \
             --config-source {src}",
            src = host.source().display()
        ),
        format!("{home}/guard-daemon.sh is still present, so the legacy guard can run beside guard-user"),
        format!("{home}/.config/systemd/user/guard-daemon.timer still runs the legacy guard"),
        format!("{home}/.config/systemd/user/guard-daemon.service still runs the legacy guard"),
        format!("the guard has not completed a tick for 1000s (last at {last_at})"),
    ] {
        assert!(out.stdout.lines().any(|l| l == line), "missing `{line}` in\n{}", out.stdout);
    }
    assert!(
        !out.stdout.contains("is missing\n") || !out.stdout.contains("guard-config.json is missing"),
        "{}",
        out.stdout
    );

    // install: the documented line first, exit 0, and the legacy guard retired.
    host.answer("user-manager", "running");
    let out = host.run("install");
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert_eq!(
        out.stdout.lines().next().unwrap(),
        format!(
            "[OK] Host guard installed for {user} in {home} from {}, every 60s as {instance}",
            host.source().display()
        )
    );
    let calls = host.calls();
    for c in [
        format!("--user -M {user}@ disable --now guard-daemon.timer"),
        format!("--user -M {user}@ disable --now guard-daemon.service"),
        format!("--user -M {user}@ daemon-reload"),
        "daemon-reload".to_string(),
        format!("enable --now {instance}"),
    ] {
        assert!(calls.lines().any(|l| l == c), "no `systemctl {c}` in\n{calls}");
    }
    for p in ["guard-daemon.sh", ".config/systemd/user/guard-daemon.timer", ".config/systemd/user/guard-daemon.service"]
    {
        assert!(fs::symlink_metadata(host.h(p)).is_err(), "{p} survived install");
    }
    assert!(fs::symlink_metadata(host.h(".config/systemd/user/timers.target.wants/guard-daemon.timer")).is_err());
    let meta = fs::symlink_metadata(host.link()).unwrap();
    assert!(meta.file_type().is_symlink() && meta.uid() == host.uid, "the link belongs to the account");
    let unit = fs::read_to_string(host.p("units/guard-user@.service")).unwrap();
    assert!(
        unit.contains(&format!("ExecStart={}/guard-user run --user %i $GUARD_ARGS\n", host.p("bin").display())),
        "{unit}"
    );

    host.write_status(now_secs(), 60.0);
    // A `guard-user run` another test binary starts for this account at the same moment would be
    // (rightly) a leak: retry a few times so only a steady report counts.
    let mut out = host.run("check");
    for _ in 0..5 {
        if !out.stdout.contains(" is running outside ") {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
        out = host.run("check");
    }
    assert_eq!(out.stdout, format!("[OK] Host guard in sync with {}\n", host.source().display()));
    assert_eq!(out.code, 0);
}

#[guard_test(needs = [root])]
fn check_reports_an_invalid_config_a_link_elsewhere_and_an_edited_unit() {
    let _g = setup();
    let host = Host::new();
    let user = host.user;
    let home = host.home.path().display().to_string();
    assert_eq!(host.run("install").code, 0);

    // A link to another checkout.
    std::os::unix::fs::symlink(host.p("b.json"), host.h("x")).unwrap();
    fs::rename(host.h("x"), host.link()).unwrap();
    let out = host.run("check");
    assert_eq!(out.code, 1);
    let line = format!(
        "{home}/guard-config.json is not a link to {src}; run guard-user install --user {user} --home {home} \
         --config-source {src}",
        src = host.source().display()
    );
    assert!(out.stdout.lines().any(|l| l == line), "missing `{line}` in\n{}", out.stdout);

    // An invalid source, linked: the ERROR line's reason.
    fs::write(host.p("bad.json"), "{\"threshold\": 0}").unwrap();
    let bad = fs::canonicalize(host.p("bad.json")).unwrap();
    std::os::unix::fs::symlink(&bad, host.h("x")).unwrap();
    fs::rename(host.h("x"), host.link()).unwrap();
    let out = host.run_with("check", &bad, "1");
    assert_eq!(out.code, 1);
    assert!(
        out.stdout
            .lines()
            // The ERROR line's reason, which carries validate's reason and fix.
            .any(|l| l == format!(r#"{home}/guard-config.json is invalid: config_malformed threshold value=0 reason="0 is below 1" fix="write a whole number >= 1, e.g. 30""#)),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("not a link"), "{}", out.stdout);
    // A value of the wrong type is shown as its JSON: the string "30" never reads as the number.
    fs::write(host.p("string.json"), r#"{"threshold": "30"}"#).unwrap();
    let string = fs::canonicalize(host.p("string.json")).unwrap();
    std::os::unix::fs::symlink(&string, host.h("x")).unwrap();
    fs::rename(host.h("x"), host.link()).unwrap();
    let out = host.run_with("check", &string, "1");
    assert_eq!(out.code, 1);
    assert!(
        out.stdout.lines().any(|l| l
            == format!(
                r#"{home}/guard-config.json is invalid: config_malformed threshold value="30" reason="\"30\" is a string" fix="write a whole number >= 1, e.g. 30""#
            )),
        "{}",
        out.stdout
    );
    std::os::unix::fs::symlink(&bad, host.h("x")).unwrap();
    fs::rename(host.h("x"), host.link()).unwrap();
    // install refuses to link an invalid source.
    let mut c = host.command("install");
    c.arg("--home").arg(host.home.path()).arg("--config-source").arg(&bad);
    let o = install_host::out(c);
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("is invalid: config_malformed threshold value=0"), "{}", o.stderr);

    // An edited unit.
    let unit = host.p("units/guard-user@.service");
    let text = fs::read_to_string(&unit).unwrap().replace("MemoryMax=64M", "MemoryMax=1G");
    fs::write(&unit, text).unwrap();
    let out = host.run("check");
    assert!(
        out.stdout.lines().any(|l| l == format!("{} is missing or differs from this build", unit.display())),
        "{}",
        out.stdout
    );
    // And a stopped instance.
    host.answer("is-active", "failed");
    let out = host.run("check");
    assert!(out.stdout.lines().any(|l| l == format!("guard-user@{user}.service is not active")), "{}", out.stdout);
    assert!(!out.stdout.contains("is not enabled"), "{}", out.stdout);
}

#[guard_test(needs = [root])]
fn check_after_install_with_a_config_source_compares_against_that_source() {
    let _g = setup();
    let host = Host::new();
    let user = host.user;
    let home = host.home.path().display().to_string();
    let chosen = fs::canonicalize(host.p("b.json")).unwrap();
    let out = host.run_with("install", &chosen, "1");
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    host.write_status(now_secs(), 60.0);

    // A plain check (no --home, no --config-source): in sync with the operator's source.
    let plain = |sub: &str| install_host::out(host.command(sub));
    let out = plain("check");
    assert_eq!(out.stdout, format!("[OK] Host guard in sync with {}\n", chosen.display()), "{}", out.stderr);
    assert_eq!(out.code, 0);
    let record = fs::read_to_string(host.record()).unwrap();
    assert!(record.ends_with(&format!("\n{}\n", chosen.display())), "{record}");
    assert_eq!(fs::symlink_metadata(host.record()).unwrap().uid(), 0, "the record is root's");

    // The account relinks to another file: the drift names the recorded source, and the fix
    // installs that source again (never the default, which would discard the choice).
    std::os::unix::fs::symlink(host.source(), host.h("x")).unwrap();
    std::os::unix::fs::lchown(host.h("x"), Some(host.uid), Some(host.uid)).unwrap();
    fs::rename(host.h("x"), host.link()).unwrap();
    let out = plain("check");
    assert_eq!(out.code, 1);
    let line = format!(
        "{home}/guard-config.json is not a link to {src}; run guard-user install --user {user} --home {home} \
         --config-source {src}",
        src = chosen.display()
    );
    assert_eq!(out.stdout.lines().collect::<Vec<_>>(), [line.as_str()], "{}", out.stderr);

    // Repairing without --config-source keeps the recorded source.
    let mut c = host.command("install");
    c.arg("--home").arg(host.home.path());
    let out = install_host::out(c);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.lines().next().unwrap().contains(&format!(" from {}, ", chosen.display())), "{}", out.stdout);
    assert_eq!(fs::read_link(host.link()).unwrap(), chosen);
    assert_eq!(plain("check").stdout, format!("[OK] Host guard in sync with {}\n", chosen.display()));
}

#[guard_test(needs = [root])]
fn a_second_install_changes_nothing() {
    let _g = setup();
    let host = Host::new();
    assert_eq!(host.run("install").code, 0);
    let before = host.fingerprint();
    let calls_before = host.calls();
    std::thread::sleep(Duration::from_millis(20));
    let out = host.run("install");
    assert_eq!(out.code, 0);
    assert!(out.stdout.starts_with("[OK] Host guard installed for "), "{}", out.stdout);
    assert!(out.stdout.contains("(already installed, nothing changed)"), "{}", out.stdout);
    assert_eq!(host.fingerprint(), before, "a second install rewrote a file");
    let new_calls = &host.calls()[calls_before.len()..];
    assert!(
        !new_calls.contains("daemon-reload") && !new_calls.contains("enable --now") && !new_calls.contains("restart"),
        "{new_calls}"
    );
}

#[guard_test(needs = [root])]
fn install_without_systemd_links_and_says_the_guard_is_not_scheduled() {
    let _g = setup();
    let host = Host::new();
    let out = host.run_with("install", &host.source(), "0");
    assert_eq!(out.code, 1);
    assert_eq!(
        out.stdout.lines().next().unwrap(),
        format!(
            "[!!] Host guard linked in {}; systemd is not running, so the guard is not scheduled",
            host.home.path().display()
        )
    );
    assert!(fs::read_link(host.link()).unwrap() == host.source());
    assert!(!host.calls().lines().any(|l| l.contains("enable")), "{}", host.calls());
}

#[guard_test(needs = [root])]
fn install_without_systemd_prints_one_outcome_and_the_command_to_run_instead() {
    let _g = setup();
    let host = Host::new();
    assert_eq!(host.run_with("install", &host.source(), "0").code, 1);
    // Run again, so nothing changes: the `[!!]` line stays the one outcome (no `[OK] … nothing
    // changed` after it), and the way forward is the command the unit would have run.
    let out = host.run_with("install", &host.source(), "0");
    assert_eq!(out.code, 1, "{}", out.stdout);
    let outcomes: Vec<&str> = out.stdout.lines().filter(|l| l.starts_with('[')).collect();
    assert_eq!(outcomes.len(), 1, "{}", out.stdout);
    assert!(outcomes[0].starts_with("[!!] Host guard linked in "), "{}", out.stdout);
    assert!(out.stdout.lines().any(|l| l == "  nothing changed"), "{}", out.stdout);
    let command = format!(
        "{} run --user {} --home {}",
        host.p("bin/guard-user").display(),
        host.user,
        host.home.path().display()
    );
    assert!(out.stdout.lines().any(|l| l.trim() == command), "no `{command}` in:\n{}", out.stdout);
}

#[guard_test(needs = [root])]
fn uninstall_removes_the_unit_and_binary_but_keeps_the_link_and_log() {
    let _g = setup();
    let host = Host::new();
    let user = host.user;
    assert_eq!(host.run("install").code, 0);
    fs::write(host.h("guard-daemon.log"), "x\n").unwrap();

    // Another account's instance keeps the shared template and binary.
    let wants = host.p("units/multi-user.target.wants");
    fs::create_dir_all(&wants).unwrap();
    std::os::unix::fs::symlink("../guard-user@.service", wants.join(format!("guard-user@{TEST_USER}.service")))
        .unwrap();
    let out = host.run("uninstall");
    assert_eq!(out.code, 0, "{}", out.stdout);
    assert!(host.calls().lines().any(|l| l == format!("disable --now guard-user@{user}.service")), "{}", host.calls());
    assert!(host.p("units/guard-user@.service").exists() && host.p("bin/guard-user").exists(), "{}", out.stdout);
    assert!(!host.p(&format!("units/guard-user@{user}.service.d/home.conf")).exists());

    fs::remove_file(wants.join(format!("guard-user@{TEST_USER}.service"))).unwrap();
    let out = host.run("uninstall");
    assert_eq!(out.code, 0, "{}", out.stdout);
    assert!(!host.p("units/guard-user@.service").exists() && !host.p("bin/guard-user").exists(), "{}", out.stdout);
    assert!(fs::symlink_metadata(host.link()).unwrap().file_type().is_symlink(), "the config link was removed");
    assert_eq!(fs::read_to_string(host.h("guard-daemon.log")).unwrap(), "x\n");
}

#[guard_test(needs = [root])]
fn the_relink_never_leaves_the_config_path_missing() {
    let _g = setup();
    let host = Host::new();
    let (a, b) = (host.source(), fs::canonicalize(host.p("b.json")).unwrap());
    fs::copy(&a, host.link()).unwrap(); // starts as a hand copy
    let link = host.link();
    let done = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    let (seen_missing, relinks) = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut missing = 0u64;
            while !done.load(Ordering::Relaxed) {
                if fs::symlink_metadata(&link).is_err() {
                    missing += 1;
                }
                reads.fetch_add(1, Ordering::Relaxed);
            }
            missing
        });
        // At least 200 relinks, and on until the reader looked 1,000 times (a loaded machine
        // may not schedule it at first); an even count leaves the link on `a`.
        let mut i = 0u64;
        while i < 200 || reads.load(Ordering::Relaxed) < 1_000 || !i.is_multiple_of(2) {
            let src = if i.is_multiple_of(2) { &b } else { &a };
            let who = guard::safefs::FsIdentity { uid: host.uid, gid: host.uid };
            assert!(guard::install::relink(&link, src, who).unwrap());
            i += 1;
        }
        done.store(true, Ordering::Relaxed);
        (reader.join().unwrap(), i)
    });
    let reads = reads.into_inner();
    assert_eq!(seen_missing, 0, "the config path was missing in {seen_missing} of {reads} reads ({relinks} relinks)");
    assert!(guard::install::links_to(&link, &a));
}

#[guard_test(needs = [root])]
fn check_reports_a_guard_running_outside_the_unit() {
    let _g = setup();
    let host = Host::for_account(TEST_USER, TEST_UID, "home-");
    assert_eq!(host.run("install").code, 0);
    let daemon = Daemon::start(&host.home, &["--backend", "procfs"]);
    let pid = daemon.child.id();
    let line = format!("guard-user pid {pid} is running outside guard-user@{TEST_USER}.service");
    // Wait until the child has exec'd (its cmdline is the guard's).
    let end = std::time::Instant::now() + Duration::from_secs(5);
    while !fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .starts_with(guard_bin().as_os_str().as_encoded_bytes())
        && std::time::Instant::now() < end
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    host.answer("MainPID", "0");
    let out = host.run("check");
    assert_eq!(out.code, 1);
    assert!(out.stdout.lines().any(|l| l == line), "missing `{line}` in\n{}", out.stdout);

    // The same process as the unit's MainPID is not a leak.
    host.answer("MainPID", &pid.to_string());
    let out = host.run("check");
    assert!(!out.stdout.contains(&format!("pid {pid} ")), "{}", out.stdout);
    daemon.stop();
}

/// A `guard-user` that is not a daemon (`tree`, `holders`: what an operator runs beside the
/// service) is no leak, with or without `--user`; a process with a `run` argv beside them is
/// reported, so the report reads each process's argv.
#[guard_test(needs = [root])]
fn check_does_not_report_a_guard_user_that_is_not_a_daemon() {
    let _g = setup();
    let host = Host::for_account(TEST_USER, TEST_UID, "home-");
    assert_eq!(host.run("install").code, 0);
    host.answer("MainPID", "0");
    // This test binary as the account, idle, under the argv `guard-user <args>`.
    let start = |args: &[&str]| {
        let mut cmd = Child::helper_command_as("idle", TEST_UID);
        cmd.arg0("guard-user").args(args);
        let mut child = Child::spawn(&mut cmd);
        child.expect_line("ready");
        child
    };
    let tree = start(&["tree", "--user", TEST_USER]);
    let holders = start(&["holders", "/tmp"]);
    let run = start(&["run", "--user", TEST_USER]);
    let out = host.run("check");
    let line = |pid: u32| format!("guard-user pid {pid} is running outside guard-user@{TEST_USER}.service");
    assert!(out.stdout.lines().any(|l| l == line(run.pid())), "the `run` is missing in\n{}", out.stdout);
    for (what, child) in [("tree", &tree), ("holders", &holders)] {
        assert!(!out.stdout.contains(&format!("pid {} ", child.pid())), "the `{what}` is reported:\n{}", out.stdout);
    }
}

fn helper_main(mode: &str) {
    assert_eq!(mode, "idle", "unknown helper mode {mode}");
    // Named as the real binary is (its comm), which is what check looks at before any argv.
    // SAFETY: PR_SET_NAME reads a NUL-terminated name of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"guard-user".as_ptr()) };
    say("ready");
    wait_for_eof();
}

/// `/etc/default/guard-user` (here under `GUARD_PACKAGED_ROOT`): `check` shows the flags it adds
/// to `run` after its verdict, an instance's own file wins, and flags the service would not
/// start with (an unknown flag, a bad duration, a second `--user`) are drift naming the file.
#[guard_test(needs = [root])]
fn check_shows_the_flags_of_the_defaults_file_and_refuses_those_run_would_not_start_with() {
    let _g = setup();
    let host = Host::new();
    assert_eq!(host.run("install").code, 0);
    let ok = format!("[OK] Host guard in sync with {}\n", host.source().display());
    assert_eq!(host.run("check").stdout, ok, "no defaults file, no flags line");

    let dir = host.p("no-package/etc/default");
    fs::create_dir_all(&dir).unwrap();
    let shared = dir.join("guard-user");
    fs::write(
        &shared,
        "# flags for every instance\nGUARD_ARGS=\"--interval 30s --metrics-file /var/lib/prometheus/node-exporter/\"\n",
    )
    .unwrap();
    let out = host.run("check");
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert_eq!(
        out.stdout,
        format!(
            "{ok}flags: --interval 30s --metrics-file /var/lib/prometheus/node-exporter/ (GUARD_ARGS from {})\n",
            shared.display()
        )
    );

    let own = dir.join(format!("guard-user@{}", host.user));
    for (args, why) in [
        ("--interval soon", "(--interval: `soon` is not a duration"),
        ("--colour", "(unexpected argument '--colour' found)"),
        ("--user root", "(the argument '--user <NAME|UID>' cannot be used multiple times)"),
        ("--metrics-file /srv/guard.txt", "(--metrics-file /srv/guard.txt: node_exporter's textfile collector"),
        (
            "--config /srv/other.json --interval 30s",
            "(--config is set per instance by guard-user install --config FILE",
        ),
        ("--config=/srv/other.json", "(--config is set per instance by guard-user install --config FILE"),
    ] {
        fs::write(&own, format!("GUARD_ARGS='{args}'\n")).unwrap();
        let out = host.run("check");
        assert_eq!(out.code, 1, "{args}: {}", out.stdout);
        let want = format!("{}: GUARD_ARGS \"{args}\" is refused {why}", own.display());
        assert!(out.stdout.lines().any(|l| l.starts_with(&want)), "{args}: want `{want}` in\n{}", out.stdout);
    }
    fs::write(&own, "GUARD_ARGS=--dry-run\n").unwrap();
    let out = host.run("check");
    assert_eq!(out.code, 0, "{}", out.stdout);
    assert!(out.stdout.ends_with(&format!("flags: --dry-run (GUARD_ARGS from {})\n", own.display())), "{}", out.stdout);
}

guard_test::main!(helpers = helper_main);
